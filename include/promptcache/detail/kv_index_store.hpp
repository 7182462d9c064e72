// promptcache: detail/kv_index_store.hpp
// SPDX-License-Identifier: Apache-2.0
//
// Node and hold pools of kv_index.hpp. Both hand out 32-bit indices from a
// vector with a free list instead of pointers: freed slots are reused without
// calling the allocator, the structures are half the size of pointer-based
// ones, and nothing dangles when a vector grows.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "promptcache/detail/kv_index_holders.hpp"
#include "promptcache/detail/kv_index_table.hpp"

namespace promptcache::detail {

/// Tree nodes, stored as rows of four 64-bit words so that one node's hashes,
/// count and holder set share half a cache line (32 bytes, whatever the number
/// of worker slots):
///   [0] path hash (identifies the root-to-node path, keys the edge table)
///   [1] tokens hash of the node's block
///   [2] parent index (low 32 bits) | holder count (high 32 bits)
///   [3] holder word: the holder slots themselves, or where they are in the
///       holder-set arena (see KvHolderSets)
/// Node 0 is the root; it is never freed and its holder fields are unused.
/// While no other node exists there are no rows at all (the root's only field
/// in use, its path hash, is a constant), so an empty store owns no memory and
/// constructing or emptying one cannot throw.
/// A freed node has count 0 and keeps the next free index in its parent field.
class KvNodeStore {
 public:
  /// Path hash of the root (any constant; the paths below it derive from it).
  static constexpr std::uint64_t root_path_hash = 0x6a09e667f3bcc908ULL;

  /// Just the root. O(1), no allocation.
  KvNodeStore() noexcept = default;

  /// Path hash of `child_tokens` below a node with path hash `parent_path`.
  /// For a fixed parent this is a bijection of the tokens hash, so two children
  /// of one node never share a path hash.
  [[nodiscard]] static constexpr std::uint64_t child_path(std::uint64_t parent_path,
                                                          std::uint64_t child_tokens) noexcept {
    return kv_mix64(parent_path ^ child_tokens);
  }

  /// Path hash of node `n` (its key in the edge table). O(1).
  [[nodiscard]] std::uint64_t path_hash(std::uint32_t n) const noexcept {
    return n == 0U ? root_path_hash : row(n)[0];
  }
  /// Tokens hash of node `n`'s block. O(1).
  [[nodiscard]] std::uint64_t tokens_hash(std::uint32_t n) const noexcept { return row(n)[1]; }
  /// Parent of node `n` (next free node for a freed one). O(1).
  [[nodiscard]] std::uint32_t parent(std::uint32_t n) const noexcept {
    return static_cast<std::uint32_t>(row(n)[2] & 0xffffffffULL);
  }
  /// Number of slots holding node `n`; 0 for a free node. O(1).
  [[nodiscard]] std::uint32_t count(std::uint32_t n) const noexcept {
    return static_cast<std::uint32_t>(row(n)[2] >> 32U);
  }
  /// Fills `v` with the holders of node `n` (ascending slots); invalidated by
  /// any change to a holder set. O(1).
  void holders(std::uint32_t n, KvHolderSets::View& v) const noexcept {
    holders_.view(row(n)[3], count(n), v);
  }

  /// True when `slot` holds node `n`. O(log holders).
  [[nodiscard]] bool test(std::uint32_t n, std::uint32_t slot) const noexcept {
    return holders_.contains(row(n)[3], count(n), slot);
  }
  /// Marks `slot` (below the width set by ensure_slots) as a holder of `n`; it
  /// must not be one. Cannot throw after reserve_holders. O(holders).
  void set(std::uint32_t n, std::uint32_t slot) {
    std::uint64_t* r = row(n);
    holders_.insert(r[3], static_cast<std::uint32_t>(r[2] >> 32U), slot);
    r[2] += std::uint64_t{1} << 32U;
  }
  /// Removes holder `slot` of `n` (it must be one); returns the new count.
  /// Never allocates. O(holders).
  std::uint32_t reset_bit(std::uint32_t n, std::uint32_t slot, bool shrink = true) noexcept {
    std::uint64_t* r = row(n);
    holders_.erase(r[3], static_cast<std::uint32_t>(r[2] >> 32U), slot, shrink);
    r[2] -= std::uint64_t{1} << 32U;
    return static_cast<std::uint32_t>(r[2] >> 32U);
  }

  /// Hints the CPU to load node `n`'s row. O(1).
  void prefetch(std::uint32_t n) const noexcept {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(row(n));
#else
    (void)n;
#endif
  }

  /// Makes room for `extra` more nodes without reallocating during the next
  /// `extra` allocate() calls, which then cannot throw. Strong guarantee;
  /// std::length_error when the indices would not fit in 32 bits.
  void reserve_extra(std::size_t extra) {
    if (extra <= free_count_) return;
    // The first node also brings the root's row.
    const std::size_t have = std::max<std::size_t>(rows(), 1U);
    if (extra - free_count_ > max_rows - have) throw std::length_error("kv index: too many nodes");
    const std::size_t need = (have + extra - free_count_) * stride;
    if (need > words_.capacity()) words_.reserve(std::max(need, words_.capacity() * 2U));
  }

  /// Makes the next `extra` set() calls allocation-free. Strong guarantee.
  void reserve_holders(std::size_t extra) {
    holders_.reserve(extra);
  }

  /// A new node (holder count 0, no holders). Call reserve_extra first to make
  /// it noexcept.
  std::uint32_t allocate(std::uint64_t path, std::uint64_t tokens, std::uint32_t parent_node) {
    std::uint32_t n;
    if (free_head_ != kv_npos) {
      n = free_head_;
      free_head_ = parent(n);
      --free_count_;
      // The next allocation reads that row (free rows are usually cold).
      if (free_head_ != kv_npos) prefetch(free_head_);
    } else {
      n = append_row();
    }
    std::uint64_t* r = row(n);
    r[0] = path;
    r[1] = tokens;
    r[2] = parent_node;
    r[3] = KvHolderSets::empty_word;
    ++live_;
    return n;
  }

  /// Returns node `n` (holder count 0) to the free list. When no node is left
  /// the storage itself is released, so an emptied index gives memory back,
  /// unless `shrink` is false (then earlier reserve_extra guarantees hold).
  void release(std::uint32_t n, bool shrink = true) noexcept {
    row(n)[2] = free_head_;
    free_head_ = n;
    ++free_count_;
    --live_;
    if (shrink) shrink_if_empty();
  }

  /// Releases the storage when no node but the root is live. O(1).
  void shrink_if_empty() noexcept {
    holders_.release_if_empty();
    if (live_ != 0U) return;
    std::vector<std::uint64_t>().swap(words_);
    free_head_ = kv_npos;
    free_count_ = 0;
  }

  /// Widens the holder bitsets so that slot indices below `slots` fit.
  /// O(nodes) when it grows (at 128, 256, 512, ... slots); strong guarantee.
  void ensure_slots(std::size_t slots) {
    if (KvHolderSets::bitset_class_for(slots) > holders_.bitset_class()) fit_slots(slots);
  }

  /// Sets the bitset width to what slot indices below `slots` need, growing
  /// or shrinking; no node may hold a slot beyond the new width. O(nodes)
  /// when the width changes; strong guarantee.
  void fit_slots(std::size_t slots) {
    const std::size_t k = KvHolderSets::bitset_class_for(slots);
    if (k == holders_.bitset_class()) return;
    std::size_t bitsets = 0;
    for (std::size_t n = 1; n < rows(); ++n)
      if (KvHolderSets::is_bitset_set(words_[n * stride + 3U],
                                      count(static_cast<std::uint32_t>(n))))
        ++bitsets;
    holders_.reserve_rewidth(bitsets, k);
    for (std::size_t n = 1; n < rows(); ++n)
      holders_.rewidth(words_[n * stride + 3U], count(static_cast<std::uint32_t>(n)), k);
    holders_.end_rewidth(k);
  }

  /// Replaces holder `from` of `n` with `to` (not a holder, below the width);
  /// the count is unchanged. Never allocates.
  void move_bit(std::uint32_t n, std::uint32_t from, std::uint32_t to) noexcept {
    holders_.replace(row(n)[3], count(n), from, to);
  }

  /// Live nodes, the root excluded. O(1).
  [[nodiscard]] std::size_t live() const noexcept {
    return live_;
  }
  /// Rows allocated (live + free + root). O(1).
  [[nodiscard]] std::size_t rows() const noexcept {
    return words_.size() / stride;
  }
  /// Bytes held, holder sets included. O(1).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return words_.capacity() * 8U + holders_.memory_bytes();
  }
  /// Bytes held by spilled holder sets. O(1).
  [[nodiscard]] std::size_t holder_memory_bytes() const noexcept {
    return holders_.memory_bytes();
  }
  /// True when `n` is a live non-root node (for invariant checks). O(1).
  [[nodiscard]] bool is_live(std::uint32_t n) const noexcept {
    return n != 0U && n < rows() && count(n) != 0U;
  }

 private:
  static constexpr std::size_t stride = 4;
  static constexpr std::size_t max_rows = kv_npos - 1U;  // indices below kv_npos - 1

  // allocate()'s slow path, kept out of line so the free-list path inlines.
  std::uint32_t append_row() {
    if (rows() >= max_rows) throw std::length_error("kv index: too many nodes");
    if (words_.empty()) {  // the root's row first; its parent is "none"
      words_.assign(stride, 0U);
      words_[0] = root_path_hash;
      words_[2] = kv_npos;
      words_[3] = KvHolderSets::empty_word;
    }
    const auto n = static_cast<std::uint32_t>(rows());
    words_.resize(words_.size() + stride, 0U);
    return n;
  }

  [[nodiscard]] const std::uint64_t* row(std::uint32_t n) const noexcept {
    return words_.data() + static_cast<std::size_t>(n) * stride;
  }
  [[nodiscard]] std::uint64_t* row(std::uint32_t n) noexcept {
    return words_.data() + static_cast<std::size_t>(n) * stride;
  }

  std::vector<std::uint64_t> words_;
  KvHolderSets holders_;
  std::uint32_t free_head_ = kv_npos;
  std::size_t free_count_ = 0;
  std::size_t live_ = 0;
};

/// One worker slot's hold on one node, named by the worker's block hash. The
/// holds of a slot form a tree mirroring the part of the node tree it holds
/// (rooted at a per-slot sentinel hold on node 0), so removing a block visits
/// only that worker's descendants, not every child of a shared node.
struct KvHold {
  std::uint64_t block_hash = 0;         ///< the worker's name for the block
  std::uint32_t node = 0;               ///< the tree node held
  std::uint32_t slot = 0;               ///< the worker slot holding it; kv_npos when freed
  std::uint32_t parent = kv_npos;       ///< the slot's hold on the parent node
  std::uint32_t first_child = kv_npos;  ///< first hold of the slot on a child node
  std::uint32_t next = kv_npos;         ///< next sibling; next free hold when freed
  std::uint32_t prev = kv_npos;         ///< previous sibling
};

/// Pool of holds with a free list and intrusive sibling lists.
class KvHoldStore {
 public:
  /// Hold `h`; the reference is invalidated by allocate() and release(). O(1).
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

  /// Makes the next `extra` allocate() calls non-allocating (so they cannot
  /// throw). Strong guarantee; std::length_error when the indices would not
  /// fit in 32 bits.
  void reserve_extra(std::size_t extra) {
    if (extra <= free_count_) return;
    if (extra - free_count_ > max_holds - holds_.size())
      throw std::length_error("kv index: too many blocks");
    const std::size_t need = holds_.size() + extra - free_count_;
    if (need > holds_.capacity()) holds_.reserve(std::max(need, holds_.capacity() * 2U));
  }

  /// A new hold linked as the first child of `parent` (kv_npos: a sentinel).
  /// Always inlined: it runs once per stored block (other compilers ignore
  /// the gnu:: attribute).
  [[gnu::always_inline]] std::uint32_t allocate(std::uint64_t block_hash, std::uint32_t node,
                                                std::uint32_t slot, std::uint32_t parent) {
    std::uint32_t h;
    if (free_head_ != kv_npos) {
      h = free_head_;
      free_head_ = holds_[h].next;
      --free_count_;
      if (free_head_ != kv_npos) prefetch(free_head_);  // the next allocation reads it
    } else {
      h = append();
    }
    KvHold& x = holds_[h];
    x = KvHold{block_hash, node, slot, parent, kv_npos, kv_npos, kv_npos};
    if (parent != kv_npos) {
      KvHold& p = holds_[parent];
      x.next = p.first_child;
      if (x.next != kv_npos) holds_[x.next].prev = h;
      p.first_child = h;
    }
    ++live_;
    return h;
  }

  /// Unlinks hold `h` (which must have no children) and frees it.
  void release(std::uint32_t h) noexcept {
    KvHold& x = holds_[h];
    if (x.parent != kv_npos) {
      if (x.prev == kv_npos)
        holds_[x.parent].first_child = x.next;
      else
        holds_[x.prev].next = x.next;
      if (x.next != kv_npos) holds_[x.next].prev = x.prev;
    }
    x.next = free_head_;
    x.slot = kv_npos;  // marks it free (see is_free)
    x.parent = kv_npos;
    x.first_child = kv_npos;
    free_head_ = h;
    ++free_count_;
    --live_;
    if (live_ == 0U) {
      std::vector<KvHold>().swap(holds_);
      free_head_ = kv_npos;
      free_count_ = 0;
    }
  }

  /// True when hold `h` (an index below the pool size) was released and not
  /// reused since. O(1).
  [[nodiscard]] bool is_free(std::uint32_t h) const noexcept {
    return holds_[h].slot == kv_npos;
  }

  /// Holds in use (sentinels included). O(1).
  [[nodiscard]] std::size_t live() const noexcept {
    return live_;
  }
  /// Bytes held. O(1).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return holds_.capacity() * sizeof(KvHold);
  }

 private:
  static constexpr std::size_t max_holds = kv_npos - 1U;  // indices below kv_npos - 1

  // allocate()'s slow path, kept out of line so the free-list path inlines.
  std::uint32_t append() {
    if (holds_.size() >= max_holds) throw std::length_error("kv index: too many blocks");
    const auto h = static_cast<std::uint32_t>(holds_.size());
    holds_.emplace_back();
    return h;
  }

  std::vector<KvHold> holds_;
  std::uint32_t free_head_ = kv_npos;
  std::size_t free_count_ = 0;
  std::size_t live_ = 0;
};

}  // namespace promptcache::detail
