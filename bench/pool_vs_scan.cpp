// pool_vs_scan: PromptCachePool against a linear-scan pool (linear_scan_pool.hpp) and a
// memcmp floor, in one process on the same data.
//
// Grid: entries N in {16, 256, 4096, 65536} x query length L in {256, 4096, 32768}. Every
// entry is a shared system prefix of L/4 tokens then a distinct tail (L tokens in total).
// Exact mode: a query is a stored entry plus 3 new tokens (the hit matches L tokens).
// Common-prefix mode: a query follows a stored entry up to a random point past the shared
// prefix, then diverges (the hit matches that many tokens and must trim the rest).
// Pool columns: with steady_clock (the default), with CoarseSteadyClock, and with a frozen
// clock (no clock read: the cost of the index alone).
// Floor: one memcmp of the query against the matched entry's ids, i.e. reading every matched
// token once, which any exact answer has to do.
// Each pool and floor figure is the median of 5 rounds in which the four take turns (50 ms
// each); the scan is measured once after them.
//
// Memory: each pool holds its own copy of the ids (N x L x 4 bytes). Cells whose copy would
// exceed --max-gib (default 1.5 GiB) are skipped and reported as such: by default only
// N=65536 x L=32768 (8 GiB per copy). The scan pool is bulk-loaded (its insert is
// O(N x L) per call, which would take hours at N=65536); lookups are what is compared.
//
// Contention: SynchronizedPromptCachePool (N=4096, L=1024) driven by 1, 2 and 4 threads,
// each doing 90% lookups and 10% lineage extensions; reports throughput and ns per op.
//
// Usage: pool_vs_scan [--json] [--quick] [--max-gib X] [--mode exact|common|both]
//                     [--n N] [--len L] [--no-contention]
// (--n / --len run only the cells with that many entries / that query length.)
#include <promptcache/coarse_steady_clock.hpp>
#include <promptcache/prompt_cache_pool.hpp>
#include <promptcache/synchronized_prompt_cache_pool.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "linear_scan_pool.hpp"

namespace {

using Token = std::uint32_t;
using Clock = std::chrono::steady_clock;

struct Layer {
  std::uint64_t handle = 0;  // a cheap handle, as an engine's shared KV tensors would be
};

// steady_clock, CoarseSteadyClock, or a frozen time point, as g_clock says: the same pool is
// measured with the real clock read (what a server pays with the default clock), with the
// coarse clock (what it pays with CoarseSteadyClock) and without any read (the index alone).
// Every variant pays the same switch. CLOCK_MONOTONIC_COARSE and steady_clock's
// CLOCK_MONOTONIC share their epoch on Linux, so switching between them mid-run keeps TTLs sane.
enum class ClockKind { steady, coarse, frozen };
ClockKind g_clock = ClockKind::steady;
struct BenchClock {
  using duration = std::chrono::steady_clock::duration;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::steady_clock::time_point;
  time_point now() const noexcept {
    switch (g_clock) {
      case ClockKind::coarse:
        return time_point(std::chrono::duration_cast<duration>(
            promptcache::CoarseSteadyClock::now().time_since_epoch()));
      case ClockKind::frozen:
        return frozen_at;
      case ClockKind::steady:
        break;
    }
    return std::chrono::steady_clock::now();
  }
  time_point frozen_at = std::chrono::steady_clock::now();
};

using Pool = promptcache::PromptCachePool<Layer, Token, BenchClock>;
using Scan = bench::LinearScanPool<Layer, Token>;

volatile std::size_t g_sink = 0;

struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  Token token() { return static_cast<Token>(next() % 50000); }
};

// Runs op(i) for i = 0, 1, ... in growing batches until `min_seconds` passed (at least
// `min_ops` ops, at most `max_ops`); returns ns per op.
template <class Op>
double ns_per_op(Op op, std::size_t min_ops, std::size_t max_ops, double min_seconds) {
  for (std::size_t i = 0; i < std::min<std::size_t>(min_ops, 4); ++i)
    op(i);  // warm up
  std::size_t done = 0, batch = 1;
  const auto start = Clock::now();
  double elapsed = 0;
  while (true) {
    for (std::size_t i = 0; i < batch; ++i)
      op(done + i);
    done += batch;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if ((elapsed >= min_seconds && done >= min_ops) || done >= max_ops) break;
    batch = std::min(batch * 2, max_ops - done);
  }
  return elapsed * 1e9 / static_cast<double>(done);
}

constexpr int kRounds = 5;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Cell {
  std::string mode;
  std::size_t n = 0, len = 0;
  bool skipped = false;
  std::string note;
  double pool_ns = 0, pool_coarse_ns = 0, pool_noclock_ns = 0, scan_ns = 0, floor_ns = 0;
  std::size_t index_bytes = 0, id_bytes = 0;
};

std::vector<Token> entry_ids(const std::vector<Token>& prefix, std::size_t i, std::size_t len,
                             Rng& rng) {
  std::vector<Token> ids(prefix);
  ids.reserve(len);
  ids.push_back(static_cast<Token>(1000000 + i));  // the tail starts with a token of its own
  while (ids.size() < len)
    ids.push_back(rng.token());
  return ids;
}

Cell run_cell(const std::string& mode, std::size_t n, std::size_t len, bool quick, double max_gib) {
  Cell c;
  c.mode = mode;
  c.n = n;
  c.len = len;
  const double copy_gib =
      static_cast<double>(n) * static_cast<double>(len) * sizeof(Token) / (1024.0 * 1024 * 1024);
  if (copy_gib > max_gib) {
    c.skipped = true;
    char buf[160];
    std::snprintf(buf, sizeof buf, "skipped: %.1f GiB of ids per pool copy > --max-gib %.1f",
                  copy_gib, max_gib);
    c.note = buf;
    return c;
  }
  const bool common = mode == "common";
  Rng rng{0x9E3779B97F4A7C15ULL ^ (n * 31 + len)};
  std::vector<Token> prefix(len / 4);
  for (Token& t : prefix)
    t = rng.token();

  Pool::Options o;
  o.max_entries = n;
  o.ttl = std::chrono::hours(1);
  o.min_cacheable_tokens = 0;
  o.match = common ? promptcache::MatchMode::common_prefix : promptcache::MatchMode::exact_prefix;
  auto pool = std::make_unique<Pool>(o);
  auto scan = std::make_unique<Scan>(n, std::chrono::hours(1), 0);

  // Queries: up to 512 entries in random order.
  const std::size_t nq = std::min<std::size_t>(n, 512);
  std::vector<std::size_t> pick(n);
  for (std::size_t i = 0; i < n; ++i)
    pick[i] = i;
  for (std::size_t i = n; i > 1; --i)
    std::swap(pick[i - 1], pick[rng.next() % i]);
  pick.resize(nq);
  std::vector<char> wanted(n, 0);
  for (std::size_t i : pick)
    wanted[i] = 1;
  std::vector<std::vector<Token>> query_of(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<Token> ids = entry_ids(prefix, i, len, rng);
    if (wanted[i]) query_of[i] = ids;
    scan->push_unchecked(ids, {Layer{i}});
    pool->insert(std::move(ids), {Layer{i}});
  }
  std::vector<std::vector<Token>> queries;
  std::vector<std::shared_ptr<const Pool::Entry>> stored;
  std::vector<std::size_t> expect;
  for (std::size_t i : pick) {
    std::vector<Token> q = std::move(query_of[i]);
    stored.push_back(pool->find_exact(q));
    std::size_t matched = len;
    if (common) {
      // Diverge at a random point past the shared prefix.
      matched = len / 4 + 1 + static_cast<std::size_t>(rng.next() % (len - len / 4 - 1));
      q.resize(matched);
    }
    for (int k = 0; k < 3; ++k)
      q.push_back(static_cast<Token>(2000000 + k));
    queries.push_back(std::move(q));
    expect.push_back(matched);
  }
  query_of.clear();
  query_of.shrink_to_fit();

  const auto mem = pool->memory_usage();
  c.index_bytes = mem.index_bytes;
  c.id_bytes = mem.id_bytes;

  std::size_t bad = 0;
  auto pool_lookup = [&](std::size_t i) {
    const std::size_t k = i % nq;
    auto hit = pool->find_longest_prefix(queries[k]);
    if (!hit || hit->matched != expect[k]) ++bad;
    g_sink = g_sink + (hit ? hit->matched : 0);
  };
  auto floor_compare = [&](std::size_t i) {
    const std::size_t k = i % nq;
    g_sink = g_sink + static_cast<std::size_t>(std::memcmp(queries[k].data(), stored[k]->ids.data(),
                                                           expect[k] * sizeof(Token)) == 0);
  };
  // The three pool variants and the floor take turns, kRounds times, and each figure is the
  // median of its rounds: a slow spell of the machine (frequency, a neighbour on the host)
  // then hits all four alike instead of whichever one it happened to fall on.
  const double t = quick ? 0.01 : 0.05;
  std::vector<double> steady_ns, coarse_ns, noclock_ns, floor_ns;
  for (int round = 0; round < kRounds; ++round) {
    g_clock = ClockKind::steady;
    steady_ns.push_back(ns_per_op(pool_lookup, nq, 50000000, t));
    g_clock = ClockKind::coarse;
    coarse_ns.push_back(ns_per_op(pool_lookup, nq, 50000000, t));
    g_clock = ClockKind::frozen;
    noclock_ns.push_back(ns_per_op(pool_lookup, nq, 50000000, t));
    g_clock = ClockKind::steady;
    floor_ns.push_back(ns_per_op(floor_compare, nq, 50000000, t));
  }
  c.pool_ns = median(steady_ns);
  c.pool_coarse_ns = median(coarse_ns);
  c.pool_noclock_ns = median(noclock_ns);
  c.floor_ns = median(floor_ns);
  // The scan reads ~N x L/4 tokens per lookup: a few lookups suffice for the big cells.
  const std::size_t scan_max = n * len >= (std::size_t{1} << 26) ? 4 : 100000;
  c.scan_ns = ns_per_op(
      [&](std::size_t i) {
        const std::size_t k = i % nq;
        auto hit = common ? scan->find_longest_common_prefix(queries[k])
                          : scan->find_longest_prefix(queries[k]);
        if (!hit || hit->second != expect[k]) ++bad;
        g_sink = g_sink + (hit ? hit->second : 0);
      },
      std::min<std::size_t>(nq, 3), scan_max, quick ? 0.05 : 0.25);
  if (bad != 0) {
    std::fprintf(stderr, "pool_vs_scan: %zu wrong answers at N=%zu L=%zu (%s)\n", bad, n, len,
                 mode.c_str());
    std::exit(1);
  }
  return c;
}

struct Contention {
  int threads = 0;
  double ops_per_s = 0, ns_per_op_per_thread = 0;
};

Contention run_contention(int threads, bool quick) {
  using Sync = promptcache::SynchronizedPromptCachePool<Layer, Token>;
  constexpr std::size_t n = 4096, len = 1024;
  Sync::Options o;
  o.max_entries = n;
  o.ttl = std::chrono::hours(1);
  o.min_cacheable_tokens = 0;
  Sync pool(o);
  Rng rng{12345};
  std::vector<Token> prefix(len / 4);
  for (Token& t : prefix)
    t = rng.token();
  std::vector<std::vector<Token>> lineages;
  for (std::size_t i = 0; i < n; ++i) {
    lineages.push_back(entry_ids(prefix, i, len, rng));
    pool.insert(lineages.back(), {Layer{i}});
  }
  const double seconds = quick ? 0.1 : 0.4;
  std::vector<std::size_t> ops(static_cast<std::size_t>(threads), 0);
  std::vector<std::thread> workers;
  const auto start = Clock::now();
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      Rng r{static_cast<std::uint64_t>(t) * 7919 + 17};
      // Each thread owns the lineages i == t (mod threads), so extensions never race on ids.
      std::size_t done = 0;
      while (true) {
        for (int k = 0; k < 64; ++k, ++done) {
          std::size_t i = (r.next() % (n / static_cast<std::size_t>(threads))) *
                              static_cast<std::size_t>(threads) +
                          static_cast<std::size_t>(t);
          std::vector<Token>& mine = lineages[i];
          if (done % 10 == 9) {
            mine.push_back(r.token());
            pool.insert(mine, {Layer{i}});
          } else {
            auto hit = pool.find_longest_prefix(mine);
            g_sink = g_sink + (hit ? hit->matched : 0);
          }
        }
        if (std::chrono::duration<double>(Clock::now() - start).count() >= seconds) break;
      }
      ops[static_cast<std::size_t>(t)] = done;
    });
  }
  for (auto& w : workers)
    w.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  std::size_t total = 0;
  for (std::size_t x : ops)
    total += x;
  Contention c;
  c.threads = threads;
  c.ops_per_s = static_cast<double>(total) / elapsed;
  c.ns_per_op_per_thread = elapsed * 1e9 * threads / static_cast<double>(total);
  return c;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto p = line.find(':');
      return p == std::string::npos ? line : line.substr(p + 2);
    }
  }
  return "unknown CPU";
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false, quick = false;
  double max_gib = 1.5;
  std::string modes = "both";
  std::size_t only_n = 0, only_len = 0;
  bool contention_runs = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--max-gib" && i + 1 < argc) {
      max_gib = std::stod(argv[++i]);
    } else if (a == "--mode" && i + 1 < argc) {
      modes = argv[++i];
    } else if (a == "--n" && i + 1 < argc) {
      only_n = std::stoul(argv[++i]);
    } else if (a == "--len" && i + 1 < argc) {
      only_len = std::stoul(argv[++i]);
    } else if (a == "--no-contention") {
      contention_runs = false;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--json] [--quick] [--max-gib X] [--mode exact|common|both] "
                   "[--n N] [--len L] [--no-contention]\n",
                   argv[0]);
      return 2;
    }
  }
  std::vector<std::string> mode_list;
  if (modes == "exact" || modes == "both") mode_list.push_back("exact");
  if (modes == "common" || modes == "both") mode_list.push_back("common");

  std::vector<Cell> cells;
  const auto t0 = Clock::now();
  for (const std::string& mode : mode_list) {
    for (std::size_t n : {16UL, 256UL, 4096UL, 65536UL}) {
      for (std::size_t len : {256UL, 4096UL, 32768UL}) {
        if ((only_n != 0 && n != only_n) || (only_len != 0 && len != only_len)) continue;
        cells.push_back(run_cell(mode, n, len, quick, max_gib));
        const Cell& c = cells.back();
        if (!json) {
          if (c.skipped) {
            std::printf("%-6s N=%-6zu L=%-6zu %s\n", c.mode.c_str(), c.n, c.len, c.note.c_str());
          } else {
            std::printf(
                "%-6s N=%-6zu L=%-6zu pool %7.0f ns (coarse %7.0f, no clock %7.0f)  scan %12.0f ns"
                "  floor %6.0f ns  scan/pool %9.1fx  pool/floor %5.2fx (coarse %5.2fx, no clock "
                "%5.2fx)  index/ids %.3f\n",
                c.mode.c_str(), c.n, c.len, c.pool_ns, c.pool_coarse_ns, c.pool_noclock_ns,
                c.scan_ns, c.floor_ns, c.scan_ns / c.pool_ns, c.pool_ns / c.floor_ns,
                c.pool_coarse_ns / c.floor_ns, c.pool_noclock_ns / c.floor_ns,
                static_cast<double>(c.index_bytes) / static_cast<double>(c.id_bytes));
          }
          std::fflush(stdout);
        }
      }
    }
  }
  std::vector<Contention> contention;
  for (int threads : {1, 2, 4}) {
    if (!contention_runs) break;
    contention.push_back(run_contention(threads, quick));
    if (!json) {
      const Contention& c = contention.back();
      std::printf("synchronized pool, %d thread(s): %.2f M ops/s, %.0f ns per op per thread\n",
                  c.threads, c.ops_per_s / 1e6, c.ns_per_op_per_thread);
      std::fflush(stdout);
    }
  }
  const double total_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (json) {
    std::printf("{\n  \"machine\": \"%s\",\n  \"total_seconds\": %.1f,\n  \"cells\": [\n",
                cpu_model().c_str(), total_s);
    for (std::size_t i = 0; i < cells.size(); ++i) {
      const Cell& c = cells[i];
      if (c.skipped) {
        std::printf(
            "    {\"mode\": \"%s\", \"entries\": %zu, \"query_tokens\": %zu, \"skipped\": true, "
            "\"note\": \"%s\"}",
            c.mode.c_str(), c.n, c.len, c.note.c_str());
      } else {
        std::printf(
            "    {\"mode\": \"%s\", \"entries\": %zu, \"query_tokens\": %zu, \"pool_ns\": %.1f, "
            "\"pool_coarse_clock_ns\": %.1f, \"pool_without_clock_ns\": %.1f, \"scan_ns\": "
            "%.1f, \"floor_ns\": %.1f, \"scan_over_pool\": %.2f, \"pool_over_floor\": %.3f, "
            "\"pool_coarse_clock_over_floor\": %.3f, \"pool_without_clock_over_floor\": %.3f, "
            "\"index_bytes\": %zu, \"id_bytes\": %zu}",
            c.mode.c_str(), c.n, c.len, c.pool_ns, c.pool_coarse_ns, c.pool_noclock_ns, c.scan_ns,
            c.floor_ns, c.scan_ns / c.pool_ns, c.pool_ns / c.floor_ns,
            c.pool_coarse_ns / c.floor_ns, c.pool_noclock_ns / c.floor_ns, c.index_bytes,
            c.id_bytes);
      }
      std::printf("%s\n", i + 1 < cells.size() ? "," : "");
    }
    std::printf("  ],\n  \"contention\": [\n");
    for (std::size_t i = 0; i < contention.size(); ++i) {
      const Contention& c = contention[i];
      std::printf("    {\"threads\": %d, \"ops_per_s\": %.0f, \"ns_per_op_per_thread\": %.1f}%s\n",
                  c.threads, c.ops_per_s, c.ns_per_op_per_thread,
                  i + 1 < contention.size() ? "," : "");
    }
    std::printf("  ]\n}\n");
  } else {
    std::printf("machine: %s; total %.1f s\n", cpu_model().c_str(), total_s);
    for (const Cell& c : cells) {
      if (c.skipped || c.n != 4096 || c.len != 4096) continue;
      std::printf("target (%s): N=4096 L=4096 scan/pool = %.0fx (>= 200x: %s)\n", c.mode.c_str(),
                  c.scan_ns / c.pool_ns, c.scan_ns / c.pool_ns >= 200 ? "met" : "MISSED");
    }
    double worst = 0, worst_coarse = 0, worst_noclock = 0;
    for (const Cell& c : cells) {
      if (c.skipped) continue;
      worst = std::max(worst, c.pool_ns / c.floor_ns);
      worst_coarse = std::max(worst_coarse, c.pool_coarse_ns / c.floor_ns);
      worst_noclock = std::max(worst_noclock, c.pool_noclock_ns / c.floor_ns);
    }
    std::printf(
        "target: pool/floor <= 2x in every cell with CoarseSteadyClock: worst %.2fx (%s); "
        "with steady_clock %.2fx, without the clock read %.2fx\n",
        worst_coarse, worst_coarse <= 2 ? "met" : "MISSED", worst, worst_noclock);
  }
  return 0;
}
