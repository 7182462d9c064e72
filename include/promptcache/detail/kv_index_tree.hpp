// promptcache: detail/kv_index_tree.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The radix tree of kv_index.hpp: nodes (one per distinct block position,
// shared by every worker holding it) and the edge table that finds a node's
// child by the child's path hash. Nodes live in a pool that hands out 32-bit
// indices from a vector with a free list instead of pointers: freed slots are
// reused without calling the allocator, rows are half the size of pointers
// plus headers, and nothing dangles when the vector grows.
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
    // allocate() writes the row; push_back is cheaper than resize's fill.
    for (std::size_t w = 0; w < stride; ++w)
      words_.push_back(0U);
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

/// The tree: the node pool and the edge table (path hash, parent) -> child.
/// A child's key is its path hash, a hash of the tokens hashes on the path
/// from the root, so a walk computes every key of a query up front and
/// prefetches the edge slots before it needs them.
class KvTree {
 public:
  /// Path hash of the root.
  static constexpr std::uint64_t root_path_hash = KvNodeStore::root_path_hash;

  /// Path hash of `child_tokens` below a node with path hash `parent_path`. O(1).
  [[nodiscard]] static constexpr std::uint64_t child_path(std::uint64_t parent_path,
                                                          std::uint64_t child_tokens) noexcept {
    return KvNodeStore::child_path(parent_path, child_tokens);
  }

  /// The nodes (rows, holder sets). O(1).
  [[nodiscard]] const KvNodeStore& nodes() const noexcept { return nodes_; }
  /// The nodes, for changing holder sets. O(1).
  [[nodiscard]] KvNodeStore& nodes() noexcept { return nodes_; }

  /// The child of `parent` with path hash `path`, or kv_npos. O(1) expected.
  [[nodiscard]] std::uint32_t find_child(std::uint64_t path, std::uint32_t parent) const noexcept {
    return edges_.find(path, parent);
  }
  /// Hints the CPU to load the edge slot of `path`. O(1).
  void prefetch_edge(std::uint64_t path) const noexcept { edges_.prefetch(path, 0); }

  /// Makes the next `blocks` add_child() and holder additions allocation-free
  /// (so they cannot throw). Strong guarantee.
  void reserve(std::size_t blocks) {
    nodes_.reserve_extra(blocks);
    nodes_.reserve_holders(blocks);
    edges_.reserve_extra(blocks);
  }

  /// A new child of `parent` (no holders) with path hash `path` (absent) and
  /// tokens hash `tokens`. Cannot throw after reserve().
  std::uint32_t add_child(std::uint64_t path, std::uint64_t tokens, std::uint32_t parent) {
    const std::uint32_t child = nodes_.allocate(path, tokens, parent);
    edges_.insert(path, parent, child);
    return child;
  }

  /// Frees node `n` (no holders). With `shrink` false the pools and the edge
  /// table keep their capacity (earlier reservations hold).
  void remove_node(std::uint32_t n, bool shrink = true) noexcept {
    edges_.erase(nodes_.path_hash(n), nodes_.parent(n), shrink);
    nodes_.release(n, shrink);
  }

  /// Gives back what removals with `shrink` false kept. O(edge capacity).
  void shrink_to_fit_live() noexcept {
    nodes_.shrink_if_empty();
    edges_.shrink_to_load();
  }

  /// Checks the tree's own invariants: every live node is found by its edge,
  /// its path hash follows from its parent's and its tokens hash, and the edge
  /// table holds the live nodes only. O(nodes).
  [[nodiscard]] bool check() const {
    std::size_t live = 0;
    for (std::uint32_t n = 1; n < nodes_.rows(); ++n) {
      if (nodes_.count(n) == 0U) continue;
      ++live;
      if (edges_.find(nodes_.path_hash(n), nodes_.parent(n)) != n) return false;
      if (nodes_.path_hash(n) !=
          child_path(nodes_.path_hash(nodes_.parent(n)), nodes_.tokens_hash(n)))
        return false;
    }
    return live == nodes_.live() && edges_.size() == live;
  }

  /// Bytes held. O(1).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return nodes_.memory_bytes() + edges_.memory_bytes();
  }

  /// Exchanges the contents with `other`. O(1).
  void swap(KvTree& other) noexcept {
    using std::swap;
    swap(nodes_, other.nodes_);
    swap(edges_, other.edges_);
  }

 private:
  struct EdgeHash {
    static constexpr std::uint64_t hash(std::uint64_t path, std::uint32_t) noexcept { return path; }
  };

  KvNodeStore nodes_;
  KvPackedTable<EdgeHash> edges_;
};

}  // namespace promptcache::detail
