// promptcache: detail/kv_index_state.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The state of one KvIndex, which every part of it (the store, remove and
// match paths, orphan grafting) works on: the tree (nodes, holder sets,
// edges), every worker's holds, the worker slots, the event counters and the
// orphan blocks. The parts are stateless: they take the state by reference,
// so a call through a part costs what a member function of the index did.
//
// Invariants (checked by KvIndex::check_invariants): a worker holding a node
// holds its parent; a node's holder set is exactly the slots with a hold on
// it; every hold but a slot's sentinel has its name in the slot's name table;
// a slot never has one name both placed (held) and orphaned.
#pragma once

#include <cstdint>
#include <utility>

#include "promptcache/detail/kv_index_holds.hpp"
#include "promptcache/detail/kv_index_orphans.hpp"
#include "promptcache/detail/kv_index_tree.hpp"
#include "promptcache/detail/kv_index_workers.hpp"

namespace promptcache::detail {

/// The shared state of a KvIndex. `Types` names the public types the parts
/// use: Worker, Block, Result, Status, Match, Counters, Event and Stored.
template <class Types>
struct KvIndexState {
  /// One worker rank's slot.
  using Slot = KvWorkerSlot<typename Types::Worker>;

  KvTree tree;                                    ///< nodes, holder sets, edges
  KvHoldStore holds;                              ///< (worker, block) pairs, as per-worker trees
  KvWorkerSlots<typename Types::Worker> workers;  ///< cursors, names, hold roots
  typename Types::Counters counters;              ///< event counters
  KvOrphans orphans;  ///< blocks stored under parents unknown to their worker

  /// Exchanges everything with `other`. O(1), noexcept.
  void swap(KvIndexState& other) noexcept {
    using std::swap;
    tree.swap(other.tree);
    swap(holds, other.holds);
    workers.swap(other.workers);
    swap(counters, other.counters);
    orphans.swap(other.orphans);
  }

  /// The name-table fingerprint of a worker's block hash. O(1).
  [[nodiscard]] static constexpr std::uint32_t name_fp(std::uint64_t block_hash) noexcept {
    return kv_name_fingerprint(block_hash);
  }

  /// The hold of `s` named `block_hash`, or kv_npos. O(1) expected.
  [[nodiscard]] std::uint32_t find_name(const Slot& s, std::uint64_t block_hash) const noexcept {
    return s.names.find(name_fp(block_hash),
                        [&](std::uint32_t h) { return holds[h].block_hash == block_hash; });
  }
};

}  // namespace promptcache::detail
