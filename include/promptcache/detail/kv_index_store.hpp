// promptcache: detail/kv_index_store.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The store path of KvIndex: the choice of the edge and name tables' load
// (roomy while the index is small, compact from 2^19 pairs on), the
// reservation that makes a store's mutation phase allocation-free (with the
// read-only walk that counts what a store can add), and the store of a chain
// itself (a chunked walk with its probes issued up front), undone whole on a
// conflict.
//
// Invariants: reserve_for_store is the only step that allocates, and it
// changes nothing but capacity, so store_blocks never throws and a store gives
// the strong guarantee. store_blocks either applies the whole chain or, on a
// conflict (a name held elsewhere, or a position under another name), leaves
// the tree, the holds and the names as they were. A worker holding a node
// holds its parent, so the holds a store adds form one chain.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "promptcache/detail/kv_index_remove.hpp"
#include "promptcache/detail/kv_index_state.hpp"

namespace promptcache::detail {

/// The store path over a KvIndexState<Types>. Stateless.
template <class Types>
struct KvStorePath {
  /// The state it works on.
  using State = KvIndexState<Types>;
  /// The per-event result it counts into.
  using Result = typename Types::Result;
  /// The event status it returns.
  using Status = typename Types::Status;
  /// One block of a Stored event (block_hash, tokens_hash).
  using Block = typename Types::Block;
  /// Undoes a conflicting store.
  using Remove = KvRemovePath<Types>;

  /// Below this many (worker, block) pairs the edge and name tables run at
  /// load 1/16..1/4 instead of 2/5..4/5: inserts and deletions shift far
  /// shorter runs, and most probes end at their home slot (fewer mispredicted
  /// loop exits), while the extra bytes are few (a table keeps roomy slots
  /// only until its next resize, at most 16 per entry it then held). The
  /// threshold bounds a roomy table at about 32 MiB (8 slots of 8 bytes per
  /// entry after its last doubling).
  /// From this many on they run compact, so large indexes keep their size;
  /// between half of it and it each table keeps the policy it has, so an
  /// index hovering at the threshold does not resize back and forth.
  static constexpr std::size_t compact_tables_from = std::size_t{1} << 19U;

  /// The load policies of a slot's name table and of the edge table.
  struct TableLoads {
    KvTableLoad names;  ///< the slot's name table
    KvTableLoad edges;  ///< the edge table
  };

  /// Sets the load policy of `slot`'s name table and of the edge table from
  /// the number of live pairs plus the `incoming` blocks the event may add (see
  /// compact_tables_from): a table grows only while reserving for an event, so
  /// one large event (or dump) grows it compact once it would cross the
  /// threshold. Returns the policies before, for restore_table_load. O(1).
  static TableLoads pick_table_load(State& st, std::uint32_t slot,
                                    std::size_t incoming = 0) noexcept {
    const TableLoads before{st.workers[slot].names.load(), st.tree.edge_load()};
    const std::size_t pairs = st.holds.live() + incoming;
    if (pairs >= compact_tables_from) {
      st.workers[slot].names.set_load(KvTableLoad::compact);
      st.tree.set_edge_load(KvTableLoad::compact);
    } else if (pairs < compact_tables_from / 2U) {
      st.workers[slot].names.set_load(KvTableLoad::roomy);
      st.tree.set_edge_load(KvTableLoad::roomy);
    }
    return before;
  }

  /// Undoes pick_table_load when the event fails, so a failed event leaves
  /// even the growth policy as it was. O(1).
  static void restore_table_load(State& st, std::uint32_t slot, TableLoads before) noexcept {
    st.workers[slot].names.set_load(before.names);
    st.tree.set_edge_load(before.edges);
  }

  /// Makes the mutation phase of a store allocation-free, so std::bad_alloc
  /// (or std::length_error) can only come before anything changed, without
  /// growing anything for blocks the store will not add. `reset`: a gap's
  /// reset drops the slot's view first (a no-shrink clear_slot, so what it
  /// frees stays as capacity).
  static void reserve_for_store(State& st, std::uint32_t slot,
                                std::optional<std::uint64_t> parent_hash,
                                std::span<const Block> blocks, bool reset) {
    const std::size_t n = blocks.size();
    const std::size_t freed = reset ? st.workers[slot].blocks : 0U;
    const std::size_t own = n > freed ? n - freed : 0U;
    // Room for every block as a new node, holder and hold is usually at
    // hand (free lists, the last page, table headroom): then nothing grows
    // and the tree need not be walked twice.
    auto& names = st.workers[slot].names;
    if (st.tree.fits(n) && st.holds.fits_extra(own) && names.fits_extra(own)) return;
    // Otherwise the store reserves only what it can add, so an idempotent
    // re-store grows nothing (unless pick_table_load switched the tables to the
    // roomy load: it counts every block of the event) and new nodes take no
    // holder-set room.
    const StoreNeed need = store_need(st, slot, parent_hash, blocks, reset);
    st.tree.reserve_exact(need.nodes, need.holder_units);
    // After a reset a chained event finds no parent: it adds nothing.
    const std::size_t holds = !reset ? need.holds : parent_hash ? 0U : own;
    st.holds.reserve_extra(holds);
    names.reserve_extra(holds);
  }

  /// What a store can add: new nodes, new holds (and names), and the
  /// holder-set room of the existing nodes that gain a holder.
  struct StoreNeed {
    std::size_t nodes = 0;         ///< nodes for missing levels
    std::size_t holds = 0;         ///< holds (and names) for blocks not held
    std::size_t holder_units = 0;  ///< holder-set room of existing nodes gaining a holder
  };

  /// The read-only walk of a store (see reserve_for_store): the chain's levels
  /// that exist already need no node, those `slot` holds no hold either, and
  /// a holder joining an existing node's set may need the block that set
  /// moves to (none while it fits in the holder word).
  /// With `reset` the slot's view is counted as dropped: its holds, and the
  /// nodes only it holds, are gone. Upper bounds: a conflict adds less.
  /// O(blocks) expected.
  [[nodiscard]] static StoreNeed store_need(const State& st, std::uint32_t slot,
                                            std::optional<std::uint64_t> parent_hash,
                                            std::span<const Block> blocks, bool reset) noexcept {
    StoreNeed need;
    std::uint32_t cur_node = 0;
    if (parent_hash) {
      // After a reset the slot holds nothing, so the parent is not found.
      const std::uint32_t h = reset ? kv_npos : st.find_name(st.workers[slot], *parent_hash);
      if (h == kv_npos) return need;  // parent_not_found: adds nothing
      cur_node = st.holds[h].node;
    }
    const KvNodeStore& nodes = st.tree.nodes();
    constexpr std::size_t chunk = 64;
    std::uint64_t paths[chunk];
    std::uint32_t found[chunk];
    std::uint32_t counts[chunk];
    std::uint64_t path = nodes.path_hash(cur_node);
    std::size_t existing = 0;  // leading levels whose node exists (after a reset)
    std::size_t held = 0;      // leading levels the slot holds (a holder holds the parent)
    bool holding = true;       // no level the slot does not hold seen yet
    for (std::size_t base = 0; base < blocks.size(); base += chunk) {
      const std::size_t m = std::min(chunk, blocks.size() - base);
      // No edge prefetches: a chain stored in order is followed row by row,
      // and the walk batches its table probes after a miss.
      for (std::size_t j = 0; j < m; ++j) {
        path = KvNodeStore::child_path(path, blocks[base + j].tokens_hash);
        paths[j] = path;
      }
      const std::size_t walked = st.tree.walk(paths, m, cur_node, found, counts);
      for (std::size_t j = 0; j < walked; ++j) {
        const bool mine = holding && nodes.test(found[j], slot);
        holding = mine;
        const std::uint32_t others = counts[j] - (mine ? 1U : 0U);
        if (reset) {
          // Only the slot holds it: the reset frees it, and every node below.
          if (others == 0U) {
            need.nodes = blocks.size() - existing;
            return need;
          }
        } else if (mine) {
          ++held;
        }
        ++existing;
        if (!mine || reset) need.holder_units += nodes.holder_insert_units(others);
      }
      if (walked < m) break;
      cur_node = found[m - 1U];
    }
    need.nodes = blocks.size() - existing;
    need.holds = blocks.size() - held;
    return need;
  }

  /// Stores the chain (capacity reserved by reserve_for_store). On a conflict
  /// every hold it added is undone, so the tree is unchanged.
  static Status store_blocks(State& st, std::uint32_t slot,
                             std::optional<std::uint64_t> parent_hash,
                             std::span<const Block> blocks, Result& r) noexcept {
    auto& names = st.workers[slot].names;
    std::uint32_t cur_hold = st.workers[slot].sentinel;
    if (parent_hash) {
      cur_hold = st.find_name(st.workers[slot], *parent_hash);
      if (cur_hold == kv_npos) return Status::parent_not_found;
    }
    // The chain's last hold, kept at hand: the next new hold links under it.
    KvHold* cur = &st.holds[cur_hold];
    std::uint32_t cur_node = cur->node;
    std::size_t added = 0;
    // Path hashes follow from the tokens hashes alone, so the probes of a whole
    // chunk are issued up front and their cache misses overlap.
    constexpr std::size_t chunk = 64;
    std::uint64_t paths[chunk];
    std::uint32_t name_fps[chunk];
    std::uint32_t found[chunk];
    std::uint64_t path = st.tree.nodes().path_hash(cur_node);
    for (std::size_t base = 0; base < blocks.size(); base += chunk) {
      const std::size_t m = std::min(chunk, blocks.size() - base);
      for (std::size_t j = 0; j < m; ++j) {
        path = KvNodeStore::child_path(path, blocks[base + j].tokens_hash);
        paths[j] = path;
        st.tree.prefetch_edge(path);
        name_fps[j] = kv_name_fingerprint(blocks[base + j].block_hash);
        names.prefetch(name_fps[j]);
      }
      // Nodes that already exist (a prefix other workers hold) are found in a
      // first pass so that their rows are on the way before they are written.
      const std::size_t walked = st.tree.walk(paths, m, cur_node, found);
      for (std::size_t j = 0; j < m; ++j) {
        const Block& b = blocks[base + j];
        // Past the walk the parent is new (or the walk's first miss), so the
        // node cannot exist yet.
        std::uint32_t child = j < walked ? found[j] : kv_npos;
        bool fresh_node = false;
        if (child == kv_npos) {  // a new node, held by this slot from the start
          child = st.tree.add_held_child(paths[j], cur_node, slot);
          fresh_node = true;
        }
        // One probe serves both the lookup and the insert (room is reserved).
        const auto name = names.probe(
            name_fps[j], [&](std::uint32_t h) { return st.holds[h].block_hash == b.block_hash; });
        if (name.value != kv_npos) {
          KvHold& held = st.holds[name.value];
          if (held.node == child) {  // re-store of a held block (never on a new node)
            ++r.blocks_already_held;
            cur_hold = name.value;
            cur = &held;
            cur_node = child;
            continue;
          }
        } else if (fresh_node || st.tree.nodes().add_holder(child, slot)) {
          const auto h = st.holds.allocate_child(b.block_hash, child, cur_hold, *cur);
          names.insert_at(name, name_fps[j], h.index);
          ++added;
          cur_hold = h.index;
          cur = h.hold;
          cur_node = child;
          continue;
        }
        // Conflict: the name is held elsewhere, or the position under another name.
        if (fresh_node) {
          (void)st.tree.nodes().reset_bit(child, slot);
          Remove::free_node(st, child);
        }
        st.workers[slot].blocks += added;  // undo_chain takes them off again
        undo_chain(st, slot, cur_hold, added);
        r.blocks_already_held = 0;
        return Status::block_conflict;
      }
    }
    // Counted once here: the per-block stores into holds and rows could alias
    // the worker's counter and would make the compiler reload it each block.
    st.workers[slot].blocks += added;
    r.blocks_stored = added;
    return Status::applied;
  }

  /// Undoes the `added` holds of a store. After the first new hold every later
  /// one is new too (a worker holding a node holds its parent), so they form a
  /// chain ending at `h`.
  static void undo_chain(State& st, std::uint32_t slot, std::uint32_t h,
                         std::size_t added) noexcept {
    for (std::size_t i = 0; i < added; ++i) {
      const std::uint32_t parent = st.holds.parent(h);  // O(1): a new hold is a first child
      Remove::release_hold(st, slot, h, State::name_fp(st.holds[h].block_hash));
      h = parent;
    }
  }
};

}  // namespace promptcache::detail
