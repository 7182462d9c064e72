// promptcache: prompt_cache_pool.hpp
// SPDX-License-Identifier: Apache-2.0
//
// A process-local pool of recently used prompt prefixes and the per-layer KV
// state an engine computed for them. A stateless server sends the full token
// list on every call; the pool answers "which stored prefix of this request can
// I resume from" and keeps the state after each call.
//
// Layout: one compressed trie (radix tree) per namespace over token ids; an entry lives on the
// node where its ids end. Edge labels are not copies: they point into the ids of some entry
// stored below the edge, so the index costs a few dozen bytes per node on top of the ids the
// entries own anyway. Unpinned entries also sit on an intrusive recency list (one per distinct
// TTL), and two small heaps over the lists' heads give the LRU victim and the next entry to
// expire, so a lookup that expires nothing checks one heap top, however many TTLs are in use.
// Lookup and insert cost O(query length), whatever the pool size.
//
// The class below is the policy (what an insert replaces, what is evicted when, the stats);
// the structures are named parts in detail/:
//   pool_record.hpp     an entry's record, sharing one allocation with its snapshot, and the
//                       chain of removed records released after the operation (or the lock)
//   pool_tree.hpp       the radix tree: walks, splits, merges, pruning, label owners
//   pool_best_heap.hpp  common-prefix mode: each node's best entry below it, children in heaps
//   pool_child_map.hpp  a node's children: open-addressing table keyed by first token
//   pool_recency.hpp    the recency lists by TTL class: LRU victim and TTL expiry
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

#include "detail/pool_recency.hpp"
#include "detail/pool_record.hpp"
#include "detail/pool_tree.hpp"

namespace promptcache {

/// How find_longest_prefix matches stored entries against a query.
enum class MatchMode {
  /// An entry must be a prefix of the query (an append-only KV cache). The default.
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
  std::size_t bytes = 0;           ///< Gauge: sum of entry sizes, saturating at SIZE_MAX.
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
///   ManualClock handle shared with a test drives TTLs. Should not go backwards; if it does,
///   the pool keeps using the latest reading it used until the clock passes it again (so
///   entries only look younger: nothing expires early, and the structure stays consistent).
///   Hence one bogus reading near time_point::max() stops TTL expiry (positive TTLs) for
///   the pool's lifetime: steady_clock cannot produce one, a ManualClock set() can.
/// - `CacheBytes`: size customization point for the byte budget: a default-constructible
///   functor `std::size_t(const LayerCache&)`; an entry weighs the sum over its caches.
///   It must be callable concurrently (SynchronizedPromptCachePool calls it unlocked).
///
/// Costs below use T, the number of TTL lists: the most distinct idle TTLs the pool has held
/// at once (a list left empty is reused for the next new TTL), 1 without per-entry TTLs. T only
/// enters as log T per entry that expires, is evicted, or leaves or joins an empty list (plus,
/// amortized, per touch of a list's oldest entry); a lookup that expires nothing is O(1) in T.
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
    MatchMode match =
        MatchMode::exact_prefix;       ///< Exact-prefix (default) or common-prefix lookups.
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
    bool pinned = false;  ///< Exempt from LRU, byte and TTL eviction.
    /// Idle TTL of this entry. Unset: the TTL of the entry this insert replaces (update or
    /// lineage extension), else Options::ttl. Set: this value, even if shorter than the old one.
    std::optional<duration> ttl{};
    namespace_id ns = 0;         ///< Namespace; entries of other namespaces never interact.
    std::size_t fed_images = 0;  ///< Stored as Entry::fed_images.
    std::size_t fed_audios = 0;  ///< Stored as Entry::fed_audios.
  };

  /// Pool with an entry budget, idle TTL and minimum length (exact-prefix mode, no byte budget).
  PromptCachePool(std::size_t max_entries, duration ttl, std::size_t min_cacheable_tokens,
                  Clock clock = Clock{})
      : PromptCachePool(Options{max_entries, ttl, min_cacheable_tokens}, std::move(clock)) {}

  /// Pool with the given options. Throws std::invalid_argument if max_bytes != 0 while
  /// CacheBytes is unsized_caches (every entry would weigh 0, silently ignoring the budget).
  explicit PromptCachePool(Options options, Clock clock = Clock{}, CacheBytes cache_bytes = {})
      : options_(options),
        clock_(std::move(clock)),
        cache_bytes_(std::move(cache_bytes)),
        recency_(options_.ttl) {
    if (std::is_same_v<CacheBytes, unsized_caches> && options_.max_bytes != 0) {
      throw std::invalid_argument("PromptCachePool: max_bytes needs a CacheBytes functor");
    }
  }

  /// 16 entries, 5 minute idle TTL, 8-token minimum: the Options{} defaults.
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
    free_retired(retired_.take());
  }

  /// The options the pool was built with.
  [[nodiscard]] const Options& options() const noexcept { return options_; }

  /// Evicts expired entries, then returns the best stored entry for `ids` in namespace `ns`
  /// (exact-prefix: the longest stored prefix; common-prefix: the longest common prefix,
  /// preferring no trim, then the shortest entry, then the most recent) and refreshes its
  /// recency. Empty query, no match or a match below min_match_tokens: nullopt.
  /// O(|ids| + expired x log T), T = TTL lists (common-prefix mode: + O(depth) to record the
  /// hit's recency; the heaps are re-sorted later, see insert); invalidates nothing a caller
  /// holds.
  std::optional<Hit> find_longest_prefix(std::span<const Token> ids, namespace_id ns = 0) {
    const time_point now = use_clock();
    // The expiry check is one comparison; the removal work is out of line, so that the hot
    // path of a lookup that expires nothing keeps its registers (and its code) small.
    if (recency_.due(now)) [[unlikely]]
      expire_out_of_line(now);
    ++stats_.lookups;
    stats_.query_tokens += ids.size();
    std::optional<Hit> result;
    if (!ids.empty()) {
      const std::size_t limit = options_.keep_one_token ? ids.size() - 1 : ids.size();
      const Node* root = root_of(ns);
      Match m = options_.match == MatchMode::exact_prefix ? Tree::match_exact(root, ids, limit)
                                                          : Tree::match_common(root, ids, limit);
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

  /// Positional shorthand: insert(ids, caches, {pinned, default ttl, namespace 0, media counts}).
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
  /// and max_bytes (the new entry too, if nothing else is evictable). TTL: an explicit
  /// InsertOptions::ttl wins (it describes the new state, so a server can shorten a TTL);
  /// without one, an update or extension keeps the TTL of the entry it replaces (a
  /// conversation keeps its TTL across turns), and a new entry gets Options::ttl. Only an
  /// insert that leaves the pool over a budget collects expired entries (the new one too, if
  /// its TTL is 0), before any LRU victim: otherwise lookups and evict_expired do. In
  /// common-prefix mode an extension also retires every other unpinned strict prefix of the
  /// new ids (counted as `superseded`): the new entry serves them all by trimming, so they
  /// would only hold budget. Strong exception guarantee: if anything throws, the pool is
  /// unchanged. O(|ids| + |caches| + (1 + evicted) x log T), T = TTL lists; common-prefix mode adds
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
  /// O(1 + expired x log T), T = TTL lists.
  std::size_t evict_expired() {
    const std::size_t n = expire(use_clock());
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

  /// Evicts expired entries (as a lookup does), then pins the entry with exactly `ids`:
  /// exempt from LRU, byte and TTL eviction. Returns false if there is no such entry (an
  /// expired one is collected, never revived). Snapshots are not rewritten (Entry::pinned).
  /// If the clock throws, nothing changed. O(|ids| + expired x log T), T = TTL lists.
  bool pin(std::span<const Token> ids, namespace_id ns = 0) {
    const time_point now = use_clock();  // first: if the clock throws, nothing changed
    if (recency_.due(now)) expire(now);
    Slot* s = find_slot(ids, ns);
    if (s != nullptr && !s->pinned) {
      recency_.unlink(s);
      s->pinned = true;
      ++stats_.pinned_entries;
    }
    release_retired();
    return s != nullptr;
  }

  /// Evicts expired entries (as a lookup does), then unpins the entry with exactly `ids`; it
  /// counts as used now (most recent, fresh TTL), then budgets are enforced. Returns false if
  /// there is no such entry (an expired unpinned one is collected first). If the clock throws,
  /// nothing changed. O(|ids| + (1 + evicted) x log T), T = TTL lists.
  bool unpin(std::span<const Token> ids, namespace_id ns = 0) {
    const time_point now = use_clock();  // first: if the clock throws, nothing changed
    if (recency_.due(now)) expire(now);
    Slot* s = find_slot(ids, ns);
    if (s != nullptr && s->pinned) {
      s->pinned = false;
      --stats_.pinned_entries;
      s->last_used = now;
      s->seq = ++seq_;
      recency_.push_back(s);
      if (options_.match == MatchMode::common_prefix) Best::propagate(s->node);
      enforce_budgets(now);
    }
    release_retired();
    return s != nullptr;
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
  /// Sum of stored entry sizes per CacheBytes, saturating at SIZE_MAX (the pool keeps the
  /// exact sum, so a sum past SIZE_MAX is still evicted exactly down to max_bytes). O(1).
  [[nodiscard]] std::size_t bytes() const noexcept {
    return bytes_carry_ != 0 ? SIZE_MAX : stats_.bytes;
  }

  /// Counters and gauges (PoolStats::bytes as bytes()). O(1).
  [[nodiscard]] PoolStats stats() const noexcept {
    PoolStats s = stats_;
    s.bytes = bytes();
    return s;
  }
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
    m.index_bytes =
        sizeof(*this) + recency_.memory_bytes() + roots_.bucket_count() * sizeof(void*) +
        roots_.size() *
            (sizeof(std::pair<namespace_id, std::unique_ptr<Node>>) + 2 * sizeof(void*));
    for (const auto& [ns, root] : roots_) {
      Tree::visit(root.get(), [&](const Node* n) {
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
    std::size_t entries = 0, pinned = 0, bytes = 0, bytes_carry = 0;
    std::vector<std::size_t> members(recency_.class_count(), 0);
    const bool common = options_.match == MatchMode::common_prefix;
    for (const auto& kv : roots_) {
      const namespace_id nsv = kv.first;
      const Node* root = kv.second.get();
      require(nsv != 0 || root == root0_, "root0 cache");
      Tree::check(root, common, require, [&](const Slot* s) {
        ++entries;
        bytes += s->bytes;
        if (bytes < s->bytes) ++bytes_carry;
        require(s->len == s->entry->ids.size(), "slot length");
        require(s->ns == nsv, "slot back link");
        require(s->ttl_class < members.size(), "ttl class index");
        ++members[s->ttl_class];
        if (s->pinned) ++pinned;
      });
    }
    const auto ns0 = roots_.find(0);
    require(root0_ == (ns0 == roots_.end() ? nullptr : ns0->second.get()), "root0 cache");
    const std::size_t listed = recency_.check(options_.ttl, members, require);
    require(entries == stats_.entries && pinned == stats_.pinned_entries, "entry gauges");
    require(listed == entries - pinned, "listed entries");
    require(bytes == stats_.bytes && bytes_carry == bytes_carry_, "byte gauge");
    require(retired_.empty(), "retired list");
  }

 private:
  friend class SynchronizedPromptCachePool<LayerCache, Token, Clock, CacheBytes>;

  // The named parts (include/promptcache/detail/): the record of an entry, the radix tree
  // with its common-prefix aggregates, and the recency lists by TTL class. The pool is the
  // policy over them: which entry an insert replaces, what is evicted when, and the stats.
  using Slot = detail::PoolSlot<Entry, Token, time_point>;
  using SlotPtr = detail::PoolSlotPtr<Slot>;
  using Record = detail::PoolRecord<Slot>;
  using Tree = detail::PoolTree<Token, Slot>;
  using Node = typename Tree::Node;
  using Best = typename Tree::Best;
  using Match = typename Tree::Match;
  using Recency = detail::PoolRecency<Slot, duration>;

  enum class Reason { lru, ttl, bytes, explicit_removal, superseded, replaced };

  static void require(bool ok, const char* what) {
    if (!ok) throw std::logic_error(std::string("PromptCachePool invariant: ") + what);
  }

  static SlotPtr make_record(std::vector<Token>&& ids, std::vector<LayerCache>&& caches,
                             const InsertOptions& o) {
    return detail::make_pool_record<Slot>([&](Entry& e) {
      e.ids = std::move(ids);
      e.caches = std::move(caches);
      e.fed_images = o.fed_images;
      e.fed_audios = o.fed_audios;
    });
  }

  Node* root_of(namespace_id ns) const noexcept {
    if (ns == 0) return root0_;
    auto it = roots_.find(ns);
    return it == roots_.end() ? nullptr : it->second.get();
  }

  Slot* find_slot(std::span<const Token> ids, namespace_id ns) const noexcept {
    return Tree::find(root_of(ns), ids);
  }

  void touch(Slot* s, time_point now) noexcept {
    s->last_used = now;
    s->seq = ++seq_;
    if (!s->pinned) recency_.touch(s);
    if (options_.match == MatchMode::common_prefix) Best::propagate_touch(s);
  }

  std::size_t expire(time_point now) noexcept {
    return recency_.expire(now, [this](Slot* s) { remove_slot(s, Reason::ttl); });
  }

  [[gnu::noinline, gnu::cold]] void expire_out_of_line(time_point now) noexcept { expire(now); }

  // The clock reading to use: never earlier than one the pool already used, so that a clock
  // that goes back only makes entries look younger (nothing expires early, and every recency
  // list stays in time order). The caller stores it in latest_ once it cannot fail any more.
  time_point monotonic(time_point t) const noexcept { return t < latest_ ? latest_ : t; }

  // The clock reading for a member that cannot fail once it has read the clock: stored in
  // latest_ at once (insert, which can, stores its reading itself).
  time_point use_clock() {
    const time_point now = monotonic(clock_.now());
    latest_ = now;
    return now;
  }

  bool over_bytes() const noexcept {
    return options_.max_bytes != 0 && (bytes_carry_ != 0 || stats_.bytes > options_.max_bytes);
  }

  // Over a budget, expired entries go first (they are dead weight; evicting a live LRU entry
  // instead would keep them), then the least recently used ones.
  void enforce_budgets(time_point now) noexcept {
    if (stats_.entries <= options_.max_entries && !over_bytes()) return;
    if (recency_.due(now)) expire(now);
    while (stats_.entries > options_.max_entries) {
      Slot* v = recency_.lru_victim();
      if (v == nullptr) break;
      remove_slot(v, Reason::lru);
    }
    while (over_bytes()) {
      Slot* v = recency_.lru_victim();
      if (v == nullptr) break;
      remove_slot(v, Reason::bytes);
    }
  }

  // The byte total is kept exact past SIZE_MAX: stats_.bytes is its low word and
  // bytes_carry_ counts the wraps (pinned entries, or an unlimited budget, can hold more).
  void add_bytes(std::size_t b) noexcept {
    stats_.bytes += b;
    if (stats_.bytes < b) ++bytes_carry_;
  }
  void sub_bytes(std::size_t b) noexcept {
    if (stats_.bytes < b) --bytes_carry_;
    stats_.bytes -= b;
  }

  // ---- removal --------------------------------------------------------------------------

  // Frees removed records. Deferred so SynchronizedPromptCachePool can run the LayerCache
  // destructors of the last snapshot references after releasing its lock.
  // The test is inline and the release out of line: most lookups retire nothing.
  void release_retired() noexcept {
    if (!retired_.empty() && !defer_release_) release_retired_out_of_line();
  }

  [[gnu::noinline]] void release_retired_out_of_line() noexcept {
    Retired::release(retired_.take());
  }

  Slot* take_retired() noexcept { return retired_.take(); }

  static void free_retired(Slot* chain) noexcept { Retired::release(chain); }

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
      recency_.unlink(s);
    }
    --stats_.entries;
    sub_bytes(s->bytes);
    recency_.leave(s);
    count_removal(why);
  }

  // Unlinks one entry and repairs the tree around it.
  void remove_slot(Slot* s, Reason why) noexcept {
    Node* n = s->node;
    const Entry* old = s->entry.get();
    const namespace_id ns = s->ns;
    unaccount(s, why);
    retired_.push(std::move(n->slot));
    Node* x = Tree::repair(n, old, options_.match == MatchMode::common_prefix);
    if (x->parent == nullptr && x->children.empty() && ns != 0) {
      roots_.erase(ns);  // an empty tenant costs nothing
    }
  }

  // Removes every entry below `root` (root stays, childless). Returns how many.
  std::size_t drop_tree(Node* root) noexcept {
    std::size_t n = 0;
    Tree::drop(root, [&](SlotPtr&& slot) {
      unaccount(slot.get(), Reason::explicit_removal);
      ++n;
      retired_.push(std::move(slot));
    });
    return n;
  }

  // ---- insert ---------------------------------------------------------------------------

  // The core of insert, after the entry is built and sized (callers may do that unlocked).
  // Links a record built by make_record. Publishing moves `slot` into the tree; if the entry
  // is rejected or anything throws, `slot` is left with the caller, who releases it.
  InsertResult insert_prepared(SlotPtr& slot, std::size_t bytes, const InsertOptions& o) {
    const time_point now = monotonic(clock_.now());
    const std::vector<Token>& ids = slot->entry->ids;
    const std::size_t n = ids.size();
    if (n == 0) {
      ++stats_.rejected_empty;
      return InsertResult::rejected_empty;
    }

    // Walk (read-only): where the ids end or leave the tree, and which entries are prefixes.
    Slot* exact = nullptr;
    Slot* lineage = nullptr;  // deepest unpinned proper prefix
    bool any_prefix = false;
    typename Tree::Place place = Tree::locate(root_of(o.ns), ids, [&](Slot* p, bool at_end) {
      any_prefix = true;
      if (at_end) {
        exact = p;
      } else if (!p->pinned) {
        lineage = p;
      }
    });

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
    // An explicit TTL describes the new state and wins; without one, the entry keeps the TTL
    // of the entry it replaces (the same conversation), and a new entry gets Options::ttl.
    const duration ttl = o.ttl                ? *o.ttl
                         : exact != nullptr   ? recency_.ttl_of(exact)
                         : lineage != nullptr ? recency_.ttl_of(lineage)
                                              : options_.ttl;
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
    std::uint32_t ttl_class = 0;
    const bool common_mode = options_.match == MatchMode::common_prefix;
    typename Tree::Spare spare;
    bool created_root = false;
    try {
      if (place.where == Tree::Where::new_root) {
        auto root = Tree::make_root(common_mode);
        place.node = root.get();
        roots_.emplace(o.ns, std::move(root));  // strong guarantee for a single element
        created_root = true;
        if (o.ns == 0) root0_ = place.node;
        place.where = Tree::Where::new_leaf;
        spare.leaf = std::make_unique<Node>();
      } else {
        spare = Tree::reserve(place, n, common_mode);
      }
      ttl_class = recency_.prepare(ttl);  // last: once it returned, nothing may fail
    } catch (...) {
      if (created_root) {
        roots_.erase(o.ns);
        if (o.ns == 0) root0_ = nullptr;
      }
      throw;
    }

    // Phase 2: link; nothing below throws.
    latest_ = now;
    Slot* s = slot.get();
    const Entry* e = s->entry.get();
    // Not yet published, and the Entry object itself is not const (see make_record).
    const_cast<Entry*>(e)->pinned = o.pinned || (exact != nullptr && exact->pinned);
    recency_.join(s, ttl_class);
    s->len = n;
    s->bytes = bytes;
    s->ns = o.ns;
    s->last_used = now;
    s->seq = ++seq_;
    s->pinned = e->pinned;

    Node* new_leaf = nullptr;
    Node* target = Tree::link(place, spare, e, common_mode, new_leaf);
    SlotPtr replaced;
    if (exact != nullptr) {
      replaced = std::move(target->slot);
      if (replaced->pinned) {
        --stats_.pinned_entries;
      } else {
        recency_.unlink(replaced.get());
      }
      --stats_.entries;
      sub_bytes(replaced->bytes);
      recency_.leave(replaced.get());
    }
    target->slot = std::move(slot);
    s->node = target;
    if (s->pinned) {
      ++stats_.pinned_entries;
    } else {
      recency_.push_back(s);
    }
    ++stats_.entries;
    add_bytes(bytes);
    if (exact != nullptr) {
      Tree::relabel(target, replaced->entry.get(), e);
      retired_.push(std::move(replaced));
    }
    if (common_mode) {
      if (new_leaf != nullptr) {
        new_leaf->best = s;
        Best::heap_push(new_leaf->parent, new_leaf);
      }
      Best::propagate(target);
    }

    InsertResult result = InsertResult::inserted;
    if (exact != nullptr) {
      result = InsertResult::updated;
      ++stats_.updated;
    } else if (lineage != nullptr) {
      result = InsertResult::extended;
      ++stats_.extended;
      if (common_mode) {
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
    enforce_budgets(now);
    return result;
  }

  using Retired = detail::PoolRetiredChain<Slot>;

  Options options_;
  Clock clock_;
  CacheBytes cache_bytes_;
  std::unordered_map<namespace_id, std::unique_ptr<Node>> roots_;
  Node* root0_ = nullptr;  // roots_[0], cached: the default namespace skips the hash lookup
  Recency recency_;
  time_point latest_ = time_point::min();  // the latest clock reading used (see monotonic)
  std::size_t bytes_carry_ = 0;            // times the byte total passed SIZE_MAX
  std::uint64_t seq_ = 0;
  Retired retired_;
  bool defer_release_ = false;
  PoolStats stats_;
};

}  // namespace promptcache

#endif  // PROMPTCACHE_PROMPT_CACHE_POOL_HPP
