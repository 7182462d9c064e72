// Fuzz harness for the Dynamo RouterEvent codec (dynamo_kv_event.hpp). The
// first byte picks one of two modes.
//
// Raw bytes: the rest of the input is decoded as it is, as msgpack and as
// JSON RouterEvents and as an envelope, each from its own exactly sized
// buffer, under limits from the input. A decode must never crash, leak, throw
// or read past the payload; a rejected payload must leave the output as it
// was; an accepted one must re-encode to bytes that decode to the same event
// (and, re-encoded, to the same bytes again).
//
// Structured: the input describes one event (stored with or without a parent
// and up to 40 blocks, removed, cleared; ids, ranks and hashes at their
// extremes), which is encoded in both formats and must decode back to itself.
// Every strict prefix of each encoding must then be rejected (empty at length
// 0, truncated otherwise, with the output untouched), a byte appended must be
// rejected as trailing bytes (JSON: unless it is whitespace), and the depth
// and size limits must cut exactly at the encoding's depth and size.
//
// One operation is one decode.
#include <fuzzer/FuzzedDataProvider.h>
#include <promptcache/dynamo_kv_event.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <variant>
#include <vector>

#include "fuzz_support.hpp"

namespace {

using promptcache::DynamoDecodeOptions;
using promptcache::DynamoErrc;
using promptcache::DynamoEventEnvelope;
using promptcache::DynamoRouterEvent;
using promptcache::DynamoWireFormat;
using promptcache::KvBlock;
namespace kv_event = promptcache::kv_event;
using Bytes = std::vector<std::byte>;

fuzz::OperationReport report{"fuzz_dynamo_kv_event"};

constexpr std::uint64_t u64max = std::numeric_limits<std::uint64_t>::max();

// A sentinel the failed decodes must leave in place.
DynamoRouterEvent sentinel() {
  DynamoRouterEvent ev;
  ev.worker = {0x5E5E5E5E5E5E5E5EULL, 77};
  ev.event.event_id = 99;
  ev.event.data = kv_event::Removed{{1, 2, 3}};
  return ev;
}

// Decodes from an exactly sized heap copy, so ASan sees any overread.
promptcache::DynamoStatus decode(const Bytes& b, DynamoWireFormat f, DynamoRouterEvent& out,
                                 const DynamoDecodeOptions& o = {}) {
  ++fuzz::operations();
  std::unique_ptr<std::byte[]> copy(new std::byte[b.size() == 0 ? 1 : b.size()]);
  if (!b.empty()) std::memcpy(copy.get(), b.data(), b.size());
  return promptcache::decode_dynamo_router_event(std::span<const std::byte>(copy.get(), b.size()),
                                                 f, out, o);
}

void check_accepted(const DynamoRouterEvent& ev, DynamoWireFormat f) {
  const Bytes again = promptcache::encode_dynamo_router_event(ev, f);
  DynamoRouterEvent back;
  FUZZ_CHECK(decode(again, f, back).ok());
  FUZZ_CHECK(back == ev);
  FUZZ_CHECK(promptcache::encode_dynamo_router_event(back, f) == again);
  // The other format carries the same event.
  const auto other =
      f == DynamoWireFormat::json ? DynamoWireFormat::msgpack : DynamoWireFormat::json;
  DynamoRouterEvent cross;
  FUZZ_CHECK(decode(promptcache::encode_dynamo_router_event(ev, other), other, cross).ok());
  FUZZ_CHECK(cross == ev);
}

void raw_mode(FuzzedDataProvider& in) {
  DynamoDecodeOptions o;
  if (in.ConsumeBool()) o.max_depth = in.ConsumeIntegralInRange<std::uint32_t>(0, 20);
  if (in.ConsumeBool()) o.max_payload_bytes = in.ConsumeIntegralInRange<std::size_t>(0, 4096);
  const std::vector<std::uint8_t> rest = in.ConsumeRemainingBytes<std::uint8_t>();
  Bytes b(rest.size());
  if (!rest.empty()) std::memcpy(b.data(), rest.data(), rest.size());
  for (const auto f : {DynamoWireFormat::msgpack, DynamoWireFormat::json}) {
    DynamoRouterEvent ev = sentinel();
    const auto st = decode(b, f, ev, o);
    if (!st.ok()) {
      FUZZ_CHECK(ev == sentinel());
      FUZZ_CHECK(!st.detail.empty());
      FUZZ_CHECK(st.code != DynamoErrc::out_of_memory);
      continue;
    }
    FUZZ_CHECK(b.size() <= o.max_payload_bytes);
    check_accepted(ev, f);
  }
  DynamoEventEnvelope env;
  env.topic = "sentinel";
  ++fuzz::operations();
  const auto st = promptcache::decode_dynamo_event_envelope(b, env, o);
  if (!st.ok()) {
    FUZZ_CHECK(env.topic == "sentinel" && env.payload.empty());
  } else {
    DynamoEventEnvelope back;
    FUZZ_CHECK(promptcache::decode_dynamo_event_envelope(
                   promptcache::encode_dynamo_event_envelope(env), back)
                   .ok());
    FUZZ_CHECK(back == env);
  }
}

std::uint64_t value(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0:
      return 0;
    case 1:
      return u64max;
    case 2:
      return (std::uint64_t{1} << 53) + in.ConsumeIntegralInRange<std::uint64_t>(0, 3);
    case 3:
      return in.ConsumeIntegralInRange<std::uint64_t>(0, 70000);
    default:
      return in.ConsumeIntegral<std::uint64_t>();
  }
}

// The deepest container nesting of the encoding.
std::uint32_t depth_of(const DynamoRouterEvent& ev) {
  if (const auto* st = std::get_if<kv_event::Stored>(&ev.event.data))
    return st->blocks.empty() ? 5U : 6U;  // event, data, stored, blocks, block
  if (std::holds_alternative<kv_event::Removed>(ev.event.data)) return 5U;
  return 2U;
}

void structured_mode(FuzzedDataProvider& in) {
  DynamoRouterEvent ev;
  ev.worker.worker_id = value(in);
  ev.worker.dp_rank = in.ConsumeBool() ? std::numeric_limits<std::uint32_t>::max()
                                       : in.ConsumeIntegral<std::uint32_t>();
  ev.event.event_id = value(in);
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0: {
      kv_event::Stored st;
      if (in.ConsumeBool()) st.parent_hash = value(in);
      const int n = in.ConsumeIntegralInRange<int>(0, 40);
      for (int i = 0; i < n; ++i)
        st.blocks.push_back(KvBlock{value(in), value(in)});
      ev.event.data = std::move(st);
      break;
    }
    case 1: {
      kv_event::Removed rm;
      const int n = in.ConsumeIntegralInRange<int>(0, 40);
      for (int i = 0; i < n; ++i)
        rm.block_hashes.push_back(value(in));
      ev.event.data = std::move(rm);
      break;
    }
    default:
      ev.event.data = kv_event::Cleared{};
  }
  for (const auto f : {DynamoWireFormat::msgpack, DynamoWireFormat::json}) {
    const Bytes b = promptcache::encode_dynamo_router_event(ev, f);
    DynamoRouterEvent back;
    FUZZ_CHECK(decode(b, f, back).ok());
    FUZZ_CHECK(back == ev);
    // Prefixes (all of them for short encodings, a sample otherwise).
    const std::size_t step = b.size() > 512 ? b.size() / 64 : 1;
    for (std::size_t n = 0; n < b.size(); n += step) {
      DynamoRouterEvent out = sentinel();
      const Bytes cut(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n));
      const auto st = decode(cut, f, out);
      FUZZ_CHECK(st.code == (n == 0 ? DynamoErrc::empty : DynamoErrc::truncated));
      FUZZ_CHECK(out == sentinel());
    }
    Bytes more = b;
    const auto extra = in.ConsumeIntegral<std::uint8_t>();
    more.push_back(static_cast<std::byte>(extra));
    DynamoRouterEvent out = sentinel();
    const auto st = decode(more, f, out);
    const bool ws = extra == ' ' || extra == '\t' || extra == '\n' || extra == '\r';
    if (f == DynamoWireFormat::json && ws) {
      FUZZ_CHECK(st.ok() && out == ev);
    } else {
      FUZZ_CHECK(st.code == DynamoErrc::trailing_bytes);
      FUZZ_CHECK(out == sentinel());
    }
    // Limits cut exactly at the encoding's depth and size.
    DynamoDecodeOptions o;
    o.max_depth = depth_of(ev);
    FUZZ_CHECK(decode(b, f, out, o).ok());
    o.max_depth -= 1U;
    FUZZ_CHECK(decode(b, f, out, o).code == DynamoErrc::too_deep);
    o = DynamoDecodeOptions{};
    o.max_payload_bytes = b.size();
    FUZZ_CHECK(decode(b, f, out, o).ok());
    o.max_payload_bytes = b.size() - 1U;
    FUZZ_CHECK(decode(b, f, out, o).code == DynamoErrc::too_large);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  FuzzedDataProvider in(data + 1, size - 1);
  if (data[0] < 0x80)
    raw_mode(in);
  else
    structured_mode(in);
  return 0;
}
