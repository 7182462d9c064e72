// Hit rates of the replay tool's structures on hand-made traces, worked out by
// hand: the leaf-only LRU block cache, Belady's bound, the adaptive policy and
// the prompt cache pool in both match modes.
#include "replay.hpp"

#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"

namespace rp = promptcache::replay;

namespace {

// Block size 4; each request is (input_length, ids).
rp::Trace make(const std::vector<std::pair<std::size_t, std::vector<int>>>& reqs) {
  std::ostringstream s;
  int ts = 0;
  for (const auto& [len, ids] : reqs) {
    s << "{\"timestamp\": " << ts++ << ", \"input_length\": " << len
      << ", \"output_length\": 2, \"hash_ids\": [";
    for (std::size_t i = 0; i < ids.size(); ++i)
      s << (i ? ", " : "") << ids[i];
    s << "]}\n";
  }
  std::istringstream in(s.str());
  rp::Trace t = rp::parse_trace(in, 4);
  REQUIRE(t.errors.empty());
  return t;
}

rp::CacheRun lru(const rp::Trace& t, std::size_t blocks) {
  rp::LruPolicy p(t, blocks);
  return rp::run_leaf_cache(t, blocks, p);
}

}  // namespace

TEST_CASE("replay sim: leaf-only LRU and Belady on a hand-made trace", "[replay]") {
  // A: [1,2]  B: [1,3]  C: [1,2], 8 tokens each, 2 block slots.
  const rp::Trace t = make({{8, {1, 2}}, {8, {1, 3}}, {8, {1, 2}}});
  // LRU: A misses; B hits 1, evicts 2 (1 is B's own) for 3; C hits 1, evicts 3 for 2.
  const rp::CacheRun l = lru(t, 2);
  CHECK(l.requests == 3);
  CHECK(l.prompt_tokens == 24);
  CHECK(l.hit_tokens == 8);
  // Belady: B's block 3 is never used again, so it is the one dropped; C hits all 8.
  const rp::CacheRun b = rp::run_belady(t, 2);
  CHECK(b.hit_tokens == 12);
  CHECK(b.hit_rate() == 0.5);
  // Enough room: every repeated block hits (4 + 8).
  CHECK(lru(t, 3).hit_tokens == 12);
  CHECK(rp::run_belady(t, 3).hit_tokens == 12);
  // No room at all: nothing is cached, nothing hits.
  CHECK(lru(t, 0).hit_tokens == 0);
  CHECK(rp::run_belady(t, 0).hit_tokens == 0);
}

TEST_CASE("replay sim: only leaves are evicted, never the request's own blocks", "[replay]") {
  // A: [1,2,3]  B: [4]  C: [1,2,3], 3 slots. B must evict a leaf of A's chain:
  // 3 (a leaf) and not 1 (the least recent in insertion order but a parent).
  const rp::Trace t = make({{12, {1, 2, 3}}, {4, {4}}, {12, {1, 2, 3}}});
  const rp::CacheRun l = lru(t, 3);
  CHECK(l.hit_tokens == 8);  // C hits 1 and 2
  // A request longer than the cache caches what fits and still counts hits.
  const rp::Trace big = make({{16, {1, 2, 3, 4}}, {16, {1, 2, 3, 4}}});
  CHECK(lru(big, 2).hit_tokens == 8);
  CHECK(rp::run_belady(big, 2).hit_tokens == 8);
}

TEST_CASE("replay sim: partial blocks count their own tokens", "[replay]") {
  // [1,5] with 6 tokens: block 5 holds 2. Repeated: LRU hits all 6.
  const rp::Trace t = make({{6, {1, 5}}, {6, {1, 5}}});
  CHECK(lru(t, 4).hit_tokens == 6);
  CHECK(rp::run_belady(t, 4).hit_tokens == 6);
  // The adaptive policy does not cache the final partial block: only block 1 hits.
  rp::AdaptiveLeafPolicy a(t, 4);
  CHECK(rp::run_leaf_cache(t, 4, a).hit_tokens == 4);
  rp::AdaptiveLeafPolicy with_partial(t, 4, rp::AdaptiveParams{4.0, true});
  CHECK(rp::run_leaf_cache(t, 4, with_partial).hit_tokens == 6);
}

TEST_CASE("replay sim: a block stored from a shorter partial use serves only its tokens",
          "[replay]") {
  // [1] is first a 2-token partial block, then a full one: the cache holds 2
  // of its tokens, so the second request hits 2, and the third (after the
  // second stored all 4) hits 4 more in every block and paged cache.
  const rp::Trace t = make({{2, {1}}, {4, {1}}, {4, {1}}});
  // The paged cache and the adaptive policy store no partial block: they miss
  // the second request.
  // The optimum bound counts both full uses whole (8): it stays an upper bound.
  CHECK(rp::run_belady(t, 1).hit_tokens == 6);
  CHECK(rp::run_optimum_bound(t, 1).hit_tokens == 8);
  for (const rp::SweepStructure& s : rp::all_structures()) {
    if (s.structure == "pool-exact" || s.structure == "pool-common" || s.structure == "belady")
      continue;
    INFO(s.structure << ":" << s.policy);
    CHECK(s.run(t, 4).hit_tokens == (s.policy == "lru" && s.structure == "block" ? 6U : 4U));
  }
  const rp::Trace two = make({{2, {1}}, {4, {1}}});
  rp::LruPolicy lru(two, 1);
  CHECK(rp::run_leaf_cache(two, 1, lru).hit_tokens == 2);
  CHECK(rp::run_belady(two, 1).hit_tokens == 2);
}

TEST_CASE("replay sim: the adaptive policy keeps a reused block that LRU loses", "[replay]") {
  // Block 1 is used by every other request; scans of fresh single blocks go in
  // between. 2 slots: LRU holds 1 across one scan block but not two; the
  // adaptive policy promotes 1 to T2 on its second use and evicts T1 blocks.
  const rp::Trace t =
      make({{4, {1}}, {4, {1}}, {4, {10}}, {4, {11}}, {4, {1}}, {4, {12}}, {4, {13}}, {4, {1}}});
  // LRU: hits at the 2nd request only (1 is gone after 10 and 11).
  CHECK(lru(t, 2).hit_tokens == 4);
  rp::AdaptiveLeafPolicy a(t, 2);
  CHECK(rp::run_leaf_cache(t, 2, a).hit_tokens == 12);
  CHECK(rp::run_belady(t, 2).hit_tokens == 12);
}

TEST_CASE("replay sim: the prompt cache pool in exact and common-prefix mode", "[replay]") {
  // A: [1,2]  B: [1,2,3]  C: [1,4], block size 4.
  const rp::Trace t = make({{8, {1, 2}}, {12, {1, 2, 3}}, {8, {1, 4}}});
  // Exact: B resumes A (8); C has no stored prefix ([1,2,3] diverges): 8 / 28.
  const rp::CacheRun e = rp::run_pool(t, 1'000, promptcache::MatchMode::exact_prefix);
  CHECK(e.prompt_tokens == 28);
  CHECK(e.hit_tokens == 8);
  // Common prefix: C shares block 1 with [1,2,3]: 8 + 4.
  const rp::CacheRun c = rp::run_pool(t, 1'000, promptcache::MatchMode::common_prefix);
  CHECK(c.hit_tokens == 12);
  // A budget below every prompt stores nothing.
  CHECK(rp::run_pool(t, 7, promptcache::MatchMode::exact_prefix).hit_tokens == 0);
  CHECK(rp::run_pool(t, 0, promptcache::MatchMode::common_prefix).hit_tokens == 0);
  // A budget of 8: A fits; B (12) does not, so C still finds A in common-prefix mode.
  CHECK(rp::run_pool(t, 8, promptcache::MatchMode::exact_prefix).hit_tokens == 8);
  CHECK(rp::run_pool(t, 8, promptcache::MatchMode::common_prefix).hit_tokens == 12);
}

TEST_CASE("replay sim: the paged prefix cache stores whole pages only", "[replay]") {
  // A: [1,2]  B: [1,3]  C: [1,2], 8 tokens each, 2 pages: as the leaf-only LRU block cache.
  const rp::Trace t = make({{8, {1, 2}}, {8, {1, 3}}, {8, {1, 2}}});
  CHECK(rp::run_paged(t, 8, promptcache::eviction::Lru{}).hit_tokens == 8);
  CHECK(rp::run_paged(t, 12, promptcache::eviction::Lru{}).hit_tokens == 12);
  CHECK(rp::run_paged(t, 0, promptcache::eviction::Lru{}).hit_tokens == 0);
  // FIFO: B's miss evicts 2 and C's evicts 3 (each the only unlocked leaf): 4 + 4.
  CHECK(rp::run_paged(t, 8, promptcache::eviction::Fifo{}).hit_tokens == 8);
  // The final partial page is never stored: [1,5] of 6 tokens hits 4 when resent.
  const rp::Trace p = make({{6, {1, 5}}, {6, {1, 5}}});
  CHECK(rp::run_paged(p, 100, promptcache::eviction::Lru{}).hit_tokens == 4);
  // MRU: with room for 2 pages, A stores 1, 2; B hits 1 and evicts the most recent unlocked
  // leaf (2) for 3; C hits 1 only.
  CHECK(rp::run_paged(t, 8, promptcache::eviction::Mru{}).hit_tokens == 8);
  // Page ids are 32-bit: a larger pool is refused before anything is allocated.
  using Engine = rp::PagedEngine<promptcache::eviction::Lru>;
  CHECK_THROWS_AS(Engine(4, rp::max_pages + 1), std::invalid_argument);
  CHECK_THROWS_AS(rp::run_paged(t, 4 * (rp::max_pages + 1), promptcache::eviction::Lru{}),
                  std::invalid_argument);
}

TEST_CASE("replay sim: the sweep runs every structure and times it", "[replay]") {
  const rp::Trace t = make({{8, {1, 2}}, {8, {1, 3}}, {8, {1, 2}}});
  for (const rp::SweepStructure& s : rp::all_structures()) {
    INFO(s.structure << ":" << s.policy);
    const rp::SweepRow row = rp::run_structure(s, t, 8);
    CHECK(row.run.requests == 3);
    CHECK(row.run.prompt_tokens == 24);
    if (s.structure != "pool-exact" && s.structure != "pool-common")
      CHECK(row.run.hit_tokens <= rp::run_optimum_bound(t, 2).hit_tokens);
    CHECK(row.run.seconds >= 0.0);
  }
}

TEST_CASE("replay sim: the optimum bound holds for caches that skip partial blocks", "[replay]") {
  // One slot. [1] is a full block used at 0 and 3; [2] a 1-token partial block
  // used at 1 and 2. Belady's block schedule keeps [2] (used sooner) and
  // serves 1 token; a cache that never stores partial blocks keeps [1] and
  // serves 4. The bound counts both parts: 4 + 1.
  const rp::Trace t = make({{4, {1}}, {1, {2}}, {1, {2}}, {4, {1}}});
  CHECK(rp::run_belady(t, 1).hit_tokens == 1);
  const rp::CacheRun b = rp::run_optimum_bound(t, 1);
  CHECK(b.hit_tokens == 5);
  CHECK(b.prompt_tokens == 10);
  CHECK(b.requests == 4);
  for (const rp::SweepStructure& s : rp::all_structures()) {
    INFO(s.structure << ":" << s.policy);
    if (s.structure == "belady") CHECK(s.run(t, 4).hit_tokens == 5);
    if (s.structure == "paged" || (s.structure == "block" && s.policy == "adaptive"))
      CHECK(s.run(t, 4).hit_tokens == 4);
  }
  // No partial block repeats: the bound is Belady's full-block optimum.
  const rp::Trace f = make({{8, {1, 2}}, {8, {1, 3}}, {8, {1, 2}}});
  CHECK(rp::run_optimum_bound(f, 2).hit_tokens == 12);
  CHECK(rp::run_optimum_bound(f, 1).hit_tokens == 8);
  CHECK(rp::run_optimum_bound(f, 0).hit_tokens == 0);
}

TEST_CASE("replay sim: no block or paged cache beats the optimum bound", "[replay]") {
  // Random traces with shared prefixes, repeated prompts and partial final
  // blocks (some repeated), at every capacity from 0 to past the whole trace.
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<std::pair<std::size_t, std::vector<int>>> reqs;
    const auto n = static_cast<int>(4 + rng() % 16);
    for (int k = 0; k < n; ++k) {
      std::vector<int> ids;
      const auto blocks = static_cast<std::size_t>(1 + rng() % 3);
      for (std::size_t b = 0; b < blocks; ++b)
        ids.push_back(static_cast<int>(b * 10 + rng() % 3));
      // Half the prompts end in a partial block of 1-3 tokens.
      const std::size_t len = 4 * blocks - (rng() % 2 == 0 ? 0 : 1 + rng() % 3);
      reqs.emplace_back(len, ids);
    }
    const rp::Trace t = make(reqs);
    for (std::size_t slots = 0; slots <= 8; ++slots) {
      const std::size_t bound = rp::run_optimum_bound(t, slots).hit_tokens;
      INFO("trial " << trial << ", " << slots << " slots");
      CHECK(rp::run_belady(t, slots).hit_tokens <= bound);
      for (const rp::SweepStructure& s : rp::all_structures()) {
        if (s.structure == "pool-exact" || s.structure == "pool-common") continue;
        INFO(s.structure << ":" << s.policy);
        CHECK(s.run(t, slots * 4).hit_tokens <= bound);
      }
    }
  }
}
