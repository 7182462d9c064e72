// Block-level cache simulations over a trace's prefix tree: a leaf-only block
// cache (only blocks without cached children are evictable, as in a radix
// prefix cache) under a replacement policy, and Belady's offline optimum.
//
// A block is one node of Trace's prefix tree and takes one slot whatever its
// token count (a paged engine allocates the final partial block a whole page),
// so a capacity of C tokens is C / block_size slots. A cached block holds the
// tokens of the longest use that stored it since it was inserted. A request
// hits its leading cached blocks, each up to the tokens it holds (a block
// stored from a shorter partial use serves those and ends the hit); then its
// blocks are touched and the missing ones inserted, root first, evicting as
// needed. Blocks of the request being
// served are never evicted; when nothing else is evictable the rest of the
// request is not cached.
#pragma once

#include "trace.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <functional>
#include <queue>
#include <string>
#include <vector>

namespace promptcache::replay {

/// Outcome of replaying a trace through one cache configuration.
struct CacheRun {
  std::size_t requests = 0;       ///< Requests replayed.
  std::size_t prompt_tokens = 0;  ///< Sum of input lengths.
  std::size_t hit_tokens = 0;     ///< Prompt tokens served from cache.
  double seconds = 0.0;           ///< CPU time of the replay (filled by the caller).
  /// hit_tokens / prompt_tokens (0 for an empty trace).
  [[nodiscard]] double hit_rate() const {
    return prompt_tokens == 0
               ? 0.0
               : static_cast<double>(hit_tokens) / static_cast<double>(prompt_tokens);
  }
};

/// Processor time used by this process, in seconds: the replay is
/// single-threaded, so this times a run without counting the time other
/// processes of a loaded machine take from it.
[[nodiscard]] inline double cpu_seconds() {
  return static_cast<double>(std::clock()) / static_cast<double>(CLOCKS_PER_SEC);
}

namespace detail {

inline constexpr std::uint32_t nil = Trace::npos;

// Intrusive doubly linked lists over node ids; one node is on at most one list.
struct NodeLists {
  std::vector<std::uint32_t> prev, next;
  std::vector<std::uint8_t> list;  // which list a node is on (0: none)
  struct Head {
    std::uint32_t lru = nil, mru = nil;
    std::size_t size = 0;
  };
  std::vector<Head> heads;
  NodeLists(std::size_t nodes, std::size_t lists)
      : prev(nodes, nil), next(nodes, nil), list(nodes, 0), heads(lists + 1) {}
  void unlink(std::uint32_t n) {
    Head& h = heads[list[n]];
    if (prev[n] != nil)
      next[prev[n]] = next[n];
    else
      h.lru = next[n];
    if (next[n] != nil)
      prev[next[n]] = prev[n];
    else
      h.mru = prev[n];
    prev[n] = next[n] = nil;
    --h.size;
    list[n] = 0;
  }
  void push_mru(std::uint32_t n, std::uint8_t l) {
    if (list[n] != 0) unlink(n);
    Head& h = heads[l];
    prev[n] = h.mru;
    next[n] = nil;
    if (h.mru != nil)
      next[h.mru] = n;
    else
      h.lru = n;
    h.mru = n;
    ++h.size;
    list[n] = l;
  }
  [[nodiscard]] std::size_t size(std::uint8_t l) const { return heads[l].size; }
};

}  // namespace detail

/// The state every leaf-only policy sees: which nodes are cached, how many
/// cached children each has, and which belong to the request being served.
class LeafState {
 public:
  explicit LeafState(const Trace& t)
      : parent_(&t.node_parent),
        resident_(t.node_count(), 0),
        children_(t.node_count(), 0),
        stamp_(t.node_count(), 0) {}
  /// True when node `n` is cached.
  [[nodiscard]] bool resident(std::uint32_t n) const { return resident_[n] != 0; }
  /// True when `n` may be evicted now: cached, no cached child, not in the current request.
  [[nodiscard]] bool evictable(std::uint32_t n) const {
    return resident_[n] != 0 && children_[n] == 0 && stamp_[n] != request_;
  }
  /// True when `n` belongs to the request being served.
  [[nodiscard]] bool locked(std::uint32_t n) const { return stamp_[n] == request_; }
  /// Cached blocks.
  [[nodiscard]] std::size_t used() const { return used_; }

  // Driver side.
  void begin_request() { ++request_; }
  void lock(std::uint32_t n) { stamp_[n] = request_; }
  void add(std::uint32_t n) {
    resident_[n] = 1;
    ++used_;
    const std::uint32_t p = (*parent_)[n];
    if (p != Trace::npos) ++children_[p];
  }
  void remove(std::uint32_t n) {
    resident_[n] = 0;
    --used_;
    const std::uint32_t p = (*parent_)[n];
    if (p != Trace::npos) --children_[p];
  }

 private:
  const std::vector<std::uint32_t>* parent_;
  std::vector<std::uint8_t> resident_;
  std::vector<std::uint32_t> children_;
  std::vector<std::uint64_t> stamp_;
  std::uint64_t request_ = 0;
  std::size_t used_ = 0;
};

/// Leaf-only LRU: evicts the least recently used evictable block. A request's
/// blocks are re-touched deepest first, so a parent is always more recent
/// than its children and the LRU end is (almost always) a leaf.
class LruPolicy {
 public:
  LruPolicy(const Trace& t, std::size_t /*capacity*/) : lists_(t.node_count(), 1) {}
  [[nodiscard]] static std::string name() { return "lru"; }
  /// Whether to cache block i of r at all.
  [[nodiscard]] static bool admit(const Request& /*r*/, std::size_t /*i*/) { return true; }
  void touch(std::uint32_t n) { lists_.push_mru(n, 1); }
  void inserted(std::uint32_t n, const Request& /*r*/, std::size_t /*i*/) { lists_.push_mru(n, 1); }
  void end_request(const Request& r, std::size_t cached) {
    for (std::size_t i = cached; i-- > 0;)
      lists_.push_mru(r.nodes[i], 1);
  }
  /// The block to evict, or nil when none is evictable.
  [[nodiscard]] std::uint32_t victim(const LeafState& s) const {
    for (std::uint32_t n = lists_.heads[1].lru; n != detail::nil; n = lists_.next[n]) {
      if (s.locked(n)) break;  // the current request's blocks sit at the MRU end
      if (s.evictable(n)) return n;
    }
    return detail::nil;
  }
  void evicted(std::uint32_t n) { lists_.unlink(n); }

 private:
  detail::NodeLists lists_;
};

/// Replays `t` through a leaf-only block cache of `capacity_blocks` slots
/// under `policy`.
// The tokens request `r` hits in its leading cached blocks, each up to the
// tokens the cache holds for it (`stored`): the hit ends at the first block
// not resident, or after one held shorter than this use needs.
template <class Resident>
[[nodiscard]] std::size_t leading_hit_tokens(const Request& r, std::size_t block_size,
                                             const std::vector<std::size_t>& stored,
                                             Resident resident) {
  std::size_t hit = 0;
  for (std::size_t m = 0; m < r.nodes.size() && resident(r.nodes[m]); ++m) {
    const std::size_t used = block_tokens(r, m, block_size);
    hit += std::min(used, stored[r.nodes[m]]);
    if (stored[r.nodes[m]] < used) break;
  }
  return hit;
}

template <class Policy>
[[nodiscard]] CacheRun run_leaf_cache(const Trace& t, std::size_t capacity_blocks, Policy& policy) {
  CacheRun run;
  LeafState s(t);
  std::vector<std::size_t> stored(t.node_count(), 0);  // tokens a cached block holds
  for (const Request& r : t.requests) {
    ++run.requests;
    run.prompt_tokens += r.input_length;
    s.begin_request();
    const std::size_t n = r.nodes.size();
    run.hit_tokens += leading_hit_tokens(r, t.block_size, stored,
                                         [&](std::uint32_t node) { return s.resident(node); });
    std::size_t cached = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t node = r.nodes[i];
      if (s.resident(node)) {
        stored[node] = std::max(stored[node], block_tokens(r, i, t.block_size));
        s.lock(node);
        policy.touch(node);
        cached = i + 1;
        continue;
      }
      if (!policy.admit(r, i)) break;
      bool room = s.used() < capacity_blocks;
      while (!room) {
        const std::uint32_t v = policy.victim(s);
        if (v == detail::nil) break;
        s.remove(v);
        policy.evicted(v);
        room = s.used() < capacity_blocks;
      }
      if (!room) break;
      s.add(node);
      stored[node] = block_tokens(r, i, t.block_size);
      s.lock(node);
      policy.inserted(node, r, i);
      cached = i + 1;
    }
    policy.end_request(r, cached);
  }
  return run;
}

/// Belady's schedule for a block cache of `capacity_blocks` slots: every
/// request's blocks are cached, and while over capacity the block whose next
/// use is farthest in the future (never: farthest of all) is dropped, the
/// deeper one first on ties. A parent is used whenever its child is, so its
/// next use is never later than its child's and the cached set stays
/// prefix-closed. The hits it counts are the leading cached blocks of each
/// request, each up to the tokens it holds, as in run_leaf_cache. It maximizes block hits, not
/// tokens: a cache that spends no slot on final partial blocks can serve more tokens (see
/// run_optimum_bound for a bound on every block cache).
[[nodiscard]] inline CacheRun run_belady(const Trace& t, std::size_t capacity_blocks) {
  CacheRun run;
  const std::size_t never = t.requests.size();
  // next_use[k][i]: index of the next request using block i of request k.
  std::vector<std::vector<std::uint32_t>> next_use(t.requests.size());
  std::vector<std::uint32_t> upcoming(t.node_count(), static_cast<std::uint32_t>(never));
  for (std::size_t k = t.requests.size(); k-- > 0;) {
    const Request& r = t.requests[k];
    next_use[k].resize(r.nodes.size());
    for (std::size_t i = 0; i < r.nodes.size(); ++i)
      next_use[k][i] = upcoming[r.nodes[i]];
    for (std::uint32_t node : r.nodes)
      upcoming[node] = static_cast<std::uint32_t>(k);
  }
  struct Item {
    std::uint32_t next, depth, node;
    bool operator<(const Item& o) const { return next != o.next ? next < o.next : depth < o.depth; }
  };
  std::priority_queue<Item> heap;  // farthest next use, then deepest, on top
  std::vector<std::uint32_t> cached_next(t.node_count(), 0);
  std::vector<std::uint8_t> resident(t.node_count(), 0);
  std::vector<std::size_t> stored(t.node_count(), 0);  // tokens a cached block holds
  std::size_t used = 0;
  for (std::size_t k = 0; k < t.requests.size(); ++k) {
    const Request& r = t.requests[k];
    ++run.requests;
    run.prompt_tokens += r.input_length;
    run.hit_tokens += leading_hit_tokens(r, t.block_size, stored,
                                         [&](std::uint32_t node) { return resident[node] != 0; });
    for (std::size_t i = 0; i < r.nodes.size(); ++i) {
      const std::uint32_t node = r.nodes[i];
      const std::size_t tokens = block_tokens(r, i, t.block_size);
      if (resident[node] == 0) {
        resident[node] = 1;
        stored[node] = tokens;
        ++used;
      } else {
        stored[node] = std::max(stored[node], tokens);
      }
      cached_next[node] = next_use[k][i];
      heap.push({next_use[k][i], t.node_depth[node], node});
    }
    while (used > capacity_blocks) {
      const Item top = heap.top();
      heap.pop();
      if (resident[top.node] == 0 || cached_next[top.node] != top.next) continue;  // stale
      resident[top.node] = 0;
      --used;
    }
    if (heap.size() > 4 * (used + 1) + 1024) {  // drop stale entries now and then
      std::priority_queue<Item> fresh;
      while (!heap.empty()) {
        const Item it = heap.top();
        heap.pop();
        if (resident[it.node] != 0 && cached_next[it.node] == it.next) fresh.push(it);
      }
      heap.swap(fresh);
    }
  }
  return run;
}

namespace detail {

// The most hits any cache of `capacity` slots can score on the accesses that
// `counted(r, i)` selects (block i of request r), calling on_hit(r, i) for
// each. A cache holds a block through a gap between two uses only if it held
// it since the first of them, so the hits are gaps it kept: gaps ending at a
// counted use are worth one, the others nothing. Keeping the most
// unit-value gaps with at most `capacity` held at a time is interval
// scheduling on `capacity` tracks, which this solves exactly by dropping the
// gap that ends last (Belady's rule over the gaps worth keeping).
template <class Counted, class OnHit>
void optimal_gaps(const Trace& t, std::size_t capacity, Counted counted, OnHit on_hit) {
  const auto never = static_cast<std::uint32_t>(t.requests.size());
  // keep[k][i]: end of the gap after block i of request k, if worth keeping.
  std::vector<std::vector<std::uint32_t>> keep(t.requests.size());
  std::vector<std::uint32_t> upcoming(t.node_count(), never);
  std::vector<std::uint8_t> upcoming_counted(t.node_count(), 0);
  for (std::size_t k = t.requests.size(); k-- > 0;) {
    const Request& r = t.requests[k];
    keep[k].resize(r.nodes.size());
    for (std::size_t i = 0; i < r.nodes.size(); ++i) {
      const std::uint32_t n = r.nodes[i];
      keep[k][i] = upcoming_counted[n] != 0 ? upcoming[n] : never;
      upcoming[n] = static_cast<std::uint32_t>(k);
      upcoming_counted[n] = counted(r, i) ? 1 : 0;
    }
  }
  struct Item {
    std::uint32_t end, node;
    bool operator<(const Item& o) const { return end < o.end; }
  };
  std::priority_queue<Item> heap;                                // the gap that ends last on top
  std::vector<std::uint32_t> held_until(t.node_count(), never);  // never: not held
  std::size_t held = 0;
  for (std::size_t k = 0; k < t.requests.size(); ++k) {
    const Request& r = t.requests[k];
    for (std::size_t i = 0; i < r.nodes.size(); ++i) {
      const std::uint32_t n = r.nodes[i];
      if (held_until[n] != never) {  // a kept gap ends here
        if (counted(r, i)) on_hit(r, i);
        held_until[n] = never;
        --held;
      }
      if (keep[k][i] != never) {
        held_until[n] = keep[k][i];
        ++held;
        heap.push({keep[k][i], n});
      }
    }
    while (held > capacity) {
      const Item top = heap.top();
      heap.pop();
      if (held_until[top.node] != top.end) continue;  // stale
      held_until[top.node] = never;
      --held;
    }
    if (heap.size() > 4 * (held + 1) + 1024) {  // drop stale entries now and then
      std::priority_queue<Item> fresh;
      for (; !heap.empty(); heap.pop())
        if (held_until[heap.top().node] == heap.top().end) fresh.push(heap.top());
      heap.swap(fresh);
    }
  }
}

}  // namespace detail

/// An upper bound on the prompt tokens any block cache of `capacity_blocks`
/// slots serves from cache, whatever it stores (final partial blocks or not)
/// and however it evicts: every leaf-only block cache here and the paged
/// prefix cache with as many pages. It adds the most full blocks any such
/// cache can hit (exact: see detail::optimal_gaps), times the block size, and
/// the most tokens it can hit in final partial blocks (the most partial hits
/// any cache scores, each counted at the size of the largest repeated partial
/// blocks). Each part gets the whole capacity, and a full use of a block
/// stored from a partial one counts whole, so the sum can exceed what one
/// cache achieves; on a trace where no block used partially is used twice it
/// is exact.
/// O(blocks log blocks).
[[nodiscard]] inline CacheRun run_optimum_bound(const Trace& t, std::size_t capacity_blocks) {
  CacheRun run;
  const std::size_t bs = t.block_size;
  const auto full = [bs](const Request& r, std::size_t i) { return block_tokens(r, i, bs) == bs; };
  std::size_t full_hits = 0;
  detail::optimal_gaps(t, capacity_blocks, full, [&](const Request&, std::size_t) { ++full_hits; });
  std::size_t partial_hits = 0;
  detail::optimal_gaps(
      t, capacity_blocks, [&](const Request& r, std::size_t i) { return !full(r, i); },
      [&](const Request&, std::size_t) { ++partial_hits; });
  // Every partial block that some cache could hit: a use of a block used before.
  std::vector<std::size_t> repeated;
  std::vector<std::uint8_t> seen(t.node_count(), 0);
  for (const Request& r : t.requests) {
    ++run.requests;
    run.prompt_tokens += r.input_length;
    for (std::size_t i = 0; i < r.nodes.size(); ++i) {
      if (seen[r.nodes[i]] != 0 && !full(r, i)) repeated.push_back(block_tokens(r, i, bs));
      seen[r.nodes[i]] = 1;
    }
  }
  const std::size_t take = std::min(partial_hits, repeated.size());
  std::partial_sort(repeated.begin(), repeated.begin() + static_cast<std::ptrdiff_t>(take),
                    repeated.end(), std::greater<>());
  run.hit_tokens = full_hits * bs;
  for (std::size_t i = 0; i < take; ++i)
    run.hit_tokens += repeated[i];
  return run;
}

}  // namespace promptcache::replay
