// promptcache: detail/paged_locks.hpp
// SPDX-License-Identifier: Apache-2.0
//
// Lock counts of PagedPrefixCache: a running request locks the path to its prefix's
// end so that its pages are never evicted. Every node on the path counts the locks
// running through it (`lock`), the end node also those taken with a handle ending
// there (`own`, what unlock() may release), and the namespace root all of the
// namespace's (so an erase knows at once whether anything is locked). A node whose
// count leaves 0 stops being evictable: its pages leave the evictable count and, if
// it is a leaf, it leaves its heap; it returns there when the count is back at 0.
#pragma once

#include <cstdint>
#include <limits>

#include "promptcache/detail/paged_eviction_order.hpp"
#include "promptcache/detail/paged_state.hpp"
#include "promptcache/detail/paged_tree.hpp"

namespace promptcache::detail {

/// Locking and unlocking paths over a PagedCacheState<Types>. Stateless.
template <class Types>
struct PagedLocks {
  /// The state it works on.
  using State = PagedCacheState<Types>;
  /// A tree node.
  using Node = typename State::Node;
  /// A handle to the end of a prefix.
  using Handle = typename Types::Handle;
  /// The heaps.
  using Order = PagedEvictionOrder<Types>;

  /// Locks the path ending at `h`. False, changing nothing, for a stale handle or when
  /// the namespace holds 2^32 - 1 locks; true (no-op) for an empty handle.
  /// O(nodes on the path + log leaves). Never throws.
  static bool lock(State& st, const Handle& h) noexcept {
    if (h.empty()) return true;
    if (!PagedTree<Types>::valid(st, h)) return false;
    Node& root = st.nodes[st.namespaces[st.nodes[h.node].ns].root];
    if (root.lock == std::numeric_limits<std::uint32_t>::max()) return false;
    for (std::uint32_t x = h.node; st.nodes[x].kind == PagedKind::node; x = st.nodes[x].parent) {
      Node& nd = st.nodes[x];
      if (nd.lock == 0) {
        st.evictable_pages -= nd.n;
        st.stats.locked_pages += nd.n;
        if (nd.heap_pos != paged_npos) Order::erase(st, x);
      }
      ++nd.lock;
    }
    ++st.nodes[h.node].own;
    ++root.lock;
    return true;
  }

  /// Releases one lock taken at `h`. False, changing nothing, for a stale handle or when
  /// none is held there; true (no-op) for an empty handle. O(nodes on the path + log
  /// leaves). Never throws.
  static bool unlock(State& st, const Handle& h) noexcept {
    if (h.empty()) return true;
    if (!PagedTree<Types>::valid(st, h) || st.nodes[h.node].own == 0) return false;
    --st.nodes[h.node].own;
    for (std::uint32_t x = h.node; st.nodes[x].kind == PagedKind::node; x = st.nodes[x].parent) {
      Node& nd = st.nodes[x];
      --nd.lock;
      if (nd.lock == 0) {
        st.evictable_pages += nd.n;
        st.stats.locked_pages -= nd.n;
        if (nd.first_child == paged_npos) Order::push(st, x);
      }
    }
    --st.nodes[st.namespaces[st.nodes[h.node].ns].root].lock;
    return true;
  }

  /// Locks taken at `h` and not yet released (0 for an empty or stale handle). O(1).
  [[nodiscard]] static std::size_t count(const State& st, const Handle& h) noexcept {
    return !h.empty() && PagedTree<Types>::valid(st, h) ? st.nodes[h.node].own : 0U;
  }
};

}  // namespace promptcache::detail
