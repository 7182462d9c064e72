// promptcache: detail/pool_record.hpp
// SPDX-License-Identifier: Apache-2.0
//
// PromptCachePool's record of one stored entry, the single allocation that holds it together
// with the entry's snapshot, and the chain of removed records whose release is deferred.
//
// A record and its snapshot share one block with the snapshot's reference count, so a hit
// (which touches the record and copies the snapshot) reaches one block, not two. The record
// owns the block through its own `entry` (an aliasing shared_ptr); releasing the record ends
// that reference, and the block then lives exactly as long as the snapshots handed out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

namespace promptcache::detail {

template <class Token, class Slot>
struct PoolNode;

/// The pool's record of one stored entry. What a hit reads and writes (entry, recency links,
/// touch order, TTL class, pinned) fills the first cache line; the rest is for inserts.
template <class Entry, class Token, class TimePoint>
struct PoolSlot {
  using entry_type = Entry;
  using time_point = TimePoint;

  std::shared_ptr<const Entry> entry;
  PoolSlot* prev = nullptr;  // recency list of its TTL class (unpinned entries only)
  PoolSlot* next = nullptr;  // ... and the retired chain once removed
  PoolNode<Token, PoolSlot>* node = nullptr;
  std::uint64_t seq = 0;  // global touch order: a larger seq is more recent
  TimePoint last_used{};
  std::uint32_t ttl_class = 0;  // index of its TTL class (at most one class per stored entry)
  bool pinned = false;
  std::size_t len = 0;  // entry->ids.size(), kept here to spare a dereference
  std::size_t bytes = 0;
  std::uint64_t ns = 0;
};

/// Ends the record's own reference to its block (which may free the record itself).
template <class Slot>
struct PoolSlotRelease {
  void operator()(Slot* s) const noexcept {
    // Moved out first: the last reference frees the block that holds *s.
    std::shared_ptr<const typename Slot::entry_type> last = std::move(s->entry);
  }
};

template <class Slot>
using PoolSlotPtr = std::unique_ptr<Slot, PoolSlotRelease<Slot>>;

/// The block a record shares with its snapshot.
template <class Slot>
struct PoolRecord {
  Slot slot;
  typename Slot::entry_type entry;
};

/// Allocates a record and its entry in one block; `fill(entry)` sets the entry's fields.
/// Throws what the allocation or `fill` throws (nothing is left behind).
template <class Slot, class Fill>
PoolSlotPtr<Slot> make_pool_record(Fill&& fill) {
  auto block = std::make_shared<PoolRecord<Slot>>();
  typename Slot::entry_type* e = &block->entry;
  fill(*e);
  Slot* s = &block->slot;
  s->entry = std::shared_ptr<const typename Slot::entry_type>(std::move(block), e);
  return PoolSlotPtr<Slot>(s);
}

/// Removed records, threaded through their `next` links, released later: the pool frees them
/// at the end of each operation, and SynchronizedPromptCachePool takes the chain and frees it
/// after unlocking (so LayerCache destructors never run under its lock).
template <class Slot>
class PoolRetiredChain {
 public:
  PoolRetiredChain() noexcept = default;
  PoolRetiredChain(const PoolRetiredChain&) = delete;
  PoolRetiredChain& operator=(const PoolRetiredChain&) = delete;
  ~PoolRetiredChain() { release(take()); }

  /// Adds a removed record. O(1).
  void push(PoolSlotPtr<Slot> s) noexcept {
    Slot* raw = s.release();
    raw->prev = nullptr;
    raw->next = head_;
    head_ = raw;
  }

  /// Hands the chain over (for release after unlocking). O(1).
  Slot* take() noexcept { return std::exchange(head_, nullptr); }

  [[nodiscard]] bool empty() const noexcept { return head_ == nullptr; }

  /// Releases every record of `chain` (as returned by take()). O(records).
  static void release(Slot* chain) noexcept {
    while (chain != nullptr) {
      Slot* s = chain;
      chain = s->next;
      PoolSlotRelease<Slot>{}(s);
    }
  }

 private:
  Slot* head_ = nullptr;
};

}  // namespace promptcache::detail
