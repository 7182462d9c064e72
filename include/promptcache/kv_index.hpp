// promptcache: kv_index.hpp
// SPDX-License-Identifier: Apache-2.0
//
// A radix-tree index of which worker holds which KV-cache blocks, fed by the
// KV event stream of every worker (blocks stored, blocks removed, cache
// cleared), for cache-aware routing: for a request's block hashes it answers,
// per worker, how many leading blocks that worker already holds.
//
// The tree is keyed by the blocks' tokens hashes (the local block hashes of
// block_hash.hpp; any well-mixed 64-bit hashes work) along the path from the
// root, so equal prefixes from different workers share nodes. Each worker names
// its blocks with its own 64-bit block hashes, used by its later events.
// Every event passes through a CursorState per (worker, dp rank): stale events
// are dropped and lost events are reported instead of silently diverging.
// After a reset or a late join, chains stored under parents the index does
// not know can be kept as orphan chains (KvUnknownParent::keep_orphan): block
// names are chained hashes, so holding a block implies holding its prefix,
// and a chain is grafted into the tree once its parent's position is known.
//
// Not thread-safe for writers; const member functions may run concurrently
// with each other (find_matches keeps its scratch space on the stack).
//
// The class below is the policy (admission and cursors, which path an event
// takes, the exception-safety steps, replace_worker / dump, invariants); the
// mechanisms are named parts in detail/, over one shared state:
//   kv_index_state.hpp   the state: tree, holds, worker slots, counters, orphans
//   kv_index_store.hpp   the store path: table loads, reservation, storing a chain
//   kv_index_remove.hpp  the remove path: removed blocks, cascades, a worker's view
//   kv_index_match.hpp   the match path: find_matches' walk and its matches
//   kv_index_grafts.hpp  orphan chains: orphan stores and removals, settling, grafts
// and the structures under them (kv_index_tree.hpp, kv_index_holds.hpp,
// kv_index_workers.hpp, kv_index_orphans.hpp and the tables they use).
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
#endif
#if !defined(PROMPTCACHE_KV_INDEX_HPP) && \
    (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) >= 202002L
#define PROMPTCACHE_KV_INDEX_HPP

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "promptcache/cursor.hpp"
#include "promptcache/detail/kv_index_grafts.hpp"
#include "promptcache/detail/kv_index_holders.hpp"
#include "promptcache/detail/kv_index_holds.hpp"
#include "promptcache/detail/kv_index_match.hpp"
#include "promptcache/detail/kv_index_orphans.hpp"
#include "promptcache/detail/kv_index_remove.hpp"
#include "promptcache/detail/kv_index_state.hpp"
#include "promptcache/detail/kv_index_store.hpp"
#include "promptcache/detail/kv_index_table.hpp"
#include "promptcache/detail/kv_index_tree.hpp"
#include "promptcache/detail/kv_index_workers.hpp"

namespace promptcache {

/// One KV event publisher: a worker process and one of its data-parallel ranks.
/// Ranks of one worker are independent streams with independent caches.
struct KvWorker {
  std::uint64_t worker_id = 0;  ///< The worker (engine instance) id.
  std::uint32_t dp_rank = 0;    ///< Data-parallel rank within the worker.
  /// Memberwise comparison. O(1).
  friend constexpr auto operator<=>(const KvWorker&, const KvWorker&) = default;
};

/// One block of a Stored event.
struct KvBlock {
  std::uint64_t block_hash = 0;   ///< The engine's own name for the block (used by later events).
  std::uint64_t tokens_hash = 0;  ///< Hash of the block's tokens (block_hash.hpp local hash).
  /// Memberwise equality. O(1).
  friend constexpr bool operator==(const KvBlock&, const KvBlock&) = default;
};

/// Payloads of KV events.
namespace kv_event {

/// Blocks were stored as a chain: blocks[0] is a child of `parent_hash` (or of
/// the root when absent), each next block a child of the previous one.
struct Stored {
  std::optional<std::uint64_t> parent_hash;  ///< Block hash of the parent, by the same worker.
  std::vector<KvBlock> blocks;               ///< The chain, root side first.
  /// Memberwise equality. O(blocks).
  friend bool operator==(const Stored&, const Stored&) = default;
};

/// Blocks were evicted (named by the worker's block hashes).
struct Removed {
  std::vector<std::uint64_t> block_hashes;  ///< Evicted blocks.
  /// Memberwise equality. O(blocks).
  friend bool operator==(const Removed&, const Removed&) = default;
};

/// The worker dropped its whole cache.
struct Cleared {
  /// Always equal. O(1).
  friend constexpr bool operator==(const Cleared&, const Cleared&) = default;
};

}  // namespace kv_event

/// The payload of one KV event: exactly one of Stored, Removed, Cleared.
using KvEventData = std::variant<kv_event::Stored, kv_event::Removed, kv_event::Cleared>;

/// One KV event of one publisher; ids run 0, 1, 2, ... per (worker, dp rank).
struct KvEvent {
  std::uint64_t event_id = 0;  ///< Position in the publisher's stream.
  KvEventData data;            ///< What happened.
  /// Memberwise equality. O(size of the payload).
  friend bool operator==(const KvEvent&, const KvEvent&) = default;
};

/// What happened to one event.
enum class KvEventStatus : std::uint8_t {
  applied,           ///< Applied; the worker's cursor advanced to the event id.
  stale,             ///< Id not newer than the last applied one: dropped, nothing changed.
  gap,               ///< Events were lost: not applied, nothing changed (cursor too); resync
                     ///< with replace_worker (only under KvGapPolicy::report).
  parent_not_found,  ///< Stored under a parent the worker does not hold, refused (under
                     ///< KvUnknownParent::refuse, or with no blocks): nothing changed but the
                     ///< cursor (the id is consumed); the view may have diverged.
  block_conflict,    ///< Stored would give one of the worker's block hashes a second tree position,
                     ///< or one position a second name: tree unchanged, id consumed.
};

/// What an event that reveals a gap does.
enum class KvGapPolicy : std::uint8_t {
  report,           ///< Reject the event and report the gap; the caller resyncs from a dump.
  reset_and_apply,  ///< Degraded mode for publishers without replay: drop the worker's view,
                    ///< then apply the event and continue from its id.
};

/// What a Stored event under a parent the worker does not hold does.
enum class KvUnknownParent : std::uint8_t {
  refuse,       ///< Refuse it (parent_not_found): after a reset or a late join the worker's
                ///< cached prefixes stay invisible until it stores them again from the root.
  keep_orphan,  ///< Keep its chain as an orphan chain of the worker, routable by block name
                ///< and grafted into the tree once its parent's position is known.
};

/// Construction options of KvIndex.
struct KvIndexOptions {
  KvGapPolicy on_gap = KvGapPolicy::report;                     ///< See KvGapPolicy.
  KvUnknownParent on_unknown_parent = KvUnknownParent::refuse;  ///< See KvUnknownParent.
};

/// The outcome of applying one event: its status, what the cursor saw, and
/// block counts.
struct KvEventResult {
  KvEventStatus status = KvEventStatus::applied;  ///< What happened.
  CursorObservation<> observation{};              ///< The cursor's view of the event id.
  bool view_reset = false;              ///< reset_and_apply: a gap dropped the worker's view first.
  std::size_t blocks_stored = 0;        ///< Stored: blocks newly held by the worker.
  std::size_t blocks_already_held = 0;  ///< Stored: blocks it already held (idempotent).
  std::size_t blocks_removed = 0;       ///< Removed: named blocks that were dropped.
  std::size_t blocks_cascaded = 0;      ///< Removed / Cleared / reset: descendants and other blocks
                                        ///< dropped along with them.
  std::size_t blocks_not_held = 0;      ///< Removed: named blocks the worker did not hold (no-op),
                                        ///< including ones an earlier name of this event cascaded.
  std::size_t blocks_orphaned = 0;      ///< Stored: blocks newly kept as orphans of the worker.
  std::size_t blocks_grafted = 0;       ///< Stored: blocks the event's grafts placed in the tree
                                        ///< (of any worker; implied prefix blocks included).

  /// True when the event was applied. O(1).
  [[nodiscard]] bool ok() const noexcept { return status == KvEventStatus::applied; }
  /// The gap the cursor saw (also set when reset_and_apply applied past it). O(1).
  [[nodiscard]] std::optional<cursor::Gap<std::uint64_t>> gap() const noexcept {
    if (const auto* g = std::get_if<cursor::Gap<std::uint64_t>>(&observation)) return *g;
    return std::nullopt;
  }
};

/// The outcome of replace_worker.
struct KvReplaceResult {
  bool ok = false;               ///< True when the worker's view was replaced.
  std::size_t failed_event = 0;  ///< !ok: index in the dump of the event that could not apply.
  KvEventStatus failure = KvEventStatus::applied;  ///< !ok: why (parent_not_found/block_conflict).
  std::size_t blocks = 0;                          ///< ok: blocks the worker holds now.
};

/// How many leading blocks of a query one worker holds.
struct KvWorkerMatch {
  KvWorker worker;         ///< The worker rank.
  std::size_t blocks = 0;  ///< Leading blocks held (>= 1).
  /// Memberwise comparison. O(1).
  friend constexpr auto operator<=>(const KvWorkerMatch&, const KvWorkerMatch&) = default;
};

/// Event counters since construction.
struct KvIndexCounters {
  std::uint64_t events_applied = 0;    ///< Events with status applied.
  std::uint64_t events_stale = 0;      ///< Stale events dropped.
  std::uint64_t gaps = 0;              ///< Events that revealed a gap (reported or reset).
  std::uint64_t parent_not_found = 0;  ///< Stored events refused as parent_not_found.
  std::uint64_t orphan_stores = 0;     ///< Stored events kept (at least in part) as orphans.
  std::uint64_t grafts = 0;            ///< Orphan chains grafted into the tree.
  std::uint64_t block_conflicts = 0;   ///< Stored events rejected as block conflicts.
  std::uint64_t views_reset = 0;       ///< Worker views dropped by reset_and_apply.
  std::uint64_t workers_replaced = 0;  ///< Successful replace_worker calls.
  /// Memberwise equality. O(1).
  friend constexpr bool operator==(const KvIndexCounters&, const KvIndexCounters&) = default;
};

/// The KV-event-fed radix index. Costs below: B = blocks in the call, H =
/// holders of a node the call touches (adding or dropping a holder costs
/// O(H) while the node's set is a sorted array, O(1) otherwise), D =
/// descendants a removal drops. Memory: a tree node takes a 24-byte row plus
/// its 8-byte slot in the edge table (at load 0.53..0.8 from 2^19 live pairs
/// on; below that, while memory is small, load 1/16..1/4 for speed), whatever the number
/// of worker ranks: up to 64 ranks the row's holder word is the bitset of its
/// holders; with more, up to two holders fit in the row, a larger holder set
/// takes a sorted array of 4-byte slot indices, or once that would be larger, a
/// bitset over all ranks (one bit per rank, in steps of 128). A (worker, block)
/// pair takes a 24-byte hold plus its 8-byte slot in the worker's name table.
/// Rows and holds are allocated in pages, so their unused capacity is at most
/// one page each.
/// Everything is held in index-addressed pools, so an index is an ordinary
/// copyable value. Freed nodes, holds and holder sets go to free lists that
/// the next stores reuse; the pools themselves shrink only when they empty
/// (tables shrink as their load drops). A store reserves only what it can
/// add (nodes for missing levels, holds for blocks not held, holder-set room
/// for existing nodes gaining a holder), so memory is bounded by the peak
/// numbers of live nodes and pairs (a Stored event rejected as a conflict
/// counts what it would have added) and the peak size of the holder arena.
///
/// Exception safety: apply / store / remove / clear, replace_worker and copy
/// assignment give the strong guarantee (on std::bad_alloc the index is
/// unchanged); remove_worker(KvWorker), moves and swap never throw; the
/// const queries allocate only their results. Grafting orphan chains (under
/// KvUnknownParent::keep_orphan) is best effort: a graft that cannot allocate
/// is undone and leaves its chain an orphan chain, and the event still applies.
///
/// Invalidation: queries return values (vectors, counts, dumps), so no call
/// invalidates anything a caller holds; the references from counters() and
/// options() stay valid as long as the index object does (they then show the
/// values after later calls, a swap or a move).
class KvIndex {
 public:
  /// An empty index (just the root). O(1), allocates nothing.
  KvIndex() noexcept : KvIndex(KvIndexOptions{}) {}
  /// An empty index with `options`. O(1), allocates nothing.
  explicit KvIndex(KvIndexOptions options) noexcept : options_(options) {}

  /// A deep copy. O(size of `other`).
  KvIndex(const KvIndex& other) = default;
  /// Takes over `other`'s contents; `other` is left empty (with its options),
  /// ready for reuse. O(1).
  KvIndex(KvIndex&& other) noexcept : options_(other.options_) { swap(other); }
  /// Replaces the contents with a copy of `other`. Strong guarantee: on
  /// std::bad_alloc this index is unchanged. O(size of both).
  KvIndex& operator=(const KvIndex& other) {
    if (this != &other) {
      KvIndex copy(other);
      swap(copy);
    }
    return *this;
  }
  /// Takes over `other`'s contents; `other` is left empty (with its options).
  /// O(size of this index, which is released).
  KvIndex& operator=(KvIndex&& other) noexcept {
    if (this != &other) {
      KvIndex taken(std::move(other));
      swap(taken);
    }
    return *this;
  }

  /// Exchanges the contents (options included) with `other`. O(1), noexcept.
  void swap(KvIndex& other) noexcept {
    using std::swap;
    swap(options_, other.options_);
    state_.swap(other.state_);
  }
  /// Exchanges the contents of `a` and `b`. O(1), noexcept.
  friend void swap(KvIndex& a, KvIndex& b) noexcept { a.swap(b); }

  /// Applies one event of `worker` (creating the worker on its first event).
  /// O(B) expected for Stored, O(B + D) for Removed, O(blocks held) for Cleared.
  /// Never throws on bad input. Strong guarantee: on std::bad_alloc (or
  /// std::length_error once (worker, block) pairs plus worker ranks would pass
  /// 2^31 - 1) nothing changed but capacity, not even under reset_and_apply;
  /// only a Stored event or a new worker's first event can throw.
  KvEventResult apply(const KvWorker& worker, const KvEvent& event) {
    return std::visit(
        [&](const auto& data) -> KvEventResult {
          using T = std::decay_t<decltype(data)>;
          if constexpr (std::is_same_v<T, kv_event::Stored>)
            return store(worker, event.event_id, data.parent_hash, data.blocks);
          else if constexpr (std::is_same_v<T, kv_event::Removed>)
            return remove(worker, event.event_id, data.block_hashes);
          else
            return clear(worker, event.event_id);
        },
        event.data);
  }

  /// Applies a Stored event without building a KvEvent. Same rules as apply().
  KvEventResult store(const KvWorker& worker, std::uint64_t event_id,
                      std::optional<std::uint64_t> parent_hash, std::span<const KvBlock> blocks) {
    bool created = false;
    const std::uint32_t slot = slot_for(worker, created);
    KvEventResult r;
    if (!admit(slot, event_id, r)) return r;
    if (orphan_store(slot, parent_hash, blocks, r.view_reset)) {
      try {
        Grafts::store_orphans(state_, slot, *parent_hash, blocks, r, r.view_reset);
      } catch (...) {
        if (created) remove_worker(worker);  // a new worker's first event did not apply
        throw;
      }
      if (r.status == KvEventStatus::applied)
        Grafts::settle_anchor_of(state_, slot, *parent_hash, r);
      finish(slot, event_id, r);
      return r;
    }
    const Store::TableLoads before = Store::pick_table_load(state_, slot, blocks.size());
    try {
      // A reset frees the worker's holds and names before the store, so they
      // need room only beyond what it frees.
      Store::reserve_for_store(state_, slot, parent_hash, blocks, r.view_reset);
    } catch (...) {
      Store::restore_table_load(state_, slot, before);
      if (created) remove_worker(worker);  // a new worker's first event did not apply
      throw;
    }
    // Only now, with room reserved, may a gap drop the view; dropping it
    // keeps capacity, so the reservation holds.
    if (r.view_reset)
      r.blocks_cascaded +=
          Remove::clear_slot(state_, slot, false) + state_.orphans.erase_slot(slot);
    r.status = Store::store_blocks(state_, slot, parent_hash, blocks, r);
    if (r.view_reset) {  // give back what the reset freed but kept for the store
      state_.tree.shrink_to_fit_live();
      state_.workers[slot].names.shrink_to_load();
    }
    if (r.status == KvEventStatus::applied && !state_.orphans.empty())
      Grafts::settle_stored(state_, slot, blocks, r);
    finish(slot, event_id, r);
    return r;
  }

  /// Applies a Removed event without building a KvEvent. Same rules as apply().
  KvEventResult remove(const KvWorker& worker, std::uint64_t event_id,
                       std::span<const std::uint64_t> block_hashes) {
    bool created = false;
    const std::uint32_t slot = slot_for(worker, created);
    KvEventResult r;
    if (!admit(slot, event_id, r)) return r;
    Store::pick_table_load(state_, slot);
    if (r.view_reset)
      r.blocks_cascaded += Remove::clear_slot(state_, slot) + state_.orphans.erase_slot(slot);
    Remove::remove_blocks(state_, slot, block_hashes, r);
    if (!state_.orphans.empty()) Grafts::remove_orphans(state_, slot, block_hashes, r);
    finish(slot, event_id, r);
    return r;
  }

  /// Applies a Cleared event without building a KvEvent. Same rules as apply().
  KvEventResult clear(const KvWorker& worker, std::uint64_t event_id) {
    bool created = false;
    const std::uint32_t slot = slot_for(worker, created);
    KvEventResult r;
    if (!admit(slot, event_id, r)) return r;
    r.blocks_cascaded +=
        Remove::clear_slot(state_, slot) + state_.orphans.erase_slot(slot);  // also a gap's reset
    finish(slot, event_id, r);
    return r;
  }

  /// Replaces everything known about `worker` in one step with the view that
  /// `dump` rebuilds (its events apply in order, ids ignored) and sets its
  /// cursor to live(last_event_id). If an event of the dump cannot apply, the
  /// old view (and cursor) stays untouched and the result says which event
  /// failed. O(blocks of the old view + blocks of the dump).
  KvReplaceResult replace_worker(const KvWorker& worker, std::span<const KvEvent> dump,
                                 std::uint64_t last_event_id) {
    KvReplaceResult res;
    const std::uint32_t tmp = new_slot(worker);  // built aside, swapped in at the end
    const detail::KvTableLoad edges_before = state_.tree.edge_load();
    Store::pick_table_load(state_, tmp);
    // A failed dump leaves the index as it was: the view built aside, the edge
    // table's load policy and the holder sets' width.
    const auto abandon = [&]() noexcept {
      drop_slot(tmp);
      state_.tree.set_edge_load(edges_before);
      trim_masks();
    };
    for (std::size_t i = 0; i < dump.size(); ++i) {
      KvEventResult r;
      KvEventStatus st = KvEventStatus::applied;
      try {
        if (const auto* s = std::get_if<kv_event::Stored>(&dump[i].data)) {
          if (orphan_store(tmp, s->parent_hash, s->blocks, false)) {
            Grafts::store_orphans(state_, tmp, *s->parent_hash, s->blocks, r, false);
            st = r.status;
          } else {
            Store::pick_table_load(state_, tmp, s->blocks.size());
            Store::reserve_for_store(state_, tmp, s->parent_hash, s->blocks, false);
            st = Store::store_blocks(state_, tmp, s->parent_hash, s->blocks, r);
            if (st == KvEventStatus::applied) Grafts::promote(state_, tmp, s->blocks);
          }
        } else if (const auto* rm = std::get_if<kv_event::Removed>(&dump[i].data)) {
          Remove::remove_blocks(state_, tmp, rm->block_hashes, r);
          Grafts::remove_orphans(state_, tmp, rm->block_hashes, r);
        } else {
          Remove::clear_slot(state_, tmp);
          state_.orphans.erase_slot(tmp);
        }
      } catch (...) {
        abandon();
        throw;
      }
      if (st != KvEventStatus::applied) {
        abandon();
        res.failed_event = i;
        res.failure = st;
        return res;
      }
    }
    std::uint32_t slot = state_.workers.find(worker);
    if (slot != detail::kv_npos) {
      Remove::clear_slot(state_, slot);
      state_.orphans.erase_slot(slot);
      adopt(slot, tmp);
    } else {
      slot = tmp;
      state_.workers.index(worker, tmp);  // capacity reserved by new_slot
    }
    state_.workers[slot].cursor = CursorState<>::live(last_event_id);
    ++state_.counters.workers_replaced;
    trim_masks();
    // Grafts wait until the view is in place: a failed dump must not have
    // changed other workers. They are best effort (see KvGraftPath::settle).
    if (!state_.orphans.empty()) Grafts::settle_replaced(state_, slot, dump);
    res.ok = true;
    res.blocks = state_.workers[slot].blocks;
    return res;
  }

  /// Drops every dp rank of `worker_id` with all its blocks and cursors;
  /// returns how many ranks were dropped. O(ranks known + blocks dropped).
  std::size_t remove_worker(std::uint64_t worker_id) {
    std::vector<KvWorker> ranks;
    for (std::uint32_t s = 0; s < state_.workers.size(); ++s)
      if (state_.workers[s].live && state_.workers[s].worker.worker_id == worker_id)
        ranks.push_back(state_.workers[s].worker);
    for (const KvWorker& w : ranks)
      remove_worker(w);
    return ranks.size();
  }

  /// Drops one dp rank with its blocks and cursor; false if unknown.
  /// O(blocks dropped).
  bool remove_worker(const KvWorker& worker) noexcept {
    const std::uint32_t slot = state_.workers.find(worker);
    if (slot == detail::kv_npos) return false;
    state_.workers.unindex(worker);
    drop_slot(slot);
    trim_masks();
    return true;
  }

  /// Events (Stored only, ids 0, 1, ...) that rebuild `worker`'s view when given
  /// to replace_worker or applied to an empty index; empty for an unknown
  /// worker. O(blocks held).
  [[nodiscard]] std::vector<KvEvent> dump(const KvWorker& worker) const {
    std::vector<KvEvent> out;
    const std::uint32_t slot = state_.workers.find(worker);
    if (slot == detail::kv_npos) return out;
    const std::uint32_t sentinel = state_.workers[slot].sentinel;
    kv_event::Stored* ev = nullptr;
    detail::kv_for_each_hold_chain(
        state_.holds, sentinel,
        [&](std::uint32_t, std::uint32_t parent) {
          out.push_back(KvEvent{out.size(), kv_event::Stored{}});
          ev = &std::get<kv_event::Stored>(out.back().data);
          if (parent != sentinel) ev->parent_hash = state_.holds[parent].block_hash;
        },
        [&](std::uint32_t h) {
          ev->blocks.push_back(KvBlock{state_.holds[h].block_hash,
                                       state_.tree.nodes().tokens_hash(state_.holds[h].node)});
        });
    // Then the orphan chains, each under its parent's name: a chain's first
    // event names its anchor (a parent the worker does not hold), a branch
    // the orphan it leaves from, so replaying the dump keeps them orphans.
    std::vector<std::uint64_t> starts;
    state_.orphans.for_each_of(slot, [&](std::uint64_t name, const detail::KvOrphanBlock& b) {
      if (state_.orphans.find(slot, b.parent) == nullptr) starts.push_back(name);
    });
    while (!starts.empty()) {
      std::uint64_t name = starts.back();
      starts.pop_back();
      kv_event::Stored chain;
      chain.parent_hash = state_.orphans.find(slot, name)->parent;
      for (;;) {
        chain.blocks.push_back(KvBlock{name, state_.orphans.find(slot, name)->tokens_hash});
        const std::vector<std::uint64_t> kids = state_.orphans.children(slot, name);
        if (kids.empty()) break;
        starts.insert(starts.end(), kids.begin() + 1, kids.end());
        name = kids.front();
      }
      out.push_back(KvEvent{out.size(), std::move(chain)});
    }
    return out;
  }

  /// The names (block hashes) of every block `worker` holds, in the tree and
  /// as orphans, sorted ascending: the set an engine's cache holds when the
  /// view is exact (compare with PagedPrefixCache::block_hashes()). Empty for
  /// an unknown worker. O(blocks held x log blocks held).
  [[nodiscard]] std::vector<std::uint64_t> block_hashes(const KvWorker& worker) const {
    std::vector<std::uint64_t> out;
    const std::uint32_t slot = state_.workers.find(worker);
    if (slot == detail::kv_npos) return out;
    out.reserve(state_.workers[slot].blocks + state_.orphans.count(slot));
    detail::kv_for_each_hold_chain(
        state_.holds, state_.workers[slot].sentinel, [](std::uint32_t, std::uint32_t) {},
        [&](std::uint32_t h) { out.push_back(state_.holds[h].block_hash); });
    state_.orphans.for_each_of(
        slot, [&](std::uint64_t name, const detail::KvOrphanBlock&) { out.push_back(name); });
    std::sort(out.begin(), out.end());
    return out;
  }

  /// Per worker rank holding at least the first block, the number of leading
  /// blocks of `tokens_hashes` it holds, in unspecified order. With
  /// `early_exit`, the walk stops once a single worker remains and that worker
  /// gets the depth reached so far. O(matched blocks + holders of the nodes
  /// where the number of holders drops, + result size).
  [[nodiscard]] std::vector<KvWorkerMatch> find_matches(
      std::span<const std::uint64_t> tokens_hashes, bool early_exit = false) const {
    std::vector<KvWorkerMatch> out;
    find_matches(tokens_hashes, early_exit, out);
    return out;
  }

  /// As find_matches above, writing into `out` (cleared first) so a caller can
  /// reuse its capacity. If growing `out` throws, `out` holds some of the
  /// matches or none; the index is unchanged.
  void find_matches(std::span<const std::uint64_t> tokens_hashes, bool early_exit,
                    std::vector<KvWorkerMatch>& out) const {
    Matches::find(state_, tokens_hashes, early_exit, out);
  }

  /// As find_matches(tokens_hashes, early_exit), also counting orphan blocks:
  /// `block_names[i]` is the request's name for block i (the engines' block
  /// hash, e.g. sequence_hashes() of block_hash.hpp), and a worker holding
  /// block i as an orphan, or an orphan whose parent is block i, holds its
  /// i + 1 leading blocks (names are chained).
  /// Per worker, the larger of its tree depth and its deepest orphan; names
  /// past tokens_hashes.size() are ignored. `early_exit` stops the tree walk
  /// only. O(find_matches + (when orphans exist) names x log orphans).
  [[nodiscard]] std::vector<KvWorkerMatch> find_matches(
      std::span<const std::uint64_t> tokens_hashes, std::span<const std::uint64_t> block_names,
      bool early_exit = false) const {
    std::vector<KvWorkerMatch> out;
    find_matches(tokens_hashes, block_names, early_exit, out);
    return out;
  }

  /// As the overload above, writing into `out` (cleared first). If growing
  /// `out` throws, `out` holds some of the matches or none.
  void find_matches(std::span<const std::uint64_t> tokens_hashes,
                    std::span<const std::uint64_t> block_names, bool early_exit,
                    std::vector<KvWorkerMatch>& out) const {
    find_matches(tokens_hashes, early_exit, out);
    Matches::add_orphans(state_, tokens_hashes, block_names, out);
  }

  /// Places orphan chains along a request's path: for every block i of the
  /// request that anchors orphan chains of some worker (their first parent),
  /// the chains are grafted at depth i + 1, with blocks 0..i as their implied
  /// prefix. `block_names` must be the engines' names for `tokens_hashes`
  /// (equal names mean equal prefixes); a graft that conflicts with a
  /// worker's tree is undone. Returns the blocks placed. Best effort, never
  /// throws. O(names x log orphans + grafted blocks); nothing without orphans.
  std::size_t graft_along(std::span<const std::uint64_t> tokens_hashes,
                          std::span<const std::uint64_t> block_names) noexcept {
    return Grafts::graft_along(state_, tokens_hashes, block_names);
  }

  /// Orphan blocks of `worker`: blocks it stored under a parent not (yet)
  /// placed, not counted by block_count (0 for an unknown worker).
  /// O(its orphans + log orphans).
  [[nodiscard]] std::size_t orphan_count(const KvWorker& worker) const noexcept {
    const std::uint32_t slot = state_.workers.find(worker);
    return slot == detail::kv_npos ? 0U : state_.orphans.count(slot);
  }

  /// Orphan blocks over all workers. O(1).
  [[nodiscard]] std::size_t total_orphans() const noexcept { return state_.orphans.size(); }

  /// The cursor of `worker`, or nullopt for an unknown worker. O(1).
  [[nodiscard]] std::optional<CursorState<>> cursor(const KvWorker& worker) const noexcept {
    const std::uint32_t slot = state_.workers.find(worker);
    if (slot == detail::kv_npos) return std::nullopt;
    return state_.workers[slot].cursor;
  }

  /// Blocks `worker` holds (0 for an unknown worker). O(1).
  [[nodiscard]] std::size_t block_count(const KvWorker& worker) const noexcept {
    const std::uint32_t slot = state_.workers.find(worker);
    return slot == detail::kv_npos ? 0U : state_.workers[slot].blocks;
  }

  /// True when `worker` is known (has sent an event or been replaced). O(1).
  [[nodiscard]] bool contains(const KvWorker& worker) const noexcept {
    return state_.workers.find(worker) != detail::kv_npos;
  }

  /// Known worker ranks, in unspecified order. O(slots).
  [[nodiscard]] std::vector<KvWorker> workers() const {
    std::vector<KvWorker> out;
    for (std::uint32_t s = 0; s < state_.workers.size(); ++s)
      if (state_.workers[s].live) out.push_back(state_.workers[s].worker);
    return out;
  }

  /// Number of known worker ranks. O(1).
  [[nodiscard]] std::size_t worker_count() const noexcept { return state_.workers.workers(); }
  /// Tree nodes other than the root; 0 means the tree is back to its root. O(1).
  [[nodiscard]] std::size_t node_count() const noexcept { return state_.tree.nodes().live(); }
  /// (worker, block) pairs held over all workers. O(1).
  [[nodiscard]] std::size_t total_blocks() const noexcept {
    return state_.holds.live() - state_.workers.workers();  // minus one sentinel per worker
  }
  /// Event counters since construction. O(1).
  [[nodiscard]] const KvIndexCounters& counters() const noexcept { return state_.counters; }
  /// The options given at construction. O(1).
  [[nodiscard]] const KvIndexOptions& options() const noexcept { return options_; }

  /// Approximate heap bytes held (container capacities). O(1).
  [[nodiscard]] std::size_t approximate_memory_bytes() const noexcept {
    return state_.tree.memory_bytes() + state_.holds.memory_bytes() +
           state_.workers.memory_bytes() + state_.orphans.memory_bytes();
  }

  /// Checks every internal invariant (holder bits and counts, the subset rule
  /// parent/child, hold trees, hash tables, free lists, the holder arena).
  /// O(everything); for tests.
  [[nodiscard]] bool check_invariants() const {
    std::size_t holds_seen = 0;
    std::vector<std::uint32_t> seen_count(state_.tree.nodes().rows(), 0U);
    for (std::uint32_t slot = 0; slot < state_.workers.size(); ++slot) {
      const Slot& s = state_.workers[slot];
      if (!s.live) continue;
      if (state_.workers.find(s.worker) != slot) return false;
      std::size_t blocks = 0;
      std::vector<std::pair<std::uint32_t, std::uint32_t>> stack{{s.sentinel, detail::kv_npos}};
      while (!stack.empty()) {
        const auto [h, up] = stack.back();  // a hold and its parent hold
        stack.pop_back();
        ++holds_seen;
        const detail::KvHold& x = state_.holds[h];
        if (state_.holds.is_free(h)) return false;
        if (h != s.sentinel) {
          ++blocks;
          if (!state_.tree.nodes().is_live(x.node) || !state_.tree.nodes().test(x.node, slot))
            return false;
          if (state_.tree.nodes().parent(x.node) != state_.holds[up].node) return false;
          if (state_.find_name(s, x.block_hash) != h) return false;
          ++seen_count[x.node];
        } else if (x.node != 0U || x.link != detail::kv_npos) {
          return false;
        }
        // The first child links to its parent, every later one to its
        // previous sibling.
        std::uint32_t expect = h | detail::kv_hold_parent_bit;
        for (std::uint32_t c = x.first_child; c != detail::kv_npos; c = state_.holds[c].next) {
          if (state_.holds[c].link != expect) return false;
          expect = c;
          stack.emplace_back(c, h);
        }
      }
      if (blocks != s.blocks) return false;
    }
    if (holds_seen != state_.holds.live() || !state_.holds.check_pool()) return false;
    std::size_t names = 0;
    for (std::uint32_t s = 0; s < state_.workers.size(); ++s) {
      names += state_.workers[s].names.size();
      if (!state_.workers[s].names.check()) return false;
    }
    if (names + state_.workers.workers() != state_.holds.live()) return false;
    std::size_t live_nodes = 0;
    for (std::uint32_t n = 1; n < state_.tree.nodes().rows(); ++n) {
      if (state_.tree.nodes().count(n) == 0U) continue;
      ++live_nodes;
      std::uint32_t bits = 0;
      bool subset = true;
      std::uint32_t last = 0;
      bool ascending = true;
      detail::KvHolderSets::View has;
      state_.tree.nodes().holders(n, has);
      const std::uint32_t p = state_.tree.nodes().parent(n);
      has.for_each([&](std::uint32_t slot) {
        ascending = ascending && (bits == 0U || slot > last);
        last = slot;
        ++bits;
        if (slot >= state_.workers.size() || !state_.workers[slot].live ||
            !state_.tree.nodes().test(n, slot))
          subset = false;
        if (p != 0U && !state_.tree.nodes().test(p, slot)) subset = false;
      });
      if (!subset || !ascending) return false;
      if (bits != state_.tree.nodes().count(n) || bits != seen_count[n]) return false;
    }
    // The word form is in use exactly while every live slot is below 64 (every
    // call that lowers the top slot narrows the sets, and narrowing to the word
    // form never fails).
    if (state_.tree.nodes().word_form() !=
        (state_.workers.top() <= detail::KvHolderSets::word_slots))
      return false;
    // Orphans: the three indexes agree, their slots are live, and a worker
    // never has one name both placed and orphaned.
    if (!state_.orphans.check()) return false;
    for (std::uint32_t slot = 0; slot < state_.workers.size(); ++slot) {
      bool ok = true;
      state_.orphans.for_each_of(slot, [&](std::uint64_t name, const detail::KvOrphanBlock&) {
        ok = ok && state_.workers[slot].live &&
             state_.find_name(state_.workers[slot], name) == detail::kv_npos;
      });
      if (!ok) return false;
    }
    std::size_t orphan_total = 0;
    for (std::uint32_t slot = 0; slot < state_.workers.size(); ++slot)
      orphan_total += state_.orphans.count(slot);
    if (orphan_total != state_.orphans.size()) return false;
    return live_nodes == state_.tree.nodes().live() && state_.tree.check();
  }

 private:
  // The public types the parts work with.
  struct Types {
    using Worker = KvWorker;
    using Block = KvBlock;
    using Result = KvEventResult;
    using Status = KvEventStatus;
    using Match = KvWorkerMatch;
    using Counters = KvIndexCounters;
    using Event = KvEvent;
    using Stored = kv_event::Stored;
  };
  using State = detail::KvIndexState<Types>;
  using Slot = State::Slot;
  using Remove = detail::KvRemovePath<Types>;
  using Store = detail::KvStorePath<Types>;
  using Matches = detail::KvMatchPath<Types>;
  using Grafts = detail::KvGraftPath<Types>;

  // The slot of `worker`, created (with an initial cursor) on first sight;
  // `created` says which. Strong guarantee.
  std::uint32_t slot_for(const KvWorker& worker, bool& created) {
    const std::uint32_t slot = state_.workers.find(worker);
    if (slot != detail::kv_npos) return slot;
    const std::uint32_t fresh = new_slot(worker);
    state_.workers.index(worker, fresh);
    created = true;
    return fresh;
  }

  // A live slot with a sentinel hold, not yet in the worker table (whose
  // capacity for one more entry is reserved). O(slots). Strong guarantee.
  std::uint32_t new_slot(const KvWorker& worker) {
    state_.workers.reserve_index();
    state_.holds.reserve_extra(1);
    // The lowest free index keeps the holder bitsets as narrow as possible.
    const std::uint32_t slot = state_.workers.lowest_free();
    // Never reached in practice: the hold pool, one sentinel per slot, runs
    // out first (reserve_extra above, at 2^31 - 1 holds).
    if (slot >= detail::kv_npos - 1U) throw std::length_error("kv index: too many workers");
    state_.tree.nodes().ensure_slots(std::size_t{slot} + 1U);
    try {
      state_.workers.make_room(slot);
    } catch (...) {
      trim_masks();  // back to the form and width of the live slots
      throw;
    }
    state_.workers.open(slot, worker, state_.holds.allocate(0, 0, detail::kv_npos));
    return slot;
  }

  // Drops every block of `slot`, its sentinel, and frees the slot.
  void drop_slot(std::uint32_t slot) noexcept {
    Remove::clear_slot(state_, slot);
    state_.orphans.erase_slot(slot);
    state_.holds.release(state_.workers[slot].sentinel);
    state_.workers.close(slot);
  }

  // Moves the view built in slot `tmp` into the (cleared) slot `into`, so a
  // replaced worker keeps its slot index and the bitsets need not grow for
  // good. O(blocks of the view).
  void adopt(std::uint32_t into, std::uint32_t tmp) noexcept {
    Slot& dst = state_.workers[into];
    Slot& src = state_.workers[tmp];
    state_.holds.release(dst.sentinel);  // childless after clear_slot
    const std::uint32_t sentinel = src.sentinel;
    detail::kv_for_each_hold_below(state_.holds, sentinel, [&](std::uint32_t h) {
      state_.tree.nodes().move_bit(state_.holds[h].node, tmp, into);
    });
    dst.names = std::move(src.names);
    dst.sentinel = sentinel;
    dst.blocks = src.blocks;
    state_.orphans.move_slot(tmp, into);
    state_.workers.close(tmp);
  }

  // Narrows the holder bitsets to the highest live slot. Optional, so a failed
  // allocation just keeps the current width.
  void trim_masks() noexcept {
    try {
      state_.tree.nodes().fit_slots(state_.workers.top());
    } catch (...) {
    }
  }

  // Classifies the event id; false when the event must not be applied. A gap
  // under reset_and_apply sets r.view_reset: the caller drops the view once
  // nothing can fail any more. Changes nothing but the counters of rejected
  // events.
  bool admit(std::uint32_t slot, std::uint64_t event_id, KvEventResult& r) noexcept {
    Slot& s = state_.workers[slot];
    r.observation = s.cursor.observe(event_id);
    if (std::holds_alternative<cursor::Stale<std::uint64_t>>(r.observation)) {
      ++state_.counters.events_stale;
      r.status = KvEventStatus::stale;
      return false;
    }
    if (std::holds_alternative<cursor::Gap<std::uint64_t>>(r.observation)) {
      if (options_.on_gap == KvGapPolicy::report) {
        ++state_.counters.gaps;
        r.status = KvEventStatus::gap;
        return false;
      }
      r.view_reset = true;
    }
    return true;
  }

  void finish(std::uint32_t slot, std::uint64_t event_id, const KvEventResult& r) noexcept {
    state_.workers[slot].cursor = state_.workers[slot].cursor.advance_to(event_id);
    if (r.view_reset) {
      ++state_.counters.gaps;
      ++state_.counters.views_reset;
    }
    switch (r.status) {
      case KvEventStatus::applied:
        ++state_.counters.events_applied;
        if (r.blocks_orphaned != 0U) ++state_.counters.orphan_stores;
        break;
      case KvEventStatus::parent_not_found:
        ++state_.counters.parent_not_found;
        break;
      case KvEventStatus::block_conflict:
        ++state_.counters.block_conflicts;
        break;
      case KvEventStatus::stale:
      case KvEventStatus::gap:
        break;
    }
  }

  // True when a Stored event takes the orphan path: orphans are kept, it has
  // blocks, and its parent is not placed for `slot` (after a reset nothing is).
  [[nodiscard]] bool orphan_store(std::uint32_t slot, std::optional<std::uint64_t> parent_hash,
                                  std::span<const KvBlock> blocks, bool reset) const noexcept {
    if (options_.on_unknown_parent != KvUnknownParent::keep_orphan || !parent_hash ||
        blocks.empty())
      return false;
    return reset || state_.find_name(state_.workers[slot], *parent_hash) == detail::kv_npos;
  }

  KvIndexOptions options_;
  State state_;
};

}  // namespace promptcache

#endif  // PROMPTCACHE_KV_INDEX_HPP
