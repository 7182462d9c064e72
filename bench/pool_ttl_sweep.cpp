// pool_ttl_sweep: PromptCachePool lookups against the number of distinct idle TTLs.
//
// A server that passes each request's TTL through (an integer number of seconds, say) fills
// the pool with as many distinct TTLs T as it sees values. A lookup that expires nothing
// should cost the same whatever T is. For each T, a pool of N = max(4096, T) entries of 64
// tokens is filled with per-entry TTLs of 3600 + (i mod T) seconds (entry i); every T needs
// at least T entries to hold T distinct TTLs at once, so T = 100,000 uses 100,000 entries and
// is compared with T = 1 at the same N. Lookups are hits on stored entries in random order
// (each refreshes its entry's recency); nothing expires during the run.
// Clock: CoarseSteadyClock, as a server should use (the clock read is the same for every T).
//
// Every figure is the median of 15 rounds in which all the pools take turns (30 ms each), so a
// slow spell of the machine hits every T alike. Prints ns per lookup and the ratio to T = 1 at
// the same N; the target is a ratio within 1.2x at every T.
//
// Usage: pool_ttl_sweep [--quick] [--json]
#include <promptcache/coarse_steady_clock.hpp>
#include <promptcache/prompt_cache_pool.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace {

using Token = std::uint32_t;
using Clock = promptcache::CoarseSteadyClock;
struct Layer {
  std::uint64_t handle = 0;
};
using Pool = promptcache::PromptCachePool<Layer, Token, Clock>;

volatile std::size_t g_sink = 0;

struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

constexpr std::size_t kLen = 64;
constexpr std::size_t kQueries = 4096;
constexpr int kRounds = 15;

struct Case {
  std::size_t t = 0, n = 0;
  std::unique_ptr<Pool> pool;
  std::vector<std::vector<Token>> queries;
  std::vector<double> ns;
  std::size_t wrong = 0;
};

Case make_case(std::size_t t, std::size_t n) {
  Case c;
  c.t = t;
  c.n = n;
  Pool::Options o;
  o.max_entries = n;
  o.ttl = std::chrono::hours(1);
  o.min_cacheable_tokens = 0;
  c.pool = std::make_unique<Pool>(o);
  Rng rng{0x2545F4914F6CDD1DULL ^ n};
  std::vector<std::vector<Token>> all(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<Token>& ids = all[i];
    ids.push_back(static_cast<Token>(i));  // distinct first token: N leaves under the root
    while (ids.size() < kLen)
      ids.push_back(static_cast<Token>(rng.next() % 50000));
    Pool::InsertOptions io;
    io.ttl = std::chrono::seconds(3600 + static_cast<std::int64_t>(i % t));
    c.pool->insert(ids, {Layer{i}}, io);
  }
  for (std::size_t k = 0; k < kQueries; ++k) {
    std::vector<Token> q = all[rng.next() % n];
    q.push_back(7);  // a new turn: the stored entry is a proper prefix
    c.queries.push_back(std::move(q));
  }
  return c;
}

double run_round(Case& c, double seconds) {
  std::size_t done = 0, batch = 1024;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (true) {
    for (std::size_t i = 0; i < batch; ++i) {
      const auto& q = c.queries[(done + i) % kQueries];
      auto hit = c.pool->find_longest_prefix(q);
      if (!hit || hit->matched != kLen) ++c.wrong;
      g_sink = g_sink + (hit ? hit->matched : 0);
    }
    done += batch;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed >= seconds) break;
  }
  return elapsed * 1e9 / static_cast<double>(done);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--json") {
      json = true;
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--json]\n", argv[0]);
      return 2;
    }
  }
  const std::vector<std::size_t> ts{1, 10, 100, 1000, 4096, 100000};
  std::vector<Case> cases;
  for (std::size_t t : ts)
    cases.push_back(make_case(t, std::max<std::size_t>(4096, t)));
  cases.push_back(make_case(1, 100000));  // the baseline for T = 100,000
  const double seconds = quick ? 0.005 : 0.03;
  for (int r = 0; r < kRounds; ++r) {
    for (Case& c : cases)
      c.ns.push_back(run_round(c, seconds));
  }
  auto baseline = [&](std::size_t n) {
    for (const Case& c : cases)
      if (c.t == 1 && c.n == n) return median(c.ns);
    return 0.0;
  };
  double worst = 0;
  bool ok = true;
  if (json) std::printf("{\n  \"rows\": [\n");
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const double ns = median(c.ns);
    const double ratio = ns / baseline(c.n);
    worst = std::max(worst, ratio);
    const std::size_t stored = c.pool->stats().entries;
    ok = ok && c.wrong == 0;
    if (json) {
      std::printf(
          "    {\"distinct_ttls\": %zu, \"entries\": %zu, \"ns_per_lookup\": %.1f, "
          "\"ratio_to_one_ttl\": %.3f}%s\n",
          c.t, c.n, ns, ratio, i + 1 < cases.size() ? "," : "");
    } else {
      std::printf("T=%-6zu N=%-6zu %7.1f ns per lookup  %.2fx of T=1 at N=%zu  (entries %zu)\n",
                  c.t, c.n, ns, ratio, c.n, stored);
    }
  }
  if (json) {
    std::printf("  ],\n  \"worst_ratio\": %.3f\n}\n", worst);
  } else {
    std::printf("target: every T within 1.2x of T=1: worst %.2fx (%s)\n", worst,
                worst <= 1.2 ? "met" : "MISSED");
  }
  if (!ok) {
    std::fprintf(stderr, "pool_ttl_sweep: wrong lookup results\n");
    return 1;
  }
  return 0;
}
