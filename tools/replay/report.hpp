// Output of promptcache_replay: the stdout tables, CSV rows and JSON document.
#pragma once

#include "cluster.hpp"
#include "sweep.hpp"
#include "trace.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <map>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace promptcache::replay {

/// What the tool ran, for the outputs.
struct Report {
  std::string trace_name;           ///< Path of the trace (or its embedded name).
  const Trace* trace = nullptr;     ///< The parsed trace.
  std::vector<SweepRow> sweep;      ///< Capacity sweep rows.
  std::vector<ClusterRun> cluster;  ///< One run per routing policy.
  std::size_t workers = 0;          ///< Cluster workers.
  std::size_t worker_capacity = 0;  ///< Cluster worker capacity in tokens.
  std::string worker_cache;         ///< The cluster's worker cache ("paged:lru", ...).
  double total_seconds = 0.0;       ///< Wall time of the whole run.
};

/// "1.5M" / "250K" / "512" for a token count.
[[nodiscard]] inline std::string format_tokens(std::size_t n) {
  char buf[32];
  if (n >= 1'000'000 && n % 10'000 == 0) {
    std::snprintf(buf, sizeof buf, "%gM", static_cast<double>(n) / 1e6);
  } else if (n >= 1'000 && n % 10 == 0) {
    std::snprintf(buf, sizeof buf, "%gK", static_cast<double>(n) / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%zu", n);
  }
  return buf;
}

/// The CSV header line (no newline).
[[nodiscard]] inline std::string csv_header() {
  return "section,structure,policy,capacity_tokens,workers,requests,prompt_tokens,hit_tokens,"
         "hit_rate,computed_tokens,imbalance,ttft_p50_s,ttft_p99_s,ns_per_request";
}

/// Every row of `r` as CSV, header first.
inline void write_csv(std::ostream& out, const Report& r) {
  out << csv_header() << '\n';
  char buf[512];
  for (const SweepRow& s : r.sweep) {
    std::snprintf(buf, sizeof buf, "sweep,%s,%s,%zu,1,%zu,%zu,%zu,%.6f,%zu,,,,%.1f\n",
                  s.structure.c_str(), s.policy.c_str(), s.capacity_tokens, s.run.requests,
                  s.run.prompt_tokens, s.run.hit_tokens, s.run.hit_rate(),
                  s.run.prompt_tokens - s.run.hit_tokens, s.ns_per_request());
    out << buf;
  }
  for (const ClusterRun& c : r.cluster) {
    std::snprintf(buf, sizeof buf,
                  "cluster,%s,%s,%zu,%zu,%zu,%zu,%zu,%.6f,%zu,%.4f,%.4f,%.4f,%.1f\n",
                  r.worker_cache.c_str(), c.name().c_str(), r.worker_capacity, r.workers,
                  c.requests, c.prompt_tokens, c.cached_tokens, c.hit_rate(), c.computed_tokens,
                  c.imbalance(), c.ttft_quantile(0.5), c.ttft_quantile(0.99),
                  c.requests == 0 ? 0.0 : c.seconds * 1e9 / static_cast<double>(c.requests));
    out << buf;
  }
}

/// `r` as one JSON document.
[[nodiscard]] inline nlohmann::json to_json(const Report& r) {
  nlohmann::json j;
  const Trace& t = *r.trace;
  std::size_t blocks = 0;
  for (const Request& q : t.requests)
    blocks += q.hash_ids.size();
  j["trace"] = {{"path", r.trace_name},
                {"requests", t.requests.size()},
                {"prompt_tokens", t.prompt_tokens()},
                {"blocks", blocks},
                {"distinct_blocks", t.node_count()},
                {"block_size", t.block_size},
                {"errors", nlohmann::json::array()}};
  for (const TraceError& e : t.errors)
    j["trace"]["errors"].push_back({{"line", e.line}, {"message", e.message}});
  j["sweep"] = nlohmann::json::array();
  for (const SweepRow& s : r.sweep)
    j["sweep"].push_back({{"structure", s.structure},
                          {"policy", s.policy},
                          {"capacity_tokens", s.capacity_tokens},
                          {"requests", s.run.requests},
                          {"prompt_tokens", s.run.prompt_tokens},
                          {"hit_tokens", s.run.hit_tokens},
                          {"hit_rate", s.run.hit_rate()},
                          {"ns_per_request", s.ns_per_request()}});
  j["cluster"] = {{"workers", r.workers},
                  {"worker_capacity_tokens", r.worker_capacity},
                  {"worker_cache", r.worker_cache},
                  {"runs", nlohmann::json::array()}};
  for (const ClusterRun& c : r.cluster)
    j["cluster"]["runs"].push_back(
        {{"policy", route_policy_name(c.policy)},
         {"name", c.name()},
         {"router_restarted_at", c.restarted_at},
         {"hit_rate_after_restart", c.hit_rate_from(c.restarted_at, t)},
         {"requests", c.requests},
         {"prompt_tokens", c.prompt_tokens},
         {"cached_tokens", c.cached_tokens},
         {"computed_tokens", c.computed_tokens},
         {"hit_rate", c.hit_rate()},
         {"imbalance", c.imbalance()},
         {"ttft_p50_s", c.ttft_quantile(0.5)},
         {"ttft_p99_s", c.ttft_quantile(0.99)},
         {"worker_requests", c.worker_requests},
         {"worker_busy_s", c.worker_busy_s},
         {"index_events", c.index_events},
         {"index_rejected", c.index_rejected},
         {"ns_per_request",
          c.requests == 0 ? 0.0 : c.seconds * 1e9 / static_cast<double>(c.requests)}});
  j["seconds"] = r.total_seconds;
  return j;
}

/// The human-readable tables.
inline void write_tables(std::ostream& out, const Report& r) {
  const Trace& t = *r.trace;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "trace: %s\n  %zu requests, %zu prompt tokens, %zu distinct blocks of %zu tokens",
                r.trace_name.c_str(), t.requests.size(), t.prompt_tokens(), t.node_count(),
                t.block_size);
  out << buf;
  if (!t.errors.empty()) out << ", " << t.errors.size() << " malformed lines skipped";
  out << "\n";
  if (!r.sweep.empty()) {
    // Columns: structures in first-seen order; rows: capacities.
    std::vector<std::pair<std::string, std::string>> cols;
    std::vector<std::size_t> caps;
    std::map<std::pair<std::string, std::size_t>, const SweepRow*> cell;
    for (const SweepRow& s : r.sweep) {
      const std::string name = s.policy == "-" ? s.structure : s.structure + ":" + s.policy;
      if (std::find_if(cols.begin(), cols.end(), [&](const auto& c) { return c.first == name; }) ==
          cols.end())
        cols.push_back({name, s.structure});
      if (std::find(caps.begin(), caps.end(), s.capacity_tokens) == caps.end())
        caps.push_back(s.capacity_tokens);
      cell[{name, s.capacity_tokens}] = &s;
    }
    out << "\nprompt tokens served from cache, one engine, by capacity (tokens)\n";
    std::snprintf(buf, sizeof buf, "%-9s", "capacity");
    out << buf;
    for (const auto& c : cols) {
      std::snprintf(buf, sizeof buf, " %15s", c.first.c_str());
      out << buf;
    }
    out << "\n";
    for (std::size_t cap : caps) {
      std::snprintf(buf, sizeof buf, "%-9s", format_tokens(cap).c_str());
      out << buf;
      for (const auto& c : cols) {
        const auto it = cell.find({c.first, cap});
        if (it == cell.end())
          std::snprintf(buf, sizeof buf, " %15s", "-");
        else
          std::snprintf(buf, sizeof buf, " %14.1f%%", 100.0 * it->second->run.hit_rate());
        out << buf;
      }
      out << "\n";
    }
    std::snprintf(buf, sizeof buf, "%-9s", "ns/req");
    out << buf;
    for (const auto& c : cols) {
      double sum = 0.0;
      std::size_t n = 0;
      for (std::size_t cap : caps) {
        const auto it = cell.find({c.first, cap});
        if (it == cell.end()) continue;
        sum += it->second->ns_per_request();
        ++n;
      }
      std::snprintf(buf, sizeof buf, " %15.0f", n == 0 ? 0.0 : sum / static_cast<double>(n));
      out << buf;
    }
    out << "   (CPU ns per request, mean over capacities)\n";
  }
  if (!r.cluster.empty()) {
    std::snprintf(buf, sizeof buf,
                  "\ncluster: %zu workers x %s tokens (%s), requests at their timestamps\n",
                  r.workers, format_tokens(r.worker_capacity).c_str(), r.worker_cache.c_str());
    out << buf;
    const bool restarts = std::any_of(r.cluster.begin(), r.cluster.end(),
                                      [](const ClusterRun& c) { return c.restarted_at != 0; });
    const int width = restarts ? 29 : 13;
    std::snprintf(buf, sizeof buf, "%-*s %9s %16s %10s %10s %10s %9s\n", width, "routing",
                  "hit rate", "prefill tokens", "imbalance", "TTFT p50", "TTFT p99", "ns/req");
    out << buf;
    for (const ClusterRun& c : r.cluster) {
      std::snprintf(buf, sizeof buf, "%-*s %8.1f%% %16zu %10.2f %9.2fs %9.2fs %9.0f\n", width,
                    c.name().c_str(), 100.0 * c.hit_rate(), c.computed_tokens, c.imbalance(),
                    c.ttft_quantile(0.5), c.ttft_quantile(0.99),
                    c.requests == 0 ? 0.0 : c.seconds * 1e9 / static_cast<double>(c.requests));
      out << buf;
    }
  }
  if (!r.cluster.empty()) {
    // A restarted router: the hit rate of the second half, against the run
    // that kept its router.
    const ClusterRun* kept = nullptr;
    for (const ClusterRun& c : r.cluster)
      if (c.restarted_at == 0 && c.policy == RoutePolicy::cache_aware) kept = &c;
    for (const ClusterRun& c : r.cluster) {
      if (c.restarted_at == 0) continue;
      std::snprintf(buf, sizeof buf,
                    "%s: requests from %zu on (after the restart): %.1f%% from cache "
                    "(router kept: %.1f%%)\n",
                    c.name().c_str(), c.restarted_at, 100.0 * c.hit_rate_from(c.restarted_at, t),
                    kept == nullptr ? 0.0 : 100.0 * kept->hit_rate_from(c.restarted_at, t));
      out << buf;
    }
  }
  std::snprintf(buf, sizeof buf, "\ntotal %.2f s wall\n", r.total_seconds);
  out << buf;
}

}  // namespace promptcache::replay
