// promptcache: paged_prefix_cache.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The prefix cache of a paged-KV engine (the design of SGLang's RadixCache and
// vLLM's block pool): a radix tree over token ids at page granularity whose
// nodes carry the engine's page ids. The engine owns its KV pages and their
// allocator; the cache owns only the index. Running requests lock their path
// so their pages are never evicted; evict() frees unlocked leaf pages in the
// order of a pluggable policy (paged_eviction_policy.hpp) and hands each page
// id back to the engine. Every change a router must know about is published as
// a KvEvent (kv_index.hpp) carrying Dynamo block hashes (block_hash.hpp), so a
// KvIndex fed by the events answers exactly what this cache would match.
//
// Layout: nodes live in one index-addressed vector; a node's token ids and page
// ids share one allocation. With an event sink a node keeps only the sequence
// hash of its last page (what a child's Stored event names as its parent); the
// hashes of its other pages are recomputed from its tokens when they are
// evicted, which keeps the index at a few bytes per page. Child edges of all nodes sit in
// one hash table keyed by (parent, first token), and the evictable leaves in
// one binary heap ordered by the policy key, so match and insert cost
// O(tokens) and evict O(log leaves) per node it touches, whatever the size.
//
// Not thread-safe: one engine scheduler thread owns a cache.
//
// The class below is the policy (what insert, evict, erase and clear do in which
// order, the exception-safety steps, namespace configuration, invariants); the
// mechanisms are named parts in detail/, over one shared state:
//   paged_state.hpp           the state: nodes, blocks, edges, heaps, namespaces, counters
//   paged_tree.hpp            the radix tree: node slots, child lookup, splits, leaves
//   paged_blocks.hpp          a node's token and page ids in one block; compaction keeps
//                             them within twice what is cached
//   paged_locks.hpp           lock counts along a path
//   paged_eviction_order.hpp  heaps of evictable leaves per key class, the policy hooks
//   paged_match.hpp           the match walk (and peek)
//   paged_removal.hpp         evict, erase a namespace, clear: pages back to the engine
//   paged_events.hpp          block hashes, the KV events, event ids, the sink's guard
//   paged_namespaces.hpp      namespace slots, seeds and default seeds
// and the edge table under them (paged_edge_table.hpp).
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
#endif
#if !defined(PROMPTCACHE_PAGED_PREFIX_CACHE_HPP) && \
    (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) >= 202002L
#define PROMPTCACHE_PAGED_PREFIX_CACHE_HPP

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "promptcache/block_hash.hpp"
#include "promptcache/detail/paged_blocks.hpp"
#include "promptcache/detail/paged_edge_table.hpp"
#include "promptcache/detail/paged_events.hpp"
#include "promptcache/detail/paged_eviction_order.hpp"
#include "promptcache/detail/paged_locks.hpp"
#include "promptcache/detail/paged_match.hpp"
#include "promptcache/detail/paged_namespaces.hpp"
#include "promptcache/detail/paged_removal.hpp"
#include "promptcache/detail/paged_state.hpp"
#include "promptcache/detail/paged_tree.hpp"
#include "promptcache/kv_index.hpp"
#include "promptcache/paged_eviction_policy.hpp"

namespace promptcache {

/// A position in a PagedPrefixCache: the end of a matched or inserted prefix.
/// Lock it while a request runs on those pages. An empty handle stands for the
/// empty prefix. A handle goes stale when its node is evicted, trimmed, erased
/// or cleared (which can happen only while it is unlocked); stale handles are
/// refused by lock() and unlock(). Splits never make a handle stale.
struct PagedPrefixHandle {
  std::uint32_t node = 0xFFFFFFFFU;  ///< Node index (opaque).
  std::uint32_t generation = 0;      ///< Node generation when the handle was made (opaque).
  /// True for the empty prefix (a match of zero pages). O(1).
  [[nodiscard]] constexpr bool empty() const noexcept { return node == 0xFFFFFFFFU; }
  /// Memberwise equality. O(1).
  friend constexpr bool operator==(const PagedPrefixHandle&, const PagedPrefixHandle&) = default;
};

/// Counters (since construction) and gauges (current) of a PagedPrefixCache.
struct PagedCacheStats {
  std::uint64_t lookups = 0;          ///< match() calls.
  std::uint64_t query_tokens = 0;     ///< Sum of query lengths over match() calls.
  std::uint64_t hit_tokens = 0;       ///< Sum of matched tokens over match() calls.
  std::uint64_t inserts = 0;          ///< insert() calls that were accepted.
  std::uint64_t inserted_pages = 0;   ///< Pages newly stored by insert().
  std::uint64_t duplicate_pages = 0;  ///< Engine pages reported as duplicates by insert().
  std::uint64_t evicted_pages = 0;    ///< Pages freed by evict().
  std::uint64_t erased_pages = 0;     ///< Pages freed by erase_namespace().
  std::uint64_t cleared_pages = 0;    ///< Pages freed by clear().
  std::uint64_t splits = 0;           ///< Nodes split by a match or insert ending inside them.
  std::uint64_t events = 0;           ///< Event ids consumed (a throwing sink's included).
  std::size_t cached_pages = 0;       ///< Gauge: pages in the cache.
  std::size_t locked_pages = 0;       ///< Gauge: pages on the path of at least one lock.
  std::size_t nodes = 0;              ///< Gauge: tree nodes (namespace roots not counted).
};

/// What a token sink (PagedPrefixCache's second sink form) receives beside each event:
/// for a Stored event, the namespace and the token ids of the new pages, which a
/// publisher needs to send them on (vLLM's BlockStored carries token ids). Empty for
/// other events. Valid only during the sink call.
struct PagedStoredPages {
  std::uint64_t ns = 0;                   ///< The namespace the pages were stored in.
  std::span<const std::uint32_t> tokens;  ///< page_size tokens per new page, root side first.
};

/// Memory held by a PagedPrefixCache, split into the index and the token ids it indexes.
struct PagedCacheMemory {
  std::size_t index_bytes = 0;  ///< Nodes, page ids, block hashes, edge table, heap, namespaces.
  std::size_t token_bytes = 0;  ///< Token ids kept to compare queries against.
};

/// The prefix cache (see the file comment).
///
/// - `PageId`: the engine's page id type (any integral type but bool).
/// - `Policy`: the eviction policy (paged_eviction_policy.hpp); eviction::Lru by default.
///
/// Costs below: T = tokens of the call, P = pages of the call, L = evictable
/// leaves, N = nodes. Invalidation: results are values (vectors, counts,
/// handles); a handle is invalidated only as PagedPrefixHandle says.
/// Exception safety: see each member. The eviction callbacks must not throw. The
/// event sink may throw; a sink that throws is taken not to have published the event
/// (its id stays consumed, so a router sees the gap and resyncs). insert() calls the
/// sink before it changes anything, so a throwing sink leaves the cache unchanged;
/// evict(), erase_namespace() and clear() call it after their change, which stands
/// (their callbacks have run) while the exception propagates.
/// Reentrance: while the sink runs, the cache is mid-change (insert has found its path
/// and reserved its space but not stored yet), so every non-const member called from
/// the sink changes nothing and throws std::logic_error (lock() and unlock(), which never
/// throw, return false); const members (peek, valid, stats, ...) answer as usual. The
/// sink must not move, move-assign or destroy the cache that calls it.
template <std::integral PageId = std::uint32_t, PagedEvictionPolicy Policy = eviction::Lru>
class PagedPrefixCache {
  static_assert(!std::is_same_v<std::remove_cv_t<PageId>, bool>, "PageId must not be bool");
  static_assert(alignof(PageId) <= alignof(std::uint64_t), "PageId alignment above 8");

  // The types the parts (detail/paged_state.hpp) use.
  using Types = detail::PagedTypes<PageId, Policy, std::function<void(const KvEvent&)>,
                                   std::function<void(const KvEvent&, const PagedStoredPages&)>,
                                   PagedCacheStats, PagedPrefixHandle>;
  using State = detail::PagedCacheState<Types>;
  using Node = typename State::Node;
  using Tree = detail::PagedTree<Types>;
  using Order = detail::PagedEvictionOrder<Types>;
  using Locks = detail::PagedLocks<Types>;
  using Matches = detail::PagedMatchPath<Types>;
  using Removal = detail::PagedRemoval<Types>;
  static constexpr std::uint32_t npos = detail::paged_npos;
  // The moves throw only where the policy's move, or the sink's or a map's move
  // assignment, does (the vectors and the edge table never do).
  static constexpr bool nothrow_take = State::nothrow_take;
  static constexpr bool nothrow_move_construct =
      std::is_nothrow_move_constructible_v<Policy> && nothrow_take;
  static constexpr bool nothrow_move_assign =
      std::is_nothrow_move_assignable_v<Policy> && nothrow_take;

 public:
  using page_id = PageId;              ///< The engine's page id type.
  using token_type = std::uint32_t;    ///< Token ids (as hashed by Dynamo).
  using namespace_id = std::uint64_t;  ///< Tenant / model / adapter key.
  using policy_type = Policy;          ///< The eviction policy.
  /// Key classes of the policy: one heap of evictable leaves each (1 for most policies).
  static constexpr std::size_t classes = paged_key_classes<Policy>;
  /// Receives the KV events. It may read the cache through const members; a non-const
  /// call from it throws std::logic_error (see the class comment).
  using event_sink = std::function<void(const KvEvent&)>;
  /// The second sink form: also receives the tokens of stored pages (PagedStoredPages).
  using token_sink = std::function<void(const KvEvent&, const PagedStoredPages&)>;

  /// What match() found.
  struct MatchResult {
    std::size_t matched = 0;      ///< Matched tokens: a multiple of page_size().
    std::vector<PageId> pages{};  ///< The matched pages, root side first (matched / page_size).
    PagedPrefixHandle handle{};   ///< End of the match; lock it to keep the pages.
  };

  /// What match() found, when the pages go to a caller's vector.
  struct MatchEnd {
    std::size_t matched = 0;     ///< Matched tokens: a multiple of page_size().
    PagedPrefixHandle handle{};  ///< End of the match; lock it to keep the pages.
  };

  /// What insert() did.
  struct InsertResult {
    std::size_t cached_pages = 0;  ///< Leading pages that were already cached (kept as they were).
    std::size_t inserted_pages = 0;  ///< Pages newly stored (the engine's ids, now the cache's).
    /// Engine pages among the first cached_pages that differ from the cached ones: the
    /// cache keeps its own pages, so the engine frees these (SGLang's contract).
    std::vector<PageId> duplicates{};
    PagedPrefixHandle handle{};  ///< End of the stored prefix (empty when nothing was stored).
  };

  /// A cache of pages of `page_size` tokens, evicting with `policy`, publishing KV
  /// events to `sink` when given (pages are then hashed on insert and on eviction).
  /// Throws std::invalid_argument if page_size is 0 or above 2^20. O(1).
  explicit PagedPrefixCache(std::size_t page_size, Policy policy = Policy{}, event_sink sink = {})
      : state_(check_page_size(page_size), std::move(policy), std::move(sink)) {}
  /// As above, publishing to a token sink: `sink(event, pages)`, with the tokens of a
  /// Stored event's pages (the cache keeps them anyway: passing them costs nothing).
  /// Chosen for a callable taking both arguments. O(1).
  template <class TokenSink>
  requires std::is_invocable_v<TokenSink&, const KvEvent&, const PagedStoredPages&>
  PagedPrefixCache(std::size_t page_size, Policy policy, TokenSink sink)
      : state_(check_page_size(page_size), std::move(policy), detail::PagedTokenSinkTag{},
               token_sink(std::move(sink))) {}

  /// Not copyable (one cache per engine).
  PagedPrefixCache(const PagedPrefixCache&) = delete;
  /// Not copy-assignable.
  PagedPrefixCache& operator=(const PagedPrefixCache&) = delete;
  /// Takes over `other` (handles into it stay valid for the new object). `other` is left
  /// empty and usable: no namespaces, pages, events or counters, the same page size, its
  /// policy as Policy's move left it, and no sink (publishes_events() false). O(1).
  PagedPrefixCache(PagedPrefixCache&& other) noexcept(nothrow_move_construct)
      : state_(other.state_.blocks.page_size(), std::move(other.state_.policy)) {
    state_.take(other.state_);
  }
  /// Takes over `other` as the move constructor does, leaving `other` as it says; this
  /// cache's pages are dropped without callbacks. Self-move changes nothing. O(N).
  /// Invalidates this cache's handles, undetectably: an old handle whose index and
  /// generation happen to match one of `other`'s nodes is accepted (as a handle from
  /// another cache would be). If Policy's move assignment throws, nothing changed.
  PagedPrefixCache& operator=(PagedPrefixCache&& other) noexcept(nothrow_move_assign) {
    if (this == &other) return *this;
    // The policy first: it is the one member whose move may throw, so a throw leaves
    // this cache as it was.
    state_.policy = std::move(other.state_.policy);
    state_.take(other.state_);
    return *this;
  }
  /// Releases the index (not the engine's pages: the engine owns them). O(N).
  ~PagedPrefixCache() = default;

  // ---- namespaces -------------------------------------------------------------------------

  /// Sets the block-hash seed of namespace `ns` from a LoRA name and a cache salt
  /// (block_hash_seed()). A namespace never configured hashes with no LoRA name and,
  /// except namespace 0, its id in decimal as the cache salt, so distinct namespaces
  /// never share block hashes. Throws std::invalid_argument (nothing changed) if `ns`
  /// holds pages and the seed would change (published hashes would be wrong), if
  /// another namespace uses the seed, or if the seed is the default of another
  /// namespace id (no LoRA name and either no salt with `ns` != 0, or a salt that is
  /// another id in decimal), used or not: a router asking for that id would be
  /// answered with this namespace's blocks. O(names + 1) expected.
  void configure_namespace(namespace_id ns, std::string_view lora_name = {},
                           std::string_view cache_salt = {}) {
    if (state_.events.publishing()) detail::paged_throw_reentered();
    if (lora_name.empty() && detail::PagedNamespaces::names_other_namespace(cache_salt, ns))
      throw std::invalid_argument(
          "PagedPrefixCache: the seed is another namespace's default block-hash seed");
    const std::uint64_t seed = block_hash_seed(lora_name, cache_salt);
    const std::uint32_t slot = state_.namespaces.find(ns);
    if (slot != npos) {
      const detail::PagedNsSlot& s = state_.namespaces[slot];
      if (s.seed == seed) return;
      if (state_.nodes[s.root].first_child != npos)
        throw std::invalid_argument("PagedPrefixCache: namespace holds pages, seed cannot change");
      state_.namespaces.check_seed_free(seed, ns);
      state_.namespaces.reseed(slot, seed);  // strong
      return;
    }
    state_.namespaces.check_seed_free(seed, ns);
    Tree::open_namespace(state_, ns, seed);
  }

  /// The block-hash seed namespace `ns` uses (or would use) for its pages. O(1) expected.
  [[nodiscard]] std::uint64_t namespace_seed(namespace_id ns) const {
    const std::uint32_t slot = state_.namespaces.find(ns);
    return slot != npos ? state_.namespaces[slot].seed : detail::PagedNamespaces::default_seed(ns);
  }

  /// Number of namespaces known (configured or holding pages since their last erase). O(1).
  [[nodiscard]] std::size_t namespace_count() const noexcept { return state_.namespaces.size(); }

  // ---- lookups ----------------------------------------------------------------------------

  /// The longest cached page-aligned prefix of `tokens` in namespace `ns`: matched
  /// tokens, its pages and a handle to its end. Refreshes the policy metadata of the
  /// matched pages. A match ending inside a node splits it (no event: the blocks did
  /// not change). O(T); a split adds a node and one or two blocks and copies the smaller
  /// part of the node, and the larger too if its block would be at most half live. On
  /// std::bad_alloc the cached pages and every answer are unchanged; the walked pages'
  /// access metadata may have been refreshed. A walk splits at most once, after the
  /// split's allocations succeed, so a split remains only when growing the result vector
  /// throws after it.
  [[nodiscard]] MatchResult match(std::span<const token_type> tokens, namespace_id ns = 0) {
    MatchResult r;
    const MatchEnd e = match(tokens, ns, r.pages);
    r.matched = e.matched;
    r.handle = e.handle;
    return r;
  }

  /// As match() above, writing the pages to `pages` (cleared first) so a caller can
  /// reuse its capacity.
  MatchEnd match(std::span<const token_type> tokens, namespace_id ns, std::vector<PageId>& pages) {
    pages.clear();
    return ended(Matches::template walk<false>(
        state_, tokens, ns, tokens.size() / state_.blocks.page_size(),
        [&](std::size_t, const PageId* ids, std::size_t n) {
          pages.insert(pages.end(), ids, ids + n);
        },
        nullptr));
  }

  /// As match() above, writing the page ids to out[0, matched / page_size()), as an engine
  /// filling its own page table wants them; out's other entries are left as they were.
  /// Matches at most out.size() pages (a shorter span caps the match, splitting a node
  /// there like a shorter query would). Allocates only for a split; the cheapest match().
  /// If that split throws std::bad_alloc, out may already hold a prefix of the ids a
  /// successful call writes (never an entry past them); the cache is as above. out may be
  /// the query's own storage (out.data() == tokens.data()) when page_size() >= 2 or
  /// sizeof(PageId) <= 4: ids then land only on compared tokens. With 8-byte ids at page
  /// size 1 they would overwrite tokens still to compare: use separate storage.
  MatchEnd match(std::span<const token_type> tokens, namespace_id ns, std::span<PageId> out) {
    const std::size_t q_pages = std::min(tokens.size() / state_.blocks.page_size(), out.size());
    const auto emit = [&](std::size_t at, const PageId* ids, std::size_t n) {
      std::memcpy(out.data() + at, ids, n * sizeof(PageId));
    };
    // With one token per page the ids are as many bytes as the tokens: the compare copies
    // them in the same pass (see PagedTree::find_child).
    if (state_.blocks.page_size() == 1)
      return ended(Matches::template walk<true>(state_, tokens, ns, q_pages, emit, out.data()));
    return ended(Matches::template walk<false>(state_, tokens, ns, q_pages, emit, nullptr));
  }

  /// Matched tokens match() would report, without refreshing or splitting anything.
  /// O(T); never throws.
  [[nodiscard]] std::size_t peek(std::span<const token_type> tokens,
                                 namespace_id ns = 0) const noexcept {
    return Matches::peek(state_, tokens, ns);
  }

  // ---- locks ------------------------------------------------------------------------------

  /// Locks the prefix ending at `h`: its pages are not evicted until a matching
  /// unlock(). Locks nest (counted per node). Returns false, changing nothing, for a
  /// stale handle, when 2^32 - 1 locks are held in the namespace, or when called from the
  /// event sink; true (no-op) for an empty handle. O(nodes on the path + log L); never throws.
  bool lock(const PagedPrefixHandle& h) noexcept {
    if (state_.events.publishing()) return false;
    return Locks::lock(state_, h);
  }

  /// Releases one lock taken with lock() on a handle ending where `h` ends. Returns
  /// false, changing nothing, for a stale handle or when no such lock is held
  /// (unlocking below zero; locks of longer prefixes through `h` do not count), or when
  /// called from the event sink; true (no-op) for an empty handle. O(nodes on the path +
  /// log L); never throws.
  bool unlock(const PagedPrefixHandle& h) noexcept {
    if (state_.events.publishing()) return false;
    return Locks::unlock(state_, h);
  }

  /// True when `h` is empty or still names a cached prefix. O(1).
  [[nodiscard]] bool valid(const PagedPrefixHandle& h) const noexcept {
    return Tree::valid(state_, h);
  }

  /// Locks taken with handles ending where `h` ends and not yet released (0 for an
  /// empty or stale handle). O(1).
  [[nodiscard]] std::size_t lock_count(const PagedPrefixHandle& h) const noexcept {
    return Locks::count(state_, h);
  }

  // ---- insert / evict ---------------------------------------------------------------------

  /// Stores the page-aligned prefix of `tokens` (tokens.size() / page_size() pages)
  /// in namespace `ns`, with `pages[i]` the engine's page holding page i; pages past
  /// that count (the partial page) are ignored. Leading pages already cached keep
  /// their cached ids; engine ids that differ from them are returned as duplicates.
  /// The policy sees an insert hit on every cached page of the path and `priority`
  /// on the new ones. Publishes one Stored event for the new pages, before storing them.
  /// With no whole page it only counts the call (no namespace is created, nothing is
  /// checked but the page count). Throws std::invalid_argument if pages.size() is below
  /// the page count, or if `ns` is new and another namespace's configured seed equals its
  /// default (configure_namespace() refuses every seed that is another id's default by
  /// construction, so only a 64-bit collision of seeds gets here). O(T + log L).
  /// Strong guarantee for every exception, the sink's included: nothing was inserted and
  /// the engine still owns its pages (a throwing sink consumes the event id).
  InsertResult insert(std::span<const token_type> tokens, std::span<const PageId> pages,
                      namespace_id ns = 0, std::int64_t priority = 0) {
    if (state_.events.publishing()) detail::paged_throw_reentered();
    const std::size_t q_pages = tokens.size() / page_size();
    if (pages.size() < q_pages)
      throw std::invalid_argument("PagedPrefixCache::insert: fewer page ids than whole pages");
    InsertResult r;
    if (q_pages == 0) {
      ++state_.stats.inserts;
      return r;
    }
    if (q_pages > std::numeric_limits<std::uint32_t>::max() - 1)
      throw std::invalid_argument("PagedPrefixCache::insert: more than 2^32 - 2 pages");

    // Phase 1: find the path and allocate everything; nothing changes yet.
    std::uint32_t slot = state_.namespaces.find(ns);
    const bool new_ns = slot == npos;
    std::uint64_t seed = 0;
    std::uint32_t cur = npos;
    if (!new_ns) {
      cur = state_.namespaces[slot].root;
      seed = state_.namespaces[slot].seed;
    } else {
      seed = detail::PagedNamespaces::default_seed(ns);
      state_.namespaces.check_seed_free(seed, ns);
    }
    state_.path.clear();
    std::size_t pos = 0;
    std::uint32_t split_node = npos;
    std::uint32_t split_pages = 0;
    if (cur != npos) {
      typename Tree::Found f;
      while (pos < q_pages) {
        f = Tree::template find_child<false>(state_, state_.nodes.data(), state_.edges.view(), cur,
                                             tokens.data() + pos * page_size(), q_pages - pos,
                                             f.next, f.ahead, nullptr);
        if (f.node == npos) break;
        const Node& x = state_.nodes[f.node];
        // A local: push_back may write any memory, after which x.ids would be reloaded.
        const PageId* ids = x.ids;
        for (std::size_t i = 0; i < f.pages; ++i)
          if (ids[i] != pages[pos + i]) r.duplicates.push_back(pages[pos + i]);
        pos += f.pages;
        if (f.pages < x.n) {
          split_node = f.node;
          split_pages = static_cast<std::uint32_t>(f.pages);
          break;
        }
        state_.path.push_back(f.node);
        cur = f.node;
      }
    }
    const std::size_t new_pages = q_pages - pos;
    typename Tree::SplitBlocks split_space;
    std::unique_ptr<unsigned char[]> leaf_block;
    if (split_node != npos)
      split_space = state_.blocks.split_blocks(state_.nodes[split_node], split_pages);
    if (new_pages > 0) leaf_block = state_.blocks.make_block(static_cast<std::uint32_t>(new_pages));
    std::optional<kv_event::Stored> event;
    if (new_pages > 0 && state_.events.on()) {
      std::optional<std::uint64_t> parent;
      if (split_node != npos)
        parent = Tree::head_hash(state_, state_.nodes[split_node], split_pages);
      else if (pos > 0)
        parent = state_.nodes[cur].last_hash;
      event.emplace(
          detail::paged_stored_event(tokens.subspan(pos * page_size(), new_pages * page_size()),
                                     page_size(), new_pages, seed, parent));
    }
    const std::size_t extra_nodes = (split_node != npos ? 1U : 0U) + (new_pages > 0 ? 1U : 0U);
    Tree::reserve_nodes(state_, extra_nodes + 1);  // + a root for a new namespace
    state_.edges.reserve(extra_nodes);
    Order::reserve(state_, state_.stats.nodes + extra_nodes);
    if (new_ns) {
      slot = Tree::open_namespace(state_, ns, seed);  // strong: nothing else changed yet
      cur = state_.namespaces[slot].root;
    }
    // The event goes out before the commit, the one step after it that cannot throw: a
    // sink that throws has not published it, and leaves the cache as it was (the new
    // namespace withdrawn), so the engine keeps its pages whatever insert throws.
    const std::uint64_t leaf_hash = event ? event->blocks.back().block_hash : 0;
    if (event) {
      try {
        state_.events.publish(
            std::move(*event), state_.stats.events,
            PagedStoredPages{ns, tokens.subspan(pos * page_size(), new_pages * page_size())});
      } catch (...) {
        if (new_ns) Tree::drop_empty_namespace(state_, slot);
        throw;
      }
    }

    // Phase 2: commit; nothing below throws.
    ++state_.tick;
    ++state_.stats.inserts;
    for (const std::uint32_t x : state_.path)
      Order::touch_insert(state_, x, ns, priority);
    if (split_node != npos) {
      cur = Tree::split(state_, split_node, split_pages, std::move(split_space));
      Order::touch_insert(state_, cur, ns, priority);
    }
    if (new_pages > 0) {
      cur = Tree::add_leaf(state_, cur, tokens.data() + pos * page_size(), pages.data() + pos,
                           static_cast<std::uint32_t>(new_pages), std::move(leaf_block), ns,
                           priority, leaf_hash);
    }
    r.cached_pages = pos;
    r.inserted_pages = new_pages;
    r.handle = Tree::handle_of(state_, cur);
    state_.stats.inserted_pages += new_pages;
    state_.stats.duplicate_pages += r.duplicates.size();
    return r;
  }

  /// Frees min(n_pages, evictable_pages()) pages, exactly: never more. Takes the
  /// unlocked leaf with the smallest policy key and frees its pages from the tail
  /// (so a long leaf can give up only what is needed); a leaf emptied this way is
  /// removed and its parent may become a leaf. Calls on_evict(PageId) for each freed
  /// page (deepest first) and publishes one Removed event with their block hashes.
  /// A policy with key classes picks the class before every page, so a leaf is left
  /// part-evicted when its class stops being picked (plus O(classes) per page).
  /// O(pages freed + log L per node touched); with a sink, plus hashing every page of
  /// each node it touches (a node keeps only its last page's hash, so trimming k pages
  /// of an n-page leaf rehashes n pages). on_evict must not throw (a throwing
  /// callback terminates: the cache cannot hand back half a node). Strong guarantee
  /// for std::bad_alloc (before anything changes). A throwing sink: the pages are freed
  /// (on_evict ran), the event id consumed, and the exception propagates.
  template <class OnEvict>
  std::size_t evict(std::size_t n_pages, OnEvict&& on_evict) {
    if (state_.events.publishing()) detail::paged_throw_reentered();
    const std::size_t target = std::min(n_pages, state_.evictable_pages);
    if (target == 0) return 0;
    std::vector<std::uint64_t> removed;
    if (state_.events.on()) removed.reserve(target);
    Removal::evict(state_, target, on_evict, removed);
    if (state_.events.on())
      state_.events.publish(kv_event::Removed{std::move(removed)}, state_.stats.events);
    return target;
  }

  /// evict() without a callback (for engines that track pages otherwise).
  std::size_t evict(std::size_t n_pages) {
    return evict(n_pages, [](PageId) noexcept {});
  }

  /// Drops every page of every namespace, calling on_free(PageId) for each (in
  /// unspecified order), and publishes Cleared. Namespace configurations stay.
  /// Returns false, changing nothing, if any page is locked. O(N + pages); the
  /// callback must not throw (see evict). Invalidates every handle. A throwing sink:
  /// the cache is cleared (on_free ran), the event id consumed, the exception propagates.
  template <class OnFree>
  bool clear(OnFree&& on_free) {
    if (state_.events.publishing()) detail::paged_throw_reentered();
    if (state_.stats.locked_pages > 0) return false;
    Removal::clear(state_, on_free);
    state_.events.publish(kv_event::Cleared{}, state_.stats.events);
    return true;
  }

  /// clear() without a callback.
  bool clear() {
    return clear([](PageId) noexcept {});
  }

  /// Drops every page of namespace `ns` (calling on_free for each) and forgets the
  /// namespace, configuration included; publishes one Removed event if pages were
  /// dropped. Returns false, changing nothing, if a page of `ns` is locked; true for
  /// an unknown namespace. O(nodes and pages of ns). Strong guarantee for bad_alloc.
  /// A throwing sink: the namespace is erased (on_free ran), the event id consumed, the
  /// exception propagates.
  template <class OnFree>
  bool erase_namespace(namespace_id ns, OnFree&& on_free) {
    if (state_.events.publishing()) detail::paged_throw_reentered();
    const std::uint32_t slot = state_.namespaces.find(ns);
    if (slot == npos) return true;
    const std::uint32_t root = state_.namespaces[slot].root;
    if (state_.nodes[root].lock > 0) return false;
    std::vector<std::uint32_t> order;  // every node of the namespace, parents first
    const std::size_t pages = Removal::collect(state_, root, order);
    std::vector<std::uint64_t> removed;
    if (state_.events.on()) removed.reserve(pages);
    Removal::erase(state_, slot, order, on_free, removed);
    state_.stats.erased_pages += pages;
    if (state_.events.on() && pages > 0)
      state_.events.publish(kv_event::Removed{std::move(removed)}, state_.stats.events);
    return true;
  }

  /// erase_namespace() without a callback.
  bool erase_namespace(namespace_id ns) {
    return erase_namespace(ns, [](PageId) noexcept {});
  }

  // ---- state ------------------------------------------------------------------------------

  /// Tokens per page. O(1).
  [[nodiscard]] std::size_t page_size() const noexcept { return state_.blocks.page_size(); }
  /// Pages in the cache. O(1).
  [[nodiscard]] std::size_t cached_pages() const noexcept { return state_.stats.cached_pages; }
  /// Pages on the path of at least one lock. O(1).
  [[nodiscard]] std::size_t locked_pages() const noexcept { return state_.stats.locked_pages; }
  /// Pages evict() can free now (cached minus locked). O(1).
  [[nodiscard]] std::size_t evictable_pages() const noexcept { return state_.evictable_pages; }
  /// Tree nodes, namespace roots not counted. O(1).
  [[nodiscard]] std::size_t node_count() const noexcept { return state_.stats.nodes; }
  /// True when a sink was given: pages carry block hashes and events are published. O(1).
  [[nodiscard]] bool publishes_events() const noexcept { return state_.events.on(); }
  /// Id the next event will carry (events are numbered 0, 1, 2, ...). O(1).
  [[nodiscard]] std::uint64_t next_event_id() const noexcept { return state_.events.next_id(); }
  /// Counters and gauges. O(1).
  [[nodiscard]] const PagedCacheStats& stats() const noexcept { return state_.stats; }
  /// The policy object (its own state, e.g. an adaptive target). O(1).
  [[nodiscard]] const Policy& policy() const noexcept { return state_.policy; }

  /// The block hash (the sequence hash its Stored event named) of every cached page, over
  /// all namespaces, sorted ascending: the set a KvIndex fed by this cache's events holds
  /// for its worker (KvIndex::block_hashes) when the index's view is exact. Computed from
  /// the tokens, so it needs no sink. O(cached tokens + P log P), P = cached pages.
  [[nodiscard]] std::vector<std::uint64_t> block_hashes() const {
    std::vector<std::uint64_t> out;
    out.reserve(state_.stats.cached_pages);
    std::vector<std::pair<std::uint32_t, std::optional<std::uint64_t>>> stack;
    for (std::uint32_t slot = 0; slot < state_.namespaces.slot_count(); ++slot) {
      const detail::PagedNsSlot& s = state_.namespaces[slot];
      if (!s.live) continue;
      for (std::uint32_t c = state_.nodes[s.root].first_child; c != npos; c = state_.nodes[c].next)
        stack.emplace_back(c, std::nullopt);
      while (!stack.empty()) {
        const auto [x, parent] = stack.back();
        stack.pop_back();
        const Node& nd = state_.nodes[x];
        std::optional<std::uint64_t> last = parent;
        if (nd.n != 0)
          last =
              detail::paged_chain_hashes(parent, nd.tok, nd.n, page_size(), s.seed,
                                         [&](std::uint32_t, std::uint64_t h) { out.push_back(h); });
        for (std::uint32_t c = nd.first_child; c != npos; c = state_.nodes[c].next)
          stack.emplace_back(c, last);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  /// Cached pages (locked ones included) whose node is in key class `k` of the
  /// policy; 0 for k >= classes. With one class, all cached pages. O(1).
  [[nodiscard]] std::size_t class_pages(std::size_t k) const noexcept {
    if constexpr (classes == 1)
      return k == 0 ? state_.stats.cached_pages : 0;
    else
      return k < classes ? state_.class_pages[k] : 0;
  }

  /// Heap bytes held, split into the index and the token ids (capacities). token_bytes
  /// stays at most twice the cached tokens (cached_pages() x page_size() x 4), and the page
  /// ids' share of index_bytes twice the cached ids: a split or trim that would leave a
  /// block at most half live compacts it (after a trim, unless that allocation fails). O(1).
  [[nodiscard]] PagedCacheMemory memory() const noexcept {
    PagedCacheMemory m;
    m.token_bytes = state_.blocks.token_bytes();
    m.index_bytes =
        state_.blocks.id_bytes() + state_.nodes.capacity() * sizeof(Node) +
        state_.edges.memory_bytes() + Order::capacity(state_) * sizeof(typename State::HeapEntry) +
        state_.namespaces.memory_bytes() + state_.path.capacity() * sizeof(std::uint32_t);
    return m;
  }

  /// Checks every internal invariant (links, edges, depths, lock counts, page
  /// counters, heap membership and order, block hashes). O(N + pages * page_size);
  /// for tests.
  [[nodiscard]] bool check_invariants() const {
    const std::vector<Node>& nodes = state_.nodes;
    const std::size_t ps = state_.blocks.page_size();
    std::size_t live = 0, pages = 0, locked = 0, evictable = 0, in_heap = 0, block_pages = 0;
    std::array<std::size_t, classes> class_pages{};
    for (std::uint32_t slot = 0; slot < state_.namespaces.slot_count(); ++slot) {
      const detail::PagedNsSlot& s = state_.namespaces[slot];
      if (!s.live) continue;
      if (!state_.namespaces.indexed(slot)) return false;
      const Node& root = nodes[s.root];
      if (root.kind != detail::PagedKind::root || root.ns != slot || root.parent != npos)
        return false;
      std::vector<std::uint32_t> stack{s.root};
      while (!stack.empty()) {
        const std::uint32_t x = stack.back();
        stack.pop_back();
        const Node& nd = nodes[x];
        std::uint64_t child_locks = 0;
        std::uint32_t prev = npos;
        for (std::uint32_t c = nd.first_child; c != npos; c = nodes[c].next) {
          const Node& ch = nodes[c];
          if (ch.kind != detail::PagedKind::node || ch.parent != x || ch.prev != prev ||
              ch.ns != slot)
            return false;
          if (ch.n == 0 || state_.blocks.off_of(ch) + ch.n > ch.cap) return false;
          if (ch.tok !=
              reinterpret_cast<const token_type*>(ch.block.get()) + state_.blocks.off_of(ch) * ps)
            return false;
          if (ch.depth != (nd.kind == detail::PagedKind::root ? 0U : nd.depth + nd.n)) return false;
          // The child is reachable through its (parent, first token) chain.
          bool reachable = false;
          const void* hint = nullptr;
          const std::uint32_t head = state_.edges.view().find(x, ch.tok[0], hint);
          for (std::uint32_t e = head; e != npos; e = nodes[e].next_same)
            reachable = reachable || e == c;
          if (!reachable) return false;
          // The chain's edge carries its head's tokens as the look-ahead's prefetch hint.
          if (head == c && hint != ch.tok) return false;
          // Siblings never share their first page.
          for (std::uint32_t o = ch.next; o != npos; o = nodes[o].next)
            if (std::memcmp(ch.tok, nodes[o].tok, state_.blocks.page_bytes()) == 0) return false;
          child_locks += ch.lock;
          prev = c;
          stack.push_back(c);
        }
        if (child_locks + nd.own != nd.lock) return false;
        if (nd.kind == detail::PagedKind::root) continue;
        ++live;
        pages += nd.n;
        block_pages += nd.cap;
        if (nd.lock > 0) locked += nd.n;
        if (nd.lock == 0) evictable += nd.n;
        const bool leaf = nd.first_child == npos && nd.lock == 0;
        if (leaf != (nd.heap_pos != npos)) return false;
        class_pages[Order::class_of(state_, nd)] += nd.n;
        if (leaf) {
          ++in_heap;
          const auto& heap = state_.heaps[Order::class_of(state_, nd)];
          if (nd.heap_pos >= heap.size() || heap[nd.heap_pos].node != x) return false;
          const auto now = state_.policy.key(nd.meta);
          const auto& stored = heap[nd.heap_pos].key;
          if (now < stored) return false;
          if (!Policy::monotone_keys && stored < now) return false;
        }
        if (state_.events.on() && Tree::head_hash(state_, nd, nd.n) != nd.last_hash) return false;
      }
    }
    const PagedCacheStats& st = state_.stats;
    if (live != st.nodes || pages != st.cached_pages || locked != st.locked_pages ||
        evictable != state_.evictable_pages || in_heap != Order::size(state_) ||
        block_pages != state_.blocks.block_pages())
      return false;
    if constexpr (classes > 1)
      if (class_pages != state_.class_pages) return false;
    if (state_.edges.size() != st.nodes - Tree::chained_siblings(state_)) return false;
    for (const auto& heap : state_.heaps)
      for (std::size_t i = 1; i < heap.size(); ++i)
        if (heap[i].key < heap[(i - 1) / 2].key) return false;
    std::size_t free_count = 0;
    for (std::uint32_t f = state_.free_head; f != npos; f = nodes[f].next) {
      if (nodes[f].kind != detail::PagedKind::free) return false;
      ++free_count;
    }
    return free_count == state_.free_count &&
           live + free_count + state_.namespaces.size() == nodes.size();
  }

 private:
  // A walk's end as match() reports it.
  static MatchEnd ended(const typename Matches::End& e) noexcept { return {e.matched, e.handle}; }

  static std::size_t check_page_size(std::size_t page_size) {
    if (page_size == 0 || page_size > (std::size_t{1} << 20))
      throw std::invalid_argument("PagedPrefixCache: page_size must be in [1, 2^20]");
    return page_size;
  }

  State state_;
};

}  // namespace promptcache

#endif  // PROMPTCACHE_PAGED_PREFIX_CACHE_HPP
