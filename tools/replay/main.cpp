// promptcache_replay: hit rate, capacity planning and cache-aware routing of
// the library's caches on a Mooncake-format trace. See docs/replay.md.
#include "replay.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#ifndef PROMPTCACHE_REPLAY_DEFAULT_TRACE
#define PROMPTCACHE_REPLAY_DEFAULT_TRACE "tools/replay/data/mooncake_synthetic_trace.jsonl"
#endif

namespace rp = promptcache::replay;

namespace {

// A one-line progress display on stderr, only when stderr is a terminal.
class Progress {
 public:
  Progress() : on_(isatty(STDERR_FILENO) != 0) {}
  void show(const std::string& what, std::size_t done, std::size_t total) const {
    if (!on_) return;
    std::fprintf(stderr, "\r\033[K[%zu/%zu] %s", done, total, what.c_str());
    std::fflush(stderr);
  }
  void clear() const {
    if (!on_) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }

 private:
  bool on_;
};

int run(const rp::Options& o) {
  const auto t0 = std::chrono::steady_clock::now();
  // Checked first, so an unwritable path fails before the run, not after it:
  // opened for append, which leaves an existing file as it is until the run
  // succeeds (a file the check creates is removed again).
  if (!o.csv.empty()) {
    std::error_code ec;
    const bool existed = std::filesystem::exists(o.csv, ec);
    const bool writable = static_cast<bool>(std::ofstream(o.csv, std::ios::app));
    if (!existed) std::filesystem::remove(o.csv, ec);
    if (!writable) {
      std::fprintf(stderr, "promptcache_replay: cannot write '%s'\n", o.csv.c_str());
      return 2;
    }
  }
  const std::string path = o.trace.empty() ? PROMPTCACHE_REPLAY_DEFAULT_TRACE : o.trace;
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "promptcache_replay: cannot open trace '%s'\n", path.c_str());
    return 2;
  }
  const rp::Trace trace = rp::parse_trace(in, o.block_size, o.on_error);
  for (const rp::TraceError& e : trace.errors)
    std::fprintf(stderr, "%s:%zu: %s\n", path.c_str(), e.line, e.message.c_str());
  if (!trace.errors.empty() && o.on_error == rp::OnError::stop) {
    std::fprintf(stderr, "promptcache_replay: stopped at the first malformed line\n");
    return 1;
  }
  if (trace.requests.empty()) {
    std::fprintf(stderr, "promptcache_replay: no usable request in '%s'\n", path.c_str());
    return 1;
  }

  rp::Report report;
  report.trace_name = path;
  report.trace = &trace;
  const Progress progress;

  if (o.sweep) {
    std::vector<rp::SweepStructure> all = rp::all_structures();
    std::vector<rp::SweepStructure> chosen;
    for (rp::SweepStructure& s : all)
      if (rp::selected(o.structures, s.structure, s.policy)) chosen.push_back(std::move(s));
    const std::size_t total = chosen.size() * o.capacities.size();
    std::size_t done = 0;
    for (std::size_t cap : o.capacities)
      for (const rp::SweepStructure& s : chosen) {
        progress.show(s.structure + ":" + s.policy + " @ " + rp::format_tokens(cap), done, total);
        report.sweep.push_back(rp::run_structure(s, trace, cap));
        ++done;
      }
  }
  if (o.run_cluster && !o.routing.empty()) {
    const rp::TraceHashes hashes(trace);
    report.workers = o.cluster.workers;
    report.worker_capacity = o.worker_capacity;
    report.worker_cache = o.worker_cache;
    std::size_t done = 0;
    for (rp::RoutePolicy p : o.routing) {
      progress.show(std::string("cluster: ") + rp::route_policy_name(p), done++, o.routing.size());
      report.cluster.push_back(rp::run_named_cluster(trace, hashes, o.cluster, p, o.worker_capacity,
                                                     report.worker_cache));
      // A router restart matters only to the policy that reads the index:
      // once keeping orphan chains, once refusing them (the index before them).
      if (!o.restart_router || p != rp::RoutePolicy::cache_aware) continue;
      for (const auto rule :
           {promptcache::KvUnknownParent::keep_orphan, promptcache::KvUnknownParent::refuse}) {
        rp::ClusterConfig restarted = o.cluster;
        restarted.restart_router = true;
        restarted.on_unknown_parent = rule;
        report.cluster.push_back(rp::run_named_cluster(trace, hashes, restarted, p,
                                                       o.worker_capacity, report.worker_cache));
      }
    }
  }
  progress.clear();
  report.total_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (!o.csv.empty()) {
    std::ofstream csv(o.csv);
    rp::write_csv(csv, report);
    csv.flush();
    if (!csv) {
      std::fprintf(stderr, "promptcache_replay: cannot write '%s'\n", o.csv.c_str());
      return 1;
    }
  }
  if (o.json)
    std::cout << rp::to_json(report).dump(2) << "\n";
  else
    rp::write_tables(std::cout, report);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "generate") return rp::generate_main(argc - 1, argv + 1);
  rp::Options o;
  try {
    o = rp::parse_options(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "promptcache_replay: %s\n", e.what());
    return 2;
  }
  if (o.help) {
    std::cout << rp::usage();
    return 0;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "promptcache_replay: %s\n", e.what());
    return 1;
  }
}
