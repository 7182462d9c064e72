// PromptCachePool with many distinct per-entry idle TTLs: entries expire exactly when their own
// TTL says, in the right order, however many TTLs are in use; LRU eviction picks the least
// recently used entry across all TTLs; and the TTL rule of an update or lineage extension
// (an explicit TTL wins, otherwise the replaced entry's TTL carries over).
#include <promptcache/manual_clock.hpp>
#include <promptcache/prompt_cache_pool.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <list>
#include <random>
#include <vector>

#include "catch.hpp"

namespace {

using namespace std::chrono_literals;
using promptcache::ManualClock;
using promptcache::MatchMode;
using Ids = std::vector<std::uint32_t>;

struct Layer {
  int tag = 0;
};
using Pool = promptcache::PromptCachePool<Layer, std::uint32_t, ManualClock>;
using Dur = ManualClock::duration;

Pool::Options options(std::size_t max_entries, Dur ttl) {
  Pool::Options o;
  o.max_entries = max_entries;
  o.ttl = ttl;
  o.min_cacheable_tokens = 0;
  return o;
}

Ids ids_of(std::uint32_t i) {
  return Ids{i, i ^ 0x5555U, 7};
}

Pool::InsertOptions with_ttl(Dur ttl) {
  Pool::InsertOptions io;
  io.ttl = ttl;
  return io;
}

}  // namespace

TEST_CASE("ttl: thousands of distinct TTLs expire one by one, each at its own time") {
  // 2000 entries with 2000 distinct TTLs (a random permutation of 1..2000 units) plus entries
  // with the default TTL and pinned ones; the clock moves one unit at a time, and lookups keep
  // refreshing random entries (moving their expiry). At every step exactly the entries idle
  // for at least their TTL are gone, no other.
  constexpr std::uint32_t kDistinct = 2000, kDefault = 100, kPinned = 20;
  ManualClock clock;
  Pool pool(options(10000, Dur(1500)), clock);
  std::mt19937 rng(7);
  std::vector<std::int64_t> ttl(kDistinct + kDefault + kPinned);
  for (std::uint32_t i = 0; i < kDistinct; ++i)
    ttl[i] = i + 1;
  std::shuffle(ttl.begin(), ttl.begin() + kDistinct, rng);
  for (std::uint32_t i = 0; i < kDistinct + kDefault + kPinned; ++i) {
    Pool::InsertOptions io;
    if (i < kDistinct) {
      io.ttl = Dur(ttl[i]);
    } else {
      ttl[i] = 1500;  // the default
    }
    io.pinned = i >= kDistinct + kDefault;
    if (io.pinned) io.ttl = Dur(1);  // pinned: never expires while pinned
    REQUIRE(pool.insert(ids_of(i), {Layer{static_cast<int>(i)}}, io) ==
            Pool::InsertResult::inserted);
  }
  pool.check_invariants();
  std::vector<std::int64_t> last_used(ttl.size(), 0);
  std::vector<bool> alive(ttl.size(), true);
  std::size_t alive_count = ttl.size();
  std::int64_t now = 0;
  while (now < 4000) {
    clock.advance(Dur(1));
    ++now;
    std::size_t due = 0;
    for (std::uint32_t i = 0; i < kDistinct + kDefault; ++i) {
      if (alive[i] && now - last_used[i] >= ttl[i]) {
        alive[i] = false;
        ++due;
      }
    }
    REQUIRE(pool.evict_expired() == due);
    alive_count -= due;
    REQUIRE(pool.size() == alive_count);
    if (now % 97 == 0) {  // the whole set, now and then
      for (std::uint32_t i = 0; i < ttl.size(); ++i)
        REQUIRE((pool.find_exact(ids_of(i)) != nullptr) == alive[i]);
      pool.check_invariants();
    }
    // Refresh a few live entries: their expiry moves to now + their own TTL.
    for (int k = 0; k < 3 && now < 1900; ++k) {
      const auto i = static_cast<std::uint32_t>(rng() % (kDistinct + kDefault));
      if (!alive[i]) continue;
      Ids q = ids_of(i);
      q.push_back(1);
      auto hit = pool.find_longest_prefix(q);
      REQUIRE(hit);
      REQUIRE(hit->entry->caches[0].tag == static_cast<int>(i));
      last_used[i] = now;
    }
  }
  CHECK(pool.size() == kPinned);  // refreshed before 1900, TTLs at most 2000: all gone by 4000
  CHECK(pool.stats().evicted_ttl == kDistinct + kDefault);
  pool.check_invariants();
}

TEST_CASE("ttl: a lookup collects every expired entry, whatever TTL it has") {
  ManualClock clock;
  Pool pool(options(1000, 1h), clock);
  for (std::uint32_t i = 0; i < 500; ++i)
    pool.insert(ids_of(i), {Layer{}}, with_ttl(Dur(1000 + i)));
  clock.advance(Dur(1000 + 249));  // entries 0..249 are due
  CHECK_FALSE(pool.find_longest_prefix(Ids{4242}));
  CHECK(pool.size() == 250);
  CHECK(pool.stats().evicted_ttl == 250);
  CHECK_FALSE(pool.find_exact(ids_of(249)));
  CHECK(pool.find_exact(ids_of(250)));
  pool.check_invariants();
}

TEST_CASE("ttl: the LRU victim is the least recently used entry across all TTLs") {
  ManualClock clock;
  Pool pool(options(200, 1h), clock);
  std::mt19937 rng(11);
  std::list<std::uint32_t> order;  // least recently used first
  for (std::uint32_t i = 0; i < 200; ++i) {
    pool.insert(ids_of(i), {Layer{}}, with_ttl(std::chrono::hours(2) + Dur(i % 150)));
    order.push_back(i);
  }
  for (int k = 0; k < 300; ++k) {  // touch in random order
    const auto i = static_cast<std::uint32_t>(rng() % 200);
    if (!pool.find_exact(ids_of(i))) continue;
    REQUIRE(pool.find_longest_prefix(ids_of(i)));
    order.remove(i);
    order.push_back(i);
  }
  for (std::uint32_t j = 1000; j < 1150; ++j) {
    // Each new entry (its own new TTL) evicts exactly the least recently used one.
    const std::uint32_t victim = order.front();
    order.pop_front();
    pool.insert(ids_of(j), {Layer{}}, with_ttl(std::chrono::hours(3) + Dur(j)));
    order.push_back(j);
    REQUIRE_FALSE(pool.find_exact(ids_of(victim)));
    REQUIRE(pool.size() == 200);
  }
  for (std::uint32_t i : order)
    CHECK(pool.find_exact(ids_of(i)));
  CHECK(pool.stats().evicted_lru == 150);
  pool.check_invariants();
}

TEST_CASE("ttl: extreme TTLs among many others") {
  ManualClock clock;
  Pool pool(options(100, 10s), clock);
  pool.insert(ids_of(1), {Layer{}}, with_ttl(Dur::max()));
  pool.insert(ids_of(2), {Layer{}}, with_ttl(Dur(-5)));
  pool.insert(ids_of(3), {Layer{}}, with_ttl(Dur::zero()));
  pool.insert(ids_of(4), {Layer{}}, with_ttl(Dur::min()));
  for (std::uint32_t i = 10; i < 60; ++i)
    pool.insert(ids_of(i), {Layer{}}, with_ttl(Dur(i)));
  pool.check_invariants();
  // Zero and negative TTLs expire at the next check, even without time passing.
  CHECK(pool.evict_expired() == 3);
  CHECK(pool.find_exact(ids_of(1)));
  clock.advance(Dur(35));  // 10..35 are due
  CHECK(pool.evict_expired() == 26);
  clock.advance(std::chrono::hours(24 * 365 * 100));
  CHECK(pool.evict_expired() == 24);
  CHECK(pool.size() == 1);  // "never" outlives a century of idleness
  CHECK(pool.find_exact(ids_of(1)));
  pool.check_invariants();
}

TEST_CASE("ttl: an extension keeps the replaced entry's TTL unless the insert sets one") {
  const auto mode = GENERATE(MatchMode::exact_prefix, MatchMode::common_prefix);
  ManualClock clock;
  auto o = options(16, 5min);
  o.match = mode;
  Pool pool(o, clock);

  SECTION("no TTL given: the lineage keeps its long TTL") {
    pool.insert({1, 2}, {Layer{}}, with_ttl(1h));
    CHECK(pool.insert({1, 2, 3}, {Layer{}}) == Pool::InsertResult::extended);
    clock.advance(30min);
    CHECK(pool.evict_expired() == 0);
    CHECK(pool.find_exact(Ids{1, 2, 3}));
    clock.advance(30min);
    CHECK(pool.evict_expired() == 1);
  }
  SECTION("no TTL given: a short TTL is kept too (not reset to the default)") {
    pool.insert({1, 2}, {Layer{}}, with_ttl(1min));
    CHECK(pool.insert({1, 2, 3}, {Layer{}}) == Pool::InsertResult::extended);
    clock.advance(1min);
    CHECK(pool.evict_expired() == 1);
  }
  SECTION("an explicit shorter TTL wins: it describes the new state") {
    pool.insert({1, 2}, {Layer{}}, with_ttl(1h));
    CHECK(pool.insert({1, 2, 3}, {Layer{}}, with_ttl(1min)) == Pool::InsertResult::extended);
    clock.advance(1min);
    CHECK(pool.evict_expired() == 1);
    CHECK(pool.empty());
  }
  SECTION("an explicit longer TTL wins") {
    pool.insert({1, 2}, {Layer{}}, with_ttl(1min));
    CHECK(pool.insert({1, 2, 3}, {Layer{}}, with_ttl(1h)) == Pool::InsertResult::extended);
    clock.advance(59min);
    CHECK(pool.evict_expired() == 0);
  }
  SECTION("an update follows the same rule") {
    pool.insert({1, 2}, {Layer{}}, with_ttl(1h));
    CHECK(pool.insert({1, 2}, {Layer{}}) == Pool::InsertResult::updated);
    clock.advance(59min);
    CHECK(pool.evict_expired() == 0);
    CHECK(pool.insert({1, 2}, {Layer{}}, with_ttl(1s)) == Pool::InsertResult::updated);
    clock.advance(1s);
    CHECK(pool.evict_expired() == 1);
  }
  SECTION("a new entry, or one that extends only a pinned anchor, gets the default") {
    Pool::InsertOptions anchor;
    anchor.pinned = true;
    anchor.ttl = 1h;
    pool.insert({1}, {Layer{}}, anchor);
    CHECK(pool.insert({1, 2}, {Layer{}}) == Pool::InsertResult::inserted);
    CHECK(pool.insert({9, 9}, {Layer{}}) == Pool::InsertResult::inserted);
    clock.advance(5min);
    CHECK(pool.evict_expired() == 2);
    CHECK(pool.find_exact(Ids{1}));
  }
  SECTION("the TTL carries over through several turns") {
    pool.insert({1, 2}, {Layer{}}, with_ttl(1h));
    Ids turn{1, 2};
    for (std::uint32_t t = 3; t < 10; ++t) {
      turn.push_back(t);
      CHECK(pool.insert(turn, {Layer{}}) == Pool::InsertResult::extended);
      clock.advance(50min);  // longer than the default, shorter than 1h
      CHECK(pool.evict_expired() == 0);
    }
    CHECK(pool.find_exact(turn));
    clock.advance(10min);
    CHECK(pool.evict_expired() == 1);
    CHECK(pool.empty());
  }
  pool.check_invariants();
}

TEST_CASE("ttl: an insert over budget collects expired entries before evicting a live one") {
  ManualClock clock;
  Pool pool(options(2, 1h), clock);
  pool.insert({1}, {Layer{1}});                // live for an hour
  pool.insert({2}, {Layer{2}}, with_ttl(0s));  // expired at once, not yet collected
  CHECK(pool.insert({3}, {Layer{3}}) == Pool::InsertResult::inserted);  // over max_entries
  CHECK(pool.find_exact(Ids{1}));
  CHECK_FALSE(pool.find_exact(Ids{2}));
  CHECK(pool.find_exact(Ids{3}));
  CHECK(pool.stats().evicted_ttl == 1);
  CHECK(pool.stats().evicted_lru == 0);
  pool.check_invariants();
  // Over budget again, with the new entry the only expired one: it goes, not a live entry.
  pool.insert({4}, {Layer{4}}, with_ttl(0s));
  CHECK_FALSE(pool.find_exact(Ids{4}));
  CHECK(pool.size() == 2);
  CHECK(pool.stats().evicted_ttl == 2);
  CHECK(pool.erase(Ids{3}));
  // Within budget, an insert leaves expired entries to lookups and evict_expired.
  pool.insert({5}, {Layer{5}}, with_ttl(0s));
  CHECK(pool.find_exact(Ids{5}));
  CHECK(pool.evict_expired() == 1);
  pool.check_invariants();
}

TEST_CASE(
    "ttl: an expired entry that no call has collected yet still counts for insert and erase") {
  const auto mode = GENERATE(MatchMode::exact_prefix, MatchMode::common_prefix);
  ManualClock clock;
  auto o = options(16, 5min);
  o.match = mode;
  Pool pool(o, clock);
  pool.insert({1, 2}, {Layer{}}, with_ttl(1min));
  pool.insert({7, 8}, {Layer{}}, with_ttl(1min));
  pool.insert({4, 5}, {Layer{}}, with_ttl(1min));
  clock.advance(2min);  // all three expired; no lookup, pin, unpin or evict_expired since
  // Equal ids: an update, and the dead entry's TTL carries over as for a live one.
  CHECK(pool.insert({1, 2}, {Layer{}}) == Pool::InsertResult::updated);
  // A longer lineage: an extension.
  CHECK(pool.insert({7, 8, 9}, {Layer{}}) == Pool::InsertResult::extended);
  CHECK(pool.stats().evicted_ttl == 0);
  CHECK(pool.erase(Ids{4, 5}));
  CHECK(pool.size() == 2);
  pool.check_invariants();
  clock.advance(1min);  // the carried 1-minute TTL, not the pool's 5 minutes
  CHECK(pool.evict_expired() == 2);
  CHECK(pool.empty());
  pool.check_invariants();
}

TEST_CASE("ttl: idle times and deadlines at the clock's limits never overflow") {
  using TP = ManualClock::time_point;
  SECTION("used just before the epoch, checked at the clock's end: idle for ages") {
    ManualClock clock;
    Pool pool(options(10, 1h), clock);
    clock.set(TP(Dur(-1)));
    pool.insert({1}, {Layer{1}});
    clock.set(TP::max());
    CHECK(pool.evict_expired() == 1);  // the idle time does not fit a signed count
    CHECK(pool.empty());
    pool.check_invariants();
  }
  SECTION("a TTL of duration::max() never expires, even at time_point::max()") {
    ManualClock clock;
    Pool pool(options(10, 1h), clock);
    pool.insert({1}, {Layer{1}}, with_ttl(Dur::max()));
    clock.set(TP::max());
    CHECK(pool.find_longest_prefix(Ids{1}));
    CHECK(pool.evict_expired() == 0);
    CHECK(pool.stats().evicted_ttl == 0);
    pool.check_invariants();
  }
  SECTION("a deadline past the clock's range is never, one exactly at its end is due") {
    ManualClock clock;
    Pool pool(options(10, 1h), clock);
    clock.set(TP(Dur(5)));
    pool.insert({1}, {Layer{1}}, with_ttl(Dur::max() - Dur(1)));  // deadline past TP::max()
    clock.set(TP::max() - Dur(10));
    pool.insert({2}, {Layer{2}}, with_ttl(Dur(10)));  // deadline exactly TP::max()
    pool.check_invariants();
    clock.set(TP::max());
    CHECK_FALSE(pool.find_longest_prefix(Ids{2, 3}));  // [2] is expired: both keys tie
    CHECK(pool.stats().evicted_ttl == 1);
    CHECK(pool.find_exact(Ids{1}));
    CHECK(pool.evict_expired() == 0);
    pool.check_invariants();
  }
}
