// promptcache: detail/kv_index_holds.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The holds of kv_index.hpp: one per (worker slot, node) pair, named by the
// worker's block hash. A slot's holds form a tree of their own that mirrors
// the part of the node tree the slot holds, so the work of a removal or a
// clear is proportional to that worker's blocks, not to every block below a
// shared node. Held in an index-addressed pool with a free list.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "promptcache/detail/kv_index_pages.hpp"
#include "promptcache/detail/kv_index_table.hpp"

namespace promptcache::detail {

/// Marks a hold's `link` as naming its parent (it is the first child) rather
/// than its previous sibling.
inline constexpr std::uint32_t kv_hold_parent_bit = std::uint32_t{1} << 31U;

/// One worker slot's hold on one node, named by the worker's block hash. The
/// holds of a slot form a tree mirroring the part of the node tree it holds
/// (rooted at a per-slot sentinel hold on node 0), so removing a block visits
/// only that worker's descendants, not every child of a shared node. 24 bytes:
/// the slot is not stored (every caller knows it), and the parent is stored
/// only in the first child of each sibling list (`link`), which is the child
/// that leaf-first removals and new chains use.
struct KvHold {
  std::uint64_t block_hash = 0;         ///< the worker's name for the block
  std::uint32_t node = 0;               ///< the tree node held; kv_npos when freed
  std::uint32_t first_child = kv_npos;  ///< first hold of the slot on a child node
  std::uint32_t next = kv_npos;         ///< next sibling; next free hold when freed
  std::uint32_t link = kv_npos;         ///< previous sibling, or parent | kv_hold_parent_bit
                                        ///< for a first child; kv_npos for a sentinel
};

/// Pool of holds (in pages, so no per-hold headroom) with a free list and
/// intrusive sibling lists. At most 2^31 - 1 holds, sentinels included (the
/// link's top bit is a flag).
class KvHoldStore {
 public:
  /// Hold `h`; the reference is invalidated by release() of the last hold. O(1).
  [[nodiscard]] KvHold& operator[](std::uint32_t h) noexcept { return holds_[h]; }
  /// Hold `h`. O(1).
  [[nodiscard]] const KvHold& operator[](std::uint32_t h) const noexcept { return holds_[h]; }

  /// Hints the CPU to load hold `h`. O(1).
  void prefetch(std::uint32_t h) const noexcept {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(&holds_[h]);
#else
    (void)h;
#endif
  }

  /// Hints the CPU to load element `x` (found with operator[]). O(1).
  static void prefetch(const KvHold& x) noexcept {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(&x);
#else
    (void)x;
#endif
  }

  /// The parent of hold `h` (kv_npos for a sentinel): O(1) for a first
  /// child, else O(earlier siblings), found through the first one.
  [[nodiscard]] std::uint32_t parent(std::uint32_t h) const noexcept {
    std::uint32_t l = holds_[h].link;
    while (l != kv_npos && (l & kv_hold_parent_bit) == 0U)
      l = holds_[l].link;
    return l == kv_npos ? kv_npos : l & ~kv_hold_parent_bit;
  }

  /// Makes the next `extra` allocate() calls non-allocating (so they cannot
  /// throw). Strong guarantee; std::length_error past 2^31 - 1 holds.
  void reserve_extra(std::size_t extra) {
    if (extra <= free_count_) return;
    if (extra - free_count_ > max_holds - holds_.size())
      throw std::length_error("kv index: too many blocks");
    holds_.reserve(holds_.size() + extra - free_count_);
  }

  /// True when reserve_extra(extra) would allocate nothing (and not throw).
  /// O(1).
  [[nodiscard]] bool fits_extra(std::size_t extra) const noexcept {
    if (extra <= free_count_) return true;
    return extra - free_count_ <= max_holds - holds_.size() &&
           extra - free_count_ <= holds_.capacity() - holds_.size();
  }

  /// A new hold and its element, as allocate_child() returns them.
  struct Placed {
    std::uint32_t index;  ///< the hold
    KvHold* hold;         ///< its element; valid until release() of the last hold
  };

  /// A new hold linked as the first child of `parent` (kv_npos: a sentinel).
  /// Always inlined: it runs once per stored block (other compilers ignore
  /// the gnu:: attribute).
  [[gnu::always_inline]] std::uint32_t allocate(std::uint64_t block_hash, std::uint32_t node,
                                                std::uint32_t parent) {
    if (parent == kv_npos) {
      const Placed x = take();
      *x.hold = KvHold{block_hash, node, kv_npos, kv_npos, kv_npos};
      return x.index;
    }
    return allocate_child(block_hash, node, parent, holds_[parent]).index;
  }

  /// allocate() under `parent` (not kv_npos) whose element `p` the caller
  /// already has, e.g. the previous hold of a chain being stored: each
  /// element found again costs a page-table step. Returns the new hold and
  /// its element. O(1); always inlined (once per stored block).
  [[gnu::always_inline]] Placed allocate_child(std::uint64_t block_hash, std::uint32_t node,
                                               std::uint32_t parent, KvHold& p) {
    const Placed x = take();
    *x.hold = KvHold{block_hash, node, kv_npos, p.first_child, parent | kv_hold_parent_bit};
    if (p.first_child != kv_npos) holds_[p.first_child].link = x.index;
    p.first_child = x.index;
    return x;
  }

  /// Unlinks hold `h` (which must have no children) and frees it. O(1).
  /// Always inlined: it runs once per removed block.
  [[gnu::always_inline]] void release(std::uint32_t h) noexcept {
    release(h, holds_[h]);
  }

  /// release() of hold `h` whose element `x` the caller already has (saves a
  /// page-table step). O(1); always inlined.
  [[gnu::always_inline]] void release(std::uint32_t h, KvHold& x) noexcept {
    if (x.link != kv_npos) {
      if ((x.link & kv_hold_parent_bit) != 0U)
        holds_[x.link & ~kv_hold_parent_bit].first_child = x.next;
      else
        holds_[x.link].next = x.next;
      if (x.next != kv_npos) holds_[x.next].link = x.link;  // takes over the parent or sibling
    }
    x.next = free_head_;
    x.node = kv_npos;  // marks it free (see is_free)
    x.link = kv_npos;
    x.first_child = kv_npos;
    free_head_ = h;
    ++free_count_;
    --live_;
    if (live_ == 0U) {
      holds_.clear();
      free_head_ = kv_npos;
      free_count_ = 0;
    }
  }

  /// True when hold `h` (an index below the pool size) was released and not
  /// reused since. O(1).
  [[nodiscard]] bool is_free(std::uint32_t h) const noexcept {
    return holds_[h].node == kv_npos;
  }

  /// is_free() of the hold whose element is `x`. O(1).
  [[nodiscard]] static bool is_free(const KvHold& x) noexcept {
    return x.node == kv_npos;
  }

  /// Checks the pool's bookkeeping: the free list holds free holds only,
  /// free_count of them, and every hold is live or free. O(pool size); for
  /// tests.
  [[nodiscard]] bool check_pool() const {
    std::size_t free = 0;
    for (std::uint32_t h = free_head_; h != kv_npos; h = holds_[h].next)
      if (h >= holds_.size() || !is_free(h) || ++free > free_count_) return false;
    return free == free_count_ && live_ + free_count_ == holds_.size();
  }

  /// Holds in use (sentinels included). O(1).
  [[nodiscard]] std::size_t live() const noexcept {
    return live_;
  }
  /// Bytes held. O(1).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return holds_.memory_bytes();
  }

 private:
  static constexpr std::size_t max_holds = kv_hold_parent_bit - 1U;  // indices below 2^31 - 1

  // A free hold (from the free list, else appended), counted live; the
  // caller writes its element.
  [[gnu::always_inline]] Placed take() {
    std::uint32_t h;
    if (free_head_ != kv_npos) {
      h = free_head_;
      KvHold& x = holds_[h];
      free_head_ = x.next;
      --free_count_;
      if (free_head_ != kv_npos) prefetch(free_head_);  // the next allocation reads it
      ++live_;
      return Placed{h, &x};
    }
    h = append();
    ++live_;
    return Placed{h, &holds_[h]};
  }

  // take()'s slow path, kept out of line so the free-list path inlines.
  std::uint32_t append() {
    if (holds_.size() >= max_holds) throw std::length_error("kv index: too many blocks");
    const auto h = static_cast<std::uint32_t>(holds_.size());
    holds_.push_back(KvHold{});
    return h;
  }

  KvPagedArray<KvHold> holds_;
  std::uint32_t free_head_ = kv_npos;
  std::size_t free_count_ = 0;
  std::size_t live_ = 0;
};

/// Releases hold `top` and all its descendants, leaves first, without
/// recursion (chains can be thousands of blocks long): release(h) is called on
/// each hold once it is childless and must free it (KvHoldStore::release).
/// Returns how many holds were released. O(descendants).
template <class Release>
std::size_t kv_drop_hold_subtree(const KvHoldStore& holds, std::uint32_t top, Release&& release) {
  std::size_t n = 0;
  std::uint32_t h = top;
  for (;;) {
    while (holds[h].first_child != kv_npos)
      h = holds[h].first_child;
    const bool last = h == top;
    // Below `top` every hold reached is a first child: its parent is O(1).
    const std::uint32_t up = last ? kv_npos : holds.parent(h);
    release(h, last);
    ++n;
    if (last) return n;
    h = up;
  }
}

/// Calls f(h) for every hold below `root` (not `root` itself), parents before
/// children, without a stack (parent links; climbing from a last sibling walks
/// back over its siblings once). O(descendants).
template <class F>
void kv_for_each_hold_below(const KvHoldStore& holds, std::uint32_t root, F&& f) {
  std::uint32_t h = holds[root].first_child;
  while (h != kv_npos) {
    f(h);
    if (holds[h].first_child != kv_npos) {
      h = holds[h].first_child;
      continue;
    }
    while (h != root && holds[h].next == kv_npos)
      h = holds.parent(h);
    h = h == root ? kv_npos : holds[h].next;
  }
}

/// Splits the holds below `root` into chains that follow first children:
/// calls start(h, parent) at the first hold h of each chain, then step(h) for
/// each hold of the chain, the first included.
/// Siblings start later chains. O(descendants), O(width) extra memory.
template <class Start, class Step>
void kv_for_each_hold_chain(const KvHoldStore& holds, std::uint32_t root, Start&& start,
                            Step&& step) {
  std::vector<std::pair<std::uint32_t, std::uint32_t>> starts;  // (hold, its parent)
  for (std::uint32_t c = holds[root].first_child; c != kv_npos; c = holds[c].next)
    starts.emplace_back(c, root);
  while (!starts.empty()) {
    std::uint32_t h = starts.back().first;
    start(h, starts.back().second);
    starts.pop_back();
    while (h != kv_npos) {
      step(h);
      const std::uint32_t first = holds[h].first_child;
      if (first != kv_npos)
        for (std::uint32_t c = holds[first].next; c != kv_npos; c = holds[c].next)
          starts.emplace_back(c, h);
      h = first;
    }
  }
}

}  // namespace promptcache::detail
