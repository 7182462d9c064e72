// promptcache: detail/kv_index_tree.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The radix tree of kv_index.hpp: nodes (one per distinct block position,
// shared by every worker holding it) and the edge table that finds a node's
// child by the child's path hash. Nodes live in a pool that hands out 32-bit
// indices from a vector with a free list instead of pointers: freed slots are
// reused without calling the allocator, rows are half the size of pointers
// plus headers, and nothing dangles when the pool grows.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "promptcache/detail/kv_index_fingerprints.hpp"
#include "promptcache/detail/kv_index_holders.hpp"
#include "promptcache/detail/kv_index_pages.hpp"
#include "promptcache/detail/kv_index_table.hpp"

namespace promptcache::detail {

/// The odd multiplier of kv_path_mix.
inline constexpr std::uint64_t kv_path_multiplier = 0xd6e8feb86659fd93ULL;

/// The mix behind path hashes: one odd multiply, a bijection of 64-bit
/// values. A child's path hash is kv_path_mix(rotl(parent's, 32) ^ tokens
/// hash) (see KvNodeStore::child_path), so a query's path hashes form a
/// dependency chain of a rotate, an xor and a multiply per block (5 cycles,
/// where xor-shift, multiply, xor-shift took 8). The rotation feeds the
/// parent's high half, which every input bit of its own multiply reached,
/// into the low bits of the next product, whose high half (the edge table's
/// fingerprint) every one of them reaches in turn.
[[nodiscard]] constexpr std::uint64_t kv_path_mix(std::uint64_t k) noexcept {
  return k * kv_path_multiplier;
}

/// Inverse of kv_path_mix (the multiplier is odd, so it has an inverse
/// modulo 2^64).
[[nodiscard]] constexpr std::uint64_t kv_path_unmix(std::uint64_t k) noexcept {
  // Newton's iteration for the inverse of an odd number modulo 2^64: each
  // step doubles the number of correct low bits (3 -> 96).
  constexpr auto inverse = [](std::uint64_t a) {
    std::uint64_t x = a;
    for (int i = 0; i < 5; ++i)
      x *= 2U - a * x;
    return x;
  };
  return k * inverse(kv_path_multiplier);
}

/// Tree nodes, stored as 24-byte rows in pages:
///   path     path hash (identifies the root-to-node path; the edge table
///            keeps only a fingerprint of it and confirms here)
///   links    parent index (low 32 bits) | holder count (high 32 bits)
///   holders  the holder slots themselves, or where they are in the
///            holder-set arena (see KvHolderSets)
/// The block's tokens hash is not stored: the path hash is a bijection of it
/// for a fixed parent, so it is recovered from the two path hashes.
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
    return kv_path_mix(std::rotl(parent_path, 32) ^ child_tokens);
  }

  /// Path hash of node `n` (its key in the edge table). O(1).
  [[nodiscard]] std::uint64_t path_hash(std::uint32_t n) const noexcept {
    return n == 0U ? root_path_hash : rows_[n].path;
  }
  /// Tokens hash of node `n`'s block (n != 0), recovered from its path hash
  /// and its parent's. O(1).
  [[nodiscard]] std::uint64_t tokens_hash(std::uint32_t n) const noexcept {
    return kv_path_unmix(rows_[n].path) ^ std::rotl(path_hash(parent(n)), 32);
  }
  /// Parent of node `n` (next free node for a freed one). O(1).
  [[nodiscard]] std::uint32_t parent(std::uint32_t n) const noexcept {
    return static_cast<std::uint32_t>(rows_[n].links & 0xffffffffULL);
  }
  /// Number of slots holding node `n`; 0 for a free node. O(1).
  [[nodiscard]] std::uint32_t count(std::uint32_t n) const noexcept {
    return static_cast<std::uint32_t>(rows_[n].links >> 32U);
  }
  /// True when `n` is the child of `parent_node` with path hash `path`. O(1).
  [[nodiscard]] bool is_child(std::uint32_t n, std::uint64_t path,
                              std::uint32_t parent_node) const noexcept {
    const Row& r = rows_[n];
    return r.path == path && static_cast<std::uint32_t>(r.links & 0xffffffffULL) == parent_node;
  }
  /// The holder count of `n` when it is the child of `parent_node` with path
  /// hash `path`, else 0 (a live node has at least one holder). Reads the row
  /// once, for walks that need both. O(1).
  [[nodiscard]] std::uint32_t child_count(std::uint32_t n, std::uint64_t path,
                                          std::uint32_t parent_node) const noexcept {
    return row_child_count(rows_[n], path, parent_node);
  }
  /// From level `j` on, while row at + 1 is the live child of row `at` with
  /// path hash paths[j], records it in found[j] (and, with `Counted`, its
  /// holder count in counts[j]) and steps to it; returns the first level
  /// where that guess fails (or `m`), with `at` the last node reached.
  /// Consecutive rows of a page are read through one pointer instead of an
  /// index each, and each run of them is cut to the levels left, so a level
  /// costs one bound test. O(levels followed).
  template <bool Counted>
  std::size_t follow_rows(const std::uint64_t* paths, std::size_t j, std::size_t m,
                          std::uint32_t& at, std::uint32_t* found,
                          std::uint32_t* counts) const noexcept {
    constexpr std::size_t page = decltype(rows_)::page_size;
    const std::size_t n_rows = rows();
    std::size_t g = std::size_t{at} + 1U;  // the row guessed for level j
    while (j < m && g < n_rows) {
      const Row* r = &rows_[g];
      const std::size_t run = std::min({page - (g & (page - 1U)), n_rows - g, m - j});
      for (const Row* const end = r + run; r != end; ++r, ++g, ++j) {
        // A free row has count 0, whatever its path field holds.
        const std::uint32_t k = row_child_count(*r, paths[j], static_cast<std::uint32_t>(g - 1U));
        if (k == 0U) {
          at = static_cast<std::uint32_t>(g - 1U);
          return j;
        }
        found[j] = static_cast<std::uint32_t>(g);
        if constexpr (Counted) counts[j] = k;
      }
    }
    at = static_cast<std::uint32_t>(g - 1U);
    return j;
  }

  /// Fills `v` with the holders of node `n` (ascending slots); invalidated by
  /// any change to a holder set. O(1).
  void holders(std::uint32_t n, KvHolderSets::View& v) const noexcept {
    holders_.view(rows_[n].holders, count(n), v);
  }

  /// True when `slot` holds node `n`. O(log holders).
  [[nodiscard]] bool test(std::uint32_t n, std::uint32_t slot) const noexcept {
    return holders_.contains(rows_[n].holders, count(n), slot);
  }
  /// Marks `slot` (below the width set by ensure_slots) as a holder of `n`; it
  /// must not be one. Cannot throw after reserve_holders. O(holders).
  void set(std::uint32_t n, std::uint32_t slot) {
    Row& r = rows_[n];
    holders_.insert(r.holders, static_cast<std::uint32_t>(r.links >> 32U), slot);
    r.links += std::uint64_t{1} << 32U;
  }
  /// set() unless `slot` already holds `n` (then false and nothing changes):
  /// test() and set() on one row lookup. Cannot throw after reserve_holders.
  /// O(holders).
  bool add_holder(std::uint32_t n, std::uint32_t slot) {
    Row& r = rows_[n];
    const auto count = static_cast<std::uint32_t>(r.links >> 32U);
    if (holders_.contains(r.holders, count, slot)) return false;
    holders_.insert(r.holders, count, slot);
    r.links += std::uint64_t{1} << 32U;
    return true;
  }
  /// Removes holder `slot` of `n` (it must be one); returns the new count.
  /// Never allocates. O(holders).
  std::uint32_t reset_bit(std::uint32_t n, std::uint32_t slot, bool shrink = true) noexcept {
    Row& r = rows_[n];
    holders_.erase(r.holders, static_cast<std::uint32_t>(r.links >> 32U), slot, shrink);
    r.links -= std::uint64_t{1} << 32U;
    return static_cast<std::uint32_t>(r.links >> 32U);
  }

  /// Hints the CPU to load node `n`'s row. O(1). Always inlined: GCC 12 at -O2
  /// emitted neither of its prefetches where a caller's loop called it out of
  /// line (nor in a function calling only it).
  [[gnu::always_inline]] void prefetch(std::uint32_t n) const noexcept {
#if defined(__GNUC__) || defined(__clang__)
    // A 24-byte row may straddle two cache lines.
    const auto* p = reinterpret_cast<const char*>(&rows_[n]);
    __builtin_prefetch(p);
    __builtin_prefetch(p + sizeof(Row) - 1U);
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
    rows_.reserve(have + extra - free_count_);
  }

  /// True when reserve_extra(extra) would allocate nothing (and not throw).
  /// O(1).
  [[nodiscard]] bool fits_extra(std::size_t extra) const noexcept {
    if (extra <= free_count_) return true;
    const std::size_t have = std::max<std::size_t>(rows(), 1U);
    return extra - free_count_ <= max_rows - have && have + extra - free_count_ <= rows_.capacity();
  }

  /// Makes the next `extra` set() calls allocation-free. Strong guarantee.
  void reserve_holders(std::size_t extra) {
    holders_.reserve(extra);
  }
  /// True when reserve_holders(extra) would allocate nothing. O(1).
  [[nodiscard]] bool fits_holders(std::size_t extra) const noexcept {
    return holders_.fits(extra);
  }
  /// Makes set() calls allocation-free whose holder_insert_units() add up to
  /// `units`. Strong guarantee.
  void reserve_holder_units(std::size_t units) {
    holders_.reserve_room(units);
  }
  /// Holder-set room a set() on a node with `count` holders may take. O(log
  /// count).
  [[nodiscard]] std::size_t holder_insert_units(std::uint32_t count) const noexcept {
    return holders_.insert_units(count);
  }

  /// A new node (holder count 0, no holders). Call reserve_extra first to make
  /// it noexcept.
  std::uint32_t allocate(std::uint64_t path, std::uint32_t parent_node) {
    const auto [n, r] = take_row();
    *r = Row{path, parent_node, KvHolderSets::empty_word};
    return n;
  }

  /// allocate() with `slot` as its one holder: set() on the row just written,
  /// without finding it again. Call reserve_extra and reserve_holders first
  /// to make it noexcept.
  std::uint32_t allocate_held(std::uint64_t path, std::uint32_t parent_node, std::uint32_t slot) {
    const auto [n, r] = take_row();
    *r = Row{path, parent_node | (std::uint64_t{1} << 32U), KvHolderSets::empty_word};
    holders_.insert(r->holders, 0, slot);
    return n;
  }

  /// Returns node `n` (holder count 0) to the free list. When no node is left
  /// the storage itself is released, so an emptied index gives memory back,
  /// unless `shrink` is false (then earlier reserve_extra guarantees hold).
  void release(std::uint32_t n, bool shrink = true) noexcept {
    rows_[n].links = free_head_;
    free_head_ = n;
    ++free_count_;
    --live_;
    if (shrink) shrink_if_empty();
  }

  /// Releases the storage when no node but the root is live. O(1).
  void shrink_if_empty() noexcept {
    // The word form has no arena (spilled sets exist only past 64 slots), so
    // the call, which every node release makes, is skipped there.
    if (!holders_.word_form()) holders_.release_if_empty();
    if (live_ != 0U) return;
    rows_.clear();
    free_head_ = kv_npos;
    free_count_ = 0;
  }

  /// Widens the holder sets so that slot indices below `slots` fit: past 64
  /// slots every set leaves the word form, past 128, 256, ... the bitsets
  /// widen. O(nodes) when that happens; strong guarantee.
  void ensure_slots(std::size_t slots) {
    if (holders_.word_form()) {
      if (slots > KvHolderSets::word_slots) to_sparse(slots);
      return;
    }
    if (KvHolderSets::bitset_class_for(slots) > holders_.bitset_class()) fit_slots(slots);
  }

  /// Sets the holder sets' form and bitset width to what slot indices below
  /// `slots` need, growing or shrinking (up to 64 slots the word form); no
  /// node may hold a slot beyond the new width. O(nodes) when the form or the
  /// width changes; strong guarantee (going to the word form never
  /// allocates).
  void fit_slots(std::size_t slots) {
    if (slots <= KvHolderSets::word_slots) {
      if (!holders_.word_form()) to_word();
      return;
    }
    if (holders_.word_form()) {
      to_sparse(slots);
      return;
    }
    const std::size_t k = KvHolderSets::bitset_class_for(slots);
    if (k == holders_.bitset_class()) return;
    std::size_t bitsets = 0;
    for (std::size_t n = 1; n < rows(); ++n)
      if (KvHolderSets::is_bitset_set(rows_[n].holders, count(static_cast<std::uint32_t>(n))))
        ++bitsets;
    holders_.reserve_rewidth(bitsets, k);
    for (std::size_t n = 1; n < rows(); ++n)
      holders_.rewidth(rows_[n].holders, count(static_cast<std::uint32_t>(n)), k);
    holders_.end_rewidth(k);
  }

  /// True while every holder set is the 64-bit bitset in its row (all slots
  /// below 64). O(1).
  [[nodiscard]] bool word_form() const noexcept {
    return holders_.word_form();
  }
  /// The holder word of `n`: in the word form the bitset of its holders. O(1).
  [[nodiscard]] std::uint64_t holder_word(std::uint32_t n) const noexcept {
    return rows_[n].holders;
  }

  /// Replaces holder `from` of `n` with `to` (not a holder, below the width);
  /// the count is unchanged. Never allocates.
  void move_bit(std::uint32_t n, std::uint32_t from, std::uint32_t to) noexcept {
    holders_.replace(rows_[n].holders, count(n), from, to);
  }

  /// Live nodes, the root excluded. O(1).
  [[nodiscard]] std::size_t live() const noexcept {
    return live_;
  }
  /// Rows allocated (live + free + root). O(1).
  [[nodiscard]] std::size_t rows() const noexcept {
    return rows_.size();
  }
  /// Bytes held, holder sets included. O(1).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return rows_.memory_bytes() + holders_.memory_bytes();
  }
  /// Bytes held by spilled holder sets. O(1).
  [[nodiscard]] std::size_t holder_memory_bytes() const noexcept {
    return holders_.memory_bytes();
  }
  /// Checks the pool's bookkeeping: the free list holds free rows only,
  /// free_count of them, every row is the root, live or free, and the holder
  /// arena matches the rows' sets (KvHolderSets::check). O(rows + arena);
  /// for tests.
  [[nodiscard]] bool check_pool() const {
    std::size_t free = 0;
    for (std::uint32_t f = free_head_; f != kv_npos; f = parent(f))
      if (f == 0U || f >= rows() || count(f) != 0U || ++free > free_count_) return false;
    if (free != free_count_) return false;
    if (rows() == 0U ? live_ != 0U : live_ + free_count_ + 1U != rows()) return false;
    return holders_.check([&](const auto& f) {
      for (std::uint32_t n = 1; n < rows(); ++n)
        f(rows_[n].holders, count(n));
    });
  }

  /// True when `n` is a live non-root node (for invariant checks). O(1).
  [[nodiscard]] bool is_live(std::uint32_t n) const noexcept {
    return n != 0U && n < rows() && count(n) != 0U;
  }

 private:
  static constexpr std::size_t max_rows = kv_npos - 1U;  // indices below kv_npos - 1

  // Every set from the word form to the sparse form for slots below `slots`
  // (> 64). The arena the spilled sets need is reserved first, so a failure
  // leaves the word form. O(nodes).
  void to_sparse(std::size_t slots) {
    const std::size_t k = KvHolderSets::bitset_class_for(slots);
    std::size_t units = 0;
    for (std::size_t n = 1; n < rows(); ++n)
      units += KvHolderSets::sparse_units(count(static_cast<std::uint32_t>(n)), k);
    holders_.reserve_units(units);
    holders_.begin_sparse(k);
    for (std::size_t n = 1; n < rows(); ++n)
      holders_.to_sparse(rows_[n].holders, count(static_cast<std::uint32_t>(n)));
  }

  // Every set from the sparse form to the word form (no holder is 64 or more);
  // the arena is released. Never allocates. O(nodes).
  void to_word() noexcept {
    for (std::size_t n = 1; n < rows(); ++n)
      holders_.to_word(rows_[n].holders, count(static_cast<std::uint32_t>(n)));
    holders_.end_word_form();
  }

  // take_row()'s slow path, kept out of line so the free-list path inlines.
  std::uint32_t append_row() {
    if (rows() >= max_rows) throw std::length_error("kv index: too many nodes");
    if (rows_.empty())  // the root's row first; its parent is "none"
      rows_.push_back(Row{root_path_hash, kv_npos, KvHolderSets::empty_word});
    const auto n = static_cast<std::uint32_t>(rows());
    rows_.push_back(Row{});  // allocate() writes it
    return n;
  }

  struct Row {
    std::uint64_t path = 0;
    std::uint64_t links = 0;
    std::uint64_t holders = 0;
  };

  // A free row (from the free list, else appended), counted live, with its
  // element; the caller writes it.
  std::pair<std::uint32_t, Row*> take_row() {
    std::uint32_t n;
    Row* r;
    if (free_head_ != kv_npos) {
      n = free_head_;
      r = &rows_[n];
      free_head_ = static_cast<std::uint32_t>(r->links & 0xffffffffULL);
      --free_count_;
      // The next allocation reads that row (free rows are usually cold).
      if (free_head_ != kv_npos) prefetch(free_head_);
    } else {
      n = append_row();
      r = &rows_[n];
    }
    ++live_;
    return {n, r};
  }

  // The holder count of row `r` when it is the child of `parent_node` with
  // path hash `path`, else 0: one read of the row confirms and counts.
  [[nodiscard]] static std::uint32_t row_child_count(const Row& r, std::uint64_t path,
                                                     std::uint32_t parent_node) noexcept {
    const std::uint64_t links = r.links;
    if (r.path != path || static_cast<std::uint32_t>(links & 0xffffffffULL) != parent_node)
      return 0;
    return static_cast<std::uint32_t>(links >> 32U);
  }

  KvPagedArray<Row> rows_;
  KvHolderSets holders_;
  std::uint32_t free_head_ = kv_npos;
  std::size_t free_count_ = 0;
  std::size_t live_ = 0;
};

/// The tree: the node pool and the edge table (path hash, parent) -> child.
/// A child's key is its path hash, a hash of the tokens hashes on the path
/// from the root, so a walk computes every key of a query up front and
/// prefetches the edge slots before it needs them. The edge table keeps a
/// fingerprint of the path hash and the child's index; the child's row
/// confirms the full key.
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
    return edges_.find(KvFingerprintTable::fingerprint(path),
                       [&](std::uint32_t n) { return nodes_.is_child(n, path, parent); });
  }
  /// Hints the CPU to load the edge slot of `path`. O(1).
  void prefetch_edge(std::uint64_t path) const noexcept {
    edges_.prefetch(KvFingerprintTable::fingerprint(path));
  }
  /// prefetch_edge for many paths in one loop: call it with each path's
  /// fingerprint. Invalidated by any change to the tree. O(1).
  [[nodiscard]] KvFingerprintTable::Prefetcher edge_prefetcher() const noexcept {
    return edges_.prefetcher();
  }

  /// Follows `paths[0..m)` (consecutive path hashes) down from node `from`:
  /// sets found[j] to the node at depth j + 1 and, when `counts` is not null,
  /// counts[j] to its holder count; returns how many exist.
  /// The rows of a Stored chain are usually allocated in order, so row n + 1
  /// is tried first as the child of row n: if it is live, below n and has the
  /// path hash, it is the node the edge table would return (one node per
  /// (parent, path hash)) and the probe is skipped. After a miss, a few levels
  /// take their candidates from the fingerprints alone, prefetch those rows
  /// together and confirm each (a fingerprint that matched another node falls
  /// back to a full lookup). O(m) expected.
  std::size_t walk(const std::uint64_t* paths, std::size_t m, std::uint32_t from,
                   std::uint32_t* found, std::uint32_t* counts = nullptr) const noexcept {
    return counts != nullptr ? walk_rows<true>(paths, m, from, found, counts)
                             : walk_rows<false>(paths, m, from, found, nullptr);
  }
  /// walk(), writing `counts` when `Counted` (the query walk) and not
  /// testing for it per level. O(m) expected.
  template <bool Counted>
  std::size_t walk_rows(const std::uint64_t* paths, std::size_t m, std::uint32_t from,
                        std::uint32_t* found, std::uint32_t* counts) const noexcept {
    std::uint32_t at = from;
    std::size_t j = 0;
    while (j < m) {
      j = nodes_.follow_rows<Counted>(paths, j, m, at, found, counts);
      if (j == m) break;
      // A miss: probing the table level by level would wait for each row in
      // turn, so a few levels are probed at once and their rows load together.
      const std::size_t e = std::min(m, j + (Counted ? query_walk_batch : walk_batch));
      std::size_t c = j;
      for (; c < e; ++c) {
        const std::uint32_t n = edges_.first(KvFingerprintTable::fingerprint(paths[c]));
        if (n == kv_npos) break;
        found[c] = n;
        nodes_.prefetch(n);
      }
      for (; j < c; ++j) {
        std::uint32_t k = nodes_.child_count(found[j], paths[j], at);
        if (k == 0U) {
          found[j] = find_child(paths[j], at);
          if (found[j] == kv_npos) return j;
          k = nodes_.count(found[j]);
        }
        if constexpr (Counted) counts[j] = k;
        at = found[j];
      }
      if (c < e) return c;
    }
    return m;
  }

  /// Makes the next `blocks` add_child() and holder additions allocation-free
  /// (so they cannot throw). Strong guarantee.
  void reserve(std::size_t blocks) {
    nodes_.reserve_extra(blocks);
    nodes_.reserve_holders(blocks);
    edges_.reserve_extra(blocks);
  }
  /// True when reserve(blocks) would allocate nothing (and not throw). O(1).
  [[nodiscard]] bool fits(std::size_t blocks) const noexcept {
    return nodes_.fits_extra(blocks) && edges_.fits_extra(blocks) && nodes_.fits_holders(blocks);
  }
  /// Makes the next `nodes` add_child() calls, and holder additions to
  /// existing nodes whose holder_insert_units() add up to `holder_units`,
  /// allocation-free (a new node's first holder needs no room). Strong
  /// guarantee.
  void reserve_exact(std::size_t nodes, std::size_t holder_units) {
    nodes_.reserve_extra(nodes);
    nodes_.reserve_holder_units(holder_units);
    edges_.reserve_extra(nodes);
  }

  /// A new child of `parent` (no holders) with path hash `path` (absent).
  /// Requires room from reserve() (one node per call since); then it cannot
  /// throw.
  std::uint32_t add_child(std::uint64_t path, std::uint32_t parent) {
    const std::uint32_t child = nodes_.allocate(path, parent);
    edges_.insert_reserved(KvFingerprintTable::fingerprint(path), child);
    return child;
  }

  /// add_child() with `slot` as the new node's one holder (one row lookup
  /// instead of two). Requires room from reserve(); then it cannot throw.
  /// Always inlined: a store runs it once per new node.
  [[gnu::always_inline]] std::uint32_t add_held_child(std::uint64_t path, std::uint32_t parent,
                                                      std::uint32_t slot) {
    const std::uint32_t child = nodes_.allocate_held(path, parent, slot);
    edges_.insert_reserved(KvFingerprintTable::fingerprint(path), child);
    return child;
  }

  /// Frees node `n` (no holders). With `shrink` false the pools and the edge
  /// table keep their capacity (earlier reservations hold).
  void remove_node(std::uint32_t n, bool shrink = true) noexcept {
    // A live node is in the edge table, once: the probe need not look for the
    // end of its run.
    edges_.erase_present(KvFingerprintTable::fingerprint(nodes_.path_hash(n)), n, shrink);
    nodes_.release(n, shrink);
  }

  /// Sets the load policy of the edge table (see KvTableLoad); takes effect
  /// at its next resize. O(1).
  void set_edge_load(KvTableLoad load) noexcept { edges_.set_load(load); }
  /// The load policy of the edge table. O(1).
  [[nodiscard]] KvTableLoad edge_load() const noexcept { return edges_.load(); }

  /// Gives back what removals with `shrink` false kept. O(edge capacity).
  void shrink_to_fit_live() noexcept {
    nodes_.shrink_if_empty();
    edges_.shrink_to_load();
  }

  /// Checks the tree's own invariants: every live node is found by its edge
  /// and its tokens hash round-trips through its path hash, and the edge table
  /// holds the live nodes only, each reachable from its home slot. O(nodes).
  [[nodiscard]] bool check() const {
    std::size_t live = 0;
    for (std::uint32_t n = 1; n < nodes_.rows(); ++n) {
      if (nodes_.count(n) == 0U) continue;
      ++live;
      if (find_child(nodes_.path_hash(n), nodes_.parent(n)) != n) return false;
      if (nodes_.path_hash(n) !=
          child_path(nodes_.path_hash(nodes_.parent(n)), nodes_.tokens_hash(n)))
        return false;
    }
    return live == nodes_.live() && edges_.size() == live && edges_.check() && nodes_.check_pool();
  }

  /// Bytes held. O(1).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return nodes_.memory_bytes() + edges_.memory_bytes();
  }

  /// Hints the CPU to load the cache lines of the `n` hashes at `p` (a
  /// query's tokens hashes, usually cold). O(n).
  static void prefetch_hashes(const std::uint64_t* p, std::size_t n) noexcept {
#if defined(__GNUC__) || defined(__clang__)
    // Line by line on addresses (GCC 12 at -O2 dropped every prefetch of a
    // loop over p + i followed by a prefetch of the last element).
    const auto end = reinterpret_cast<std::uintptr_t>(p + n);
    for (auto a = reinterpret_cast<std::uintptr_t>(p) & ~std::uintptr_t{63}; a < end; a += 64U)
      __builtin_prefetch(reinterpret_cast<const void*>(a));
#endif
    (void)p;  // unused without the builtin
    (void)n;
  }

  /// Exchanges the contents with `other`. O(1).
  void swap(KvTree& other) noexcept {
    using std::swap;
    swap(nodes_, other.nodes_);
    swap(edges_, other.edges_);
  }

 private:
  static constexpr std::size_t walk_batch = 4;  // levels probed together after a miss
  // The same for the query walk: a deep query misses the row n + 1 guess
  // about once in 4 levels, so with 4 it waited for a new batch of rows after
  // nearly every miss. With 16 the rows of half a chunk load together (32 was
  // faster still, but its table lookups for levels the guess would have
  // found cost 7% more instructions per query).
  static constexpr std::size_t query_walk_batch = 16;

  KvNodeStore nodes_;
  KvFingerprintTable edges_;
};

}  // namespace promptcache::detail
