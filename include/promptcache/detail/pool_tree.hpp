// promptcache: detail/pool_tree.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The radix tree of PromptCachePool: one compressed trie per namespace over token ids, an
// entry's record hanging off the node where its ids end. Edge labels are not copies: they
// point into the ids of some entry stored below the edge (the node's `owner`), so the index
// costs a few dozen bytes per node on top of the ids the entries own anyway, and a label is
// re-pointed when its owner leaves.
//
// This file knows the shape of the tree (walks, splits, merges, pruning, label owners) and
// keeps the common-prefix aggregates (detail/pool_best_heap.hpp) in step with it. It knows
// nothing of recency, TTLs, budgets or statistics: those are the pool's policy.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "mismatch.hpp"
#include "pool_best_heap.hpp"
#include "pool_child_map.hpp"
#include "pool_record.hpp"

namespace promptcache::detail {

/// One tree node. The fields a lookup reads (label, depths, best, child table) come first, so
/// that a node on the lookup path costs one cache line rather than two or three.
template <class Token, class Slot>
struct PoolNode {
  using slot_type = Slot;
  using entry_type = typename Slot::entry_type;

  const Token* label = nullptr;  // points into owner->ids
  std::size_t label_len = 0;
  std::size_t depth = 0;  // tokens from the root through the end of the label
  Slot* best = nullptr;   // common-prefix mode: shortest, then most recent entry below
  PoolNode* parent = nullptr;
  bool is_stale = false;  // listed in the parent's stale list
  Token first{};          // label[0], kept here so teardown never reads freed ids
  PoolChildMap<Token, PoolNode> children;
  PoolNode* stale = nullptr;                 // children whose heap item a touch made stale
  PoolNode* stale_next = nullptr;            // next in the parent's stale list
  const entry_type* owner = nullptr;         // some entry in this subtree whose ids back the label
  PoolSlotPtr<Slot> slot;                    // the entry whose ids end exactly here
  std::vector<PoolHeapItem<PoolNode>> heap;  // common-prefix mode: children as a heap by best
  std::size_t heap_pos = 0;                  // index in the parent's heap
};

/// Tree algorithms over PoolNode<Token, Slot>; all static (the pool owns the roots).
template <std::integral Token, class Slot>
struct PoolTree {
  using Node = PoolNode<Token, Slot>;
  using Entry = typename Slot::entry_type;
  using Best = PoolBestHeap<Node>;
  using ChildMap = PoolChildMap<Token, Node>;

  static bool equal_tokens(const Token* a, const Token* b, std::size_t n) noexcept {
    return std::memcmp(a, b, n * sizeof(Token)) == 0;
  }

  // Length of the common prefix of a[0, n) and b[0, n). Long equal stretches go through
  // memcmp in big blocks (libc's is the fastest "equal?"); the block that differs, and
  // anything short, through detail::mismatch, which also says where.
  // Forced inline: left out of line, g++ laid out find_longest_prefix so that exact-prefix
  // lookups (which never call this) got ~10% slower.
  [[gnu::always_inline]] static std::size_t common_length(const Token* a, const Token* b,
                                                          std::size_t n) noexcept {
    std::size_t i = 0;
    while (n - i >= 1024 && equal_tokens(a + i, b + i, 1024))
      i += 1024;
    while (n - i >= 256 && equal_tokens(a + i, b + i, 128))
      i += 128;
    return i + mismatch(a + i, b + i, (n - i) * sizeof(Token)) / sizeof(Token);
  }

  /// A child's label length from its parent's table (the node's copy only for huge labels).
  static std::size_t label_len_of(const typename ChildMap::Slot* e) noexcept {
    return e->label_len != ChildMap::kLongLabel ? e->label_len : e->node->label_len;
  }

  /// The record stored with exactly `ids` below `root` (may be null); nullptr if none. O(|ids|).
  static Slot* find(const Node* root, std::span<const Token> ids) noexcept {
    const Node* node = root;
    if (node == nullptr || ids.empty()) return nullptr;
    std::size_t pos = 0;
    while (pos < ids.size()) {
      const Node* c = node->children.find(ids[pos]);
      if (c == nullptr || c->depth > ids.size() ||
          !equal_tokens(c->label, ids.data() + pos, c->label_len)) {
        return nullptr;
      }
      node = c;
      pos = c->depth;
    }
    return node->slot.get();
  }

  /// A lookup's answer: the record and how many query tokens it covers.
  struct Match {
    Slot* slot = nullptr;
    std::size_t matched = 0;
  };

  /// The deepest record whose ids are a prefix of q[0, limit). O(limit).
  static Match match_exact(const Node* node, std::span<const Token> q, std::size_t limit) noexcept {
    Match m;
    if (node == nullptr) return m;
    std::size_t pos = 0;
    while (pos < limit) {
      const auto* e = node->children.find_slot(q[pos]);
      if (e == nullptr) break;
      const std::size_t len = label_len_of(e);
      if (len > limit - pos || !equal_tokens(e->label, q.data() + pos, len)) break;
      node = e->node;
      pos += len;
      if (node->slot) m.slot = node->slot.get();
    }
    if (m.slot != nullptr) m.matched = m.slot->len;
    return m;
  }

  /// The best record (per the aggregates) below the point where q[0, limit) leaves the tree,
  /// with the length of that common prefix. O(limit).
  static Match match_common(const Node* node, std::span<const Token> q,
                            std::size_t limit) noexcept {
    Match m;
    if (node == nullptr) return m;
    std::size_t pos = 0;
    while (pos < limit) {
      // The label (pointer and length) comes from the parent's table, not the child: the
      // compare then runs while the child node is still a cache miss away.
      const auto* e = node->children.find_slot(q[pos]);
      if (e == nullptr) break;
      const Token* label = e->label;
      const std::size_t len = label_len_of(e);
      // An edge the query covers usually matches in full (every edge on the path but the
      // last), and for a short one a single memcmp confirms that twice as fast as the
      // narrowing loop of common_length.
      const std::size_t k =
          len < 128 && len <= limit - pos && equal_tokens(label, q.data() + pos, len)
              ? len
              : common_length(label, q.data() + pos, std::min(len, limit - pos));
      const Node* c = e->node;
      if (k < len) {  // the query leaves the tree (or hits the cap) inside this edge
        m.slot = c->best;
        m.matched = pos + k;
        return m;
      }
      node = c;
      pos += len;
    }
    if (node->parent != nullptr) {
      m.slot = node->best;
      m.matched = pos;
    }
    return m;
  }

  /// Calls f(node) for every node of the subtree of `root`, iteratively: a lineage of
  /// single-token turns can make the tree as deep as the ids are long.
  template <class F>
  static void visit(const Node* root, F&& f) {
    std::vector<const Node*> stack{root};
    while (!stack.empty()) {
      const Node* n = stack.back();
      stack.pop_back();
      f(n);
      n->children.for_each([&](const Node* c) { stack.push_back(c); });
    }
  }

  // ---- insert -----------------------------------------------------------------------------

  /// Where new ids end relative to the tree: on an existing node, below it as a new leaf,
  /// inside an edge (the edge splits), or in a namespace without a root yet.
  enum class Where { at_node, new_leaf, split, new_root };

  /// The outcome of locate(): `node` is the deepest node on the ids' path, `child` the edge
  /// they leave through (split), `pos` the depth of `node`, `common` the tokens shared with
  /// `child`'s label.
  struct Place {
    Where where = Where::new_root;
    Node* node = nullptr;
    Node* child = nullptr;
    std::size_t pos = 0;
    std::size_t common = 0;
  };

  /// Walks ids down from `root` (null: the namespace has no tree) without changing anything;
  /// calls on_prefix(slot, exact) for every record on the path, shallowest first (`exact`
  /// when its ids equal `ids`). O(|ids|).
  template <class OnPrefix>
  static Place locate(Node* root, const std::vector<Token>& ids, OnPrefix&& on_prefix) {
    Place p;
    const std::size_t n = ids.size();
    Node* node = root;
    if (node == nullptr) return p;
    std::size_t pos = 0;
    while (true) {
      if (node->slot) on_prefix(node->slot.get(), pos == n);
      if (pos == n) {
        p.where = Where::at_node;
        break;
      }
      Node* child = node->children.find(ids[pos]);
      if (child == nullptr) {
        p.where = Where::new_leaf;
        break;
      }
      const std::size_t common =
          common_length(child->label, ids.data() + pos, std::min(child->label_len, n - pos));
      if (common < child->label_len) {
        p.where = Where::split;
        p.child = child;
        p.common = common;
        break;
      }
      node = child;
      pos = child->depth;
    }
    p.node = node;
    p.pos = pos;
    return p;
  }

  /// The nodes an insert at `p` needs, allocated up front (phase 1) so linking cannot throw.
  struct Spare {
    std::unique_ptr<Node> leaf;
    std::unique_ptr<Node> mid;
  };

  /// A fresh root for a new namespace, with room for its first child. May throw.
  static std::unique_ptr<Node> make_root(bool common) {
    auto root = std::make_unique<Node>();
    root->children.reserve(1);
    if (common) root->heap.reserve(1);
    return root;
  }

  /// Phase 1 of an insert of `n` ids at `p` (where is new_leaf or split, or at_node): every
  /// allocation the link will need. May throw; then nothing changed.
  static Spare reserve(const Place& p, std::size_t n, bool common) {
    Spare s;
    if (p.where == Where::new_leaf) {
      p.node->children.reserve(1);
      if (common && p.node->heap.size() == p.node->heap.capacity()) {
        p.node->heap.reserve(std::max<std::size_t>(4, 2 * p.node->heap.capacity()));  // geometric
      }
    }
    if (p.where == Where::split) {
      s.mid = std::make_unique<Node>();
      s.mid->children.reserve(p.pos + p.common == n ? 1 : 2);
      if (common) s.mid->heap.reserve(p.pos + p.common == n ? 1 : 2);
    }
    if (p.where == Where::new_leaf || (p.where == Where::split && p.pos + p.common < n)) {
      s.leaf = std::make_unique<Node>();
    }
    return s;
  }

  /// Phase 2: splits the edge and/or hangs the new leaf so that a node ends exactly at e's ids;
  /// returns that node (the new leaf, or null, in `new_leaf`). Never throws.
  static Node* link(const Place& p, Spare& spare, const Entry* e, bool common,
                    Node*& new_leaf) noexcept {
    const std::size_t n = e->ids.size();
    Node* node = p.node;
    std::size_t pos = p.pos;
    Node* target = node;
    if (p.where == Where::split) {
      Node* child = p.child;
      Node* m = spare.mid.release();
      m->parent = node;
      m->label = child->label;
      m->label_len = p.common;
      m->depth = pos + p.common;
      m->first = child->first;
      m->owner = child->owner;
      node->children.replace(child->first, m, m->label, m->label_len);
      child->label += p.common;
      child->label_len -= p.common;
      child->first = child->label[0];
      child->parent = m;
      m->children.insert_reserved(child->first, child, child->label, child->label_len);
      if (common) {
        m->best = child->best;  // same key: m takes child's place in node's heap as is
        Best::heap_substitute(node, child, m);
        m->heap.push_back(Best::item_of(child));  // reserved
        child->heap_pos = 0;
      }
      node = m;
      pos = m->depth;
      target = m;
    }
    new_leaf = nullptr;
    if (spare.leaf) {
      Node* l = spare.leaf.release();
      new_leaf = l;
      l->parent = node;
      l->label = e->ids.data() + pos;
      l->label_len = n - pos;
      l->depth = n;
      l->first = e->ids[pos];
      l->owner = e;
      node->children.insert_reserved(l->first, l, l->label, l->label_len);
      target = l;
    }
    return target;
  }

  /// Labels on the path to `target` that lived in `old`'s ids move to `e`'s equal ids.
  static void relabel(Node* target, const Entry* old, const Entry* e) noexcept {
    for (Node* y = target; y->parent != nullptr; y = y->parent) {
      if (y->owner == old) {
        y->owner = e;
        y->label = e->ids.data() + (y->depth - y->label_len);
        y->parent->children.set_label(y->first, y->label);
      }
    }
  }

  // ---- removal ----------------------------------------------------------------------------

  /// Repairs the tree after node n lost its record, whose entry was `old`: prunes nodes left
  /// without records, merges a node left with one child into it, and re-points labels that
  /// lived in old's ids. Returns the deepest surviving node on the path (the root if the
  /// tree is now empty). Never throws; O(depth) (+ O(depth x log fan-out) in common mode).
  static Node* repair(Node* n, const Entry* old, bool common) noexcept {
    Node* x = n;
    while (x->parent != nullptr && !x->slot && x->children.empty()) {
      Node* p = x->parent;
      p->children.erase(x->first);
      if (common) Best::heap_erase(p, x);
      delete x;
      x = p;
    }
    Node* lowest = x;  // the deepest node whose subtree lost the entry
    if (x->parent != nullptr && !x->slot && x->children.size() == 1) {
      Node* c = x->children.any();
      Node* p = x->parent;
      if (common) Best::flush_stale(x);  // c must not stay listed in x
      c->label_len += x->label_len;
      c->label = c->owner->ids.data() + (c->depth - c->label_len);
      c->first = x->first;
      c->parent = p;
      p->children.replace(x->first, c, c->label, c->label_len);
      if (common) Best::heap_substitute(p, x, c);
      x->children = ChildMap{};
      delete x;
      x = p;
      lowest = c;
    }
    for (Node* y = x; y->parent != nullptr; y = y->parent) {
      if (y->owner == old) {
        const Entry* o = y->slot ? y->slot->entry.get() : y->children.any()->owner;
        y->owner = o;
        y->label = o->ids.data() + (y->depth - y->label_len);
        y->parent->children.set_label(y->first, y->label);
      }
    }
    if (common) Best::propagate(lowest);
    return x;
  }

  /// Deletes every node below `root` (root stays, childless), handing each record to
  /// on_record(PoolSlotPtr<Slot>&&) first. The nodes are threaded into a stack through their
  /// (no longer needed) parent links: no allocation, no recursion, O(nodes + child tables).
  template <class OnRecord>
  static void drop(Node* root, OnRecord&& on_record) noexcept {
    Node* stack = nullptr;
    auto push = [&stack](Node* c) {
      c->parent = stack;
      stack = c;
    };
    root->children.for_each(push);
    root->children = ChildMap{};
    root->heap.clear();
    root->stale = nullptr;
    while (stack != nullptr) {
      Node* x = stack;
      stack = x->parent;
      x->children.for_each(push);
      if (x->slot) on_record(std::move(x->slot));
      delete x;
    }
  }

  // ---- checks -----------------------------------------------------------------------------

  /// Checks the shape of the tree under `root` (links, depths, labels and their owners,
  /// merged nodes, the aggregates in common mode) and calls on_record(record) for each
  /// record, whose path must spell its ids. `require(ok, what)` reports a violation.
  /// O(nodes x subtree size + entries x length).
  template <class Require, class OnRecord>
  static void check(const Node* root, bool common, Require&& require, OnRecord&& on_record) {
    require(root->parent == nullptr && !root->slot && root->depth == 0, "root shape");
    visit(root, [&](const Node* n) {
      n->children.for_each([&](const Node* c) {
        require(c->parent == n, "parent link");
        require(c->label_len > 0 && c->depth == n->depth + c->label_len, "depth");
        require(c->label[0] == c->first && n->children.find(c->first) == c, "first token");
        const auto* e = n->children.find_slot(c->first);
        require(e->label == c->label && label_len_of(e) == c->label_len, "label copy");
      });
      if (common) {
        Best::check_heap(n, require);
      } else {
        require(n->heap.empty() && n->stale == nullptr, "heap outside common-prefix mode");
      }
      if (n == root) return;
      require(n->slot || n->children.size() >= 2, "unmerged or empty node");
      const Entry* o = n->owner;
      require(o != nullptr && o->ids.size() >= n->depth, "owner too short");
      require(n->label == o->ids.data() + (n->depth - n->label_len), "label not in owner");
      // The owner must live in this node's subtree.
      bool owned = false;
      visit(n, [&](const Node* d) { owned = owned || (d->slot && d->slot->entry.get() == o); });
      require(owned, "owner outside subtree");
      if (n->slot) {
        const Slot* s = n->slot.get();
        require(s->node == n, "slot back link");
        require(s->entry->ids.size() == n->depth, "entry length");
        const Node* p = n;
        std::size_t end = n->depth;
        while (p->parent != nullptr) {
          require(
              std::equal(p->label, p->label + p->label_len,
                         s->entry->ids.begin() + static_cast<std::ptrdiff_t>(end - p->label_len)),
              "path differs from ids");
          end -= p->label_len;
          p = p->parent;
        }
        on_record(s);
      }
      if (common) Best::check_best(n, require);
    });
  }
};

}  // namespace promptcache::detail
