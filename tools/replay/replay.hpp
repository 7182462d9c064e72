// promptcache_replay's testable logic in one include: trace parsing, the
// capacity sweep over every structure, the cluster simulation and the outputs.
#pragma once

#include "adaptive_policy.hpp"
#include "block_sim.hpp"
#include "cluster.hpp"
#include "options.hpp"
#include "paged.hpp"
#include "report.hpp"
#include "sweep.hpp"
#include "trace.hpp"

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace promptcache::replay {

/// Calls `f(name, make)` for each eviction policy of the paged prefix cache,
/// where make(capacity_pages) builds the policy for a cache of that many pages
/// (only the adaptive policy uses it: its target and ghost history scale with it).
template <class F>
void for_each_paged_policy(F&& f) {
  f("lru", [](std::size_t) { return eviction::Lru{}; });
  f("lfu", [](std::size_t) { return eviction::Lfu{}; });
  f("fifo", [](std::size_t) { return eviction::Fifo{}; });
  f("priority", [](std::size_t) { return eviction::Priority{}; });
  f("slru", [](std::size_t) { return eviction::Slru{}; });
  f("mru", [](std::size_t) { return eviction::Mru{}; });
  f("filo", [](std::size_t) { return eviction::Filo{}; });
  f("adaptive", [](std::size_t pages) { return eviction::Adaptive(pages); });
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

/// Names accepted by --worker-cache: "paged:<policy>" or "block:lru".
[[nodiscard]] inline std::vector<std::string> worker_cache_names() {
  std::vector<std::string> names;
  for_each_paged_policy(
      [&](const char* name, auto) { names.push_back(std::string("paged:") + name); });
  names.push_back("block:lru");
  return names;
}

/// One cluster run whose workers use the cache named `worker_cache` (see
/// worker_cache_names()). Throws std::invalid_argument for an unknown name.
[[nodiscard]] inline ClusterRun run_named_cluster(const Trace& t, const TraceHashes& h,
                                                  const ClusterConfig& cfg, RoutePolicy p,
                                                  std::size_t worker_capacity_tokens,
                                                  const std::string& worker_cache) {
  const std::size_t pages = worker_capacity_tokens / t.block_size;
  if (worker_cache == "block:lru")
    return run_cluster<BlockWorkerCache>(
        t, h, cfg, p, [&](std::size_t) { return std::make_unique<BlockWorkerCache>(t, pages); });
  std::optional<ClusterRun> out;
  for_each_paged_policy([&](const char* name, auto make) {
    using Policy = decltype(make(pages));
    if (out || worker_cache != std::string("paged:") + name) return;
    out = run_cluster<PagedWorkerCache<Policy>>(t, h, cfg, p, [&](std::size_t) {
      return std::make_unique<PagedWorkerCache<Policy>>(t, pages, make(pages));
    });
  });
  if (!out) throw std::invalid_argument("unknown worker cache: '" + worker_cache + "'");
  return std::move(*out);
}

}  // namespace promptcache::replay
