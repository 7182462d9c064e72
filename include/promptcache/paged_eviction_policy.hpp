// promptcache: paged_eviction_policy.hpp
// SPDX-License-Identifier: Apache-2.0
//
// Eviction policies of PagedPrefixCache, and the interface a new one implements.
//
// The cache keeps every evictable leaf (an unlocked node without children) in a
// binary min-heap ordered by the policy's key, and evicts from the leaf with the
// smallest key, tail pages first. A policy decides only two things: what it
// remembers per node (its `meta_type`, updated by the hooks below) and how that
// metadata orders leaves (its `key_type`). The cache calls the hooks; a policy
// never sees the tree and never needs to rebuild anything, so a new policy is
// one small class and no edit of the cache.
//
// Interface (checked by the PagedEvictionPolicy concept):
//
//   struct MyPolicy {
//     using meta_type = ...;   // per-node metadata: trivially copyable, stored in every node
//     using key_type = ...;    // totally ordered by operator<; the smaller key is evicted first
//     static constexpr bool monotone_keys = ...;  // see below
//     meta_type on_create(const PagedPolicyContext&);               // insert created a node
//     void on_match(meta_type&, const PagedPolicyContext&);         // match() walked the node
//     void on_insert_hit(meta_type&, const PagedPolicyContext&);    // insert() walked the node
//     void on_evict(const meta_type&, const PagedPolicyContext&);   // pages of the node freed
//     key_type key(const meta_type&) const;                         // the eviction order
//   };
//
// Rules the cache relies on:
// - key() depends on the node's metadata alone (not on other policy state), so a
//   leaf's position in the heap changes only when a hook changes its metadata.
// - monotone_keys = true promises that on_match and on_insert_hit never make
//   key() smaller. The cache then re-keys lazily: a hook costs O(1), and a leaf
//   whose key grew is moved down the heap only when it reaches the top during
//   evict(). match() stays O(path). With monotone_keys = false every hook on a
//   node in the heap re-keys it at once, O(log leaves).
// - A node split (a match or insert ending inside a node) copies the metadata
//   to both halves; a split is not an access and calls no hook.
// - Keys of two leaves should differ (the shipped policies break ties by a
//   logical access time that no two leaves share); equal keys are evicted in an
//   unspecified order.
// - Hooks must not throw (they run while the cache is mid-update).
// The policy object is a member of the cache (constructed from the instance
// given to the cache), so it may keep state of its own: ghost lists, adaptive
// targets, counters.
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
#endif

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

namespace promptcache {

/// What a policy hook is told about the node it is called for.
struct PagedPolicyContext {
  /// Logical time of the operation: the cache's operation counter, incremented
  /// by every match() and insert(); strictly increasing, starting at 1.
  std::uint64_t tick = 0;
  /// insert(): the request's priority; other hooks: 0.
  std::int64_t priority = 0;
  /// The namespace of the node.
  std::uint64_t ns = 0;
  /// Depth of the node's first page: the number of pages before it on its path.
  std::size_t depth_pages = 0;
  /// on_evict: the pages being freed now (the node's tail, all of them when
  /// `whole_node`); other hooks: the node's pages. One page is page_size tokens.
  std::span<const std::uint32_t> tokens{};
  /// on_evict: true when the node goes away entirely (not just its tail).
  bool whole_node = false;
};

/// The interface of an eviction policy (see the file comment for the rules).
template <class P>
concept PagedEvictionPolicy = std::is_nothrow_copy_constructible_v<typename P::meta_type> &&
    std::is_trivially_copyable_v<typename P::meta_type> &&
    std::is_nothrow_copy_constructible_v<typename P::key_type> &&
    std::is_nothrow_copy_assignable_v<typename P::key_type> &&
    requires(P& p, const P& cp, typename P::meta_type& m, const typename P::meta_type& cm,
             const typename P::key_type& k, const PagedPolicyContext& ctx) {
  { P::monotone_keys } -> std::convertible_to<bool>;
  { p.on_create(ctx) } -> std::same_as<typename P::meta_type>;
  p.on_match(m, ctx);
  p.on_insert_hit(m, ctx);
  p.on_evict(cm, ctx);
  { cp.key(cm) } -> std::same_as<typename P::key_type>;
  { k < k } -> std::convertible_to<bool>;
};

/// The shipped policies; their keys follow SGLang's eviction strategies
/// (python/sglang/srt/mem_cache/evict_policy.py), with a logical clock for time.
namespace eviction {

/// Least recently used: a node's key is the tick of its last match or insert.
/// The default policy.
struct Lru {
  /// Last access tick.
  struct meta_type {
    std::uint64_t last_access = 0;  ///< Tick of the last match or insert through the node.
  };
  using key_type = std::uint64_t;              ///< The last access tick.
  static constexpr bool monotone_keys = true;  ///< Accesses only move the tick forward.

  /// New node: accessed now. O(1).
  meta_type on_create(const PagedPolicyContext& c) noexcept { return {c.tick}; }
  /// Match: accessed now. O(1).
  void on_match(meta_type& m, const PagedPolicyContext& c) noexcept { m.last_access = c.tick; }
  /// Insert through the node: accessed now. O(1).
  void on_insert_hit(meta_type& m, const PagedPolicyContext& c) noexcept { m.last_access = c.tick; }
  /// Nothing to remember. O(1).
  void on_evict(const meta_type&, const PagedPolicyContext&) noexcept {}
  /// Oldest access first. O(1).
  [[nodiscard]] key_type key(const meta_type& m) const noexcept { return m.last_access; }
};

/// Least frequently used, then least recently used. As in SGLang, the count is
/// of inserts through the node (an engine inserts every request's tokens when it
/// finishes, so this counts the requests that used the prefix); match() only
/// refreshes the access time. A split copies the count to both halves.
struct Lfu {
  /// Hit count and last access tick.
  struct meta_type {
    std::uint64_t hits = 0;         ///< Inserts through the node (1 at creation).
    std::uint64_t last_access = 0;  ///< Tick of the last match or insert.
  };
  /// (hits, last access), compared lexicographically.
  struct key_type {
    std::uint64_t hits = 0;         ///< Fewer hits are evicted first.
    std::uint64_t last_access = 0;  ///< Then the older access.
    /// Lexicographic order. O(1).
    friend constexpr bool operator<(const key_type& a, const key_type& b) noexcept {
      return a.hits != b.hits ? a.hits < b.hits : a.last_access < b.last_access;
    }
  };
  static constexpr bool monotone_keys = true;  ///< Counts and ticks only grow.

  /// New node: one hit, accessed now. O(1).
  meta_type on_create(const PagedPolicyContext& c) noexcept { return {1, c.tick}; }
  /// Match: accessed now (not a hit, as in SGLang). O(1).
  void on_match(meta_type& m, const PagedPolicyContext& c) noexcept { m.last_access = c.tick; }
  /// Insert through the node: a hit, accessed now. O(1).
  void on_insert_hit(meta_type& m, const PagedPolicyContext& c) noexcept {
    ++m.hits;
    m.last_access = c.tick;
  }
  /// Nothing to remember. O(1).
  void on_evict(const meta_type&, const PagedPolicyContext&) noexcept {}
  /// (hits, last access). O(1).
  [[nodiscard]] key_type key(const meta_type& m) const noexcept { return {m.hits, m.last_access}; }
};

/// First in, first out: a node's key is the tick of the insert that created its
/// pages. Accesses change nothing. A split keeps the creation tick on both
/// halves (SGLang stamps the new half with the split time; a split is not a new
/// page here).
struct Fifo {
  /// Creation tick.
  struct meta_type {
    std::uint64_t created = 0;  ///< Tick of the insert that stored the pages.
  };
  using key_type = std::uint64_t;              ///< The creation tick.
  static constexpr bool monotone_keys = true;  ///< Keys never change.

  /// New node: created now. O(1).
  meta_type on_create(const PagedPolicyContext& c) noexcept { return {c.tick}; }
  /// No change. O(1).
  void on_match(meta_type&, const PagedPolicyContext&) noexcept {}
  /// No change. O(1).
  void on_insert_hit(meta_type&, const PagedPolicyContext&) noexcept {}
  /// Nothing to remember. O(1).
  void on_evict(const meta_type&, const PagedPolicyContext&) noexcept {}
  /// Oldest creation first. O(1).
  [[nodiscard]] key_type key(const meta_type& m) const noexcept { return m.created; }
};

/// Per-insert priority, then least recently used: lower priorities are evicted
/// first. As in SGLang, an insert raises the priority of every node on its path
/// to at least its own (a prefix is as important as the most important request
/// that used it), and a new node takes the insert's priority.
struct Priority {
  /// Priority and last access tick.
  struct meta_type {
    std::int64_t priority = 0;      ///< Highest priority of an insert through the node.
    std::uint64_t last_access = 0;  ///< Tick of the last match or insert.
  };
  /// (priority, last access), compared lexicographically.
  struct key_type {
    std::int64_t priority = 0;      ///< Lower priority is evicted first.
    std::uint64_t last_access = 0;  ///< Then the older access.
    /// Lexicographic order. O(1).
    friend constexpr bool operator<(const key_type& a, const key_type& b) noexcept {
      return a.priority != b.priority ? a.priority < b.priority : a.last_access < b.last_access;
    }
  };
  static constexpr bool monotone_keys = true;  ///< Priorities are raised, ticks only grow.

  /// New node: the insert's priority, accessed now. O(1).
  meta_type on_create(const PagedPolicyContext& c) noexcept { return {c.priority, c.tick}; }
  /// Match: accessed now. O(1).
  void on_match(meta_type& m, const PagedPolicyContext& c) noexcept { m.last_access = c.tick; }
  /// Insert through the node: priority raised to the insert's, accessed now. O(1).
  void on_insert_hit(meta_type& m, const PagedPolicyContext& c) noexcept {
    if (m.priority < c.priority) m.priority = c.priority;
    m.last_access = c.tick;
  }
  /// Nothing to remember. O(1).
  void on_evict(const meta_type&, const PagedPolicyContext&) noexcept {}
  /// (priority, last access). O(1).
  [[nodiscard]] key_type key(const meta_type& m) const noexcept {
    return {m.priority, m.last_access};
  }
};

/// Segmented LRU: nodes with at least `protected_threshold` hits (inserts
/// through them, counted as for Lfu) are protected and evicted only after every
/// probationary node; within a segment, least recently used first. SGLang's
/// default threshold is 2.
struct Slru {
  /// Hits needed to enter the protected segment.
  std::uint64_t protected_threshold = 2;

  /// Hit count and last access tick.
  struct meta_type {
    std::uint64_t hits = 0;         ///< Inserts through the node (1 at creation).
    std::uint64_t last_access = 0;  ///< Tick of the last match or insert.
  };
  /// (segment, last access), compared lexicographically.
  struct key_type {
    std::uint8_t segment = 0;       ///< 0 probationary, 1 protected.
    std::uint64_t last_access = 0;  ///< Older access first within a segment.
    /// Lexicographic order. O(1).
    friend constexpr bool operator<(const key_type& a, const key_type& b) noexcept {
      return a.segment != b.segment ? a.segment < b.segment : a.last_access < b.last_access;
    }
  };
  static constexpr bool monotone_keys = true;  ///< Hits and ticks only grow.

  /// New node: one hit, accessed now. O(1).
  meta_type on_create(const PagedPolicyContext& c) noexcept { return {1, c.tick}; }
  /// Match: accessed now. O(1).
  void on_match(meta_type& m, const PagedPolicyContext& c) noexcept { m.last_access = c.tick; }
  /// Insert through the node: a hit, accessed now. O(1).
  void on_insert_hit(meta_type& m, const PagedPolicyContext& c) noexcept {
    ++m.hits;
    m.last_access = c.tick;
  }
  /// Nothing to remember. O(1).
  void on_evict(const meta_type&, const PagedPolicyContext&) noexcept {}
  /// (protected?, last access). O(1).
  [[nodiscard]] key_type key(const meta_type& m) const noexcept {
    return {static_cast<std::uint8_t>(m.hits >= protected_threshold ? 1 : 0), m.last_access};
  }
};

/// Most recently used first (SGLang's "mru"): for workloads that scan a set of
/// prompts larger than the cache, where the newest prefix is the least likely to
/// be seen again before the others. A touch makes a key smaller, so the cache
/// re-keys eagerly (O(log leaves) per touched leaf).
struct Mru {
  /// Last access tick.
  struct meta_type {
    std::uint64_t last_access = 0;  ///< Tick of the last match or insert through the node.
  };
  using key_type = std::uint64_t;               ///< Max tick minus the last access tick.
  static constexpr bool monotone_keys = false;  ///< Accesses make keys smaller.

  /// New node: accessed now. O(1).
  meta_type on_create(const PagedPolicyContext& c) noexcept { return {c.tick}; }
  /// Match: accessed now. O(1).
  void on_match(meta_type& m, const PagedPolicyContext& c) noexcept { m.last_access = c.tick; }
  /// Insert through the node: accessed now. O(1).
  void on_insert_hit(meta_type& m, const PagedPolicyContext& c) noexcept { m.last_access = c.tick; }
  /// Nothing to remember. O(1).
  void on_evict(const meta_type&, const PagedPolicyContext&) noexcept {}
  /// Newest access first. O(1).
  [[nodiscard]] key_type key(const meta_type& m) const noexcept { return ~m.last_access; }
};

/// First in, last out (SGLang's "filo"): the newest pages are evicted first.
struct Filo {
  /// Creation tick.
  struct meta_type {
    std::uint64_t created = 0;  ///< Tick of the insert that stored the pages.
  };
  using key_type = std::uint64_t;              ///< Max tick minus the creation tick.
  static constexpr bool monotone_keys = true;  ///< Keys never change.

  /// New node: created now. O(1).
  meta_type on_create(const PagedPolicyContext& c) noexcept { return {c.tick}; }
  /// No change. O(1).
  void on_match(meta_type&, const PagedPolicyContext&) noexcept {}
  /// No change. O(1).
  void on_insert_hit(meta_type&, const PagedPolicyContext&) noexcept {}
  /// Nothing to remember. O(1).
  void on_evict(const meta_type&, const PagedPolicyContext&) noexcept {}
  /// Newest creation first. O(1).
  [[nodiscard]] key_type key(const meta_type& m) const noexcept { return ~m.created; }
};

static_assert(PagedEvictionPolicy<Lru>);
static_assert(PagedEvictionPolicy<Lfu>);
static_assert(PagedEvictionPolicy<Fifo>);
static_assert(PagedEvictionPolicy<Priority>);
static_assert(PagedEvictionPolicy<Slru>);
static_assert(PagedEvictionPolicy<Mru>);
static_assert(PagedEvictionPolicy<Filo>);

}  // namespace eviction

}  // namespace promptcache
