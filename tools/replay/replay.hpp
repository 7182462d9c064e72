// promptcache_replay's testable logic in one include: trace parsing, the
// capacity sweep over every structure, the cluster simulation and the outputs.
#pragma once

#include "adaptive_policy.hpp"
#include "block_sim.hpp"
#include "cluster.hpp"
#include "options.hpp"
#include "report.hpp"
#include "sweep.hpp"
#include "trace.hpp"

#include <memory>
#include <string>
#include <vector>

namespace promptcache::replay {

/// Every structure of the default sweep, in output order.
[[nodiscard]] inline std::vector<SweepStructure> all_structures() {
  return basic_structures();
}

/// One cluster run with the default worker cache; `worker_cache` receives its name.
[[nodiscard]] inline ClusterRun run_default_cluster(const Trace& t, const TraceHashes& h,
                                                    const ClusterConfig& cfg, RoutePolicy p,
                                                    std::size_t worker_capacity_tokens,
                                                    std::string& worker_cache) {
  worker_cache = "block:lru";
  return run_cluster<BlockWorkerCache>(t, h, cfg, p, [&](std::size_t) {
    return std::make_unique<BlockWorkerCache>(t, worker_capacity_tokens / t.block_size);
  });
}

}  // namespace promptcache::replay
