// promptcache: kv_event_wire.hpp
// SPDX-License-Identifier: Apache-2.0
//
// Decodes the KV event batches that vLLM and SGLang publish with
// --kv-events-config (msgpack payloads written by msgspec) into the KvEventData
// that KvIndex consumes, computing each stored block's tokens hash the way
// NVIDIA Dynamo's router does (block_hash.hpp, LoRA name and cache salt as
// seed, multimodal hashes from extra_keys).
//
// Three layouts are in the field and all decode:
//   [ts, [events]] / [ts, [events], dp_rank, ...]   with array events
//   [ts, [events], dp_rank, ...]                     with map events
//   {"ts": .., "events": [..], "data_parallel_rank": ..}   with map events
// An array event carries its tag first (["BlockStored", hashes, parent, tokens,
// block_size, lora_id, medium, lora_name, extra_keys, group_idx, spec_kind],
// ["BlockRemoved", hashes, medium, group_idx], ["TierBlocksCleared", medium]);
// a map event has a "type" key anywhere. Missing trailing array elements and
// omitted map keys take their defaults; extra elements and unknown keys are
// ignored. docs/kv_event_wire.md lists every rule.
//
// A batch is refused whole only when it is not a well-formed KVEventBatch. A
// well-formed event that is not for the index (another medium, whose contents
// are not read; another attention group; no complete block) is counted and
// skipped, and the batch's other events apply.
//
// Events of attention groups other than the main one (sliding window, Mamba)
// are skipped. vLLM names a group's kind on stored events only, so a
// KvWireStreamState per publisher, passed to each decode of its stream,
// remembers the kinds and classifies the removals that carry only a group.
//
// A payload either decodes completely or yields an error code and an empty
// batch: bad bytes never throw, never crash, and never give half a batch.
// The decoder parses msgpack itself, in one pass, into no object tree:
// values go to a flat tape whose length is bounded by the payload size, so a
// huge declared length costs nothing before it is found truncated. It
// accepts and refuses exactly the bytes msgpack-cxx's parser does.
//
// Includes msgpack-cxx (header-only, used without Boost: MSGPACK_NO_BOOST is
// defined here unless the includer decided otherwise), which publishers and
// tests use to encode payloads.
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
#endif
#if !defined(PROMPTCACHE_KV_EVENT_WIRE_HPP) && \
    (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) >= 202002L
#define PROMPTCACHE_KV_EVENT_WIRE_HPP

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#ifndef MSGPACK_NO_BOOST
#define MSGPACK_NO_BOOST
#endif
#include <msgpack.hpp>

#include "promptcache/block_hash.hpp"
#include "promptcache/kv_index.hpp"

namespace promptcache {

/// Why a payload was rejected; `ok` when it decoded.
enum class KvWireErrc : std::uint8_t {
  ok = 0,           ///< Decoded.
  empty,            ///< Zero bytes.
  too_large,        ///< Longer than KvWireOptions::max_payload_bytes.
  truncated,        ///< The bytes end inside a value (also: a length larger than what follows).
  invalid_msgpack,  ///< Not msgpack (a reserved type byte).
  trailing_bytes,   ///< Bytes follow the batch value.
  too_deep,         ///< Containers nested deeper than KvWireOptions::max_depth.
  bad_batch,        ///< The batch is not [ts, events, dp_rank?] or a map with "ts" and "events".
  bad_event,        ///< An event is not a tagged array or map, or lacks a required field.
  bad_value,        ///< A field has the wrong type or a value out of its range.
};

/// The name of an error code, for logs. O(1).
[[nodiscard]] constexpr std::string_view to_string(KvWireErrc e) noexcept {
  switch (e) {
    case KvWireErrc::ok:
      return "ok";
    case KvWireErrc::empty:
      return "empty";
    case KvWireErrc::too_large:
      return "too_large";
    case KvWireErrc::truncated:
      return "truncated";
    case KvWireErrc::invalid_msgpack:
      return "invalid_msgpack";
    case KvWireErrc::trailing_bytes:
      return "trailing_bytes";
    case KvWireErrc::too_deep:
      return "too_deep";
    case KvWireErrc::bad_batch:
      return "bad_batch";
    case KvWireErrc::bad_event:
      return "bad_event";
    case KvWireErrc::bad_value:
      return "bad_value";
  }
  return "unknown";
}

/// The outcome of one decode: the error code, and for event-level errors the
/// index of the offending event in the batch's event list.
struct KvWireStatus {
  KvWireErrc code = KvWireErrc::ok;  ///< ok, or why the payload was rejected.
  std::size_t event = 0;             ///< bad_event / bad_value inside an event: its index.
  std::string_view detail = {};      ///< A static description of the failed check ("" when ok).

  /// True when the payload decoded. O(1).
  [[nodiscard]] constexpr bool ok() const noexcept { return code == KvWireErrc::ok; }
};

/// Decoding choices a router makes once for all publishers.
struct KvWireOptions {
  /// The router's block size: a stored event with another block_size keeps no
  /// blocks (and is counted as ignored), as Dynamo's router refuses them. 0
  /// accepts whatever block_size each event carries.
  std::uint32_t block_size = 0;
  /// Only events about device (GPU) memory apply; events whose "medium" is a
  /// string other than "GPU" (CPU offload tiers, disk), tier clears included,
  /// are skipped unread and counted as ignored. false: every medium applies.
  bool device_only = true;
  /// Longer payloads are rejected before parsing (too_large).
  std::size_t max_payload_bytes = std::size_t{64} << 20;
  /// Deeper container nesting is rejected (too_deep). The format needs 6.
  std::uint32_t max_depth = 16;
};

/// One decoded KVEventBatch.
struct KvWireBatch {
  double ts = 0.0;                       ///< The publisher's timestamp (seconds since the epoch).
  std::optional<std::uint32_t> dp_rank;  ///< data_parallel_rank, when the batch carries one.
  std::vector<KvEventData> events;       ///< The events to apply, in order.
  std::size_t unknown_events = 0;        ///< Events with an unknown tag (skipped).
  std::size_t ignored_events = 0;  ///< Events skipped by rule: another medium or attention group,
                                   ///< or a stored event left without blocks.
  std::size_t dropped_blocks = 0;  ///< Stored blocks without their full tokens, or with another
                                   ///< block size than KvWireOptions::block_size (not applied).
  std::size_t blocks = 0;          ///< Blocks over all Stored and Removed events kept.

  /// Empties the batch, keeping the events vector's capacity. O(events).
  void clear() noexcept {
    ts = 0.0;
    dp_rank.reset();
    events.clear();
    unknown_events = 0;
    ignored_events = 0;
    dropped_blocks = 0;
    blocks = 0;
  }
};

/// What a decoder has learned about one publisher's attention groups: for
/// each group index below `max_groups`, whether its blocks are the main
/// attention's (routed on) or another group's (sliding window, Mamba, ...).
/// vLLM names a group's kind (`kv_cache_spec_kind`) only on stored events;
/// its removals carry the group index alone, so a removal can be classified
/// only by what earlier stored events of that publisher said. Keep one per
/// publisher (stream), pass it to every decode of that stream, and reset it
/// when the publisher restarts: a new process may group its layers
/// differently. Fixed size (64 bytes), no allocation; copying is cheap.
class KvWireStreamState {
 public:
  /// Group indices at or above this are never learned: events naming them
  /// follow the stateless rule (a group other than 0 is not the main one).
  static constexpr std::uint32_t max_groups = 256;

  /// A state that knows no group. O(1).
  constexpr KvWireStreamState() noexcept = default;

  /// Whether group `group_idx` is the main attention group, as last learned;
  /// nullopt when no decoded event has named its kind (or it is at or above
  /// max_groups). O(1).
  [[nodiscard]] constexpr std::optional<bool> is_main_group(
      std::uint64_t group_idx) const noexcept {
    if (group_idx >= max_groups) return std::nullopt;
    const std::size_t w = static_cast<std::size_t>(group_idx / 64U);
    const std::uint64_t bit = std::uint64_t{1} << (group_idx % 64U);
    if ((known_[w] & bit) == 0) return std::nullopt;
    return (main_[w] & bit) != 0;
  }

  /// The number of groups whose kind is known. O(1).
  [[nodiscard]] constexpr std::size_t known_groups() const noexcept {
    std::size_t n = 0;
    for (const std::uint64_t w : known_)
      n += static_cast<std::size_t>(std::popcount(w));
    return n;
  }

  /// Forgets every group (a publisher restart). O(1).
  constexpr void reset() noexcept { *this = KvWireStreamState(); }

  /// Records that group `group_idx` is (or is not) the main attention group;
  /// a later record replaces an earlier one. Indices at or above max_groups
  /// are not recorded. O(1).
  constexpr void learn(std::uint64_t group_idx, bool main) noexcept {
    if (group_idx >= max_groups) return;
    const std::size_t w = static_cast<std::size_t>(group_idx / 64U);
    const std::uint64_t bit = std::uint64_t{1} << (group_idx % 64U);
    known_[w] |= bit;
    if (main)
      main_[w] |= bit;
    else
      main_[w] &= ~bit;
  }

  /// Same groups, same kinds. O(1).
  friend constexpr bool operator==(const KvWireStreamState&,
                                   const KvWireStreamState&) noexcept = default;

 private:
  std::array<std::uint64_t, max_groups / 64U> known_{};
  std::array<std::uint64_t, max_groups / 64U> main_{};
};

/// The 64-bit name of a block hash sent as a byte string (vLLM's sha256 or
/// xxh128 block hashes): the last 8 bytes read big-endian, i.e. the integer
/// value modulo 2^64. It is the integer vLLM itself publishes for the same
/// block with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, so both settings name a
/// block identically. Shorter strings are zero-extended. O(1).
[[nodiscard]] constexpr std::uint64_t kv_wire_hash_from_bytes(
    std::span<const unsigned char> bytes) noexcept {
  std::uint64_t v = 0;
  const std::size_t from = bytes.size() > 8 ? bytes.size() - 8 : 0;
  for (std::size_t i = from; i < bytes.size(); ++i)
    v = (v << 8) | bytes[i];
  return v;
}

/// The multimodal hash that an extra_keys string names, Dynamo's rule: a
/// 64-character hexadecimal identifier gives the value of its first 16 hex
/// digits; anything else (LoRA names, cache salts, other ids) is no media
/// hash. O(1).
[[nodiscard]] constexpr std::optional<std::uint64_t> kv_wire_media_hash(
    std::string_view s) noexcept {
  if (s.size() != 64) return std::nullopt;
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    std::uint64_t d = 0;
    if (c >= '0' && c <= '9')
      d = static_cast<std::uint64_t>(c - '0');
    else if (c >= 'a' && c <= 'f')
      d = static_cast<std::uint64_t>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      d = static_cast<std::uint64_t>(c - 'A' + 10);
    else
      return std::nullopt;
    if (i < 16) v = (v << 4) | d;
  }
  return v;
}

namespace detail {

enum class MpKind : std::uint8_t { nil, boolean, uint, sint, real, str, bin, ext, array, map };

// One msgpack value on the tape, in pre-order. A container's children follow
// it; `end` is the index past its last descendant (for a scalar, its own
// index + 1), so any value is skipped in O(1).
struct MpNode {
  std::uint64_t bits = 0;  // uint (>= 0 in any format), sint (< 0, two's complement),
                           // real (bit pattern), str/bin offset
  std::uint32_t size = 0;  // array: elements; map: pairs; str/bin/ext: bytes
  std::uint32_t end = 0;
  MpKind kind = MpKind::nil;
};

// Why a parse stopped.
enum class MpParse : std::uint8_t {
  ok,         // one whole value; `used` says where it ended
  truncated,  // the bytes end inside a value (or a declared length runs past them)
  invalid,    // a reserved type byte (0xc1)
  too_deep,   // a container would open more than max_depth deep
  overflow,   // an ext 32 declaring 2^32 - 1 bytes with a 32-bit size_t (msgpack-cxx throws)
};

// A msgpack parser that writes the tape directly: one pass over the bytes,
// a branch per type byte, no callbacks. It accepts and refuses exactly what
// msgpack-cxx's parse does (same value per type byte, a non-negative value
// of a signed format read as unsigned, the first problem in byte order
// decides) and keeps the tape and the stack of open containers between
// payloads, so steady state parsing allocates nothing. Every value takes at
// least one input byte, so the tape never has more nodes than the payload has
// bytes, whatever lengths the payload declares.
class MpTape {
 public:
  // The node at `i` (< size()).
  const MpNode& operator[](std::uint32_t i) const noexcept { return nodes_[i]; }
  // Nodes on the tape.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

  // Parses the first value of `bytes` (fewer than 2^32 of them) onto the
  // tape (cleared first); `used` is where it ended (with ok).
  MpParse parse(const unsigned char* bytes, std::size_t n, std::uint32_t max_depth,
                std::size_t& used) {
    size_ = 0;  // an unfinished parse leaves an empty tape
    limit_ = n;
    // Each open container took a byte, so the stack never holds more than
    // min(max_depth, n) of them: reserved up front, it is used through a
    // plain pointer.
    open_.resize(std::min<std::size_t>(max_depth, n) + 1U);
    Open* const stack = open_.data();
    std::size_t depth = 0;
    // The write position lives in locals, so the loop keeps it in registers
    // (stores to the nodes could alias a member).
    MpNode* base = nodes_.get();
    MpNode* out = base;
    MpNode* out_end = base + cap_;
    const unsigned char* const begin = bytes;
    const unsigned char* const end = bytes + n;
    const unsigned char* p = begin;
    const auto at = [&](const unsigned char* q) { return static_cast<std::uint64_t>(q - begin); };
    for (;;) {
      // Token ids and block hashes: a run of unsigned integers inside an
      // array takes a short loop (the last element takes the general path,
      // which closes the array).
      if (depth != 0U && stack[depth - 1U].array && stack[depth - 1U].left > 1U) {
        Open& o = stack[depth - 1U];
        // In locals: stores to the nodes could alias the stack.
        auto room = std::min<std::uint64_t>(o.left - 1U, static_cast<std::uint64_t>(out_end - out));
        auto node = static_cast<std::uint32_t>(out - base);
        MpNode* q = out;
        while (room != 0U && end - p >= 9) {
          const unsigned c = *p;
          std::uint64_t v = 0;
          if (c <= 0x7fU) {
            v = c;
            p += 1;
          } else if (c == 0xcdU) {
            v = be16(p + 1);
            p += 3;
          } else if (c == 0xceU) {
            v = be32(p + 1);
            p += 5;
          } else if (c == 0xccU) {
            v = p[1];
            p += 2;
          } else if (c == 0xcfU) {
            v = be64(p + 1);
            p += 9;
          } else {
            break;
          }
          q->bits = v;
          q->size = 0;
          q->kind = MpKind::uint;
          q->end = ++node;
          ++q;
          --room;
        }
        o.left -= static_cast<std::uint64_t>(q - out);
        out = q;
      }
      if (p == end) return MpParse::truncated;
      const unsigned b = *p;
      const auto left = static_cast<std::size_t>(end - p) - 1U;  // after the type byte
      // The value's node, written once below (one write site keeps the
      // loop small enough to inline everything).
      MpKind kind = MpKind::nil;
      std::uint64_t bits = 0;
      std::uint32_t size = 0;  // str/bin/ext bytes; array elements; map pairs
      bool container = false;
      if (b <= 0x7fU) {  // positive fixint
        kind = MpKind::uint;
        bits = b;
        p += 1;
      } else if (b >= 0xe0U) {  // negative fixint
        kind = MpKind::sint;
        bits = static_cast<std::uint64_t>(static_cast<std::int64_t>(b) - 256);
        p += 1;
      } else if (b <= 0x9fU) {  // fixmap, fixarray
        container = true;
        kind = b <= 0x8fU ? MpKind::map : MpKind::array;
        size = b & 0x0fU;
        p += 1;
      } else if (b <= 0xbfU) {  // fixstr
        const std::uint32_t len = b & 0x1fU;
        if (left < len) return MpParse::truncated;
        kind = MpKind::str;
        bits = len == 0U ? 0U : at(p + 1);
        size = len;
        p += 1U + len;
      } else {
        switch (b) {
          case 0xc0U:
            kind = MpKind::nil;
            p += 1;
            break;
          case 0xc2U:
          case 0xc3U:
            kind = MpKind::boolean;
            bits = b - 0xc2U;
            p += 1;
            break;
          case 0xccU:
            if (left < 1U) return MpParse::truncated;
            kind = MpKind::uint;
            bits = p[1];
            p += 2;
            break;
          case 0xcdU:
            if (left < 2U) return MpParse::truncated;
            kind = MpKind::uint;
            bits = be16(p + 1);
            p += 3;
            break;
          case 0xceU:
            if (left < 4U) return MpParse::truncated;
            kind = MpKind::uint;
            bits = be32(p + 1);
            p += 5;
            break;
          case 0xcfU:
            if (left < 8U) return MpParse::truncated;
            kind = MpKind::uint;
            bits = be64(p + 1);
            p += 9;
            break;
          case 0xd0U:
          case 0xd1U:
          case 0xd2U:
          case 0xd3U: {  // int 8/16/32/64: a non-negative value is the same number
            const std::size_t w = std::size_t{1} << (b - 0xd0U);
            if (left < w) return MpParse::truncated;
            const std::int64_t v = w == 1U   ? static_cast<std::int8_t>(p[1])
                                   : w == 2U ? static_cast<std::int16_t>(be16(p + 1))
                                   : w == 4U ? static_cast<std::int32_t>(be32(p + 1))
                                             : static_cast<std::int64_t>(be64(p + 1));
            kind = v < 0 ? MpKind::sint : MpKind::uint;
            bits = static_cast<std::uint64_t>(v);
            p += 1U + w;
            break;
          }
          case 0xcaU:
            if (left < 4U) return MpParse::truncated;
            kind = MpKind::real;
            bits = std::bit_cast<std::uint64_t>(
                static_cast<double>(std::bit_cast<float>(be32(p + 1))));
            p += 5;
            break;
          case 0xcbU:
            if (left < 8U) return MpParse::truncated;
            kind = MpKind::real;
            bits = be64(p + 1);
            p += 9;
            break;
          case 0xc4U:
          case 0xc5U:
          case 0xc6U:
          case 0xd9U:
          case 0xdaU:
          case 0xdbU: {  // bin 8/16/32, str 8/16/32
            const unsigned k = b <= 0xc6U ? b - 0xc4U : b - 0xd9U;
            const std::size_t w = std::size_t{1} << k;
            if (left < w) return MpParse::truncated;
            const std::uint64_t len = k == 0U ? p[1] : k == 1U ? be16(p + 1) : be32(p + 1);
            if (left - w < len) return MpParse::truncated;
            kind = b <= 0xc6U ? MpKind::bin : MpKind::str;
            bits = len == 0U ? 0U : at(p + 1 + w);
            size = static_cast<std::uint32_t>(len);
            p += 1U + w + len;
            break;
          }
          case 0xc7U:
          case 0xc8U:
          case 0xc9U: {  // ext 8/16/32: the size counts the type byte
            const unsigned k = b - 0xc7U;
            const std::size_t w = std::size_t{1} << k;
            if (left < w) return MpParse::truncated;
            const std::uint64_t len = k == 0U ? p[1] : k == 1U ? be16(p + 1) : be32(p + 1);
            // msgpack-cxx refuses this size where size_t has 32 bits; with
            // 64 bits it is just longer than any payload.
            if (sizeof(std::size_t) == 4U && len == 0xffffffffU) return MpParse::overflow;
            if (left - w < len + 1U) return MpParse::truncated;
            kind = MpKind::ext;
            bits = at(p + 1 + w);
            size = static_cast<std::uint32_t>(len + 1U);
            p += 2U + w + len;
            break;
          }
          case 0xd4U:
          case 0xd5U:
          case 0xd6U:
          case 0xd7U:
          case 0xd8U: {  // fixext 1/2/4/8/16
            const std::size_t len = std::size_t{1} << (b - 0xd4U);
            if (left < len + 1U) return MpParse::truncated;
            kind = MpKind::ext;
            bits = at(p + 1);
            size = static_cast<std::uint32_t>(len + 1U);
            p += 2U + len;
            break;
          }
          case 0xdcU:
          case 0xddU:
          case 0xdeU:
          case 0xdfU: {  // array 16/32, map 16/32
            const std::size_t w = (b & 1U) == 0U ? 2U : 4U;
            if (left < w) return MpParse::truncated;
            container = true;
            kind = b <= 0xddU ? MpKind::array : MpKind::map;
            size = w == 2U ? be16(p + 1) : be32(p + 1);
            p += 1U + w;
            break;
          }
          default:  // 0xc1, never used
            return MpParse::invalid;
        }
      }
      // A container opens even when empty (then it is complete at once), as
      // msgpack-cxx's do.
      if (container && depth >= max_depth) return MpParse::too_deep;
      if (out == out_end) grow(base, out, out_end);
      const auto node = static_cast<std::uint32_t>(out - base);
      out->bits = bits;
      out->size = size;
      out->kind = kind;
      out->end = node + 1U;
      ++out;
      if (container && size != 0U) {
        const bool array = kind == MpKind::array;
        stack[depth++] = Open{node, array, array ? size : 2U * std::uint64_t{size}};
        continue;
      }
      // A value ended: close the containers it completes.
      for (;;) {
        if (depth == 0U) {
          used = static_cast<std::size_t>(p - begin);
          size_ = static_cast<std::size_t>(out - base);
          return MpParse::ok;
        }
        Open& o = stack[depth - 1U];
        if (--o.left != 0U) break;
        base[o.node].end = static_cast<std::uint32_t>(out - base);
        --depth;
      }
    }
  }

 private:
  struct Open {
    std::uint32_t node;  // its node on the tape
    bool array;          // an array (else a map)
    std::uint64_t left;  // values still to come (a map's pairs count twice)
  };

  // Big-endian integers.
  static std::uint32_t be16(const unsigned char* q) noexcept {
    return static_cast<std::uint32_t>((unsigned{q[0]} << 8U) | q[1]);
  }
  static std::uint32_t be32(const unsigned char* q) noexcept {
    return (std::uint32_t{q[0]} << 24U) | (std::uint32_t{q[1]} << 16U) |
           (std::uint32_t{q[2]} << 8U) | q[3];
  }
  static std::uint64_t be64(const unsigned char* q) noexcept {
    return (std::uint64_t{be32(q)} << 32U) | be32(q + 4);
  }

  // Doubles the tape, never past one node per payload byte (more never
  // come); `base`, `out` and `out_end` follow it.
  void grow(MpNode*& base, MpNode*& out, MpNode*& out_end) {
    const auto size = static_cast<std::size_t>(out - base);
    const std::size_t want =
        std::max(std::min(std::max<std::size_t>(cap_ * 2U, 1024), limit_), size + 1U);
    auto bigger = std::make_unique_for_overwrite<MpNode[]>(want);
    if (size != 0U) std::memcpy(bigger.get(), base, size * sizeof(MpNode));
    nodes_ = std::move(bigger);
    cap_ = want;
    base = nodes_.get();
    out = base + size;
    out_end = base + cap_;
  }

  std::unique_ptr<MpNode[]> nodes_;
  std::size_t size_ = 0;
  std::size_t cap_ = 0;
  std::size_t limit_ = 0;
  std::vector<Open> open_;
};

}  // namespace detail

/// A reusable decoder: keeps its scratch buffers between payloads, so steady
/// state decoding allocates only the events it returns. Not thread-safe; use
/// one per thread.
class KvEventWireDecoder {
 public:
  /// A decoder with default options. O(1).
  KvEventWireDecoder() = default;
  /// A decoder with `options`. O(1).
  explicit KvEventWireDecoder(const KvWireOptions& options) : options_(options) {}

  /// The options in use. O(1).
  [[nodiscard]] const KvWireOptions& options() const noexcept { return options_; }

  /// Decodes one payload into `out` (cleared first). On any error `out` is
  /// left empty and the status says why; bad bytes never throw (only
  /// std::bad_alloc can, with `out` then unspecified but valid). Learns no
  /// attention group: an event without a kind is classified by the stateless
  /// rule (group 0 is the main one). O(payload bytes + tokens): one parsing
  /// pass, then one pass over the events (hashing each block's tokens).
  KvWireStatus decode(std::span<const std::byte> payload, KvWireBatch& out) {
    out.clear();
    KvWireStatus st = decode_impl(payload, out);
    if (!st.ok()) out.clear();
    return st;
  }

  /// As above, for `size` bytes at `data`.
  KvWireStatus decode(const void* data, std::size_t size, KvWireBatch& out) {
    return decode(std::span<const std::byte>(static_cast<const std::byte*>(data), size), out);
  }

  /// Decodes one payload of the stream that `state` follows: events that
  /// name a group's kind teach it to `state`, and a removal (or any event)
  /// without a kind is classified by its group's learned kind, in event
  /// order (a group learned earlier in the same batch counts). Groups not
  /// learned follow the stateless rule. `state` changes only when the
  /// payload decodes: on an error, or std::bad_alloc, it is left as it was.
  /// O(payload bytes + tokens), as the stateless overload.
  KvWireStatus decode(std::span<const std::byte> payload, KvWireBatch& out,
                      KvWireStreamState& state) {
    KvWireStreamState next = state;
    KvWireStatus st;
    {
      const StreamScope scope(*this, next);
      st = decode(payload, out);
    }
    if (st.ok()) state = next;
    return st;
  }

  /// As above, for `size` bytes at `data`.
  KvWireStatus decode(const void* data, std::size_t size, KvWireBatch& out,
                      KvWireStreamState& state) {
    return decode(std::span<const std::byte>(static_cast<const std::byte*>(data), size), out,
                  state);
  }

 private:
  using Kind = detail::MpKind;

  struct Fail {
    KvWireErrc code;
    std::string_view detail;
  };

  // Points the decoder at a stream's working state for one decode, and away
  // from it however the decode ends (an exception included).
  struct StreamScope {
    StreamScope(KvEventWireDecoder& d, KvWireStreamState& s) noexcept : decoder(d) {
      decoder.stream_ = &s;
    }
    ~StreamScope() { decoder.stream_ = nullptr; }
    StreamScope(const StreamScope&) = delete;
    StreamScope& operator=(const StreamScope&) = delete;
    KvEventWireDecoder& decoder;
  };

  // Fields of one event, gathered before it is built.
  struct Fields {
    std::uint32_t hashes = kNone;
    std::uint32_t parent = kNone;
    std::uint32_t tokens = kNone;
    std::uint32_t block_size = kNone;
    std::uint32_t medium = kNone;
    std::uint32_t lora_name = kNone;
    std::uint32_t extra_keys = kNone;
    std::uint32_t group_idx = kNone;
    std::uint32_t spec_kind = kNone;
    std::uint32_t cache_salt = kNone;  // map events: a string or nil
    // Positional: some SGLang versions put a metadata map in lora_name's
    // place, which names no LoRA (its "cache_salt" key holds the salt), and
    // in map events a "lora_name" key holds a name or nil.
    bool positional = false;
  };

  enum class Tag : std::uint8_t { stored, removed, cleared, tier_cleared, unknown };

  static constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();

  KvWireStatus decode_impl(std::span<const std::byte> payload, KvWireBatch& out) {
    if (payload.empty()) return {KvWireErrc::empty, 0, "no bytes"};
    if (payload.size() > options_.max_payload_bytes ||
        payload.size() >= std::numeric_limits<std::uint32_t>::max())
      return {KvWireErrc::too_large, 0, "payload longer than max_payload_bytes"};
    base_ = reinterpret_cast<const char*>(payload.data());
    std::size_t used = 0;
    switch (tape_.parse(reinterpret_cast<const unsigned char*>(payload.data()), payload.size(),
                        options_.max_depth, used)) {
      case detail::MpParse::ok:
        break;
      case detail::MpParse::too_deep:
        return {KvWireErrc::too_deep, 0, "nesting deeper than max_depth"};
      case detail::MpParse::invalid:
        return {KvWireErrc::invalid_msgpack, 0, "reserved msgpack type byte"};
      case detail::MpParse::overflow:
        return {KvWireErrc::invalid_msgpack, 0, "rejected by the msgpack parser"};
      case detail::MpParse::truncated:
        return {KvWireErrc::truncated, 0, "bytes end inside a value"};
    }
    if (used != payload.size()) return {KvWireErrc::trailing_bytes, 0, "bytes after the batch"};
    return batch(out);
  }

  // --- tape access ---------------------------------------------------------

  const detail::MpNode& at(std::uint32_t i) const noexcept { return tape_[i]; }
  std::uint32_t next(std::uint32_t i) const noexcept { return tape_[i].end; }
  std::string_view str(std::uint32_t i) const noexcept { return {base_ + at(i).bits, at(i).size}; }
  bool is_str(std::uint32_t i, std::string_view s) const noexcept {
    return at(i).kind == Kind::str && str(i) == s;
  }
  bool is_nil(std::uint32_t i) const noexcept { return i == kNone || at(i).kind == Kind::nil; }

  // The children of array `i` (element indexes) into `out`.
  void children(std::uint32_t i, std::vector<std::uint32_t>& out) const {
    out.clear();
    std::uint32_t c = i + 1U;
    for (std::uint32_t k = 0; k < at(i).size; ++k) {
      out.push_back(c);
      c = next(c);
    }
  }

  // An integer that fits `max`, from an unsigned or non-negative signed node.
  bool small_uint(std::uint32_t i, std::uint64_t max, std::uint64_t& v) const noexcept {
    if (at(i).kind != Kind::uint || at(i).bits > max) return false;
    v = at(i).bits;
    return true;
  }

  // A block hash: unsigned (up to 2^64 - 1), signed (two's complement, as
  // SGLang sends Python's signed hashes), or a byte string (see
  // kv_wire_hash_from_bytes).
  bool block_hash(std::uint32_t i, std::uint64_t& v) const noexcept {
    const detail::MpNode& n = at(i);
    switch (n.kind) {
      case Kind::uint:
      case Kind::sint:
        v = n.bits;
        return true;
      case Kind::bin:
        if (n.size == 0) return false;
        v = kv_wire_hash_from_bytes(std::span<const unsigned char>(
            reinterpret_cast<const unsigned char*>(base_ + n.bits), n.size));
        return true;
      default:
        return false;
    }
  }

  // --- batch ---------------------------------------------------------------

  KvWireStatus batch(KvWireBatch& out) {
    const std::uint32_t root = 0;
    std::uint32_t ts = kNone, events = kNone, rank = kNone;
    if (at(root).kind == Kind::array) {
      if (at(root).size < 2) return {KvWireErrc::bad_batch, 0, "batch array shorter than 2"};
      ts = root + 1U;
      events = next(ts);
      if (at(root).size >= 3) rank = next(events);
    } else if (at(root).kind == Kind::map) {
      std::uint32_t k = root + 1U;
      for (std::uint32_t p = 0; p < at(root).size; ++p) {
        const std::uint32_t v = next(k);
        if (is_str(k, "ts"))
          ts = v;
        else if (is_str(k, "events"))
          events = v;
        else if (is_str(k, "data_parallel_rank") || is_str(k, "dp_rank"))
          rank = v;
        k = next(v);
      }
      if (ts == kNone) return {KvWireErrc::bad_batch, 0, "batch map without ts"};
      if (events == kNone) return {KvWireErrc::bad_batch, 0, "batch map without events"};
    } else {
      return {KvWireErrc::bad_batch, 0, "batch is neither an array nor a map"};
    }

    switch (at(ts).kind) {
      case Kind::real:
        out.ts = std::bit_cast<double>(at(ts).bits);
        break;
      case Kind::uint:
        out.ts = static_cast<double>(at(ts).bits);
        break;
      case Kind::sint:
        out.ts = static_cast<double>(static_cast<std::int64_t>(at(ts).bits));
        break;
      default:
        return {KvWireErrc::bad_batch, 0, "ts is not a number"};
    }
    if (!is_nil(rank)) {
      std::uint64_t r = 0;
      if (!small_uint(rank, std::numeric_limits<std::uint32_t>::max(), r))
        return {KvWireErrc::bad_batch, 0, "data_parallel_rank is not a 32-bit unsigned integer"};
      out.dp_rank = static_cast<std::uint32_t>(r);
    }
    if (at(events).kind != Kind::array) return {KvWireErrc::bad_batch, 0, "events is not an array"};

    out.events.reserve(at(events).size);
    std::uint32_t e = events + 1U;
    for (std::uint32_t k = 0; k < at(events).size; ++k) {
      if (const auto f = event(e, out)) return {f->code, k, f->detail};
      e = next(e);
    }
    return {};
  }

  // --- events --------------------------------------------------------------

  static Tag tag_of(std::string_view s) noexcept {
    if (s == "BlockStored") return Tag::stored;
    if (s == "BlockRemoved") return Tag::removed;
    if (s == "AllBlocksCleared") return Tag::cleared;
    if (s == "TierBlocksCleared") return Tag::tier_cleared;
    return Tag::unknown;
  }

  std::optional<Fail> event(std::uint32_t e, KvWireBatch& out) {
    Fields f;
    Tag tag = Tag::unknown;
    if (at(e).kind == Kind::array) {
      if (at(e).size == 0) return Fail{KvWireErrc::bad_event, "empty event array"};
      const std::uint32_t t = e + 1U;
      if (at(t).kind != Kind::str) return Fail{KvWireErrc::bad_event, "event tag is not a string"};
      tag = tag_of(str(t));
      f.positional = true;
      // Positional fields in msgspec's declaration order.
      std::uint32_t c = next(t);
      for (std::uint32_t pos = 1; pos < at(e).size; ++pos, c = next(c)) {
        if (tag == Tag::stored) {
          switch (pos) {
            case 1:
              f.hashes = c;
              break;
            case 2:
              f.parent = c;
              break;
            case 3:
              f.tokens = c;
              break;
            case 4:
              f.block_size = c;
              break;
            case 6:
              f.medium = c;
              break;
            case 7:
              f.lora_name = c;
              break;
            case 8:
              f.extra_keys = c;
              break;
            case 9:
              f.group_idx = c;
              break;
            case 10:
              f.spec_kind = c;
              break;
            default:
              break;  // 5: lora_id (superseded by lora_name); later ones: unknown
          }
        } else if (tag == Tag::removed) {
          // vLLM's BlockRemoved names no kind: what follows group_idx
          // (locality, ...) says nothing about the group.
          switch (pos) {
            case 1:
              f.hashes = c;
              break;
            case 2:
              f.medium = c;
              break;
            case 3:
              f.group_idx = c;
              break;
            default:
              break;
          }
        } else if (tag == Tag::tier_cleared && pos == 1) {
          f.medium = c;
        }
      }
    } else if (at(e).kind == Kind::map) {
      bool has_type = false;
      std::uint32_t k = e + 1U;
      for (std::uint32_t p = 0; p < at(e).size; ++p) {
        const std::uint32_t v = next(k);
        if (at(k).kind == Kind::str) {
          const std::string_view key = str(k);
          if (key == "type") {
            if (at(v).kind != Kind::str)
              return Fail{KvWireErrc::bad_event, "event type is not a string"};
            tag = tag_of(str(v));
            has_type = true;
          } else if (key == "block_hashes") {
            f.hashes = v;
          } else if (key == "parent_block_hash") {
            f.parent = v;
          } else if (key == "token_ids") {
            f.tokens = v;
          } else if (key == "block_size") {
            f.block_size = v;
          } else if (key == "medium") {
            f.medium = v;
          } else if (key == "lora_name") {
            f.lora_name = v;
          } else if (key == "extra_keys") {
            f.extra_keys = v;
          } else if (key == "group_idx") {
            f.group_idx = v;
          } else if (key == "kv_cache_spec_kind") {
            f.spec_kind = v;
          } else if (key == "cache_salt") {
            f.cache_salt = v;
          }
        }
        k = next(v);
      }
      if (!has_type) return Fail{KvWireErrc::bad_event, "event map without type"};
    } else {
      return Fail{KvWireErrc::bad_event, "event is neither an array nor a map"};
    }

    switch (tag) {
      case Tag::unknown:
        ++out.unknown_events;
        return std::nullopt;
      case Tag::cleared:
        out.events.emplace_back(kv_event::Cleared{});
        return std::nullopt;
      case Tag::tier_cleared:
        return tier_cleared(f, out);
      case Tag::removed:
        return removed(f, out);
      case Tag::stored:
        return stored(f, out);
    }
    return std::nullopt;
  }

  static bool main_kind(std::string_view k) noexcept {
    return k == "full_attention" || k == "mla_attention" || k == "sink_full_attention";
  }

  // Whether the event is about another medium than the indexed one (with
  // device_only, a string other than "GPU"). Checked before the event's
  // contents: an offload tier publishes what the index never reads (block
  // size 0, no token ids), and a step's GPU events share its batch.
  bool other_medium(std::uint32_t medium) const noexcept {
    return options_.device_only && medium != kNone && at(medium).kind == Kind::str &&
           str(medium) != "GPU";
  }

  // Dynamo's filter: only the main attention group's blocks are routed on.
  // The event's spec kind decides; without one, the kind learned for its
  // group (with a stream state); otherwise a group index other than 0 skips.
  // An event with both a kind and a group teaches the stream state, even
  // when its medium skips it: a group's kind does not depend on the tier.
  bool skipped_by_rule(const Fields& f) noexcept {
    const bool has_group = f.group_idx != kNone && at(f.group_idx).kind == Kind::uint;
    bool other_group = false;
    if (f.spec_kind != kNone && at(f.spec_kind).kind == Kind::str) {
      const bool main = main_kind(str(f.spec_kind));
      if (stream_ != nullptr && has_group) stream_->learn(at(f.group_idx).bits, main);
      other_group = !main;
    } else if (has_group) {
      const std::optional<bool> learned =
          stream_ != nullptr ? stream_->is_main_group(at(f.group_idx).bits) : std::nullopt;
      other_group = learned ? !*learned : at(f.group_idx).bits != 0;
    }
    return other_group || other_medium(f.medium);
  }

  // A clear of one tier: of the indexed medium (any, without device_only)
  // it clears the worker, of another it is skipped.
  std::optional<Fail> tier_cleared(const Fields& f, KvWireBatch& out) {
    if (f.medium == kNone) return Fail{KvWireErrc::bad_event, "TierBlocksCleared without medium"};
    if (at(f.medium).kind != Kind::str)
      return Fail{KvWireErrc::bad_value, "TierBlocksCleared medium is not a string"};
    if (other_medium(f.medium)) {
      ++out.ignored_events;
      return std::nullopt;
    }
    out.events.emplace_back(kv_event::Cleared{});
    return std::nullopt;
  }

  std::optional<Fail> hash_list(std::uint32_t i, std::vector<std::uint64_t>& out) const {
    out.clear();
    if (i == kNone) return Fail{KvWireErrc::bad_event, "block_hashes missing"};
    if (at(i).kind != Kind::array) return Fail{KvWireErrc::bad_value, "block_hashes not an array"};
    out.reserve(at(i).size);
    std::uint32_t c = i + 1U;
    for (std::uint32_t k = 0; k < at(i).size; ++k, c = next(c)) {
      std::uint64_t h = 0;
      if (!block_hash(c, h)) return Fail{KvWireErrc::bad_value, "block hash of a wrong type"};
      out.push_back(h);
    }
    return std::nullopt;
  }

  std::optional<Fail> removed(const Fields& f, KvWireBatch& out) {
    if (other_medium(f.medium)) {
      skipped_by_rule(f);  // still teaches the group's kind
      ++out.ignored_events;
      return std::nullopt;
    }
    if (auto fail = hash_list(f.hashes, hashes_)) return fail;
    if (skipped_by_rule(f)) {
      ++out.ignored_events;
      return std::nullopt;
    }
    out.blocks += hashes_.size();
    out.events.emplace_back(kv_event::Removed{hashes_});
    return std::nullopt;
  }

  // token_ids: plain ids, or (Eagle speculative decoding) [token, next] pairs
  // from which the window of block_size + 1 tokens is rebuilt, as Dynamo does.
  std::optional<Fail> token_list(std::uint32_t i, bool& eagle) {
    eagle = false;
    if (i == kNone) return Fail{KvWireErrc::bad_event, "token_ids missing"};
    if (at(i).kind != Kind::array) return Fail{KvWireErrc::bad_value, "token_ids not an array"};
    const std::uint32_t n = at(i).size;
    eagle = n > 0 && at(i + 1U).kind == Kind::array;
    constexpr std::uint64_t max = std::numeric_limits<std::uint32_t>::max();
    if (!eagle) {
      // Plain ids are scalars, so id k is node i + 1 + k (the tape holds
      // them all: the parse completed). Not cleared first: resizing keeps
      // the old values instead of zeroing what is overwritten anyway.
      tokens_.resize(n);
      const detail::MpNode* id = &tape_[i] + 1;
      for (std::uint32_t k = 0; k < n; ++k) {
        if (id[k].kind != Kind::uint || id[k].bits > max)
          return Fail{KvWireErrc::bad_value, "token id is not a 32-bit unsigned integer"};
        tokens_[k] = static_cast<std::uint32_t>(id[k].bits);
      }
      return std::nullopt;
    }
    tokens_.clear();
    tokens_.reserve(std::size_t{n} + 1U);
    std::uint32_t c = i + 1U;
    std::uint64_t last = 0;
    for (std::uint32_t k = 0; k < n; ++k, c = next(c)) {
      std::uint64_t t = 0;
      if (at(c).kind != Kind::array || at(c).size != 2 || !small_uint(c + 1U, max, t) ||
          !small_uint(next(c + 1U), max, last))
        return Fail{KvWireErrc::bad_value, "token pair is not two 32-bit token ids"};
      tokens_.push_back(static_cast<std::uint32_t>(t));
    }
    tokens_.push_back(static_cast<std::uint32_t>(last));
    return std::nullopt;
  }

  // extra_keys: nil, or one entry per block, each nil or a list of keys.
  std::optional<Fail> check_extra_keys(std::uint32_t i) const noexcept {
    if (is_nil(i)) return std::nullopt;
    if (at(i).kind != Kind::array) return Fail{KvWireErrc::bad_value, "extra_keys not an array"};
    std::uint32_t c = i + 1U;
    for (std::uint32_t b = 0; b < at(i).size; ++b, c = next(c))
      if (at(c).kind != Kind::nil && at(c).kind != Kind::array)
        return Fail{KvWireErrc::bad_value, "extra_keys entry is neither nil nor an array"};
    return std::nullopt;
  }

  // The value of string key `key` in map `m`; kNone when absent.
  std::uint32_t map_value(std::uint32_t m, std::string_view key) const noexcept {
    std::uint32_t k = m + 1U;
    for (std::uint32_t p = 0; p < at(m).size; ++p) {
      const std::uint32_t v = next(k);
      if (at(k).kind == Kind::str && str(k) == key) return v;
      k = next(v);
    }
    return kNone;
  }

  // The cache salt among the first block's extra_keys (checked), Dynamo's
  // rule: its first plain string that starts with cache_salt_key_prefix
  // and goes on, skipping once a key equal to the LoRA name; empty if none.
  std::string_view extra_keys_salt(std::uint32_t i, std::string_view lora) const noexcept {
    if (i == kNone || at(i).kind != Kind::array || at(i).size == 0) return {};
    const std::uint32_t first = i + 1U;
    if (at(first).kind != Kind::array) return {};
    bool lora_skipped = lora.empty();
    std::uint32_t key = first + 1U;
    for (std::uint32_t k = 0; k < at(first).size; ++k, key = next(key)) {
      if (at(key).kind != Kind::str) continue;
      const std::string_view s = str(key);
      if (!lora_skipped && s == lora) {
        lora_skipped = true;
        continue;
      }
      if (s.size() > cache_salt_key_prefix.size() && s.starts_with(cache_salt_key_prefix))
        return s.substr(cache_salt_key_prefix.size());
    }
    return {};
  }

  // extra_keys (checked): a key is a string or a [string, offset] pair, or
  // any other value (a salt, an embedding hash). Only strings that name a
  // media hash count.
  void media_lists(std::uint32_t i, std::size_t blocks) {
    media_.resize(std::max(media_.size(), blocks));
    for (std::size_t b = 0; b < blocks; ++b)
      media_[b].clear();
    media_spans_.clear();
    if (i == kNone || at(i).kind != Kind::array) return;
    bool any = false;
    std::uint32_t c = i + 1U;
    for (std::uint32_t b = 0; b < at(i).size && b < blocks; ++b, c = next(c)) {
      if (at(c).kind != Kind::array) continue;
      std::uint32_t key = c + 1U;
      for (std::uint32_t k = 0; k < at(c).size; ++k, key = next(key)) {
        std::uint32_t s = key;
        if (at(key).kind == Kind::array && at(key).size >= 1) s = key + 1U;
        if (at(s).kind != Kind::str) continue;
        if (const auto h = kv_wire_media_hash(str(s))) {
          media_[b].push_back(*h);
          any = true;
        }
      }
    }
    if (!any) return;
    for (std::size_t b = 0; b < blocks; ++b)
      media_spans_.emplace_back(media_[b]);
  }

  std::optional<Fail> stored(const Fields& f, KvWireBatch& out) {
    if (other_medium(f.medium)) {
      skipped_by_rule(f);  // still teaches the group's kind
      ++out.ignored_events;
      return std::nullopt;
    }
    if (auto fail = hash_list(f.hashes, hashes_)) return fail;
    std::optional<std::uint64_t> parent;
    if (!is_nil(f.parent)) {
      std::uint64_t p = 0;
      if (!block_hash(f.parent, p))
        return Fail{KvWireErrc::bad_value, "parent_block_hash of a wrong type"};
      parent = p;
    }
    bool eagle = false;
    if (auto fail = token_list(f.tokens, eagle)) return fail;
    if (f.block_size == kNone) return Fail{KvWireErrc::bad_event, "block_size missing"};
    std::uint64_t bs = 0;
    if (!small_uint(f.block_size, std::numeric_limits<std::uint32_t>::max(), bs))
      return Fail{KvWireErrc::bad_value, "block_size is not a 32-bit unsigned integer"};
    const bool lora_map = f.positional && f.lora_name != kNone && at(f.lora_name).kind == Kind::map;
    if (!is_nil(f.lora_name) && at(f.lora_name).kind != Kind::str && !lora_map)
      return Fail{KvWireErrc::bad_value, "lora_name is not a string"};
    const std::uint32_t salt = lora_map ? map_value(f.lora_name, "cache_salt") : f.cache_salt;
    if (!is_nil(salt) && at(salt).kind != Kind::str)
      return Fail{KvWireErrc::bad_value, "cache_salt is not a string"};
    if (auto fail = check_extra_keys(f.extra_keys)) return fail;
    if (skipped_by_rule(f)) {
      ++out.ignored_events;
      return std::nullopt;
    }

    // Blocks whose tokens are all present, in order; the rest are not
    // published (Dynamo stops at the first incomplete block).
    std::size_t kept = 0;
    if (options_.block_size == 0 || bs == options_.block_size) {
      const std::size_t usable = tokens_.size() - (eagle && !tokens_.empty() ? 1U : 0U);
      kept = std::min(hashes_.size(), bs == 0 ? std::size_t{0} : usable / bs);
    }
    out.dropped_blocks += hashes_.size() - kept;
    if (kept == 0) {
      ++out.ignored_events;
      return std::nullopt;
    }

    std::string_view lora;
    if (!is_nil(f.lora_name) && at(f.lora_name).kind == Kind::str) lora = str(f.lora_name);
    media_lists(f.extra_keys, kept);
    BlockHashOptions ho;
    // A salt the event names (even an empty one, which is no salt) is the
    // event's; otherwise its first block's extra_keys may carry one.
    ho.seed = block_hash_seed(lora, is_nil(salt) ? extra_keys_salt(f.extra_keys, lora) : str(salt));
    ho.media = media_spans_;
    ho.eagle = eagle;
    locals_.resize(kept);
    const std::size_t window = kept * bs + (eagle ? 1U : 0U);
    local_block_hashes(std::span<const std::uint32_t>(tokens_.data(), window), bs, locals_, ho);

    kv_event::Stored ev;
    ev.parent_hash = parent;
    ev.blocks.resize(kept);
    for (std::size_t b = 0; b < kept; ++b)
      ev.blocks[b] = KvBlock{hashes_[b], locals_[b]};
    out.blocks += kept;
    out.events.emplace_back(std::move(ev));
    return std::nullopt;
  }

  KvWireOptions options_;
  KvWireStreamState* stream_ = nullptr;  // the working state of a stateful decode
  const char* base_ = nullptr;
  detail::MpTape tape_;
  std::vector<std::uint64_t> hashes_;
  std::vector<std::uint32_t> tokens_;
  std::vector<std::uint64_t> locals_;
  std::vector<std::vector<std::uint64_t>> media_;
  std::vector<std::span<const std::uint64_t>> media_spans_;
};

/// Decodes one payload with a temporary decoder (see KvEventWireDecoder::decode;
/// keep a decoder to reuse its buffers). O(payload bytes + tokens).
inline KvWireStatus decode_kv_event_batch(std::span<const std::byte> payload, KvWireBatch& out,
                                          const KvWireOptions& options = {}) {
  KvEventWireDecoder decoder(options);
  return decoder.decode(payload, out);
}

/// Decodes one payload of the stream that `state` follows with a temporary
/// decoder (see the stateful KvEventWireDecoder::decode). O(payload bytes +
/// tokens).
inline KvWireStatus decode_kv_event_batch(std::span<const std::byte> payload, KvWireBatch& out,
                                          KvWireStreamState& state,
                                          const KvWireOptions& options = {}) {
  KvEventWireDecoder decoder(options);
  return decoder.decode(payload, out, state);
}

}  // namespace promptcache

#endif  // PROMPTCACHE_KV_EVENT_WIRE_HPP
