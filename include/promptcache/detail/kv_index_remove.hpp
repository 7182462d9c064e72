// promptcache: detail/kv_index_remove.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The remove path of KvIndex: a Removed event's blocks (a software pipeline
// over chunks of names), cascading removal of a hold's subtree, dropping a
// worker's whole view, and releasing one hold (its name, its holder bit, and
// the node once no worker holds it).
//
// Invariants: removal never allocates, so it never throws and a freed hold is
// not reused while an event is being removed (a name that an earlier name of
// the same event cascaded away is seen as not held). Holds are released
// leaves first, so a worker holding a node always holds its parent; with
// `shrink` false the tables and pools keep their capacity, so room reserved
// for a store that follows stays reserved.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "promptcache/detail/kv_index_state.hpp"

namespace promptcache::detail {

/// The remove path over a KvIndexState<Types>. Stateless.
template <class Types>
struct KvRemovePath {
  /// The state it works on.
  using State = KvIndexState<Types>;
  /// A slot of the state.
  using Slot = typename State::Slot;
  /// The per-event result it counts into.
  using Result = typename Types::Result;

  /// Removes the blocks of `slot` named `block_hashes`, each with its
  /// descendants; counts removed, cascaded and not-held blocks into `r`.
  /// O(B + D) expected.
  static void remove_blocks(State& st, std::uint32_t slot,
                            std::span<const std::uint64_t> block_hashes, Result& r) noexcept {
    // A software pipeline over chunks: each stage prefetches what the next
    // one reads (name slot, hold, node row, edge slot), so the misses overlap.
    auto& names = st.workers[slot].names;
    constexpr std::size_t chunk = 64;
    std::uint32_t hs[chunk];
    KvHold* hp[chunk];              // the elements of hs[j], found once for all stages
    std::uint32_t fps[2][chunk];    // this chunk's name fingerprints and the next one's
    std::size_t name_slots[chunk];  // where hs[j] was found, a hint for erasing it
    // The name slots are prefetched a chunk ahead: they are the first miss of
    // each block, and the other stages depend on them.
    const auto issue_names = [&](std::size_t from, std::uint32_t* dst) {
      const std::size_t k = std::min(chunk, block_hashes.size() - from);
      for (std::size_t j = 0; j < k; ++j) {
        dst[j] = kv_name_fingerprint(block_hashes[from + j]);
        names.prefetch(dst[j]);
      }
    };
    if (!block_hashes.empty()) issue_names(0, fps[0]);
    for (std::size_t base = 0, cur = 0; base < block_hashes.size(); base += chunk, cur ^= 1U) {
      const std::size_t m = std::min(chunk, block_hashes.size() - base);
      const std::uint32_t* name_fps = fps[cur];
      if (base + chunk < block_hashes.size()) issue_names(base + chunk, fps[cur ^ 1U]);
      // Candidates by fingerprint first, so the holds that confirm them load
      // together.
      for (std::size_t j = 0; j < m; ++j) {
        const auto first = names.first_slot(name_fps[j]);
        hs[j] = first.value;
        name_slots[j] = first.pos;
        if (hs[j] != kv_npos) {
          hp[j] = &st.holds[hs[j]];
          KvHoldStore::prefetch(*hp[j]);
        }
      }
      for (std::size_t j = 0; j < m; ++j)
        if (hs[j] != kv_npos && hp[j]->block_hash != block_hashes[base + j]) {
          hs[j] = st.find_name(st.workers[slot], block_hashes[base + j]);
          if (hs[j] != kv_npos) hp[j] = &st.holds[hs[j]];
        }
      for (std::size_t j = 0; j < m; ++j)
        if (hs[j] != kv_npos) st.tree.nodes().prefetch(hp[j]->node);
      for (std::size_t j = 0; j < m; ++j)
        if (hs[j] != kv_npos) st.tree.prefetch_edge(st.tree.nodes().path_hash(hp[j]->node));
      for (std::size_t j = 0; j < m; ++j) {
        // An earlier name of this event may have cascaded it away. A removal
        // allocates nothing, so a freed hold is not reused meanwhile (and its
        // element stays where hp[j] points).
        const std::uint32_t h = hs[j];
        if (h == kv_npos || KvHoldStore::is_free(*hp[j])) {
          ++r.blocks_not_held;
          continue;
        }
        ++r.blocks_removed;
        if (hp[j]->first_child == kv_npos)  // a leaf (LRU evicts these): no walk
          release_hold(st, slot, h, *hp[j], name_fps[j], true, name_slots[j]);
        else
          r.blocks_cascaded += remove_subtree_fp(st, slot, h, name_fps[j]) - 1U;
      }
    }
  }

  /// Drops every block of `slot`; returns how many. With shrink false the
  /// tables and pools keep their capacity (reservations stay valid).
  /// O(blocks dropped).
  static std::size_t clear_slot(State& st, std::uint32_t slot, bool shrink = true) noexcept {
    const std::uint32_t sentinel = st.workers[slot].sentinel;
    std::size_t n = 0;
    while (st.holds[sentinel].first_child != kv_npos)
      n += remove_subtree(st, slot, st.holds[sentinel].first_child, shrink);
    return n;
  }

  /// Releases hold `top` and all its descendants, leaves first, without
  /// recursion (chains can be thousands of blocks long). Returns how many.
  static std::size_t remove_subtree(State& st, std::uint32_t slot, std::uint32_t top,
                                    bool shrink = true) noexcept {
    return remove_subtree_fp(st, slot, top, State::name_fp(st.holds[top].block_hash), shrink);
  }

  /// As above, with `top_fp` the name fingerprint of `top`'s block hash (a
  /// removal has it from its lookup).
  static std::size_t remove_subtree_fp(State& st, std::uint32_t slot, std::uint32_t top,
                                       std::uint32_t top_fp, bool shrink = true) noexcept {
    return kv_drop_hold_subtree(st.holds, top, [&](std::uint32_t h, bool is_top) {
      release_hold(st, slot, h, is_top ? top_fp : State::name_fp(st.holds[h].block_hash), shrink);
    });
  }

  /// Releases a childless hold of `slot`: its name, its holder bit, and the
  /// node when no worker holds it any more. `fp`: name_fp of its block hash.
  /// Always inlined: it runs once per removed block. `name_slot`: where the
  /// name table had the name (a hint, checked; out of range when unknown).
  [[gnu::always_inline]] static void release_hold(State& st, std::uint32_t slot, std::uint32_t h,
                                                  std::uint32_t fp, bool shrink = true,
                                                  std::size_t name_slot = ~std::size_t{
                                                      0}) noexcept {
    release_hold(st, slot, h, st.holds[h], fp, shrink, name_slot);
  }

  /// As above, with `x` the element of hold `h` (a caller that has it saves
  /// the page-table step).
  [[gnu::always_inline]] static void release_hold(State& st, std::uint32_t slot, std::uint32_t h,
                                                  KvHold& x, std::uint32_t fp, bool shrink = true,
                                                  std::size_t name_slot = ~std::size_t{
                                                      0}) noexcept {
    Slot& s = st.workers[slot];
    s.names.erase_hint(name_slot, fp, h, shrink);
    --s.blocks;
    if (st.tree.nodes().reset_bit(x.node, slot, shrink) == 0U) free_node(st, x.node, shrink);
    st.holds.release(h, x);
  }

  /// Frees node `n`, which no worker holds any more. O(1) expected.
  static void free_node(State& st, std::uint32_t n, bool shrink = true) noexcept {
    st.tree.remove_node(n, shrink);
  }
};

}  // namespace promptcache::detail
