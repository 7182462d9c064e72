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
#include "promptcache/detail/mismatch.hpp"
#include "promptcache/detail/paged_edge_table.hpp"
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

  using meta_type = typename Policy::meta_type;
  using key_type = typename Policy::key_type;
  static constexpr std::uint32_t npos = 0xFFFFFFFFU;
  using ns_map = std::unordered_map<std::uint64_t, std::uint32_t>;
  using seed_map = std::unordered_map<std::uint64_t, std::uint64_t>;
  // The moves throw only where the policy's move, or the sink's or a map's move
  // assignment, does (the vectors and the edge table never do).
  static constexpr bool nothrow_take =
      std::is_nothrow_move_assignable_v<std::function<void(const KvEvent&)>> &&
      std::is_nothrow_move_assignable_v<ns_map> && std::is_nothrow_move_assignable_v<seed_map>;
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
      : page_size_(check_page_size(page_size)),
        policy_(std::move(policy)),
        sink_(std::move(sink)),
        hashes_(static_cast<bool>(sink_)) {}

  /// Not copyable (one cache per engine).
  PagedPrefixCache(const PagedPrefixCache&) = delete;
  /// Not copy-assignable.
  PagedPrefixCache& operator=(const PagedPrefixCache&) = delete;
  /// Takes over `other` (handles into it stay valid for the new object). `other` is left
  /// empty and usable: no namespaces, pages, events or counters, the same page size, its
  /// policy as Policy's move left it, and no sink (publishes_events() false). O(1).
  PagedPrefixCache(PagedPrefixCache&& other) noexcept(nothrow_move_construct)
      : page_size_(other.page_size_), policy_(std::move(other.policy_)), hashes_(false) {
    take_contents(other);
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
    policy_ = std::move(other.policy_);
    page_size_ = other.page_size_;
    take_contents(other);
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
    if (publishing_) throw_reentered();
    if (lora_name.empty() && names_other_namespace(cache_salt, ns))
      throw std::invalid_argument(
          "PagedPrefixCache: the seed is another namespace's default block-hash seed");
    const std::uint64_t seed = block_hash_seed(lora_name, cache_salt);
    const auto it = ns_index_.find(ns);
    if (it != ns_index_.end()) {
      NsSlot& s = ns_slots_[it->second];
      if (s.seed == seed) return;
      if (nodes_[s.root].first_child != npos)
        throw std::invalid_argument("PagedPrefixCache: namespace holds pages, seed cannot change");
      check_seed_free(seed, ns);
      seed_owner_.emplace(seed, ns);  // may throw: nothing changed yet
      seed_owner_.erase(s.seed);
      s.seed = seed;
      return;
    }
    check_seed_free(seed, ns);
    create_namespace(ns, seed);
  }

  /// The block-hash seed namespace `ns` uses (or would use) for its pages. O(1) expected.
  [[nodiscard]] std::uint64_t namespace_seed(namespace_id ns) const {
    const auto it = ns_index_.find(ns);
    return it != ns_index_.end() ? ns_slots_[it->second].seed : default_seed(ns);
  }

  /// Number of namespaces known (configured or holding pages since their last erase). O(1).
  [[nodiscard]] std::size_t namespace_count() const noexcept { return ns_index_.size(); }

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
    return walk<false>(
        tokens, ns, tokens.size() / page_size_,
        [&](std::size_t, const PageId* ids, std::size_t n) {
          pages.insert(pages.end(), ids, ids + n);
        },
        nullptr);
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
    const std::size_t q_pages = std::min(tokens.size() / page_size_, out.size());
    const auto emit = [&](std::size_t at, const PageId* ids, std::size_t n) {
      std::memcpy(out.data() + at, ids, n * sizeof(PageId));
    };
    // With one token per page the ids are as many bytes as the tokens: the compare copies
    // them in the same pass (see find_child).
    if (page_size_ == 1) return walk<true>(tokens, ns, q_pages, emit, out.data());
    return walk<false>(tokens, ns, q_pages, emit, nullptr);
  }

  /// Matched tokens match() would report, without refreshing or splitting anything.
  /// O(T); never throws.
  [[nodiscard]] std::size_t peek(std::span<const token_type> tokens,
                                 namespace_id ns = 0) const noexcept {
    const std::uint32_t slot = ns_slot(ns);
    if (slot == npos) return 0;
    const std::size_t q_pages = tokens.size() / page_size_;
    std::uint32_t cur = ns_slots_[slot].root;
    std::size_t pos = 0;
    Found f;
    while (pos < q_pages) {
      f = find_child<false>(nodes_.data(), edges_.view(), cur, tokens.data() + pos * page_size_,
                            q_pages - pos, f.next, f.ahead, nullptr);
      if (f.node == npos) break;
      pos += f.pages;
      if (f.pages < nodes_[f.node].n) break;
      cur = f.node;
    }
    return pos * page_size_;
  }

  // ---- locks ------------------------------------------------------------------------------

  /// Locks the prefix ending at `h`: its pages are not evicted until a matching
  /// unlock(). Locks nest (counted per node). Returns false, changing nothing, for a
  /// stale handle, when 2^32 - 1 locks are held in the namespace, or when called from the
  /// event sink; true (no-op) for an empty handle. O(nodes on the path + log L); never throws.
  bool lock(const PagedPrefixHandle& h) noexcept {
    if (publishing_) return false;
    if (h.empty()) return true;
    if (!valid(h)) return false;
    Node& root = nodes_[ns_slots_[nodes_[h.node].ns].root];
    if (root.lock == std::numeric_limits<std::uint32_t>::max()) return false;
    for (std::uint32_t x = h.node; nodes_[x].kind == Kind::node; x = nodes_[x].parent) {
      Node& nd = nodes_[x];
      if (nd.lock == 0) {
        evictable_pages_ -= nd.n;
        stats_.locked_pages += nd.n;
        if (nd.heap_pos != npos) heap_erase(x);
      }
      ++nd.lock;
    }
    ++nodes_[h.node].own;
    ++root.lock;
    return true;
  }

  /// Releases one lock taken with lock() on a handle ending where `h` ends. Returns
  /// false, changing nothing, for a stale handle or when no such lock is held
  /// (unlocking below zero; locks of longer prefixes through `h` do not count), or when
  /// called from the event sink; true (no-op) for an empty handle. O(nodes on the path +
  /// log L); never throws.
  bool unlock(const PagedPrefixHandle& h) noexcept {
    if (publishing_) return false;
    if (h.empty()) return true;
    if (!valid(h) || nodes_[h.node].own == 0) return false;
    --nodes_[h.node].own;
    for (std::uint32_t x = h.node; nodes_[x].kind == Kind::node; x = nodes_[x].parent) {
      Node& nd = nodes_[x];
      --nd.lock;
      if (nd.lock == 0) {
        evictable_pages_ += nd.n;
        stats_.locked_pages -= nd.n;
        if (nd.first_child == npos) heap_push(x);
      }
    }
    --nodes_[ns_slots_[nodes_[h.node].ns].root].lock;
    return true;
  }

  /// True when `h` is empty or still names a cached prefix. O(1).
  [[nodiscard]] bool valid(const PagedPrefixHandle& h) const noexcept {
    if (h.empty()) return true;
    return h.node < nodes_.size() && nodes_[h.node].kind == Kind::node &&
           nodes_[h.node].gen == h.generation;
  }

  /// Locks taken with handles ending where `h` ends and not yet released (0 for an
  /// empty or stale handle). O(1).
  [[nodiscard]] std::size_t lock_count(const PagedPrefixHandle& h) const noexcept {
    return !h.empty() && valid(h) ? nodes_[h.node].own : 0U;
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
    if (publishing_) throw_reentered();
    const std::size_t q_pages = tokens.size() / page_size_;
    if (pages.size() < q_pages)
      throw std::invalid_argument("PagedPrefixCache::insert: fewer page ids than whole pages");
    InsertResult r;
    if (q_pages == 0) {
      ++stats_.inserts;
      return r;
    }
    if (q_pages > std::numeric_limits<std::uint32_t>::max() - 1)
      throw std::invalid_argument("PagedPrefixCache::insert: more than 2^32 - 2 pages");

    // Phase 1: find the path and allocate everything; nothing changes yet.
    const auto it = ns_index_.find(ns);
    std::uint64_t seed = 0;
    std::uint32_t cur = npos;
    if (it != ns_index_.end()) {
      cur = ns_slots_[it->second].root;
      seed = ns_slots_[it->second].seed;
    } else {
      seed = default_seed(ns);
      check_seed_free(seed, ns);
    }
    path_.clear();
    std::size_t pos = 0;
    std::uint32_t split_node = npos;
    std::uint32_t split_pages = 0;
    if (cur != npos) {
      Found f;
      while (pos < q_pages) {
        f = find_child<false>(nodes_.data(), edges_.view(), cur, tokens.data() + pos * page_size_,
                              q_pages - pos, f.next, f.ahead, nullptr);
        if (f.node == npos) break;
        const Node& x = nodes_[f.node];
        const PageId* ids = page_ids(x);
        for (std::size_t i = 0; i < f.pages; ++i)
          if (ids[i] != pages[pos + i]) r.duplicates.push_back(pages[pos + i]);
        pos += f.pages;
        if (f.pages < x.n) {
          split_node = f.node;
          split_pages = static_cast<std::uint32_t>(f.pages);
          break;
        }
        path_.push_back(f.node);
        cur = f.node;
      }
    }
    const std::size_t new_pages = q_pages - pos;
    SplitBlocks split_space;
    std::unique_ptr<unsigned char[]> leaf_block;
    if (split_node != npos) split_space = split_blocks(nodes_[split_node], split_pages);
    if (new_pages > 0) leaf_block = make_block(static_cast<std::uint32_t>(new_pages));
    std::optional<kv_event::Stored> event;
    if (new_pages > 0 && hashes_) {
      kv_event::Stored st;
      st.blocks.resize(new_pages);
      std::vector<std::uint64_t> locals(new_pages);
      BlockHashOptions opts;
      opts.seed = seed;
      local_block_hashes(tokens.subspan(pos * page_size_, new_pages * page_size_), page_size_,
                         locals, opts);
      std::optional<std::uint64_t> parent;
      if (split_node != npos) {
        const Node& c = nodes_[split_node];
        parent = chain(parent_hash(c), tokens_of(c), split_pages, seed,
                       [](std::uint32_t, std::uint64_t) {});
      } else if (pos > 0) {
        parent = nodes_[cur].last_hash;
      }
      st.parent_hash = parent;
      for (std::size_t i = 0; i < new_pages; ++i) {
        const std::uint64_t h = parent ? sequence_hash(*parent, locals[i]) : locals[i];
        st.blocks[i] = KvBlock{h, locals[i]};
        parent = h;
      }
      event.emplace(std::move(st));
    }
    const std::size_t extra_nodes = (split_node != npos ? 1U : 0U) + (new_pages > 0 ? 1U : 0U);
    reserve_nodes(extra_nodes + 1);  // + a root for a new namespace
    edges_.reserve(extra_nodes);
    reserve_heap(stats_.nodes + extra_nodes);
    if (it == ns_index_.end()) {
      create_namespace(ns, seed);  // strong: nothing else changed yet
      cur = ns_slots_[ns_index_.find(ns)->second].root;
    }
    // The event goes out before the commit, the one step after it that cannot throw: a
    // sink that throws has not published it, and leaves the cache as it was (the new
    // namespace withdrawn), so the engine keeps its pages whatever insert throws.
    const std::uint64_t leaf_hash = event ? event->blocks.back().block_hash : 0;
    if (event) {
      try {
        publish(std::move(*event));
      } catch (...) {
        if (it == ns_index_.end()) drop_empty_namespace(ns);
        throw;
      }
    }

    // Phase 2: commit; nothing below throws.
    ++tick_;
    ++stats_.inserts;
    for (const std::uint32_t x : path_)
      touch_insert(x, ns, priority);
    if (split_node != npos) {
      cur = split(split_node, split_pages, std::move(split_space));
      touch_insert(cur, ns, priority);
    }
    if (new_pages > 0) {
      cur = add_leaf(cur, tokens.data() + pos * page_size_, pages.data() + pos,
                     static_cast<std::uint32_t>(new_pages), std::move(leaf_block), ns, priority,
                     leaf_hash);
    }
    r.cached_pages = pos;
    r.inserted_pages = new_pages;
    r.handle = handle_of(cur);
    stats_.inserted_pages += new_pages;
    stats_.duplicate_pages += r.duplicates.size();
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
    if (publishing_) throw_reentered();
    const std::size_t target = std::min(n_pages, evictable_pages_);
    if (target == 0) return 0;
    std::vector<std::uint64_t> removed;
    if (hashes_) removed.reserve(target);
    evict_reserved(target, on_evict, removed);
    if (hashes_) publish(kv_event::Removed{std::move(removed)});
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
    if (publishing_) throw_reentered();
    if (stats_.locked_pages > 0) return false;
    clear_reserved(on_free);
    publish(kv_event::Cleared{});
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
    if (publishing_) throw_reentered();
    const auto it = ns_index_.find(ns);
    if (it == ns_index_.end()) return true;
    const std::uint32_t slot = it->second;
    const std::uint32_t root = ns_slots_[slot].root;
    if (nodes_[root].lock > 0) return false;
    std::vector<std::uint32_t> order;  // every node of the namespace, parents first
    std::size_t pages = 0;
    for (std::uint32_t c = nodes_[root].first_child; c != npos; c = nodes_[c].next)
      order.push_back(c);
    for (std::size_t i = 0; i < order.size(); ++i) {
      pages += nodes_[order[i]].n;
      for (std::uint32_t c = nodes_[order[i]].first_child; c != npos; c = nodes_[c].next)
        order.push_back(c);
    }
    std::vector<std::uint64_t> removed;
    if (hashes_) removed.reserve(pages);
    erase_reserved(slot, order, on_free, removed);
    stats_.erased_pages += pages;
    if (hashes_ && pages > 0) publish(kv_event::Removed{std::move(removed)});
    return true;
  }

  /// erase_namespace() without a callback.
  bool erase_namespace(namespace_id ns) {
    return erase_namespace(ns, [](PageId) noexcept {});
  }

  // ---- state ------------------------------------------------------------------------------

  /// Tokens per page. O(1).
  [[nodiscard]] std::size_t page_size() const noexcept { return page_size_; }
  /// Pages in the cache. O(1).
  [[nodiscard]] std::size_t cached_pages() const noexcept { return stats_.cached_pages; }
  /// Pages on the path of at least one lock. O(1).
  [[nodiscard]] std::size_t locked_pages() const noexcept { return stats_.locked_pages; }
  /// Pages evict() can free now (cached minus locked). O(1).
  [[nodiscard]] std::size_t evictable_pages() const noexcept { return evictable_pages_; }
  /// Tree nodes, namespace roots not counted. O(1).
  [[nodiscard]] std::size_t node_count() const noexcept { return stats_.nodes; }
  /// True when a sink was given: pages carry block hashes and events are published. O(1).
  [[nodiscard]] bool publishes_events() const noexcept { return hashes_; }
  /// Id the next event will carry (events are numbered 0, 1, 2, ...). O(1).
  [[nodiscard]] std::uint64_t next_event_id() const noexcept { return next_event_id_; }
  /// Counters and gauges. O(1).
  [[nodiscard]] const PagedCacheStats& stats() const noexcept { return stats_; }
  /// The policy object (its own state, e.g. an adaptive target). O(1).
  [[nodiscard]] const Policy& policy() const noexcept { return policy_; }

  /// The block hash (the sequence hash its Stored event named) of every cached page, over
  /// all namespaces, sorted ascending: the set a KvIndex fed by this cache's events holds
  /// for its worker (KvIndex::block_hashes) when the index's view is exact. Computed from
  /// the tokens, so it needs no sink. O(cached tokens + P log P), P = cached pages.
  [[nodiscard]] std::vector<std::uint64_t> block_hashes() const {
    std::vector<std::uint64_t> out;
    out.reserve(stats_.cached_pages);
    std::vector<std::pair<std::uint32_t, std::optional<std::uint64_t>>> stack;
    for (const NsSlot& s : ns_slots_) {
      if (!s.live) continue;
      for (std::uint32_t c = nodes_[s.root].first_child; c != npos; c = nodes_[c].next)
        stack.emplace_back(c, std::nullopt);
      while (!stack.empty()) {
        const auto [x, parent] = stack.back();
        stack.pop_back();
        const Node& nd = nodes_[x];
        std::optional<std::uint64_t> last = parent;
        if (nd.n != 0)
          last = chain(parent, tokens_of(nd), nd.n, s.seed,
                       [&](std::uint32_t, std::uint64_t h) { out.push_back(h); });
        for (std::uint32_t c = nd.first_child; c != npos; c = nodes_[c].next)
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
      return k == 0 ? stats_.cached_pages : 0;
    else
      return k < classes ? class_pages_[k] : 0;
  }

  /// Heap bytes held, split into the index and the token ids (capacities). token_bytes
  /// stays at most twice the cached tokens (cached_pages() x page_size() x 4), and the page
  /// ids' share of index_bytes twice the cached ids: a split or trim that would leave a
  /// block at most half live compacts it (after a trim, unless that allocation fails). O(1).
  [[nodiscard]] PagedCacheMemory memory() const noexcept {
    PagedCacheMemory m;
    m.token_bytes = block_pages_ * page_size_ * sizeof(token_type);
    m.index_bytes = block_pages_ * sizeof(PageId) + nodes_.capacity() * sizeof(Node) +
                    edges_.memory_bytes() + heap_capacity() * sizeof(HeapEntry) +
                    ns_slots_.capacity() * sizeof(NsSlot) +
                    (ns_index_.size() + seed_owner_.size()) * 4 * sizeof(std::uint64_t) +
                    path_.capacity() * sizeof(std::uint32_t);
    return m;
  }

  /// Checks every internal invariant (links, edges, depths, lock counts, page
  /// counters, heap membership and order, block hashes). O(N + pages * page_size);
  /// for tests.
  [[nodiscard]] bool check_invariants() const {
    std::size_t live = 0, pages = 0, locked = 0, evictable = 0, in_heap = 0, block_pages = 0;
    std::array<std::size_t, classes> class_pages{};
    for (std::uint32_t slot = 0; slot < ns_slots_.size(); ++slot) {
      const NsSlot& s = ns_slots_[slot];
      if (!s.live) continue;
      const auto it = ns_index_.find(s.id);
      if (it == ns_index_.end() || it->second != slot) return false;
      const auto so = seed_owner_.find(s.seed);
      if (so == seed_owner_.end() || so->second != s.id) return false;
      const Node& root = nodes_[s.root];
      if (root.kind != Kind::root || root.ns != slot || root.parent != npos) return false;
      std::vector<std::uint32_t> stack{s.root};
      while (!stack.empty()) {
        const std::uint32_t x = stack.back();
        stack.pop_back();
        const Node& nd = nodes_[x];
        std::uint64_t child_locks = 0;
        std::uint32_t prev = npos;
        for (std::uint32_t c = nd.first_child; c != npos; c = nodes_[c].next) {
          const Node& ch = nodes_[c];
          if (ch.kind != Kind::node || ch.parent != x || ch.prev != prev || ch.ns != slot)
            return false;
          if (ch.n == 0 || off_of(ch) + ch.n > ch.cap) return false;
          if (ch.tok !=
              reinterpret_cast<const token_type*>(ch.block.get()) + off_of(ch) * page_size_)
            return false;
          if (ch.depth != (nd.kind == Kind::root ? 0U : nd.depth + nd.n)) return false;
          // The child is reachable through its (parent, first token) chain.
          bool reachable = false;
          const void* hint = nullptr;
          const std::uint32_t head = edges_.view().find(x, tokens_of(ch)[0], hint);
          for (std::uint32_t e = head; e != npos; e = nodes_[e].next_same)
            reachable = reachable || e == c;
          if (!reachable) return false;
          // The chain's edge carries its head's tokens as the look-ahead's prefetch hint.
          if (head == c && hint != ch.tok) return false;
          // Siblings never share their first page.
          for (std::uint32_t o = ch.next; o != npos; o = nodes_[o].next)
            if (std::memcmp(tokens_of(ch), tokens_of(nodes_[o]), page_bytes()) == 0) return false;
          child_locks += ch.lock;
          prev = c;
          stack.push_back(c);
        }
        if (child_locks + nd.own != nd.lock) return false;
        if (nd.kind == Kind::root) continue;
        ++live;
        pages += nd.n;
        block_pages += nd.cap;
        if (nd.lock > 0) locked += nd.n;
        if (nd.lock == 0) evictable += nd.n;
        const bool leaf = nd.first_child == npos && nd.lock == 0;
        if (leaf != (nd.heap_pos != npos)) return false;
        class_pages[class_of(nd)] += nd.n;
        if (leaf) {
          ++in_heap;
          const auto& heap = heaps_[class_of(nd)];
          if (nd.heap_pos >= heap.size() || heap[nd.heap_pos].node != x) return false;
          const key_type now = policy_.key(nd.meta);
          const key_type& stored = heap[nd.heap_pos].key;
          if (now < stored) return false;
          if (!Policy::monotone_keys && stored < now) return false;
        }
        if (hashes_ && chain(parent_hash(nd), tokens_of(nd), nd.n, s.seed,
                             [](std::uint32_t, std::uint64_t) {}) != nd.last_hash)
          return false;
      }
    }
    if (live != stats_.nodes || pages != stats_.cached_pages || locked != stats_.locked_pages ||
        evictable != evictable_pages_ || in_heap != heap_size() || block_pages != block_pages_)
      return false;
    if constexpr (classes > 1)
      if (class_pages != class_pages_) return false;
    if (edges_.size() != stats_.nodes - chained_siblings()) return false;
    for (const auto& heap : heaps_)
      for (std::size_t i = 1; i < heap.size(); ++i)
        if (heap[i].key < heap[(i - 1) / 2].key) return false;
    std::size_t free_count = 0;
    for (std::uint32_t f = free_head_; f != npos; f = nodes_[f].next) {
      if (nodes_[f].kind != Kind::free) return false;
      ++free_count;
    }
    return free_count == free_count_ && live + free_count + live_namespaces() == nodes_.size();
  }

 private:
  enum class Kind : std::uint8_t { free, root, node };

  // One tree node. Pages [off, off + n) of its block are live: a split copies its
  // smaller part to a new block (advancing `off` when the tail stays), a trim lowers
  // `n`; a block is compacted once at most half of it would be live (see split_blocks).
  // `tok` and `ids` point at the first live page's tokens and id, so a match reads them
  // without the block's layout arithmetic.
  // Layout: what match() reads and writes on every node of its path (tok, ids, n,
  // first_child and, for the common policies, meta) comes first and fills at most 32
  // bytes; with the node aligned to 32 bytes those fields never straddle a cache line,
  // so a walk misses at most once per node. The rest serves insert, evict and locks.
  struct alignas(32) Node {
    token_type* tok = nullptr;  // tokens of the first live page
    PageId* ids = nullptr;      // id of the first live page
    std::uint32_t n = 0;        // live pages
    std::uint32_t first_child = npos;
    meta_type meta{};
    std::unique_ptr<unsigned char[]> block{};
    std::uint32_t cap = 0;           // pages the block holds
    std::uint32_t next_same = npos;  // next sibling with the same first token
    std::uint32_t gen = 0;           // bumped when the node is freed or trimmed
    std::uint32_t depth = 0;         // pages before this node on its path
    std::uint32_t parent = npos;
    std::uint32_t next = npos;      // next sibling (free list link for free nodes)
    std::uint32_t prev = npos;      // previous sibling
    std::uint32_t lock = 0;         // locks whose path runs through this node
    std::uint32_t own = 0;          // locks taken with a handle ending at this node
    std::uint32_t heap_pos = npos;  // position in the heap of evictable leaves
    std::uint32_t ns = 0;           // namespace slot
    Kind kind = Kind::free;
    std::uint64_t last_hash = 0;  // with a sink: sequence hash of the last page
  };

  struct HeapEntry {
    key_type key;
    std::uint32_t node;
  };

  struct NsSlot {
    namespace_id id = 0;
    std::uint64_t seed = 0;
    std::uint32_t root = npos;
    bool live = false;
  };

  // 16 bytes, so that it travels in two registers.
  struct Found {
    std::uint32_t node = npos;
    std::uint32_t pages = 0;  // leading pages of the node that match (at most its n)
    // When `ahead`: the edge-chain head under `node` for the query's next token (npos: none),
    // looked up while the node was compared.
    std::uint32_t next = npos;
    bool ahead = false;
  };

  // Compares at least this long look the next level up while they run (see find_child).
  static constexpr std::size_t look_ahead_bytes = 256;

  // The moves' common part: takes every member but the page size and the policy from
  // `other` and leaves `other` an empty cache (a moved-from standard container is only
  // "valid but unspecified", and the counters and free-list links describe the
  // containers, so each is exchanged with its empty value). The sink goes with the
  // contents.
  void take_contents(PagedPrefixCache& other) noexcept(nothrow_take) {
    sink_ = std::exchange(other.sink_, nullptr);
    hashes_ = std::exchange(other.hashes_, false);
    nodes_ = std::exchange(other.nodes_, {});
    free_head_ = std::exchange(other.free_head_, npos);
    free_count_ = std::exchange(other.free_count_, 0);
    block_pages_ = std::exchange(other.block_pages_, 0);
    evictable_pages_ = std::exchange(other.evictable_pages_, 0);
    edges_ = std::exchange(other.edges_, {});
    heaps_ = std::exchange(other.heaps_, {});
    class_pages_ = std::exchange(other.class_pages_, {});
    ns_slots_ = std::exchange(other.ns_slots_, {});
    ns_index_ = std::exchange(other.ns_index_, {});
    seed_owner_ = std::exchange(other.seed_owner_, {});
    path_ = std::exchange(other.path_, {});
    ns_hint_ = std::exchange(other.ns_hint_, npos);
    tick_ = std::exchange(other.tick_, 0);
    next_event_id_ = std::exchange(other.next_event_id_, 0);
    stats_ = std::exchange(other.stats_, {});
  }

  static std::size_t check_page_size(std::size_t page_size) {
    if (page_size == 0 || page_size > (std::size_t{1} << 20))
      throw std::invalid_argument("PagedPrefixCache: page_size must be in [1, 2^20]");
    return page_size;
  }

  static std::uint64_t default_seed(namespace_id ns) {
    if (ns == 0) return block_hash_seed();
    return block_hash_seed({}, std::to_string(ns));
  }

  // True when a cache salt with no LoRA name gives namespace `ns` the default seed of
  // another id m (default_seed(m)): the empty salt is namespace 0's, and the decimal form
  // std::to_string(m) (no sign, no leading zero) is m's for m != 0.
  static bool names_other_namespace(std::string_view salt, namespace_id ns) noexcept {
    if (salt.empty()) return ns != 0;
    if (salt.size() > 20 || salt[0] == '0') return false;
    namespace_id m = 0;
    for (const char ch : salt) {
      if (ch < '0' || ch > '9') return false;
      const auto d = static_cast<namespace_id>(ch - '0');
      if (m > (std::numeric_limits<namespace_id>::max() - d) / 10) return false;
      m = m * 10 + d;
    }
    return m != ns;
  }

  [[nodiscard]] std::size_t page_bytes() const noexcept { return page_size_ * sizeof(token_type); }

  // Block layout for `cap` pages: [tokens][page ids], the ids aligned. Ids follow
  // the tokens so that a match streams through both in one direction.
  [[nodiscard]] std::size_t ids_offset(std::size_t cap) const noexcept {
    const std::size_t end = cap * page_bytes();
    return (end + alignof(PageId) - 1) / alignof(PageId) * alignof(PageId);
  }
  [[nodiscard]] std::size_t block_bytes(std::size_t cap) const noexcept {
    return ids_offset(cap) + cap * sizeof(PageId);
  }
  [[nodiscard]] std::unique_ptr<unsigned char[]> make_block(std::uint32_t cap) const {
    return std::unique_ptr<unsigned char[]>(new unsigned char[block_bytes(cap)]);
  }
  [[nodiscard]] PageId* page_ids(const Node& x) const noexcept { return x.ids; }
  [[nodiscard]] token_type* tokens_of(const Node& x) const noexcept { return x.tok; }
  // The first live page's index in x's block.
  [[nodiscard]] std::size_t off_of(const Node& x) const noexcept {
    return static_cast<std::size_t>(x.ids -
                                    reinterpret_cast<PageId*>(x.block.get() + ids_offset(x.cap)));
  }
  // Gives x a fresh block of `cap` pages, all live from its first; the old block is freed.
  void set_block(Node& x, std::unique_ptr<unsigned char[]> block, std::uint32_t cap) noexcept {
    x.block = std::move(block);
    x.cap = cap;
    x.tok = reinterpret_cast<token_type*>(x.block.get());
    x.ids = reinterpret_cast<PageId*>(x.block.get() + ids_offset(cap));
  }
  // Drops x's first k live pages (a split gave them to a new node).
  void advance(Node& x, std::uint32_t k) noexcept {
    x.tok += std::size_t{k} * page_size_;
    x.ids += k;
    x.n -= k;
  }

  // The child of `parent` sharing the most leading pages with q (at least one), or npos,
  // read through `nodes` (nodes_.data()) and `edges` (edges_.view()): a caller that makes
  // calls between lookups keeps them in registers instead of reloading the members. `head`,
  // when `known`, is the edge-chain head of (parent, q[0]) from the previous level's Found.
  // With Copy (page size 1 only), the ids of the matched pages are written to out[0, pages).
  // A leaf is answered from its node, without probing the edge table (a likely cache miss):
  // every query that matches a whole cached sequence ends at one. Only a partial match pays
  // for the division by the page size.
  // The next level is looked up before the node is compared, and the first lines of the
  // next node's tokens and ids are prefetched: a node, its block and the next edge slot are
  // a chain of dependent loads, each a likely cache miss, which then overlaps the compare
  // instead of following it. The speculation is wasted only on a partial match (the last
  // node of a walk), and a leaf has nothing to look ahead to. Below look_ahead_bytes the
  // compare is too short to hide those misses and the look-ahead's instructions would cost
  // more than they save: only the next edge slot is prefetched.
  // Forced inline: out of line, saving and restoring its registers cost as much as the edge
  // probe on short pages.
  template <bool Copy>
  [[nodiscard]] [[gnu::always_inline]] Found find_child(const Node* nodes,
                                                        detail::PagedEdgeTable::View edges,
                                                        std::uint32_t parent, const token_type* q,
                                                        std::size_t q_pages, std::uint32_t head,
                                                        bool known, PageId* out) const noexcept {
    if (nodes[parent].first_child == npos) return {};
    const std::size_t ps = page_size_;
    const std::size_t pb = ps * sizeof(token_type);
    for (std::uint32_t c = known ? head : edges.find(parent, q[0]); c != npos;
         c = nodes[c].next_same) {
      const Node& x = nodes[c];
      const std::size_t pages = std::min<std::size_t>(x.n, q_pages);
      const std::size_t cmp = pages * pb;
      std::uint32_t next = npos;
      bool ahead = false;
      if (x.first_child != npos && q_pages > pages) {
        if (cmp >= look_ahead_bytes) {
          ahead = true;
          const void* tokens = nullptr;
          next = edges.find(c, q[pages * ps], tokens);
          if (next != npos) prefetch_head(&nodes[next], tokens);
        } else {
          edges.prefetch(c, q[pages * ps]);
        }
      }
      // Copy (page size 1, into a caller's table): one pass compares the tokens and copies
      // the ids of the matching ones to out, instead of a compare and then a second pass
      // over as many id bytes.
      // Otherwise every node of a path but the last matches whole, so "all equal" is asked
      // first, of memcmp: the C library picks the CPU's widest compare when the program
      // loads, and answers in fewer instructions than mismatch, which only a partial match
      // then pays.
      if constexpr (Copy) {
        const std::size_t same = detail::mismatch_copy(x.tok, q, x.ids, out, pages);
        if (same == pages) return {c, static_cast<std::uint32_t>(pages), next, ahead};
        if (same > 0) return {c, static_cast<std::uint32_t>(same)};
        continue;
      }
      if (std::memcmp(x.tok, q, cmp) == 0)
        return {c, static_cast<std::uint32_t>(pages), next, ahead};
      const std::size_t same = detail::mismatch(x.tok, q, cmp);
      const auto k = static_cast<std::uint32_t>(same / pb);
      if (k > 0) return {c, k};
    }
    return {};
  }

  // Asks for node x's line and the first lines of its tokens (up to 256 bytes: past them
  // the hardware prefetcher is following the compare), whose address the edge slot keeps
  // so that the two misses overlap instead of the node's preceding the block's. Prefetches
  // never fault: a stale or short hint costs only bandwidth. Forced inline: GCC deems a
  // function that only prefetches free of effects and deletes the calls to it.
  [[gnu::always_inline]] static void prefetch_head(const Node* x, const void* tokens) noexcept {
#if defined(__GNUC__) || defined(__clang__)
    const char* t = static_cast<const char*>(tokens);
    __builtin_prefetch(x);
    __builtin_prefetch(t);
    __builtin_prefetch(t + 64);
    __builtin_prefetch(t + 128);
    __builtin_prefetch(t + 192);
#else
    (void)x;
    (void)tokens;
#endif
  }

  // match(): walks the first q_pages pages of `tokens`, handing emit(offset in pages, ids,
  // count) the ids of each matched node in path order; with Copy (page size 1) the compare
  // writes them to out instead and emit is not called.
  template <bool Copy, class Emit>
  MatchEnd walk(std::span<const token_type> tokens, namespace_id ns, std::size_t q_pages,
                Emit&& emit, PageId* out) {
    if (publishing_) [[unlikely]]
      throw_reentered();
    ++stats_.lookups;
    stats_.query_tokens += tokens.size();
    ++tick_;
    const std::uint32_t slot = ns_slot(ns);
    if (slot == npos) return {};
    ns_hint_ = slot;
    // Locals: the compare and the copy are calls that may write any memory, after which
    // members would be loaded again at every node.
    const std::size_t ps = page_size_;
    const token_type* const q = tokens.data();
    Node* nodes = nodes_.data();
    const detail::PagedEdgeTable::View edges = edges_.view();
    std::uint32_t cur = ns_slots_[slot].root;
    std::size_t pos = 0;
    Found f;
    while (pos < q_pages) {
      f = find_child<Copy>(nodes, edges, cur, q + pos * ps, q_pages - pos, f.next, f.ahead,
                           Copy ? out + pos : nullptr);
      if (f.node == npos) break;
      std::uint32_t c = f.node;
      const std::size_t k = f.pages;
      const bool inside = k < nodes[c].n;  // the match ends inside c: split it there
      if (inside) {
        // prepare_split() may rehash the edge table, freeing the slots `edges` views; the
        // walk ends after this node, so `edges` is never read again.
        prepare_split();
        c = split(c, k, split_blocks(nodes_[c], k));
        nodes = nodes_.data();
      }
      touch_match(c, ns);
      const Node& x = nodes[c];
      if constexpr (!Copy) emit(pos, x.ids, std::size_t{x.n});
      pos += x.n;
      cur = c;
      if (inside) break;
    }
    stats_.hit_tokens += pos * ps;
    // The walk ends at the root exactly when it matched nothing.
    if (pos == 0) return {};
    return {pos * ps, PagedPrefixHandle{cur, nodes[cur].gen}};
  }

  // The slot of namespace `ns`, or npos. match() remembers the last slot it used: an engine
  // serving one model asks for the same namespace every time, and checking that slot is a
  // load where the map is a hash and a probe. Only one live slot holds a given id.
  [[nodiscard]] std::uint32_t ns_slot(namespace_id ns) const noexcept {
    if (ns_hint_ < ns_slots_.size() && ns_slots_[ns_hint_].live && ns_slots_[ns_hint_].id == ns)
      return ns_hint_;
    const auto it = ns_index_.find(ns);
    return it != ns_index_.end() ? it->second : npos;
  }

  // The sequence hash before node x's first page (none at the root).
  [[nodiscard]] std::optional<std::uint64_t> parent_hash(const Node& x) const noexcept {
    const Node& p = nodes_[x.parent];
    if (p.kind != Kind::node) return std::nullopt;
    return p.last_hash;
  }

  // Walks the sequence hashes of `n` pages at `tokens` following `parent`, calling
  // f(page index, hash) for each; returns the last one. Allocates nothing.
  template <class F>
  std::uint64_t chain(std::optional<std::uint64_t> parent, const token_type* tokens, std::size_t n,
                      std::uint64_t seed, F&& f) const noexcept {
    constexpr std::size_t batch = 32;
    std::uint64_t locals[batch];
    BlockHashOptions opts;
    opts.seed = seed;
    std::uint64_t h = 0;
    for (std::size_t base = 0; base < n; base += batch) {
      const std::size_t m = std::min(batch, n - base);
      local_block_hashes(std::span<const token_type>(tokens + base * page_size_, m * page_size_),
                         page_size_, std::span<std::uint64_t>(locals, m), opts);
      for (std::size_t i = 0; i < m; ++i) {
        h = parent ? sequence_hash(*parent, locals[i]) : locals[i];
        parent = h;
        f(static_cast<std::uint32_t>(base + i), h);
      }
    }
    return h;
  }

  [[nodiscard]] PagedPrefixHandle handle_of(std::uint32_t x) const noexcept {
    if (nodes_[x].kind != Kind::node) return {};
    return {x, nodes_[x].gen};
  }

  [[nodiscard]] PagedPolicyContext context(const Node& x, namespace_id ns,
                                           std::int64_t priority) const noexcept {
    return {tick_,
            priority,
            ns,
            x.depth,
            std::span<const token_type>(tokens_of(x), std::size_t{x.n} * page_size_),
            false,
            page_size_};
  }

  void touch_match(std::uint32_t x, namespace_id ns) noexcept {
    Node& nd = nodes_[x];
    const std::size_t before = class_of(nd);
    policy_.on_match(nd.meta, context(nd, ns, 0));
    touched(x, before);
  }

  void touch_insert(std::uint32_t x, namespace_id ns, std::int64_t priority) noexcept {
    Node& nd = nodes_[x];
    const std::size_t before = class_of(nd);
    policy_.on_insert_hit(nd.meta, context(nd, ns, priority));
    touched(x, before);
  }

  // After a hook changed x's metadata: a node whose key class changed moves its
  // pages to the new class and, if it is a leaf, to the new class's heap at once;
  // otherwise non-monotone keys are re-keyed at once and monotone ones lazily.
  void touched(std::uint32_t x, [[maybe_unused]] std::size_t before) noexcept {
    Node& nd = nodes_[x];
    if constexpr (classes > 1) {
      const std::size_t now = class_of(nd);
      if (now != before) {
        class_pages_[before] -= nd.n;
        class_pages_[now] += nd.n;
        if (nd.heap_pos != npos) {
          heap_erase_at(before, nd.heap_pos);
          heap_push(x);
        }
        return;
      }
    }
    if constexpr (!Policy::monotone_keys)
      if (nd.heap_pos != npos) heap_rekey(x);
  }

  // ---- node slots --------------------------------------------------------------------------

  void reserve_nodes(std::size_t k) {
    if (free_count_ >= k) return;
    const std::size_t need = nodes_.size() + (k - free_count_);
    if (need > npos) throw std::length_error("PagedPrefixCache: more than 2^32 - 1 nodes");
    if (need > nodes_.capacity())
      nodes_.reserve(std::max(need, nodes_.capacity() + nodes_.capacity() / 2));
  }

  // A heap holds at most one entry per node; keeping room for every node in each
  // lets unlock(), evict() and a change of key class push without allocating.
  // Grows geometrically.
  void reserve_heap(std::size_t n) {
    for (auto& heap : heaps_)
      if (n > heap.capacity()) heap.reserve(std::max(n, heap.capacity() + heap.capacity() / 2));
  }

  // Requires reserve_nodes(): never throws.
  std::uint32_t alloc_node() noexcept {
    if (free_head_ != npos) {
      const std::uint32_t x = free_head_;
      free_head_ = nodes_[x].next;
      --free_count_;
      nodes_[x].next = npos;
      return x;
    }
    nodes_.emplace_back();
    return static_cast<std::uint32_t>(nodes_.size() - 1);
  }

  void free_node(std::uint32_t x) noexcept {
    Node& nd = nodes_[x];
    block_pages_ -= nd.cap;
    nd.block.reset();
    nd.tok = nullptr;
    nd.ids = nullptr;
    nd.cap = nd.n = nd.depth = 0;
    nd.parent = nd.first_child = nd.prev = nd.next_same = npos;
    nd.lock = nd.own = 0;
    nd.heap_pos = npos;
    ++nd.gen;
    nd.kind = Kind::free;
    nd.next = free_head_;
    free_head_ = x;
    ++free_count_;
  }

  void create_namespace(namespace_id ns, std::uint64_t seed) {
    reserve_nodes(1);
    std::uint32_t slot = 0;
    while (slot < ns_slots_.size() && ns_slots_[slot].live)
      ++slot;
    if (slot == ns_slots_.size()) ns_slots_.emplace_back();
    try {
      ns_index_.emplace(ns, slot);
      try {
        seed_owner_.emplace(seed, ns);
      } catch (...) {
        ns_index_.erase(ns);
        throw;
      }
    } catch (...) {
      if (slot + 1 == ns_slots_.size() && !ns_slots_[slot].live) ns_slots_.pop_back();
      throw;
    }
    const std::uint32_t root = alloc_node();
    Node& r = nodes_[root];
    r.kind = Kind::root;
    r.ns = slot;
    ns_slots_[slot] = NsSlot{ns, seed, root, true};
  }

  // Undoes create_namespace(ns) for a namespace that holds nothing yet. Never throws.
  void drop_empty_namespace(namespace_id ns) noexcept {
    const std::uint32_t slot = ns_index_.find(ns)->second;
    release_slot(slot);
    if (slot + 1 == ns_slots_.size()) ns_slots_.pop_back();
  }

  // Frees the root, the id and the seed of the namespace in `slot`, whose other nodes
  // are gone, and marks the slot free for reuse. Never throws.
  void release_slot(std::uint32_t slot) noexcept {
    NsSlot& s = ns_slots_[slot];
    free_node(s.root);
    ns_index_.erase(s.id);
    seed_owner_.erase(s.seed);
    s = NsSlot{};
  }

  void check_seed_free(std::uint64_t seed, namespace_id ns) const {
    const auto so = seed_owner_.find(seed);
    if (so != seed_owner_.end() && so->second != ns)
      throw std::invalid_argument("PagedPrefixCache: another namespace uses this block-hash seed");
  }

  [[nodiscard]] std::size_t live_namespaces() const noexcept {
    return ns_index_.size();
  }

  // Nodes that are not the head of their (parent, first token) chain.
  [[nodiscard]] std::size_t chained_siblings() const noexcept {
    std::size_t k = 0;
    for (const Node& nd : nodes_)
      if (nd.kind == Kind::node && nd.next_same != npos) ++k;
    return k;
  }

  // ---- structure ---------------------------------------------------------------------------

  void prepare_split() {
    reserve_nodes(1);
    edges_.reserve(1);
    reserve_heap(stats_.nodes + 1);
  }

  // A new unlinked node holding a copy of n pages (their tokens and ids) in `block`, with
  // its parent, depth and namespace slot set; its links, locks, metadata and hash are the
  // caller's. Requires reserve_nodes() (it may reallocate nodes_). Never throws.
  std::uint32_t new_node(std::unique_ptr<unsigned char[]> block, std::uint32_t n,
                         const token_type* tokens, const PageId* ids, std::uint32_t parent,
                         std::uint32_t depth, std::uint32_t ns) noexcept {
    const std::uint32_t x = alloc_node();
    Node& nd = nodes_[x];
    set_block(nd, std::move(block), n);
    nd.n = n;
    block_pages_ += n;
    std::memcpy(nd.ids, ids, n * sizeof(PageId));
    std::memcpy(nd.tok, tokens, std::size_t{n} * page_bytes());
    nd.depth = depth;
    nd.parent = parent;
    nd.ns = ns;
    nd.kind = Kind::node;
    return x;
  }

  // The blocks a split of node x after its first k pages needs: the larger part keeps x's
  // block (the head on a tie) and the smaller one is copied to `small`, so a split copies at
  // most half the node; `keep`, when the larger part would fill at most half its block,
  // receives it too. Every node's block thus stays under twice its live pages (after a
  // trim, as far as memory allows), whatever the splits: a tail that kept its block forever (the
  // head always copied out) would pin the whole block of a context that is branched off page by
  // page. Throws std::bad_alloc.
  struct SplitBlocks {
    std::unique_ptr<unsigned char[]> small;
    std::unique_ptr<unsigned char[]> keep;
  };
  [[nodiscard]] SplitBlocks split_blocks(const Node& x, std::size_t k) const {
    const std::size_t big = std::max<std::size_t>(k, x.n - k);
    SplitBlocks b;
    b.small = make_block(static_cast<std::uint32_t>(x.n - big));
    if (big * 2 <= x.cap) b.keep = make_block(static_cast<std::uint32_t>(big));
    return b;
  }

  // Splits node c after its first k pages: a new node takes them (and c's place
  // under its parent); c keeps the rest, and its index, so handles to c still
  // name the same end. `blocks` comes from split_blocks(c, k). Requires
  // prepare_split() or equivalent. Never throws.
  std::uint32_t split(std::uint32_t c, std::size_t k_pages, SplitBlocks blocks) noexcept {
    const auto k = static_cast<std::uint32_t>(k_pages);
    const std::uint32_t h = alloc_node();
    Node& H = nodes_[h];
    Node& C = nodes_[c];
    const token_type first = tokens_of(C)[0];
    if (hashes_)
      H.last_hash = chain(parent_hash(C), tokens_of(C), k, ns_slots_[C.ns].seed,
                          [](std::uint32_t, std::uint64_t) {});
    H.depth = C.depth;
    H.parent = C.parent;
    H.ns = C.ns;
    H.kind = Kind::node;
    const std::uint32_t tail = C.n - k;
    if (k >= tail) {
      // The head keeps the block (it starts at C's first live page); the tail is copied.
      H.block = std::move(C.block);
      H.cap = std::exchange(C.cap, 0);
      H.tok = C.tok;
      H.ids = C.ids;
      H.n = k;
      rehome(C, std::move(blocks.small), tail, C.tok + std::size_t{k} * page_size_, C.ids + k);
      if (blocks.keep) rehome(H, std::move(blocks.keep), k, H.tok, H.ids);
    } else {
      rehome(H, std::move(blocks.small), k, C.tok, C.ids);
      advance(C, k);
      if (blocks.keep) rehome(C, std::move(blocks.keep), tail, C.tok, C.ids);
    }
    H.lock = C.lock;
    H.meta = C.meta;
    // H takes C's place among the siblings and in the edge chain.
    H.prev = C.prev;
    H.next = C.next;
    if (C.prev != npos) nodes_[C.prev].next = h;
    if (C.next != npos) nodes_[C.next].prev = h;
    Node& P = nodes_[C.parent];
    if (P.first_child == c) P.first_child = h;
    H.next_same = C.next_same;
    const std::uint32_t head = edges_.find(C.parent, first);
    if (head == c) {
      edges_.replace(C.parent, first, h, H.tok);
    } else {
      std::uint32_t e = head;
      while (nodes_[e].next_same != c)
        e = nodes_[e].next_same;
      nodes_[e].next_same = h;
    }
    // C becomes H's only child.
    C.depth += k;
    C.parent = h;
    C.prev = C.next = C.next_same = npos;
    H.first_child = c;
    edges_.insert_reserved(h, tokens_of(C)[0], c, C.tok);
    ++stats_.nodes;
    ++stats_.splits;
    return h;
  }

  // Gives x `block`, of exactly n pages, holding a copy of the n pages at tok and ids (which
  // may lie in x's current block: that one is freed after the copy), all of them live.
  // Never throws.
  void rehome(Node& x, std::unique_ptr<unsigned char[]> block, std::uint32_t n,
              const token_type* tok, const PageId* ids) noexcept {
    std::memcpy(block.get() + ids_offset(n), ids, n * sizeof(PageId));
    std::memcpy(block.get(), tok, std::size_t{n} * page_bytes());
    block_pages_ -= x.cap;
    block_pages_ += n;
    set_block(x, std::move(block), n);
    x.n = n;
  }

  // Adds a new unlocked leaf under `parent` holding n pages. Requires room for a
  // node, an edge and a heap entry. Never throws.
  std::uint32_t add_leaf(std::uint32_t parent, const token_type* tokens, const PageId* ids,
                         std::uint32_t n, std::unique_ptr<unsigned char[]> block, namespace_id ns,
                         std::int64_t priority, std::uint64_t last_hash) noexcept {
    const Node& p = nodes_[parent];
    const std::uint32_t x = new_node(std::move(block), n, tokens, ids, parent,
                                     p.kind == Kind::root ? 0U : p.depth + p.n, p.ns);
    Node& L = nodes_[x];
    Node& P = nodes_[parent];
    L.last_hash = last_hash;
    L.meta = policy_.on_create(context(L, ns, priority));
    // Link as the first child; chain behind any sibling with the same first token.
    L.prev = npos;
    L.next = P.first_child;
    if (P.first_child != npos) nodes_[P.first_child].prev = x;
    if (P.kind == Kind::node && P.first_child == npos && P.heap_pos != npos) heap_erase(parent);
    P.first_child = x;
    const std::uint32_t head = edges_.find(parent, tokens[0]);
    if (head == npos) {
      edges_.insert_reserved(parent, tokens[0], x, L.tok);
    } else {
      L.next_same = head;
      edges_.replace(parent, tokens[0], x, L.tok);
    }
    ++stats_.nodes;
    stats_.cached_pages += n;
    if constexpr (classes > 1) class_pages_[class_of(L)] += n;
    evictable_pages_ += n;
    heap_push(x);
    return x;
  }

  // Unlinks leaf x from its parent and the edge table, and frees it.
  void remove_leaf(std::uint32_t x) noexcept {
    Node& L = nodes_[x];
    Node& P = nodes_[L.parent];
    if (L.prev != npos) nodes_[L.prev].next = L.next;
    if (L.next != npos) nodes_[L.next].prev = L.prev;
    if (P.first_child == x) P.first_child = L.next;
    const token_type first = tokens_of(L)[0];
    const std::uint32_t head = edges_.find(L.parent, first);
    if (head == x) {
      if (L.next_same != npos)
        edges_.replace(L.parent, first, L.next_same, nodes_[L.next_same].tok);
      else
        edges_.erase(L.parent, first);
    } else {
      std::uint32_t e = head;
      while (nodes_[e].next_same != x)
        e = nodes_[e].next_same;
      nodes_[e].next_same = L.next_same;
    }
    --stats_.nodes;
    free_node(x);
  }

  // Keeps a trimmed node's block at most twice its live pages (best effort).
  void compact(Node& x) noexcept {
    if (std::size_t{x.n} * 2 > x.cap) return;
    std::unique_ptr<unsigned char[]> nb(new (std::nothrow) unsigned char[block_bytes(x.n)]);
    if (!nb) return;
    rehome(x, std::move(nb), x.n, x.tok, x.ids);
    // The edge naming x as its chain head carries x's tokens as its prefetch hint.
    const auto self = static_cast<std::uint32_t>(&x - nodes_.data());
    if (edges_.find(x.parent, x.tok[0]) == self) edges_.set_hint(x.parent, x.tok[0], x.tok);
  }

  template <class OnEvict>
  void evict_reserved(std::size_t target, OnEvict& on_evict,
                      std::vector<std::uint64_t>& removed) noexcept {
    std::size_t freed = 0;
    while (freed < target) {
      const std::size_t k = evict_class();
      heap_fresh_top(k);
      const std::uint32_t x = heaps_[k][0].node;
      Node& nd = nodes_[x];
      std::uint32_t take = static_cast<std::uint32_t>(std::min<std::size_t>(target - freed, nd.n));
      if constexpr (classes > 1) {
        // The policy chooses again after every page: its choice depends on the
        // pages per class, which this leaf's pages are leaving.
        std::uint32_t t = 0;
        do {
          --class_pages_[k];
          ++t;
        } while (t < take && evict_class() == k);
        take = t;
      }
      const std::uint32_t keep = nd.n - take;
      for (std::uint32_t i = nd.n; i-- > keep;)
        on_evict(page_ids(nd)[i]);
      if (hashes_) {
        // Only the last page's hash is kept: walk the node's chain once for the
        // hashes of the freed pages (deepest first) and the new last page's.
        const std::size_t first = removed.size();
        std::uint64_t new_last = 0;
        chain(parent_hash(nd), tokens_of(nd), nd.n, ns_slots_[nd.ns].seed,
              [&](std::uint32_t i, std::uint64_t h) {
                if (i + 1 == keep) new_last = h;
                if (i >= keep) removed.push_back(h);
              });
        std::reverse(removed.begin() + static_cast<std::ptrdiff_t>(first), removed.end());
        nd.last_hash = new_last;
      }
      PagedPolicyContext ctx = context(nd, ns_slots_[nd.ns].id, 0);
      ctx.tokens = ctx.tokens.subspan(std::size_t{keep} * page_size_);
      ctx.whole_node = keep == 0;
      ctx.depth_pages += keep;
      policy_.on_evict(nd.meta, ctx);
      stats_.cached_pages -= take;
      evictable_pages_ -= take;
      stats_.evicted_pages += take;
      freed += take;
      if (keep == 0) {
        const std::uint32_t parent = nd.parent;
        heap_erase_at(k, 0);
        remove_leaf(x);
        Node& p = nodes_[parent];
        if (p.kind == Kind::node && p.first_child == npos && p.lock == 0) heap_push(parent);
      } else {
        nd.n = keep;
        ++nd.gen;
        compact(nd);
      }
    }
  }

  template <class OnFree>
  void clear_reserved(OnFree& on_free) noexcept {
    for (std::uint32_t x = 0; x < nodes_.size(); ++x) {
      Node& nd = nodes_[x];
      if (nd.kind == Kind::root) {
        nd.first_child = npos;
        nd.lock = 0;
      }
      if (nd.kind != Kind::node) continue;
      for (std::uint32_t i = 0; i < nd.n; ++i)
        on_free(page_ids(nd)[i]);
      free_node(x);
    }
    stats_.cleared_pages += stats_.cached_pages;
    stats_.cached_pages = 0;
    stats_.nodes = 0;
    evictable_pages_ = 0;
    edges_.clear();
    for (auto& heap : heaps_)
      heap.clear();
    class_pages_ = {};
  }

  template <class OnFree>
  void erase_reserved(std::uint32_t slot, const std::vector<std::uint32_t>& order, OnFree& on_free,
                      std::vector<std::uint64_t>& removed) noexcept {
    // Children first, so every removal is of a leaf.
    for (std::size_t i = order.size(); i-- > 0;) {
      const std::uint32_t x = order[i];
      Node& nd = nodes_[x];
      for (std::uint32_t j = nd.n; j-- > 0;)
        on_free(page_ids(nd)[j]);
      if (hashes_) {  // the parent is still there: children go first
        const std::size_t first = removed.size();
        chain(parent_hash(nd), tokens_of(nd), nd.n, ns_slots_[nd.ns].seed,
              [&](std::uint32_t, std::uint64_t h) { removed.push_back(h); });
        std::reverse(removed.begin() + static_cast<std::ptrdiff_t>(first), removed.end());
      }
      stats_.cached_pages -= nd.n;
      if constexpr (classes > 1) class_pages_[class_of(nd)] -= nd.n;
      evictable_pages_ -= nd.n;
      if (nd.heap_pos != npos) heap_erase(x);
      remove_leaf(x);
    }
    release_slot(slot);
  }

  // The payload is emplaced into the event: building a variant first and moving
  // it in trips GCC's maybe-uninitialized analysis at -O1 and above.
  template <class Payload>
  void publish(Payload&& payload) {
    if (!sink_) return;
    KvEvent ev;
    ev.event_id = next_event_id_++;
    ev.data.template emplace<std::decay_t<Payload>>(std::forward<Payload>(payload));
    ++stats_.events;
    // The caller's saved state (insert's path and reserved space, evict's heap) would go
    // stale if the sink changed the cache: every non-const member refuses while this runs.
    publishing_ = true;
    struct Reset {
      bool& flag;
      ~Reset() { flag = false; }
    } reset{publishing_};
    sink_(ev);
  }

  // A non-const member called from the event sink: refused, nothing changed.
  [[noreturn]] static void throw_reentered() {
    throw std::logic_error("PagedPrefixCache: called from its own event sink");
  }

  // ---- heaps of evictable leaves, one per key class ------------------------------------------

  // The key class of a node (always 0 for a policy without classes). A leaf is
  // in heaps_[class_of(leaf)]: a hook that changes the class moves it at once.
  [[nodiscard]] std::size_t class_of(const Node& nd) const noexcept {
    if constexpr (classes == 1)
      return 0;
    else
      return std::min<std::size_t>(policy_.key_class(nd.meta), classes - 1);
  }

  // The class evict() takes its next leaf from: the policy's choice, else the
  // first class after it (cyclically) with an evictable leaf. Requires one.
  [[nodiscard]] std::size_t evict_class() noexcept {
    if constexpr (classes == 1) {
      return 0;
    } else {
      const std::span<const std::size_t> pages(class_pages_);
      std::size_t k = 0;
      if constexpr (requires(std::span<const key_type* const> t) {
                      policy_.choose_class(pages, t);
                    }) {
        // The policy also sees each class's least key (nullptr: no evictable leaf).
        const key_type* tops[classes];
        for (std::size_t c = 0; c < classes; ++c) {
          if (!heaps_[c].empty()) heap_fresh_top(c);
          tops[c] = heaps_[c].empty() ? nullptr : &heaps_[c][0].key;
        }
        k = policy_.choose_class(pages, std::span<const key_type* const>(tops));
      } else {
        k = policy_.choose_class(pages);
      }
      k = std::min<std::size_t>(k, classes - 1);
      while (heaps_[k].empty())
        k = k + 1 == classes ? 0 : k + 1;
      return k;
    }
  }

  [[nodiscard]] std::size_t heap_size() const noexcept {
    std::size_t n = 0;
    for (const auto& heap : heaps_)
      n += heap.size();
    return n;
  }

  [[nodiscard]] std::size_t heap_capacity() const noexcept {
    std::size_t n = 0;
    for (const auto& heap : heaps_)
      n += heap.capacity();
    return n;
  }

  void heap_set(std::vector<HeapEntry>& heap, std::size_t i, const HeapEntry& e) noexcept {
    heap[i] = e;
    nodes_[e.node].heap_pos = static_cast<std::uint32_t>(i);
  }

  void sift_up(std::vector<HeapEntry>& heap, std::size_t i) noexcept {
    const HeapEntry e = heap[i];
    while (i > 0) {
      const std::size_t p = (i - 1) / 2;
      if (!(e.key < heap[p].key)) break;
      heap_set(heap, i, heap[p]);
      i = p;
    }
    heap_set(heap, i, e);
  }

  void sift_down(std::vector<HeapEntry>& heap, std::size_t i) noexcept {
    const HeapEntry e = heap[i];
    const std::size_t n = heap.size();
    for (;;) {
      std::size_t c = 2 * i + 1;
      if (c >= n) break;
      if (c + 1 < n && heap[c + 1].key < heap[c].key) ++c;
      if (!(heap[c].key < e.key)) break;
      heap_set(heap, i, heap[c]);
      i = c;
    }
    heap_set(heap, i, e);
  }

  // Requires capacity (kept at least the number of live nodes). Never throws.
  void heap_push(std::uint32_t x) noexcept {
    auto& heap = heaps_[class_of(nodes_[x])];
    heap.push_back(HeapEntry{policy_.key(nodes_[x].meta), x});
    nodes_[x].heap_pos = static_cast<std::uint32_t>(heap.size() - 1);
    sift_up(heap, heap.size() - 1);
  }

  void heap_erase_at(std::size_t k, std::size_t i) noexcept {
    auto& heap = heaps_[k];
    nodes_[heap[i].node].heap_pos = npos;
    const HeapEntry last = heap.back();
    heap.pop_back();
    if (i == heap.size()) return;
    heap_set(heap, i, last);
    sift_up(heap, i);
    sift_down(heap, nodes_[last.node].heap_pos);
  }

  // Removes leaf x from its heap.
  void heap_erase(std::uint32_t x) noexcept {
    heap_erase_at(class_of(nodes_[x]), nodes_[x].heap_pos);
  }

  void heap_rekey(std::uint32_t x) noexcept {
    auto& heap = heaps_[class_of(nodes_[x])];
    const std::size_t i = nodes_[x].heap_pos;
    heap[i].key = policy_.key(nodes_[x].meta);
    sift_up(heap, i);
    sift_down(heap, nodes_[x].heap_pos);
  }

  // Lazy re-keying: a leaf whose key grew since it was pushed sinks when it
  // reaches the top, so the top is then the true minimum.
  void heap_fresh_top([[maybe_unused]] std::size_t k) noexcept {
    if constexpr (Policy::monotone_keys) {
      auto& heap = heaps_[k];
      for (;;) {
        const key_type now = policy_.key(nodes_[heap[0].node].meta);
        if (!(heap[0].key < now)) return;
        heap[0].key = now;
        sift_down(heap, 0);
      }
    }
  }

  std::size_t page_size_;
  Policy policy_;
  event_sink sink_;
  bool hashes_;
  std::vector<Node> nodes_;
  std::uint32_t free_head_ = npos;
  std::size_t free_count_ = 0;
  std::size_t block_pages_ = 0;  // pages of block capacity over all nodes
  std::size_t evictable_pages_ = 0;
  detail::PagedEdgeTable edges_;
  std::array<std::vector<HeapEntry>, classes> heaps_;
  std::array<std::size_t, classes> class_pages_{};  // cached pages per key class (classes > 1)
  std::vector<NsSlot> ns_slots_;
  ns_map ns_index_;
  seed_map seed_owner_;
  std::vector<std::uint32_t> path_;  // insert's scratch: fully matched nodes of the path
  std::uint32_t ns_hint_ = npos;     // the slot match() used last (checked before use)
  std::uint64_t tick_ = 0;
  std::uint64_t next_event_id_ = 0;
  PagedCacheStats stats_;
  bool publishing_ = false;  // the sink is running: non-const members throw std::logic_error
};

}  // namespace promptcache

#endif  // PROMPTCACHE_PAGED_PREFIX_CACHE_HPP
