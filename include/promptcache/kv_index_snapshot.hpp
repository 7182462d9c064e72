// promptcache: kv_index_snapshot.hpp
// SPDX-License-Identifier: Apache-2.0
//
// A snapshot of a KvIndex that says where in the event stream it is current:
// every worker rank's view (its dump, as KvIndex::dump gives it), every worker
// rank's cursor (the last event id applied) and one stream sequence number the
// caller supplies (for instance the JetStream sequence or the event plane
// sequence of the last event applied), in one versioned msgpack document.
// A router replica restoring it knows exactly which events to replay on top,
// instead of replaying from an unknown point and relying on replays being
// harmless.
//
// Restoring is all or nothing: a snapshot that is truncated, garbled (every
// byte is covered by an XXH3-64 checksum), of another version or that the
// index would refuse leaves the target index untouched.
//
// Needs msgpack-cxx (for the parser) and xxHash (through block_hash.hpp).
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
#endif
#if !defined(PROMPTCACHE_KV_INDEX_SNAPSHOT_HPP) && \
    (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) >= 202002L
#define PROMPTCACHE_KV_INDEX_SNAPSHOT_HPP

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "promptcache/block_hash.hpp"
#include "promptcache/detail/dynamo_tape.hpp"
#include "promptcache/kv_index.hpp"

namespace promptcache {

/// The snapshot format's version this header writes (and the only one it reads).
inline constexpr std::uint64_t kv_index_snapshot_version = 1;

/// The first element of every snapshot.
inline constexpr std::string_view kv_index_snapshot_magic = "promptcache.kv_index_snapshot";

/// One worker rank's position in its event stream.
struct KvSnapshotCursor {
  KvWorker worker;                             ///< The worker rank.
  std::optional<std::uint64_t> last_event_id;  ///< Last applied event id; none if none yet.
  /// Memberwise equality. O(1).
  friend bool operator==(const KvSnapshotCursor&, const KvSnapshotCursor&) = default;
};

/// Where a restored index is current.
struct KvSnapshotInfo {
  std::uint64_t stream_sequence = 0;      ///< The sequence the snapshot was taken at.
  std::vector<KvSnapshotCursor> cursors;  ///< Every worker rank, by (worker_id, dp_rank).
  /// Memberwise equality. O(workers).
  friend bool operator==(const KvSnapshotInfo&, const KvSnapshotInfo&) = default;
};

/// Why a snapshot was not restored; `ok` when it was.
enum class KvSnapshotErrc : std::uint8_t {
  ok = 0,               ///< Restored.
  empty,                ///< Zero bytes.
  truncated,            ///< The bytes end inside a value.
  invalid_msgpack,      ///< Not msgpack (a reserved byte), or more than 4 GiB.
  trailing_bytes,       ///< Bytes follow the document.
  bad_magic,            ///< Not a KvIndex snapshot (no magic string first).
  unsupported_version,  ///< A version other than kv_index_snapshot_version.
  bad_checksum,         ///< The checksum does not match the bytes (garbled).
  bad_format,           ///< A field of the wrong type or range, a block list not a multiple
                        ///< of 16 bytes, workers out of order or repeated.
  index_not_empty,      ///< The target index knows workers already.
  refused,              ///< The index refused a worker's dump (parent_not_found or
                        ///< block_conflict: e.g. orphans restored into a refusing index).
  out_of_memory,        ///< An allocation failed.
};

/// The name of an error code, for logs. O(1).
[[nodiscard]] constexpr std::string_view to_string(KvSnapshotErrc e) noexcept {
  constexpr std::array<std::string_view, 12> names = {"ok",
                                                      "empty",
                                                      "truncated",
                                                      "invalid_msgpack",
                                                      "trailing_bytes",
                                                      "bad_magic",
                                                      "unsupported_version",
                                                      "bad_checksum",
                                                      "bad_format",
                                                      "index_not_empty",
                                                      "refused",
                                                      "out_of_memory"};
  const auto i = static_cast<std::size_t>(e);
  return i < names.size() ? names[i] : std::string_view("unknown");
}

/// The outcome of a restore.
struct KvSnapshotStatus {
  KvSnapshotErrc code = KvSnapshotErrc::ok;  ///< ok, or why nothing was restored.
  std::string_view detail = {};              ///< A static description of the failed check.
  /// True when the snapshot was restored. O(1).
  [[nodiscard]] constexpr bool ok() const noexcept { return code == KvSnapshotErrc::ok; }
};

namespace detail {

class KvSnapshotWriter {
 public:
  explicit KvSnapshotWriter(std::vector<std::byte>& out) noexcept : buf_(out), pk_(buf_) {}
  msgpack::packer<DynByteBuffer>& pk() noexcept { return pk_; }

 private:
  DynByteBuffer buf_;
  msgpack::packer<DynByteBuffer> pk_;
};

inline void kv_snapshot_put_le64(std::byte* p, std::uint64_t v) noexcept {
  for (int i = 0; i < 8; ++i)
    p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xFFU);
}
inline std::uint64_t kv_snapshot_get_le64(const std::byte* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | static_cast<std::uint64_t>(p[i]);
  return v;
}

struct KvSnapshotWorker {
  KvWorker worker;
  std::optional<std::uint64_t> last;
  std::vector<KvEvent> dump;
};

}  // namespace detail

/// The snapshot of `index`, current at `stream_sequence`: every worker rank
/// (sorted by worker id, then dp rank) with its cursor and its dump. Throws
/// only std::bad_alloc; the index is not changed. O(blocks held); the bytes
/// take about 16 per (worker, block) pair plus about 12 per chain of the dumps.
[[nodiscard]] inline std::vector<std::byte> kv_index_snapshot(const KvIndex& index,
                                                              std::uint64_t stream_sequence) {
  std::vector<KvWorker> workers = index.workers();
  std::sort(workers.begin(), workers.end());
  std::vector<std::byte> out;
  out.reserve(64 + index.total_blocks() * 16U);
  detail::KvSnapshotWriter w(out);
  auto& pk = w.pk();
  pk.pack_array(5);
  pk.pack_str(static_cast<std::uint32_t>(kv_index_snapshot_magic.size()));
  pk.pack_str_body(kv_index_snapshot_magic.data(),
                   static_cast<std::uint32_t>(kv_index_snapshot_magic.size()));
  pk.pack_uint64(kv_index_snapshot_version);
  pk.pack_uint64(stream_sequence);
  pk.pack_array(static_cast<std::uint32_t>(workers.size()));
  std::vector<std::byte> blob;
  for (const KvWorker& wk : workers) {
    pk.pack_array(4);
    pk.pack_uint64(wk.worker_id);
    pk.pack_uint32(wk.dp_rank);
    const std::optional<CursorState<>> cur = index.cursor(wk);
    const std::optional<std::uint64_t> last = cur ? cur->last_applied_id() : std::nullopt;
    if (last)
      pk.pack_uint64(*last);
    else
      pk.pack_nil();
    const std::vector<KvEvent> dump = index.dump(wk);
    pk.pack_array(static_cast<std::uint32_t>(dump.size()));
    for (const KvEvent& ev : dump) {
      const auto& st = std::get<kv_event::Stored>(ev.data);  // dump gives Stored only
      pk.pack_array(2);
      if (st.parent_hash)
        pk.pack_uint64(*st.parent_hash);
      else
        pk.pack_nil();
      blob.resize(st.blocks.size() * 16U);
      for (std::size_t i = 0; i < st.blocks.size(); ++i) {
        detail::kv_snapshot_put_le64(blob.data() + 16U * i, st.blocks[i].block_hash);
        detail::kv_snapshot_put_le64(blob.data() + 16U * i + 8U, st.blocks[i].tokens_hash);
      }
      pk.pack_bin(static_cast<std::uint32_t>(blob.size()));
      pk.pack_bin_body(reinterpret_cast<const char*>(blob.data()),
                       static_cast<std::uint32_t>(blob.size()));
    }
  }
  // The checksum: always uint 64 (0xcf + 8 bytes, big-endian), the XXH3-64
  // (seed 0) of every byte before it.
  const std::uint64_t sum = detail::xxh3_64(out.data(), out.size());
  out.push_back(std::byte{0xcf});
  for (int i = 7; i >= 0; --i)
    out.push_back(static_cast<std::byte>((sum >> (8 * i)) & 0xFFU));
  return out;
}

/// Restores `snapshot` into `index`, which must know no worker yet, and
/// writes where it is current into `info`. All or nothing: on any error
/// `index` and `info` are left untouched and the status says why; nothing
/// throws. On success the index holds exactly the snapshotted views and
/// cursors (a worker rank whose cursor had applied nothing and that holds
/// nothing stays unknown, which behaves the same), keeps its options, and its
/// counters are those of the restore (one replace_worker per rank).
/// O(snapshot bytes + blocks restored).
inline KvSnapshotStatus restore_kv_index(std::span<const std::byte> snapshot, KvIndex& index,
                                         KvSnapshotInfo& info) noexcept {
  using detail::DynKind;
  using detail::DynNode;
  using E = KvSnapshotErrc;
  if (snapshot.empty()) return {E::empty, "no bytes"};
  if (snapshot.size() >= std::numeric_limits<std::uint32_t>::max())
    return {E::invalid_msgpack, "larger than 4 GiB"};
  if (index.worker_count() != 0U) return {E::index_not_empty, "the index knows workers"};
  try {
    std::vector<DynNode> tape;
    std::vector<std::uint32_t> open;
    const char* base = reinterpret_cast<const char*>(snapshot.data());
    switch (detail::dyn_parse_msgpack(base, snapshot.size(), 8, tape, open)) {
      case detail::DynParse::ok:
        break;
      case detail::DynParse::truncated:
        return {E::truncated, "bytes end inside a value"};
      case detail::DynParse::invalid:
        return {E::invalid_msgpack, "not msgpack"};
      case detail::DynParse::trailing:
        return {E::trailing_bytes, "bytes after the snapshot"};
      case detail::DynParse::too_deep:
        return {E::bad_format, "nesting deeper than the format's"};
    }
    const auto at = [&](std::uint32_t i) -> const DynNode& { return tape[i]; };
    if (at(0).kind != DynKind::array || at(0).size == 0U || at(1).kind != DynKind::str ||
        std::string_view(base + at(1).bits, at(1).size) != kv_index_snapshot_magic)
      return {E::bad_magic, "not a KvIndex snapshot"};
    const std::uint32_t ver = at(1).end;
    if (at(0).size < 2U || at(ver).kind != DynKind::uint)
      return {E::bad_format, "no version number"};
    if (at(ver).bits != kv_index_snapshot_version)
      return {E::unsupported_version, "unknown snapshot version"};
    if (at(0).size != 5U) return {E::bad_format, "the document is not 5 elements"};
    const std::uint32_t seq = at(ver).end;
    const std::uint32_t list = at(seq).end;
    const std::uint32_t sum = at(list).end;
    // The checksum is the document's last 9 bytes: 0xcf and a big-endian u64.
    const std::size_t n = snapshot.size();
    if (at(sum).kind != DynKind::uint || n < 9U || snapshot[n - 9U] != std::byte{0xcf})
      return {E::bad_format, "no checksum"};
    if (detail::xxh3_64(snapshot.data(), n - 9U) != at(sum).bits)
      return {E::bad_checksum, "checksum mismatch"};
    if (at(seq).kind != DynKind::uint) return {E::bad_format, "stream sequence"};
    if (at(list).kind != DynKind::array) return {E::bad_format, "worker list"};

    std::vector<detail::KvSnapshotWorker> workers;
    workers.reserve(at(list).size);
    for (std::uint32_t c = list + 1U; c < at(list).end; c = at(c).end) {
      if (at(c).kind != DynKind::array || at(c).size != 4U)
        return {E::bad_format, "a worker is not [id, rank, cursor, chains]"};
      const std::uint32_t id = c + 1U, rank = at(id).end, cur = at(rank).end, chains = at(cur).end;
      if (at(id).kind != DynKind::uint || at(rank).kind != DynKind::uint ||
          at(rank).bits > std::numeric_limits<std::uint32_t>::max())
        return {E::bad_format, "worker id or dp rank"};
      detail::KvSnapshotWorker w;
      w.worker = KvWorker{at(id).bits, static_cast<std::uint32_t>(at(rank).bits)};
      if (!workers.empty() && !(workers.back().worker < w.worker))
        return {E::bad_format, "workers not in strictly increasing order"};
      if (at(cur).kind == DynKind::uint)
        w.last = at(cur).bits;
      else if (at(cur).kind != DynKind::nil)
        return {E::bad_format, "cursor"};
      if (at(chains).kind != DynKind::array) return {E::bad_format, "chain list"};
      w.dump.reserve(at(chains).size);
      for (std::uint32_t e = chains + 1U; e < at(chains).end; e = at(e).end) {
        if (at(e).kind != DynKind::array || at(e).size != 2U)
          return {E::bad_format, "a chain is not [parent, blocks]"};
        const std::uint32_t parent = e + 1U, blocks = at(parent).end;
        kv_event::Stored st;
        if (at(parent).kind == DynKind::uint)
          st.parent_hash = at(parent).bits;
        else if (at(parent).kind != DynKind::nil)
          return {E::bad_format, "chain parent"};
        if (at(blocks).kind != DynKind::bin || at(blocks).size == 0U || at(blocks).size % 16U != 0U)
          return {E::bad_format, "chain blocks are not 16-byte records"};
        const auto* p = reinterpret_cast<const std::byte*>(base + at(blocks).bits);
        st.blocks.resize(at(blocks).size / 16U);
        for (std::size_t i = 0; i < st.blocks.size(); ++i)
          st.blocks[i] = KvBlock{detail::kv_snapshot_get_le64(p + 16U * i),
                                 detail::kv_snapshot_get_le64(p + 16U * i + 8U)};
        w.dump.push_back(KvEvent{w.dump.size(), std::move(st)});
      }
      if (!w.last && !w.dump.empty()) return {E::bad_format, "blocks without a cursor"};
      workers.push_back(std::move(w));
    }

    // Built aside, swapped in only when every worker applied.
    KvIndex built(index.options());
    KvSnapshotInfo got;
    got.stream_sequence = at(seq).bits;
    got.cursors.reserve(workers.size());
    for (const detail::KvSnapshotWorker& w : workers) {
      got.cursors.push_back(KvSnapshotCursor{w.worker, w.last});
      if (!w.last) continue;  // nothing applied, nothing held: stays unknown
      if (!built.replace_worker(w.worker, w.dump, *w.last).ok)
        return {E::refused, "the index refused a worker's dump"};
    }
    index.swap(built);
    info = std::move(got);
    return {};
  } catch (const std::bad_alloc&) {
    return {E::out_of_memory, "allocation failed"};
  } catch (...) {
    return {E::out_of_memory, "unexpected exception"};
  }
}

}  // namespace promptcache

#endif  // PROMPTCACHE_KV_INDEX_SNAPSHOT_HPP
