// Tests of PromptCachePool: the basic contract of a prompt-prefix pool (with a manual clock in
// place of sleeping), each documented decision (docs/prompt_cache_pool.md), and the structural
// invariants.
#include <promptcache/manual_clock.hpp>
#include <promptcache/prompt_cache_pool.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <type_traits>
#include <vector>

#include "catch.hpp"

namespace {

using namespace std::chrono_literals;
using promptcache::ManualClock;

struct Layer {
  int tag = 0;
};

using Pool = promptcache::PromptCachePool<Layer, std::uint32_t, ManualClock>;
using Ids = std::vector<std::uint32_t>;
using R = Pool::InsertResult;

std::vector<Layer> caches(int tag = 0) {
  return {Layer{tag}};
}

Ids iota_ids(std::uint32_t first, std::uint32_t last) {
  Ids v;
  for (std::uint32_t i = first; i <= last; ++i)
    v.push_back(i);
  return v;
}

}  // namespace

// ---- the basic contract ----------------------------------------------------------------

TEST_CASE("basics: find_longest_prefix picks the best match") {
  ManualClock clock;
  Pool pool(16, 300s, 0, clock);
  pool.insert_or_update({1, 2, 3}, caches(), 0, 0, false);
  pool.insert_or_update({1, 2, 3, 4, 5}, caches(), 0, 0, false);
  // Decision 3: [1,2,3] was replaced in place by its extension.
  REQUIRE(pool.size() == 1);
  auto hit = pool.find_longest_prefix(Ids{1, 2, 3, 4, 5, 6});
  REQUIRE(hit);
  CHECK(hit->entry->ids == Ids{1, 2, 3, 4, 5});
  CHECK(hit->matched == 5);
  pool.check_invariants();
}

TEST_CASE("basics: the longer of two stored prefixes wins") {
  ManualClock clock;
  Pool pool(16, 300s, 0, clock);
  // A pinned [1,2,3] is never replaced, so both entries coexist.
  pool.insert_or_update({1, 2, 3}, caches(1), 0, 0, true);
  REQUIRE(pool.insert_or_update({1, 2, 3, 4, 5}, caches(2), 0, 0, false) == R::inserted);
  REQUIRE(pool.size() == 2);
  auto hit = pool.find_longest_prefix(Ids{1, 2, 3, 4, 5, 6});
  REQUIRE(hit);
  CHECK(hit->entry->ids == Ids{1, 2, 3, 4, 5});
  CHECK(hit->matched == 5);
  auto short_hit = pool.find_longest_prefix(Ids{1, 2, 3, 9});
  REQUIRE(short_hit);
  CHECK(short_hit->entry->caches[0].tag == 1);
  CHECK(short_hit->matched == 3);
}

TEST_CASE("basics: find_longest_prefix returns none when no overlap") {
  ManualClock clock;
  Pool pool(16, 300s, 0, clock);
  pool.insert_or_update({1, 2, 3}, caches(), 0, 0, false);
  CHECK_FALSE(pool.find_longest_prefix(Ids{9, 9, 9}));
  // A partial overlap is not a prefix either.
  CHECK_FALSE(pool.find_longest_prefix(Ids{1, 2, 9}));
  CHECK_FALSE(pool.find_longest_prefix(Ids{1, 2}));
}

TEST_CASE("basics: insert_or_update extends an existing lineage in place") {
  ManualClock clock;
  Pool pool(16, 300s, 0, clock);
  REQUIRE(pool.insert_or_update({1, 2, 3}, caches(), 0, 0, false) == R::inserted);
  REQUIRE(pool.insert_or_update({1, 2, 3, 4, 5}, caches(), 1, 0, false) == R::extended);
  CHECK(pool.size() == 1);
  auto hit = pool.find_longest_prefix(Ids{1, 2, 3, 4, 5});
  REQUIRE(hit);
  CHECK(hit->entry->fed_images == 1);
  CHECK_FALSE(pool.find_longest_prefix(Ids{1, 2, 3, 4}));
  pool.check_invariants();
}

TEST_CASE("basics: insert_or_update evicts the LRU entry over capacity") {
  ManualClock clock;
  Pool pool(2, 300s, 0, clock);
  pool.insert_or_update({1}, caches(), 0, 0, false);
  pool.insert_or_update({2}, caches(), 0, 0, false);
  clock.advance(1s);
  REQUIRE(pool.find_longest_prefix(Ids{1}));  // [2] is now least recently used
  pool.insert_or_update({3}, caches(), 0, 0, false);
  CHECK(pool.size() == 2);
  CHECK_FALSE(pool.find_longest_prefix(Ids{2}));
  CHECK(pool.find_longest_prefix(Ids{1}));
  CHECK(pool.find_longest_prefix(Ids{3}));
  CHECK(pool.stats().evicted_lru == 1);
}

TEST_CASE("basics: LRU order holds without any clock movement") {
  ManualClock clock;  // never advanced: recency comes from the order of use, not the time
  Pool pool(2, 300s, 0, clock);
  pool.insert_or_update({1}, caches(), 0, 0, false);
  pool.insert_or_update({2}, caches(), 0, 0, false);
  REQUIRE(pool.find_longest_prefix(Ids{1}));
  pool.insert_or_update({3}, caches(), 0, 0, false);
  CHECK_FALSE(pool.find_exact(Ids{2}));
  CHECK(pool.find_exact(Ids{1}));
}

TEST_CASE("basics: pinned entries survive LRU pressure") {
  ManualClock clock;
  Pool pool(2, 300s, 0, clock);
  pool.insert_or_update({1}, caches(), 0, 0, true);
  pool.insert_or_update({2}, caches(), 0, 0, false);
  pool.insert_or_update({3}, caches(), 0, 0, false);
  CHECK(pool.size() == 2);
  CHECK(pool.find_longest_prefix(Ids{1}));
  CHECK_FALSE(pool.find_longest_prefix(Ids{2}));
  CHECK(pool.find_longest_prefix(Ids{3}));
}

TEST_CASE("basics: entries shorter than the minimum are not cached") {
  ManualClock clock;
  Pool pool(16, 300s, 8, clock);
  CHECK(pool.insert_or_update({1, 2, 3}, caches(), 0, 0, false) == R::rejected_too_short);
  CHECK(pool.empty());
  CHECK_FALSE(pool.find_longest_prefix(Ids{1, 2, 3}));
}

TEST_CASE("basics: a lineage becomes cacheable once it crosses the minimum") {
  ManualClock clock;
  Pool pool(16, 300s, 8, clock);
  pool.insert_or_update({1, 2, 3}, caches(), 0, 0, false);
  REQUIRE(pool.empty());
  const Ids turn_two = iota_ids(1, 10);
  CHECK(pool.insert_or_update(turn_two, caches(), 0, 0, false) == R::inserted);
  CHECK(pool.size() == 1);
  CHECK(pool.find_longest_prefix(turn_two));
}

TEST_CASE("basics: expired unpinned entries are evicted") {
  ManualClock clock;
  Pool pool(16, 1ms, 0, clock);
  pool.insert_or_update({1, 2, 3}, caches(), 0, 0, false);
  clock.advance(5ms);
  CHECK_FALSE(pool.find_longest_prefix(Ids{1, 2, 3}));
  CHECK(pool.empty());
  CHECK(pool.stats().evicted_ttl == 1);
}

TEST_CASE("with_defaults: 16 entries, 5 minutes, 8 tokens") {
  auto pool = promptcache::PromptCachePool<Layer>::with_defaults();
  CHECK(pool.options().max_entries == 16);
  CHECK(pool.options().ttl == std::chrono::minutes(5));
  CHECK(pool.options().min_cacheable_tokens == 8);
  CHECK(pool.options().match == promptcache::MatchMode::exact_prefix);
  CHECK(pool.insert_or_update(iota_ids(1, 7), caches(), 0, 0, false) ==
        decltype(pool)::InsertResult::rejected_too_short);
  CHECK(pool.insert_or_update(iota_ids(1, 8), caches(), 0, 0, false) ==
        decltype(pool)::InsertResult::inserted);
  CHECK(pool.find_longest_prefix(iota_ids(1, 9)));
}

// ---- decision 1: lookup ---------------------------------------------------------------

TEST_CASE("decision 1: equal ids count as a prefix; matched is the entry length") {
  ManualClock clock;
  Pool pool(16, 300s, 0, clock);
  pool.insert_or_update({5, 6, 7}, caches(), 0, 0, false);
  auto hit = pool.find_longest_prefix(Ids{5, 6, 7});
  REQUIRE(hit);
  CHECK(hit->matched == 3);
  CHECK(hit->matched == hit->entry->ids.size());
  CHECK(hit->trim() == 0);
}

TEST_CASE("decision 1: a hit is a snapshot that outlives its eviction and later updates") {
  ManualClock clock;
  Pool pool(1, 300s, 0, clock);
  pool.insert_or_update({1, 2}, caches(7), 0, 0, false);
  auto hit = pool.find_longest_prefix(Ids{1, 2, 3});
  REQUIRE(hit);
  const Pool::Entry* before = hit->entry.get();
  pool.insert_or_update({1, 2}, caches(8), 0, 0, false);  // update: a new snapshot
  auto again = pool.find_longest_prefix(Ids{1, 2});
  REQUIRE(again);
  CHECK(again->entry.get() != before);
  CHECK(again->entry->caches[0].tag == 8);
  pool.insert_or_update({9}, caches(9), 0, 0, false);  // evicts [1,2]
  pool.clear();
  CHECK(hit->entry->caches[0].tag == 7);  // still readable
  CHECK(hit->entry->ids == Ids{1, 2});
  CHECK(again->entry->caches[0].tag == 8);
}

namespace {
int g_layer_copies = 0;
struct CountedLayer {
  int tag = 0;
  CountedLayer() = default;
  explicit CountedLayer(int t) : tag(t) {}
  CountedLayer(const CountedLayer& o) : tag(o.tag) { ++g_layer_copies; }
  CountedLayer& operator=(const CountedLayer& o) {
    tag = o.tag;
    ++g_layer_copies;
    return *this;
  }
  CountedLayer(CountedLayer&&) noexcept = default;
  CountedLayer& operator=(CountedLayer&&) noexcept = default;
  ~CountedLayer() = default;
};
}  // namespace

TEST_CASE("decision 1: a hit shares the stored snapshot; neither insert nor lookup copies") {
  ManualClock clock;
  promptcache::PromptCachePool<CountedLayer, std::uint32_t, ManualClock> pool(16, 300s, 0, clock);
  std::vector<CountedLayer> layers;
  layers.emplace_back(1);
  layers.emplace_back(2);
  g_layer_copies = 0;
  pool.insert_or_update({1, 2, 3}, std::move(layers), 0, 0, false);
  auto a = pool.find_longest_prefix(Ids{1, 2, 3, 4});
  auto b = pool.find_longest_prefix(Ids{1, 2, 3});
  REQUIRE(a);
  REQUIRE(b);
  CHECK(g_layer_copies == 0);
  CHECK(a->entry == b->entry);  // the same object, not equal copies
  CHECK(a->entry == pool.find_exact(Ids{1, 2, 3}));
  CHECK(a->entry.use_count() == 3);  // the pool's reference and the two hits
}

TEST_CASE("decision 1: lookup refreshes the recency and the TTL of the hit only") {
  ManualClock clock;
  Pool pool(16, 10s, 0, clock);
  pool.insert_or_update({1}, caches(), 0, 0, false);
  pool.insert_or_update({2}, caches(), 0, 0, false);
  clock.advance(6s);
  REQUIRE(pool.find_longest_prefix(Ids{1, 5}));  // refreshes [1]
  clock.advance(6s);                             // [2] idle 12 s, [1] idle 6 s
  CHECK(pool.evict_expired() == 1);
  CHECK(pool.find_exact(Ids{1}));
  CHECK_FALSE(pool.find_exact(Ids{2}));
}

TEST_CASE("decision 1: a miss refreshes nothing") {
  ManualClock clock;
  Pool pool(2, 300s, 0, clock);
  pool.insert_or_update({1, 2}, caches(), 0, 0, false);
  pool.insert_or_update({3}, caches(), 0, 0, false);
  CHECK_FALSE(pool.find_longest_prefix(Ids{1}));  // [1,2] is not a prefix of [1]
  pool.insert_or_update({4}, caches(), 0, 0, false);
  CHECK_FALSE(pool.find_exact(Ids{1, 2}));  // still the LRU one
}

// ---- decision 2: empty ids ------------------------------------------------------------

TEST_CASE("decision 2: empty ids are never stored and an empty query misses") {
  ManualClock clock;
  Pool pool(16, 300s, 0, clock);
  CHECK(pool.insert_or_update({}, caches(), 0, 0, false) == R::rejected_empty);
  CHECK(pool.insert_or_update({}, caches(), 0, 0, true) == R::rejected_empty);
  CHECK(pool.empty());
  pool.insert_or_update({1}, caches(), 0, 0, false);
  CHECK_FALSE(pool.find_longest_prefix(Ids{}));
  CHECK(pool.stats().rejected_empty == 2);
  CHECK_FALSE(pool.erase(Ids{}));
  pool.check_invariants();
}

// ---- decision 3: insert ---------------------------------------------------------------

TEST_CASE("decision 3: equal ids update the entry; pinned stays pinned if either says so") {
  ManualClock clock;
  Pool pool(16, 300s, 0, clock);
  REQUIRE(pool.insert_or_update({1, 2, 3}, caches(1), 0, 0, true) == R::inserted);
  REQUIRE(pool.insert_or_update({1, 2, 3}, caches(2), 3, 4, false) == R::updated);
  CHECK(pool.size() == 1);
  CHECK(pool.is_pinned(Ids{1, 2, 3}));
  auto e = pool.find_exact(Ids{1, 2, 3});
  REQUIRE(e);
  CHECK(e->pinned);
  CHECK(e->caches[0].tag == 2);
  CHECK(e->fed_images == 3);
  CHECK(e->fed_audios == 4);
  // Unpinned + pinned update: pinned.
  pool.insert_or_update({7, 8}, caches(), 0, 0, false);
  REQUIRE(pool.insert_or_update({7, 8}, caches(), 0, 0, true) == R::updated);
  CHECK(pool.is_pinned(Ids{7, 8}));
  CHECK(pool.stats().pinned_entries == 2);
  pool.check_invariants();
}

TEST_CASE("decision 3: the deepest unpinned proper prefix is the one replaced") {
  ManualClock clock;
  Pool pool(16, 300s, 0, clock);
  pool.insert_or_update({1, 2}, caches(1), 0, 0, true);  // pinned anchor
  pool.insert_or_update({1, 2, 3, 4}, caches(2), 0, 0, false);
  // Put an unpinned shorter entry between them with another anchor... build [1,2,3,4] and a
  // separate unpinned [1,2,3,4,5,6] would extend [1,2,3,4]:
  REQUIRE(pool.insert_or_update({1, 2, 3, 4, 5, 6}, caches(3), 0, 0, false) == R::extended);
  CHECK(pool.size() == 2);
  CHECK(pool.find_exact(Ids{1, 2}));
  CHECK_FALSE(pool.find_exact(Ids{1, 2, 3, 4}));
  CHECK(pool.find_exact(Ids{1, 2, 3, 4, 5, 6}));
  pool.check_invariants();
}

TEST_CASE("decision 3: with two unpinned prefixes, only the deepest is replaced") {
  ManualClock clock;
  Pool pool(16, 300s, 0, clock);
  // Two unpinned entries on one path can exist when the shorter was stored after the longer.
  pool.insert_or_update({1, 2, 3, 4}, caches(1), 0, 0, false);
  REQUIRE(pool.insert_or_update({1, 2}, caches(2), 0, 0, false) == R::inserted);
  REQUIRE(pool.size() == 2);
  REQUIRE(pool.insert_or_update({1, 2, 3, 4, 5}, caches(3), 0, 0, false) == R::extended);
  CHECK(pool.find_exact(Ids{1, 2}));
  CHECK_FALSE(pool.find_exact(Ids{1, 2, 3, 4}));
  CHECK(pool.size() == 2);
  pool.check_invariants();
}

TEST_CASE("decision 3: a pinned prefix is never replaced; it keeps serving every lineage") {
  ManualClock clock;
  Pool pool(16, 300s, 0, clock);
  const Ids system = iota_ids(100, 120);
  pool.insert_or_update(system, caches(0), 0, 0, true);
  for (std::uint32_t conv = 0; conv < 3; ++conv) {
    Ids turn = system;
    turn.push_back(1000 + conv);
    CHECK(pool.insert_or_update(turn, caches(static_cast<int>(conv) + 1), 0, 0, false) ==
          R::inserted);
  }
  CHECK(pool.size() == 4);
  Ids other = system;
  other.push_back(5);
  auto hit = pool.find_longest_prefix(other);
  REQUIRE(hit);
  CHECK(hit->entry->ids == system);
  CHECK(hit->entry->caches[0].tag == 0);
  // Next turn of conversation 1 extends its own entry, not the anchor.
  Ids next = system;
  next.push_back(1001);
  next.push_back(7);
  CHECK(pool.insert_or_update(next, caches(9), 0, 0, false) == R::extended);
  CHECK(pool.size() == 4);
  pool.check_invariants();
}

TEST_CASE("decision 3: short ids are stored when they extend an existing lineage") {
  // The minimum is fixed, so every stored entry is at least that long and a short insert
  // can only be an update; shrink the rule by observing that [1..8] + 1 token is accepted
  // while a fresh 7-token lineage is not.
  ManualClock clock;
  Pool pool(16, 300s, 8, clock);
  REQUIRE(pool.insert_or_update(iota_ids(1, 8), caches(), 0, 0, false) == R::inserted);
  CHECK(pool.insert_or_update(iota_ids(1, 9), caches(), 0, 0, false) == R::extended);
  CHECK(pool.insert_or_update(iota_ids(50, 56), caches(), 0, 0, false) == R::rejected_too_short);
  CHECK(pool.stats().rejected_too_short == 1);
}

TEST_CASE("decision 3: storing a prefix of an existing entry adds it beside the entry") {
  ManualClock clock;
  Pool pool(16, 300s, 0, clock);
  pool.insert_or_update({1, 2, 3, 4}, caches(1), 0, 0, false);
  CHECK(pool.insert_or_update({1, 2}, caches(2), 0, 0, false) == R::inserted);
  CHECK(pool.find_longest_prefix(Ids{1, 2, 3})->entry->caches[0].tag == 2);
  CHECK(pool.find_longest_prefix(Ids{1, 2, 3, 4, 5})->entry->caches[0].tag == 1);
  pool.check_invariants();
}

// ---- decision 4: LRU ------------------------------------------------------------------

TEST_CASE("decision 4: the new entry is the victim when every other entry is pinned") {
  ManualClock clock;
  Pool pool(2, 300s, 0, clock);
  pool.insert_or_update({1}, caches(), 0, 0, true);
  pool.insert_or_update({2}, caches(), 0, 0, true);
  CHECK(pool.insert_or_update({3}, caches(), 0, 0, false) == R::inserted);
  CHECK(pool.size() == 2);
  CHECK_FALSE(pool.find_exact(Ids{3}));
  // Pinned entries may exceed the limit.
  pool.insert_or_update({4}, caches(), 0, 0, true);
  CHECK(pool.size() == 3);
  CHECK(pool.stats().pinned_entries == 3);
  pool.check_invariants();
}

TEST_CASE("decision 4: a zero max_entries keeps only pinned entries") {
  ManualClock clock;
  Pool pool(0, 300s, 0, clock);
  pool.insert_or_update({1}, caches(), 0, 0, false);
  CHECK(pool.empty());
  pool.insert_or_update({2}, caches(), 0, 0, true);
  CHECK(pool.size() == 1);
  CHECK(pool.find_longest_prefix(Ids{2, 3}));
}

TEST_CASE("decision 4: LRU evicts several entries in recency order") {
  ManualClock clock;
  Pool pool(3, 300s, 0, clock);
  for (std::uint32_t i = 1; i <= 3; ++i)
    pool.insert_or_update({i}, caches(), 0, 0, false);
  REQUIRE(pool.find_longest_prefix(Ids{1}));
  REQUIRE(pool.find_longest_prefix(Ids{2}));
  pool.insert_or_update({4}, caches(), 0, 0, false);  // evicts 3
  pool.insert_or_update({5}, caches(), 0, 0, false);  // evicts 1
  CHECK_FALSE(pool.find_exact(Ids{3}));
  CHECK_FALSE(pool.find_exact(Ids{1}));
  CHECK(pool.find_exact(Ids{2}));
  CHECK(pool.find_exact(Ids{4}));
  CHECK(pool.find_exact(Ids{5}));
}

TEST_CASE("decision 4: after hits reorder many entries, eviction and expiry follow exact recency") {
  // Entries of two TTLs (two recency lists) are hit in random order between inserts; every
  // insert over capacity must evict exactly the least recently used entry of the model, and
  // expiry must remove exactly the entries idle for their TTL.
  constexpr std::size_t kCap = 64;
  for (std::uint32_t seed = 1; seed <= 4; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    ManualClock clock;
    Pool pool(kCap, 5000s, 0, clock);
    auto ttl_of = [](std::uint32_t id) { return id % 3 == 0 ? 4000s : 5000s; };
    struct Used {
      std::uint32_t id;
      ManualClock::time_point at;
    };
    std::vector<Used> order;  // least recently used first
    std::uint32_t next_id = 1;
    auto insert = [&] {
      const std::uint32_t id = next_id++;
      Pool::InsertOptions o;
      o.ttl = ttl_of(id);
      pool.insert({id}, caches(), o);
      order.push_back(Used{id, clock.now()});
      if (order.size() > kCap) {
        const std::uint32_t victim = order.front().id;
        order.erase(order.begin());
        INFO("victim " << victim);
        CHECK_FALSE(pool.find_exact(Ids{victim}));
        CHECK(pool.size() == kCap);
      }
    };
    auto hit = [&](std::size_t i) {
      const std::uint32_t id = order[i].id;
      REQUIRE(pool.find_longest_prefix(Ids{id}));
      order.erase(order.begin() + static_cast<std::ptrdiff_t>(i));
      order.push_back(Used{id, clock.now()});
    };
    for (std::size_t i = 0; i < kCap; ++i)
      insert();
    for (int round = 0; round < 40; ++round) {
      // Hit a random half of the entries, oldest ones included, then insert a few.
      for (std::size_t k = 0; k < kCap / 2; ++k) {
        hit(rng() % order.size());
        clock.advance(1s);
      }
      for (auto k = rng() % 6; k > 0; --k) {
        insert();
        clock.advance(1s);
      }
      pool.check_invariants();
    }
    for (const Used& u : order)
      REQUIRE(pool.find_exact(Ids{u.id}));
    // Expiry: in the model, exactly the entries idle for at least their TTL.
    clock.advance(4200s);
    std::size_t want = 0;
    for (const Used& u : order)
      if (clock.now() - u.at >= ttl_of(u.id)) ++want;
    CHECK(want > 0);
    CHECK(want < order.size());
    CHECK(pool.evict_expired() == want);
    for (const Used& u : order) {
      INFO("id " << u.id);
      CHECK(static_cast<bool>(pool.find_exact(Ids{u.id})) == (clock.now() - u.at < ttl_of(u.id)));
    }
    pool.check_invariants();
  }
}

// ---- decision 5: TTL ------------------------------------------------------------------

TEST_CASE("decision 5: TTL is idle time since the last insert or hit") {
  ManualClock clock;
  Pool pool(16, 10s, 0, clock);
  pool.insert_or_update({1, 2}, caches(), 0, 0, false);
  clock.advance(9s);
  REQUIRE(pool.find_longest_prefix(Ids{1, 2}));
  clock.advance(9s);  // 18 s since insert, 9 s idle
  REQUIRE(pool.find_longest_prefix(Ids{1, 2}));
  pool.insert_or_update({1, 2}, caches(), 0, 0, false);  // an update refreshes too
  clock.advance(9s);
  CHECK(pool.find_longest_prefix(Ids{1, 2}));
  clock.advance(10s);  // exactly the TTL: expired
  CHECK_FALSE(pool.find_longest_prefix(Ids{1, 2}));
}

TEST_CASE("decision 5: pinned entries never expire") {
  ManualClock clock;
  Pool pool(16, 1s, 0, clock);
  pool.insert_or_update({1}, caches(), 0, 0, true);
  pool.insert_or_update({2}, caches(), 0, 0, false);
  clock.advance(std::chrono::hours(24 * 365));
  CHECK(pool.evict_expired() == 1);
  CHECK(pool.find_longest_prefix(Ids{1}));
  CHECK(pool.size() == 1);
}

TEST_CASE("decision 5: a zero TTL expires every unpinned entry at the next check") {
  ManualClock clock;
  Pool pool(16, 0s, 0, clock);
  pool.insert_or_update({1}, caches(), 0, 0, false);
  pool.insert_or_update({2}, caches(), 0, 0, true);
  CHECK(pool.size() == 2);
  CHECK_FALSE(pool.find_longest_prefix(Ids{1}));  // no time passed, still expired
  CHECK(pool.find_longest_prefix(Ids{2}));
  CHECK(pool.size() == 1);
}

TEST_CASE("decision 5: expiry removes the oldest first and stops at the first live entry") {
  ManualClock clock;
  Pool pool(16, 10s, 0, clock);
  for (std::uint32_t i = 1; i <= 5; ++i) {
    pool.insert_or_update({i}, caches(), 0, 0, false);
    clock.advance(3s);
  }
  // Inserted at 0,3,6,9,12; now 15: idle 15,12,9,6,3 -> two expired.
  CHECK(pool.evict_expired() == 2);
  CHECK(pool.size() == 3);
  CHECK(pool.evict_expired() == 0);
  pool.check_invariants();
}

// ---- erase / clear / misc -----------------------------------------------------------

TEST_CASE("erase removes exactly the given ids, pinned or not") {
  ManualClock clock;
  Pool pool(16, 300s, 0, clock);
  pool.insert_or_update({1, 2}, caches(), 0, 0, true);
  pool.insert_or_update({1, 2, 3, 4}, caches(), 0, 0, false);
  CHECK_FALSE(pool.erase(Ids{1, 2, 3}));
  CHECK_FALSE(pool.erase(Ids{1}));
  CHECK(pool.erase(Ids{1, 2}));
  CHECK(pool.size() == 1);
  CHECK(pool.find_longest_prefix(Ids{1, 2, 3, 4, 5})->matched == 4);
  CHECK_FALSE(pool.find_longest_prefix(Ids{1, 2, 3}));
  CHECK(pool.erase(Ids{1, 2, 3, 4}));
  CHECK(pool.empty());
  CHECK(pool.stats().evicted_explicit == 2);
  pool.check_invariants();
}

TEST_CASE("clear drops everything, including pinned entries") {
  ManualClock clock;
  Pool pool(16, 300s, 0, clock);
  pool.insert_or_update({1, 2}, caches(), 0, 0, true);
  pool.insert_or_update({3, 4}, caches(), 0, 0, false);
  pool.clear();
  CHECK(pool.empty());
  CHECK(pool.stats().pinned_entries == 0);
  CHECK_FALSE(pool.find_longest_prefix(Ids{1, 2}));
  pool.insert_or_update({1, 2}, caches(), 0, 0, false);
  CHECK(pool.size() == 1);
  pool.check_invariants();
}

TEST_CASE("ids at the token type's extremes are ordinary keys") {
  ManualClock clock;
  promptcache::PromptCachePool<Layer, std::int64_t, ManualClock> pool(16, 300s, 0, clock);
  constexpr auto hi = std::numeric_limits<std::int64_t>::max();
  constexpr auto lo = std::numeric_limits<std::int64_t>::min();
  pool.insert_or_update({hi, lo, 0}, caches(1), 0, 0, false);
  pool.insert_or_update({lo, hi}, caches(2), 0, 0, false);
  pool.insert_or_update({hi, hi}, caches(3), 0, 0, false);
  CHECK(pool.find_longest_prefix(std::vector<std::int64_t>{hi, lo, 0, -1})->entry->caches[0].tag ==
        1);
  CHECK(pool.find_longest_prefix(std::vector<std::int64_t>{lo, hi})->entry->caches[0].tag == 2);
  CHECK(pool.find_longest_prefix(std::vector<std::int64_t>{hi, hi, hi})->entry->caches[0].tag == 3);
  CHECK_FALSE(pool.find_longest_prefix(std::vector<std::int64_t>{hi, lo, 1}));
  pool.check_invariants();
}

TEST_CASE("many branches at one node: splits, merges and label re-pointing") {
  ManualClock clock;
  Pool pool(100000, 300s, 0, clock);
  const Ids base = iota_ids(1, 50);
  for (std::uint32_t i = 0; i < 300; ++i) {
    Ids ids = base;
    ids.push_back(10000 + i);
    ids.push_back(i % 7);
    pool.insert_or_update(ids, caches(static_cast<int>(i)), 0, 0, false);
  }
  CHECK(pool.size() == 300);
  pool.check_invariants();
  // Remove the entries in an order that forces the shared prefix's label owner to move.
  for (std::uint32_t i = 0; i < 300; i += 2) {
    Ids ids = base;
    ids.push_back(10000 + i);
    ids.push_back(i % 7);
    REQUIRE(pool.erase(ids));
  }
  pool.check_invariants();
  for (std::uint32_t i = 1; i < 300; i += 2) {
    Ids q = base;
    q.push_back(10000 + i);
    q.push_back(i % 7);
    q.push_back(1);
    auto hit = pool.find_longest_prefix(q);
    REQUIRE(hit);
    CHECK(hit->entry->caches[0].tag == static_cast<int>(i));
  }
  // Leave two branches: the branch node's child table shrinks on the way down.
  for (std::uint32_t i = 5; i < 300; i += 2) {
    Ids ids = base;
    ids.push_back(10000 + i);
    ids.push_back(i % 7);
    REQUIRE(pool.erase(ids));
  }
  CHECK(pool.size() == 2);
  pool.check_invariants();
  const auto shrunk = pool.memory_usage();
  CHECK(shrunk.index_bytes - sizeof(Pool) < 2048);  // the pool object itself aside
  for (std::uint32_t i : {1U, 3U}) {
    Ids q = base;
    q.push_back(10000 + i);
    q.push_back(i % 7);
    CHECK(pool.find_longest_prefix(q)->entry->caches[0].tag == static_cast<int>(i));
  }
  pool.clear();
  pool.check_invariants();
}

TEST_CASE("a deep chain of one-token extensions stays consistent") {
  ManualClock clock;
  Pool pool(100000, 300s, 0, clock);
  // Pinned every 3rd so each turn leaves an anchor behind: a path with thousands of nodes.
  Ids ids;
  for (std::uint32_t i = 0; i < 3000; ++i) {
    ids.push_back(i);
    pool.insert_or_update(ids, caches(static_cast<int>(i)), 0, 0, i % 3 == 0);
  }
  CHECK(pool.size() == 1001);
  Ids q = ids;
  q.push_back(0);
  CHECK(pool.find_longest_prefix(q)->matched == 3000);
  pool.clear();  // iterative teardown of a 3000-deep path
  CHECK(pool.empty());
}

TEST_CASE("memory_usage reports the index separately from the ids") {
  ManualClock clock;
  Pool pool(1000, 300s, 0, clock);
  const Ids base = iota_ids(1, 1024);
  for (std::uint32_t i = 0; i < 64; ++i) {
    Ids ids = base;
    for (std::uint32_t k = 0; k < 256; ++k)
      ids.push_back(i * 1000 + k);
    pool.insert_or_update(ids, caches(), 0, 0, false);
  }
  const auto m = pool.memory_usage();
  CHECK(m.id_bytes == 64 * (1024 + 256) * sizeof(std::uint32_t));
  CHECK(m.index_bytes > 0);
  CHECK(m.index_bytes < m.id_bytes);  // labels point into the entries' ids: no copies
}

TEST_CASE("bad input: absent ids and unknown namespaces find nothing; pin and unpin still expire") {
  ManualClock clock;
  Pool pool(16, 300s, 0, clock);
  REQUIRE(pool.insert({1, 2, 3}, caches(1)) == R::inserted);
  const auto before = pool.stats();
  for (const Ids& ids : {Ids{}, Ids{1, 2}, Ids{1, 2, 3, 4}, Ids{9}}) {
    CHECK_FALSE(pool.pin(ids));
    CHECK_FALSE(pool.unpin(ids));
    CHECK_FALSE(pool.is_pinned(ids));
    CHECK_FALSE(pool.find_exact(ids));
    CHECK_FALSE(pool.erase(ids));
  }
  constexpr auto unknown_ns = std::numeric_limits<std::uint64_t>::max();
  CHECK_FALSE(pool.find_exact(Ids{1, 2, 3}, unknown_ns));
  CHECK_FALSE(pool.find_longest_prefix(Ids{1, 2, 3}, unknown_ns));
  CHECK_FALSE(pool.erase(Ids{1, 2, 3}, unknown_ns));
  CHECK_FALSE(pool.pin(Ids{1, 2, 3}, unknown_ns));
  CHECK(pool.erase_namespace(unknown_ns) == 0);
  CHECK(pool.size() == 1);
  CHECK_FALSE(pool.is_pinned(Ids{1, 2, 3}));
  CHECK(pool.find_exact(Ids{1, 2, 3})->caches[0].tag == 1);
  CHECK(pool.stats().evicted_explicit == before.evicted_explicit);
  pool.check_invariants();

  // Like a lookup, pin and unpin collect expired entries before they look for the ids, even
  // when there is nothing to find; erase and erase_namespace do not.
  for (int op = 0; op < 4; ++op) {
    CAPTURE(op);
    ManualClock c;
    Pool p(16, 10s, 0, c);
    REQUIRE(p.insert({1, 2}, caches(1)) == R::inserted);
    c.advance(10s);
    if (op == 0) CHECK_FALSE(p.pin(Ids{9, 9}));
    if (op == 1) CHECK_FALSE(p.unpin(Ids{9, 9}, unknown_ns));
    if (op == 2) CHECK_FALSE(p.erase(Ids{9, 9}));
    if (op == 3) CHECK(p.erase_namespace(unknown_ns) == 0);
    const bool collects = op < 2;
    CHECK(p.size() == (collects ? 0U : 1U));
    CHECK(p.stats().evicted_ttl == (collects ? 1U : 0U));
    p.check_invariants();
  }
}

TEST_CASE("bad input: an entry without layers is stored and weighs nothing") {
  ManualClock clock;
  Pool pool(16, 300s, 0, clock);
  CHECK(pool.insert({4, 5}, {}) == R::inserted);
  CHECK(pool.bytes() == 0);
  CHECK(pool.find_longest_prefix(Ids{4, 5, 6})->entry->caches.empty());
  pool.check_invariants();
}

TEST_CASE("bad input: negative TTLs expire at the next check; a clock going back expires nothing") {
  ManualClock clock;
  Pool pool(16, -1s, 0, clock);  // a negative default TTL behaves as 0
  pool.insert({1}, caches(1));
  Pool::InsertOptions keep;
  keep.ttl = std::chrono::hours(1);
  pool.insert({2}, caches(2), keep);
  CHECK(pool.evict_expired() == 1);
  CHECK_FALSE(pool.find_exact(Ids{1}));
  REQUIRE(pool.find_exact(Ids{2}));
  // The clock must not go back; if it does, entries only look younger than they are.
  clock.advance(-10s);
  CHECK(pool.evict_expired() == 0);
  CHECK(pool.find_longest_prefix(Ids{2, 3})->matched == 1);
  clock.advance(std::chrono::hours(2));
  CHECK(pool.evict_expired() == 1);
  CHECK(pool.empty());
  pool.check_invariants();
}

TEST_CASE("bad input: after the clock goes back, the pool keeps its latest time until it passes") {
  using TP = ManualClock::time_point;
  ManualClock clock;
  Pool pool(16, 10s, 0, clock);
  clock.set(TP(100s));
  pool.insert({1}, caches(1));
  clock.set(TP(50s));           // back by 50 s
  pool.insert({2}, caches(2));  // stamped at 100 s, the latest time the pool used
  CHECK(pool.erase(Ids{1}));    // [2] heads its list
  pool.check_invariants();
  clock.set(TP(109s));
  CHECK(pool.evict_expired() == 0);  // nothing expires early
  CHECK(pool.find_longest_prefix(Ids{2})->matched == 1);
  clock.set(TP(60s));  // back again: [2] was last used at 109 s
  pool.insert({3}, caches(3));
  CHECK(pool.pin(Ids{3}));
  CHECK(pool.unpin(Ids{3}));  // used at 109 s too
  pool.check_invariants();
  clock.set(TP(118s));
  CHECK(pool.evict_expired() == 0);
  clock.set(TP(119s));
  CHECK(pool.evict_expired() == 2);
  CHECK(pool.empty());
  pool.check_invariants();
}

// A pool is neither copied nor moved (hold it by unique_ptr to move it): a moved-from pool
// would need its gauges, cached root and recency state reset by hand to be valid and empty.
// Making it movable must come with that state, documented and tested.
static_assert(!std::is_copy_constructible_v<Pool> && !std::is_copy_assignable_v<Pool>);
static_assert(!std::is_move_constructible_v<Pool> && !std::is_move_assignable_v<Pool>);
