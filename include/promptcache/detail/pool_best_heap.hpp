// promptcache: detail/pool_best_heap.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The common-prefix aggregates of PromptCachePool's radix tree. Every node knows the best
// entry of its subtree (shortest, then most recently used) and keeps its children in a 4-ary
// heap ordered by their best, so any change costs O(log fan-out) per level up to the root,
// removals included.
//
// A lookup hit only makes its entry the most recent: the bests on its path are set at once
// (lookups read them), but the items in the parents' heaps, whose keys only improved, are
// just listed as stale and re-sifted by the next operation that reads or reshapes that heap
// (flush_stale). Lookups then never sift (a sift at fan-out 65536 is 8 levels of scattered
// node writes), and the sift work, one per touched child, moves to inserts and removals.
// Stored keys always form a valid heap, so settling the listed items one at a time is exact.
//
// Works on any node type with the fields of detail::PoolNode (best, parent, slot, heap,
// heap_pos, stale, stale_next, is_stale) over records with `len` and `seq`.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace promptcache::detail {

/// A child in its parent's heap, with the key of its best entry copied in, so sifting reads
/// the (mostly cached) heap array instead of chasing two pointers per comparison.
template <class Node>
struct PoolHeapItem {
  std::size_t len;
  std::uint64_t seq;
  Node* node;
};

template <class Node>
struct PoolBestHeap {
  using Slot = typename Node::slot_type;
  using Item = PoolHeapItem<Node>;

  /// Heap arity: half as many levels to sift up through as a binary heap.
  static constexpr std::size_t kArity = 4;

  /// The common-prefix preference between two entries: shorter, then more recent.
  static bool better(const Slot* a, const Slot* b) noexcept {
    return a->len < b->len || (a->len == b->len && a->seq > b->seq);
  }

  static bool item_better(const Item& a, const Item& b) noexcept {
    return a.len < b.len || (a.len == b.len && a.seq > b.seq);
  }

  static Item item_of(Node* c) noexcept { return Item{c->best->len, c->best->seq, c}; }

  // Re-sifts the items that touches made stale. Every other heap operation starts with it
  // (propagate, for heap_update).
  // A listed key only improved (propagate flushes before it makes a best worse), but each item
  // is sifted both ways anyway, so a missed flush cannot leave a heap out of order.
  static void flush_stale(Node* p) noexcept {
    for (Node* c = std::exchange(p->stale, nullptr); c != nullptr;) {
      Node* next = std::exchange(c->stale_next, nullptr);
      c->is_stale = false;
      heap_update(p, c);
      c = next;
    }
  }

  /// Restores the heap order around position i (the item there changed its key).
  static void heap_fix(Node* p, std::size_t i) noexcept {
    std::vector<Item>& h = p->heap;
    const Item c = h[i];
    while (i > 0) {
      const std::size_t up = (i - 1) / kArity;
      if (!item_better(c, h[up])) break;
      h[i] = h[up];
      h[i].node->heap_pos = i;
      i = up;
    }
    const std::size_t n = h.size();
    while (true) {
      const std::size_t first = kArity * i + 1;
      if (first >= n) break;
      std::size_t b = first;
      const std::size_t last = std::min(first + kArity, n);
      for (std::size_t k = first + 1; k < last; ++k) {
        if (item_better(h[k], h[b])) b = k;
      }
      if (!item_better(h[b], c)) break;
      h[i] = h[b];
      h[i].node->heap_pos = i;
      i = b;
    }
    h[i] = c;
    c.node->heap_pos = i;
  }

  // Child c's best (or its key) changed: refresh its item and reposition it. The stored keys
  // of the other items form a valid heap, stale ones included, so this is exact for c; the
  // caller settles p's stale list first when it matters (propagate, flush_stale itself).
  static void heap_update(Node* p, Node* c) noexcept {
    p->heap[c->heap_pos] = item_of(c);
    heap_fix(p, c->heap_pos);
  }

  /// `now` takes the heap position of `before` (a split or merge swapping one child for
  /// another with the same best).
  static void heap_substitute(Node* p, Node* before, Node* now) noexcept {
    flush_stale(p);
    now->heap_pos = before->heap_pos;
    p->heap[now->heap_pos] = item_of(now);
  }

  /// Adds child c; requires reserved capacity (phase 1 of an insert).
  static void heap_push(Node* p, Node* c) noexcept {
    flush_stale(p);
    p->heap.push_back(item_of(c));
    c->heap_pos = p->heap.size() - 1;
    heap_fix(p, c->heap_pos);
  }

  /// Removes child c.
  static void heap_erase(Node* p, Node* c) noexcept {
    flush_stale(p);
    std::vector<Item>& h = p->heap;
    const std::size_t i = c->heap_pos;
    const Item last = h.back();
    h.pop_back();
    if (last.node != c) {
      h[i] = last;
      last.node->heap_pos = i;
      heap_fix(p, i);
    }
  }

  static Slot* compute_best(Node* y) noexcept {
    flush_stale(y);
    Slot* b = y->slot.get();
    if (!y->heap.empty() && (b == nullptr || better(y->heap[0].node->best, b))) {
      b = y->heap[0].node->best;
    }
    return b;
  }

  /// The subtree of x changed: recomputes best from x up, fixing each parent's heap.
  /// O(depth x log fan-out) plus the stale items settled on the way.
  static void propagate(Node* x) noexcept {
    for (Node* y = x; y->parent != nullptr; y = y->parent) {
      // Settle the parent's stale items while y's best is still the one they were listed
      // with (y's new best may be worse), so a listed key has only ever improved.
      flush_stale(y->parent);
      y->best = compute_best(y);
      heap_update(y->parent, y);
    }
  }

  // s was just touched: its key only improved (same len, newest seq) and nothing else changed,
  // so an ancestor's best becomes s exactly when s beats its old best, its heap item only
  // improves (listed as stale, not sifted), and once an ancestor keeps a best other than s
  // nothing above it changes. Same bests as propagate(s->node), without reading the heaps.
  // s's own node needs no comparison: an entry is shorter than everything below it, so it is
  // always its node's best already. The root keeps no best.
  static void propagate_touch(Slot* s) noexcept {
    Node* y = s->node;
    for (Node* p = y->parent; p != nullptr; y = p, p = p->parent) {
      if (!y->is_stale) {
        y->is_stale = true;
        y->stale_next = std::exchange(p->stale, y);
      }
      if (p->parent == nullptr || (p->best != s && !better(s, p->best))) return;
      p->best = s;
    }
  }

  /// Checks node n's heap and stale list; `require(ok, what)` reports a violation.
  template <class Require>
  static void check_heap(const Node* n, Require&& require) {
    require(n->heap.size() == n->children.size(), "heap size");
    std::size_t stale = 0;
    for (const Node* c = n->stale; c != nullptr; c = c->stale_next, ++stale)
      require(c->parent == n && c->is_stale && stale < n->heap.size(), "stale list");
    for (std::size_t i = 0; i < n->heap.size(); ++i) {
      const Item& it = n->heap[i];
      const Node* c = it.node;
      require(c->parent == n && c->heap_pos == i, "heap links");
      // A stale item has its child's length and an older touch order; others are exact.
      require(
          it.len == c->best->len && (c->is_stale ? it.seq <= c->best->seq : it.seq == c->best->seq),
          "heap keys");
      require(i == 0 || !item_better(it, n->heap[(i - 1) / kArity]), "heap order");
      if (c->is_stale) --stale;
    }
    require(stale == 0, "stale list members");
  }

  /// Checks a non-root node's best against its entry and its children's bests.
  template <class Require>
  static void check_best(const Node* n, Require&& require) {
    const Slot* b = n->slot.get();
    n->children.for_each([&](const Node* c) {
      if (b == nullptr || better(c->best, b)) b = c->best;
    });
    require(n->best == b, "common-prefix aggregate");
  }
};

}  // namespace promptcache::detail
