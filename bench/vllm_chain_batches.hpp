// The synthetic vLLM KV event stream of the subscriber benchmarks
// (zmq_kv_subscriber_catchup, nats_kv_subscriber_throughput, nats_kv_replica_join):
// msgpack batches of `events_per_batch` BlockStored events, one chain each. Chain c
// stores `chain_blocks` blocks named (c << 20) + b, its tokens c * 1000 + position.
#pragma once

#include <msgpack.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace bench {

inline constexpr std::uint32_t block_size = 16;
inline constexpr std::uint32_t chain_blocks = 64;  // blocks per stored event (one request's prefix)
inline constexpr std::uint32_t events_per_batch = 4;

// Chain c's tokens.
inline std::vector<std::uint32_t> chain_tokens(std::uint64_t c) {
  std::vector<std::uint32_t> t(std::size_t{chain_blocks} * block_size);
  for (std::size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<std::uint32_t>(c * 1000U + i);
  return t;
}

// Chains first_chain .. first_chain + events_per_batch - 1, as the batch of sequence
// number `seq` (its timestamp moves 1 ms per batch).
inline std::string make_batch(std::uint64_t first_chain, std::uint64_t seq) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_array(3);
  p.pack(1764600000.0 + static_cast<double>(seq) * 0.001);
  p.pack_array(events_per_batch);
  for (std::uint32_t e = 0; e < events_per_batch; ++e) {
    const std::uint64_t c = first_chain + e;
    p.pack_array(7);
    p.pack(std::string("BlockStored"));
    p.pack_array(chain_blocks);
    for (std::uint32_t b = 0; b < chain_blocks; ++b)
      p.pack((c << 20) + b);
    p.pack_nil();
    p.pack(chain_tokens(c));
    p.pack(block_size);
    p.pack_nil();
    p.pack(std::string("GPU"));
  }
  p.pack(0);
  return std::string(buf.data(), buf.size());
}

}  // namespace bench
