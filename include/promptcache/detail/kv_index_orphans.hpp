// promptcache: detail/kv_index_orphans.hpp
// SPDX-License-Identifier: Apache-2.0
//
// Orphan blocks of KvIndex: blocks a worker stored under a parent the index
// does not know for that worker (its view was reset, or it joined late), kept
// by name until their position in the tree can be known. Holding a block
// implies holding its whole prefix (block hashes are chained), so an orphan is
// routable by name, and grafted into the tree once its anchor (the parent
// name of its chain's first block) is placed.
//
// Orphans exist only after a reset or a late join, so this part favours
// simplicity over compactness: ordered std containers, O(log orphans) per
// block, and the strong guarantee by staging insertions in separate
// containers that are spliced in without allocating (node-based merge).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

namespace promptcache::detail {

/// What the index knows of one orphan block.
struct KvOrphanBlock {
  std::uint64_t tokens_hash = 0;  ///< its tokens hash (for the tree once grafted)
  std::uint64_t parent = 0;       ///< its parent's name (an orphan of the slot, or its anchor)
  /// Memberwise equality. O(1).
  friend constexpr bool operator==(const KvOrphanBlock&, const KvOrphanBlock&) = default;
};

/// Every worker slot's orphan blocks, indexed three ways: by (slot, name) for
/// the slot's blocks, by (name, slot) for matching a request's names, and by
/// (parent, slot, child) for chains (the children of an orphan, and the chains
/// anchored at a name the slot does not hold as an orphan).
class KvOrphans {
 public:
  using BlockKey = std::pair<std::uint32_t, std::uint64_t>;  // (slot, name)
  using NameKey = std::pair<std::uint64_t, std::uint32_t>;   // (name, slot)
  using ChildKey =
      std::tuple<std::uint64_t, std::uint32_t, std::uint64_t>;  // (parent, slot, child)
  using Blocks = std::map<BlockKey, KvOrphanBlock>;
  using Names = std::set<NameKey>;
  using Children = std::set<ChildKey>;

  /// Insertions prepared aside: building one allocates (and may throw) while
  /// the index is untouched; commit() then splices it in without allocating.
  struct Stage {
    Blocks blocks;      ///< new blocks
    Names names;        ///< their (name, slot) keys
    Children children;  ///< their (parent, slot, child) keys
    /// Adds block `name` of `slot` under `parent`. O(log staged). May throw.
    void add(std::uint32_t slot, std::uint64_t name, KvOrphanBlock b) {
      blocks.emplace(BlockKey{slot, name}, b);
      names.emplace(name, slot);
      children.emplace(b.parent, slot, name);
    }
  };

  /// Exchanges the contents with `other`. O(1), noexcept.
  void swap(KvOrphans& other) noexcept {
    blocks_.swap(other.blocks_);
    names_.swap(other.names_);
    children_.swap(other.children_);
  }

  /// True when no slot has an orphan. O(1).
  [[nodiscard]] bool empty() const noexcept { return blocks_.empty(); }
  /// Orphan blocks over all slots. O(1).
  [[nodiscard]] std::size_t size() const noexcept { return blocks_.size(); }

  /// The orphan `name` of `slot`, or nullptr. O(log orphans).
  [[nodiscard]] const KvOrphanBlock* find(std::uint32_t slot, std::uint64_t name) const noexcept {
    const auto it = blocks_.find(BlockKey{slot, name});
    return it == blocks_.end() ? nullptr : &it->second;
  }

  /// Moves the staged blocks in. Never allocates (node splicing). O(staged
  /// x log orphans).
  void commit(Stage& s) noexcept {
    blocks_.merge(s.blocks);
    names_.merge(s.names);
    children_.merge(s.children);
  }

  /// Calls f(slot) for every slot holding `name` as an orphan. O(log orphans
  /// + matches).
  template <class F>
  void for_each_holder(std::uint64_t name, F&& f) const {
    for (auto it = names_.lower_bound(NameKey{name, 0U}); it != names_.end() && it->first == name;
         ++it)
      f(it->second);
  }

  /// Calls f(slot, child) for every orphan whose parent is named `parent`
  /// (in any slot). O(log orphans + matches).
  template <class F>
  void for_each_child_of(std::uint64_t parent, F&& f) const {
    for (auto it = children_.lower_bound(ChildKey{parent, 0U, 0U});
         it != children_.end() && std::get<0>(*it) == parent; ++it)
      f(std::get<1>(*it), std::get<2>(*it));
  }

  /// The orphan children of `parent` in `slot`. O(log orphans + children).
  [[nodiscard]] std::vector<std::uint64_t> children(std::uint32_t slot,
                                                    std::uint64_t parent) const {
    std::vector<std::uint64_t> out;
    for (auto it = children_.lower_bound(ChildKey{parent, slot, 0U});
         it != children_.end() && std::get<0>(*it) == parent && std::get<1>(*it) == slot; ++it)
      out.push_back(std::get<2>(*it));
    return out;
  }

  /// True when `slot` has an orphan whose parent is named `parent`.
  /// O(log orphans).
  [[nodiscard]] bool has_children(std::uint32_t slot, std::uint64_t parent) const noexcept {
    const auto it = children_.lower_bound(ChildKey{parent, slot, 0U});
    return it != children_.end() && std::get<0>(*it) == parent && std::get<1>(*it) == slot;
  }

  /// Drops orphan `name` of `slot` alone (its children stay, now anchored at
  /// `name`); false if it is not one. O(log orphans).
  bool erase_one(std::uint32_t slot, std::uint64_t name) noexcept {
    const auto it = blocks_.find(BlockKey{slot, name});
    if (it == blocks_.end()) return false;
    children_.erase(ChildKey{it->second.parent, slot, name});
    names_.erase(NameKey{name, slot});
    blocks_.erase(it);
    return true;
  }

  /// Drops orphan `name` of `slot` and its orphan descendants; returns how
  /// many (0 if it is not one). O((dropped + 1) x log orphans), no recursion.
  std::size_t erase_subtree(std::uint32_t slot, std::uint64_t name) noexcept {
    if (blocks_.find(BlockKey{slot, name}) == blocks_.end()) return 0;
    std::size_t n = 0;
    // Leaves first: descend to a childless block, drop it, climb back.
    std::uint64_t cur = name;
    for (;;) {
      const auto c = children_.lower_bound(ChildKey{cur, slot, 0U});
      if (c != children_.end() && std::get<0>(*c) == cur && std::get<1>(*c) == slot) {
        cur = std::get<2>(*c);
        continue;
      }
      const auto it = blocks_.find(BlockKey{slot, cur});
      const std::uint64_t up = it->second.parent;
      erase_one(slot, cur);
      ++n;
      if (cur == name) return n;
      cur = up;
    }
  }

  /// Drops every orphan of `slot`; returns how many. O(its orphans x log
  /// orphans).
  std::size_t erase_slot(std::uint32_t slot) noexcept {
    std::size_t n = 0;
    auto it = blocks_.lower_bound(BlockKey{slot, 0U});
    while (it != blocks_.end() && it->first.first == slot) {
      children_.erase(ChildKey{it->second.parent, slot, it->first.second});
      names_.erase(NameKey{it->first.second, slot});
      it = blocks_.erase(it);
      ++n;
    }
    return n;
  }

  /// Orphans of `slot`. O(its orphans + log orphans).
  [[nodiscard]] std::size_t count(std::uint32_t slot) const noexcept {
    std::size_t n = 0;
    for (auto it = blocks_.lower_bound(BlockKey{slot, 0U});
         it != blocks_.end() && it->first.first == slot; ++it)
      ++n;
    return n;
  }

  /// Calls f(name, block) for every orphan of `slot`, by name. O(its
  /// orphans + log orphans).
  template <class F>
  void for_each_of(std::uint32_t slot, F&& f) const {
    for (auto it = blocks_.lower_bound(BlockKey{slot, 0U});
         it != blocks_.end() && it->first.first == slot; ++it)
      f(it->first.second, it->second);
  }

  /// Moves every orphan of slot `from` to slot `to` (which has none), by
  /// re-keying the container nodes: never allocates. O(its orphans x log
  /// orphans).
  void move_slot(std::uint32_t from, std::uint32_t to) noexcept {
    auto it = blocks_.lower_bound(BlockKey{from, 0U});
    while (it != blocks_.end() && it->first.first == from) {
      const std::uint64_t name = it->first.second;
      const std::uint64_t parent = it->second.parent;
      auto next = std::next(it);
      auto b = blocks_.extract(it);
      b.key().first = to;
      parked_blocks_.insert(std::move(b));
      auto nm = names_.extract(NameKey{name, from});
      nm.value().second = to;
      names_.insert(std::move(nm));
      auto ch = children_.extract(ChildKey{parent, from, name});
      std::get<1>(ch.value()) = to;
      children_.insert(std::move(ch));
      it = next;
    }
    blocks_.merge(parked_blocks_);
  }

  /// Approximate heap bytes: three container nodes per orphan. O(1).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return blocks_.size() *
           (3U * 32U + sizeof(Blocks::value_type) + sizeof(NameKey) + sizeof(ChildKey));
  }

  /// The three indexes agree. O(orphans x log orphans); for tests.
  [[nodiscard]] bool check() const {
    if (names_.size() != blocks_.size() || children_.size() != blocks_.size()) return false;
    for (const auto& [key, b] : blocks_) {
      if (names_.count(NameKey{key.second, key.first}) != 1U) return false;
      if (children_.count(ChildKey{b.parent, key.first, key.second}) != 1U) return false;
      if (b.parent == key.second) return false;
    }
    return true;
  }

 private:
  Blocks blocks_;
  Names names_;
  Children children_;
  Blocks parked_blocks_;  // empty between calls: move_slot's re-keyed nodes
};

}  // namespace promptcache::detail
