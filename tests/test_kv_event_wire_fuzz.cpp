// Mutation and random-input testing of the KV event wire decoder: every
// payload either decodes into a consistent batch or is rejected with an error
// and an empty batch; nothing crashes, reads out of bounds or leaks (run it
// under the asan preset). Decoded batches are applied to a KvIndex, which
// must stay consistent. Deterministic: fixed seeds.
#include <promptcache/kv_event_wire.hpp>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "catch.hpp"

#ifndef PROMPTCACHE_KV_WIRE_FIXTURES
#error "PROMPTCACHE_KV_WIRE_FIXTURES must name the fixture directory"
#endif

using promptcache::KvEventWireDecoder;
using promptcache::KvWireBatch;
using promptcache::KvWireErrc;
using promptcache::KvWireStatus;
namespace kv_event = promptcache::kv_event;

namespace {

using Bytes = std::vector<std::byte>;

Bytes read_bytes(const std::string& name) {
  std::ifstream in(std::string(PROMPTCACHE_KV_WIRE_FIXTURES) + "/" + name, std::ios::binary);
  REQUIRE(in.good());
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Bytes out(chars.size());
  for (std::size_t i = 0; i < chars.size(); ++i)
    out[i] = static_cast<std::byte>(chars[i]);
  return out;
}

std::vector<Bytes> seeds() {
  std::vector<Bytes> out;
  for (const char* n :
       {"sglang_array_v0", "sglang_array_dp", "vllm_array_events", "vllm_array_map_events",
        "vllm_map_batch", "vllm_map_batch_eagle", "incomplete_tokens", "empty_events"})
    out.push_back(read_bytes(std::string(n) + ".msgpack"));
  return out;
}

struct Stats {
  std::size_t ok = 0;
  std::size_t rejected = 0;
  std::size_t by_code[10] = {};
};

// Decodes `input` and checks the batch is either consistent or empty; then
// applies a decoded batch to `index` under a worker of its own.
void check_one(KvEventWireDecoder& decoder, const Bytes& input, promptcache::KvIndex& index,
               std::uint64_t worker, Stats& stats) {
  KvWireBatch b;
  const KvWireStatus st = decoder.decode(input, b);
  ++stats.by_code[static_cast<std::size_t>(st.code)];
  if (!st.ok()) {
    ++stats.rejected;
    REQUIRE(b.events.empty());
    REQUIRE(b.blocks == 0);
    REQUIRE(b.unknown_events == 0);
    REQUIRE(b.ignored_events == 0);
    REQUIRE(b.dropped_blocks == 0);
    REQUIRE_FALSE(st.detail.empty());
    return;
  }
  ++stats.ok;
  std::size_t blocks = 0;
  for (const auto& e : b.events) {
    if (const auto* s = std::get_if<kv_event::Stored>(&e)) {
      REQUIRE_FALSE(s->blocks.empty());
      blocks += s->blocks.size();
    } else if (const auto* r = std::get_if<kv_event::Removed>(&e)) {
      blocks += r->block_hashes.size();
    }
  }
  REQUIRE(blocks == b.blocks);
  const promptcache::KvWorker w{worker % 8U, 0};
  std::uint64_t id = index.cursor(w) && !index.cursor(w)->is_initial()
                         ? *index.cursor(w)->last_applied_id() + 1U
                         : 0U;
  for (const auto& e : b.events)
    index.apply(w, promptcache::KvEvent{id++, e});
}

}  // namespace

TEST_CASE("mutated fixtures never crash the decoder", "[kv_event_wire][fuzz]") {
  const std::vector<Bytes> base = seeds();
  std::mt19937_64 rng(0x6b76776972650001ULL);
  KvEventWireDecoder decoder;
  promptcache::KvIndex index;
  Stats stats;
  // Bytes that make a msgpack length field: mutations often hit those.
  const unsigned char markers[] = {0xdc, 0xdd, 0xde, 0xdf, 0xc4, 0xc5, 0xc6, 0xd9, 0xda, 0xdb,
                                   0x9f, 0x8f, 0xbf, 0xc1, 0xc0, 0xcf, 0xd3, 0xcb, 0xca, 0xff};
  constexpr int rounds = 20000;
  for (int i = 0; i < rounds; ++i) {
    Bytes in = base[rng() % base.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits && !in.empty(); ++k) {
      const std::size_t at = rng() % in.size();
      switch (rng() % 7) {
        case 0:  // flip a bit
          in[at] ^= static_cast<std::byte>(1U << (rng() % 8));
          break;
        case 1:  // a random byte
          in[at] = static_cast<std::byte>(rng() & 0xffU);
          break;
        case 2:  // a length marker followed by large length bytes
          in[at] = static_cast<std::byte>(markers[rng() % sizeof(markers)]);
          for (std::size_t j = at + 1; j < in.size() && j < at + 5; ++j)
            in[j] = static_cast<std::byte>(rng() % 2 ? 0xff : rng() & 0xffU);
          break;
        case 3:  // insert a byte
          in.insert(in.begin() + static_cast<std::ptrdiff_t>(at),
                    static_cast<std::byte>(rng() & 0xffU));
          break;
        case 4:  // delete a byte
          in.erase(in.begin() + static_cast<std::ptrdiff_t>(at));
          break;
        case 5:  // truncate
          in.resize(at);
          break;
        default: {  // duplicate a slice in place
          const std::size_t len = std::min<std::size_t>(in.size() - at, 1 + rng() % 16);
          const Bytes slice(in.begin() + static_cast<std::ptrdiff_t>(at),
                            in.begin() + static_cast<std::ptrdiff_t>(at + len));
          in.insert(in.begin() + static_cast<std::ptrdiff_t>(at), slice.begin(), slice.end());
          break;
        }
      }
    }
    check_one(decoder, in, index, static_cast<std::uint64_t>(i), stats);
  }
  CHECK(index.check_invariants());
  // Both outcomes were exercised, and errors of several kinds.
  CHECK(stats.ok > 100);
  CHECK(stats.rejected > 1000);
  CHECK(stats.by_code[static_cast<std::size_t>(KvWireErrc::truncated)] > 0);
  CHECK(stats.by_code[static_cast<std::size_t>(KvWireErrc::bad_value)] > 0);
  CHECK(stats.by_code[static_cast<std::size_t>(KvWireErrc::trailing_bytes)] > 0);
}

TEST_CASE("random bytes never crash the decoder", "[kv_event_wire][fuzz]") {
  std::mt19937_64 rng(0x6b76776972650002ULL);
  KvEventWireDecoder decoder;
  promptcache::KvIndex index;
  Stats stats;
  for (int i = 0; i < 20000; ++i) {
    Bytes in(rng() % 96);
    for (auto& b : in)
      b = static_cast<std::byte>(rng() & 0xffU);
    // Half of them start like a batch, to get past the first checks.
    if (i % 2 == 0 && in.size() >= 10) {
      in[0] = std::byte{0x93};
      in[1] = std::byte{0xcb};
    }
    check_one(decoder, in, index, static_cast<std::uint64_t>(i), stats);
  }
  CHECK(index.check_invariants());
  CHECK(stats.rejected > 10000);
}

namespace {

// A random msgpack value shaped like a batch, with random types in random
// places: reaches the field checks far more often than random bytes do.
void random_value(msgpack::packer<msgpack::sbuffer>& p, std::mt19937_64& rng, int depth) {
  const auto pick = rng() % (depth > 5 ? 8 : 12);
  switch (pick) {
    case 0:
      p.pack_nil();
      break;
    case 1:
      p.pack(rng() % 2 == 0);
      break;
    case 2:
      p.pack(static_cast<std::uint64_t>(rng() % 40));
      break;
    case 3:
      p.pack(static_cast<std::int64_t>(rng() | 0xc000000000000000ULL));
      break;
    case 4:
      p.pack(static_cast<std::uint64_t>(rng()));
      break;
    case 5:
      p.pack(1.5);
      break;
    case 6: {
      const char* tags[] = {"BlockStored", "BlockRemoved", "AllBlocksCleared", "type",        "ts",
                            "events",      "GPU",          "token_ids",        "block_hashes"};
      p.pack(std::string(tags[rng() % 9]));
      break;
    }
    case 7: {
      const std::string bin(rng() % 40, 'x');
      p.pack_bin(static_cast<std::uint32_t>(bin.size()));
      p.pack_bin_body(bin.data(), static_cast<std::uint32_t>(bin.size()));
      break;
    }
    case 8:
    case 9: {
      const auto n = static_cast<std::uint32_t>(rng() % 7);
      p.pack_array(n);
      for (std::uint32_t k = 0; k < n; ++k)
        random_value(p, rng, depth + 1);
      break;
    }
    case 10: {  // an event-like array
      const char* tags[] = {"BlockStored", "BlockRemoved", "AllBlocksCleared"};
      const auto n = static_cast<std::uint32_t>(1 + rng() % 10);
      p.pack_array(n);
      p.pack(std::string(tags[rng() % 3]));
      for (std::uint32_t k = 1; k < n; ++k)
        random_value(p, rng, depth + 1);
      break;
    }
    default: {
      const char* keys[] = {"type",       "block_hashes", "parent_block_hash",
                            "token_ids",  "block_size",   "lora_name",
                            "extra_keys", "medium",       "group_idx"};
      const auto n = static_cast<std::uint32_t>(rng() % 6);
      p.pack_map(n);
      for (std::uint32_t k = 0; k < n; ++k) {
        p.pack(std::string(keys[rng() % 9]));
        random_value(p, rng, depth + 1);
      }
      break;
    }
  }
}

}  // namespace

TEST_CASE("random batch-shaped values never crash the decoder", "[kv_event_wire][fuzz]") {
  std::mt19937_64 rng(0x6b76776972650003ULL);
  KvEventWireDecoder decoder;
  promptcache::KvIndex index;
  Stats stats;
  for (int i = 0; i < 20000; ++i) {
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> p(buf);
    p.pack_array(3);
    p.pack(1.0);
    const auto n = static_cast<std::uint32_t>(rng() % 5);
    p.pack_array(n);
    for (std::uint32_t k = 0; k < n; ++k)
      random_value(p, rng, 2);
    if (rng() % 4 == 0)
      p.pack(std::string("rank"));
    else
      p.pack_nil();
    const auto* data = reinterpret_cast<const std::byte*>(buf.data());
    check_one(decoder, Bytes(data, data + buf.size()), index, static_cast<std::uint64_t>(i), stats);
  }
  CHECK(index.check_invariants());
  CHECK(stats.ok > 1000);
  CHECK(stats.by_code[static_cast<std::size_t>(KvWireErrc::bad_event)] > 0);
  CHECK(stats.by_code[static_cast<std::size_t>(KvWireErrc::bad_value)] > 0);
  CHECK(stats.by_code[static_cast<std::size_t>(KvWireErrc::bad_batch)] > 0);
}
