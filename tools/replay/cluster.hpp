// Cluster simulation: W workers, each with its own prefix cache whose KV
// events feed one KvIndex; requests arrive at their trace timestamps and are
// routed by one of four policies (random, round-robin, least-loaded,
// cache-aware through KvRouter).
//
// Time model (simple on purpose, so that routing is what differs):
//   - a request reaches its worker at its (scaled) timestamp; the worker's
//     cache is looked up and the request's blocks are locked and stored then,
//     as an engine allocates KV pages when it schedules a request;
//   - prefill is serialized per worker: it starts when the worker's previous
//     prefill is done and lasts uncached tokens / prefill rate;
//   - decode is batched (it does not hold the prefill queue) and lasts
//     output tokens x decode time per token; the request's blocks stay locked
//     and count as in-flight decode blocks until it ends;
//   - the queueing proxy for time to first token is (prefill end - arrival),
//     and a worker's busy time is the sum of its prefill times.
#pragma once

#include "block_sim.hpp"
#include "trace.hpp"

#include <promptcache/block_hash.hpp>
#include <promptcache/kv_index.hpp>
#include <promptcache/kv_router.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <queue>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace promptcache::replay {

/// How requests are assigned to workers.
enum class RoutePolicy : std::uint8_t {
  random,        ///< Uniformly at random (seeded).
  round_robin,   ///< Workers in turn.
  least_loaded,  ///< Fewest KV blocks in flight (ties: lowest id).
  /// KvRouter's overlap-vs-load cost over the KvIndex's matches, with Dynamo's
  /// loads: each worker's queued prefill tokens (requests' whole uncached
  /// tokens until their prefill ends) and decode blocks (the distinct full
  /// blocks in flight plus the request's full blocks not among them).
  cache_aware,
};

/// The policy's name as printed.
[[nodiscard]] inline const char* route_policy_name(RoutePolicy p) {
  switch (p) {
    case RoutePolicy::random:
      return "random";
    case RoutePolicy::round_robin:
      return "round-robin";
    case RoutePolicy::least_loaded:
      return "least-loaded";
    case RoutePolicy::cache_aware:
      return "cache-aware";
  }
  return "?";
}

/// The Dynamo block hashes of every full block of a trace, per prefix-tree
/// node: the local hash of the block's pseudo-tokens and the chained sequence
/// hash (the engine-side block name). Partial blocks get none (0): paged
/// caches never store them, so no event or query names them.
struct TraceHashes {
  std::vector<std::uint64_t> local;     ///< Local block hash per node.
  std::vector<std::uint64_t> sequence;  ///< Sequence hash per node.
  std::vector<std::uint8_t> full;       ///< 1 where the node is some request's full block.

  /// Hashes for every full block of `t`. O(full blocks x block size).
  explicit TraceHashes(const Trace& t)
      : local(t.node_count(), 0), sequence(t.node_count(), 0), full(t.node_count(), 0) {
    std::vector<std::uint32_t> tokens(t.block_size);
    for (const Request& r : t.requests) {
      const std::size_t nfull = r.input_length / t.block_size;
      for (std::size_t i = 0; i < nfull; ++i) {
        const std::uint32_t n = r.nodes[i];
        if (full[n] != 0) continue;
        full[n] = 1;
        const auto base = static_cast<std::uint32_t>(r.hash_ids[i] * t.block_size);
        for (std::size_t j = 0; j < t.block_size; ++j)
          tokens[j] = base + static_cast<std::uint32_t>(j);
        std::uint64_t h = 0;
        local_block_hashes(tokens, t.block_size, std::span<std::uint64_t>(&h, 1));
        local[n] = h;
        sequence[n] = i == 0 ? h : sequence_hash(sequence[r.nodes[i - 1]], h);
      }
    }
  }
};

/// What a worker cache is told about one request.
struct WorkerRequest {
  std::size_t index = 0;                     ///< Request index in the trace.
  const Request* request = nullptr;          ///< The request.
  std::span<const std::uint32_t> tokens;     ///< Its pseudo-tokens.
  std::span<const std::uint64_t> locals;     ///< Local hashes of its full blocks.
  std::span<const std::uint64_t> sequences;  ///< Sequence hashes of its full blocks.
};

/// A leaf-only LRU block cache of full blocks with lock counts, publishing KV
/// events: the cluster's built-in worker cache (the paged prefix cache is the
/// other). Locked blocks (requests in flight) are never evicted.
class BlockWorkerCache {
 public:
  BlockWorkerCache(const Trace& t, std::size_t capacity_blocks)
      : trace_(&t),
        capacity_(capacity_blocks),
        state_(t),
        lists_(t.node_count(), 1),
        locks_(t.node_count(), 0) {}

  /// Looks up, locks and stores the request's full blocks, appending the KV
  /// events this causes to `events`; returns the prompt tokens served from cache.
  std::size_t admit(const WorkerRequest& q, const TraceHashes& h, std::vector<KvEvent>& events) {
    const Request& r = *q.request;
    state_.begin_request();  // locks are counted here, not by LeafState's request stamp
    const std::size_t nfull = q.locals.size();
    std::size_t m = 0;
    while (m < nfull && state_.resident(r.nodes[m]))
      ++m;
    std::vector<std::uint32_t>& held = held_[q.index];
    kv_event::Removed removed;
    kv_event::Stored stored;
    for (std::size_t i = 0; i < nfull; ++i) {
      const std::uint32_t n = r.nodes[i];
      if (!state_.resident(n)) {
        bool room = state_.used() < capacity_;
        while (!room) {
          const std::uint32_t v = victim();
          if (v == detail::nil) break;
          state_.remove(v);
          lists_.unlink(v);
          removed.block_hashes.push_back(h.sequence[v]);
          room = state_.used() < capacity_;
        }
        if (!room) break;
        state_.add(n);
        if (stored.blocks.empty() && i > 0) stored.parent_hash = h.sequence[r.nodes[i - 1]];
        stored.blocks.push_back(KvBlock{h.sequence[n], h.local[n]});
      }
      ++locks_[n];
      held.push_back(n);
      lists_.push_mru(n, 1);
    }
    for (std::size_t i = held.size(); i-- > 0;)
      lists_.push_mru(held[i], 1);
    if (!removed.block_hashes.empty()) events.push_back(KvEvent{next_id_++, std::move(removed)});
    if (!stored.blocks.empty()) events.push_back(KvEvent{next_id_++, std::move(stored)});
    return m * trace_->block_size;
  }

  /// Unlocks the blocks request `index` locked. O(its blocks).
  void release(std::size_t index) {
    auto it = held_.find(index);
    if (it == held_.end()) return;
    for (std::uint32_t n : it->second)
      --locks_[n];
    held_.erase(it);
  }
  /// Blocks cached now.
  [[nodiscard]] std::size_t cached_blocks() const { return state_.used(); }

 private:
  [[nodiscard]] std::uint32_t victim() const {
    for (std::uint32_t n = lists_.heads[1].lru; n != detail::nil; n = lists_.next[n])
      if (locks_[n] == 0 && state_.resident(n) && state_.evictable(n)) return n;
    return detail::nil;
  }

  const Trace* trace_;
  std::size_t capacity_;
  LeafState state_;
  detail::NodeLists lists_;
  std::vector<std::uint32_t> locks_;
  std::unordered_map<std::size_t, std::vector<std::uint32_t>> held_;
  std::uint64_t next_id_ = 0;
};

/// Cluster parameters.
struct ClusterConfig {
  std::size_t workers = 8;                ///< Worker count (> 0).
  double time_scale = 1.0;                ///< Arrival times are timestamps x this (> 0).
  double prefill_tokens_per_s = 10000.0;  ///< Prefill throughput of one worker (> 0).
  double decode_s_per_token = 0.02;       ///< Decode time per output token (>= 0).
  double overlap_weight = 1.0;            ///< KvRouter overlap weight (cache-aware).
  double temperature = 0.0;               ///< KvRouter temperature (cache-aware).
  std::uint64_t seed = 1;                 ///< Seed of the random policy and softmax draws.
  /// Restart the router half-way: at request n / 2 the index is dropped and
  /// rebuilt from the events published from then on (the router rejoins
  /// late, as after a router restart or scale-out while the engines run on).
  bool restart_router = false;
  /// What the index does with a Stored event under a parent it does not
  /// know for the worker (after a restart, most of them).
  KvUnknownParent on_unknown_parent = KvUnknownParent::keep_orphan;
};

/// Per-policy results of one cluster run.
struct ClusterRun {
  RoutePolicy policy = RoutePolicy::random;  ///< The routing policy.
  std::size_t requests = 0;                  ///< Requests routed.
  std::size_t prompt_tokens = 0;             ///< Sum of input lengths.
  std::size_t cached_tokens = 0;             ///< Prompt tokens served from some worker's cache.
  std::size_t computed_tokens = 0;           ///< Prompt tokens prefilled.
  std::vector<std::size_t> worker_requests;  ///< Requests per worker.
  std::vector<std::size_t> worker_cached;    ///< Cached tokens per worker.
  std::vector<std::size_t> worker_computed;  ///< Computed tokens per worker.
  std::vector<double> worker_busy_s;         ///< Prefill seconds per worker.
  std::vector<std::uint32_t> assignment;     ///< Worker of each request.
  std::vector<double> ttft_s;                ///< Queueing proxy for TTFT, per request.
  std::vector<std::size_t> request_cached;   ///< Prompt tokens served from cache, per request.
  /// Cache-aware only: the prompt tokens the index said the chosen worker
  /// holds, per request (empty for the other policies).
  std::vector<std::size_t> routed_cached;
  /// The request at which the router restarted (0: it did not).
  std::size_t restarted_at = 0;
  /// The index's rule for Stored events under unknown parents.
  KvUnknownParent on_unknown_parent = KvUnknownParent::keep_orphan;
  double seconds = 0.0;            ///< CPU time of the run.
  std::size_t index_events = 0;    ///< KV events applied to the index.
  std::size_t index_rejected = 0;  ///< KV events the index did not apply.

  /// cached_tokens / prompt_tokens.
  [[nodiscard]] double hit_rate() const {
    return prompt_tokens == 0
               ? 0.0
               : static_cast<double>(cached_tokens) / static_cast<double>(prompt_tokens);
  }
  /// The hit rate of requests `from` .. end (e.g. those after a restart).
  [[nodiscard]] double hit_rate_from(std::size_t from, const Trace& t) const {
    std::size_t prompt = 0;
    std::size_t cached = 0;
    for (std::size_t k = from; k < request_cached.size(); ++k) {
      prompt += t.requests[k].input_length;
      cached += request_cached[k];
    }
    return prompt == 0 ? 0.0 : static_cast<double>(cached) / static_cast<double>(prompt);
  }
  /// The row name: the policy, with how the router restarted if it did.
  [[nodiscard]] std::string name() const {
    std::string n = route_policy_name(policy);
    if (restarted_at != 0)
      n += on_unknown_parent == KvUnknownParent::keep_orphan ? "+restart" : "+restart(refuse)";
    return n;
  }
  /// max / mean busy time over workers (1 = perfectly balanced; 0 if idle).
  [[nodiscard]] double imbalance() const {
    double mx = 0.0;
    double sum = 0.0;
    for (double b : worker_busy_s) {
      mx = std::max(mx, b);
      sum += b;
    }
    return sum <= 0.0 ? 0.0 : mx / (sum / static_cast<double>(worker_busy_s.size()));
  }
  /// The q-quantile (0..1) of the TTFT proxy: the value at 0-based rank
  /// round(q x (n - 1)) of the n sorted values (no interpolation).
  [[nodiscard]] double ttft_quantile(double q) const {
    if (ttft_s.empty()) return 0.0;
    std::vector<double> v = ttft_s;
    const auto k = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
    return v[k];
  }
};

/// Replays `t` through a cluster of `cfg.workers` caches made by
/// `make_cache(worker)`, routing with `policy`. Throws std::invalid_argument
/// on a configuration out of range.
template <class Cache, class MakeCache>
[[nodiscard]] ClusterRun run_cluster(const Trace& t, const TraceHashes& hashes,
                                     const ClusterConfig& cfg, RoutePolicy policy,
                                     MakeCache&& make_cache) {
  if (cfg.workers == 0 || cfg.workers > 4096) throw std::invalid_argument("workers: 1..4096");
  if (!(cfg.time_scale > 0.0)) throw std::invalid_argument("time scale must be > 0");
  if (!(cfg.prefill_tokens_per_s > 0.0)) throw std::invalid_argument("prefill rate must be > 0");
  if (!(cfg.decode_s_per_token >= 0.0)) throw std::invalid_argument("decode time must be >= 0");
  const double cpu0 = cpu_seconds();
  const KvRouter router(KvRouterConfig{cfg.overlap_weight, cfg.temperature, t.block_size});
  std::mt19937_64 rng(cfg.seed);
  const std::size_t w = cfg.workers;

  std::vector<std::unique_ptr<Cache>> caches;
  for (std::size_t i = 0; i < w; ++i)
    caches.push_back(make_cache(i));
  const KvIndexOptions index_options{KvGapPolicy::report, cfg.on_unknown_parent};
  KvIndex index(index_options);
  ClusterRun run;
  run.policy = policy;
  run.on_unknown_parent = cfg.on_unknown_parent;
  run.worker_requests.assign(w, 0);
  run.worker_cached.assign(w, 0);
  run.worker_computed.assign(w, 0);
  run.worker_busy_s.assign(w, 0.0);
  run.assignment.reserve(t.requests.size());
  run.ttft_s.reserve(t.requests.size());
  run.request_cached.reserve(t.requests.size());
  std::vector<double> prefill_free(w, 0.0);
  std::vector<std::size_t> decode_blocks(w, 0);
  // Cache-aware: how many requests in flight on each worker hold each full
  // block (Dynamo hashes full blocks only), and the (prefill end, uncached
  // tokens) of the requests on each worker whose prefill has not ended, in
  // end order (prefills are serialized per worker).
  std::vector<std::unordered_map<std::uint32_t, std::uint32_t>> in_flight(
      policy == RoutePolicy::cache_aware ? w : 0);
  std::vector<std::deque<std::pair<double, std::size_t>>> queued(
      policy == RoutePolicy::cache_aware ? w : 0);
  std::vector<std::size_t> queued_tokens(w, 0);
  std::vector<KvWorkerLoad> loads(w);
  for (std::size_t i = 0; i < w; ++i)
    loads[i].worker = KvWorker{i, 0};

  struct Finish {
    double at;
    std::size_t request;
    std::uint32_t worker;
    std::size_t blocks;
    bool operator>(const Finish& o) const { return at != o.at ? at > o.at : request > o.request; }
  };
  std::priority_queue<Finish, std::vector<Finish>, std::greater<>> finishing;

  std::vector<std::uint32_t> tokens;
  std::vector<std::uint64_t> locals, seqs;
  std::vector<KvWorkerMatch> matches;
  std::vector<KvEvent> events;
  std::size_t rr = 0;
  double clock = 0.0;
  for (std::size_t k = 0; k < t.requests.size(); ++k) {
    const Request& r = t.requests[k];
    if (cfg.restart_router && k == t.requests.size() / 2U && k != 0U) {
      // The router restarts: its index starts empty, and each worker's next
      // event is the first of that worker it sees.
      index = KvIndex(index_options);
      run.restarted_at = k;
    }
    clock = std::max(clock, r.timestamp_ms * cfg.time_scale / 1000.0);
    while (!finishing.empty() && finishing.top().at <= clock) {
      const Finish f = finishing.top();
      finishing.pop();
      caches[f.worker]->release(f.request);
      decode_blocks[f.worker] -= f.blocks;
      if (!in_flight.empty()) {
        const Request& done = t.requests[f.request];
        for (std::size_t b = 0; b < done.input_length / t.block_size; ++b)
          if (--in_flight[f.worker][done.nodes[b]] == 0) in_flight[f.worker].erase(done.nodes[b]);
      }
    }
    for (std::size_t i = 0; i < queued.size(); ++i)
      while (!queued[i].empty() && queued[i].front().first <= clock) {
        queued_tokens[i] -= queued[i].front().second;
        queued[i].pop_front();
      }
    tokens.clear();
    expand_tokens(r, t.block_size, tokens);
    const std::size_t nfull = r.input_length / t.block_size;
    locals.resize(nfull);
    seqs.resize(nfull);
    for (std::size_t i = 0; i < nfull; ++i) {
      locals[i] = hashes.local[r.nodes[i]];
      seqs[i] = hashes.sequence[r.nodes[i]];
    }
    const std::size_t blocks = r.hash_ids.size();

    std::size_t target = 0;
    switch (policy) {
      case RoutePolicy::random:
        target = static_cast<std::size_t>(rng() % w);
        break;
      case RoutePolicy::round_robin:
        target = rr++ % w;
        break;
      case RoutePolicy::least_loaded:
        target = static_cast<std::size_t>(
            std::min_element(decode_blocks.begin(), decode_blocks.end()) - decode_blocks.begin());
        break;
      case RoutePolicy::cache_aware: {
        // By tokens hashes and block names: after a restart a worker's chains
        // under prefixes it cached before are known by name only, until a
        // request names their parent's path (graft_along places them).
        index.graft_along(locals, seqs);
        index.find_matches(locals, seqs, false, matches);
        for (std::size_t i = 0; i < w; ++i) {
          // Dynamo's decode load: the distinct blocks in flight plus the
          // request's full blocks that are not among them.
          std::size_t fresh = 0;
          for (std::size_t b = 0; b < nfull; ++b)
            fresh += in_flight[i].count(r.nodes[b]) == 0 ? 1U : 0U;
          loads[i].decode_blocks = in_flight[i].size() + fresh;
          loads[i].cached_blocks =
              index.block_count(loads[i].worker) + index.orphan_count(loads[i].worker);
          // Dynamo's queued prefill: the whole uncached tokens of every
          // request on the worker whose prefill has not ended.
          loads[i].prefill_tokens = queued_tokens[i];
        }
        const auto d = router.select(r.input_length, matches, loads, rng);
        target = d ? d->index : 0;
        run.routed_cached.push_back(d ? d->chosen.cached_tokens : 0);
        break;
      }
    }

    events.clear();
    const std::size_t cached =
        std::min(r.input_length,
                 caches[target]->admit(WorkerRequest{k, &r, tokens, locals, seqs}, hashes, events));
    for (const KvEvent& e : events) {
      ++run.index_events;
      if (!index.apply(KvWorker{target, 0}, e).ok()) ++run.index_rejected;
    }
    const std::size_t computed = r.input_length - cached;
    const double start = std::max(clock, prefill_free[target]);
    const double prefill = static_cast<double>(computed) / cfg.prefill_tokens_per_s;
    prefill_free[target] = start + prefill;
    run.worker_busy_s[target] += prefill;
    run.ttft_s.push_back(prefill_free[target] - clock);
    const double end =
        prefill_free[target] + static_cast<double>(r.output_length) * cfg.decode_s_per_token;
    decode_blocks[target] += blocks;
    if (!in_flight.empty())
      for (std::size_t b = 0; b < nfull; ++b)
        ++in_flight[target][r.nodes[b]];
    if (!queued.empty() && computed > 0) {
      queued[target].emplace_back(prefill_free[target], computed);
      queued_tokens[target] += computed;
    }
    finishing.push(Finish{end, k, static_cast<std::uint32_t>(target), blocks});

    ++run.requests;
    run.prompt_tokens += r.input_length;
    run.cached_tokens += cached;
    run.computed_tokens += computed;
    ++run.worker_requests[target];
    run.worker_cached[target] += cached;
    run.worker_computed[target] += computed;
    run.assignment.push_back(static_cast<std::uint32_t>(target));
    run.request_cached.push_back(cached);
  }
  run.seconds = cpu_seconds() - cpu0;
  return run;
}

}  // namespace promptcache::replay
