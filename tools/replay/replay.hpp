// promptcache_replay's testable logic in one include: trace parsing, the
// capacity sweep over every structure, the cluster simulation and the outputs.
#pragma once

#include "adaptive_policy.hpp"
#include "block_sim.hpp"
#include "cluster.hpp"
#include "generate.hpp"
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
