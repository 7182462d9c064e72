// Tests of the PromptCachePool features for real servers: common-prefix mode, keep-one-token,
// min_match_tokens, byte budget, namespaces, insert options, pin/unpin, multimodal keying
// and stats.
#include <promptcache/manual_clock.hpp>
#include <promptcache/prompt_cache_pool.hpp>

#include <chrono>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "catch.hpp"

namespace {

using namespace std::chrono_literals;
using promptcache::ManualClock;
using promptcache::MatchMode;
using Ids = std::vector<std::uint32_t>;

struct Layer {
  int tag = 0;
  std::size_t nbytes = 0;
};

// The size customization point: a functor type given as a template argument.
struct LayerBytes {
  std::size_t operator()(const Layer& l) const noexcept { return l.nbytes; }
};

using Pool = promptcache::PromptCachePool<Layer, std::uint32_t, ManualClock, LayerBytes>;
using R = Pool::InsertResult;

std::vector<Layer> layer(int tag, std::size_t nbytes = 0) {
  return {Layer{tag, nbytes}};
}

Pool::Options base_options(MatchMode mode = MatchMode::exact_prefix) {
  Pool::Options o;
  o.max_entries = 16;
  o.ttl = 300s;
  o.min_cacheable_tokens = 0;
  o.match = mode;
  return o;
}

Pool::InsertOptions opts(std::uint64_t ns = 0, bool pinned = false) {
  Pool::InsertOptions o;
  o.ns = ns;
  o.pinned = pinned;
  return o;
}

int tag_of(const std::optional<Pool::Hit>& hit) {
  return hit ? hit->entry->caches[0].tag : -1;
}

}  // namespace

// ---- common-prefix mode ---------------------------------------------------------------

TEST_CASE("common-prefix: the entry sharing the longest common prefix wins, with its trim") {
  ManualClock clock;
  Pool pool(base_options(MatchMode::common_prefix), clock);
  pool.insert({1, 2, 3, 4, 5, 6}, layer(1));
  pool.insert({1, 2, 9, 9}, layer(2));
  auto hit = pool.find_longest_prefix(Ids{1, 2, 3, 4, 7});
  REQUIRE(hit);
  CHECK(tag_of(hit) == 1);
  CHECK(hit->matched == 4);
  CHECK(hit->trim() == 2);
  // A query inside an entry: matched is the query length.
  hit = pool.find_longest_prefix(Ids{1, 2, 3});
  REQUIRE(hit);
  CHECK(hit->matched == 3);
  CHECK(hit->trim() == 3);
  CHECK_FALSE(pool.find_longest_prefix(Ids{5, 1, 2}));
  // The same pool in exact mode would have missed.
  Pool exact(base_options(), clock);
  exact.insert({1, 2, 3, 4, 5, 6}, layer(1));
  CHECK_FALSE(exact.find_longest_prefix(Ids{1, 2, 3, 4, 7}));
  pool.check_invariants();
}

TEST_CASE("common-prefix: prefer no trim, then the shortest entry, then the most recent") {
  ManualClock clock;
  Pool pool(base_options(MatchMode::common_prefix), clock);
  pool.insert({1, 2, 3, 8, 8, 8, 8}, layer(1));  // common 3 with the query, trim 4
  pool.insert({1, 2, 3, 9, 9}, layer(2));        // common 3, trim 2
  pool.insert({1, 2, 3, 7, 7}, layer(3));        // common 3, trim 2, more recent
  const Ids q{1, 2, 3, 5};
  CHECK(tag_of(pool.find_longest_prefix(q)) == 3);           // shortest, then most recent
  REQUIRE(pool.find_longest_prefix(Ids{1, 2, 3, 9, 9, 9}));  // touch entry 2
  CHECK(tag_of(pool.find_longest_prefix(q)) == 2);
  pool.insert({1, 2, 3}, layer(4));  // an entry needing no trim beats them all
  CHECK(tag_of(pool.find_longest_prefix(q)) == 4);
  CHECK(pool.find_longest_prefix(q)->trim() == 0);
  pool.check_invariants();
}

TEST_CASE("common-prefix: a removal after lookups keeps the shortest entry preferred") {
  // Lookups leave heap items stale until the next change; here the erase makes the best of a
  // stale child worse, and the shortest entry (tag 1) must still beat a longer one (tag 2).
  ManualClock clock;
  Pool pool(base_options(MatchMode::common_prefix), clock);
  pool.insert({100, 3, 7, 7}, layer(1));
  pool.insert({100, 2, 5, 5, 5}, layer(2));
  pool.insert({100, 1, 6, 6, 6, 6}, layer(3));
  pool.insert({100, 1, 7, 7, 7, 7}, layer(4));
  pool.insert({100, 1, 5}, layer(5));
  REQUIRE(pool.find_longest_prefix(Ids{100, 2, 5, 5, 5}));
  REQUIRE(pool.find_longest_prefix(Ids{100, 1, 5}));
  REQUIRE(pool.erase(Ids{100, 1, 5}));
  pool.check_invariants();
  const auto hit = pool.find_longest_prefix(Ids{100, 42});
  CHECK(tag_of(hit) == 1);
  CHECK(hit->matched == 1);
  CHECK(hit->trim() == 3);
}

TEST_CASE("common-prefix: a longer lineage retires every unpinned strict prefix") {
  ManualClock clock;
  Pool pool(base_options(MatchMode::common_prefix), clock);
  pool.insert({1, 2, 3, 4}, layer(1));
  pool.insert({1, 2}, layer(2));
  pool.insert({1}, layer(3), opts(0, true));  // pinned: kept
  REQUIRE(pool.size() == 3);
  CHECK(pool.insert({1, 2, 3, 4, 5, 6}, layer(4)) == R::extended);
  CHECK(pool.size() == 2);
  CHECK(pool.find_exact(Ids{1}));
  CHECK_FALSE(pool.find_exact(Ids{1, 2}));
  CHECK_FALSE(pool.find_exact(Ids{1, 2, 3, 4}));
  CHECK(pool.stats().superseded == 1);
  CHECK(pool.stats().extended == 1);
  // The longer entry serves what [1,2] served, by trimming.
  auto hit = pool.find_longest_prefix(Ids{1, 2, 7});
  REQUIRE(hit);
  CHECK(tag_of(hit) == 4);
  CHECK(hit->matched == 2);
  pool.check_invariants();
}

TEST_CASE("common-prefix: long entries diverging at every kind of offset") {
  // Exercises the block-wise mismatch search (1024-, 128- and 8-token strides, then single
  // tokens) at and around every block boundary.
  ManualClock clock;
  Pool pool(base_options(MatchMode::common_prefix), clock);
  Ids stored;
  for (std::uint32_t i = 0; i < 2600; ++i)
    stored.push_back(i * 7 + 1);
  pool.insert(stored, layer(1));
  std::vector<std::size_t> offsets{0,    1,    7,    8,    9,    15,   16,   17,   127,
                                   128,  129,  135,  136,  1023, 1024, 1025, 1151, 1152,
                                   1159, 1160, 2047, 2048, 2175, 2176, 2598, 2599};
  for (std::size_t at : offsets) {
    INFO("diverge at " << at);
    Ids q(stored.begin(), stored.begin() + static_cast<std::ptrdiff_t>(at));
    q.push_back(0);  // no stored token is 0
    q.push_back(5);
    auto hit = pool.find_longest_prefix(q);
    if (at == 0) {
      CHECK_FALSE(hit);
      continue;
    }
    REQUIRE(hit);
    CHECK(hit->matched == at);
    CHECK(hit->trim() == stored.size() - at);
  }
  Ids longer = stored;
  longer.push_back(3);
  CHECK(pool.find_longest_prefix(longer)->matched == stored.size());
}

TEST_CASE("common-prefix: a query leaving an edge early whose later tokens match a child") {
  // The query differs inside the shared edge {1, 2, 3, 4}, but its token after that edge is
  // the first token of a child: the hit is still the best entry below the shared edge.
  ManualClock clock;
  Pool pool(base_options(MatchMode::common_prefix), clock);
  pool.insert({1, 2, 3, 4, 10, 11}, layer(1));
  pool.insert({1, 2, 3, 4, 20, 21}, layer(2));  // same length, more recent: the best below
  auto hit = pool.find_longest_prefix(Ids{1, 2, 9, 4, 10, 11});
  REQUIRE(hit);
  CHECK(tag_of(hit) == 2);
  CHECK(hit->matched == 2);
  hit = pool.find_longest_prefix(Ids{1, 2, 3, 4, 10, 12});  // leaves inside the child's edge
  REQUIRE(hit);
  CHECK(tag_of(hit) == 1);
  CHECK(hit->matched == 5);
  CHECK_FALSE(pool.find_longest_prefix(Ids{9, 2, 3, 4, 10, 11}));
  pool.check_invariants();
}

TEST_CASE("exact-prefix: a query leaving an edge early whose later tokens match a child") {
  ManualClock clock;
  Pool pool(base_options(), clock);
  pool.insert({1, 2, 3, 4, 10, 11}, layer(2));
  pool.insert({1, 2, 3, 4, 20, 21}, layer(3));
  pool.insert({1, 2}, layer(1));  // a prefix stored after its extensions: kept beside them
  // Differs at index 3, inside the edge {3, 4}; index 4 matches the child {10, 11}.
  auto hit = pool.find_longest_prefix(Ids{1, 2, 3, 9, 10, 11, 5});
  REQUIRE(hit);
  CHECK(tag_of(hit) == 1);
  CHECK(hit->matched == 2);
  hit = pool.find_longest_prefix(Ids{1, 2, 3, 4, 10, 11, 5});
  REQUIRE(hit);
  CHECK(tag_of(hit) == 2);
  CHECK_FALSE(pool.find_longest_prefix(Ids{1, 9, 3, 4, 10, 11}));
  pool.check_invariants();
}

// ---- keep one token --------------------------------------------------------------------

TEST_CASE("keep_one_token: exact mode yields to the longest proper prefix") {
  ManualClock clock;
  auto o = base_options();
  o.keep_one_token = true;
  Pool pool(o, clock);
  pool.insert({1, 2, 3}, layer(1), opts(0, true));
  pool.insert({1, 2, 3, 4}, layer(2));
  auto hit = pool.find_longest_prefix(Ids{1, 2, 3, 4});
  REQUIRE(hit);
  CHECK(tag_of(hit) == 1);
  CHECK(hit->matched == 3);
  CHECK(pool.find_longest_prefix(Ids{1, 2, 3, 4, 5})->matched == 4);
  CHECK_FALSE(pool.find_longest_prefix(Ids{1, 2, 3}));  // only [1,2,3] itself would match
  CHECK_FALSE(pool.find_longest_prefix(Ids{1}));        // a one-token query never hits
}

TEST_CASE("keep_one_token: common-prefix mode caps the match and trims one token") {
  ManualClock clock;
  auto o = base_options(MatchMode::common_prefix);
  o.keep_one_token = true;
  Pool pool(o, clock);
  pool.insert({1, 2, 3, 4}, layer(1));
  auto hit = pool.find_longest_prefix(Ids{1, 2, 3, 4});
  REQUIRE(hit);
  CHECK(hit->matched == 3);
  CHECK(hit->trim() == 1);
}

// ---- min_match_tokens ------------------------------------------------------------------

TEST_CASE("min_match_tokens: a shorter match is a miss that refreshes nothing") {
  ManualClock clock;
  auto o = base_options(MatchMode::common_prefix);
  o.min_match_tokens = 3;
  o.max_entries = 2;
  Pool pool(o, clock);
  pool.insert({1, 2, 8, 8}, layer(1));
  pool.insert({5, 5, 5}, layer(2));
  CHECK_FALSE(pool.find_longest_prefix(Ids{1, 2, 9}));  // common 2 < 3
  CHECK(pool.find_longest_prefix(Ids{1, 2, 8, 9})->matched == 3);
  CHECK_FALSE(pool.find_longest_prefix(Ids{5, 5, 6}));  // refreshes nothing: [5,5,5] stays LRU
  pool.insert({7, 7, 7}, layer(3));
  CHECK_FALSE(pool.find_exact(Ids{5, 5, 5}));
  const auto s = pool.stats();
  CHECK(s.lookups == 3);
  CHECK(s.hits == 1);
}

// ---- byte budget -----------------------------------------------------------------------

TEST_CASE("byte budget: LRU eviction by bytes; an entry alone too large is rejected") {
  ManualClock clock;
  auto o = base_options();
  o.max_bytes = 100;
  Pool pool(o, clock);
  pool.insert({1}, {Layer{1, 30}, Layer{1, 10}});  // 40 bytes: sum over the caches
  pool.insert({2}, layer(2, 40));
  CHECK(pool.bytes() == 80);
  REQUIRE(pool.find_longest_prefix(Ids{1}));  // [2] is now LRU
  pool.insert({3}, layer(3, 30));             // 110 > 100: evict [2]
  CHECK(pool.bytes() == 70);
  CHECK_FALSE(pool.find_exact(Ids{2}));
  CHECK(pool.stats().evicted_bytes == 1);
  // Too large alone: rejected, nothing evicted or changed.
  CHECK(pool.insert({4}, layer(4, 101)) == R::rejected_too_large);
  CHECK(pool.insert({1}, layer(4, 101)) == R::rejected_too_large);  // not even an update
  CHECK(pool.find_exact(Ids{1})->caches[0].tag == 1);
  CHECK(pool.size() == 2);
  CHECK(pool.bytes() == 70);
  CHECK(pool.stats().rejected_too_large == 2);
  // Exactly the budget fits.
  CHECK(pool.insert({5}, layer(5, 100)) == R::inserted);
  CHECK(pool.bytes() == 100);
  CHECK(pool.size() == 1);
  pool.check_invariants();
}

TEST_CASE("byte budget: an entry whose layer sizes sum past SIZE_MAX is too large, not tiny") {
  ManualClock clock;
  auto o = base_options();
  o.max_bytes = 100;
  Pool pool(o, clock);
  constexpr std::size_t half = std::numeric_limits<std::size_t>::max() / 2 + 1;
  const std::vector<Layer> huge{Layer{1, half}, Layer{1, half}};             // 2^64: wraps to 0
  CHECK(pool.entry_bytes(huge) == std::numeric_limits<std::size_t>::max());  // saturates
  CHECK(pool.insert({1}, huge) == R::rejected_too_large);
  CHECK(pool.empty());
  CHECK(pool.bytes() == 0);
  pool.check_invariants();
}

TEST_CASE("byte budget: a total past SIZE_MAX is kept exactly; the gauge saturates") {
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
  SECTION("the whole range as budget: a fitting entry evicts the LRU one") {
    ManualClock clock;
    auto o = base_options();
    o.max_bytes = kMax;
    Pool pool(o, clock);
    CHECK(pool.insert({1}, layer(1, kMax)) == R::inserted);
    CHECK(pool.insert({2}, layer(2, 1)) == R::inserted);  // SIZE_MAX + 1: over budget
    CHECK_FALSE(pool.find_exact(Ids{1}));
    CHECK(pool.find_exact(Ids{2}));
    CHECK(pool.size() == 1);
    CHECK(pool.bytes() == 1);
    CHECK(pool.stats().evicted_bytes == 1);
    pool.check_invariants();
  }
  SECTION("pinned entries past SIZE_MAX: the gauge saturates, removals count down exactly") {
    ManualClock clock;
    auto o = base_options();
    o.max_bytes = kMax;
    Pool pool(o, clock);
    pool.insert({1}, layer(1, kMax), opts(0, true));
    pool.insert({2}, layer(2, kMax), opts(0, true));
    CHECK(pool.insert({3}, layer(3, 5)) == R::inserted);  // no room: evicted at once
    CHECK_FALSE(pool.find_exact(Ids{3}));
    CHECK(pool.size() == 2);
    CHECK(pool.bytes() == kMax);
    CHECK(pool.stats().bytes == kMax);
    pool.check_invariants();
    CHECK(pool.erase(Ids{1}));
    CHECK(pool.bytes() == kMax);  // exact now
    pool.insert({4}, layer(4, 7), opts(0, true));
    CHECK(pool.bytes() == kMax);  // saturated again
    CHECK(pool.erase(Ids{2}));
    CHECK(pool.bytes() == 7);
    pool.check_invariants();
  }
  SECTION("no budget: sizes past SIZE_MAX are stored, the gauge saturates") {
    ManualClock clock;
    Pool pool(base_options(), clock);  // max_bytes 0: unlimited
    CHECK(pool.insert({1}, layer(1, kMax)) == R::inserted);
    CHECK(pool.insert({2}, layer(2, kMax)) == R::inserted);
    CHECK(pool.insert({3}, layer(3, 2)) == R::inserted);
    CHECK(pool.size() == 3);
    CHECK(pool.bytes() == kMax);
    CHECK(pool.stats().evicted_bytes == 0);
    pool.check_invariants();
    CHECK(pool.erase(Ids{1}));
    CHECK(pool.erase(Ids{2}));
    CHECK(pool.bytes() == 2);
    pool.check_invariants();
  }
}

TEST_CASE("byte budget: pinned entries count but are never evicted for bytes") {
  ManualClock clock;
  auto o = base_options();
  o.max_bytes = 100;
  Pool pool(o, clock);
  pool.insert({1}, layer(1, 70), opts(0, true));
  pool.insert({2}, layer(2, 70), opts(0, true));  // pinned may exceed the budget
  CHECK(pool.bytes() == 140);
  CHECK(pool.insert({3}, layer(3, 10)) == R::inserted);  // evicted at once: no room
  CHECK_FALSE(pool.find_exact(Ids{3}));
  CHECK(pool.size() == 2);
  pool.check_invariants();
}

TEST_CASE("byte budget: max_bytes without a size functor is a configuration error") {
  promptcache::PromptCachePool<Layer>::Options o;
  o.max_bytes = 10;
  CHECK_THROWS_AS(promptcache::PromptCachePool<Layer>(o), std::invalid_argument);
  o.max_bytes = 0;
  promptcache::PromptCachePool<Layer> ok(o);
  CHECK(ok.entry_bytes({Layer{1, 99}}) == 0);
}

// ---- namespaces ------------------------------------------------------------------------

TEST_CASE("namespaces: two tenants with identical ids never share a hit") {
  ManualClock clock;
  Pool pool(base_options(), clock);
  const std::uint64_t alice = 0xA11CE, bob = 0xB0B;
  pool.insert({1, 2, 3}, layer(1), opts(alice));
  CHECK_FALSE(pool.find_longest_prefix(Ids{1, 2, 3, 4}, bob));
  CHECK_FALSE(pool.find_longest_prefix(Ids{1, 2, 3, 4}));  // namespace 0 is a tenant too
  CHECK(tag_of(pool.find_longest_prefix(Ids{1, 2, 3, 4}, alice)) == 1);
  // Bob's identical ids are a separate entry, not an update; his extension is his own.
  CHECK(pool.insert({1, 2, 3}, layer(2), opts(bob)) == R::inserted);
  CHECK(pool.insert({1, 2, 3, 4}, layer(3), opts(bob)) == R::extended);
  CHECK(tag_of(pool.find_longest_prefix(Ids{1, 2, 3, 4}, alice)) == 1);
  CHECK(tag_of(pool.find_longest_prefix(Ids{1, 2, 3, 4}, bob)) == 3);
  CHECK(pool.size() == 2);
  CHECK_FALSE(pool.erase(Ids{1, 2, 3}, bob));
  CHECK(pool.erase_namespace(alice) == 1);
  CHECK(pool.erase_namespace(alice) == 0);
  CHECK(pool.find_exact(Ids{1, 2, 3, 4}, bob));
  CHECK_FALSE(pool.find_exact(Ids{1, 2, 3}, alice));
  pool.check_invariants();
}

TEST_CASE("namespaces: common-prefix mode never crosses tenants either") {
  ManualClock clock;
  Pool pool(base_options(MatchMode::common_prefix), clock);
  pool.insert({1, 2, 3, 4}, layer(1), opts(1));
  CHECK_FALSE(pool.find_longest_prefix(Ids{1, 2, 9}, 2));
  CHECK(pool.find_longest_prefix(Ids{1, 2, 9}, 1)->matched == 2);
}

TEST_CASE("namespaces: common-prefix mode never supersedes or extends another tenant's entry") {
  ManualClock clock;
  Pool pool(base_options(MatchMode::common_prefix), clock);
  pool.insert({1, 2}, layer(1), opts(1));
  pool.insert({1, 2, 3}, layer(2), opts(1));  // tenant 1's own lineage: extended
  pool.insert({1}, layer(3), opts(1));        // a strict prefix beside it
  CHECK(pool.insert({1, 2, 3, 4}, layer(4), opts(2)) == R::inserted);  // tenant 2: new
  CHECK(pool.insert({1, 2, 3, 4, 5}, layer(5), opts(2)) == R::extended);
  CHECK(pool.find_exact(Ids{1, 2, 3}, 1)->caches[0].tag == 2);
  CHECK(pool.find_exact(Ids{1}, 1)->caches[0].tag == 3);
  CHECK(pool.stats().superseded == 0);
  CHECK(pool.size() == 3);
  pool.check_invariants();
}

TEST_CASE("namespaces: erase_namespace drops pinned entries too; budgets are pool-wide") {
  ManualClock clock;
  auto o = base_options();
  o.max_entries = 2;
  Pool pool(o, clock);
  pool.insert({1}, layer(1), opts(5, true));
  pool.insert({2}, layer(2), opts(5));
  pool.insert({3}, layer(3), opts(6));  // evicts the LRU entry of any namespace: [2]@5
  CHECK_FALSE(pool.find_exact(Ids{2}, 5));
  CHECK(pool.erase_namespace(5) == 1);
  CHECK(pool.size() == 1);
  CHECK(pool.stats().pinned_entries == 0);
  pool.check_invariants();
}

// ---- insert options --------------------------------------------------------------------

TEST_CASE("insert options: per-entry idle TTLs side by side (5 minutes and 1 hour)") {
  ManualClock clock;
  Pool pool(base_options(), clock);  // default TTL 300 s
  Pool::InsertOptions hour;
  hour.ttl = 1h;
  pool.insert({1}, layer(1));
  pool.insert({2}, layer(2), hour);
  clock.advance(10min);
  CHECK_FALSE(pool.find_longest_prefix(Ids{1}));
  REQUIRE(pool.find_longest_prefix(Ids{2}));  // refreshes its idle time
  clock.advance(59min);
  CHECK(pool.find_longest_prefix(Ids{2}));
  clock.advance(1h);
  CHECK(pool.evict_expired() == 1);
  CHECK(pool.empty());
  // An update without a TTL keeps the entry's TTL; an explicit one replaces it, even shorter.
  pool.insert({3}, layer(3), hour);
  pool.insert({3}, layer(4));
  clock.advance(6min);
  CHECK(pool.find_longest_prefix(Ids{3}));
  Pool::InsertOptions five;
  five.ttl = 5min;
  pool.insert({3}, layer(5), five);
  clock.advance(6min);
  CHECK_FALSE(pool.find_longest_prefix(Ids{3}));
}

TEST_CASE("insert options: many distinct per-entry TTLs over time cost no lasting memory") {
  // A server that passes each request's own TTL (say, a client-chosen number of seconds)
  // sees an unbounded number of distinct values; only the TTLs of stored entries may cost.
  ManualClock clock;
  auto o = base_options();
  o.max_entries = 4;
  Pool pool(o, clock);
  Pool::InsertOptions anchor;
  anchor.pinned = true;
  anchor.ttl = 7s;  // a pinned entry keeps its TTL for when it is unpinned
  pool.insert({1000000}, layer(999), anchor);
  Pool::InsertOptions io;
  for (std::uint32_t i = 0; i < 100; ++i) {
    io.ttl = std::chrono::seconds(1000 + i);
    pool.insert({i}, layer(1), io);
  }
  const std::size_t warm = pool.memory_usage().index_bytes;
  for (std::uint32_t i = 100; i < 20000; ++i) {
    io.ttl = std::chrono::seconds(1000 + i);
    pool.insert({i}, layer(1), io);
  }
  CHECK(pool.memory_usage().index_bytes <= warm);
  CHECK(pool.size() == 4);  // the pinned anchor and the 3 most recent
  pool.check_invariants();
  // The anchor's TTL survived all that churn.
  REQUIRE(pool.unpin(Ids{1000000}));
  clock.advance(6s);
  CHECK(pool.evict_expired() == 0);
  clock.advance(1s);
  CHECK(pool.evict_expired() == 1);
  CHECK_FALSE(pool.find_exact(Ids{1000000}));
  pool.check_invariants();
}

TEST_CASE("insert options: media counts and pinning are stored") {
  ManualClock clock;
  Pool pool(base_options(), clock);
  Pool::InsertOptions o;
  o.fed_images = 2;
  o.fed_audios = 1;
  o.pinned = true;
  pool.insert({1, 2}, layer(1), o);
  auto e = pool.find_exact(Ids{1, 2});
  REQUIRE(e);
  CHECK(e->fed_images == 2);
  CHECK(e->fed_audios == 1);
  CHECK(e->pinned);
}

// ---- pin / unpin -----------------------------------------------------------------------

TEST_CASE("pin/unpin: pinning protects from LRU and TTL; unpinning makes it most recent") {
  ManualClock clock;
  auto o = base_options();
  o.max_entries = 2;
  o.ttl = 10s;
  Pool pool(o, clock);
  pool.insert({1}, layer(1));
  pool.insert({2}, layer(2));
  CHECK(pool.pin(Ids{1}));
  CHECK(pool.pin(Ids{1}));  // idempotent
  CHECK_FALSE(pool.pin(Ids{9}));
  CHECK_FALSE(pool.unpin(Ids{9}));
  CHECK(pool.is_pinned(Ids{1}));
  CHECK_FALSE(pool.find_exact(Ids{1})->pinned);  // snapshots are immutable
  pool.insert({3}, layer(3));                    // evicts [2], not the pinned [1]
  CHECK(pool.find_exact(Ids{1}));
  CHECK_FALSE(pool.find_exact(Ids{2}));
  clock.advance(1h);
  CHECK(pool.evict_expired() == 1);  // [3]
  CHECK(pool.unpin(Ids{1}));         // fresh TTL from now
  CHECK_FALSE(pool.is_pinned(Ids{1}));
  clock.advance(9s);
  CHECK(pool.evict_expired() == 0);
  clock.advance(1s);
  CHECK(pool.evict_expired() == 1);
  CHECK(pool.stats().pinned_entries == 0);
  pool.check_invariants();
}

TEST_CASE("pin/unpin: an expired entry is collected, never pinned or revived") {
  ManualClock clock;
  auto o = base_options();
  o.ttl = 10s;
  Pool pool(o, clock);
  pool.insert({1}, layer(1));
  pool.insert({2}, layer(2));
  pool.insert({3}, layer(3), opts(0, true));
  clock.advance(20s);
  CHECK_FALSE(pool.pin(Ids{1}));  // expired: collected, not pinned
  CHECK_FALSE(pool.find_longest_prefix(Ids{1, 2}));
  CHECK_FALSE(pool.find_exact(Ids{2}));  // the pin collected every expired entry
  CHECK(pool.stats().evicted_ttl == 2);
  pool.insert({4}, layer(4));
  clock.advance(20s);
  CHECK_FALSE(pool.unpin(Ids{4}));  // not pinned and expired: collected too
  CHECK_FALSE(pool.find_exact(Ids{4}));
  CHECK(pool.stats().evicted_ttl == 3);
  CHECK(pool.unpin(Ids{3}));  // pinned entries never expire: unpinned with a fresh TTL
  CHECK(pool.find_longest_prefix(Ids{3})->matched == 1);
  CHECK(pool.stats().pinned_entries == 0);
  pool.check_invariants();
}

TEST_CASE("pin/unpin: unpinning enforces the budgets at once") {
  ManualClock clock;
  auto o = base_options();
  o.max_entries = 1;
  Pool pool(o, clock);
  pool.insert({1}, layer(1), opts(0, true));
  pool.insert({2}, layer(2), opts(0, true));
  pool.insert({3}, layer(3));  // evicted at once
  CHECK(pool.size() == 2);
  CHECK(pool.unpin(Ids{1}));  // now 2 entries > 1, [1] is the only unpinned one
  CHECK(pool.size() == 1);
  CHECK(pool.find_exact(Ids{2}));
}

// ---- multimodal keying -----------------------------------------------------------------

namespace {

// How a caller keys media. An image's placeholder tokens are the same for every image, so
// the pool must see something derived from the image itself: each image's placeholders are
// replaced, in the ids given to the pool (not the ones given to the model), by tokens drawn
// from the image's content hash, in a range above the vocabulary. Two prompts with the same
// text and different images then diverge at the first token of the first differing image.
// Images are told apart by the model's fixed number of placeholders per image, not by runs:
// two adjacent images form one run. (A model with a variable count per image delimits each
// image with start/end tokens; split on those instead.)
constexpr std::uint32_t kImagePlaceholder = 32000;
constexpr std::size_t kPlaceholdersPerImage = 3;
constexpr std::uint32_t kMediaKeyBase = 0x80000000U;  // above any real token id

Ids key_media(const Ids& ids, const std::vector<std::uint64_t>& image_hashes) {
  Ids keyed;
  std::size_t placeholder = 0;  // placeholders seen so far
  for (const std::uint32_t t : ids) {
    if (t != kImagePlaceholder) {
      keyed.push_back(t);
      continue;
    }
    const std::uint64_t h = image_hashes.at(placeholder / kPlaceholdersPerImage);
    const std::uint64_t k = placeholder % kPlaceholdersPerImage;  // position in the image
    ++placeholder;
    // 31 bits of (hash mixed with the position in the image) per token (splitmix64).
    std::uint64_t x = h + 0x9E3779B97F4A7C15ULL * (k + 1);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    keyed.push_back(kMediaKeyBase | static_cast<std::uint32_t>((x ^ (x >> 31)) & 0x7FFFFFFFU));
  }
  return keyed;
}

}  // namespace

TEST_CASE("multimodal: same text, different images never share a hit past the text") {
  ManualClock clock;
  Pool pool(base_options(), clock);
  const Ids prompt{1, 2, 3, kImagePlaceholder, kImagePlaceholder, kImagePlaceholder, 4, 5};
  const std::uint64_t cat = 0xCA7, dog = 0xD06;
  // Placeholders alone would make the two prompts identical.
  Pool::InsertOptions o;
  o.fed_images = 1;
  pool.insert(key_media(prompt, {cat}), layer(1), o);
  auto same_image = pool.find_longest_prefix(key_media(prompt, {cat}));
  REQUIRE(same_image);
  CHECK(same_image->matched == prompt.size());
  CHECK(same_image->entry->fed_images == 1);
  CHECK_FALSE(pool.find_longest_prefix(key_media(prompt, {dog})));
  // Two images: swapping them changes the key too.
  const Ids two{1, kImagePlaceholder, kImagePlaceholder, kImagePlaceholder,
                2, kImagePlaceholder, kImagePlaceholder, kImagePlaceholder};
  CHECK(key_media(two, {cat, dog}) != key_media(two, {dog, cat}));
  CHECK(key_media(two, {cat, dog}) == key_media(two, {cat, dog}));
  // In common-prefix mode the shared text before the image is still reusable.
  Pool common(base_options(MatchMode::common_prefix), clock);
  common.insert(key_media(prompt, {cat}), layer(1));
  auto hit = common.find_longest_prefix(key_media(prompt, {dog}));
  REQUIRE(hit);
  CHECK(hit->matched == 3);
}

// ---- stats -----------------------------------------------------------------------------

TEST_CASE("multimodal: two adjacent images are keyed by both hashes") {
  // A model with a fixed number of placeholders per image puts two images back to back as
  // one run of placeholders: keying by runs would key the pair by the first image alone.
  ManualClock clock;
  Pool pool(base_options(), clock);
  const Ids prompt{1,
                   2,
                   kImagePlaceholder,
                   kImagePlaceholder,
                   kImagePlaceholder,
                   kImagePlaceholder,
                   kImagePlaceholder,
                   kImagePlaceholder,
                   3};
  const std::uint64_t cat = 0xCA7, dog = 0xD06, cow = 0xC0;
  CHECK(key_media(prompt, {cat, dog}) != key_media(prompt, {cat, cow}));
  pool.insert(key_media(prompt, {cat, dog}), layer(1));
  CHECK(pool.find_longest_prefix(key_media(prompt, {cat, dog})));
  CHECK_FALSE(pool.find_longest_prefix(key_media(prompt, {cat, cow})));
}

TEST_CASE("stats: counters by outcome and reason, gauges, reset_stats") {
  ManualClock clock;
  auto o = base_options();
  o.max_entries = 3;
  o.min_cacheable_tokens = 2;
  o.max_bytes = 50;
  o.ttl = 10s;
  Pool pool(o, clock);
  pool.insert({1, 1}, layer(1, 10));                 // inserted
  pool.insert({1, 1, 2}, layer(2, 10));              // extended
  pool.insert({1, 1, 2}, layer(3, 10));              // updated
  pool.insert({}, layer(0));                         // rejected_empty
  pool.insert({9}, layer(0));                        // rejected_too_short
  pool.insert({8, 8}, layer(0, 60));                 // rejected_too_large
  pool.insert({7, 7}, layer(4, 10), opts(0, true));  // inserted, pinned
  pool.insert({6, 6}, layer(5, 10));                 // inserted
  pool.insert({2, 2}, layer(6, 5));                  // inserted; lru evicts [1,1,2]
  CHECK(pool.erase(Ids{2, 2}));                      // explicit
  pool.insert({5, 5}, layer(7, 35));                 // inserted; 55 bytes: evicts [6,6]
  (void)pool.find_longest_prefix(Ids{5, 5, 1});      // hit, matched 2
  (void)pool.find_longest_prefix(Ids{4});            // miss
  clock.advance(11s);
  CHECK(pool.evict_expired() == 1);  // ttl: [5,5]
  const auto s = pool.stats();
  CHECK(s.inserted == 5);
  CHECK(s.extended == 1);
  CHECK(s.updated == 1);
  CHECK(s.rejected_empty == 1);
  CHECK(s.rejected_too_short == 1);
  CHECK(s.rejected_too_large == 1);
  CHECK(s.evicted_lru == 1);
  CHECK(s.evicted_bytes == 1);
  CHECK(s.evicted_ttl == 1);
  CHECK(s.evicted_explicit == 1);
  CHECK(s.lookups == 2);
  CHECK(s.hits == 1);
  CHECK(s.query_tokens == 4);
  CHECK(s.matched_tokens == 2);
  CHECK(s.entries == 1);
  CHECK(s.pinned_entries == 1);
  CHECK(s.bytes == 10);
  pool.reset_stats();
  const auto r = pool.stats();
  CHECK(r.lookups == 0);
  CHECK(r.inserted == 0);
  CHECK(r.evicted_lru == 0);
  CHECK(r.entries == 1);  // gauges survive
  CHECK(r.pinned_entries == 1);
  CHECK(r.bytes == 10);
}
