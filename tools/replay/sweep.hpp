// Single-engine capacity sweep: every structure the tool knows, replayed over
// a trace at one capacity (in tokens), with its hit rate and its cost in ns
// per request.
#pragma once

#include "adaptive_policy.hpp"
#include "block_sim.hpp"
#include "paged.hpp"
#include "trace.hpp"

#include <promptcache/manual_clock.hpp>
#include <promptcache/prompt_cache_pool.hpp>

#include <chrono>
#include <cstddef>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace promptcache::replay {

/// The per-layer state a simulated pool entry carries: just its token count,
/// so that the pool's byte budget (1 byte per token) is a capacity in tokens.
struct SimulatedKv {
  std::size_t tokens = 0;  ///< Tokens whose KV this entry holds.
};

/// CacheBytes of PromptCachePool for SimulatedKv: one "byte" per token.
struct SimulatedKvTokens {
  /// The entry's token count.
  std::size_t operator()(const SimulatedKv& kv) const noexcept { return kv.tokens; }
};

/// Replays `t` through a PromptCachePool whose byte budget is `capacity_tokens`
/// (entries are whole prompts; entry count and TTL are unlimited). Each request
/// looks up its tokens, then stores them.
[[nodiscard]] inline CacheRun run_pool(const Trace& t, std::size_t capacity_tokens,
                                       MatchMode mode) {
  CacheRun run;
  using Pool = PromptCachePool<SimulatedKv, std::uint32_t, ManualClock, SimulatedKvTokens>;
  Pool::Options o;
  o.max_entries = std::numeric_limits<std::size_t>::max();
  o.ttl = ManualClock::duration::max();
  o.min_cacheable_tokens = 1;
  o.match = mode;
  // A budget of 0 would mean "unlimited" to the pool: a zero-capacity cache is
  // modelled by not storing anything.
  o.max_bytes = capacity_tokens;
  Pool pool(o, ManualClock{});
  std::vector<std::uint32_t> tokens;
  for (const Request& r : t.requests) {
    ++run.requests;
    run.prompt_tokens += r.input_length;
    tokens.clear();
    expand_tokens(r, t.block_size, tokens);
    if (const auto hit = pool.find_longest_prefix(tokens)) run.hit_tokens += hit->matched;
    if (capacity_tokens == 0 || tokens.empty()) continue;
    std::vector<SimulatedKv> kv{SimulatedKv{tokens.size()}};
    (void)pool.insert(tokens, std::move(kv));
  }
  return run;
}

/// One structure of the sweep: a name, the eviction policy it runs (or "-"),
/// and how to replay a trace through it at a capacity in tokens.
struct SweepStructure {
  std::string structure;  ///< e.g. "pool-exact", "block", "belady".
  std::string policy;     ///< e.g. "lru", "adaptive", "-".
  std::function<CacheRun(const Trace&, std::size_t)> run;  ///< Replays at a capacity in tokens.
};

/// One row of the sweep.
struct SweepRow {
  std::string structure;        ///< Structure name.
  std::string policy;           ///< Policy name.
  std::size_t capacity_tokens;  ///< Capacity in tokens.
  CacheRun run;                 ///< Outcome (seconds included).
  /// CPU time per request, in nanoseconds.
  [[nodiscard]] double ns_per_request() const {
    return run.requests == 0 ? 0.0 : run.seconds * 1e9 / static_cast<double>(run.requests);
  }
};

/// The structures that need no paged prefix cache: the offline optimum, the
/// leaf-only block cache under LRU and under the adaptive policy, and the
/// prompt cache pool in both match modes.
[[nodiscard]] inline std::vector<SweepStructure> basic_structures() {
  std::vector<SweepStructure> s;
  s.push_back({"belady", "optimal", [](const Trace& t, std::size_t cap) {
                 return run_optimum_bound(t, cap / t.block_size);
               }});
  s.push_back({"block", "lru", [](const Trace& t, std::size_t cap) {
                 LruPolicy p(t, cap / t.block_size);
                 return run_leaf_cache(t, cap / t.block_size, p);
               }});
  s.push_back({"block", "adaptive", [](const Trace& t, std::size_t cap) {
                 AdaptiveLeafPolicy p(t, cap / t.block_size);
                 return run_leaf_cache(t, cap / t.block_size, p);
               }});
  s.push_back({"pool-exact", "lru", [](const Trace& t, std::size_t cap) {
                 return run_pool(t, cap, MatchMode::exact_prefix);
               }});
  s.push_back({"pool-common", "lru", [](const Trace& t, std::size_t cap) {
                 return run_pool(t, cap, MatchMode::common_prefix);
               }});
  return s;
}

/// Every structure of the default sweep, in output order: the basic ones,
/// then the paged prefix cache under each of its policies.
[[nodiscard]] inline std::vector<SweepStructure> all_structures() {
  std::vector<SweepStructure> s = basic_structures();
  for_each_paged_policy([&](const char* name, auto make) {
    s.push_back({"paged", name, [make](const Trace& t, std::size_t cap) {
                   return run_paged(t, cap, make(cap / t.block_size));
                 }});
  });
  return s;
}

/// Runs `s` on `t` at `capacity_tokens`, timing it (CPU time).
[[nodiscard]] inline SweepRow run_structure(const SweepStructure& s, const Trace& t,
                                            std::size_t capacity_tokens) {
  const double t0 = cpu_seconds();
  CacheRun run = s.run(t, capacity_tokens);
  run.seconds = cpu_seconds() - t0;
  return SweepRow{s.structure, s.policy, capacity_tokens, run};
}

}  // namespace promptcache::replay
