// promptcache: detail/kv_index_workers.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The per-worker state of kv_index.hpp: one slot per worker rank with its
// event cursor, its block names and the root of its hold tree, and the table
// that finds a rank's slot. Slot indices are what holder sets store, so a
// freed slot is reused lowest first (keeping holder bitsets narrow).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "promptcache/cursor.hpp"
#include "promptcache/detail/kv_index_fingerprints.hpp"
#include "promptcache/detail/kv_index_table.hpp"

namespace promptcache::detail {

/// Name-table fingerprint of a worker's block hash (engines' block hashes
/// need not be well mixed, so they are hashed first). O(1).
[[nodiscard]] constexpr std::uint32_t kv_name_fingerprint(std::uint64_t block_hash) noexcept {
  return KvFingerprintTable::fingerprint(kv_fold_hash(block_hash));
}

/// One worker rank. Its block names get a table of their own: an event
/// touches one worker only, so its lookups stay in a small, warm table. The
/// table maps name fingerprints to holds; the hold confirms the block hash.
template <class Worker>
struct KvWorkerSlot {
  KvFingerprintTable names;          ///< block hash (fingerprint) -> hold
  Worker worker{};                   ///< the rank
  CursorState<> cursor;              ///< its event stream position
  std::uint32_t sentinel = kv_npos;  ///< root of its hold tree (a hold on node 0)
  std::size_t blocks = 0;            ///< blocks held
  bool live = false;                 ///< false for a free slot
};

/// The slots, indexed by slot number, and (worker id, dp rank) -> slot.
/// `Worker` has members worker_id (64-bit) and dp_rank (32-bit).
template <class Worker>
class KvWorkerSlots {
 public:
  /// One slot.
  using Slot = KvWorkerSlot<Worker>;

  /// The slot of `w`, or kv_npos. O(1) expected.
  [[nodiscard]] std::uint32_t find(const Worker& w) const noexcept {
    return table_.find(w.worker_id, w.dp_rank);
  }
  /// Slot `s`. O(1).
  [[nodiscard]] Slot& operator[](std::uint32_t s) noexcept { return slots_[s]; }
  /// Slot `s`. O(1).
  [[nodiscard]] const Slot& operator[](std::uint32_t s) const noexcept { return slots_[s]; }
  /// Slot indices in use or free (one past the highest ever used). O(1).
  [[nodiscard]] std::size_t size() const noexcept { return slots_.size(); }
  /// Workers in the table. O(1).
  [[nodiscard]] std::size_t workers() const noexcept { return table_.size(); }

  /// Makes the next index() allocation-free. Strong guarantee.
  void reserve_index() { table_.reserve_extra(1); }

  /// The lowest free slot index, or size() when every slot is live. O(slots).
  [[nodiscard]] std::uint32_t lowest_free() const noexcept {
    std::uint32_t s = 0;
    while (s < slots_.size() && slots_[s].live)
      ++s;
    return s;
  }

  /// Makes sure slot `s` (at most size()) exists. Strong guarantee;
  /// std::length_error past 2^32 - 2 slots.
  void make_room(std::uint32_t s) {
    if (s < slots_.size()) return;
    if (slots_.size() >= kv_npos - 1U) throw std::length_error("kv index: too many workers");
    slots_.emplace_back();
  }

  /// Makes free slot `s` live for `w`, with `sentinel` as its hold root; it
  /// is not in the table yet (index()). O(1).
  void open(std::uint32_t s, const Worker& w, std::uint32_t sentinel) noexcept {
    Slot& x = slots_[s];
    x.names.clear();
    x.worker = w;
    x.cursor = CursorState<>{};
    x.sentinel = sentinel;
    x.blocks = 0;
    x.live = true;
  }

  /// Enters `w` -> `s` into the table (room reserved by reserve_index()).
  void index(const Worker& w, std::uint32_t s) noexcept {
    table_.insert(w.worker_id, w.dp_rank, s);
  }
  /// Removes `w` from the table (its slot stays live until close()).
  void unindex(const Worker& w) noexcept { table_.erase(w.worker_id, w.dp_rank); }

  /// Frees slot `s` (its blocks must be gone). O(1).
  void close(std::uint32_t s) noexcept {
    Slot& x = slots_[s];
    x.names.clear();
    x.worker = Worker{};
    x.cursor = CursorState<>{};
    x.sentinel = kv_npos;
    x.blocks = 0;
    x.live = false;
  }

  /// One past the highest live slot. O(slots).
  [[nodiscard]] std::size_t top() const noexcept {
    std::size_t t = 0;
    for (std::size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].live) t = i + 1U;
    return t;
  }

  /// Bytes held: slots, the table and every name table. O(slots).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    std::size_t n = table_.memory_bytes() + slots_.capacity() * sizeof(Slot);
    for (const Slot& s : slots_)
      n += s.names.memory_bytes();
    return n;
  }

  /// Exchanges the contents with `other`. O(1).
  void swap(KvWorkerSlots& other) noexcept {
    using std::swap;
    swap(table_, other.table_);
    swap(slots_, other.slots_);
  }

 private:
  struct PairHash {
    static constexpr std::uint64_t hash(std::uint64_t key, std::uint32_t tag) noexcept {
      return kv_mix64(key ^ (std::uint64_t{tag} * 0x9e3779b97f4a7c15ULL));
    }
  };

  KvPackedTable<PairHash> table_;  // (worker id, dp rank) -> slot
  std::vector<Slot> slots_;        // free ones are not live
};

}  // namespace promptcache::detail
