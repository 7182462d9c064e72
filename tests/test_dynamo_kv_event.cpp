// Tests of dynamo_kv_event.hpp: Dynamo RouterEvent payloads (msgpack with
// field names, JSON) and the event plane envelope.
//
// The fixtures are the exact bytes Dynamo's serializers write for these
// events: hand-written from the serde definitions (docs/dynamo_kv_event.md),
// and checked against rmp-serde 1.1.1 / serde_json 1.0.87 output of the same
// definitions (tests/dynamo_kv_event/generate). Every hash that matters is
// above 2^53, so a reader that goes through a double would fail them.
#include <promptcache/dynamo_kv_event.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "catch.hpp"

namespace {

using promptcache::decode_dynamo_event_envelope;
using promptcache::decode_dynamo_router_event;
using promptcache::DynamoDecodeOptions;
using promptcache::DynamoErrc;
using promptcache::DynamoEventEnvelope;
using promptcache::DynamoRouterEvent;
using promptcache::DynamoWireFormat;
using promptcache::encode_dynamo_event_envelope;
using promptcache::encode_dynamo_router_event;
using promptcache::KvBlock;
using promptcache::KvEvent;
using promptcache::KvWorker;
namespace kv_event = promptcache::kv_event;
using Bytes = std::vector<std::byte>;

constexpr std::uint64_t u64max = std::numeric_limits<std::uint64_t>::max();

Bytes hex(std::string_view h) {
  Bytes out;
  auto nib = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (std::size_t i = 0; i + 1 < h.size();) {
    if (h[i] == ' ' || h[i] == '\n') {
      ++i;
      continue;
    }
    out.push_back(static_cast<std::byte>(nib(h[i]) * 16 + nib(h[i + 1])));
    i += 2;
  }
  return out;
}

Bytes text(std::string_view s) {
  Bytes out;
  for (const char c : s)
    out.push_back(static_cast<std::byte>(c));
  return out;
}

// Field names as msgpack fixstr (a0 | length, then the bytes).
// 82 a9 "worker_id" <u64>  a5 "event"  83 a8 "event_id" <u64>  a4 "data" <variant>
//    a7 "dp_rank" <u32>
constexpr std::string_view kStoredMsgpack =
    "82 a9 776f726b65725f6964 cf deadbeefcafef00d"     // worker_id
    " a5 6576656e74 83"                                // event: {
    " a8 6576656e745f6964 2a"                          //   event_id: 42
    " a4 64617461 81 a6 73746f726564 82"               //   data: {stored: {
    " ab 706172656e745f68617368 cf ffffffffffffffff"   // parent_hash: u64 max
    " a6 626c6f636b73 92"                              // blocks: [
    " 83 aa 626c6f636b5f68617368 cf f3a51c2b9d87e601"  // {block_hash,
    " ab 746f6b656e735f68617368 cf 9e3779b97f4a7c15"   //  tokens_hash,
    " ad 6d6d5f65787472615f696e666f c0"                //  mm_extra_info: nil}
    " 83 aa 626c6f636b5f68617368 cf 8000000000000001"
    " ab 746f6b656e735f68617368 cf 0020000000000001"
    " ad 6d6d5f65787472615f696e666f c0"
    " a7 64705f72616e6b 03";  // dp_rank: 3 }
constexpr std::string_view kStoredJson =
    R"({"worker_id":16045690984503111693,"event":{"event_id":42,"data":{"stored":{"parent_hash":18446744073709551615,"blocks":[{"block_hash":17556469696025847297,"tokens_hash":11400714819323198485,"mm_extra_info":null},{"block_hash":9223372036854775809,"tokens_hash":9007199254740993,"mm_extra_info":null}]}},"dp_rank":3}})";

constexpr std::string_view kRootMsgpack =
    "82 a9 776f726b65725f6964 07 a5 6576656e74 83 a8 6576656e745f6964 00"
    " a4 64617461 81 a6 73746f726564 82 ab 706172656e745f68617368 c0"  // parent_hash: nil
    " a6 626c6f636b73 91 83 aa 626c6f636b5f68617368 01"
    " ab 746f6b656e735f68617368 cc c8"  // tokens_hash: 200 (uint 8)
    " ad 6d6d5f65787472615f696e666f c0 a7 64705f72616e6b 00";
constexpr std::string_view kRootJson =
    R"({"worker_id":7,"event":{"event_id":0,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":1,"tokens_hash":200,"mm_extra_info":null}]}},"dp_rank":0}})";

constexpr std::string_view kRemovedMsgpack =
    "82 a9 776f726b65725f6964 07 a5 6576656e74 83 a8 6576656e745f6964 cf 0020000000000001"
    " a4 64617461 81 a7 72656d6f766564 81 ac 626c6f636b5f686173686573 94"
    " cf f3a51c2b9d87e601 7f cc 80 ce 00010000"  // 127 fixint, 128 uint 8, 65536 uint 32
    " a7 64705f72616e6b ce ffffffff";
constexpr std::string_view kRemovedJson =
    R"({"worker_id":7,"event":{"event_id":9007199254740993,"data":{"removed":{"block_hashes":[17556469696025847297,127,128,65536]}},"dp_rank":4294967295}})";

constexpr std::string_view kClearedMsgpack =
    "82 a9 776f726b65725f6964 01 a5 6576656e74 83 a8 6576656e745f6964 05"
    " a4 64617461 a7 636c6561726564"  // data: "cleared" (a unit variant is its name)
    " a7 64705f72616e6b 00";
constexpr std::string_view kClearedJson =
    R"({"worker_id":1,"event":{"event_id":5,"data":"cleared","dp_rank":0}})";

// A block with multimodal info (validated, not kept).
constexpr std::string_view kMmMsgpack =
    "82 a9 776f726b65725f6964 02 a5 6576656e74 83 a8 6576656e745f6964 01"
    " a4 64617461 81 a6 73746f726564 82 ab 706172656e745f68617368 c0"
    " a6 626c6f636b73 91 83 aa 626c6f636b5f68617368 0a ab 746f6b656e735f68617368 0b"
    " ad 6d6d5f65787472615f696e666f 81 aa 6d6d5f6f626a65637473 91"
    " 82 a7 6d6d5f68617368 cf f3a51c2b9d87e601 a7 6f666673657473 91 92 00 10"
    " a7 64705f72616e6b 00";
constexpr std::string_view kMmJson =
    R"({"worker_id":2,"event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":10,"tokens_hash":11,"mm_extra_info":{"mm_objects":[{"mm_hash":17556469696025847297,"offsets":[[0,16]]}]}}]}},"dp_rank":0}})";

// EventEnvelope{topic, publisher_id, sequence, published_at, payload (bin 8)}
// around kClearedMsgpack.
constexpr std::string_view kEnvelopeMsgpack =
    "85 a5 746f706963 a9 6b762d6576656e7473"
    " ac 7075626c69736865725f6964 cf 00123456789abcde"
    " a8 73657175656e6365 11"
    " ac 7075626c69736865645f6174 cf 0000018bcfe56800"
    " a7 7061796c6f6164 c4 33"
    " 82a9776f726b65725f696401a56576656e7483a86576656e745f696405a464617461a7636c6561726564"
    " a764705f72616e6b00";

DynamoRouterEvent stored_event() {
  return {KvWorker{0xDEADBEEFCAFEF00DULL, 3},
          KvEvent{42, kv_event::Stored{u64max,
                                       {KvBlock{0xF3A51C2B9D87E601ULL, 0x9E3779B97F4A7C15ULL},
                                        KvBlock{0x8000000000000001ULL, 0x0020000000000001ULL}}}}};
}
DynamoRouterEvent root_event() {
  return {KvWorker{7, 0}, KvEvent{0, kv_event::Stored{std::nullopt, {KvBlock{1, 200}}}}};
}
DynamoRouterEvent removed_event() {
  return {
      KvWorker{7, 0xFFFFFFFFU},
      KvEvent{9007199254740993ULL, kv_event::Removed{{0xF3A51C2B9D87E601ULL, 127, 128, 65536}}}};
}
DynamoRouterEvent cleared_event() {
  return {KvWorker{1, 0}, KvEvent{5, kv_event::Cleared{}}};
}
DynamoRouterEvent mm_event() {
  return {KvWorker{2, 0}, KvEvent{1, kv_event::Stored{std::nullopt, {KvBlock{10, 11}}}}};
}

DynamoErrc decode_json(std::string_view s, DynamoRouterEvent* out = nullptr) {
  DynamoRouterEvent ev;
  const auto st = decode_dynamo_router_event(text(s), DynamoWireFormat::json, ev);
  if (out != nullptr) *out = ev;
  return st.code;
}
DynamoErrc decode_mp(const Bytes& b) {
  DynamoRouterEvent ev;
  return decode_dynamo_router_event(b, DynamoWireFormat::msgpack, ev).code;
}

struct Fixture {
  std::string_view name;
  std::string_view msgpack;
  std::string_view json;
  DynamoRouterEvent event;
  bool reencodes;  // false: the fixture carries data the decoder drops
};

std::vector<Fixture> fixtures() {
  return {{"stored", kStoredMsgpack, kStoredJson, stored_event(), true},
          {"stored_root", kRootMsgpack, kRootJson, root_event(), true},
          {"removed", kRemovedMsgpack, kRemovedJson, removed_event(), true},
          {"cleared", kClearedMsgpack, kClearedJson, cleared_event(), true},
          {"stored_mm", kMmMsgpack, kMmJson, mm_event(), false}};
}

}  // namespace

TEST_CASE("Dynamo fixtures decode to the expected events and encode back to their bytes") {
  for (const Fixture& f : fixtures()) {
    INFO(f.name);
    DynamoRouterEvent got;
    const Bytes mp = hex(f.msgpack);
    const auto st = decode_dynamo_router_event(mp, DynamoWireFormat::msgpack, got);
    REQUIRE(st.ok());
    CHECK(got == f.event);
    DynamoRouterEvent got_json;
    const Bytes js = text(f.json);
    REQUIRE(decode_dynamo_router_event(js, DynamoWireFormat::json, got_json).ok());
    CHECK(got_json == f.event);
    if (f.reencodes) {
      CHECK(encode_dynamo_router_event(f.event, DynamoWireFormat::msgpack) == mp);
      CHECK(encode_dynamo_router_event(f.event, DynamoWireFormat::json) == js);
    }
  }
}

TEST_CASE("Dynamo hashes keep all 64 bits") {
  DynamoRouterEvent ev;
  REQUIRE(decode_json(kStoredJson, &ev) == DynamoErrc::ok);
  const auto& st = std::get<kv_event::Stored>(ev.event.data);
  // 2^53 + 1 is the first integer a double cannot hold.
  CHECK(st.blocks[1].tokens_hash == (std::uint64_t{1} << 53) + 1U);
  CHECK(*st.parent_hash == u64max);
  CHECK(ev.worker.worker_id == 16045690984503111693ULL);
}

TEST_CASE("Dynamo events round-trip through both formats") {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 300; ++i) {
    DynamoRouterEvent ev;
    ev.worker = KvWorker{rng(), static_cast<std::uint32_t>(rng())};
    ev.event.event_id = rng() >> (rng() % 64U);
    switch (rng() % 3U) {
      case 0: {
        kv_event::Stored st;
        if (rng() % 2U) st.parent_hash = rng();
        const auto n = rng() % 20U;
        for (std::uint64_t k = 0; k < n; ++k)
          st.blocks.push_back(KvBlock{rng() >> (rng() % 64U), rng()});
        ev.event.data = st;
        break;
      }
      case 1: {
        kv_event::Removed rm;
        const auto n = rng() % 20U;
        for (std::uint64_t k = 0; k < n; ++k)
          rm.block_hashes.push_back(rng() >> (rng() % 64U));
        ev.event.data = rm;
        break;
      }
      default:
        ev.event.data = kv_event::Cleared{};
    }
    for (const auto fmt : {DynamoWireFormat::msgpack, DynamoWireFormat::json}) {
      const Bytes b = encode_dynamo_router_event(ev, fmt);
      DynamoRouterEvent back;
      REQUIRE(decode_dynamo_router_event(b, fmt, back).ok());
      CHECK(back == ev);
    }
  }
}

TEST_CASE("Dynamo decoding accepts what serde accepts") {
  DynamoRouterEvent ev;
  // Fields in any order, unknown fields (any shape) skipped, defaults.
  CHECK(decode_json(R"({"event":{"data":"cleared","event_id":5},"x":[1,{"a":2.5}],"worker_id":1})",
                    &ev) == DynamoErrc::ok);
  CHECK(ev == cleared_event());
  // Positional structs (trailing defaulted fields may be left off).
  CHECK(decode_json(R"([1,[5,"cleared",2]])", &ev) == DynamoErrc::ok);
  CHECK(ev.worker.dp_rank == 2U);
  CHECK(decode_json(R"([1,[5,"cleared"]])", &ev) == DynamoErrc::ok);
  CHECK(decode_mp(hex("92 01 93 05 a7 636c6561726564 00")) == DynamoErrc::ok);
  // A unit variant as a map to null; an absent parent_hash is None.
  CHECK(decode_json(R"({"worker_id":1,"event":{"event_id":5,"data":{"cleared":null}}})") ==
        DynamoErrc::ok);
  CHECK(decode_json(R"({"worker_id":1,"event":{"event_id":5,"data":{"stored":{"blocks":[]}}}})",
                    &ev) == DynamoErrc::ok);
  CHECK(!std::get<kv_event::Stored>(ev.event.data).parent_hash);
  // Escaped keys, surrounding whitespace.
  CHECK(decode_json(
            " {\"worker_\\u0069d\" : 1 , \"event\":{\"event_id\":5,\"data\":\"cleared\"}}\n") ==
        DynamoErrc::ok);
  // msgpack: a positive value in a signed format; byte-string keys.
  Bytes m =
      hex("82 a9 776f726b65725f6964 d3 0000000000000001 a5 6576656e74 82 a8 6576656e745f6964 05"
          " a4 64617461 a7 636c6561726564");
  CHECK(decode_mp(m) == DynamoErrc::ok);
  m =
      hex("82 c4 09 776f726b65725f6964 01 a5 6576656e74 82 a8 6576656e745f6964 05"
          " a4 64617461 a7 636c6561726564");
  CHECK(decode_mp(m) == DynamoErrc::ok);
}

TEST_CASE("Dynamo decoding rejects malformed input with the documented status") {
  const std::string pre = R"({"worker_id":1,"event":{"event_id":5,"data":)";
  const auto removed = [&](std::string_view hashes) {
    return pre + R"({"removed":{"block_hashes":[)" + std::string(hashes) + "]}}}}";
  };
  CHECK(decode_json("") == DynamoErrc::empty);
  CHECK(decode_json(removed("1.0")) == DynamoErrc::wrong_type);
  CHECK(decode_json(removed("1e3")) == DynamoErrc::wrong_type);
  CHECK(decode_json(removed("-1")) == DynamoErrc::out_of_range);
  CHECK(decode_json(removed("18446744073709551616")) == DynamoErrc::out_of_range);
  CHECK(decode_json(removed("-9223372036854775809")) == DynamoErrc::out_of_range);
  CHECK(decode_json(removed("\"5\"")) == DynamoErrc::wrong_type);
  CHECK(decode_json(removed("null")) == DynamoErrc::wrong_type);
  CHECK(decode_json(removed("18446744073709551615")) == DynamoErrc::ok);
  CHECK(decode_json(pre + R"("flushed"}})") == DynamoErrc::unknown_variant);
  CHECK(decode_json(pre + R"({"flushed":null}}})") == DynamoErrc::unknown_variant);
  CHECK(decode_json(pre + R"("stored"}})") == DynamoErrc::wrong_type);
  CHECK(decode_json(pre + R"({"cleared":null,"removed":{"block_hashes":[]}}}})") ==
        DynamoErrc::bad_length);
  CHECK(decode_json(pre + R"({"cleared":1}}})") == DynamoErrc::wrong_type);
  CHECK(decode_json(pre + R"(7}})") == DynamoErrc::wrong_type);
  CHECK(decode_json(pre + R"({"stored":{"parent_hash":null}}}})") == DynamoErrc::missing_field);
  CHECK(decode_json(pre + R"({"stored":{"parent_hash":2.5,"blocks":[]}}}})") ==
        DynamoErrc::wrong_type);
  CHECK(decode_json(pre + R"({"stored":{"blocks":[{"block_hash":1}]}}}})") ==
        DynamoErrc::missing_field);
  CHECK(
      decode_json(
          pre +
          R"({"stored":{"blocks":[{"block_hash":1,"tokens_hash":2,"mm_extra_info":{"mm_objects":[{"mm_hash":1,"offsets":[[1,2,3]]}]}}]}}}})") ==
      DynamoErrc::bad_length);
  CHECK(decode_json(
            pre +
            R"({"stored":{"blocks":[{"block_hash":1,"tokens_hash":2,"mm_extra_info":7}]}}}})") ==
        DynamoErrc::wrong_type);
  CHECK(decode_json(R"({"worker_id":1,"worker_id":2,"event":{"event_id":5,"data":"cleared"}})") ==
        DynamoErrc::duplicate_field);
  CHECK(decode_json(R"({"worker_id":1})") == DynamoErrc::missing_field);
  CHECK(decode_json(
            R"({"worker_id":1,"event":{"event_id":5,"data":"cleared","dp_rank":4294967296}})") ==
        DynamoErrc::out_of_range);
  CHECK(decode_json(R"({"worker_id":1,"event":{"event_id":5,"data":"cleared","dp_rank":null}})") ==
        DynamoErrc::wrong_type);
  CHECK(decode_json(R"([1,[5,"cleared",2,9]])") == DynamoErrc::bad_length);
  CHECK(decode_json(R"([1])") == DynamoErrc::missing_field);
  CHECK(decode_json("7") == DynamoErrc::wrong_type);
  // JSON syntax.
  CHECK(decode_json(R"({"worker_id":01,"event":{}})") == DynamoErrc::invalid_syntax);
  CHECK(decode_json(R"({"worker_id":1,})") == DynamoErrc::invalid_syntax);
  CHECK(decode_json(R"({"worker_id":NaN})") == DynamoErrc::invalid_syntax);
  CHECK(decode_json("{\"a\x01\":1}") == DynamoErrc::invalid_syntax);
  CHECK(decode_json("{\"\\ud800\":1}") == DynamoErrc::invalid_syntax);
  CHECK(decode_json("{\"\xc3\x28\":1}") == DynamoErrc::invalid_syntax);
  // Built by append rather than operator+: g++ 12 at -O2 reports a false
  // -Warray-bounds on operator+(string&&, const char*) here.
  for (const std::string_view tail : {std::string_view(" x"), std::string_view("{}")}) {
    std::string text(kClearedJson);
    text.append(tail);
    CHECK(decode_json(text) == DynamoErrc::trailing_bytes);
  }
  // Every strict prefix of a fixture is truncated (or empty).
  for (const Fixture& f : fixtures()) {
    INFO(f.name);
    for (std::size_t n = 1; n < f.json.size(); ++n) {
      INFO(n);
      const DynamoErrc e = decode_json(f.json.substr(0, n));
      CHECK(e == DynamoErrc::truncated);
    }
    const Bytes mp = hex(f.msgpack);
    for (std::size_t n = 0; n < mp.size(); ++n) {
      INFO(n);
      const Bytes cut(mp.begin(), mp.begin() + static_cast<std::ptrdiff_t>(n));
      CHECK(decode_mp(cut) == (n == 0 ? DynamoErrc::empty : DynamoErrc::truncated));
    }
    Bytes more = mp;
    more.push_back(std::byte{0xc0});
    CHECK(decode_mp(more) == DynamoErrc::trailing_bytes);
  }
  // msgpack types: negative, float, reserved byte, non-string key, deep nesting.
  const std::string_view tail =
      " a5 6576656e74 82 a8 6576656e745f6964 05 a4 64617461 a7 636c6561726564";
  CHECK(decode_mp(hex("82 a9 776f726b65725f6964 d0 ff" + std::string(tail))) ==
        DynamoErrc::out_of_range);
  CHECK(decode_mp(hex("82 a9 776f726b65725f6964 cb 3ff0000000000000" + std::string(tail))) ==
        DynamoErrc::wrong_type);
  CHECK(decode_mp(hex("82 a9 776f726b65725f6964 c1" + std::string(tail))) ==
        DynamoErrc::invalid_syntax);
  CHECK(decode_mp(hex("82 00 01" + std::string(tail))) == DynamoErrc::wrong_type);
  Bytes deep(20, std::byte{0x91});
  deep.push_back(std::byte{0x00});
  CHECK(decode_mp(deep) == DynamoErrc::too_deep);
  // Limits.
  DynamoRouterEvent ev;
  DynamoDecodeOptions small;
  small.max_payload_bytes = 8;
  CHECK(decode_dynamo_router_event(text(kClearedJson), DynamoWireFormat::json, ev, small).code ==
        DynamoErrc::too_large);
}

TEST_CASE("A rejected Dynamo payload leaves the output untouched") {
  DynamoRouterEvent ev = stored_event();
  const auto st = decode_dynamo_router_event(
      text(
          R"({"worker_id":1,"event":{"event_id":5,"data":{"removed":{"block_hashes":[1,2,-3]}}}})"),
      DynamoWireFormat::json, ev);
  CHECK(st.code == DynamoErrc::out_of_range);
  CHECK(!st.detail.empty());
  CHECK(ev == stored_event());
  CHECK(promptcache::to_string(DynamoErrc::unknown_variant) == "unknown_variant");
}

TEST_CASE("Dynamo event plane envelopes decode and encode exactly") {
  const Bytes b = hex(kEnvelopeMsgpack);
  DynamoEventEnvelope env;
  REQUIRE(decode_dynamo_event_envelope(b, env).ok());
  CHECK(env.topic == "kv-events");
  CHECK(env.publisher_id == 0x00123456789ABCDEULL);
  CHECK(env.sequence == 17U);
  CHECK(env.published_at == 1700000000000ULL);
  CHECK(env.payload == hex(kClearedMsgpack));
  CHECK(encode_dynamo_event_envelope(env) == b);
  DynamoRouterEvent ev;
  REQUIRE(decode_dynamo_router_event(env.payload, DynamoWireFormat::msgpack, ev).ok());
  CHECK(ev == cleared_event());
  // A later field (published_at_ns) is ignored; a missing one is not.
  Bytes later = b;
  later[0] = std::byte{0x86};
  const Bytes extra = hex("af 7075626c69736865645f61745f6e73 01");
  later.insert(later.end(), extra.begin(), extra.end());
  CHECK(decode_dynamo_event_envelope(later, env).ok());
  Bytes missing = hex("81 a5 746f706963 a9 6b762d6576656e7473");
  CHECK(decode_dynamo_event_envelope(missing, env).code == DynamoErrc::missing_field);
}
