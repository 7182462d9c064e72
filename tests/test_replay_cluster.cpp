// The replay tool's cluster simulation: every prompt token is served from cache
// or computed on exactly one worker, the index follows the workers' events,
// and cache-aware routing finds the worker holding a prefix.
#include "replay.hpp"

#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"

namespace rp = promptcache::replay;

namespace {

rp::Trace make(const std::vector<std::tuple<double, std::size_t, std::vector<int>>>& reqs) {
  std::ostringstream s;
  for (const auto& [ts, len, ids] : reqs) {
    s << "{\"timestamp\": " << ts << ", \"input_length\": " << len
      << ", \"output_length\": 10, \"hash_ids\": [";
    for (std::size_t i = 0; i < ids.size(); ++i)
      s << (i ? ", " : "") << ids[i];
    s << "]}\n";
  }
  std::istringstream in(s.str());
  rp::Trace t = rp::parse_trace(in, 4);
  REQUIRE(t.errors.empty());
  return t;
}

rp::ClusterRun run(const rp::Trace& t, rp::RoutePolicy p, std::size_t workers,
                   std::size_t blocks_per_worker, const std::string& cache = "paged:lru") {
  const rp::TraceHashes h(t);
  rp::ClusterConfig cfg;
  cfg.workers = workers;
  cfg.prefill_tokens_per_s = 4.0;  // one block a second
  cfg.decode_s_per_token = 0.1;    // 10 output tokens: one second of decode
  return rp::run_named_cluster(t, h, cfg, p, blocks_per_worker * 4, cache);
}

// A trace from JSON lines, block size 4.
rp::Trace parse(const std::string& lines) {
  std::istringstream in(lines);
  rp::Trace t = rp::parse_trace(in, 4);
  REQUIRE(t.errors.empty());
  return t;
}

}  // namespace

TEST_CASE("replay cluster: every prompt token is cached or computed on exactly one worker",
          "[replay]") {
  // Shared prefixes, partial blocks and a request longer than a worker's cache.
  const rp::Trace t = make({{0, 12, {1, 2, 3}},
                            {100, 14, {1, 2, 3, 4}},
                            {200, 10, {1, 2, 5}},
                            {300, 12, {1, 2, 3}},
                            {300, 24, {6, 7, 8, 9, 10, 11}},
                            {5000, 12, {1, 2, 3}},
                            {5000, 3, {12}},
                            {9000, 14, {1, 2, 3, 4}}});
  for (const std::string& cache : rp::worker_cache_names())
    for (rp::RoutePolicy p : {rp::RoutePolicy::random, rp::RoutePolicy::round_robin,
                              rp::RoutePolicy::least_loaded, rp::RoutePolicy::cache_aware}) {
      INFO(cache << " " << rp::route_policy_name(p));
      const rp::ClusterRun r = run(t, p, 3, 4, cache);
      CHECK(r.requests == t.requests.size());
      CHECK(r.prompt_tokens == t.prompt_tokens());
      REQUIRE(r.assignment.size() == t.requests.size());
      std::vector<std::size_t> per_worker(3, 0);
      for (std::uint32_t w : r.assignment) {
        REQUIRE(w < 3);
        ++per_worker[w];
      }
      CHECK(per_worker == r.worker_requests);
      CHECK(std::accumulate(r.request_cached.begin(), r.request_cached.end(), std::size_t{0}) ==
            r.cached_tokens);
      CHECK(std::accumulate(r.worker_cached.begin(), r.worker_cached.end(), std::size_t{0}) ==
            r.cached_tokens);
      CHECK(std::accumulate(r.worker_computed.begin(), r.worker_computed.end(), std::size_t{0}) ==
            r.computed_tokens);
      CHECK(r.cached_tokens + r.computed_tokens == r.prompt_tokens);
      // A worker is busy for its prefills: its computed tokens at 4 tokens/s.
      REQUIRE(r.worker_busy_s.size() == 3);
      for (std::size_t i = 0; i < 3; ++i)
        CHECK(r.worker_busy_s[i] == Approx(static_cast<double>(r.worker_computed[i]) / 4.0));
      CHECK(r.index_rejected == 0);
      CHECK(r.ttft_s.size() == t.requests.size());
      for (double x : r.ttft_s)
        CHECK(x >= 0.0);
    }
}

TEST_CASE("replay cluster: figures of a hand-made trace, worked out by hand", "[replay]") {
  // Round-robin over 2 workers, 4 tokens/s, 1 s of decode each:
  //   r0 t=0  [1,2] 8 tokens  -> w0: miss, prefill 0..2 s
  //   r1 t=0  [1,3] 6 tokens  -> w1: miss, prefill 0..1.5 s (stores block 1 only)
  //   r2 t=1  [1,2,4] 10      -> w0: hits 8, prefill 2 tokens 2..2.5 s
  //   r3 t=1  [1,3] 8 tokens  -> w1: hits block 1 (4), prefill 4 tokens 1.5..2.5 s
  const rp::Trace t =
      make({{0, 8, {1, 2}}, {0, 6, {1, 3}}, {1000, 10, {1, 2, 4}}, {1000, 8, {1, 3}}});
  for (const std::string& cache : rp::worker_cache_names()) {
    INFO(cache);
    const rp::ClusterRun r = run(t, rp::RoutePolicy::round_robin, 2, 100, cache);
    CHECK(r.request_cached == std::vector<std::size_t>{0, 0, 8, 4});
    CHECK(r.cached_tokens == 12);
    CHECK(r.computed_tokens == 20);
    CHECK(r.worker_cached == std::vector<std::size_t>{8, 4});
    CHECK(r.worker_computed == std::vector<std::size_t>{10, 10});
    CHECK(r.worker_busy_s == std::vector<double>{2.5, 2.5});
    CHECK(r.ttft_s == std::vector<double>{2.0, 1.5, 1.5, 1.5});
    CHECK(r.imbalance() == 1.0);
  }
}

TEST_CASE("replay cluster: the index predicts every worker's hit exactly", "[replay]") {
  // Random conversations over shared prefixes, small workers that evict, and
  // requests that overlap in time: the index's match on the chosen worker must
  // be the hit that worker then serves, request by request.
  std::mt19937_64 rng(7);
  std::ostringstream s;
  for (int k = 0; k < 400; ++k) {
    const auto prefix = static_cast<int>(rng() % 6);
    const auto extra = static_cast<int>(rng() % 4);
    const auto len = 4 * static_cast<std::size_t>(1 + extra) + rng() % 4;
    s << "{\"timestamp\": " << k * 300 << ", \"input_length\": " << len
      << ", \"output_length\": " << rng() % 20 << ", \"hash_ids\": [" << 1000 + prefix;
    const std::size_t blocks = (len + 3) / 4;
    for (std::size_t b = 1; b < blocks; ++b)
      s << ", " << (b <= 1 && rng() % 2 == 0 ? 2000 + prefix : 3 + k * 8 + static_cast<int>(b));
    s << "]}\n";
  }
  std::istringstream in(s.str());
  const rp::Trace t = rp::parse_trace(in, 4);
  REQUIRE(t.errors.empty());
  for (const std::string& cache : {std::string("block:lru"), std::string("paged:lru"),
                                   std::string("paged:adaptive"), std::string("paged:lfu")}) {
    INFO(cache);
    const rp::ClusterRun r = run(t, rp::RoutePolicy::cache_aware, 3, 6, cache);
    CHECK(r.index_rejected == 0);
    CHECK(r.cached_tokens > 0);
    CHECK(r.routed_cached == r.request_cached);
  }
  CHECK(run(t, rp::RoutePolicy::round_robin, 3, 6).routed_cached.empty());
}

TEST_CASE("replay cluster: cache-aware routing counts each worker's queued prefill", "[replay]") {
  // r0 decodes for 100 s on w0 (12 blocks, its prefill done at 12 s); r1 at
  // 20 s queues 10 s of prefill on w1 (10 blocks). r2 at 21 s, one new block:
  // w0 costs 1 + (12 + 1) = 14, w1 (36 tokens still queued) (36 + 4) / 4 +
  // (10 + 1) = 21, so r2 goes to w0 and waits for nothing. Counting blocks in
  // flight alone would have sent it behind r1's prefill on w1 (13 vs 11).
  std::ostringstream s;
  s << "{\"timestamp\": 0, \"input_length\": 48, \"output_length\": 1000, \"hash_ids\": [1, 2, "
       "3, 4, 5, 6, 7, 8, 9, 10, 11, 12]}\n"
    << "{\"timestamp\": 20000, \"input_length\": 40, \"output_length\": 0, \"hash_ids\": [21, "
       "22, 23, 24, 25, 26, 27, 28, 29, 30]}\n"
    << "{\"timestamp\": 21000, \"input_length\": 4, \"output_length\": 0, \"hash_ids\": "
       "[99]}\n";
  std::istringstream in(s.str());
  const rp::Trace t = rp::parse_trace(in, 4);
  REQUIRE(t.errors.empty());
  for (const std::string& cache : {std::string("block:lru"), std::string("paged:lru")}) {
    INFO(cache);
    const rp::ClusterRun r = run(t, rp::RoutePolicy::cache_aware, 2, 100, cache);
    CHECK(r.assignment == std::vector<std::uint32_t>{0, 1, 0});
    CHECK(r.ttft_s[2] == 1.0);
  }
}

TEST_CASE("replay cluster: a request's queued prefill counts in full until it ends", "[replay]") {
  // r0 (17 blocks) prefills on w0 until 17 s and decodes for 100 s; r1 (10
  // blocks) at 20 s prefills on w1 until 30 s. r2 at 25 s, one new block:
  // w0 costs 1 + (17 + 1) = 19, w1 with r1's whole 40 tokens queued
  // (40 + 4) / 4 + (10 + 1) = 22, so r2 goes to w0 and waits for nothing.
  // Counting only the 20 tokens r1 has left would send r2 to w1 (17).
  const rp::Trace t = parse(
      "{\"timestamp\": 0, \"input_length\": 68, \"output_length\": 1000, \"hash_ids\": [1, 2, 3, "
      "4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]}\n"
      "{\"timestamp\": 20000, \"input_length\": 40, \"output_length\": 1000, \"hash_ids\": [21, "
      "22, 23, 24, 25, 26, 27, 28, 29, 30]}\n"
      "{\"timestamp\": 25000, \"input_length\": 4, \"output_length\": 1000, \"hash_ids\": [99]}\n");
  for (const std::string& cache : {std::string("block:lru"), std::string("paged:lru")}) {
    INFO(cache);
    const rp::ClusterRun r = run(t, rp::RoutePolicy::cache_aware, 2, 100, cache);
    CHECK(r.assignment == std::vector<std::uint32_t>{0, 1, 0});
    CHECK(r.ttft_s[2] == 1.0);
  }
}

TEST_CASE("replay cluster: decode load counts the distinct full blocks in flight", "[replay]") {
  // Dynamo hashes full blocks only: a partial final block is neither in flight
  // nor matched by a later full block. r0 (1 full block + 1 token) on w0, r1
  // (3 full blocks) on w1, both decoding for 100 s. r2 at 10 s (block 6
  // partial) goes to w0: 2 + (1 + 1) = 4 against 2 + (3 + 1) = 6. r3 at 20 s,
  // one full block: w0 holds 2 distinct full blocks in flight, so 1 + (2 + 1)
  // = 4 against 1 + (3 + 1) = 5 on w1. Counting partial blocks too, w0 would
  // hold 4 and r3 go to w1.
  const rp::Trace partial = parse(
      "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1000, \"hash_ids\": [1, 2]}\n"
      "{\"timestamp\": 0, \"input_length\": 12, \"output_length\": 1000, \"hash_ids\": [3, 4, "
      "5]}\n"
      "{\"timestamp\": 10000, \"input_length\": 5, \"output_length\": 1000, \"hash_ids\": [6, "
      "7]}\n"
      "{\"timestamp\": 20000, \"input_length\": 4, \"output_length\": 1000, \"hash_ids\": [9]}\n");
  // A prompt resent while the first is in flight shares its blocks: w0 carries
  // 6 distinct blocks, not 12, and r2 (7 new blocks) at 20 s costs 7 + (6 + 7)
  // = 20 on w0 against 7 + (0 + 7) = 14 on w1; r3 at 40 s then costs
  // 1 + (6 + 1) = 8 on w0 against 1 + (7 + 1) = 9 on w1. Summing each
  // request's blocks instead, r1 no longer finds w0 cheaper (6 against 6)
  // and the requests go to 0, 1, 0, 1.
  const rp::Trace shared = parse(
      "{\"timestamp\": 0, \"input_length\": 24, \"output_length\": 1000, \"hash_ids\": [1, 2, 3, "
      "4, 5, 6]}\n"
      "{\"timestamp\": 10000, \"input_length\": 24, \"output_length\": 1000, \"hash_ids\": [1, 2, "
      "3, 4, 5, 6]}\n"
      "{\"timestamp\": 20000, \"input_length\": 28, \"output_length\": 1000, \"hash_ids\": [11, "
      "12, 13, 14, 15, 16, 17]}\n"
      "{\"timestamp\": 40000, \"input_length\": 4, \"output_length\": 1000, \"hash_ids\": [99]}\n");
  // The request's own new blocks count as decode load: r0 (6 blocks) on w0,
  // r1 (3 blocks) on w1, both decoding. r2 at 20 s shares r0's first two
  // blocks: w0 costs 1 + (6 + 1) = 8, w1 3 + (3 + 3) = 9, so r2 goes to w0.
  // Without the new blocks w0 would cost 7 and w1 6.
  const rp::Trace fresh = parse(
      "{\"timestamp\": 0, \"input_length\": 24, \"output_length\": 1000, \"hash_ids\": [1, 2, 3, "
      "4, 5, 6]}\n"
      "{\"timestamp\": 10000, \"input_length\": 12, \"output_length\": 1000, \"hash_ids\": [11, "
      "12, 13]}\n"
      "{\"timestamp\": 20000, \"input_length\": 12, \"output_length\": 1000, \"hash_ids\": [1, 2, "
      "21]}\n");
  for (const std::string& cache : {std::string("block:lru"), std::string("paged:lru")}) {
    INFO(cache);
    CHECK(run(partial, rp::RoutePolicy::cache_aware, 2, 100, cache).assignment ==
          std::vector<std::uint32_t>{0, 1, 0, 0});
    CHECK(run(shared, rp::RoutePolicy::cache_aware, 2, 100, cache).assignment ==
          std::vector<std::uint32_t>{0, 0, 1, 0});
    CHECK(run(fresh, rp::RoutePolicy::cache_aware, 2, 100, cache).assignment ==
          std::vector<std::uint32_t>{0, 1, 0});
  }
}

TEST_CASE("replay cluster: a full worker cache evicts unlocked blocks for new ones", "[replay]") {
  // One worker of 2 blocks; each request has ended before the next arrives.
  const rp::Trace t = make({{0, 8, {1, 2}}, {100000, 8, {3, 4}}, {200000, 8, {3, 4}}});
  for (const std::string& cache : rp::worker_cache_names()) {
    INFO(cache);
    const rp::ClusterRun r = run(t, rp::RoutePolicy::round_robin, 1, 2, cache);
    CHECK(r.cached_tokens == 8);  // the third request finds [3, 4]
    CHECK(r.index_rejected == 0);
  }
  // While a request runs its blocks are locked: the second one cannot evict them.
  const rp::Trace busy = make({{0, 8, {1, 2}}, {1, 8, {3, 4}}, {200000, 8, {3, 4}}});
  for (const std::string& cache : rp::worker_cache_names()) {
    INFO(cache);
    CHECK(run(busy, rp::RoutePolicy::round_robin, 1, 2, cache).cached_tokens == 0);
  }
  CHECK_THROWS_AS(run(t, rp::RoutePolicy::random, 1, 2, "paged:nope"), std::invalid_argument);
}

TEST_CASE("replay cluster: cache-aware routing follows the prefix, round-robin does not",
          "[replay]") {
  // Three conversations, each resent three times, far apart in time.
  const rp::Trace t = make({{0, 12, {1, 2, 3}},
                            {10000, 12, {4, 5, 6}},
                            {20000, 12, {7, 8, 9}},
                            {30000, 12, {1, 2, 3}},
                            {40000, 12, {4, 5, 6}},
                            {50000, 12, {7, 8, 9}},
                            {60000, 12, {1, 2, 3}},
                            {70000, 12, {4, 5, 6}},
                            {80000, 12, {7, 8, 9}}});
  const rp::ClusterRun aware = run(t, rp::RoutePolicy::cache_aware, 2, 100);
  // Every resend hits its whole prompt: 6 resends x 12 tokens.
  CHECK(aware.cached_tokens == 72);
  CHECK(aware.assignment[3] == aware.assignment[0]);
  CHECK(aware.assignment[4] == aware.assignment[1]);
  CHECK(aware.assignment[8] == aware.assignment[2]);
  // Round-robin over 2 workers: a conversation alternates workers, so its
  // second send misses and only its third hits (the first worker kept it).
  const rp::ClusterRun rr = run(t, rp::RoutePolicy::round_robin, 2, 100);
  CHECK(rr.assignment == std::vector<std::uint32_t>{0, 1, 0, 1, 0, 1, 0, 1, 0});
  CHECK(rr.cached_tokens == 36);
  // Idle workers: no queueing, TTFT is the prefill alone (3 blocks = 3 s on a miss).
  CHECK(aware.ttft_quantile(0.0) == 0.0);
  CHECK(aware.ttft_quantile(1.0) == Approx(3.0));
}

TEST_CASE("replay cluster: the time model queues prefills and balances by load", "[replay]") {
  // Four 2-block misses at once on one worker: prefills end at 2, 4, 6, 8 s.
  const rp::Trace t = make({{0, 8, {1, 2}}, {0, 8, {3, 4}}, {0, 8, {5, 6}}, {0, 8, {7, 8}}});
  const rp::ClusterRun one = run(t, rp::RoutePolicy::least_loaded, 1, 100);
  CHECK(one.ttft_s == std::vector<double>{2.0, 4.0, 6.0, 8.0});
  CHECK(one.imbalance() == 1.0);
  // Least-loaded spreads them over 4 workers: no queueing.
  const rp::ClusterRun four = run(t, rp::RoutePolicy::least_loaded, 4, 100);
  CHECK(four.assignment == std::vector<std::uint32_t>{0, 1, 2, 3});
  CHECK(four.ttft_quantile(0.99) == 2.0);
  // All on worker 0 of 2: max/mean busy = 2.
  const rp::Trace solo = make({{0, 8, {1, 2}}});
  CHECK(run(solo, rp::RoutePolicy::round_robin, 2, 100).imbalance() == 2.0);
}

TEST_CASE("replay cluster: bad configurations are rejected", "[replay]") {
  const rp::Trace t = make({{0, 8, {1, 2}}});
  const rp::TraceHashes h(t);
  auto make_cache = [&](std::size_t) { return std::make_unique<rp::BlockWorkerCache>(t, 4); };
  CHECK(rp::worker_cache_names().front() == "paged:lru");
  rp::ClusterConfig cfg;
  cfg.workers = 0;
  CHECK_THROWS_AS(
      rp::run_cluster<rp::BlockWorkerCache>(t, h, cfg, rp::RoutePolicy::random, make_cache),
      std::invalid_argument);
  cfg.workers = 2;
  cfg.time_scale = 0.0;
  CHECK_THROWS_AS(
      rp::run_cluster<rp::BlockWorkerCache>(t, h, cfg, rp::RoutePolicy::random, make_cache),
      std::invalid_argument);
}

TEST_CASE("replay report: CSV has a row per sweep row and cluster run; JSON names them",
          "[replay]") {
  const rp::Trace t = make({{0, 8, {1, 2}}, {10000, 8, {1, 2}}});
  rp::Report rep;
  rep.trace_name = "hand";
  rep.trace = &t;
  for (const rp::SweepStructure& s : rp::all_structures())
    rep.sweep.push_back(rp::run_structure(s, t, 8));
  rep.cluster.push_back(run(t, rp::RoutePolicy::cache_aware, 2, 4));
  rep.workers = 2;
  rep.worker_capacity = 16;
  rep.worker_cache = "paged:lru";
  std::ostringstream csv;
  rp::write_csv(csv, rep);
  std::size_t lines = 0;
  for (char c : csv.str())
    lines += c == '\n' ? 1U : 0U;
  CHECK(lines == 1 + rep.sweep.size() + 1);
  const nlohmann::json j = rp::to_json(rep);
  CHECK(j["trace"]["requests"] == 2);
  CHECK(j["sweep"].size() == rep.sweep.size());
  CHECK(j["cluster"]["runs"][0]["policy"] == "cache-aware");
  CHECK(j["cluster"]["runs"][0]["cached_tokens"] == 8);
  std::ostringstream table;
  rp::write_tables(table, rep);
  CHECK(table.str().find("cache-aware") != std::string::npos);
  CHECK(table.str().find("belady:optimal") != std::string::npos);
}

TEST_CASE("replay cluster: a router restarted half-way keeps routing to cached prefixes",
          "[replay]") {
  // Four hot prefixes of six blocks, each request one of them and a block of
  // its own, a second apart.
  std::vector<std::tuple<double, std::size_t, std::vector<int>>> reqs;
  for (int k = 0; k < 80; ++k) {
    const int p = k % 4;
    std::vector<int> ids;
    for (int i = 0; i < 6; ++i)
      ids.push_back(100 * (p + 1) + i);
    ids.push_back(1000 + k);
    reqs.emplace_back(1000.0 * k, 28, ids);
  }
  const rp::Trace t = make(reqs);
  const rp::TraceHashes h(t);
  rp::ClusterConfig cfg;
  cfg.workers = 2;
  cfg.prefill_tokens_per_s = 400.0;
  cfg.decode_s_per_token = 0.01;
  const auto go = [&](bool restart, promptcache::KvUnknownParent rule) {
    rp::ClusterConfig c = cfg;
    c.restart_router = restart;
    c.on_unknown_parent = rule;
    return rp::run_named_cluster(t, h, c, rp::RoutePolicy::cache_aware, 1000 * 4, "paged:lru");
  };
  using promptcache::KvUnknownParent;
  const rp::ClusterRun kept = go(false, KvUnknownParent::keep_orphan);
  const rp::ClusterRun orphans = go(true, KvUnknownParent::keep_orphan);
  const rp::ClusterRun refused = go(true, KvUnknownParent::refuse);
  CHECK(kept.restarted_at == 0);
  CHECK(kept.name() == "cache-aware");
  REQUIRE(orphans.restarted_at == 40);
  CHECK(orphans.name() == "cache-aware+restart");
  CHECK(refused.name() == "cache-aware+restart(refuse)");
  for (const rp::ClusterRun* r : {&kept, &orphans, &refused}) {
    CHECK(r->cached_tokens + r->computed_tokens == r->prompt_tokens);
    CHECK(std::accumulate(r->request_cached.begin(), r->request_cached.end(), std::size_t{0}) ==
          r->cached_tokens);
  }
  // After the restart the index sees each worker's chains under prefixes it
  // cached before the restart: refused, the router is blind to them.
  std::size_t blind_orphans = 0;
  std::size_t blind_refused = 0;
  for (std::size_t k = 40; k < 80; ++k) {
    blind_orphans += orphans.routed_cached[k] == 0 ? 1U : 0U;
    blind_refused += refused.routed_cached[k] == 0 ? 1U : 0U;
  }
  CHECK(blind_orphans <= 4);  // at most the first request of each prefix
  CHECK(blind_refused > blind_orphans);
  CHECK(refused.index_rejected > 0);
  CHECK(orphans.index_rejected == 0);
  // Routed by name, the restarted router serves what the kept one serves.
  // (A blind router sends a request past the worker holding its prefix.)
  CHECK(orphans.hit_rate_from(40, t) > refused.hit_rate_from(40, t) + 0.05);
  CHECK(orphans.hit_rate_from(40, t) == Approx(kept.hit_rate_from(40, t)).margin(0.05));
  CHECK(orphans.hit_rate_from(0, t) == Approx(orphans.hit_rate()));
}

TEST_CASE("replay report: restarted runs get their own rows and the hit rate after the restart",
          "[replay]") {
  const rp::Trace t =
      make({{0, 8, {1, 2}}, {1000, 8, {1, 2}}, {2000, 8, {1, 2}}, {3000, 8, {1, 2}}});
  const rp::TraceHashes h(t);
  rp::Report rep;
  rep.trace_name = "hand";
  rep.trace = &t;
  rep.workers = 2;
  rep.worker_capacity = 16;
  rep.worker_cache = "paged:lru";
  rp::ClusterConfig cfg;
  cfg.workers = 2;
  rep.cluster.push_back(
      rp::run_named_cluster(t, h, cfg, rp::RoutePolicy::cache_aware, 16, "paged:lru"));
  cfg.restart_router = true;
  cfg.on_unknown_parent = promptcache::KvUnknownParent::refuse;
  rep.cluster.push_back(
      rp::run_named_cluster(t, h, cfg, rp::RoutePolicy::cache_aware, 16, "paged:lru"));
  CHECK(rep.cluster[1].restarted_at == 2);
  std::ostringstream table;
  rp::write_tables(table, rep);
  CHECK(table.str().find("cache-aware+restart(refuse)") != std::string::npos);
  CHECK(table.str().find("requests from 2 on (after the restart)") != std::string::npos);
  std::ostringstream csv;
  rp::write_csv(csv, rep);
  CHECK(csv.str().find(",cache-aware+restart(refuse),") != std::string::npos);
  const nlohmann::json j = rp::to_json(rep);
  CHECK(j["cluster"]["runs"][1]["router_restarted_at"] == 2);
  CHECK(j["cluster"]["runs"][1]["name"] == "cache-aware+restart(refuse)");
  // The flag.
  const char* args[] = {"promptcache_replay", "--restart-router"};
  CHECK(rp::parse_options(2, args).restart_router);
}
