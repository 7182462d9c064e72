// The replay tool's own leaf-only replacement policy, in the block simulator's
// policy shape (see block_sim.hpp): ARC adapted to a prefix tree.
//
// ARC (Megiddo & Modha, FAST'03) keeps cached blocks on two lists, T1 (used
// once since it was last brought in) and T2 (used again), and remembers
// recently evicted ids on two ghost lists, B1 and B2. A miss that hits a ghost
// says which list was shrunk too much, and moves the target size p of T1 that
// way: the cache leans towards recency or towards frequency as the traffic
// asks. Adapted to a prefix cache:
//   - only leaves are evicted: the victim is the least recent evictable block
//     of the list ARC picks, else of the other list;
//   - one request touches all its blocks at once, deepest first, so a parent
//     stays more recent than its children;
//   - the ghost lists hold the last `ghost_factor` x capacity evicted ids
//     (ARC: 1 x, trimmed list by list): prefix blocks come back after long
//     gaps, and a longer memory keeps recognizing them (an id costs a few
//     bytes, a cached block a whole KV page);
//   - the blocks one request stores go to T2 only when all of them come back
//     from the ghost lists: a run that also brings new blocks is mostly the
//     request's own text (as in the paged cache, where such a run is one node
//     and shares one class);
//   - the final partial block of a prompt is not cached (`cache_partial` off):
//     it holds the request's own tail, almost never shared, and a paged
//     engine would spend a whole page on it.
#pragma once

#include "block_sim.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace promptcache::replay {

/// Parameters of AdaptiveLeafPolicy.
struct AdaptiveParams {
  double ghost_factor = 8.0;   ///< Ghost ids remembered, as a multiple of the capacity.
  bool cache_partial = false;  ///< Cache the final partial block of a prompt.
  double step = 1.0;           ///< Scale of each move of the target (1: ARC's rule).
};

/// ARC adapted to leaf-only eviction (see the file comment).
class AdaptiveLeafPolicy {
  enum : std::uint8_t { none = 0, t1 = 1, t2 = 2, b1 = 3, b2 = 4 };

 public:
  /// A policy for a cache of `capacity` blocks over the nodes of `t`.
  AdaptiveLeafPolicy(const Trace& t, std::size_t capacity, AdaptiveParams params = {})
      : lists_(t.node_count(), 4),
        evicted_at_(t.node_count(), 0),
        block_size_(t.block_size),
        capacity_(capacity),
        params_(params) {}
  /// The policy's name in the outputs.
  [[nodiscard]] static std::string name() { return "adaptive"; }
  /// The current target size of T1, in blocks.
  [[nodiscard]] double target() const { return p_; }

  /// Whether to cache block i of r; a ghost hit moves the target (ARC's adaptation).
  bool admit(const Request& r, std::size_t i) {
    if (!params_.cache_partial && i + 1 == r.nodes.size() && r.input_length % block_size_ != 0)
      return false;
    if (run_of_ != &r) {  // the first block of r to store: look at the whole run
      run_of_ = &r;
      run_ghosts_ = true;
      const std::size_t end = params_.cache_partial || r.input_length % block_size_ == 0
                                  ? r.nodes.size()
                                  : r.nodes.size() - 1;
      for (std::size_t j = i; j < end; ++j) {
        const std::uint8_t lj = lists_.list[r.nodes[j]];
        run_ghosts_ = run_ghosts_ && (lj == b1 || lj == b2);
      }
    }
    const std::uint32_t n = r.nodes[i];
    const std::uint8_t l = lists_.list[n];
    const double s1 = static_cast<double>(lists_.size(b1));
    const double s2 = static_cast<double>(lists_.size(b2));
    const double cap = static_cast<double>(capacity_);
    pending_b2_ = false;
    if (l == b1) {
      p_ = std::min(cap, p_ + params_.step * std::max(s2 / s1, 1.0));
    } else if (l == b2) {
      p_ = std::max(0.0, p_ - params_.step * std::max(s1 / s2, 1.0));
      pending_b2_ = true;
    }
    return true;
  }
  /// A cached block was used again: it moves to T2.
  void touch(std::uint32_t n) { lists_.push_mru(n, t2); }
  /// A block was stored: to T2 if it and every other block the request stores
  /// were on a ghost list, else to T1.
  void inserted(std::uint32_t n, const Request& /*r*/, std::size_t /*i*/) {
    const std::uint8_t l = lists_.list[n];
    lists_.push_mru(n, run_ghosts_ && (l == b1 || l == b2) ? t2 : t1);
  }
  /// Re-touches the request's blocks deepest first, so parents stay more recent.
  void end_request(const Request& r, std::size_t cached) {
    run_of_ = nullptr;
    for (std::size_t i = cached; i-- > 0;) {
      const std::uint32_t n = r.nodes[i];
      lists_.push_mru(n, lists_.list[n]);
    }
  }
  /// ARC's choice of list, then its least recent evictable block (else the other list's).
  [[nodiscard]] std::uint32_t victim(const LeafState& s) const {
    const double s1 = static_cast<double>(lists_.size(t1));
    const bool from_t1 =
        s1 > 0 && (s1 > p_ || (pending_b2_ && lists_.size(t1) == static_cast<std::size_t>(p_)));
    std::uint32_t v = scan(from_t1 ? t1 : t2, s);
    if (v == detail::nil) v = scan(from_t1 ? t2 : t1, s);
    return v;
  }
  /// The evicted block's id goes to the ghost list of its list.
  void evicted(std::uint32_t n) {
    lists_.push_mru(n, lists_.list[n] == t1 ? b1 : b2);
    evicted_at_[n] = ++evictions_;
    order_.push_back(n);
    trim_ghosts();
  }

 private:
  [[nodiscard]] std::uint32_t scan(std::uint8_t l, const LeafState& s) const {
    for (std::uint32_t n = lists_.heads[l].lru; n != detail::nil; n = lists_.next[n])
      if (s.evictable(n)) return n;
    return detail::nil;
  }
  // Keeps at most ghost_factor x capacity ghosts, forgetting the oldest
  // eviction first whichever list it is on (as the library's eviction::Adaptive
  // does with its ring of fingerprints).
  void trim_ghosts() {
    const auto limit =
        static_cast<std::size_t>(params_.ghost_factor * static_cast<double>(capacity_));
    while (lists_.size(b1) + lists_.size(b2) > limit) {
      const std::uint32_t n = order_[next_++];
      // Only the latest eviction of a block counts, and only while it is a ghost.
      if (evicted_at_[n] == next_ && (lists_.list[n] == b1 || lists_.list[n] == b2))
        lists_.unlink(n);
    }
  }

  detail::NodeLists lists_;
  std::vector<std::uint64_t> evicted_at_;  // 1-based index of the node's last eviction
  std::vector<std::uint32_t> order_;       // evicted nodes, in eviction order
  std::size_t next_ = 0;                   // first eviction of order_ not yet forgotten
  std::uint64_t evictions_ = 0;
  std::size_t block_size_;
  std::size_t capacity_;
  AdaptiveParams params_;
  double p_ = 0.0;
  bool pending_b2_ = false;
  const Request* run_of_ = nullptr;  // the request whose run run_ghosts_ describes
  bool run_ghosts_ = false;          // every block that request stores is a ghost
};

}  // namespace promptcache::replay
