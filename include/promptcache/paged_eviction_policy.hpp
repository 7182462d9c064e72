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
// Optionally, a policy sorts leaves into K key classes, one heap each (ARC's
// two lists, say), and says which class to evict from:
//
//     static constexpr std::size_t key_classes = K;                 // 1 <= K <= 64
//     std::size_t key_class(const meta_type&) const;                // < K
//     std::size_t choose_class(std::span<const std::size_t> pages); // pages cached per class
//
// The cache counts the cached pages of each class (locked ones included), and
// before each page it evicts asks choose_class which class to take the leaf with
// the smallest key from; when that class has no evictable leaf it takes the first
// class after it (cyclically) that has one. The ordering of two leaves in
// different classes can thus change with the policy's own state (an adaptive
// target), which one key per node cannot express. Without `key_classes` a policy
// has one class and the cache behaves exactly as described above. A policy may
// also offer
//
//     std::size_t choose_class(std::span<const std::size_t> pages,
//                              std::span<const key_type* const> tops);
//
// which the cache then calls instead, with the key of each class's next victim
// (its evictable leaf with the smallest key; nullptr when it has none), valid
// during the call only: a policy can then compare classes by their keys.
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
// - key_class() depends on the metadata alone, like key(); when a hook changes a
//   node's class the cache moves it to its new heap at once (O(log leaves)).
// - Hooks and choose_class must not throw: the cache calls them from noexcept functions
//   (mid-update), so an exception escaping one calls std::terminate.
// The policy object is a member of the cache (constructed from the instance
// given to the cache), so it may keep state of its own: ghost lists, adaptive
// targets, counters.
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
#endif
#if !defined(PROMPTCACHE_PAGED_EVICTION_POLICY_HPP) && \
    (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) >= 202002L
#define PROMPTCACHE_PAGED_EVICTION_POLICY_HPP

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "promptcache/detail/paged_ghost_history.hpp"
#include "promptcache/detail/paged_shadow_cache.hpp"

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
  /// Depth of the first page of `tokens`: the number of pages before it on its
  /// path (the node's first page, except for on_evict of a tail).
  std::size_t depth_pages = 0;
  /// on_evict: the pages being freed now (the node's tail, all of them when
  /// `whole_node`); other hooks: the node's pages. One page is page_size tokens.
  std::span<const std::uint32_t> tokens{};
  /// on_evict: true when the node goes away entirely (not just its tail).
  bool whole_node = false;
  /// Tokens per page (the cache's page size), to cut `tokens` into pages.
  std::size_t page_size = 0;
};

namespace detail {

// A policy without `key_classes` keeps all leaves in one heap.
template <class P>
concept PagedSingleKeyClass = !requires {
  P::key_classes;
};

// A policy with `key_classes` = K >= 1 files each leaf under key_class(meta) < K
// and picks the class to evict from with choose_class(cached pages per class).
template <class P>
concept PagedKeyClasses = requires(P& p, const P& cp, const typename P::meta_type& cm,
                                   std::span<const std::size_t> pages) {
  { P::key_classes } -> std::convertible_to<std::size_t>;
  { cp.key_class(cm) } -> std::convertible_to<std::size_t>;
  { p.choose_class(pages) } -> std::convertible_to<std::size_t>;
}
&&(P::key_classes >= 1) && (P::key_classes <= 64);

// The metadata of the policies that count hits (Lfu, Slru) and its updates, which
// both share: they differ only in how they order it. As in SGLang, a hit is an
// insert through the node (an engine inserts every request's tokens when it
// finishes, so this counts the requests that used the prefix); match() only
// refreshes the access time. A split copies the count to both halves.
struct PagedHitMeta {
  std::uint64_t hits = 0;         ///< Inserts through the node (1 at creation).
  std::uint64_t last_access = 0;  ///< Tick of the last match or insert.

  // insert() created the node: one hit, accessed now.
  static constexpr PagedHitMeta created(const PagedPolicyContext& c) noexcept {
    return {1, c.tick};
  }
  // match() walked the node: accessed now, not a hit.
  constexpr void matched(const PagedPolicyContext& c) noexcept { last_access = c.tick; }
  // insert() walked the node: a hit, accessed now.
  constexpr void inserted(const PagedPolicyContext& c) noexcept {
    ++hits;
    last_access = c.tick;
  }
};

}  // namespace detail

/// Number of key classes (evictable heaps) of policy `P`: its `key_classes`, else 1.
template <class P>
inline constexpr std::size_t paged_key_classes = [] {
  if constexpr (requires { P::key_classes; })
    return static_cast<std::size_t>(P::key_classes);
  else
    return std::size_t{1};
}();

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
} &&(detail::PagedSingleKeyClass<P> || detail::PagedKeyClasses<P>);

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
  /// Hit count and last access tick (`hits`, `last_access`; the same type as Slru's).
  using meta_type = detail::PagedHitMeta;
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
  meta_type on_create(const PagedPolicyContext& c) noexcept { return meta_type::created(c); }
  /// Match: accessed now (not a hit, as in SGLang). O(1).
  void on_match(meta_type& m, const PagedPolicyContext& c) noexcept { m.matched(c); }
  /// Insert through the node: a hit, accessed now. O(1).
  void on_insert_hit(meta_type& m, const PagedPolicyContext& c) noexcept { m.inserted(c); }
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

  /// Hit count and last access tick, updated as Lfu's (the same type).
  using meta_type = detail::PagedHitMeta;
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
  meta_type on_create(const PagedPolicyContext& c) noexcept { return meta_type::created(c); }
  /// Match: accessed now. O(1).
  void on_match(meta_type& m, const PagedPolicyContext& c) noexcept { m.matched(c); }
  /// Insert through the node: a hit, accessed now. O(1).
  void on_insert_hit(meta_type& m, const PagedPolicyContext& c) noexcept { m.inserted(c); }
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

/// ARC (Megiddo & Modha, FAST'03) adapted to a prefix cache that evicts leaves
/// only, with LRU as a fallback it picks online. Pages used once since they
/// were stored (classes 0 and 2, ARC's T1) and pages used again (class 1, T2)
/// are each evicted least recently used first; before each page the policy
/// picks the class to evict from by following one of four rules ("experts"):
///  - LRU: the class whose least recent leaf is older (the cache passes each
///    class's next victim's key, so following this expert evicts exactly as
///    eviction::Lru does; called without the keys, the policy takes them to be
///    those of the last leaf it evicted per class, a bound that can be stale);
///  - ARC: T1 while T1 holds more than an adaptive target p of pages, else T2;
///  - used-once first: T1 whenever it has pages;
///  - cold first: the cold part of T1 whenever it has an evictable leaf, else
///    as LRU. A run stored with more new pages than the prefix it extends (a
///    request whose cached prefix was lost, a new document) is filed cold
///    (class 2), except one such run in 32, so that under thrashing the cache
///    keeps a set of prefixes whole and that set still changes with the
///    traffic (BIP's insertion, Qureshi et al., ISCA'07). For the other
///    rules cold pages are T1 pages (T1 is classes 0 and 2, taken by the
///    older of their next victims).
/// Fingerprints of evicted pages stay on ghost lists (B1, B2) for `ghost_factor`
/// x `capacity_pages` evictions: a page stored again while on B1 raises p, one
/// on B2 lowers it (ARC's rule).
///
/// Which expert to follow is measured, not guessed: each expert runs a
/// miniature cache (miniature simulation, Waldspurger et al., USENIX ATC'17)
/// over a hash-sampled subset of the pages the cache sees (1 in 2^k, k the
/// smallest with capacity_pages / 2^k <= 2048; every page for small caches) with
/// the capacity scaled by the same rate, the classes the policy gives the pages
/// and p scaled alike. The policy follows the expert whose miniature served the
/// most hits, LRU on a tie (counts halve every 32 x the miniature's capacity of
/// sampled accesses, so the choice follows changes in the traffic). One signal
/// adds to the hits: when over 65% of all pages stored again come back more
/// than 2 x `capacity_pages` evictions after they left, the cache is
/// thrashing: no recency order can keep such pages, while keeping pages used
/// again and letting new ones go keeps part of them, so the policy follows
/// used-once first as long as its miniature serves at least as many hits as
/// LRU's and cold-first's. The miniatures see every access whatever the policy follows (only
/// the classes come from the cache), so the measure hardly depends on the
/// choice it drives, as a rate of the policy's own mistakes would. The pages
/// one insert stores are one node, so they share a class: used again when all
/// of them come back from the ghost lists, used once when the run also brings
/// new pages. A later match or insert through a node counts as a use.
class Adaptive {
 public:
  /// 0: used once (T1), 1: used again (T2), 2: used once and stored cold (part of T1).
  static constexpr std::size_t key_classes = 3;
  /// LRU (0), ARC (1), used-once first (2), cold first (3).
  static constexpr std::size_t experts = 4;

  /// Last access tick and whether the node was used again.
  struct meta_type {
    std::uint64_t last_access = 0;  ///< Tick of the last match or insert through the node.
    std::uint8_t reused = 0;        ///< 1 once matched or inserted again, or back from a ghost.
    std::uint8_t cold = 0;          ///< 1 when stored cold (see the class comment).
  };
  using key_type = std::uint64_t;              ///< The last access tick, within a class.
  static constexpr bool monotone_keys = true;  ///< Accesses only move the tick forward.

  /// What choose_class follows.
  enum class Mode : std::uint8_t {
    learned,  ///< The expert whose miniature cache serves most (see the class comment); the
              ///< default.
    arc,      ///< ARC's rule alone (the ARC expert, never LRU or used-once first).
  };

  /// A policy for a cache of about `capacity_pages` pages (the engine's page
  /// pool): the target p stays in [0, capacity_pages], the ghost history
  /// remembers ghost_factor x capacity_pages evicted pages (fixed memory, about
  /// 34 bytes per ghost) and each expert's miniature cache holds up to 2048
  /// sampled pages (about 25 bytes each). A capacity or factor of 0 keeps no
  /// history and no miniatures: p stays 0 and the policy follows LRU (Mode::arc:
  /// pages used again are always kept over pages used once). `step` scales each
  /// move of p (1: ARC's rule). Throws std::invalid_argument for a negative or
  /// non-finite factor or step, std::bad_alloc / std::length_error for a history
  /// too large. `mode` picks what the policy follows (Mode::arc: ARC's rule alone,
  /// with no fallback on LRU).
  explicit Adaptive(std::size_t capacity_pages, double ghost_factor = 8.0, double step = 1.0,
                    Mode mode = Mode::learned)
      : capacity_(capacity_pages),
        step_(check(step)),
        mode_(mode),
        ghosts_(ghost_slots(capacity_pages, check(ghost_factor))) {
    if (mode_ != Mode::learned || ghosts_.capacity() == 0) return;
    while ((capacity_ >> shift_) > shadow_pages)
      ++shift_;
    const std::size_t n = capacity_ >> shift_;
    shadows_[0] = detail::PagedShadowCache(n, detail::PagedShadowCache::Rule::lru);
    shadows_[1] = detail::PagedShadowCache(n, detail::PagedShadowCache::Rule::arc);
    shadows_[2] = detail::PagedShadowCache(n, detail::PagedShadowCache::Rule::used_once);
    shadows_[3] = detail::PagedShadowCache(n, detail::PagedShadowCache::Rule::used_once);
  }
  /// Takes over `o`'s state, ghost history and miniatures. `o` keeps its capacity and
  /// step, with no ghost history, no miniatures and a target of 0 (as a policy of
  /// capacity 0 keeps). O(1).
  Adaptive(Adaptive&& o) noexcept
      : capacity_(o.capacity_),
        step_(o.step_),
        mode_(o.mode_),
        p_(std::exchange(o.p_, 0.0)),
        ghosts_(std::move(o.ghosts_)) {
    take_state(o);
  }
  /// As the move constructor; self-move changes nothing. O(1).
  Adaptive& operator=(Adaptive&& o) noexcept {
    if (this == &o) return *this;
    capacity_ = o.capacity_;
    step_ = o.step_;
    mode_ = o.mode_;
    p_ = std::exchange(o.p_, 0.0);
    ghosts_ = std::move(o.ghosts_);
    take_state(o);
    return *this;
  }
  /// Not copyable (the ghost history is not).
  Adaptive(const Adaptive&) = delete;
  /// Not copy-assignable.
  Adaptive& operator=(const Adaptive&) = delete;
  /// Frees the ghost history and the miniatures. O(1).
  ~Adaptive() = default;

  /// New node: used again when every one of its pages was on a ghost list, else
  /// used once; each ghost found moves the target. Its sampled pages go to the
  /// miniatures. O(pages of the node).
  meta_type on_create(const PagedPolicyContext& c) noexcept {
    meta_type m{c.tick, 0};
    if (c.page_size == 0 || ghosts_.capacity() == 0) return m;
    const std::size_t pages = c.tokens.size() / c.page_size;
    std::size_t back = 0;
    for (std::size_t i = 0; i < pages; ++i) {
      std::size_t age = 0;
      const std::uint8_t tag = ghosts_.take(fingerprint(c, i), age);
      if (tag == 0) continue;
      adapt(tag & 3);
      count_return(age);
      ++back;
    }
    m.reused = pages > 0 && back == pages ? 1 : 0;
    // Cold: more new pages than the prefix they extend, except one such run in
    // 32 (so that the pages kept change as the traffic does).
    if (mode_ == Mode::learned && m.reused == 0 && pages > c.depth_pages &&
        ++cold_runs_ % admit_period != 0)
      m.cold = 1;
    feed(c, key_class(m), true);
    return m;
  }
  /// Match: used again, accessed now; its sampled pages go to the miniatures.
  /// O(pages of the node).
  void on_match(meta_type& m, const PagedPolicyContext& c) noexcept {
    m.last_access = c.tick;
    m.reused = 1;
    feed(c, 1, true);
  }
  /// Insert through the node: used again, accessed now; its sampled pages go to
  /// the miniatures (not counted as hits: the match before it was). O(pages of the node).
  void on_insert_hit(meta_type& m, const PagedPolicyContext& c) noexcept {
    m.last_access = c.tick;
    m.reused = 1;
    feed(c, 1, false);
  }
  /// The freed pages go on the ghost list of their class, deepest first (the
  /// order the cache frees them in). O(pages freed).
  void on_evict(const meta_type& m, const PagedPolicyContext& c) noexcept {
    const std::size_t k = key_class(m);
    oldest_[k] = std::max(oldest_[k], m.last_access);
    if (c.page_size == 0 || ghosts_.capacity() == 0) return;
    const std::size_t pages = c.tokens.size() / c.page_size;
    const auto tag = static_cast<std::uint8_t>(m.reused != 0 ? 2 : 1);
    for (std::size_t i = pages; i-- > 0;)
      ghosts_.push(fingerprint(c, i), tag);
  }
  /// Oldest access first within a class. O(1).
  [[nodiscard]] key_type key(const meta_type& m) const noexcept { return m.last_access; }
  /// T1 (0), T2 (1) or T1 stored cold (2). O(1).
  [[nodiscard]] std::size_t key_class(const meta_type& m) const noexcept {
    return m.reused != 0 ? 1 : m.cold != 0 ? 2 : 0;
  }
  /// The class of the leading expert (Mode::arc: ARC's). O(experts).
  [[nodiscard]] std::size_t choose_class(std::span<const std::size_t> pages) noexcept {
    if (pages.size() < key_classes) return pages.size() > 1 && pages[0] == 0 ? 1 : 0;
    const key_type* tops[key_classes];
    for (std::size_t k = 0; k < key_classes; ++k)
      tops[k] = pages[k] > 0 ? &oldest_[k] : nullptr;
    return choose(pages, tops);
  }

  /// As choose_class(pages), with the LRU expert judging the classes by `tops`,
  /// the keys of their next victims (nullptr: none evictable; the cache passes
  /// them). O(experts).
  [[nodiscard]] std::size_t choose_class(std::span<const std::size_t> pages,
                                         std::span<const key_type* const> tops) noexcept {
    if (tops.size() < key_classes || pages.size() < key_classes) return choose_class(pages);
    const key_type* t[key_classes] = {tops[0], tops[1], tops[2]};
    return choose(pages, t);
  }

  /// The adaptive target size of T1, in pages. O(1).
  [[nodiscard]] double target() const noexcept { return p_; }
  /// The expert followed now: 0 LRU, 1 ARC, 2 used-once first, 3 cold first
  /// (Mode::arc: 1). O(experts).
  [[nodiscard]] std::size_t leader() const noexcept {
    if (mode_ == Mode::arc) return 1;
    if (thrashing() && hits_[2] >= hits_[0] && hits_[2] >= hits_[3]) return 2;
    std::size_t best = 0;
    for (std::size_t e = 1; e < experts; ++e)
      if (hits_[e] > hits_[best]) best = e;
    return best;
  }
  /// Recent hits of expert `e`'s (< experts) miniature cache (counts halve every
  /// 32 x its capacity of sampled accesses; 0 without miniatures or for e >= experts). O(1).
  [[nodiscard]] double sampled_hits(std::size_t e) const noexcept {
    return e < experts ? hits_[e] : 0.0;
  }
  /// Pages each miniature holds at most (0: none, Mode::arc or no history); one
  /// page in 2^sample_shift() is sampled. O(1).
  [[nodiscard]] std::size_t sampled_capacity() const noexcept { return shadows_[0].capacity(); }
  /// log2 of the sampling rate's inverse. O(1).
  [[nodiscard]] std::size_t sample_shift() const noexcept { return shift_; }
  /// True when over 65% of the pages stored again (recent counts) came back
  /// more than 2 x capacity_pages evictions after they left. O(1).
  [[nodiscard]] bool thrashing() const noexcept {
    return mode_ == Mode::learned && far_returns_ > thrash_share * returns_;
  }
  /// Ghosts on B1 (evicted while used once) and on B2 (evicted after reuse). O(1).
  [[nodiscard]] std::size_t ghosts_once() const noexcept { return ghosts_.size(1); }
  /// Ghosts evicted after reuse (B2). O(1).
  [[nodiscard]] std::size_t ghosts_reused() const noexcept { return ghosts_.size(2); }
  /// Ghosts remembered at most. O(1).
  [[nodiscard]] std::size_t ghost_capacity() const noexcept { return ghosts_.capacity(); }

 private:
  // Pages a miniature holds at most: enough that a 2% difference in hits is
  // more than sampling noise, little enough that three cost ~150 KB.
  static constexpr std::size_t shadow_pages = 2048;
  // Hit counts halve every decay x the miniature's capacity of sampled accesses.
  static constexpr double decay = 32.0;
  // One cold run in admit_period is stored as a plain used-once run (BIP's 1/32).
  static constexpr std::uint64_t admit_period = 32;
  // A return is far when it comes back more than far_age x capacity evictions
  // after it left, and the cache thrashes when far returns are over
  // thrash_share of all. Chosen on the shipped trace and three generated shapes
  // (docs/replay.md, "The thrashing rule"): used-once first gains where far returns are over
  // 62% (shipped trace, 0.25-1M; conversations at 0.25M; shared prompts up to
  // 1M) and loses where they are under 60% (conversations from 0.5M, agent loops).
  static constexpr double far_age = 2.0;
  static constexpr double thrash_share = 0.65;

  static double check(double v) {
    if (!(v >= 0.0) || v > 1e9)
      throw std::invalid_argument("eviction::Adaptive: factors must be finite and >= 0");
    return v;
  }
  static std::size_t ghost_slots(std::size_t capacity, double factor) {
    const double n = factor * static_cast<double>(capacity);
    if (n >= static_cast<double>(std::size_t{1} << 30))
      throw std::length_error("eviction::Adaptive: ghost history over 2^30 pages");
    return static_cast<std::size_t>(n);
  }
  [[nodiscard]] static std::uint64_t fingerprint(const PagedPolicyContext& c,
                                                 std::size_t i) noexcept {
    return detail::ghost_fingerprint<std::uint32_t>(c.ns, c.depth_pages + i,
                                                    c.tokens.subspan(i * c.page_size, c.page_size));
  }
  void take_state(Adaptive& o) noexcept {
    for (std::size_t e = 0; e < experts; ++e) {
      shadows_[e] = std::move(o.shadows_[e]);
      hits_[e] = std::exchange(o.hits_[e], 0.0);
    }
    for (std::size_t k = 0; k < key_classes; ++k)
      oldest_[k] = std::exchange(o.oldest_[k], 0);
    shift_ = std::exchange(o.shift_, 0);
    cold_runs_ = std::exchange(o.cold_runs_, 0);
    accesses_ = std::exchange(o.accesses_, 0.0);
    returns_ = std::exchange(o.returns_, 0.0);
    far_returns_ = std::exchange(o.far_returns_, 0.0);
  }
  // The class the leading expert evicts from, given each class's next victim
  // (nullptr: none). T1 is classes 0 and 2, each taken by its older leaf.
  [[nodiscard]] std::size_t choose(std::span<const std::size_t> pages,
                                   const key_type* const (&tops)[key_classes]) const noexcept {
    auto older = [&](std::size_t a, std::size_t b) {
      return tops[a] == nullptr ? b : tops[b] == nullptr ? a : (*tops[b] < *tops[a] ? b : a);
    };
    const std::size_t lru = older(older(0, 2), 1);
    const std::size_t t1 = older(0, 2);
    const bool t1_pages = pages[0] + pages[2] > 0 && tops[t1] != nullptr;
    switch (leader()) {
      case 0:
        return lru;
      case 1:
        return t1_pages && static_cast<double>(pages[0] + pages[2]) > p_ ? t1 : 1;
      case 2:
        return t1_pages ? t1 : 1;
      default:
        return tops[2] != nullptr ? 2 : lru;
    }
  }
  // The pages of the node `c` names, as the miniatures see them: a page is
  // sampled when the top shift_ bits of its key are 0 (top bits, since the
  // miniatures' index uses the low ones); `hit` says whether a page held counts.
  void feed(const PagedPolicyContext& c, std::size_t list, bool hit) noexcept {
    if (shadows_[0].capacity() == 0 || c.page_size == 0) return;
    const std::size_t pages = c.tokens.size() / c.page_size;
    const double target = std::ldexp(p_, -static_cast<int>(shift_));
    for (std::size_t i = 0; i < pages; ++i) {
      const std::uint64_t k = sample_key(c, i);
      if (shift_ > 0 && (k >> (64 - shift_)) != 0) continue;
      // ARC and used-once first see cold pages as T1; cold first files them
      // apart (list 0, evicted first) from the rest in one recency order.
      const std::size_t t = list == 2 ? 0 : list;
      const std::size_t to[experts] = {0, t, t, list == 2 ? 0U : 1U};
      for (std::size_t e = 0; e < experts; ++e)
        if (shadows_[e].access(k, to[e], c.tick, target) && hit) hits_[e] += 1.0;
      if (hit && (accesses_ += 1.0) > decay * static_cast<double>(shadows_[0].capacity())) {
        accesses_ = 0.0;
        for (double& h : hits_)
          h *= 0.5;
      }
    }
  }
  // A key of page i of the node: its namespace, depth and three of its tokens
  // (cheaper than the ghost fingerprint: it is computed for every page touched).
  [[nodiscard]] static std::uint64_t sample_key(const PagedPolicyContext& c,
                                                std::size_t i) noexcept {
    const std::span<const std::uint32_t> t = c.tokens.subspan(i * c.page_size, c.page_size);
    const std::uint32_t three[3] = {t[0], t[t.size() / 2], t[t.size() - 1]};
    return detail::ghost_fingerprint<std::uint32_t>(c.ns ^ 0x5a3b1e55ULL, c.depth_pages + i,
                                                    std::span<const std::uint32_t>(three));
  }
  // ARC's adaptation: a B1 hit grows p by max(|B2| / |B1|, 1), a B2 hit shrinks
  // it by max(|B1| / |B2|, 1), both scaled by step (sizes before the hit left).
  void adapt(std::uint8_t list) noexcept {
    const double b1 = static_cast<double>(ghosts_.size(1)) + (list == 1 ? 1.0 : 0.0);
    const double b2 = static_cast<double>(ghosts_.size(2)) + (list == 2 ? 1.0 : 0.0);
    if (list == 1)
      p_ = std::min(static_cast<double>(capacity_), p_ + step_ * std::max(b2 / b1, 1.0));
    else
      p_ = std::max(0.0, p_ - step_ * std::max(b1 / b2, 1.0));
  }
  // Counts a page stored again `age` evictions after it left, halving the
  // counts once they pass 4 x capacity (at least 64) so that they describe the
  // recent traffic.
  void count_return(std::size_t age) noexcept {
    returns_ += 1.0;
    if (static_cast<double>(age) >= far_age * static_cast<double>(capacity_)) far_returns_ += 1.0;
    if (returns_ > std::max(64.0, 4.0 * static_cast<double>(capacity_))) {
      returns_ *= 0.5;
      far_returns_ *= 0.5;
    }
  }

  std::size_t capacity_;
  double step_;
  Mode mode_;
  double p_ = 0.0;
  detail::PagedGhostHistory ghosts_;
  detail::PagedShadowCache shadows_[experts];      // each expert's miniature cache
  double hits_[experts] = {0.0, 0.0, 0.0, 0.0};    // their recent hits
  std::size_t shift_ = 0;                          // one page in 2^shift_ is sampled
  double accesses_ = 0.0;                          // sampled accesses since the last halving
  std::uint64_t oldest_[key_classes] = {0, 0, 0};  // key of the last leaf evicted per class
  std::uint64_t cold_runs_ = 0;                    // runs that qualified as cold
  double returns_ = 0.0;                           // pages stored again from the ghosts
  double far_returns_ = 0.0;                       // of those, back after 2 x capacity
};

static_assert(PagedEvictionPolicy<Lru>);
static_assert(PagedEvictionPolicy<Lfu>);
static_assert(PagedEvictionPolicy<Fifo>);
static_assert(PagedEvictionPolicy<Priority>);
static_assert(PagedEvictionPolicy<Slru>);
static_assert(PagedEvictionPolicy<Mru>);
static_assert(PagedEvictionPolicy<Filo>);
static_assert(PagedEvictionPolicy<Adaptive>);

}  // namespace eviction

}  // namespace promptcache

#endif  // PROMPTCACHE_PAGED_EVICTION_POLICY_HPP
