// promptcache: detail/paged_eviction_order.hpp
// SPDX-License-Identifier: Apache-2.0
//
// Which unlocked leaf PagedPrefixCache::evict() frees next: the evictable leaves sit
// in one binary heap per key class of the policy (paged_eviction_policy.hpp), ordered
// by the policy key, so evict costs O(log leaves) per node it touches whatever the
// size. The policy hooks (a match, an insert hit) update a node's metadata here and
// keep the heaps in step: a node whose key class changes moves at once; a key that
// changed is re-keyed at once, or lazily when the policy's keys only grow.
//
// A heap holds at most one entry per node; room for every node is kept in each, so
// unlock(), evict() and a change of key class push without allocating.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "promptcache/detail/paged_state.hpp"
#include "promptcache/paged_eviction_policy.hpp"

namespace promptcache::detail {

/// The heaps of evictable leaves and the policy hooks over a PagedCacheState<Types>.
/// Stateless.
template <class Types>
struct PagedEvictionOrder {
  /// The state it works on.
  using State = PagedCacheState<Types>;
  /// A tree node.
  using Node = typename State::Node;
  /// A heap entry.
  using HeapEntry = typename State::HeapEntry;
  /// The policy.
  using Policy = typename State::Policy;
  /// The policy's key.
  using key_type = typename Policy::key_type;
  /// Key classes of the policy.
  static constexpr std::size_t classes = State::classes;

  /// The key class of a node (always 0 for a policy without classes). A leaf is in
  /// heaps[class_of(leaf)]: a hook that changes the class moves it at once.
  [[nodiscard]] static std::size_t class_of(const State& st, const Node& nd) noexcept {
    if constexpr (classes == 1)
      return 0;
    else
      return std::min<std::size_t>(st.policy.key_class(nd.meta), classes - 1);
  }

  /// The class evict() takes its next leaf from: the policy's choice, else the first
  /// class after it (cyclically) with an evictable leaf. Requires one.
  [[nodiscard]] static std::size_t evict_class(State& st) noexcept {
    if constexpr (classes == 1) {
      return 0;
    } else {
      const std::span<const std::size_t> pages(st.class_pages);
      std::size_t k = 0;
      if constexpr (requires(std::span<const key_type* const> t) {
                      st.policy.choose_class(pages, t);
                    }) {
        // The policy also sees each class's least key (nullptr: no evictable leaf).
        const key_type* tops[classes];
        for (std::size_t c = 0; c < classes; ++c) {
          if (!st.heaps[c].empty()) fresh_top(st, c);
          tops[c] = st.heaps[c].empty() ? nullptr : &st.heaps[c][0].key;
        }
        k = st.policy.choose_class(pages, std::span<const key_type* const>(tops));
      } else {
        k = st.policy.choose_class(pages);
      }
      k = std::min<std::size_t>(k, classes - 1);
      while (st.heaps[k].empty())
        k = k + 1 == classes ? 0 : k + 1;
      return k;
    }
  }

  /// What the policy's hooks see of node x.
  [[nodiscard]] static PagedPolicyContext context(const State& st, const Node& x, std::uint64_t ns,
                                                  std::int64_t priority) noexcept {
    return {st.tick,
            priority,
            ns,
            x.depth,
            std::span<const std::uint32_t>(x.tok, std::size_t{x.n} * st.blocks.page_size()),
            false,
            st.blocks.page_size()};
  }

  /// A match walked through node x.
  static void touch_match(State& st, std::uint32_t x, std::uint64_t ns) noexcept {
    Node& nd = st.nodes[x];
    const std::size_t before = class_of(st, nd);
    st.policy.on_match(nd.meta, context(st, nd, ns, 0));
    touched(st, x, before);
  }

  /// An insert found node x cached.
  static void touch_insert(State& st, std::uint32_t x, std::uint64_t ns,
                           std::int64_t priority) noexcept {
    Node& nd = st.nodes[x];
    const std::size_t before = class_of(st, nd);
    st.policy.on_insert_hit(nd.meta, context(st, nd, ns, priority));
    touched(st, x, before);
  }

  /// After a hook changed x's metadata: a node whose key class changed moves its
  /// pages to the new class and, if it is a leaf, to the new class's heap at once;
  /// otherwise non-monotone keys are re-keyed at once and monotone ones lazily.
  static void touched(State& st, std::uint32_t x, [[maybe_unused]] std::size_t before) noexcept {
    Node& nd = st.nodes[x];
    if constexpr (classes > 1) {
      const std::size_t now = class_of(st, nd);
      if (now != before) {
        st.class_pages[before] -= nd.n;
        st.class_pages[now] += nd.n;
        if (nd.heap_pos != paged_npos) {
          erase_at(st, before, nd.heap_pos);
          push(st, x);
        }
        return;
      }
    }
    if constexpr (!Policy::monotone_keys)
      if (nd.heap_pos != paged_npos) rekey(st, x);
  }

  /// Keeps room for `n` entries in every heap. Grows geometrically. Throws std::bad_alloc.
  static void reserve(State& st, std::size_t n) {
    for (auto& heap : st.heaps)
      if (n > heap.capacity()) heap.reserve(std::max(n, heap.capacity() + heap.capacity() / 2));
  }

  /// Entries over all heaps.
  [[nodiscard]] static std::size_t size(const State& st) noexcept {
    std::size_t n = 0;
    for (const auto& heap : st.heaps)
      n += heap.size();
    return n;
  }

  /// Capacity over all heaps.
  [[nodiscard]] static std::size_t capacity(const State& st) noexcept {
    std::size_t n = 0;
    for (const auto& heap : st.heaps)
      n += heap.capacity();
    return n;
  }

  /// Adds leaf x to its class's heap. Requires capacity. Never throws.
  static void push(State& st, std::uint32_t x) noexcept {
    auto& heap = st.heaps[class_of(st, st.nodes[x])];
    heap.push_back(HeapEntry{st.policy.key(st.nodes[x].meta), x});
    st.nodes[x].heap_pos = static_cast<std::uint32_t>(heap.size() - 1);
    sift_up(st, heap, heap.size() - 1);
  }

  /// Removes entry i of heap k.
  static void erase_at(State& st, std::size_t k, std::size_t i) noexcept {
    auto& heap = st.heaps[k];
    st.nodes[heap[i].node].heap_pos = paged_npos;
    const HeapEntry last = heap.back();
    heap.pop_back();
    if (i == heap.size()) return;
    set(st, heap, i, last);
    sift_up(st, heap, i);
    sift_down(st, heap, st.nodes[last.node].heap_pos);
  }

  /// Removes leaf x from its heap.
  static void erase(State& st, std::uint32_t x) noexcept {
    erase_at(st, class_of(st, st.nodes[x]), st.nodes[x].heap_pos);
  }

  /// Re-keys leaf x at once.
  static void rekey(State& st, std::uint32_t x) noexcept {
    auto& heap = st.heaps[class_of(st, st.nodes[x])];
    const std::size_t i = st.nodes[x].heap_pos;
    heap[i].key = st.policy.key(st.nodes[x].meta);
    sift_up(st, heap, i);
    sift_down(st, heap, st.nodes[x].heap_pos);
  }

  /// Lazy re-keying: a leaf whose key grew since it was pushed sinks when it reaches
  /// the top of heap k, so the top is then the true minimum.
  static void fresh_top(State& st, [[maybe_unused]] std::size_t k) noexcept {
    if constexpr (Policy::monotone_keys) {
      auto& heap = st.heaps[k];
      for (;;) {
        const key_type now = st.policy.key(st.nodes[heap[0].node].meta);
        if (!(heap[0].key < now)) return;
        heap[0].key = now;
        sift_down(st, heap, 0);
      }
    }
  }

 private:
  static void set(State& st, std::vector<HeapEntry>& heap, std::size_t i,
                  const HeapEntry& e) noexcept {
    heap[i] = e;
    st.nodes[e.node].heap_pos = static_cast<std::uint32_t>(i);
  }

  static void sift_up(State& st, std::vector<HeapEntry>& heap, std::size_t i) noexcept {
    const HeapEntry e = heap[i];
    while (i > 0) {
      const std::size_t p = (i - 1) / 2;
      if (!(e.key < heap[p].key)) break;
      set(st, heap, i, heap[p]);
      i = p;
    }
    set(st, heap, i, e);
  }

  static void sift_down(State& st, std::vector<HeapEntry>& heap, std::size_t i) noexcept {
    const HeapEntry e = heap[i];
    const std::size_t n = heap.size();
    for (;;) {
      std::size_t c = 2 * i + 1;
      if (c >= n) break;
      if (c + 1 < n && heap[c + 1].key < heap[c].key) ++c;
      if (!(heap[c].key < e.key)) break;
      set(st, heap, i, heap[c]);
      i = c;
    }
    set(st, heap, i, e);
  }
};

}  // namespace promptcache::detail
