#include <promptcache/kv_router.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "catch.hpp"

namespace pc = promptcache;

namespace {

pc::KvWorker w(std::uint64_t id, std::uint32_t rank = 0) {
  return pc::KvWorker{id, rank};
}

pc::KvRouter router(double weight, double temperature, std::size_t block_size) {
  return pc::KvRouter(pc::KvRouterConfig{weight, temperature, block_size});
}

}  // namespace

TEST_CASE("kv_router: cost is overlap_weight * prefill blocks + decode blocks", "[kv_router]") {
  const pc::KvRouter r = router(2.0, 0.0, 16);
  // 100 tokens, 3 blocks held: 48 cached, 52 to prefill = 3.25 blocks.
  const pc::KvRouteCandidate c = r.candidate(w(7), 100, 3, 10);
  CHECK(c.worker == w(7));
  CHECK(c.matched_blocks == 3);
  CHECK(c.cached_tokens == 48);
  CHECK(c.prefill_blocks == 3.25);
  CHECK(c.decode_blocks == 10.0);
  CHECK(c.cost == 2.0 * 3.25 + 10.0);

  // A match covering more than the request (its last block was partial) caches it all.
  const pc::KvRouteCandidate full = r.candidate(w(1), 100, 7, 0);
  CHECK(full.cached_tokens == 100);
  CHECK(full.prefill_blocks == 0.0);
  CHECK(full.cost == 0.0);

  // Absurd block counts do not overflow.
  const pc::KvRouteCandidate huge =
      r.candidate(w(1), 100, std::numeric_limits<std::size_t>::max(), 0);
  CHECK(huge.cached_tokens == 100);

  // Weight 0 is pure load balancing.
  CHECK(router(0.0, 0.0, 16).candidate(w(1), 1000, 0, 5).cost == 5.0);
}

TEST_CASE("kv_router: the cheapest worker wins, trading overlap against load", "[kv_router]") {
  const pc::KvRouter r = router(1.0, 0.0, 16);
  // 160 tokens = 10 blocks. Worker 1 holds 8 but carries 5 decode blocks (cost 2 + 5 = 7);
  // worker 2 holds nothing and is idle (cost 10).
  const std::vector<pc::KvWorkerMatch> matches{{w(1), 8}};
  std::vector<pc::KvWorkerLoad> loads{{w(1), 5, 0}, {w(2), 0, 0}};
  auto d = r.select(160, matches, loads);
  REQUIRE(d);
  CHECK(d->chosen.worker == w(1));
  CHECK(d->index == 0);
  CHECK(d->chosen.cost == 7.0);

  // Worker 1 busier: 2 + 9 = 11 > 10, worker 2 wins.
  loads[0].decode_blocks = 9;
  d = r.select(160, matches, loads);
  REQUIRE(d);
  CHECK(d->chosen.worker == w(2));
  CHECK(d->index == 1);

  // A heavier overlap weight chases the cache again: 3 * 2 + 9 = 15 < 3 * 10.
  d = router(3.0, 0.0, 16).select(160, matches, loads);
  REQUIRE(d);
  CHECK(d->chosen.worker == w(1));
}

TEST_CASE("kv_router: ties go to fewer cached blocks, then the smallest worker id", "[kv_router]") {
  const pc::KvRouter r = router(1.0, 0.0, 16);
  // Equal costs everywhere (no matches, no load).
  std::vector<pc::KvWorkerLoad> loads{{w(5), 0, 0}, {w(3, 1), 0, 0}, {w(3, 0), 0, 0}, {w(9), 0, 0}};
  auto d = r.select(64, {}, loads);
  REQUIRE(d);
  CHECK(d->chosen.worker == w(3, 0));
  CHECK(d->index == 2);

  // Fewer cached blocks beats a smaller id.
  loads[2].cached_blocks = 10;
  loads[1].cached_blocks = 10;
  loads[0].cached_blocks = 4;
  loads[3].cached_blocks = 4;
  d = r.select(64, {}, loads);
  REQUIRE(d);
  CHECK(d->chosen.worker == w(5));

  // Input order does not matter.
  std::vector<pc::KvWorkerLoad> reversed(loads.rbegin(), loads.rend());
  d = r.select(64, {}, reversed);
  REQUIRE(d);
  CHECK(d->chosen.worker == w(5));
  CHECK(d->index == 3);
}

TEST_CASE("kv_router: matches of unknown workers are ignored, duplicates use the first",
          "[kv_router]") {
  const pc::KvRouter r = router(1.0, 0.0, 16);
  const std::vector<pc::KvWorkerMatch> matches{{w(42), 4}, {w(2), 2}, {w(2), 4}};
  const std::vector<pc::KvWorkerLoad> loads{{w(1), 0, 0}, {w(2), 0, 0}};
  const auto cands = r.candidates(64, matches, loads);
  REQUIRE(cands.size() == 2);
  CHECK(cands[0].matched_blocks == 0);
  CHECK(cands[1].matched_blocks == 2);
  auto d = r.select(64, matches, loads);
  REQUIRE(d);
  CHECK(d->chosen.worker == w(2));

  // The sorted lookup (many matches) agrees with the linear one.
  std::vector<pc::KvWorkerMatch> many;
  std::vector<pc::KvWorkerLoad> all;
  for (std::uint64_t i = 0; i < 40; ++i) {
    many.push_back({w(39 - i), static_cast<std::size_t>((39 - i) % 7 + 1)});
    all.push_back({w(i), 0, 0});
  }
  many.push_back({w(3), 100});  // a later duplicate is ignored
  const auto sorted = r.candidates(1000, many, all);
  REQUIRE(sorted.size() == 40);
  for (std::size_t i = 0; i < 40; ++i)
    CHECK(sorted[i].matched_blocks == i % 7 + 1);
}

TEST_CASE("kv_router: empty worker lists and bad configurations", "[kv_router]") {
  CHECK_FALSE(router(1.0, 0.0, 16).select(10, {}, {}).has_value());
  CHECK_FALSE(router(1.0, 0.5, 16).select(10, {}, {}, 0.3).has_value());
  std::mt19937_64 rng(1);
  const std::vector<pc::KvWorkerLoad> none;
  CHECK_FALSE(router(1.0, 0.5, 16).select(10, {}, none, rng).has_value());

  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_AS(router(-1.0, 0.0, 16), std::invalid_argument);
  CHECK_THROWS_AS(router(inf, 0.0, 16), std::invalid_argument);
  CHECK_THROWS_AS(router(nan, 0.0, 16), std::invalid_argument);
  CHECK_THROWS_AS(router(1.0, -0.1, 16), std::invalid_argument);
  CHECK_THROWS_AS(router(1.0, nan, 16), std::invalid_argument);
  CHECK_THROWS_AS(router(1.0, inf, 16), std::invalid_argument);
  CHECK_THROWS_AS(router(1.0, 0.0, 0), std::invalid_argument);
  CHECK(pc::KvRouter().config().overlap_weight == 1.0);
  CHECK(pc::KvRouter().config().temperature == 0.0);

  // An empty request costs only its load.
  const std::vector<pc::KvWorkerLoad> loads{{w(1), 3, 0}, {w(2), 1, 0}};
  auto d = router(1.0, 0.0, 16).select(0, {}, loads);
  REQUIRE(d);
  CHECK(d->chosen.worker == w(2));
}

TEST_CASE("kv_router: softmax sampling over rescaled costs", "[kv_router]") {
  const pc::KvRouter r = router(1.0, 1.0, 16);
  // Worker 1 costs 2 (cheapest), worker 2 costs 4 and worker 3 costs 6: rescaled to 0, 0.5, 1.
  const std::vector<pc::KvWorkerLoad> loads{{w(3), 6, 0}, {w(1), 2, 0}, {w(2), 4, 0}};
  const auto cands = r.candidates(0, {}, loads);
  const auto p = r.probabilities(cands);
  const double e0 = 1.0;
  const double e1 = std::exp(-0.5);
  const double e2 = std::exp(-1.0);
  const double sum = e0 + e1 + e2;
  CHECK(p[1] == Approx(e0 / sum));
  CHECK(p[2] == Approx(e1 / sum));
  CHECK(p[0] == Approx(e2 / sum));

  // The draw walks workers 1, 2, 3 in id order whatever the input order.
  const double p1 = e0 / sum;
  const double p12 = (e0 + e1) / sum;
  auto pick = [&](double u) { return r.select(0, {}, loads, u)->chosen.worker.worker_id; };
  CHECK(pick(0.0) == 1);
  CHECK(pick(p1 - 1e-9) == 1);
  CHECK(pick(p1 + 1e-9) == 2);
  CHECK(pick(p12 - 1e-9) == 2);
  CHECK(pick(p12 + 1e-9) == 3);
  CHECK(pick(0.999999) == 3);
  // Out-of-range samples are clamped; NaN counts as 0.
  CHECK(pick(1.0) == 3);
  CHECK(pick(7.0) == 3);
  CHECK(pick(-3.0) == 1);
  CHECK(pick(std::numeric_limits<double>::quiet_NaN()) == 1);

  // Scaling every cost does not change the distribution (costs are rescaled).
  const pc::KvRouter heavy = router(1.0, 1.0, 16);
  const std::vector<pc::KvWorkerLoad> scaled{{w(3), 60, 0}, {w(1), 20, 0}, {w(2), 40, 0}};
  const auto q = heavy.probabilities(heavy.candidates(0, {}, scaled));
  for (std::size_t i = 0; i < 3; ++i)
    CHECK(q[i] == Approx(p[i]));

  // A lower temperature sharpens it.
  const pc::KvRouter cold = router(1.0, 0.1, 16);
  const auto c = cold.probabilities(cold.candidates(0, {}, loads));
  CHECK(c[1] > p[1]);
  CHECK(c[1] == Approx(1.0 / (1.0 + std::exp(-5.0) + std::exp(-10.0))));

  // Equal costs: uniform.
  const std::vector<pc::KvWorkerLoad> equal{{w(1), 2, 0}, {w(2), 2, 0}, {w(3), 2, 0}, {w(4), 2, 0}};
  const auto u = r.probabilities(r.candidates(0, {}, equal));
  for (double x : u)
    CHECK(x == 0.25);
  CHECK(r.select(0, {}, equal, 0.26)->chosen.worker == w(2));

  // Temperature 0: all mass on the cheapest set.
  const pc::KvRouter greedy = router(1.0, 0.0, 16);
  const auto g = greedy.probabilities(greedy.candidates(0, {}, loads));
  CHECK(g[0] == 0.0);
  CHECK(g[1] == 1.0);
  CHECK(g[2] == 0.0);
}

TEST_CASE("kv_router: the generator overload draws one 53-bit uniform number", "[kv_router]") {
  const pc::KvRouter r = router(1.0, 0.7, 16);
  const std::vector<pc::KvWorkerMatch> matches{{w(2), 3}, {w(4), 1}};
  const std::vector<pc::KvWorkerLoad> loads{{w(1), 1, 0}, {w(2), 2, 0}, {w(3), 0, 0}, {w(4), 5, 0}};
  std::mt19937_64 a(12345);
  std::mt19937_64 b(12345);
  std::size_t counts[5] = {0, 0, 0, 0, 0};
  for (int i = 0; i < 2000; ++i) {
    const auto d = r.select(64, matches, loads, a);
    REQUIRE(d);
    const double u = static_cast<double>(b() >> 11) * 0x1.0p-53;
    CHECK(d->chosen.worker == r.select(64, matches, loads, u)->chosen.worker);
    ++counts[d->chosen.worker.worker_id];
  }
  // Every worker gets some traffic; the cheapest (worker 2: 1 + 2 = 3) the most.
  const auto p = r.probabilities(r.candidates(64, matches, loads));
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(counts[i + 1] > 0);
    CHECK(static_cast<double>(counts[i + 1]) / 2000.0 == Approx(p[i]).margin(0.05));
  }
  CHECK(counts[2] > counts[1]);
  CHECK(counts[2] > counts[3]);
  CHECK(counts[2] > counts[4]);

  // At temperature 0 the generator is not called.
  std::mt19937_64 c(99);
  std::mt19937_64 untouched(99);
  (void)router(1.0, 0.0, 16).select(64, matches, loads, c);
  CHECK(c() == untouched());
}

TEST_CASE("kv_router: cached tokens at the extremes of request and block sizes", "[kv_router]") {
  constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
  const pc::KvRouter one = router(1.0, 0.0, 1);
  // SIZE_MAX tokens of 1-token blocks: the guard itself must not wrap.
  pc::KvRouteCandidate c = one.candidate(w(0), max, 5, 0);
  CHECK(c.cached_tokens == 5);
  CHECK(c.prefill_blocks == static_cast<double>(max - 5));
  c = one.candidate(w(0), max, max - 1, 0);
  CHECK(c.cached_tokens == max - 1);
  CHECK(c.prefill_blocks == 1.0);
  c = one.candidate(w(0), max, max, 0);
  CHECK(c.cached_tokens == max);
  CHECK(c.prefill_blocks == 0.0);
  c = one.candidate(w(0), max - 1, max, 0);
  CHECK(c.cached_tokens == max - 1);
  CHECK(one.candidate(w(0), max, 0, 0).cached_tokens == 0);

  // A match of more blocks than the request has: the boundary is request_tokens / block_size.
  const pc::KvRouter sixteen = router(1.0, 0.0, 16);
  CHECK(sixteen.candidate(w(0), 100, 6, 0).cached_tokens == 96);
  CHECK(sixteen.candidate(w(0), 100, 7, 0).cached_tokens == 100);
  CHECK(sixteen.candidate(w(0), 96, 6, 0).cached_tokens == 96);
  CHECK(sixteen.candidate(w(0), 96, 7, 0).cached_tokens == 96);
  CHECK(sixteen.candidate(w(0), 0, 3, 0).cached_tokens == 0);
  CHECK(sixteen.candidate(w(0), max, max / 16 + 1, 0).cached_tokens == max);
  CHECK(sixteen.candidate(w(0), max, max / 16, 0).cached_tokens == max / 16 * 16);

  // Blocks of SIZE_MAX tokens: one block covers any request.
  const pc::KvRouter huge = router(1.0, 0.0, max);
  CHECK(huge.candidate(w(0), max, 1, 0).cached_tokens == max);
  CHECK(huge.candidate(w(0), max, 2, 0).cached_tokens == max);
  CHECK(huge.candidate(w(0), max - 1, 1, 0).cached_tokens == max - 1);
  CHECK(huge.candidate(w(0), 5, max, 0).cached_tokens == 5);
  c = huge.candidate(w(0), max, 0, 0);
  CHECK(c.cached_tokens == 0);
  CHECK(c.prefill_blocks == 1.0);

  // SIZE_MAX tokens queued on top of a SIZE_MAX-token request: summed in double.
  c = one.candidate(w(0), max, 0, max, max);
  CHECK(c.prefill_blocks == 2.0 * static_cast<double>(max));
  CHECK(c.cost == 3.0 * static_cast<double>(max));
}

TEST_CASE("kv_router: a vanishing temperature draws as temperature 0 does", "[kv_router]") {
  const double denorm = std::numeric_limits<double>::denorm_min();
  // Costs 4.5 and 5: the range times the temperature underflows to 0.
  const pc::KvRouter r(pc::KvRouterConfig{0.5, denorm, 16});
  const std::vector<pc::KvWorkerMatch> matches{{w(0), 1}};
  const std::vector<pc::KvWorkerLoad> two{{w(0), 0, 0}, {w(1), 0, 0}};
  const auto cands = r.candidates(160, matches, two);
  REQUIRE(cands[0].cost == 4.5);
  REQUIRE(cands[1].cost == 5.0);
  const auto p = r.probabilities(cands);
  CHECK(p[0] == 1.0);
  CHECK(p[1] == 0.0);
  for (double u : {0.0, 0.5, 0.999999, 1.0})
    CHECK(r.select(160, matches, two, u)->chosen.worker == w(0));

  // Two cheapest workers and a costlier one, at temperatures down to the smallest
  // double: exactly temperature 0's distribution, halves on the cheapest pair.
  const std::vector<pc::KvWorkerLoad> three{{w(3), 6, 0}, {w(1), 2, 0}, {w(2), 2, 0}};
  const pc::KvRouter greedy = router(1.0, 0.0, 16);
  const auto g = greedy.probabilities(greedy.candidates(0, {}, three));
  REQUIRE(g == std::vector<double>{0.0, 0.5, 0.5});
  for (double t : {denorm, std::numeric_limits<double>::min(), 1e-300, 1e-6}) {
    const pc::KvRouter cold = router(1.0, t, 16);
    CHECK(cold.probabilities(cold.candidates(0, {}, three)) == g);
    CHECK(cold.select(0, {}, three, 0.4)->chosen.worker == w(1));
    CHECK(cold.select(0, {}, three, 0.6)->chosen.worker == w(2));
    CHECK(cold.select(0, {}, three, 1.0)->chosen.worker == w(2));
  }
  // A small but usable temperature still gives the costlier worker a finite, tiny weight.
  const pc::KvRouter cool = router(1.0, 0.01, 16);
  const auto q = cool.probabilities(cool.candidates(0, {}, three));
  CHECK(q[0] > 0.0);
  CHECK(q[0] == Approx(std::exp(-100.0) / (2.0 + std::exp(-100.0))).epsilon(1e-12));
}

TEST_CASE("kv_router: infinite costs get probability 0 unless every cost is infinite",
          "[kv_router]") {
  const double inf = std::numeric_limits<double>::infinity();
  // Weight 1e308 times 1000 blocks to prefill overflows: worker 1 costs +infinity.
  const pc::KvRouter r(pc::KvRouterConfig{1e308, 1.0, 1});
  const std::vector<pc::KvWorkerMatch> full{{w(0), 1000}};
  const std::vector<pc::KvWorkerLoad> two{{w(0), 0, 0}, {w(1), 0, 0}};
  auto cands = r.candidates(1000, full, two);
  REQUIRE(cands[0].cost == 0.0);
  REQUIRE(cands[1].cost == inf);
  CHECK(r.probabilities(cands) == std::vector<double>{1.0, 0.0});
  for (double u : {0.0, 0.5, 0.99, 1.0})
    CHECK(r.select(1000, full, two, u)->chosen.worker == w(0));
  CHECK(pc::KvRouter(pc::KvRouterConfig{1e308, 0.0, 1}).select(1000, full, two)->chosen.worker ==
        w(0));

  // The finite costs are rescaled among themselves: 0 and 1e300 become 0 and 1.
  const pc::KvRouter big(pc::KvRouterConfig{1e300, 1.0, 1});
  const std::size_t n = 1000000000;
  const std::vector<pc::KvWorkerMatch> some{{w(1), n}, {w(2), n - 1}};
  const std::vector<pc::KvWorkerLoad> mixed{{w(1), 0, 0}, {w(2), 0, 0}, {w(3), 0, 0}};
  cands = big.candidates(n, some, mixed);
  REQUIRE(cands[0].cost == 0.0);
  REQUIRE(cands[1].cost == 1e300);
  REQUIRE(cands[2].cost == inf);
  const auto p = big.probabilities(cands);
  const double e1 = std::exp(-1.0);
  CHECK(p[0] == Approx(1.0 / (1.0 + e1)));
  CHECK(p[1] == Approx(e1 / (1.0 + e1)));
  CHECK(p[2] == 0.0);
  CHECK(big.select(n, some, mixed, 0.999999)->chosen.worker == w(2));
  CHECK(big.select(n, some, mixed, 1.0)->chosen.worker == w(2));
  // One finite cost and the rest infinite: all the weight on it.
  const std::vector<pc::KvWorkerMatch> one_full{{w(2), n}};
  CHECK(big.probabilities(big.candidates(n, one_full, mixed)) ==
        std::vector<double>{0.0, 1.0, 0.0});

  // Every cost infinite counts as all costs equal: a uniform draw, and at
  // temperature 0 the usual tie-break (fewer cached blocks, then the smaller id).
  const pc::KvRouter huge(pc::KvRouterConfig{1e308, 1.0, 1});
  const std::vector<pc::KvWorkerLoad> loads{{w(1), 5, 7}, {w(3), 0, 3}, {w(2), 0, 3}};
  const auto all_inf = huge.candidates(1000, {}, loads);
  for (const auto& c : all_inf)
    REQUIRE(c.cost == inf);
  const auto u = huge.probabilities(all_inf);
  for (double x : u)
    CHECK(x == 1.0 / 3.0);
  CHECK(huge.select(1000, {}, loads, 0.0)->chosen.worker == w(1));
  CHECK(huge.select(1000, {}, loads, 0.5)->chosen.worker == w(2));
  CHECK(huge.select(1000, {}, loads, 0.9)->chosen.worker == w(3));
  const pc::KvRouter huge0(pc::KvRouterConfig{1e308, 0.0, 1});
  CHECK(huge0.select(1000, {}, loads)->chosen.worker == w(2));
  CHECK(huge0.probabilities(all_inf) == u);
}

TEST_CASE("kv_router: in-flight prefill tokens join the prefill term, as in Dynamo",
          "[kv_router]") {
  const pc::KvRouter r = router(1.0, 0.0, 16);
  // 160 tokens = 10 blocks. Worker 1 holds 8 of them and carries 5 decode blocks,
  // with 96 tokens still to prefill: (96 + 160 - 128) / 16 = 8 prefill blocks, cost 13.
  // Worker 2 holds nothing, carries 4 decode blocks, idle prefill: 10 + 4 = 14.
  const std::vector<pc::KvWorkerMatch> matches{{w(1), 8}};
  std::vector<pc::KvWorkerLoad> loads{{w(1), 5, 0, 96}, {w(2), 4, 0, 0}};
  auto cands = r.candidates(160, matches, loads);
  CHECK(cands[0].cached_tokens == 128);
  CHECK(cands[0].prefill_blocks == 8.0);
  CHECK(cands[0].cost == 13.0);
  CHECK(cands[1].prefill_blocks == 10.0);
  CHECK(cands[1].cost == 14.0);
  CHECK(r.select(160, matches, loads)->chosen.worker == w(1));

  // 32 more tokens queued on worker 1: (128 + 32) / 16 = 10 blocks, cost 15 > 14.
  loads[0].prefill_tokens = 128;
  CHECK(r.candidates(160, matches, loads)[0].cost == 15.0);
  CHECK(r.select(160, matches, loads)->chosen.worker == w(2));
  // Without the queue (the default), the old cost: 2 + 5 = 7.
  loads[0].prefill_tokens = 0;
  CHECK(r.candidates(160, matches, loads)[0].cost == 7.0);

  // Fractions of a block count, weighted: 8 queued tokens are half a block, so
  // 3 * (8 + 100 - 48) / 16 + 10 = 3 * 3.75 + 10.
  const pc::KvRouter heavy = router(3.0, 0.0, 16);
  const pc::KvRouteCandidate c = heavy.candidate(w(7), 100, 3, 10, 8);
  CHECK(c.cached_tokens == 48);
  CHECK(c.prefill_blocks == 3.75);
  CHECK(c.cost == 21.25);
  // A match covering the request leaves only the queue: 40 / 16 = 2.5 blocks.
  CHECK(heavy.candidate(w(7), 100, 9, 0, 40).prefill_blocks == 2.5);

  // The queue moves the softmax too: worker 2's idle queue makes it the cheaper one.
  const pc::KvRouter soft = router(1.0, 1.0, 16);
  const std::vector<pc::KvWorkerLoad> queued{{w(1), 0, 0, 320}, {w(2), 0, 0, 0}};
  const auto p = soft.probabilities(soft.candidates(160, {}, queued));
  CHECK(p[1] == Approx(1.0 / (1.0 + std::exp(-1.0))));
  CHECK(p[0] == Approx(std::exp(-1.0) / (1.0 + std::exp(-1.0))));
}
