// promptcache: detail/paged_removal.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The paths that hand pages back to the engine: evict (leaves in the order of the
// policy, trimmed from the tail so that a long leaf gives up only what is needed),
// erasing a namespace, clearing everything. Each calls the engine's callback once per
// freed page, keeps the counters and the heaps in step, and collects the block hashes
// of what it freed for the cache's Removed event.
//
// None of them allocates (the callers reserve the hash vector first), so none can
// fail half-way: the cache cannot hand back half a node.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "promptcache/detail/paged_events.hpp"
#include "promptcache/detail/paged_eviction_order.hpp"
#include "promptcache/detail/paged_state.hpp"
#include "promptcache/detail/paged_tree.hpp"

namespace promptcache::detail {

/// Freeing pages over a PagedCacheState<Types>. Stateless.
template <class Types>
struct PagedRemoval {
  /// The state it works on.
  using State = PagedCacheState<Types>;
  /// A tree node.
  using Node = typename State::Node;
  /// The tree.
  using Tree = PagedTree<Types>;
  /// The heaps and hooks.
  using Order = PagedEvictionOrder<Types>;
  /// Key classes of the policy.
  static constexpr std::size_t classes = State::classes;

  /// Frees exactly `target` evictable pages (at most st.evictable_pages): takes the leaf
  /// with the least key of the class the policy picks, frees its pages from the tail
  /// (deepest first) through on_evict, and with a sink appends their hashes to `removed`
  /// (which has room for them). A leaf emptied this way is removed and its parent may
  /// become a leaf. Never throws (on_evict must not).
  template <class OnEvict>
  static void evict(State& st, std::size_t target, OnEvict& on_evict,
                    std::vector<std::uint64_t>& removed) noexcept {
    std::size_t freed = 0;
    while (freed < target) {
      const std::size_t k = Order::evict_class(st);
      Order::fresh_top(st, k);
      const std::uint32_t x = st.heaps[k][0].node;
      Node& nd = st.nodes[x];
      std::uint32_t take = static_cast<std::uint32_t>(std::min<std::size_t>(target - freed, nd.n));
      if constexpr (classes > 1) {
        // The policy chooses again after every page: its choice depends on the
        // pages per class, which this leaf's pages are leaving.
        std::uint32_t t = 0;
        do {
          --st.class_pages[k];
          ++t;
        } while (t < take && Order::evict_class(st) == k);
        take = t;
      }
      const std::uint32_t keep = nd.n - take;
      for (std::uint32_t i = nd.n; i-- > keep;)
        on_evict(nd.ids[i]);
      if (st.events.on()) {
        // Only the last page's hash is kept: walk the node's chain once for the
        // hashes of the freed pages (deepest first) and the new last page's.
        nd.last_hash =
            paged_trimmed_hashes(Tree::parent_hash(st, nd), nd.tok, nd.n, keep,
                                 st.blocks.page_size(), st.namespaces[nd.ns].seed, removed);
      }
      PagedPolicyContext ctx = Order::context(st, nd, st.namespaces[nd.ns].id, 0);
      ctx.tokens = ctx.tokens.subspan(std::size_t{keep} * st.blocks.page_size());
      ctx.whole_node = keep == 0;
      ctx.depth_pages += keep;
      st.policy.on_evict(nd.meta, ctx);
      st.stats.cached_pages -= take;
      st.evictable_pages -= take;
      st.stats.evicted_pages += take;
      freed += take;
      if (keep == 0) {
        const std::uint32_t parent = nd.parent;
        Order::erase_at(st, k, 0);
        Tree::remove_leaf(st, x);
        Node& p = st.nodes[parent];
        if (p.kind == PagedKind::node && p.first_child == paged_npos && p.lock == 0)
          Order::push(st, parent);
      } else {
        nd.n = keep;
        ++nd.gen;
        Tree::compact(st, nd);
      }
    }
  }

  /// Frees every page of every namespace through on_free (in node order) and empties
  /// the tree, keeping the namespaces and their roots. Requires no lock. Never throws
  /// (on_free must not).
  template <class OnFree>
  static void clear(State& st, OnFree& on_free) noexcept {
    for (std::uint32_t x = 0; x < st.nodes.size(); ++x) {
      Node& nd = st.nodes[x];
      if (nd.kind == PagedKind::root) {
        nd.first_child = paged_npos;
        nd.lock = 0;
      }
      if (nd.kind != PagedKind::node) continue;
      for (std::uint32_t i = 0; i < nd.n; ++i)
        on_free(nd.ids[i]);
      Tree::free_node(st, x);
    }
    st.stats.cleared_pages += st.stats.cached_pages;
    st.stats.cached_pages = 0;
    st.stats.nodes = 0;
    st.evictable_pages = 0;
    st.edges.clear();
    for (auto& heap : st.heaps)
      heap.clear();
    st.class_pages = {};
  }

  /// Appends every node of the namespace whose root is `root` to `order`, parents
  /// first; returns their pages. Throws std::bad_alloc.
  static std::size_t collect(const State& st, std::uint32_t root,
                             std::vector<std::uint32_t>& order) {
    std::size_t pages = 0;
    for (std::uint32_t c = st.nodes[root].first_child; c != paged_npos; c = st.nodes[c].next)
      order.push_back(c);
    for (std::size_t i = 0; i < order.size(); ++i) {
      pages += st.nodes[order[i]].n;
      for (std::uint32_t c = st.nodes[order[i]].first_child; c != paged_npos; c = st.nodes[c].next)
        order.push_back(c);
    }
    return pages;
  }

  /// Frees the nodes `order` (collect()'s, of the unlocked namespace in `slot`) through
  /// on_free, children first, appending their hashes to `removed` with a sink (which has
  /// room for them), and closes the namespace. Never throws (on_free must not).
  template <class OnFree>
  static void erase(State& st, std::uint32_t slot, const std::vector<std::uint32_t>& order,
                    OnFree& on_free, std::vector<std::uint64_t>& removed) noexcept {
    // Children first, so every removal is of a leaf.
    for (std::size_t i = order.size(); i-- > 0;) {
      const std::uint32_t x = order[i];
      Node& nd = st.nodes[x];
      for (std::uint32_t j = nd.n; j-- > 0;)
        on_free(nd.ids[j]);
      if (st.events.on())  // the parent is still there: children go first
        paged_removed_hashes(Tree::parent_hash(st, nd), nd.tok, nd.n, st.blocks.page_size(),
                             st.namespaces[nd.ns].seed, removed);
      st.stats.cached_pages -= nd.n;
      if constexpr (classes > 1) st.class_pages[Order::class_of(st, nd)] -= nd.n;
      st.evictable_pages -= nd.n;
      if (nd.heap_pos != paged_npos) Order::erase(st, x);
      Tree::remove_leaf(st, x);
    }
    Tree::close_namespace(st, slot);
  }
};

}  // namespace promptcache::detail
