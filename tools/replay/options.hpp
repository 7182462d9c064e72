// Command line of promptcache_replay, parsed without side effects so tests
// can check it.
#pragma once

#include "cluster.hpp"
#include "paged.hpp"
#include "sweep.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace promptcache::replay {

/// Everything the command line sets.
struct Options {
  std::string trace;             ///< Trace path (empty: the embedded default).
  std::size_t block_size = 512;  ///< Tokens per hash-id block.
  OnError on_error = OnError::skip;
  std::vector<std::size_t> capacities{250'000,    500'000,   1'000'000,  2'000'000,
                                      3'000'000,  5'000'000, 10'000'000, 16'000'000,
                                      32'000'000, 64'000'000};  ///< Sweep capacities, tokens.
  std::vector<std::string> structures;                          ///< Structure filter (empty: all).
  std::vector<RoutePolicy> routing{RoutePolicy::random, RoutePolicy::round_robin,
                                   RoutePolicy::least_loaded, RoutePolicy::cache_aware};
  std::size_t worker_capacity = 2'000'000;  ///< Cluster: tokens per worker.
  std::string worker_cache = "paged:lru";   ///< Cluster: the workers' cache.
  ClusterConfig cluster;                    ///< Cluster parameters.
  bool sweep = true;                        ///< Run the capacity sweep.
  bool run_cluster = true;                  ///< Run the cluster comparison.
  bool json = false;                        ///< JSON on stdout instead of tables.
  bool restart_router = false;              ///< Also run cache-aware with a router restart.
  std::string csv;                          ///< CSV output path (empty: none).
  bool help = false;                        ///< --help given.
};

/// "1.5M", "250K", "4096" (K = 1e3, M = 1e6, G = 1e9 tokens). Throws
/// std::invalid_argument on anything else.
[[nodiscard]] inline std::size_t parse_tokens(std::string_view s) {
  double mult = 1.0;
  if (!s.empty()) {
    const char c = s.back();
    if (c == 'k' || c == 'K') mult = 1e3;
    if (c == 'm' || c == 'M') mult = 1e6;
    if (c == 'g' || c == 'G') mult = 1e9;
    if (mult != 1.0) s.remove_suffix(1);
  }
  std::size_t used = 0;
  double v = 0.0;
  try {
    v = std::stod(std::string(s), &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size() || !std::isfinite(v) || v < 0.0 || v * mult > 1e15)
    throw std::invalid_argument("not a token count: '" + std::string(s) + "'");
  return static_cast<std::size_t>(std::llround(v * mult));
}

/// Splits "a,b,c" (empty items dropped).
[[nodiscard]] inline std::vector<std::string> split_list(std::string_view s) {
  std::vector<std::string> out;
  while (!s.empty()) {
    const std::size_t comma = s.find(',');
    const std::string_view item = s.substr(0, comma);
    if (!item.empty()) out.emplace_back(item);
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  return out;
}

/// The routing policy named `s`. Throws std::invalid_argument if unknown.
[[nodiscard]] inline RoutePolicy parse_route_policy(std::string_view s) {
  for (RoutePolicy p : {RoutePolicy::random, RoutePolicy::round_robin, RoutePolicy::least_loaded,
                        RoutePolicy::cache_aware})
    if (s == route_policy_name(p)) return p;
  throw std::invalid_argument("unknown routing policy: '" + std::string(s) + "'");
}

namespace detail {

inline double parse_double(std::string_view flag, const std::string& v) {
  std::size_t used = 0;
  double d = 0.0;
  try {
    d = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (v.empty() || used != v.size() || !std::isfinite(d))
    throw std::invalid_argument(std::string(flag) + ": not a number: '" + v + "'");
  return d;
}

inline std::uint64_t parse_uint(std::string_view flag, const std::string& v) {
  if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || v.size() > 19)
    throw std::invalid_argument(std::string(flag) + ": not a non-negative integer: '" + v + "'");
  return std::stoull(v);
}

}  // namespace detail

/// The usage text.
[[nodiscard]] inline std::string usage() {
  return R"(usage: promptcache_replay [options]

Replays a Mooncake-format JSONL trace through the library's caches and reports
prompt tokens served from cache / prompt tokens.

  --trace FILE            trace to replay (default: the embedded Mooncake trace)
  --block-size N          tokens per hash id block (default 512)
  --on-error skip|stop    malformed line: report it and go on (default) or stop there
  --capacities LIST       sweep capacities in tokens, e.g. 0.25M,1M,16M
  --structures LIST       only these structures (belady, block, pool-exact,
                          pool-common, paged) or structure:policy pairs
                          (e.g. paged:lru,block:adaptive)
  --no-sweep              skip the capacity sweep
  --no-cluster            skip the cluster comparison
  --workers N             cluster workers (default 8)
  --worker-capacity TOK   cache capacity of each worker in tokens (default 2M)
  --worker-cache NAME     the workers' cache: paged:<policy> (lru, lfu, fifo,
                          priority, slru, mru, filo, adaptive) or block:lru
                          (default paged:lru)
  --routing LIST          random,round-robin,least-loaded,cache-aware (default all)
  --time-scale X          arrival time = timestamp x X (default 1; < 1 is more load)
  --prefill-rate TOK/S    prefill throughput of a worker (default 10000)
  --decode-ms MS          decode time per output token (default 20)
  --overlap-weight W      cache-aware router overlap weight (default 1)
  --temperature T         cache-aware router softmax temperature (default 0)
  --seed N                seed of random routing and softmax draws (default 1)
  --restart-router        also run cache-aware routing with the router restarted
                          half-way (its index rebuilt from new events only),
                          keeping orphan chains and refusing them
  --csv FILE              write every row as CSV
  --json                  JSON on stdout instead of tables
  --help                  this text

  promptcache_replay generate --shape SHAPE [--seed N] [--requests N]
                          write a synthetic trace (see generate --help)

Which paged policy to pick:
  adaptive  the default for one engine, or workers behind cache-aware routing.
            Runs a small sampled simulation of each of its rules (LRU, ARC,
            used-once first, cold first) and follows the one that hits most;
            with no rule ahead it evicts exactly as lru. On the shipped trace
            and 20 generated ones (docs/replay.md) it is at most 0.5% below
            lru and at least 10% above it wherever lru serves under half of
            the optimum (one-off documents, shared prefixes, conversations
            that outgrow the cache). Costs ~34 bytes per page of 8x its
            capacity, plus up to ~200 KB of simulations.
  lru       workers behind random, round-robin or least-loaded routing (there
            adaptive lost up to 3.1%), or when memory per page matters.
  priority  when requests carry priorities.
  lfu/slru  only for a hot set that never changes; mru/filo only for cyclic
            scans larger than the cache.
)";
}

/// Every "structure" and "structure:policy" name --structures accepts, in
/// sweep order.
[[nodiscard]] inline std::vector<std::string> structure_names() {
  std::vector<std::string> names;
  for (const SweepStructure& s : all_structures()) {
    if (std::find(names.begin(), names.end(), s.structure) == names.end())
      names.push_back(s.structure);
    names.push_back(s.structure + ":" + s.policy);
  }
  return names;
}

/// Checks what no single flag can: every --structures item names a structure,
/// --worker-cache names a cache (see worker_cache_names()), and each paged
/// cache the run will build has at most max_pages pages. Throws
/// std::invalid_argument naming the flag, so a bad command line fails before
/// any work.
inline void check_options(const Options& o) {
  const std::vector<std::string> structures = structure_names();
  for (const std::string& s : o.structures)
    if (std::find(structures.begin(), structures.end(), s) == structures.end())
      throw std::invalid_argument("--structures: unknown structure '" + s + "' (see --help)");
  const std::vector<std::string> caches = worker_cache_names();
  if (std::find(caches.begin(), caches.end(), o.worker_cache) == caches.end())
    throw std::invalid_argument("--worker-cache: unknown cache '" + o.worker_cache +
                                "' (see --help)");
  const auto too_many_pages = [&](std::size_t tokens) { return tokens / o.block_size > max_pages; };
  const bool paged_sweep =
      o.sweep && (o.structures.empty() ||
                  std::any_of(o.structures.begin(), o.structures.end(),
                              [](const std::string& s) { return s.rfind("paged", 0) == 0; }));
  if (paged_sweep)
    for (std::size_t c : o.capacities)
      if (too_many_pages(c))
        throw std::invalid_argument("--capacities: " + std::to_string(c) + " tokens is more than " +
                                    std::to_string(max_pages) + " pages of " +
                                    std::to_string(o.block_size) + " tokens");
  if (o.run_cluster && !o.routing.empty() && o.worker_cache.rfind("paged:", 0) == 0 &&
      too_many_pages(o.worker_capacity))
    throw std::invalid_argument("--worker-capacity: " + std::to_string(o.worker_capacity) +
                                " tokens is more than " + std::to_string(max_pages) + " pages of " +
                                std::to_string(o.block_size) + " tokens");
}

/// Parses argv[1..argc), then check_options() unless --help is given. Throws std::invalid_argument
/// with a message naming the flag on a bad or missing value or an unknown flag.
[[nodiscard]] inline Options parse_options(int argc, const char* const* argv) {
  Options o;
  std::vector<std::string> args(argv + 1, argv + argc);
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw std::invalid_argument(a + ": missing value");
      return args[++i];
    };
    if (a == "--help" || a == "-h") {
      o.help = true;
    } else if (a == "--trace") {
      o.trace = value();
    } else if (a == "--block-size") {
      o.block_size = static_cast<std::size_t>(detail::parse_uint(a, value()));
      if (o.block_size == 0 || o.block_size > (1U << 20))
        throw std::invalid_argument("--block-size: must be 1..1048576");
    } else if (a == "--on-error") {
      const std::string& v = value();
      if (v == "skip")
        o.on_error = OnError::skip;
      else if (v == "stop")
        o.on_error = OnError::stop;
      else
        throw std::invalid_argument("--on-error: skip or stop, not '" + v + "'");
    } else if (a == "--capacities") {
      o.capacities.clear();
      for (const std::string& c : split_list(value()))
        o.capacities.push_back(parse_tokens(c));
      if (o.capacities.empty()) throw std::invalid_argument("--capacities: empty list");
    } else if (a == "--structures") {
      o.structures = split_list(value());
    } else if (a == "--no-sweep") {
      o.sweep = false;
    } else if (a == "--no-cluster") {
      o.run_cluster = false;
    } else if (a == "--workers") {
      o.cluster.workers = static_cast<std::size_t>(detail::parse_uint(a, value()));
      if (o.cluster.workers == 0 || o.cluster.workers > 4096)
        throw std::invalid_argument("--workers: must be 1..4096");
    } else if (a == "--worker-capacity") {
      o.worker_capacity = parse_tokens(value());
    } else if (a == "--worker-cache") {
      o.worker_cache = value();
    } else if (a == "--routing") {
      o.routing.clear();
      for (const std::string& p : split_list(value()))
        o.routing.push_back(parse_route_policy(p));
    } else if (a == "--time-scale") {
      o.cluster.time_scale = detail::parse_double(a, value());
      if (!(o.cluster.time_scale > 0.0)) throw std::invalid_argument("--time-scale: must be > 0");
    } else if (a == "--prefill-rate") {
      o.cluster.prefill_tokens_per_s = detail::parse_double(a, value());
      if (!(o.cluster.prefill_tokens_per_s > 0.0))
        throw std::invalid_argument("--prefill-rate: must be > 0");
    } else if (a == "--decode-ms") {
      o.cluster.decode_s_per_token = detail::parse_double(a, value()) / 1000.0;
      if (o.cluster.decode_s_per_token < 0.0)
        throw std::invalid_argument("--decode-ms: must be >= 0");
    } else if (a == "--overlap-weight") {
      o.cluster.overlap_weight = detail::parse_double(a, value());
      if (o.cluster.overlap_weight < 0.0)
        throw std::invalid_argument("--overlap-weight: must be >= 0");
    } else if (a == "--temperature") {
      o.cluster.temperature = detail::parse_double(a, value());
      if (o.cluster.temperature < 0.0) throw std::invalid_argument("--temperature: must be >= 0");
    } else if (a == "--seed") {
      o.cluster.seed = detail::parse_uint(a, value());
    } else if (a == "--restart-router") {
      o.restart_router = true;
    } else if (a == "--csv") {
      o.csv = value();
    } else if (a == "--json") {
      o.json = true;
    } else {
      throw std::invalid_argument("unknown option: " + a + " (see --help)");
    }
  }
  if (!o.help) check_options(o);  // --help prints the usage whatever else is given
  return o;
}

/// True when `s` passes the --structures filter `filter` ("structure" or
/// "structure:policy" items; empty filter: everything).
[[nodiscard]] inline bool selected(const std::vector<std::string>& filter,
                                   const std::string& structure, const std::string& policy) {
  if (filter.empty()) return true;
  for (const std::string& f : filter)
    if (f == structure || f == structure + ":" + policy) return true;
  return false;
}

}  // namespace promptcache::replay
