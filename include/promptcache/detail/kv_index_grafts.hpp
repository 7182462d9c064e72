// promptcache: detail/kv_index_grafts.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The orphan path of KvIndex: keeping a Stored event's chain as orphans of
// its worker (under KvUnknownParent::keep_orphan), the orphan part of a
// Removed event, and settling: grafting orphan chains into the tree once
// their anchor (the parent name of a chain's first block) is placed by some
// worker, after a store, an orphan store, a replace_worker, or along a
// request's path (graft_along).
//
// Invariants: a worker never has one name both placed and orphaned (a store
// that places an orphan promotes it; a graft erases what it placed). An
// orphan store changes nothing until everything it allocates is staged, so it
// gives the strong guarantee. A graft is best effort and never throws: it
// places the implied path (the donor's names from the root to the anchor),
// then the chain parents first, and one that fails (an allocation, or a
// conflict with the worker's holds) is undone whole, its chain left an
// orphan chain; removal never allocates, so the undo cannot fail.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <variant>
#include <vector>

#include "promptcache/detail/kv_index_remove.hpp"
#include "promptcache/detail/kv_index_state.hpp"
#include "promptcache/detail/kv_index_store.hpp"

namespace promptcache::detail {

/// The orphan path over a KvIndexState<Types>. Stateless.
template <class Types>
struct KvGraftPath {
  /// The state it works on.
  using State = KvIndexState<Types>;
  /// The per-event result it counts into.
  using Result = typename Types::Result;
  /// The event status.
  using Status = typename Types::Status;
  /// One block of a Stored event (block_hash, tokens_hash).
  using Block = typename Types::Block;
  /// One event of a dump (replace_worker).
  using Event = typename Types::Event;
  /// The Stored payload of an event.
  using Stored = typename Types::Stored;
  /// Places grafted blocks.
  using Store = KvStorePath<Types>;
  /// Undoes failed grafts.
  using Remove = KvRemovePath<Types>;

  /// Places the orphan chains anchored along a request's path (see
  /// KvIndex::graft_along); returns the blocks placed. Best effort, never
  /// throws. O(names x log orphans + grafted blocks); nothing without orphans.
  static std::size_t graft_along(State& st, std::span<const std::uint64_t> tokens_hashes,
                                 std::span<const std::uint64_t> block_names) noexcept {
    if (st.orphans.empty()) return 0;
    Result r;
    const std::size_t n = std::min(tokens_hashes.size(), block_names.size());
    std::vector<Block> path;
    std::vector<std::uint32_t> slots;
    std::vector<std::uint64_t> work;
    try {
      path.reserve(n);
      for (std::size_t i = 0; i < n && !st.orphans.empty(); ++i) {
        path.push_back(Block{block_names[i], tokens_hashes[i]});
        slots.clear();
        st.orphans.for_each_child_of(block_names[i], [&](std::uint32_t s, std::uint64_t) {
          if ((slots.empty() || slots.back() != s) && st.orphans.find(s, block_names[i]) == nullptr)
            slots.push_back(s);
        });
        for (const std::uint32_t s : slots)
          graft_path(st, s, block_names[i], path, work, r);
      }
    } catch (...) {
    }
    settle(st, work, r);  // chains anchored at what the grafts placed
    return r.blocks_grafted;
  }

  /// Keeps a chain under `parent` (not placed for `slot`) as orphans: it
  /// extends the orphan `parent`, or starts a chain anchored at it. Conflicts
  /// as in the tree: a name placed for the slot, an orphan name under another
  /// parent or with another tokens hash, a name twice, or the chain's anchor
  /// itself (a cycle). Everything that allocates happens before anything
  /// changes (the insertions are staged), so on std::bad_alloc nothing did;
  /// `reset` drops the slot's view once nothing can fail.
  static void store_orphans(State& st, std::uint32_t slot, std::uint64_t parent,
                            std::span<const Block> blocks, Result& r, bool reset) {
    std::uint64_t anchor = parent;  // the chain's first parent that is not an orphan
    if (!reset)
      while (const KvOrphanBlock* o = st.orphans.find(slot, anchor))
        anchor = o->parent;
    KvOrphans::Stage stage;
    bool conflict = false;
    std::size_t already = 0;
    std::uint64_t up = parent;
    for (const Block& b : blocks) {
      const KvOrphanBlock* o = reset ? nullptr : st.orphans.find(slot, b.block_hash);
      if (b.block_hash == anchor ||
          (!reset && st.find_name(st.workers[slot], b.block_hash) != kv_npos) ||
          stage.blocks.count({slot, b.block_hash}) != 0U ||
          (o != nullptr && (o->parent != up || o->tokens_hash != b.tokens_hash))) {
        conflict = true;
        break;
      }
      if (o != nullptr)
        ++already;
      else
        stage.add(slot, b.block_hash, KvOrphanBlock{b.tokens_hash, up});
      up = b.block_hash;
    }
    if (reset) r.blocks_cascaded += Remove::clear_slot(st, slot) + st.orphans.erase_slot(slot);
    if (conflict) {
      r.status = Status::block_conflict;
      return;
    }
    r.blocks_orphaned = stage.blocks.size();
    r.blocks_already_held = already;
    st.orphans.commit(stage);
    r.status = Status::applied;
  }

  /// Orphans of `slot` that a normal store just placed become ordinary holds:
  /// their orphan entries go, and their orphan children are left anchored at
  /// them (placed now), for settle to graft. Never allocates.
  static void promote(State& st, std::uint32_t slot, std::span<const Block> blocks) noexcept {
    for (const Block& b : blocks)
      (void)st.orphans.erase_one(slot, b.block_hash);
  }

  /// After an applied normal store of `slot`: promotes its placed orphans and
  /// grafts every chain anchored at a name the store placed.
  static void settle_stored(State& st, std::uint32_t slot, std::span<const Block> blocks,
                            Result& r) noexcept {
    promote(st, slot, blocks);
    std::vector<std::uint64_t> names;
    try {
      names.reserve(blocks.size());
      for (const Block& b : blocks)
        names.push_back(b.block_hash);
    } catch (...) {
      return;  // best effort, as every graft
    }
    settle(st, names, r);
  }

  /// After an orphan store of `slot` under `parent`: grafts the chain if its
  /// anchor is placed by some worker.
  static void settle_anchor_of(State& st, std::uint32_t slot, std::uint64_t parent,
                               Result& r) noexcept {
    std::uint64_t anchor = parent;
    while (const KvOrphanBlock* o = st.orphans.find(slot, anchor))
      anchor = o->parent;
    std::vector<std::uint64_t> names;
    try {
      names.push_back(anchor);
    } catch (...) {
      return;
    }
    settle(st, names, r);
  }

  /// After a successful replace_worker of `slot`: grafts chains anchored at
  /// the dump's names (of other workers too), and the slot's own chains.
  static void settle_replaced(State& st, std::uint32_t slot, std::span<const Event> dump) noexcept {
    Result r;
    std::vector<std::uint64_t> names;
    try {
      for (const Event& e : dump)
        if (const auto* s = std::get_if<Stored>(&e.data))
          for (const Block& b : s->blocks)
            if (st.find_name(st.workers[slot], b.block_hash) != kv_npos)
              names.push_back(b.block_hash);
      st.orphans.for_each_of(slot, [&](std::uint64_t, const KvOrphanBlock& b) {
        if (st.orphans.find(slot, b.parent) == nullptr) names.push_back(b.parent);
      });
    } catch (...) {
      return;
    }
    settle(st, names, r);
  }

  /// Grafts, for every name in the worklist that some worker has placed, the
  /// orphan chains anchored at it (in slots that do not hold it as an orphan),
  /// and goes on with the names the grafts place. Best effort: a graft that
  /// fails (an allocation, or a conflict with the slot's holds) is undone
  /// whole and its chain stays an orphan chain, still routable by name; it is
  /// tried again when its anchor is next placed. Never throws.
  static void settle(State& st, std::vector<std::uint64_t>& work, Result& r) noexcept {
    std::vector<std::uint32_t> slots;
    while (!work.empty() && !st.orphans.empty()) {
      const std::uint64_t anchor = work.back();
      work.pop_back();
      slots.clear();
      try {
        st.orphans.for_each_child_of(anchor, [&](std::uint32_t s, std::uint64_t) {
          if ((slots.empty() || slots.back() != s) && st.orphans.find(s, anchor) == nullptr)
            slots.push_back(s);
        });
      } catch (...) {
        continue;
      }
      if (slots.empty()) continue;
      // Any worker that placed the name: equal names mean equal prefixes.
      std::uint32_t donor = kv_npos;
      std::uint32_t donor_hold = kv_npos;
      for (std::uint32_t d = 0; d < st.workers.size() && donor == kv_npos; ++d) {
        if (!st.workers[d].live) continue;
        const std::uint32_t h = st.find_name(st.workers[d], anchor);
        if (h != kv_npos) {
          donor = d;
          donor_hold = h;
        }
      }
      if (donor == kv_npos) continue;
      for (const std::uint32_t s : slots)
        graft(st, s, anchor, donor, donor_hold, work, r);
    }
  }

  /// Places the orphan chains of `slot` anchored at `anchor` under the node
  /// that `donor` holds as `donor_hold`: first the path from the root to that
  /// node (the blocks the chain implies, named as the donor names them), then
  /// the orphans in pre-order. Newly placed names join `work`.
  static void graft(State& st, std::uint32_t slot, std::uint64_t anchor, std::uint32_t donor,
                    std::uint32_t donor_hold, std::vector<std::uint64_t>& work,
                    Result& r) noexcept {
    std::vector<Block> path;
    try {
      if (st.find_name(st.workers[slot], anchor) == kv_npos) {
        for (std::uint32_t h = donor_hold; h != st.workers[donor].sentinel; h = st.holds.parent(h))
          path.push_back(
              Block{st.holds[h].block_hash, st.tree.nodes().tokens_hash(st.holds[h].node)});
        std::reverse(path.begin(), path.end());
      }
    } catch (...) {
      return;
    }
    graft_path(st, slot, anchor, path, work, r);
  }

  /// As graft, with `path` the blocks from the root to the anchor (its last
  /// block), or empty when the slot has the anchor in its tree.
  static void graft_path(State& st, std::uint32_t slot, std::uint64_t anchor,
                         std::span<const Block> path, std::vector<std::uint64_t>& work,
                         Result& r) noexcept {
    std::vector<std::uint64_t> added;  // names newly placed, to undo a failed graft
    try {
      // The orphans, parents before children.
      std::vector<std::pair<std::uint64_t, Block>> order;  // (parent name, block)
      std::vector<std::uint64_t> stack = st.orphans.children(slot, anchor);
      const std::vector<std::uint64_t> roots = stack;
      while (!stack.empty()) {
        const std::uint64_t name = stack.back();
        stack.pop_back();
        const KvOrphanBlock* o = st.orphans.find(slot, name);
        order.emplace_back(o->parent, Block{name, o->tokens_hash});
        const std::vector<std::uint64_t> kids = st.orphans.children(slot, name);
        stack.insert(stack.end(), kids.begin(), kids.end());
      }
      added.reserve(path.size() + order.size());
      work.reserve(work.size() + path.size() + order.size());
      const auto place = [&](std::optional<std::uint64_t> parent, std::span<const Block> blocks) {
        Result one;
        Store::pick_table_load(st, slot, blocks.size());
        Store::reserve_for_store(st, slot, parent, blocks, false);
        if (Store::store_blocks(st, slot, parent, blocks, one) != Status::applied) return false;
        // The new holds are the chain's last ones (a holder holds the parent).
        for (std::size_t i = blocks.size() - one.blocks_stored; i < blocks.size(); ++i)
          added.push_back(blocks[i].block_hash);
        return true;
      };
      bool ok = st.find_name(st.workers[slot], anchor) != kv_npos ||
                (!path.empty() && place(std::nullopt, path));
      for (std::size_t i = 0; ok && i < order.size(); ++i)
        ok = place(order[i].first, std::span<const Block>(&order[i].second, 1));
      if (!ok) {
        undo_graft(st, slot, added);
        return;
      }
      for (const std::uint64_t root : roots)
        (void)st.orphans.erase_subtree(slot, root);
      // The implied path may pass orphans of other chains of the slot: they
      // are placed now (their children stay, anchored at them).
      for (const std::uint64_t name : added)
        (void)st.orphans.erase_one(slot, name);
      work.insert(work.end(), added.begin(), added.end());  // capacity reserved
      r.blocks_grafted += added.size();
      ++st.counters.grafts;
    } catch (...) {
      undo_graft(st, slot, added);
    }
  }

  /// Removes the holds a failed graft added (removal never allocates).
  static void undo_graft(State& st, std::uint32_t slot,
                         std::span<const std::uint64_t> added) noexcept {
    Result ignored;
    Remove::remove_blocks(st, slot, added, ignored);
  }

  /// The orphan part of a Removed event: a named orphan goes with its orphan
  /// descendants (as a tree removal cascades), and is counted as removed
  /// rather than not held.
  static void remove_orphans(State& st, std::uint32_t slot,
                             std::span<const std::uint64_t> block_hashes, Result& r) noexcept {
    for (const std::uint64_t name : block_hashes) {
      const std::size_t n = st.orphans.erase_subtree(slot, name);
      if (n == 0U) continue;
      --r.blocks_not_held;
      ++r.blocks_removed;
      r.blocks_cascaded += n - 1U;
    }
  }
};

}  // namespace promptcache::detail
