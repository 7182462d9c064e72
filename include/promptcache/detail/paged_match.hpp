// promptcache: detail/paged_match.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The match walk of PagedPrefixCache: from a namespace's root down the children a
// query continues in (PagedTree::find_child), handing on the page ids of each node
// it matches, refreshing their policy metadata, and splitting the node a match ends
// inside. peek() is the same walk with no change to anything.
//
// The walk is the cache's hot path: it keeps the nodes' and the edge table's
// addresses in locals (the compare and the copy are calls that may write any memory,
// after which fields of the state would be loaded again at every node) and splits at
// most once, at its end, after the split's allocations succeed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "promptcache/detail/paged_eviction_order.hpp"
#include "promptcache/detail/paged_state.hpp"
#include "promptcache/detail/paged_tree.hpp"

namespace promptcache::detail {

/// The match walk over a PagedCacheState<Types>. Stateless.
template <class Types>
struct PagedMatchPath {
  /// The state it works on.
  using State = PagedCacheState<Types>;
  /// A tree node.
  using Node = typename State::Node;
  /// The engine's page id type.
  using PageId = typename State::PageId;
  /// The tree.
  using Tree = PagedTree<Types>;
  /// The heaps and hooks.
  using Order = PagedEvictionOrder<Types>;
  /// A handle to the end of a prefix.
  using Handle = typename Types::Handle;

  /// Where a walk ended.
  struct End {
    std::size_t matched = 0;  ///< matched tokens
    Handle handle{};          ///< the node it ended at (empty: nothing matched)
  };

  /// Walks the first q_pages pages of `tokens` in namespace `ns`, handing emit(offset in
  /// pages, ids, count) the ids of each matched node in path order; with Copy (page size
  /// 1) the compare writes them to out instead and emit is not called. Counts the lookup.
  /// Throws std::logic_error from the event sink (nothing changed), std::bad_alloc from a
  /// split (see PagedPrefixCache::match).
  template <bool Copy, class Emit>
  static End walk(State& st, std::span<const std::uint32_t> tokens, std::uint64_t ns,
                  std::size_t q_pages, Emit&& emit, PageId* out) {
    if (st.events.publishing()) [[unlikely]]
      paged_throw_reentered();
    ++st.stats.lookups;
    st.stats.query_tokens += tokens.size();
    ++st.tick;
    const std::uint32_t slot = st.namespaces.find_hinted(ns);
    if (slot == paged_npos) return {};
    st.namespaces.remember(slot);
    // Locals: the compare and the copy are calls that may write any memory, after which
    // the state's fields would be loaded again at every node.
    const std::size_t ps = st.blocks.page_size();
    const std::uint32_t* const q = tokens.data();
    Node* nodes = st.nodes.data();
    const PagedEdgeTable::View edges = st.edges.view();
    std::uint32_t cur = st.namespaces[slot].root;
    std::size_t pos = 0;
    typename Tree::Found f;
    while (pos < q_pages) {
      f = Tree::template find_child<Copy>(st, nodes, edges, cur, q + pos * ps, q_pages - pos,
                                          f.next, f.ahead, Copy ? out + pos : nullptr);
      if (f.node == paged_npos) break;
      std::uint32_t c = f.node;
      const std::size_t k = f.pages;
      const bool inside = k < nodes[c].n;  // the match ends inside c: split it there
      if (inside) {
        // prepare_split() may rehash the edge table, freeing the slots `edges` views; the
        // walk ends after this node, so `edges` is never read again.
        Tree::prepare_split(st);
        c = Tree::split(st, c, k, st.blocks.split_blocks(st.nodes[c], k));
        nodes = st.nodes.data();
      }
      Order::touch_match(st, c, ns);
      const Node& x = nodes[c];
      if constexpr (!Copy) emit(pos, x.ids, std::size_t{x.n});
      pos += x.n;
      cur = c;
      if (inside) break;
    }
    st.stats.hit_tokens += pos * ps;
    // The walk ends at the root exactly when it matched nothing.
    if (pos == 0) return {};
    return {pos * ps, Handle{cur, nodes[cur].gen}};
  }

  /// Matched tokens walk() would report, without refreshing or splitting anything.
  /// O(T); never throws.
  [[nodiscard]] static std::size_t peek(const State& st, std::span<const std::uint32_t> tokens,
                                        std::uint64_t ns) noexcept {
    const std::uint32_t slot = st.namespaces.find_hinted(ns);
    if (slot == paged_npos) return 0;
    const std::size_t q_pages = tokens.size() / st.blocks.page_size();
    std::uint32_t cur = st.namespaces[slot].root;
    std::size_t pos = 0;
    typename Tree::Found f;
    while (pos < q_pages) {
      f = Tree::template find_child<false>(st, st.nodes.data(), st.edges.view(), cur,
                                           tokens.data() + pos * st.blocks.page_size(),
                                           q_pages - pos, f.next, f.ahead, nullptr);
      if (f.node == paged_npos) break;
      pos += f.pages;
      if (f.pages < st.nodes[f.node].n) break;
      cur = f.node;
    }
    return pos * st.blocks.page_size();
  }
};

}  // namespace promptcache::detail
