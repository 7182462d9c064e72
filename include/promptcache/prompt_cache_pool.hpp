// promptcache: prompt_cache_pool.hpp
// SPDX-License-Identifier: Apache-2.0
//
// A process-local pool of recently used prompt prefixes and the per-layer KV
// state an engine computed for them. A stateless server sends the full token
// list on every call; the pool answers "which stored prefix of this request can
// I resume from" and keeps the state after each call.
//
// Layout: one compressed trie (radix tree) per namespace over token ids; an
// entry lives on the node where its ids end. Edge labels are not copies: they
// point into the ids of some entry stored below the edge, so the index costs a
// few dozen bytes per node on top of the ids the entries own anyway. Unpinned
// entries also sit on an intrusive recency list (one per distinct TTL), which
// gives the LRU victim in O(1) and lets TTL expiry stop at the first live
// entry. Lookup and insert cost O(query length), whatever the pool size.
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
#endif
#if !defined(PROMPTCACHE_PROMPT_CACHE_POOL_HPP) && \
    (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) >= 202002L
#define PROMPTCACHE_PROMPT_CACHE_POOL_HPP

#include <algorithm>
#include <bit>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "detail/mismatch.hpp"
#include "detail/pool_child_map.hpp"

namespace promptcache {

/// How find_longest_prefix matches stored entries against a query.
enum class MatchMode {
  /// An entry must be a prefix of the query (an append-only KV cache). The seed behaviour.
  exact_prefix,
  /// The entry sharing the longest common prefix wins; the caller trims the
  /// entry's state to Hit::matched tokens (truncatable attention caches only).
  common_prefix,
};

/// Default size customization point: entries weigh 0 bytes, so Options::max_bytes must stay 0.
struct unsized_caches {
  /// Always 0.
  template <class LayerCache>
  constexpr std::size_t operator()(const LayerCache&) const noexcept {
    return 0;
  }
};

/// Counters (since construction or reset_stats()) and gauges (current) of one pool.
struct PoolStats {
  std::uint64_t lookups = 0;             ///< find_longest_prefix calls.
  std::uint64_t hits = 0;                ///< Lookups that returned an entry.
  std::uint64_t query_tokens = 0;        ///< Sum of query lengths over all lookups.
  std::uint64_t matched_tokens = 0;      ///< Sum of Hit::matched over all hits.
  std::uint64_t inserted = 0;            ///< Inserts that added a new entry.
  std::uint64_t extended = 0;            ///< Inserts that replaced a shorter lineage entry.
  std::uint64_t updated = 0;             ///< Inserts that replaced an entry with equal ids.
  std::uint64_t rejected_empty = 0;      ///< Inserts rejected: empty ids.
  std::uint64_t rejected_too_short = 0;  ///< Inserts rejected: below min_cacheable_tokens.
  std::uint64_t rejected_too_large = 0;  ///< Inserts rejected: entry alone exceeds max_bytes.
  std::uint64_t evicted_lru = 0;         ///< Evictions to stay within max_entries.
  std::uint64_t evicted_ttl = 0;         ///< Evictions of idle-expired entries.
  std::uint64_t evicted_bytes = 0;       ///< Evictions to stay within max_bytes.
  std::uint64_t evicted_explicit = 0;    ///< erase / erase_namespace / clear removals.
  std::uint64_t superseded = 0;    ///< Common-prefix mode: shorter prefixes retired by an insert.
  std::size_t entries = 0;         ///< Gauge: stored entries.
  std::size_t pinned_entries = 0;  ///< Gauge: stored pinned entries.
  std::size_t bytes = 0;           ///< Gauge: sum of entry sizes (size customization point).
};

/// Memory of a pool, split into the index and the token ids it indexes.
struct PoolMemory {
  std::size_t index_bytes = 0;  ///< Tree nodes, child tables, per-entry records, namespaces, lists.
  std::size_t id_bytes = 0;     ///< Bytes of token ids owned by the stored entries.
};

template <class LayerCache, std::integral Token, class Clock, class CacheBytes>
class SynchronizedPromptCachePool;

/// A pool of prompt prefixes and their per-layer state (see the file comment).
///
/// - `LayerCache`: the engine's per-layer state; copied never, moved only inside std::vector.
/// - `Token`: token id type (any integral type but bool).
/// - `Clock`: has `now()` and the std clock typedefs; used through an instance, so a
///   ManualClock handle shared with a test drives TTLs. Must not go backwards.
/// - `CacheBytes`: size customization point for the byte budget: a default-constructible
///   functor `std::size_t(const LayerCache&)`; an entry weighs the sum over its caches.
///   It must be callable concurrently (SynchronizedPromptCachePool calls it unlocked).
///
/// Costs below use T, the number of TTL lists: the most distinct idle TTLs the pool has held
/// at once (a list left empty is reused for the next new TTL), 1 without per-entry TTLs.
///
/// Invalidation: no operation invalidates anything a caller holds. Hits and find_exact()
/// return shared snapshots; removing an entry (eviction, replacement, erase, clear) only
/// drops the pool's reference. There are no iterators.
///
/// Not thread-safe; see SynchronizedPromptCachePool. Not copyable or movable (hold it
/// by unique_ptr if it has to move).
template <class LayerCache, std::integral Token = std::uint32_t,
          class Clock = std::chrono::steady_clock, class CacheBytes = unsized_caches>
class PromptCachePool {
  static_assert(!std::is_same_v<std::remove_cv_t<Token>, bool>, "Token must not be bool");

 public:
  using token_type = Token;                       ///< Token id type.
  using clock_type = Clock;                       ///< Clock type.
  using duration = typename Clock::duration;      ///< Clock duration (TTLs).
  using time_point = typename Clock::time_point;  ///< Clock time point.
  using namespace_id = std::uint64_t;             ///< Tenant / model / adapter key.

  /// Pool configuration; fixed at construction.
  struct Options {
    std::size_t max_entries = 16;  ///< LRU-evict unpinned entries beyond this count.
    /// Idle TTL of unpinned entries (<= 0: they expire at the next check).
    duration ttl = std::chrono::minutes(5);
    std::size_t min_cacheable_tokens = 8;  ///< Shorter ids are stored only to extend a lineage.
    MatchMode match = MatchMode::exact_prefix;  ///< Exact-prefix (seed) or common-prefix lookups.
    bool keep_one_token = false;       ///< Cap a hit at query length - 1 (engine needs one token).
    std::size_t min_match_tokens = 0;  ///< A hit matching fewer tokens is reported as a miss.
    std::size_t max_bytes = 0;         ///< Byte budget over CacheBytes sizes; 0 = unlimited.
  };

  /// One stored prefix. Immutable once stored; shared with every hit that returned it.
  struct Entry {
    std::vector<Token> ids{};          ///< The prefix's token ids (never empty).
    std::vector<LayerCache> caches{};  ///< Per-layer state after processing `ids`.
    std::size_t fed_images = 0;        ///< Images already spliced into `caches`.
    std::size_t fed_audios = 0;        ///< Audio clips already spliced into `caches`.
    /// Pinned when this snapshot was stored (pin()/unpin() don't rewrite snapshots).
    bool pinned = false;
  };

  /// A lookup result: a snapshot of the entry and how many query tokens it covers.
  struct Hit {
    std::shared_ptr<const Entry> entry{};  ///< Snapshot; stays valid after eviction.
    std::size_t matched = 0;               ///< Leading query tokens the entry's state covers.
    /// Tokens to cut from the entry's state before resuming (0 in exact-prefix mode).
    [[nodiscard]] std::size_t trim() const noexcept { return entry->ids.size() - matched; }
  };

  /// What an insert did.
  enum class InsertResult {
    inserted,            ///< Stored as a new entry.
    extended,            ///< Replaced a stored entry whose ids are a proper prefix (same lineage).
    updated,             ///< Replaced the stored entry with identical ids.
    rejected_empty,      ///< Empty ids; nothing changed.
    rejected_too_short,  ///< Below min_cacheable_tokens, extends nothing; nothing changed.
    rejected_too_large,  ///< Alone larger than max_bytes; nothing changed.
  };

  /// Per-insert options for insert().
  struct InsertOptions {
    bool pinned = false;            ///< Exempt from LRU, byte and TTL eviction.
    std::optional<duration> ttl{};  ///< Idle TTL of this entry (default: Options::ttl).
    namespace_id ns = 0;            ///< Namespace; entries of other namespaces never interact.
    std::size_t fed_images = 0;     ///< Stored as Entry::fed_images.
    std::size_t fed_audios = 0;     ///< Stored as Entry::fed_audios.
  };

  /// Seed-style constructor (exact-prefix mode, no byte budget).
  PromptCachePool(std::size_t max_entries, duration ttl, std::size_t min_cacheable_tokens,
                  Clock clock = Clock{})
      : PromptCachePool(Options{max_entries, ttl, min_cacheable_tokens}, std::move(clock)) {}

  /// Pool with the given options. Throws std::invalid_argument if max_bytes != 0 while
  /// CacheBytes is unsized_caches (every entry would weigh 0, silently ignoring the budget).
  explicit PromptCachePool(Options options, Clock clock = Clock{}, CacheBytes cache_bytes = {})
      : options_(options), clock_(std::move(clock)), cache_bytes_(std::move(cache_bytes)) {
    if (std::is_same_v<CacheBytes, unsized_caches> && options_.max_bytes != 0) {
      throw std::invalid_argument("PromptCachePool: max_bytes needs a CacheBytes functor");
    }
    classes_.push_back(TtlClass{options_.ttl, nullptr, nullptr, 0});
  }

  /// 16 entries, 5 minute idle TTL, 8-token minimum (the seed defaults).
  static PromptCachePool with_defaults() { return PromptCachePool(Options{}); }

  /// Not copyable (entries are shared through hits; nothing is deep-copied).
  PromptCachePool(const PromptCachePool&) = delete;
  /// Not copy-assignable (see the copy constructor).
  PromptCachePool& operator=(const PromptCachePool&) = delete;
  /// Not movable (hold the pool by unique_ptr to move it).
  PromptCachePool(PromptCachePool&&) = delete;
  /// Not move-assignable (see the move constructor).
  PromptCachePool& operator=(PromptCachePool&&) = delete;

  /// Releases every entry (snapshots held by callers stay valid). O(entries + nodes).
  ~PromptCachePool() {
    for (auto& [ns, root] : roots_)
      drop_tree(root.get());
    free_retired(std::exchange(retired_, nullptr));
  }

  /// The options the pool was built with.
  [[nodiscard]] const Options& options() const noexcept { return options_; }

  /// Evicts expired entries, then returns the best stored entry for `ids` in namespace `ns`
  /// (exact-prefix: the longest stored prefix; common-prefix: the longest common prefix,
  /// preferring no trim, then the shortest entry, then the most recent) and refreshes its
  /// recency. Empty query, no match or a match below min_match_tokens: nullopt.
  /// O(|ids| + expired + T), T = TTL lists (common-prefix mode: + O(depth) to record the
  /// hit's recency; the heaps are re-sorted later, see insert); invalidates nothing a caller
  /// holds.
  std::optional<Hit> find_longest_prefix(std::span<const Token> ids, namespace_id ns = 0) {
    const time_point now = clock_.now();
    expire(now);
    ++stats_.lookups;
    stats_.query_tokens += ids.size();
    std::optional<Hit> result;
    if (!ids.empty()) {
      const std::size_t limit = options_.keep_one_token ? ids.size() - 1 : ids.size();
      Match m = options_.match == MatchMode::exact_prefix ? match_exact(ids, limit, ns)
                                                          : match_common(ids, limit, ns);
      if (m.slot != nullptr && m.matched > 0 && m.matched >= options_.min_match_tokens) {
        touch(m.slot, now);
        ++stats_.hits;
        stats_.matched_tokens += m.matched;
        result.emplace(Hit{m.slot->entry, m.matched});
      }
    }
    release_retired();
    return result;
  }

  /// Seed-style insert: insert(ids, caches, {pinned, default ttl, namespace 0, media counts}).
  InsertResult insert_or_update(std::vector<Token> ids, std::vector<LayerCache> caches,
                                std::size_t fed_images, std::size_t fed_audios, bool pinned) {
    InsertOptions o;
    o.pinned = pinned;
    o.fed_images = fed_images;
    o.fed_audios = fed_audios;
    return insert(std::move(ids), std::move(caches), o);
  }

  /// Stores the state for `ids`: updates an entry with equal ids (pinned if either is),
  /// else replaces the deepest unpinned entry whose ids are a proper prefix (extended),
  /// else adds an entry (inserted); then LRU-evicts unpinned entries beyond max_entries
  /// and max_bytes (the new entry too, if nothing else is evictable). Expired entries are
  /// not collected here (lookups and evict_expired do that), as in the seed. In
  /// common-prefix mode an extension also retires every other unpinned strict prefix of the
  /// new ids (counted as `superseded`): the new entry serves them all by trimming, so they
  /// would only hold budget. Strong exception guarantee: if anything throws, the pool is
  /// unchanged. O(|ids| + |caches| + T + evicted x T), T = TTL lists; common-prefix mode adds
  /// O(depth x log fan-out) per change, plus one sift for each child that lookups touched
  /// since the last change to its parent (amortized O(1) per lookup).
  InsertResult insert(std::vector<Token> ids, std::vector<LayerCache> caches,
                      const InsertOptions& options = {}) {
    const std::size_t bytes = entry_bytes(caches);
    SlotPtr slot = make_record(std::move(ids), std::move(caches), options);
    const InsertResult r = insert_prepared(slot, bytes, options);
    release_retired();
    return r;
  }

  /// Removes every unpinned entry idle for at least its TTL; returns how many.
  /// O(expired + T), T = TTL lists.
  std::size_t evict_expired() {
    const std::size_t n = expire(clock_.now());
    release_retired();
    return n;
  }

  /// Removes the entry with exactly `ids` in `ns` (pinned or not). O(|ids|).
  bool erase(std::span<const Token> ids, namespace_id ns = 0) {
    Slot* s = find_slot(ids, ns);
    if (s == nullptr) return false;
    remove_slot(s, Reason::explicit_removal);
    release_retired();
    return true;
  }

  /// Removes every entry of namespace `ns`; returns how many. O(entries + nodes of `ns`).
  std::size_t erase_namespace(namespace_id ns) {
    auto it = roots_.find(ns);
    if (it == roots_.end()) return 0;
    const std::size_t n = drop_tree(it->second.get());
    roots_.erase(it);
    if (ns == 0) root0_ = nullptr;
    release_retired();
    return n;
  }

  /// Removes every entry of every namespace. O(entries + nodes).
  void clear() {
    for (auto& [ns, root] : roots_)
      drop_tree(root.get());
    roots_.clear();
    root0_ = nullptr;
    release_retired();
  }

  /// Pins the entry with exactly `ids`: exempt from LRU, byte and TTL eviction. O(|ids|).
  /// Returns false if there is no such entry. Snapshots are not rewritten (Entry::pinned).
  bool pin(std::span<const Token> ids, namespace_id ns = 0) {
    Slot* s = find_slot(ids, ns);
    if (s == nullptr) return false;
    if (!s->pinned) {
      list_unlink(s);
      s->pinned = true;
      ++stats_.pinned_entries;
    }
    return true;
  }

  /// Unpins the entry with exactly `ids`; it counts as used now (most recent, fresh TTL),
  /// then budgets are enforced. Returns false if there is no such entry. If the clock
  /// throws, nothing changed. O(|ids| + evicted x T), T = TTL lists.
  bool unpin(std::span<const Token> ids, namespace_id ns = 0) {
    Slot* s = find_slot(ids, ns);
    if (s == nullptr) return false;
    if (s->pinned) {
      const time_point now = clock_.now();  // first: if the clock throws, nothing changed
      s->pinned = false;
      --stats_.pinned_entries;
      s->last_used = now;
      s->seq = ++seq_;
      list_push_back(s);
      if (options_.match == MatchMode::common_prefix) propagate(s->node);
      enforce_budgets();
      release_retired();
    }
    return true;
  }

  /// Whether an entry with exactly `ids` exists and is pinned. O(|ids|).
  [[nodiscard]] bool is_pinned(std::span<const Token> ids, namespace_id ns = 0) const {
    const Slot* s = find_slot(ids, ns);
    return s != nullptr && s->pinned;
  }

  /// The entry with exactly `ids`, without evicting or refreshing anything (it may be
  /// past its TTL but not yet collected); nullptr if absent. O(|ids|).
  [[nodiscard]] std::shared_ptr<const Entry> find_exact(std::span<const Token> ids,
                                                        namespace_id ns = 0) const {
    const Slot* s = find_slot(ids, ns);
    return s == nullptr ? nullptr : s->entry;
  }

  /// Number of stored entries (all namespaces). O(1).
  [[nodiscard]] std::size_t size() const noexcept { return stats_.entries; }
  /// Whether no entry is stored. O(1).
  [[nodiscard]] bool empty() const noexcept { return stats_.entries == 0; }
  /// Sum of stored entry sizes per CacheBytes. O(1).
  [[nodiscard]] std::size_t bytes() const noexcept { return stats_.bytes; }

  /// Counters and gauges. O(1).
  [[nodiscard]] PoolStats stats() const noexcept { return stats_; }
  /// Zeroes the counters (gauges keep their values). O(1).
  void reset_stats() noexcept {
    PoolStats fresh;
    fresh.entries = stats_.entries;
    fresh.pinned_entries = stats_.pinned_entries;
    fresh.bytes = stats_.bytes;
    stats_ = fresh;
  }

  /// The size of an entry holding `caches` (sum of CacheBytes over them, saturating at
  /// SIZE_MAX so that an absurd size is too large rather than wrapping to a small one).
  /// O(|caches|).
  [[nodiscard]] std::size_t entry_bytes(const std::vector<LayerCache>& caches) const {
    std::size_t total = 0;
    for (const LayerCache& c : caches) {
      const auto b = static_cast<std::size_t>(cache_bytes_(c));
      total = b > SIZE_MAX - total ? SIZE_MAX : total + b;
    }
    return total;
  }

  /// Memory of the index vs the ids it indexes (LayerCache payloads excluded). O(nodes).
  [[nodiscard]] PoolMemory memory_usage() const {
    PoolMemory m;
    m.index_bytes = sizeof(*this) + classes_.capacity() * sizeof(TtlClass) +
                    roots_.bucket_count() * sizeof(void*) +
                    roots_.size() * (sizeof(std::pair<namespace_id, std::unique_ptr<Node>>) +
                                     2 * sizeof(void*));
    for (const auto& [ns, root] : roots_) {
      visit(root.get(), [&](const Node* n) {
        m.index_bytes += sizeof(Node) + n->children.table_bytes();
        if (n->slot) {
          // The record and the Entry object in one block with the shared_ptr control block
          // (not the ids).
          m.index_bytes += sizeof(Record) + 2 * sizeof(void*);
          m.id_bytes += n->slot->entry->ids.size() * sizeof(Token);
        }
      });
    }
    return m;
  }

  /// Verifies every structural invariant (tree shape, labels, heaps, lists, TTL classes,
  /// gauges); throws std::logic_error describing the first violation. For tests: O(nodes x
  /// subtree size + entries x length) (each label's owner is searched for in its subtree).
  void check_invariants() const {
    std::size_t entries = 0, pinned = 0, bytes = 0;
    std::vector<std::size_t> members(classes_.size(), 0);
    for (const auto& kv : roots_) {
      const namespace_id nsv = kv.first;
      const Node* root = kv.second.get();
      require(root->parent == nullptr && !root->slot && root->depth == 0, "root shape");
      require(nsv != 0 || root == root0_, "root0 cache");
      visit(root, [&](const Node* n) {
        n->children.for_each([&](const Node* c) {
          require(c->parent == n, "parent link");
          require(c->label_len > 0 && c->depth == n->depth + c->label_len, "depth");
          require(c->label[0] == c->first && n->children.find(c->first) == c, "first token");
          const auto* e = n->children.find_slot(c->first);
          require(e->label == c->label && label_len_of(e) == c->label_len, "label copy");
        });
        if (options_.match == MatchMode::common_prefix) {
          require(n->heap.size() == n->children.size(), "heap size");
          std::size_t stale = 0;
          for (const Node* c = n->stale; c != nullptr; c = c->stale_next, ++stale)
            require(c->parent == n && c->is_stale && stale < n->heap.size(), "stale list");
          for (std::size_t i = 0; i < n->heap.size(); ++i) {
            const HeapItem& it = n->heap[i];
            const Node* c = it.node;
            require(c->parent == n && c->heap_pos == i, "heap links");
            // A stale item has its child's length and an older touch order; others are exact.
            require(it.len == c->best->len &&
                        (c->is_stale ? it.seq <= c->best->seq : it.seq == c->best->seq),
                    "heap keys");
            require(i == 0 || !item_better(it, n->heap[(i - 1) / kArity]), "heap order");
            if (c->is_stale) --stale;
          }
          require(stale == 0, "stale list members");
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
          ++entries;
          bytes += s->bytes;
          require(s->node == n && s->ns == nsv, "slot back link");
          require(s->ttl_class < classes_.size(), "ttl class index");
          ++members[s->ttl_class];
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
          if (s->pinned) ++pinned;
        }
        if (options_.match == MatchMode::common_prefix) {
          const Slot* b = n->slot.get();
          n->children.for_each([&](const Node* c) {
            if (b == nullptr || better(c->best, b)) b = c->best;
          });
          require(n->best == b, "common-prefix aggregate");
        }
      });
    }
    const auto ns0 = roots_.find(0);
    require(root0_ == (ns0 == roots_.end() ? nullptr : ns0->second.get()), "root0 cache");
    require(!classes_.empty() && classes_[0].ttl == options_.ttl, "default ttl class");
    for (std::size_t i = 0; i < classes_.size(); ++i)
      require(classes_[i].members == members[i], "ttl class members");
    std::size_t listed = 0;
    for (const TtlClass& cls : classes_) {
      const Slot* prev = nullptr;
      for (const Slot* s = cls.head; s != nullptr; s = s->next) {
        require(!s->pinned && s->prev == prev, "list links");
        require(prev == nullptr || prev->seq < s->seq, "list order");
        require(&classes_[s->ttl_class] == &cls, "list class");
        prev = s;
        ++listed;
      }
      require(cls.tail == prev, "list tail");
    }
    require(entries == stats_.entries && pinned == stats_.pinned_entries, "entry gauges");
    require(listed == entries - pinned, "listed entries");
    require(bytes == stats_.bytes, "byte gauge");
    require(retired_ == nullptr, "retired list");
  }

 private:
  friend class SynchronizedPromptCachePool<LayerCache, Token, Clock, CacheBytes>;

  struct Node;
  struct Slot;
  struct SlotRelease;
  using SlotPtr = std::unique_ptr<Slot, SlotRelease>;

  // The pool's record of one stored entry. What a hit reads and writes (entry, recency links,
  // touch order, TTL class, pinned) fills the first cache line; the rest is for inserts.
  struct Slot {
    std::shared_ptr<const Entry> entry;
    Slot* prev = nullptr;  // recency list of its TTL class (unpinned entries only)
    Slot* next = nullptr;  // ... and the retired chain once removed
    Node* node = nullptr;
    std::uint64_t seq = 0;  // global touch order: a larger seq is more recent
    time_point last_used{};
    std::uint32_t ttl_class = 0;  // index into classes_ (at most one class per stored entry)
    bool pinned = false;
    std::size_t len = 0;  // entry->ids.size(), kept here to spare a dereference
    std::size_t bytes = 0;
    namespace_id ns = 0;
  };

  // A stored entry's record and its snapshot share one allocation with the snapshot's
  // reference count, so a hit (which touches the record and copies the snapshot) reaches one
  // block, not two. The record owns the block through its own `entry` (an aliasing
  // shared_ptr); SlotRelease ends that when the pool lets go of the record, and the block
  // then lives exactly as long as the snapshots handed out.
  struct Record {
    Slot slot;
    Entry entry;
  };

  struct SlotRelease {
    void operator()(Slot* s) const noexcept {
      // Moved out first: the last reference frees the block that holds *s.
      std::shared_ptr<const Entry> last = std::move(s->entry);
    }
  };

  static SlotPtr make_record(std::vector<Token>&& ids, std::vector<LayerCache>&& caches,
                             const InsertOptions& o) {
    auto block = std::make_shared<Record>();
    Entry* e = &block->entry;
    e->ids = std::move(ids);
    e->caches = std::move(caches);
    e->fed_images = o.fed_images;
    e->fed_audios = o.fed_audios;
    Slot* s = &block->slot;
    s->entry = std::shared_ptr<const Entry>(std::move(block), e);
    return SlotPtr(s);
  }

  // A child in its parent's heap, with the key of its best slot copied in, so sifting reads
  // the (mostly cached) heap array instead of chasing two pointers per comparison.
  struct HeapItem {
    std::size_t len;
    std::uint64_t seq;
    Node* node;
  };

  // The fields a lookup reads (label, depths, best, child table) come first, so that a node
  // on the lookup path costs one cache line rather than two or three.
  struct Node {
    const Token* label = nullptr;  // points into owner->ids
    std::size_t label_len = 0;
    std::size_t depth = 0;  // tokens from the root through the end of the label
    Slot* best = nullptr;   // common-prefix mode: shortest, then most recent slot below
    Node* parent = nullptr;
    bool is_stale = false;  // listed in the parent's stale list
    Token first{};          // label[0], kept here so teardown never reads freed ids
    detail::PoolChildMap<Token, Node> children;
    Node* stale = nullptr;         // children whose heap item a touch made stale (see below)
    Node* stale_next = nullptr;    // next in the parent's stale list
    const Entry* owner = nullptr;  // some entry in this subtree whose ids back the label
    SlotPtr slot;                  // the entry whose ids end exactly here
    std::vector<HeapItem> heap;    // common-prefix mode: children as a 4-ary heap by best
    std::size_t heap_pos = 0;      // index in the parent's heap
  };

  // The entries sharing one idle TTL. A class left without members (pinned ones included:
  // they rejoin the list when unpinned) is reused for the next new TTL value, so per-request
  // TTLs cost only as many classes as distinct TTLs are stored at once.
  struct TtlClass {
    duration ttl;
    Slot* head;           // least recently used
    Slot* tail;           // most recently used
    std::size_t members;  // stored entries of this class, pinned or not
  };

  enum class Reason { lru, ttl, bytes, explicit_removal, superseded, replaced };

  struct Match {
    Slot* slot = nullptr;
    std::size_t matched = 0;
  };

  static void require(bool ok, const char* what) {
    if (!ok) throw std::logic_error(std::string("PromptCachePool invariant: ") + what);
  }

  template <class F>
  static void visit(const Node* root, F&& f) {
    // Iterative: a lineage of single-token turns can make the tree as deep as the ids are long.
    std::vector<const Node*> stack{root};
    while (!stack.empty()) {
      const Node* n = stack.back();
      stack.pop_back();
      f(n);
      n->children.for_each([&](const Node* c) { stack.push_back(c); });
    }
  }

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
    return i + detail::mismatch(a + i, b + i, (n - i) * sizeof(Token)) / sizeof(Token);
  }

  static bool better(const Slot* a, const Slot* b) noexcept {
    return a->len < b->len || (a->len == b->len && a->seq > b->seq);
  }

  Node* root_of(namespace_id ns) const noexcept {
    if (ns == 0) return root0_;
    auto it = roots_.find(ns);
    return it == roots_.end() ? nullptr : it->second.get();
  }

  Slot* find_slot(std::span<const Token> ids, namespace_id ns) const noexcept {
    const Node* node = root_of(ns);
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

  // A child's label length from its parent's table (the node's copy only for huge labels).
  static std::size_t label_len_of(
      const typename detail::PoolChildMap<Token, Node>::Slot* e) noexcept {
    return e->label_len != detail::PoolChildMap<Token, Node>::kLongLabel ? e->label_len
                                                                         : e->node->label_len;
  }

  Match match_exact(std::span<const Token> q, std::size_t limit, namespace_id ns) const noexcept {
    Match m;
    const Node* node = root_of(ns);
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

  Match match_common(std::span<const Token> q, std::size_t limit, namespace_id ns) const noexcept {
    Match m;
    const Node* node = root_of(ns);
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

  // ---- recency lists ------------------------------------------------------------------

  void list_unlink(Slot* s) noexcept {
    TtlClass& cls = classes_[s->ttl_class];
    (s->prev ? s->prev->next : cls.head) = s->next;
    (s->next ? s->next->prev : cls.tail) = s->prev;
    s->prev = s->next = nullptr;
  }

  void list_push_back(Slot* s) noexcept {
    TtlClass& cls = classes_[s->ttl_class];
    s->prev = cls.tail;
    s->next = nullptr;
    (cls.tail ? cls.tail->next : cls.head) = s;
    cls.tail = s;
  }

  void touch(Slot* s, time_point now) noexcept {
    s->last_used = now;
    s->seq = ++seq_;
    if (!s->pinned) {
      list_unlink(s);
      list_push_back(s);
    }
    if (options_.match == MatchMode::common_prefix) propagate_touch(s);
  }

  // ---- common-prefix aggregates ---------------------------------------------------------
  // Every node knows the best slot of its subtree (shortest, then most recent) and keeps its
  // children in a heap ordered by their best, so any change costs O(log fan-out) per level up
  // to the root, removals included.
  //
  // A lookup hit only makes its slot the most recent: the bests on its path are set at once
  // (lookups read them), but the items in the parents' heaps, whose keys only improved, are
  // just listed as stale and re-sifted by the next operation that reads or reshapes that heap
  // (flush_stale). Lookups then never sift (a sift at fan-out 65536 is 8 levels of scattered
  // node writes), and the sift work, one per touched child, moves to inserts and removals.
  // Stored keys always form a valid heap, so settling the listed items one at a time is exact.

  static bool item_better(const HeapItem& a, const HeapItem& b) noexcept {
    return a.len < b.len || (a.len == b.len && a.seq > b.seq);
  }

  static HeapItem item_of(Node* c) noexcept { return HeapItem{c->best->len, c->best->seq, c}; }

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

  // Restores the heap order around position i (the item there changed its key). A 4-ary
  // heap: half as many levels to sift up through as a binary heap.
  static constexpr std::size_t kArity = 4;
  static void heap_fix(Node* p, std::size_t i) noexcept {
    std::vector<HeapItem>& h = p->heap;
    const HeapItem c = h[i];
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

  // `now` takes the heap position of `before` (a split or merge swapping one child for another).
  static void heap_substitute(Node* p, Node* before, Node* now) noexcept {
    flush_stale(p);
    now->heap_pos = before->heap_pos;
    p->heap[now->heap_pos] = item_of(now);
  }

  // Adds child c; requires reserved capacity (phase 1 of insert).
  static void heap_push(Node* p, Node* c) noexcept {
    flush_stale(p);
    p->heap.push_back(item_of(c));
    c->heap_pos = p->heap.size() - 1;
    heap_fix(p, c->heap_pos);
  }

  static void heap_erase(Node* p, Node* c) noexcept {
    flush_stale(p);
    std::vector<HeapItem>& h = p->heap;
    const std::size_t i = c->heap_pos;
    const HeapItem last = h.back();
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

  // The subtree of x changed: recompute best from x up, fixing each parent's heap.
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
  static void propagate_touch(Slot* s) noexcept {
    for (Node* y = s->node; y->parent != nullptr; y = y->parent) {
      if (y->best != s && !better(s, y->best)) return;
      y->best = s;
      if (!y->is_stale) {
        y->is_stale = true;
        y->stale_next = std::exchange(y->parent->stale, y);
      }
    }
  }

  Slot* lru_victim() const noexcept {
    Slot* victim = nullptr;
    for (const TtlClass& cls : classes_) {
      if (cls.head != nullptr && (victim == nullptr || cls.head->seq < victim->seq))
        victim = cls.head;
    }
    return victim;
  }

  std::size_t expire(time_point now) noexcept {
    std::size_t n = 0;
    for (std::size_t i = 0; i < classes_.size(); ++i) {
      while (classes_[i].head != nullptr && now - classes_[i].head->last_used >= classes_[i].ttl) {
        remove_slot(classes_[i].head, Reason::ttl);
        ++n;
      }
    }
    return n;
  }

  void enforce_budgets() noexcept {
    while (stats_.entries > options_.max_entries) {
      Slot* v = lru_victim();
      if (v == nullptr) break;
      remove_slot(v, Reason::lru);
    }
    while (options_.max_bytes != 0 && stats_.bytes > options_.max_bytes) {
      Slot* v = lru_victim();
      if (v == nullptr) break;
      remove_slot(v, Reason::bytes);
    }
  }

  // ---- removal --------------------------------------------------------------------------

  void retire(SlotPtr s) noexcept {
    Slot* raw = s.release();
    raw->prev = nullptr;
    raw->next = retired_;
    retired_ = raw;
  }

  // Frees removed records. Deferred so SynchronizedPromptCachePool can run the LayerCache
  // destructors of the last snapshot references after releasing its lock.
  void release_retired() noexcept {
    if (defer_release_) return;
    while (retired_ != nullptr) {
      Slot* s = retired_;
      retired_ = s->next;
      SlotRelease{}(s);
    }
  }

  Slot* take_retired() noexcept { return std::exchange(retired_, nullptr); }

  static void free_retired(Slot* chain) noexcept {
    while (chain != nullptr) {
      Slot* s = chain;
      chain = s->next;
      SlotRelease{}(s);
    }
  }

  void count_removal(Reason why) noexcept {
    switch (why) {
      case Reason::lru:
        ++stats_.evicted_lru;
        break;
      case Reason::ttl:
        ++stats_.evicted_ttl;
        break;
      case Reason::bytes:
        ++stats_.evicted_bytes;
        break;
      case Reason::explicit_removal:
        ++stats_.evicted_explicit;
        break;
      case Reason::superseded:
        ++stats_.superseded;
        break;
      case Reason::replaced:
        break;
    }
  }

  // Takes a departing entry off its recency list (or the pinned count) and out of the
  // gauges and its TTL class, and counts why it left. The tree is the caller's to repair.
  void unaccount(Slot* s, Reason why) noexcept {
    if (s->pinned) {
      --stats_.pinned_entries;
    } else {
      list_unlink(s);
    }
    --stats_.entries;
    stats_.bytes -= s->bytes;
    --classes_[s->ttl_class].members;
    count_removal(why);
  }

  // Unlinks one entry and repairs the tree: prunes nodes left without entries, merges a
  // node left with one child into it, and re-points labels that lived in the entry's ids.
  void remove_slot(Slot* s, Reason why) noexcept {
    Node* n = s->node;
    const Entry* old = s->entry.get();
    unaccount(s, why);
    retire(std::move(n->slot));

    const bool common = options_.match == MatchMode::common_prefix;
    Node* x = n;
    while (x->parent != nullptr && !x->slot && x->children.empty()) {
      Node* p = x->parent;
      p->children.erase(x->first);
      if (common) heap_erase(p, x);
      delete x;
      x = p;
    }
    Node* lowest = x;  // the deepest node whose subtree lost the entry
    if (x->parent != nullptr && !x->slot && x->children.size() == 1) {
      Node* c = x->children.any();
      Node* p = x->parent;
      if (common) flush_stale(x);  // c must not stay listed in x
      c->label_len += x->label_len;
      c->label = c->owner->ids.data() + (c->depth - c->label_len);
      c->first = x->first;
      c->parent = p;
      p->children.replace(x->first, c, c->label, c->label_len);
      if (common) heap_substitute(p, x, c);
      x->children = detail::PoolChildMap<Token, Node>{};
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
    if (common) propagate(lowest);
    if (x->parent == nullptr && x->children.empty() && s->ns != 0) {
      roots_.erase(s->ns);  // an empty tenant costs nothing
    }
  }

  // Removes every entry below `root` (root stays, childless). Returns how many. The nodes
  // are threaded into a stack through their (no longer needed) parent links: no allocation,
  // no recursion, O(nodes + child tables).
  std::size_t drop_tree(Node* root) noexcept {
    std::size_t n = 0;
    Node* stack = nullptr;
    auto push = [&stack](Node* c) {
      c->parent = stack;
      stack = c;
    };
    root->children.for_each(push);
    root->children = detail::PoolChildMap<Token, Node>{};
    root->heap.clear();
    root->stale = nullptr;
    while (stack != nullptr) {
      Node* x = stack;
      stack = x->parent;
      x->children.for_each(push);
      if (x->slot) {
        unaccount(x->slot.get(), Reason::explicit_removal);
        ++n;
        retire(std::move(x->slot));
      }
      delete x;
    }
    return n;
  }

  // ---- insert ---------------------------------------------------------------------------

  // The core of insert, after the entry is built and sized (callers may do that unlocked).
  // Takes ownership of `entry` only when it is stored.
  // Links a record built by make_record. Publishing moves `slot` into the tree; if the entry
  // is rejected or anything throws, `slot` is left with the caller, who releases it.
  InsertResult insert_prepared(SlotPtr& slot, std::size_t bytes, const InsertOptions& o) {
    const time_point now = clock_.now();
    const std::vector<Token>& ids = slot->entry->ids;
    const std::size_t n = ids.size();
    if (n == 0) {
      ++stats_.rejected_empty;
      return InsertResult::rejected_empty;
    }

    // Walk (read-only): where the ids end or leave the tree, and which entries are prefixes.
    enum class Where { at_node, new_leaf, split, new_root };
    Where where = Where::new_root;
    Node* node = root_of(o.ns);
    Node* child = nullptr;
    std::size_t pos = 0, common = 0;
    Slot* exact = nullptr;
    Slot* lineage = nullptr;  // deepest unpinned proper prefix
    bool any_prefix = false;
    if (node != nullptr) {
      while (true) {
        if (node->slot) {
          any_prefix = true;
          if (pos == n) {
            exact = node->slot.get();
          } else if (!node->slot->pinned) {
            lineage = node->slot.get();
          }
        }
        if (pos == n) {
          where = Where::at_node;
          break;
        }
        child = node->children.find(ids[pos]);
        if (child == nullptr) {
          where = Where::new_leaf;
          break;
        }
        common = common_length(child->label, ids.data() + pos, std::min(child->label_len, n - pos));
        if (common < child->label_len) {
          where = Where::split;
          break;
        }
        node = child;
        pos = child->depth;
      }
    }

    if (n < options_.min_cacheable_tokens && !any_prefix) {
      ++stats_.rejected_too_short;
      return InsertResult::rejected_too_short;
    }
    if (options_.max_bytes != 0 && bytes > options_.max_bytes) {
      ++stats_.rejected_too_large;
      return InsertResult::rejected_too_large;
    }

    // Phase 1: every allocation. Nothing observable changes until phase 2.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
// GCC 12 at -O2 warns that a disengaged optional's payload "may be used uninitialized" when a
// default InsertOptions{} is inlined this far (a known false positive for std::optional).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
    const duration ttl = o.ttl.value_or(options_.ttl);
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
    std::size_t ttl_class = 0, vacant = 0;  // class 0 keeps Options::ttl: never vacant
    while (ttl_class < classes_.size() && classes_[ttl_class].ttl != ttl) {
      if (vacant == 0 && ttl_class != 0 && classes_[ttl_class].members == 0) vacant = ttl_class;
      ++ttl_class;
    }
    if (ttl_class == classes_.size()) {
      if (vacant != 0) {
        ttl_class = vacant;  // takes `ttl` in phase 2
      } else {
        classes_.push_back(TtlClass{ttl, nullptr, nullptr, 0});  // an empty class is harmless
      }
    }
    const bool common_mode = options_.match == MatchMode::common_prefix;
    std::unique_ptr<Node> leaf, mid;
    bool created_root = false;
    try {
      if (where == Where::new_root) {
        auto root = std::make_unique<Node>();
        root->children.reserve(1);
        if (common_mode) root->heap.reserve(1);
        node = root.get();
        roots_.emplace(o.ns, std::move(root));  // strong guarantee for a single element
        created_root = true;
        if (o.ns == 0) root0_ = node;
        where = Where::new_leaf;
      } else if (where == Where::new_leaf) {
        node->children.reserve(1);
        if (common_mode && node->heap.size() == node->heap.capacity()) {
          node->heap.reserve(std::max<std::size_t>(4, 2 * node->heap.capacity()));  // geometric
        }
      }
      if (where == Where::split) {
        mid = std::make_unique<Node>();
        mid->children.reserve(pos + common == n ? 1 : 2);
        if (common_mode) mid->heap.reserve(pos + common == n ? 1 : 2);
      }
      if (where == Where::new_leaf || (where == Where::split && pos + common < n)) {
        leaf = std::make_unique<Node>();
      }
    } catch (...) {
      if (created_root) {
        roots_.erase(o.ns);
        if (o.ns == 0) root0_ = nullptr;
      }
      throw;
    }

    // Phase 2: link; nothing below throws.
    Slot* s = slot.get();
    const Entry* e = s->entry.get();
    // Not yet published, and the Entry object itself is not const (see make_record).
    const_cast<Entry*>(e)->pinned = o.pinned || (exact != nullptr && exact->pinned);
    // At most one class per stored entry (plus class 0): 2^32 classes would need 2^32 slots.
    s->ttl_class = static_cast<std::uint32_t>(ttl_class);
    classes_[ttl_class].ttl = ttl;
    ++classes_[ttl_class].members;
    s->len = n;
    s->bytes = bytes;
    s->ns = o.ns;
    s->last_used = now;
    s->seq = ++seq_;
    s->pinned = e->pinned;

    Node* target = node;
    if (where == Where::split) {
      Node* m = mid.release();
      m->parent = node;
      m->label = child->label;
      m->label_len = common;
      m->depth = pos + common;
      m->first = child->first;
      m->owner = child->owner;
      node->children.replace(child->first, m, m->label, m->label_len);
      child->label += common;
      child->label_len -= common;
      child->first = child->label[0];
      child->parent = m;
      m->children.insert_reserved(child->first, child, child->label, child->label_len);
      if (common_mode) {
        m->best = child->best;  // same key: m takes child's place in node's heap as is
        heap_substitute(node, child, m);
        m->heap.push_back(item_of(child));  // reserved
        child->heap_pos = 0;
      }
      node = m;
      pos = m->depth;
      target = m;
    }
    Node* new_leaf = nullptr;
    if (leaf) {
      Node* l = leaf.release();
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
    SlotPtr replaced;
    if (exact != nullptr) {
      replaced = std::move(target->slot);
      if (replaced->pinned) {
        --stats_.pinned_entries;
      } else {
        list_unlink(replaced.get());
      }
      --stats_.entries;
      stats_.bytes -= replaced->bytes;
      --classes_[replaced->ttl_class].members;
    }
    target->slot = std::move(slot);
    s->node = target;
    if (s->pinned) {
      ++stats_.pinned_entries;
    } else {
      list_push_back(s);
    }
    ++stats_.entries;
    stats_.bytes += bytes;
    if (exact != nullptr) {
      // Labels that lived in the replaced entry's ids move to the new, equal ids.
      const Entry* old = replaced->entry.get();
      for (Node* y = target; y->parent != nullptr; y = y->parent) {
        if (y->owner == old) {
          y->owner = e;
          y->label = e->ids.data() + (y->depth - y->label_len);
          y->parent->children.set_label(y->first, y->label);
        }
      }
      retire(std::move(replaced));
    }
    if (common_mode) {
      if (new_leaf != nullptr) {
        new_leaf->best = s;
        heap_push(new_leaf->parent, new_leaf);
      }
      propagate(target);
    }

    InsertResult result = InsertResult::inserted;
    if (exact != nullptr) {
      result = InsertResult::updated;
      ++stats_.updated;
    } else if (lineage != nullptr) {
      result = InsertResult::extended;
      ++stats_.extended;
      if (options_.match == MatchMode::common_prefix) {
        // Every unpinned strict prefix can be served by trimming the new entry.
        for (Node* y = target->parent; y->parent != nullptr;) {
          Node* up = y->parent;
          if (y->slot && !y->slot->pinned && y->slot.get() != lineage) {
            remove_slot(y->slot.get(), Reason::superseded);
          }
          y = up;
        }
      }
      remove_slot(lineage, Reason::replaced);
    } else {
      ++stats_.inserted;
    }
    enforce_budgets();
    return result;
  }

  Options options_;
  Clock clock_;
  CacheBytes cache_bytes_;
  std::unordered_map<namespace_id, std::unique_ptr<Node>> roots_;
  Node* root0_ = nullptr;  // roots_[0], cached: the default namespace skips the hash lookup
  std::vector<TtlClass> classes_;
  std::uint64_t seq_ = 0;
  Slot* retired_ = nullptr;
  bool defer_release_ = false;
  PoolStats stats_;
};

}  // namespace promptcache

#endif  // PROMPTCACHE_PROMPT_CACHE_POOL_HPP
