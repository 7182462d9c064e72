// promptcache: dynamo_kv_event.hpp
// SPDX-License-Identifier: Apache-2.0
//
// Reads and writes the KV router events of NVIDIA Dynamo's own workers
// (`RouterEvent{worker_id, event: KvCacheEvent{event_id, data, dp_rank}}`) in
// the two encodings Dynamo puts on the wire: MessagePack with field names
// (rmp_serde::to_vec_named, the event plane's payload codec) and JSON
// (serde_json). Also reads and writes the event plane's envelope around a
// payload. docs/dynamo_kv_event.md gives the pinned Dynamo sources and the
// exact wire shape.
//
// Decoding follows what serde's derived deserializers accept for these types
// (a struct as a map with its field names in any order or as a positional
// array, unknown fields ignored, `dp_rank` / `mm_extra_info` defaulted,
// `parent_hash` optional) and rejects everything serde rejects (a duplicate
// field, a float, a negative or a too large integer for a u64 / u32, an
// unknown variant). Two rules are stricter than Dynamo's: bytes after the
// value are refused (rmp-serde ignores them), and map keys must be strings
// (msgpack byte strings count as strings).
//
// A payload either decodes completely or yields a status and leaves the
// output untouched: no exception leaves a decode (an allocation failure is a
// status too), and there are no partial events.
//
// Dynamo's block_hash (the engine's own name for the block, its
// ExternalSequenceBlockHash) maps to KvBlock::block_hash, its tokens_hash (the
// LocalBlockHash the router's tree is keyed by, block_hash.hpp) to
// KvBlock::tokens_hash; `parent_hash` and `block_hashes` are block names.
//
// Needs msgpack-cxx (header-only; MSGPACK_NO_BOOST is defined here unless the
// includer decided otherwise); JSON needs nothing else.
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
#endif
#if !defined(PROMPTCACHE_DYNAMO_KV_EVENT_HPP) && \
    (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) >= 202002L
#define PROMPTCACHE_DYNAMO_KV_EVENT_HPP

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "promptcache/detail/dynamo_tape.hpp"
#include "promptcache/kv_index.hpp"

namespace promptcache {

/// The two encodings Dynamo uses for a RouterEvent.
enum class DynamoWireFormat : std::uint8_t {
  msgpack,  ///< MessagePack, structs as maps with field names (rmp_serde::to_vec_named).
  json,     ///< JSON (serde_json), as written to NATS JetStream.
};

/// Why a payload was rejected; `ok` when it decoded.
enum class DynamoErrc : std::uint8_t {
  ok = 0,           ///< Decoded.
  empty,            ///< Zero bytes.
  too_large,        ///< Longer than DynamoDecodeOptions::max_payload_bytes (or 4 GiB).
  truncated,        ///< The bytes end inside a value.
  invalid_syntax,   ///< Not msgpack (a reserved byte) or not JSON.
  trailing_bytes,   ///< Bytes follow the value (JSON: other than whitespace).
  too_deep,         ///< Containers nested deeper than DynamoDecodeOptions::max_depth.
  wrong_type,       ///< A value of the wrong kind (a float or a string for an integer,
                    ///< a scalar for a struct, a non-string map key, ...).
  out_of_range,     ///< An integer that does not fit its field (negative, or above u64 / u32).
  missing_field,    ///< A required field is absent (or a positional struct is too short).
  duplicate_field,  ///< A field appears twice in one struct.
  bad_length,       ///< A positional struct, tuple or variant map with too many elements.
  unknown_variant,  ///< `data` names no variant of KvCacheEventData.
  out_of_memory,    ///< An allocation failed (the output is untouched).
};

/// The name of an error code, for logs. O(1).
[[nodiscard]] constexpr std::string_view to_string(DynamoErrc e) noexcept {
  constexpr std::array<std::string_view, 14> names = {"ok",
                                                      "empty",
                                                      "too_large",
                                                      "truncated",
                                                      "invalid_syntax",
                                                      "trailing_bytes",
                                                      "too_deep",
                                                      "wrong_type",
                                                      "out_of_range",
                                                      "missing_field",
                                                      "duplicate_field",
                                                      "bad_length",
                                                      "unknown_variant",
                                                      "out_of_memory"};
  const auto i = static_cast<std::size_t>(e);
  return i < names.size() ? names[i] : std::string_view("unknown");
}

/// The outcome of one decode.
struct DynamoStatus {
  DynamoErrc code = DynamoErrc::ok;  ///< ok, or why the payload was rejected.
  std::string_view detail = {};      ///< A static description of the failed check ("" when ok).
  /// True when the payload decoded. O(1).
  [[nodiscard]] constexpr bool ok() const noexcept { return code == DynamoErrc::ok; }
};

/// Limits a decode enforces before and while parsing.
struct DynamoDecodeOptions {
  /// Longer payloads are rejected before parsing (too_large).
  std::size_t max_payload_bytes = std::size_t{64} << 20;
  /// Deeper container nesting is rejected (too_deep). The schema needs 7.
  std::uint32_t max_depth = 16;
};

/// One Dynamo RouterEvent: the publishing worker rank and its KV event.
struct DynamoRouterEvent {
  KvWorker worker;  ///< worker_id and the event's dp_rank.
  KvEvent event;    ///< event_id and the payload (Stored / Removed / Cleared).
  /// Memberwise equality. O(size of the payload).
  friend bool operator==(const DynamoRouterEvent&, const DynamoRouterEvent&) = default;
};

/// The event plane's envelope around one payload (msgpack, field names).
struct DynamoEventEnvelope {
  std::string topic;               ///< The topic ("kv-events" for router events).
  std::uint64_t publisher_id = 0;  ///< The publishing instance.
  std::uint64_t sequence = 0;      ///< Per-publisher sequence number, for gap detection.
  std::uint64_t published_at = 0;  ///< Unix time of publication in milliseconds.
  std::vector<std::byte> payload;  ///< The payload (a msgpack RouterEvent for kv-events).
  /// Memberwise equality. O(payload).
  friend bool operator==(const DynamoEventEnvelope&, const DynamoEventEnvelope&) = default;
};

namespace detail {

// The schema walker over a tape (either format).
class DynamoReader {
 public:
  DynamoReader(const std::vector<DynNode>& tape, const char* text) noexcept
      : tape_(tape), text_(text) {}

  struct Fail {
    DynamoErrc code;
    std::string_view detail;
  };
  using R = std::optional<Fail>;  // nullopt: success

  R router_event(DynamoRouterEvent& out) const {
    std::array<std::uint32_t, 2> f{};
    if (R r = fields(0, {"worker_id", "event"}, 0b11U, f.data(), "RouterEvent")) return r;
    if (R r = u64(f[0], out.worker.worker_id, "worker_id")) return r;
    return kv_cache_event(f[1], out);
  }

  R envelope(DynamoEventEnvelope& out) const {
    std::array<std::uint32_t, 5> f{};
    if (R r = fields(0, {"topic", "publisher_id", "sequence", "published_at", "payload"}, 0b11111U,
                     f.data(), "EventEnvelope"))
      return r;
    if (at(f[0]).kind != DynKind::str) return Fail{DynamoErrc::wrong_type, "topic: not a string"};
    if (R r = u64(f[1], out.publisher_id, "publisher_id")) return r;
    if (R r = u64(f[2], out.sequence, "sequence")) return r;
    if (R r = u64(f[3], out.published_at, "published_at")) return r;
    if (at(f[4]).kind != DynKind::bin) return Fail{DynamoErrc::wrong_type, "payload: not bytes"};
    out.topic.assign(text_ + at(f[0]).bits, at(f[0]).size);
    const auto* p = reinterpret_cast<const std::byte*>(text_ + at(f[4]).bits);
    out.payload.assign(p, p + at(f[4]).size);
    return std::nullopt;
  }

 private:
  static constexpr std::uint32_t none = std::numeric_limits<std::uint32_t>::max();

  const DynNode& at(std::uint32_t i) const noexcept { return tape_[i]; }
  std::string_view str(std::uint32_t i) const noexcept { return {text_ + at(i).bits, at(i).size}; }

  // The fields of the struct at `node` (a map by name, or an array by
  // position) into `out` (`none` when absent). `required`: bit i set when
  // field i has no default. Unknown names are skipped.
  template <std::size_t N>
  R fields(std::uint32_t node, const std::string_view (&names)[N], std::uint32_t required,
           std::uint32_t* out, std::string_view what) const {
    for (std::size_t i = 0; i < N; ++i)
      out[i] = none;
    const DynNode& n = at(node);
    if (n.kind == DynKind::map) {
      std::uint32_t c = node + 1U;
      for (std::uint32_t k = 0; k < n.size; ++k) {
        const std::uint32_t v = at(c).end;
        if (at(c).kind != DynKind::str && at(c).kind != DynKind::bin)
          return Fail{DynamoErrc::wrong_type, "map key is not a string"};
        const std::string_view key = str(c);
        for (std::size_t i = 0; i < N; ++i) {
          if (key != names[i]) continue;
          if (out[i] != none) return Fail{DynamoErrc::duplicate_field, what};
          out[i] = v;
        }
        c = at(v).end;
      }
    } else if (n.kind == DynKind::array) {
      if (n.size > N) return Fail{DynamoErrc::bad_length, what};
      std::uint32_t c = node + 1U;
      for (std::uint32_t k = 0; k < n.size; ++k) {
        out[k] = c;
        c = at(c).end;
      }
      // Positional: only fields with a serde default may be left off the end.
      for (std::size_t i = n.size; i < N; ++i)
        if ((required >> i) & 1U) return Fail{DynamoErrc::missing_field, what};
      return std::nullopt;
    } else {
      return Fail{DynamoErrc::wrong_type, what};
    }
    for (std::size_t i = 0; i < N; ++i)
      if (out[i] == none && ((required >> i) & 1U)) return Fail{DynamoErrc::missing_field, what};
    return std::nullopt;
  }

  R u64(std::uint32_t i, std::uint64_t& v, std::string_view what) const {
    switch (at(i).kind) {
      case DynKind::uint:
        v = at(i).bits;
        return std::nullopt;
      case DynKind::sint:
      case DynKind::big:
        return Fail{DynamoErrc::out_of_range, what};
      default:
        return Fail{DynamoErrc::wrong_type, what};
    }
  }

  R kv_cache_event(std::uint32_t node, DynamoRouterEvent& out) const {
    std::array<std::uint32_t, 3> f{};
    // event_id and data are required; dp_rank has a serde default.
    if (R r = fields(node, {"event_id", "data", "dp_rank"}, 0b011U, f.data(), "KvCacheEvent"))
      return r;
    if (R r = u64(f[0], out.event.event_id, "event_id")) return r;
    out.worker.dp_rank = 0;
    if (f[2] != none) {
      std::uint64_t rank = 0;
      if (R r = u64(f[2], rank, "dp_rank")) return r;
      if (rank > std::numeric_limits<std::uint32_t>::max())
        return Fail{DynamoErrc::out_of_range, "dp_rank"};
      out.worker.dp_rank = static_cast<std::uint32_t>(rank);
    }
    return event_data(f[1], out.event.data);
  }

  // Externally tagged: "cleared", or a one-entry map {variant: value}.
  R event_data(std::uint32_t node, KvEventData& out) const {
    const DynNode& n = at(node);
    std::string_view name;
    std::uint32_t value = none;
    if (n.kind == DynKind::str || n.kind == DynKind::bin) {
      name = str(node);
    } else if (n.kind == DynKind::map) {
      if (n.size != 1U) return Fail{DynamoErrc::bad_length, "data: a variant map needs one entry"};
      if (at(node + 1U).kind != DynKind::str && at(node + 1U).kind != DynKind::bin)
        return Fail{DynamoErrc::wrong_type, "data: variant name is not a string"};
      name = str(node + 1U);
      value = at(node + 1U).end;
    } else {
      return Fail{DynamoErrc::wrong_type, "data: not a variant"};
    }
    if (name == "cleared") {
      if (value != none && at(value).kind != DynKind::nil)
        return Fail{DynamoErrc::wrong_type, "cleared: carries a value"};
      out = kv_event::Cleared{};
      return std::nullopt;
    }
    if (name != "stored" && name != "removed")
      return Fail{DynamoErrc::unknown_variant, "data: not stored / removed / cleared"};
    if (value == none) return Fail{DynamoErrc::wrong_type, "data: variant without its value"};
    if (name == "removed") {
      std::array<std::uint32_t, 1> f{};
      if (R r = fields(value, {"block_hashes"}, 0b1U, f.data(), "KvCacheRemoveData")) return r;
      kv_event::Removed rm;
      if (R r = hash_list(f[0], rm.block_hashes)) return r;
      out = std::move(rm);
      return std::nullopt;
    }
    std::array<std::uint32_t, 2> f{};
    // parent_hash is an Option, so serde takes an absent one as None; blocks
    // is required, which positionally requires parent_hash before it too.
    if (R r = fields(value, {"parent_hash", "blocks"}, 0b10U, f.data(), "KvCacheStoreData"))
      return r;
    kv_event::Stored st;
    if (f[0] != none && at(f[0]).kind != DynKind::nil) {
      std::uint64_t p = 0;
      if (R r = u64(f[0], p, "parent_hash")) return r;
      st.parent_hash = p;
    }
    if (at(f[1]).kind != DynKind::array) return Fail{DynamoErrc::wrong_type, "blocks"};
    st.blocks.reserve(at(f[1]).size);
    for (std::uint32_t c = f[1] + 1U; c < at(f[1]).end; c = at(c).end) {
      std::array<std::uint32_t, 3> b{};
      if (R r = fields(c, {"block_hash", "tokens_hash", "mm_extra_info"}, 0b011U, b.data(),
                       "KvCacheStoredBlockData"))
        return r;
      KvBlock blk;
      if (R r = u64(b[0], blk.block_hash, "block_hash")) return r;
      if (R r = u64(b[1], blk.tokens_hash, "tokens_hash")) return r;
      if (b[2] != none && at(b[2]).kind != DynKind::nil)
        if (R r = extra_info(b[2])) return r;
      st.blocks.push_back(blk);
    }
    out = std::move(st);
    return std::nullopt;
  }

  R hash_list(std::uint32_t node, std::vector<std::uint64_t>& out) const {
    if (at(node).kind != DynKind::array) return Fail{DynamoErrc::wrong_type, "block_hashes"};
    out.reserve(at(node).size);
    for (std::uint32_t c = node + 1U; c < at(node).end; c = at(c).end) {
      std::uint64_t h = 0;
      if (R r = u64(c, h, "block_hashes")) return r;
      out.push_back(h);
    }
    return std::nullopt;
  }

  // BlockExtraInfo{mm_objects: [{mm_hash: u64, offsets: [(usize, usize)]}]}:
  // validated as Dynamo would, then not kept (the tokens hash covers it).
  R extra_info(std::uint32_t node) const {
    std::array<std::uint32_t, 1> f{};
    if (R r = fields(node, {"mm_objects"}, 0b1U, f.data(), "BlockExtraInfo")) return r;
    if (at(f[0]).kind != DynKind::array) return Fail{DynamoErrc::wrong_type, "mm_objects"};
    for (std::uint32_t c = f[0] + 1U; c < at(f[0]).end; c = at(c).end) {
      std::array<std::uint32_t, 2> o{};
      if (R r = fields(c, {"mm_hash", "offsets"}, 0b11U, o.data(), "BlockMmObjectInfo")) return r;
      std::uint64_t v = 0;
      if (R r = u64(o[0], v, "mm_hash")) return r;
      if (at(o[1]).kind != DynKind::array) return Fail{DynamoErrc::wrong_type, "offsets"};
      for (std::uint32_t p = o[1] + 1U; p < at(o[1]).end; p = at(p).end) {
        if (at(p).kind != DynKind::array) return Fail{DynamoErrc::wrong_type, "offset pair"};
        if (at(p).size < 2U) return Fail{DynamoErrc::missing_field, "offset pair"};
        if (at(p).size > 2U) return Fail{DynamoErrc::bad_length, "offset pair"};
        if (R r = u64(p + 1U, v, "offset")) return r;
        if (R r = u64(at(p + 1U).end, v, "offset")) return r;
      }
    }
    return std::nullopt;
  }

  const std::vector<DynNode>& tape_;
  const char* text_;
};

// Parses `bytes` in `format` and runs `read` on the tape.
template <class Read>
DynamoStatus dynamo_decode(std::span<const std::byte> bytes, DynamoWireFormat format,
                           const DynamoDecodeOptions& options, Read&& read) noexcept {
  if (bytes.empty()) return {DynamoErrc::empty, "no bytes"};
  if (bytes.size() > options.max_payload_bytes ||
      bytes.size() >= std::numeric_limits<std::uint32_t>::max())
    return {DynamoErrc::too_large, "payload longer than max_payload_bytes"};
  try {
    std::vector<DynNode> tape;
    std::vector<std::uint32_t> open;
    std::string text;
    const char* data = reinterpret_cast<const char*>(bytes.data());
    const DynParse p =
        format == DynamoWireFormat::msgpack
            ? dyn_parse_msgpack(data, bytes.size(), options.max_depth, tape, open)
            : dyn_parse_json(data, bytes.size(), options.max_depth, tape, open, text);
    switch (p) {
      case DynParse::ok:
        break;
      case DynParse::truncated:
        return {DynamoErrc::truncated, "bytes end inside a value"};
      case DynParse::invalid:
        return {DynamoErrc::invalid_syntax,
                format == DynamoWireFormat::msgpack ? "not msgpack" : "not JSON"};
      case DynParse::trailing:
        return {DynamoErrc::trailing_bytes, "bytes after the value"};
      case DynParse::too_deep:
        return {DynamoErrc::too_deep, "nesting deeper than max_depth"};
    }
    const DynamoReader reader(tape, format == DynamoWireFormat::msgpack ? data : text.data());
    if (auto fail = read(reader)) return {fail->code, fail->detail};
    return {};
  } catch (const std::bad_alloc&) {
    return {DynamoErrc::out_of_memory, "allocation failed"};
  } catch (...) {
    return {DynamoErrc::out_of_memory, "unexpected exception"};
  }
}

inline void dynamo_pack_str(msgpack::packer<DynByteBuffer>& pk, std::string_view s) {
  pk.pack_str(static_cast<std::uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<std::uint32_t>(s.size()));
}

inline void dynamo_encode_msgpack(const DynamoRouterEvent& ev, std::vector<std::byte>& out) {
  DynByteBuffer buf(out);
  msgpack::packer<DynByteBuffer> pk(buf);
  pk.pack_map(2);
  dynamo_pack_str(pk, "worker_id");
  pk.pack_uint64(ev.worker.worker_id);
  dynamo_pack_str(pk, "event");
  pk.pack_map(3);
  dynamo_pack_str(pk, "event_id");
  pk.pack_uint64(ev.event.event_id);
  dynamo_pack_str(pk, "data");
  if (const auto* st = std::get_if<kv_event::Stored>(&ev.event.data)) {
    pk.pack_map(1);
    dynamo_pack_str(pk, "stored");
    pk.pack_map(2);
    dynamo_pack_str(pk, "parent_hash");
    if (st->parent_hash)
      pk.pack_uint64(*st->parent_hash);
    else
      pk.pack_nil();
    dynamo_pack_str(pk, "blocks");
    pk.pack_array(static_cast<std::uint32_t>(st->blocks.size()));
    for (const KvBlock& b : st->blocks) {
      pk.pack_map(3);
      dynamo_pack_str(pk, "block_hash");
      pk.pack_uint64(b.block_hash);
      dynamo_pack_str(pk, "tokens_hash");
      pk.pack_uint64(b.tokens_hash);
      dynamo_pack_str(pk, "mm_extra_info");
      pk.pack_nil();
    }
  } else if (const auto* rm = std::get_if<kv_event::Removed>(&ev.event.data)) {
    pk.pack_map(1);
    dynamo_pack_str(pk, "removed");
    pk.pack_map(1);
    dynamo_pack_str(pk, "block_hashes");
    pk.pack_array(static_cast<std::uint32_t>(rm->block_hashes.size()));
    for (const std::uint64_t h : rm->block_hashes)
      pk.pack_uint64(h);
  } else {
    dynamo_pack_str(pk, "cleared");
  }
  dynamo_pack_str(pk, "dp_rank");
  pk.pack_uint32(ev.worker.dp_rank);
}

inline void dynamo_encode_json(const DynamoRouterEvent& ev, std::vector<std::byte>& out) {
  DynJsonWriter w(out);
  w.raw("{");
  w.key("worker_id");
  w.u64(ev.worker.worker_id);
  w.raw(",");
  w.key("event");
  w.raw("{");
  w.key("event_id");
  w.u64(ev.event.event_id);
  w.raw(",");
  w.key("data");
  if (const auto* st = std::get_if<kv_event::Stored>(&ev.event.data)) {
    w.raw("{");
    w.key("stored");
    w.raw("{");
    w.key("parent_hash");
    if (st->parent_hash)
      w.u64(*st->parent_hash);
    else
      w.raw("null");
    w.raw(",");
    w.key("blocks");
    w.raw("[");
    for (std::size_t i = 0; i < st->blocks.size(); ++i) {
      if (i != 0) w.raw(",");
      w.raw("{");
      w.key("block_hash");
      w.u64(st->blocks[i].block_hash);
      w.raw(",");
      w.key("tokens_hash");
      w.u64(st->blocks[i].tokens_hash);
      w.raw(",");
      w.key("mm_extra_info");
      w.raw("null}");
    }
    w.raw("]}}");
  } else if (const auto* rm = std::get_if<kv_event::Removed>(&ev.event.data)) {
    w.raw("{");
    w.key("removed");
    w.raw("{");
    w.key("block_hashes");
    w.raw("[");
    for (std::size_t i = 0; i < rm->block_hashes.size(); ++i) {
      if (i != 0) w.raw(",");
      w.u64(rm->block_hashes[i]);
    }
    w.raw("]}}");
  } else {
    w.str("cleared");
  }
  w.raw(",");
  w.key("dp_rank");
  w.u64(ev.worker.dp_rank);
  w.raw("}}");
}

}  // namespace detail

/// Decodes one RouterEvent payload in `format` into `out`. On any error `out`
/// is left exactly as it was and the status says why; nothing throws.
/// O(payload bytes); allocates a tape of at most one node per payload byte.
inline DynamoStatus decode_dynamo_router_event(std::span<const std::byte> payload,
                                               DynamoWireFormat format, DynamoRouterEvent& out,
                                               const DynamoDecodeOptions& options = {}) noexcept {
  DynamoRouterEvent ev;
  const DynamoStatus st = detail::dynamo_decode(
      payload, format, options, [&](const detail::DynamoReader& r) { return r.router_event(ev); });
  if (st.ok()) out = std::move(ev);  // moves of these members do not throw
  return st;
}

/// Encodes `event` exactly as Dynamo's serializer does in `format`
/// (mm_extra_info is written as nil / null). Throws only std::bad_alloc.
/// O(blocks).
[[nodiscard]] inline std::vector<std::byte> encode_dynamo_router_event(
    const DynamoRouterEvent& event, DynamoWireFormat format) {
  std::vector<std::byte> out;
  if (format == DynamoWireFormat::msgpack)
    detail::dynamo_encode_msgpack(event, out);
  else
    detail::dynamo_encode_json(event, out);
  return out;
}

/// Decodes one event plane envelope (msgpack) into `out`; on any error `out`
/// is left as it was. Unknown fields (later versions add some) are ignored.
/// O(payload bytes).
inline DynamoStatus decode_dynamo_event_envelope(std::span<const std::byte> bytes,
                                                 DynamoEventEnvelope& out,
                                                 const DynamoDecodeOptions& options = {}) noexcept {
  DynamoEventEnvelope env;
  const DynamoStatus st =
      detail::dynamo_decode(bytes, DynamoWireFormat::msgpack, options,
                            [&](const detail::DynamoReader& r) { return r.envelope(env); });
  if (st.ok()) out = std::move(env);
  return st;
}

/// Encodes `envelope` as the event plane does (msgpack map with field names,
/// the payload as bin). Throws only std::bad_alloc. O(payload).
[[nodiscard]] inline std::vector<std::byte> encode_dynamo_event_envelope(
    const DynamoEventEnvelope& envelope) {
  std::vector<std::byte> out;
  detail::DynByteBuffer buf(out);
  msgpack::packer<detail::DynByteBuffer> pk(buf);
  pk.pack_map(5);
  detail::dynamo_pack_str(pk, "topic");
  detail::dynamo_pack_str(pk, envelope.topic);
  detail::dynamo_pack_str(pk, "publisher_id");
  pk.pack_uint64(envelope.publisher_id);
  detail::dynamo_pack_str(pk, "sequence");
  pk.pack_uint64(envelope.sequence);
  detail::dynamo_pack_str(pk, "published_at");
  pk.pack_uint64(envelope.published_at);
  detail::dynamo_pack_str(pk, "payload");
  pk.pack_bin(static_cast<std::uint32_t>(envelope.payload.size()));
  pk.pack_bin_body(reinterpret_cast<const char*>(envelope.payload.data()),
                   static_cast<std::uint32_t>(envelope.payload.size()));
  return out;
}

}  // namespace promptcache

#endif  // PROMPTCACHE_DYNAMO_KV_EVENT_HPP
