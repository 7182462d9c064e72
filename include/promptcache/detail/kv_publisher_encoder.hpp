// promptcache: detail/kv_publisher_encoder.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The msgpack bytes of vLLM's KV event classes, as msgspec writes them: structs
// with array_like=False are maps of every field in declaration order (a field
// equal to its default omitted, a field without a default always written, nil
// when None), tagged structs carrying their class name under "type" first;
// array_like structs are arrays of every field in declaration order (msgspec
// omits no default there), a tagged one starting with the class name. Integers
// take their smallest form, floats 8 bytes, strings str8 from 32 bytes on.
// msgpack-cxx's packer writes each value in that form except floats, which it
// writes as integers when they have no fraction: ts is written here.
#pragma once
#ifndef PROMPTCACHE_DETAIL_KV_PUBLISHER_ENCODER_HPP
#define PROMPTCACHE_DETAIL_KV_PUBLISHER_ENCODER_HPP

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#ifndef MSGPACK_NO_BOOST
#define MSGPACK_NO_BOOST
#endif
#include <msgpack.hpp>

#include "promptcache/block_hash.hpp"  // cache_salt_key_prefix

namespace promptcache::detail {

// Appends to a byte vector: the stream msgpack::packer writes to.
struct KvPubBytes {
  std::vector<char>* out;
  void write(const char* p, std::size_t n) { out->insert(out->end(), p, p + n); }
};

// One event of a batch, as the publisher keeps it until the step ends.
struct KvPubEvent {
  enum class Kind : std::uint8_t { stored, removed, cleared };
  Kind kind = Kind::stored;
  std::optional<std::uint64_t> parent;  // stored: the chain's parent block hash
  std::vector<std::uint64_t> hashes;    // stored / removed: the blocks
  std::vector<std::uint32_t> tokens;    // stored: block_size tokens per block
  std::uint32_t block_size = 0;         // stored
  std::uint64_t ns = 0;                 // stored: the engine namespace (its seed's parts)
};

// What a namespace's blocks are hashed with: a LoRA adapter as vLLM names it,
// and a cache salt. Empty strings are none. Views: valid while the encoder
// writes the event.
struct KvPubSeed {
  std::string_view lora_name;
  std::optional<std::int64_t> lora_id;  // lora_id (deprecated by vLLM, still written)
  std::string_view cache_salt;
};

// Which of the two structs are maps (array_like=False); the others are arrays.
struct KvPubLayout {
  bool map_batch = true;   // KVEventBatch
  bool map_events = true;  // BlockStored, BlockRemoved, AllBlocksCleared
};

// Writes batches of KvPubEvent in one layout.
class KvPubEncoder {
 public:
  explicit KvPubEncoder(KvPubLayout layout) noexcept : layout_(layout) {}

  // One whole KVEventBatch payload into `out` (cleared first). `seed_of(ns)`
  // gives a namespace's KvPubSeed.
  template <class SeedOf>
  void batch(std::vector<char>& out, double ts, std::span<const KvPubEvent> events,
             std::optional<std::uint32_t> dp_rank, SeedOf&& seed_of) const {
    out.clear();
    KvPubBytes sink{&out};
    msgpack::packer<KvPubBytes> p(sink);
    const auto n = static_cast<std::uint32_t>(events.size());
    if (layout_.map_batch) {
      // data_parallel_rank defaults to None: omitted when absent.
      p.pack_map(dp_rank ? 3U : 2U);
      key(p, "ts");
      f64(out, ts);
      key(p, "events");
      p.pack_array(n);
      for (const KvPubEvent& e : events)
        event(p, e, seed_of(e.ns));
      if (dp_rank) {
        key(p, "data_parallel_rank");
        p.pack(*dp_rank);
      }
      return;
    }
    p.pack_array(3);
    f64(out, ts);
    p.pack_array(n);
    for (const KvPubEvent& e : events)
      event(p, e, seed_of(e.ns));
    if (dp_rank)
      p.pack(*dp_rank);
    else
      p.pack_nil();
  }

 private:
  using Packer = msgpack::packer<KvPubBytes>;

  static void key(Packer& p, std::string_view k) {
    p.pack_str(static_cast<std::uint32_t>(k.size()))
        .pack_str_body(k.data(), static_cast<std::uint32_t>(k.size()));
  }

  // float 64 (0xcb, big-endian IEEE 754), whatever the value.
  static void f64(std::vector<char>& out, double d) {
    const auto bits = std::bit_cast<std::uint64_t>(d);
    out.push_back(static_cast<char>(0xcb));
    for (unsigned i = 0; i < 8; ++i)
      out.push_back(static_cast<char>((bits >> (56U - 8U * i)) & 0xffU));
  }

  static void nil_or(Packer& p, const std::optional<std::uint64_t>& v) {
    if (v)
      p.pack(*v);
    else
      p.pack_nil();
  }

  static void u64_list(Packer& p, std::span<const std::uint64_t> v) {
    p.pack_array(static_cast<std::uint32_t>(v.size()));
    for (const std::uint64_t x : v)
      p.pack(x);
  }

  void event(Packer& p, const KvPubEvent& e, const KvPubSeed& seed) const {
    const bool lora = !seed.lora_name.empty();
    const bool salt = !seed.cache_salt.empty();
    const bool map = layout_.map_events;
    switch (e.kind) {
      case KvPubEvent::Kind::stored: {
        // BlockStored: block_hashes, parent_block_hash, token_ids, block_size,
        // lora_id, medium, lora_name (no defaults); extra_keys, group_idx,
        // kv_cache_spec_kind, kv_cache_spec_sliding_window (default None).
        if (map) {
          p.pack_map(10);
          key(p, "type");
        } else {
          p.pack_array(12);
        }
        key(p, "BlockStored");
        if (map) key(p, "block_hashes");
        u64_list(p, e.hashes);
        if (map) key(p, "parent_block_hash");
        nil_or(p, e.parent);
        if (map) key(p, "token_ids");
        p.pack_array(static_cast<std::uint32_t>(e.tokens.size()));
        for (const std::uint32_t t : e.tokens)
          p.pack(t);
        if (map) key(p, "block_size");
        p.pack(e.block_size);
        if (map) key(p, "lora_id");
        if (lora && seed.lora_id)
          p.pack(*seed.lora_id);
        else
          p.pack_nil();
        if (map) key(p, "medium");
        key(p, "GPU");
        if (map) key(p, "lora_name");
        if (lora)
          key(p, seed.lora_name);
        else
          p.pack_nil();
        // One entry per block: the keys besides the tokens that the block's
        // hash covers (vLLM lists the LoRA name there, and the cache salt
        // in the first block's), or None. The salt goes in the form Dynamo's
        // router reads, in every event: a router hashes each event's blocks
        // with the salt its first block names.
        if (map) key(p, "extra_keys");
        p.pack_array(static_cast<std::uint32_t>(e.hashes.size()));
        for (std::size_t i = 0; i < e.hashes.size(); ++i) {
          const bool salted = salt && i == 0;
          if (!lora && !salted) {
            p.pack_nil();
            continue;
          }
          p.pack_array((lora ? 1U : 0U) + (salted ? 1U : 0U));
          if (lora) key(p, seed.lora_name);
          if (salted) {
            const std::string_view prefix = cache_salt_key_prefix;
            p.pack_str(static_cast<std::uint32_t>(prefix.size() + seed.cache_salt.size()));
            p.pack_str_body(prefix.data(), static_cast<std::uint32_t>(prefix.size()));
            p.pack_str_body(seed.cache_salt.data(),
                            static_cast<std::uint32_t>(seed.cache_salt.size()));
          }
        }
        if (map) key(p, "group_idx");
        p.pack(0U);
        if (!map) {
          p.pack_nil();  // kv_cache_spec_kind
          p.pack_nil();  // kv_cache_spec_sliding_window
        }
        return;
      }
      case KvPubEvent::Kind::removed:
        // BlockRemoved: block_hashes, medium (no defaults); group_idx.
        if (map) {
          p.pack_map(4);
          key(p, "type");
        } else {
          p.pack_array(4);
        }
        key(p, "BlockRemoved");
        if (map) key(p, "block_hashes");
        u64_list(p, e.hashes);
        if (map) key(p, "medium");
        key(p, "GPU");
        if (map) key(p, "group_idx");
        p.pack(0U);
        return;
      case KvPubEvent::Kind::cleared:
        if (map) {
          p.pack_map(1);
          key(p, "type");
        } else {
          p.pack_array(1);
        }
        key(p, "AllBlocksCleared");
        return;
    }
  }

  KvPubLayout layout_;
};

}  // namespace promptcache::detail

#endif  // PROMPTCACHE_DETAIL_KV_PUBLISHER_ENCODER_HPP
