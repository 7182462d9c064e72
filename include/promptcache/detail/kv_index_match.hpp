// promptcache: detail/kv_index_match.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The match path of KvIndex: find_matches' walk down a query's path (path
// hashes computed and their edge probes issued one chunk ahead, rows walked
// a chunk at a time) and the emission of one match per worker rank at the
// level where it leaves the path; and the orphan-aware extension that counts
// blocks a worker holds as orphans, by name.
//
// Invariants it relies on: a child's holders are a subset of its parent's,
// so holder counts never rise along a path and equal counts mean equal sets
// (only levels where the count drops need the sets); in the word form (every
// slot below 64) each holder of the first node gets exactly one match, so the
// output is sized once and written in place. Read-only: the walk keeps its
// scratch space on the stack, so concurrent const calls are safe.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "promptcache/detail/kv_index_state.hpp"

namespace promptcache::detail {

/// The match path over a KvIndexState<Types>. Stateless.
template <class Types>
struct KvMatchPath {
  /// The state it reads.
  using State = KvIndexState<Types>;
  /// A slot of the state.
  using Slot = typename State::Slot;
  /// A worker rank.
  using Worker = typename Types::Worker;
  /// One match: a worker rank and its leading blocks held.
  using Match = typename Types::Match;

  /// Per worker rank holding the first block, the leading blocks of
  /// `tokens_hashes` it holds, into `out` (cleared first; see
  /// KvIndex::find_matches). O(matched blocks + holders of the nodes where
  /// the number of holders drops + result size).
  static void find(const State& st, std::span<const std::uint64_t> tokens_hashes, bool early_exit,
                   std::vector<Match>& out) {
    const KvNodeStore& nodes = st.tree.nodes();
    // While every slot is below 64 a holder word is the set's bitset. Then
    // `out` is sized once, at the first level: every match is a holder of
    // that node, once (see start_matches).
    const bool word_form = nodes.word_form();
    Match* next = nullptr;  // word form: where the next match goes
    if (!word_form) out.clear();
    constexpr std::size_t chunk = 32;
    std::uint64_t paths[2][chunk];
    std::uint32_t found[chunk];
    std::uint32_t counts[chunk];
    std::uint64_t path = KvTree::root_path_hash;
    // Path hashes depend on the query only, so the edge probes of a chunk are
    // issued one chunk ahead: their misses overlap the walk of the previous one.
    // The prefetcher keeps the edge table's address and size in registers (the
    // table itself would be re-read after each store of a path hash).
    const auto prefetch_edge = st.tree.edge_prefetcher();
    const auto issue = [&, prefetch_edge](std::size_t base, std::uint64_t* dst) {
      const std::size_t m = std::min(chunk, tokens_hashes.size() - base);
      // A query's hashes are usually cold: the next chunk's lines are
      // requested now, together, rather than one by one as the chain of path
      // hashes reaches them.
      if (base + m < tokens_hashes.size())
        KvTree::prefetch_hashes(tokens_hashes.data() + base + m,
                                std::min(chunk, tokens_hashes.size() - base - m));
      for (std::size_t j = 0; j < m; ++j) {
        path = KvTree::child_path(path, tokens_hashes[base + j]);
        dst[j] = path;
        prefetch_edge(KvFingerprintTable::fingerprint(path));
      }
      return m;
    };
    std::uint32_t cur = 0;         // last node reached (root at first)
    std::uint32_t prev = kv_npos;  // last node accounted for
    std::uint32_t prev_count = 0;  // its holder count
    std::size_t depth = 0;
    KvTree::prefetch_hashes(tokens_hashes.data(), std::min(chunk, tokens_hashes.size()));
    std::size_t m = tokens_hashes.empty() ? 0U : issue(0, paths[0]);
    for (std::size_t base = 0, k = 0; base < tokens_hashes.size(); base += chunk, k ^= 1U) {
      const std::size_t got = st.tree.template walk_rows<true>(paths[k], m, cur, found, counts);
      bool stop = got < m;
      // The next chunk's probes go out before this chunk's holder accounting.
      if (!stop && base + chunk < tokens_hashes.size()) m = issue(base + chunk, paths[k ^ 1U]);
      if (got != 0U) cur = found[got - 1U];
      // A child's holders are a subset of its parent's, so counts never rise
      // along the path, equal counts mean equal sets, and only the levels
      // where the count drops need the sets: they are found by binary search
      // instead of a visit per level. The count first reaches 1 at such a
      // level (or at the first), so early_exit is decided there too.
      for (std::size_t j = 0; j < got;) {
        std::size_t i = j;
        if (prev != kv_npos) {
          const std::uint32_t had_count = prev_count;
          i = static_cast<std::size_t>(
              std::partition_point(counts + j, counts + got,
                                   [had_count](std::uint32_t c) { return c >= had_count; }) -
              counts);
          if (i != j) {  // levels j .. i - 1 hold the same set as prev
            prev = found[i - 1U];
            depth += i - j;
          }
          if (i == got) break;
          const std::uint32_t child = found[i];
          if (word_form) {
            emit(st, nodes.holder_word(prev) & ~nodes.holder_word(child), depth, next);
          } else {
            KvHolderSets::View had;
            KvHolderSets::View has;
            nodes.holders(prev, had);
            nodes.holders(child, has);
            had.for_each_missing(has, [&](std::uint32_t slot) {
              out.push_back(Match{st.workers[slot].worker, depth});
            });
          }
        } else if (word_form) {
          next = start_matches(nodes.holder_word(found[i]), out);
        }
        prev = found[i];
        prev_count = counts[i];
        ++depth;
        if (early_exit && prev_count == 1U) {
          stop = true;
          break;
        }
        j = i + 1U;
      }
      if (stop) break;
    }
    if (prev == kv_npos) {
      out.clear();
      return;
    }
    if (word_form) {
      emit(st, nodes.holder_word(prev), depth, next);
      return;
    }
    KvHolderSets::View has;
    nodes.holders(prev, has);
    has.for_each([&](std::uint32_t slot) { out.push_back(Match{st.workers[slot].worker, depth}); });
  }

  /// Raises (or adds) the matches of `out` by the orphans held along
  /// `block_names`: a worker holding block i as an orphan, or an orphan whose
  /// parent is block i, holds i + 1 leading blocks. O(names x (log orphans +
  /// result size)); nothing without orphans.
  static void add_orphans(const State& st, std::span<const std::uint64_t> tokens_hashes,
                          std::span<const std::uint64_t> block_names, std::vector<Match>& out) {
    if (st.orphans.empty()) return;
    const std::size_t n = std::min(tokens_hashes.size(), block_names.size());
    for (std::size_t i = 0; i < n; ++i) {
      const auto hold = [&](std::uint32_t slot) {
        const Worker& w = st.workers[slot].worker;
        for (Match& m : out)
          if (m.worker == w) {
            m.blocks = std::max(m.blocks, i + 1U);
            return;
          }
        out.push_back(Match{w, i + 1U});
      };
      st.orphans.for_each_holder(block_names[i], hold);
      // The parent of an orphan is held too (an anchor is not an orphan).
      st.orphans.for_each_child_of(block_names[i],
                                   [&](std::uint32_t slot, std::uint64_t) { hold(slot); });
    }
  }

  /// Sizes `out` for the matches of a word-form query whose first node has
  /// the holder word `first` and returns where they start. By the subset rule
  /// each holder of the first node leaves the path at exactly one level or
  /// stays to the end, so it gets exactly one match; every element is then
  /// written by emit, so the old contents need no clearing and a vector
  /// reused from an earlier query of as many matches is not filled first
  /// (a resize per holder word filled them with zeros, and was a call). When
  /// `out` must grow it is cleared first, so a failed allocation leaves it
  /// empty.
  static Match* start_matches(std::uint64_t first, std::vector<Match>& out) {
    const auto n = static_cast<std::size_t>(std::popcount(first));
    if (out.capacity() < n) out.clear();
    out.resize(n);
    return out.data();
  }

  /// Writes a match at `depth` for every slot in the word-form set `bits` at
  /// `next`, and advances it.
  static void emit(const State& st, std::uint64_t bits, std::size_t depth, Match*& next) noexcept {
    if (bits == 0U) return;
    // The slots are contiguous: indexing from the first one's address keeps
    // the vector's data pointer out of the loop, and the KvWorker is copied
    // whole (one 16-byte load and store instead of a field each).
    const Slot* const slots = &st.workers[0];
    Match* at = next;
    do {
      const auto slot = static_cast<unsigned>(std::countr_zero(bits));
      std::memcpy(static_cast<void*>(&at->worker), &slots[slot].worker, sizeof(Worker));
      at->blocks = depth;
      ++at;
      bits &= bits - 1U;
    } while (bits != 0U);
    next = at;
  }
};

}  // namespace promptcache::detail
