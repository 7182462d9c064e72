// Tests for kv_event_wire.hpp: golden decodes of payloads in the three
// layouts vLLM and SGLang publish (tests/kv_event_wire/, written by
// make_fixtures.py with Python's msgpack following msgspec's rules), the
// malformed payloads each rejected with its error, and the decoding options.
#include <promptcache/kv_event_wire.hpp>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"

#ifndef PROMPTCACHE_KV_WIRE_FIXTURES
#error "PROMPTCACHE_KV_WIRE_FIXTURES must name the fixture directory"
#endif

using promptcache::KvBlock;
using promptcache::KvEventData;
using promptcache::KvEventWireDecoder;
using promptcache::KvWireBatch;
using promptcache::KvWireErrc;
using promptcache::KvWireOptions;
using promptcache::KvWireStatus;
namespace kv_event = promptcache::kv_event;

namespace {

std::string fixture_path(const std::string& name) {
  // Appended in place: GCC 12 at -O2 mistakes operator+ on a temporary string for an
  // out-of-bounds copy when the standard headers come from a precompiled header.
  std::string path(PROMPTCACHE_KV_WIRE_FIXTURES);
  path += '/';
  path += name;
  return path;
}

std::vector<std::byte> read_bytes(const std::string& name) {
  std::ifstream in(fixture_path(name), std::ios::binary);
  REQUIRE(in.good());
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  for (std::size_t i = 0; i < chars.size(); ++i)
    out[i] = static_cast<std::byte>(chars[i]);
  return out;
}

std::string read_text(const std::string& name) {
  std::ifstream in(fixture_path(name));
  REQUIRE(in.good());
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The batch a .golden file describes; tokens hashes computed here with
// block_hash.hpp from the listed tokens, LoRA name and media hashes.
KvWireBatch parse_golden(const std::string& text) {
  KvWireBatch b;
  std::istringstream lines(text);
  std::string line;
  kv_event::Stored* cur = nullptr;
  std::string lora;
  bool eagle = false;
  std::size_t block_size = 0;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    std::string word;
    in >> word;
    if (word == "ts") {
      std::string v;
      in >> v;
      b.ts = std::stod(v);
    } else if (word == "dp_rank") {
      std::string v;
      in >> v;
      if (v != "none") b.dp_rank = static_cast<std::uint32_t>(std::stoul(v));
    } else if (word == "counts") {
      in >> b.unknown_events >> b.ignored_events >> b.dropped_blocks;
    } else if (word == "cleared") {
      b.events.emplace_back(kv_event::Cleared{});
      cur = nullptr;
    } else if (word == "removed") {
      kv_event::Removed r;
      std::uint64_t h = 0;
      while (in >> h)
        r.block_hashes.push_back(h);
      b.blocks += r.block_hashes.size();
      b.events.emplace_back(std::move(r));
      cur = nullptr;
    } else if (word == "stored") {
      kv_event::Stored s;
      std::string field;
      while (in >> field) {
        const auto eq = field.find('=');
        const std::string key = field.substr(0, eq), value = field.substr(eq + 1);
        if (key == "parent" && value != "none") s.parent_hash = std::stoull(value);
        if (key == "lora") lora = value == "-" ? std::string() : value;
        if (key == "eagle") eagle = value == "1";
        if (key == "block_size") block_size = std::stoul(value);
      }
      b.events.emplace_back(std::move(s));
      cur = &std::get<kv_event::Stored>(b.events.back());
    } else if (word == "block") {
      REQUIRE(cur != nullptr);
      std::uint64_t name = 0;
      in >> name >> word;
      REQUIRE(word == "tokens");
      std::vector<std::uint32_t> tokens;
      std::vector<std::uint64_t> media;
      bool in_media = false;
      while (in >> word) {
        if (word == "media") {
          in_media = true;
        } else if (in_media) {
          media.push_back(std::stoull(word));
        } else {
          tokens.push_back(static_cast<std::uint32_t>(std::stoul(word)));
        }
      }
      const std::span<const std::uint64_t> media_span(media);
      promptcache::BlockHashOptions o;
      o.seed = promptcache::block_hash_seed(lora);
      o.media = std::span<const std::span<const std::uint64_t>>(&media_span, 1);
      o.eagle = eagle;
      const auto locals = promptcache::local_block_hashes(tokens, block_size, o);
      REQUIRE(locals.size() == 1);
      cur->blocks.push_back(KvBlock{name, locals[0]});
      ++b.blocks;
    }
  }
  return b;
}

void check_same(const KvWireBatch& got, const KvWireBatch& want) {
  CHECK(got.ts == want.ts);
  CHECK(got.dp_rank == want.dp_rank);
  CHECK(got.unknown_events == want.unknown_events);
  CHECK(got.ignored_events == want.ignored_events);
  CHECK(got.dropped_blocks == want.dropped_blocks);
  CHECK(got.blocks == want.blocks);
  REQUIRE(got.events.size() == want.events.size());
  for (std::size_t i = 0; i < want.events.size(); ++i) {
    INFO("event " << i);
    CHECK(got.events[i] == want.events[i]);
  }
}

const char* const golden_fixtures[] = {
    "sglang_array_v0", "sglang_array_dp",      "vllm_array_events", "vllm_array_map_events",
    "vllm_map_batch",  "vllm_map_batch_eagle", "incomplete_tokens", "empty_events",
};

KvWireErrc errc_named(const std::string& s) {
  for (auto e : {KvWireErrc::ok, KvWireErrc::empty, KvWireErrc::too_large, KvWireErrc::truncated,
                 KvWireErrc::invalid_msgpack, KvWireErrc::trailing_bytes, KvWireErrc::too_deep,
                 KvWireErrc::bad_batch, KvWireErrc::bad_event, KvWireErrc::bad_value})
    if (promptcache::to_string(e) == s) return e;
  FAIL("unknown error code name " << s);
  return KvWireErrc::ok;
}

// msgspec-style packing helpers for payloads built in the tests.
using Buffer = msgpack::sbuffer;

}  // namespace

TEST_CASE("golden decodes of every layout", "[kv_event_wire]") {
  KvEventWireDecoder decoder;
  KvWireBatch got;
  for (const char* name : golden_fixtures) {
    INFO("fixture " << name);
    const auto bytes = read_bytes(std::string(name) + ".msgpack");
    const KvWireBatch want = parse_golden(read_text(std::string(name) + ".golden"));
    const KvWireStatus st = decoder.decode(bytes, got);
    INFO("status " << promptcache::to_string(st.code) << " " << st.detail);
    REQUIRE(st.ok());
    check_same(got, want);
  }
}

TEST_CASE("the golden fixtures hold what they claim to cover", "[kv_event_wire]") {
  // Guards the fixtures themselves: hashes of each kind and every layout.
  KvEventWireDecoder decoder;
  KvWireBatch b;
  REQUIRE(decoder.decode(read_bytes("sglang_array_v0.msgpack"), b).ok());
  const auto& s = std::get<kv_event::Stored>(b.events[0]);
  CHECK(s.blocks[0].block_hash == static_cast<std::uint64_t>(-5));  // signed
  CHECK(s.blocks[1].block_hash == std::uint64_t{1} << 63);          // INT64_MIN
  REQUIRE(decoder.decode(read_bytes("vllm_array_events.msgpack"), b).ok());
  CHECK(std::get<kv_event::Stored>(b.events[0]).blocks[0].block_hash == ~std::uint64_t{0});
  CHECK(std::get<kv_event::Stored>(b.events[0]).parent_hash == ~std::uint64_t{0} - 1U);
  REQUIRE(decoder.decode(read_bytes("vllm_map_batch.msgpack"), b).ok());
  CHECK_FALSE(b.dp_rank.has_value());
}

TEST_CASE("malformed payloads are rejected with their error and an empty batch",
          "[kv_event_wire]") {
  KvEventWireDecoder decoder;
  const auto good = read_bytes("vllm_array_map_events.msgpack");
  const KvWireBatch want = parse_golden(read_text("vllm_array_map_events.golden"));
  std::istringstream list(read_text("malformed.txt"));
  std::string file, code;
  std::size_t n = 0;
  while (list >> file >> code) {
    INFO("fixture " << file);
    KvWireBatch out;
    out.events.emplace_back(kv_event::Cleared{});  // must be cleared
    out.unknown_events = 9;
    const KvWireStatus st = decoder.decode(read_bytes(file), out);
    CHECK(st.code == errc_named(code));
    CHECK_FALSE(st.detail.empty());
    CHECK(out.events.empty());
    CHECK(out.unknown_events == 0);
    CHECK(out.blocks == 0);
    // The decoder is reusable after any error.
    KvWireBatch again;
    REQUIRE(decoder.decode(good, again).ok());
    check_same(again, want);
    ++n;
  }
  CHECK(n >= 30);
}

TEST_CASE("an error inside an event names the event", "[kv_event_wire]") {
  KvWireBatch out;
  const KvWireStatus st =
      KvEventWireDecoder().decode(read_bytes("malformed_bad_second_event.msgpack"), out);
  CHECK(st.code == KvWireErrc::bad_value);
  CHECK(st.event == 1);
}

TEST_CASE("empty strings decode: an empty tag is unknown, an empty LoRA name is no LoRA",
          "[kv_event_wire]") {
  // msgpack-cxx hands a zero-length string to the parser's visitor without a data pointer.
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_array(2);
  p.pack(1.0);
  p.pack_array(2);
  p.pack_array(1);
  p.pack(std::string());
  p.pack_array(8);
  p.pack(std::string("BlockStored"));
  p.pack_array(1);
  p.pack(7U);
  p.pack_nil();
  p.pack_array(1);
  p.pack(5U);
  p.pack(1U);
  p.pack_nil();
  p.pack_nil();
  p.pack(std::string());
  KvWireBatch out;
  const KvWireStatus st = KvEventWireDecoder().decode(buf.data(), buf.size(), out);
  REQUIRE(st.ok());
  CHECK(out.unknown_events == 1);
  REQUIRE(out.events.size() == 1);
  const std::vector<std::uint32_t> tokens{5};
  const auto local = promptcache::local_block_hashes(tokens, 1);
  CHECK(std::get<kv_event::Stored>(out.events[0]).blocks == std::vector<KvBlock>{{7, local.at(0)}});
}

TEST_CASE("byte-string hashes are named by their last 8 bytes, big-endian", "[kv_event_wire]") {
  std::vector<unsigned char> b32(32);
  for (std::size_t i = 0; i < b32.size(); ++i)
    b32[i] = static_cast<unsigned char>(i + 1);
  CHECK(promptcache::kv_wire_hash_from_bytes(b32) == 0x191a1b1c1d1e1f20ULL);
  const std::vector<unsigned char> b16(b32.begin(), b32.begin() + 16);
  CHECK(promptcache::kv_wire_hash_from_bytes(b16) == 0x090a0b0c0d0e0f10ULL);
  const std::vector<unsigned char> b3 = {0x01, 0x02, 0x03};
  CHECK(promptcache::kv_wire_hash_from_bytes(b3) == 0x010203ULL);
  const std::vector<unsigned char> ff(8, 0xff);
  CHECK(promptcache::kv_wire_hash_from_bytes(ff) == ~std::uint64_t{0});
  CHECK(promptcache::kv_wire_hash_from_bytes({}) == 0);
}

TEST_CASE("media hashes: 64 hex digits give their first 16 as a number", "[kv_event_wire]") {
  const std::string id = "0123456789ABCDEF" + std::string(48, 'a');
  CHECK(promptcache::kv_wire_media_hash(id) == 0x0123456789abcdefULL);
  CHECK_FALSE(promptcache::kv_wire_media_hash(id.substr(1)).has_value());
  CHECK_FALSE(promptcache::kv_wire_media_hash(id + "0").has_value());
  std::string bad_digit(63, '0');
  bad_digit += 'g';
  CHECK_FALSE(promptcache::kv_wire_media_hash(bad_digit).has_value());
  CHECK_FALSE(promptcache::kv_wire_media_hash("").has_value());
}

namespace {

// One logical batch (two stored events, a removal, a clear) packed in each
// layout by msgpack-cxx, as msgspec would write it.
enum class Layout { array_array, array_map, map_map };

void pack_stored(msgpack::packer<Buffer>& p, Layout layout, std::uint64_t h0, std::uint64_t h1,
                 bool with_parent, const std::vector<std::uint32_t>& tokens) {
  if (layout == Layout::array_array) {
    p.pack_array(9);
    p.pack(std::string("BlockStored"));
  } else {
    p.pack_map(8);
    p.pack(std::string("type"));
    p.pack(std::string("BlockStored"));
    p.pack(std::string("block_hashes"));
  }
  p.pack_array(2);
  p.pack(h0);
  p.pack(h1);
  if (layout != Layout::array_array) p.pack(std::string("parent_block_hash"));
  if (with_parent)
    p.pack(std::uint64_t{77});
  else
    p.pack_nil();
  if (layout != Layout::array_array) p.pack(std::string("token_ids"));
  p.pack(tokens);
  if (layout != Layout::array_array) p.pack(std::string("block_size"));
  p.pack(4);
  if (layout != Layout::array_array) p.pack(std::string("lora_id"));
  p.pack_nil();
  if (layout != Layout::array_array) p.pack(std::string("medium"));
  p.pack(std::string("GPU"));
  if (layout != Layout::array_array) p.pack(std::string("lora_name"));
  p.pack(std::string("lora-x"));
  if (layout == Layout::array_array) p.pack_nil();  // extra_keys (omitted in maps)
}

Buffer pack_batch(Layout layout) {
  Buffer buf;
  msgpack::packer<Buffer> p(buf);
  const std::vector<std::uint32_t> t1 = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<std::uint32_t> t2 = {9, 10, 11, 12, 13, 14, 15, 16};
  if (layout == Layout::map_map) {
    p.pack_map(3);
    p.pack(std::string("ts"));
    p.pack(12.5);
    p.pack(std::string("events"));
  } else {
    p.pack_array(3);
    p.pack(12.5);
  }
  p.pack_array(4);
  pack_stored(p, layout, 77, 78, false, t1);
  pack_stored(p, layout, 79, 80, true, t2);
  if (layout == Layout::array_array) {
    p.pack_array(3);
    p.pack(std::string("BlockRemoved"));
  } else {
    p.pack_map(3);
    p.pack(std::string("type"));
    p.pack(std::string("BlockRemoved"));
    p.pack(std::string("block_hashes"));
  }
  p.pack_array(1);
  p.pack(std::uint64_t{80});
  if (layout != Layout::array_array) p.pack(std::string("medium"));
  p.pack(std::string("GPU"));
  if (layout == Layout::array_array) {
    p.pack_array(1);
  } else {
    p.pack_map(1);
    p.pack(std::string("type"));
  }
  p.pack(std::string("AllBlocksCleared"));
  if (layout == Layout::map_map) p.pack(std::string("data_parallel_rank"));
  p.pack(5);
  return buf;
}

KvWireBatch decode_ok(const Buffer& buf, const KvWireOptions& options = {}) {
  KvWireBatch b;
  const KvWireStatus st = KvEventWireDecoder(options).decode(buf.data(), buf.size(), b);
  INFO(promptcache::to_string(st.code) << " " << st.detail);
  REQUIRE(st.ok());
  return b;
}

}  // namespace

TEST_CASE("the three layouts of one batch decode to the same events", "[kv_event_wire]") {
  const KvWireBatch a = decode_ok(pack_batch(Layout::array_array));
  const KvWireBatch m = decode_ok(pack_batch(Layout::array_map));
  const KvWireBatch mm = decode_ok(pack_batch(Layout::map_map));
  check_same(m, a);
  check_same(mm, a);
  REQUIRE(a.events.size() == 4);
  CHECK(a.dp_rank == 5u);
  CHECK(a.ts == 12.5);
  const auto& s = std::get<kv_event::Stored>(a.events[1]);
  CHECK(s.parent_hash == 77u);
  // The LoRA name seeds the tokens hash, as Dynamo's router hashes it.
  promptcache::BlockHashOptions o;
  o.seed = promptcache::block_hash_seed("lora-x");
  const std::vector<std::uint32_t> t2 = {9, 10, 11, 12, 13, 14, 15, 16};
  const auto locals = promptcache::local_block_hashes(t2, 4, o);
  CHECK(s.blocks == std::vector<KvBlock>{{79, locals[0]}, {80, locals[1]}});
  CHECK(std::get<kv_event::Stored>(a.events[0]).blocks[0].tokens_hash !=
        promptcache::local_block_hashes(std::vector<std::uint32_t>{1, 2, 3, 4}, 4)[0]);
}

TEST_CASE("options: the router's block size and device-only media", "[kv_event_wire]") {
  KvWireOptions o;
  o.block_size = 4;
  CHECK(decode_ok(pack_batch(Layout::array_array), o).events.size() == 4);
  o.block_size = 8;  // every stored event has another block size: no blocks kept
  const KvWireBatch b = decode_ok(pack_batch(Layout::array_array), o);
  CHECK(b.events.size() == 2);  // the removal and the clear
  CHECK(b.ignored_events == 2);
  CHECK(b.dropped_blocks == 4);

  // A CPU-tier event applies only when device_only is off.
  const auto bytes = read_bytes("vllm_array_map_events.msgpack");
  KvWireBatch d;
  REQUIRE(KvEventWireDecoder().decode(bytes, d).ok());
  KvWireOptions all;
  all.device_only = false;
  KvWireBatch e;
  REQUIRE(KvEventWireDecoder(all).decode(bytes, e).ok());
  CHECK(e.events.size() == d.events.size() + 1);
  CHECK(e.ignored_events == d.ignored_events - 1);
}

TEST_CASE("options: payload size and nesting limits", "[kv_event_wire]") {
  const Buffer buf = pack_batch(Layout::map_map);
  KvWireOptions o;
  o.max_payload_bytes = buf.size();
  KvWireBatch b;
  CHECK(KvEventWireDecoder(o).decode(buf.data(), buf.size(), b).ok());
  o.max_payload_bytes = buf.size() - 1;
  CHECK(KvEventWireDecoder(o).decode(buf.data(), buf.size(), b).code == KvWireErrc::too_large);
  CHECK(b.events.empty());

  // This batch nests 4 containers deep (batch, events, event, block_hashes).
  KvWireOptions d;
  d.max_depth = 4;
  CHECK(KvEventWireDecoder(d).decode(buf.data(), buf.size(), b).ok());
  d.max_depth = 3;
  CHECK(KvEventWireDecoder(d).decode(buf.data(), buf.size(), b).code == KvWireErrc::too_deep);
}

TEST_CASE("decoded batches apply to a KvIndex", "[kv_event_wire]") {
  promptcache::KvIndex index;
  const promptcache::KvWorker w{1, 0};
  const KvWireBatch b = decode_ok(pack_batch(Layout::array_map));
  std::uint64_t id = 0;
  std::vector<promptcache::KvEventStatus> st;
  for (const KvEventData& e : b.events)
    st.push_back(index.apply(w, promptcache::KvEvent{id++, e}).status);
  using S = promptcache::KvEventStatus;
  CHECK(st == std::vector<S>{S::applied, S::applied, S::applied, S::applied});
  CHECK(index.block_count(w) == 0);  // cleared at the end
  CHECK(index.check_invariants());
}

TEST_CASE("duplicate hashes and unknown parents decode; the index refuses them unchanged",
          "[kv_event_wire]") {
  // Neither is a wire error: the decoder passes both on, and KvIndex answers for them.
  Buffer buf;
  msgpack::packer<Buffer> p(buf);
  p.pack_array(2);
  p.pack(3.0);
  p.pack_array(2);
  pack_stored(p, Layout::array_array, 5, 5, false, {1, 2, 3, 4, 5, 6, 7, 8});  // 5 twice
  pack_stored(p, Layout::array_array, 6, 7, true, {1, 2, 3, 4, 5, 6, 7, 8});   // parent 77
  const KvWireBatch b = decode_ok(buf);
  REQUIRE(b.events.size() == 2);
  promptcache::KvIndex index;
  const promptcache::KvWorker w{1, 0};
  using S = promptcache::KvEventStatus;
  CHECK(index.apply(w, promptcache::KvEvent{0, b.events[0]}).status == S::block_conflict);
  CHECK(index.apply(w, promptcache::KvEvent{1, b.events[1]}).status == S::parent_not_found);
  CHECK(index.block_count(w) == 0);
  CHECK(index.node_count() == 0);
  CHECK(index.check_invariants());
}
