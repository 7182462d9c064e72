// Strong exception guarantee of PromptCachePool::insert (decision 6): whatever allocation
// fails inside an insert, and whatever the size functor or the clock throws, the pool is
// unchanged; and the pool never copies a LayerCache (a throwing copy is never reached).
// Every allocation is made to fail in turn through a replaced global operator new that
// throws on the k-th call while armed.
#include <promptcache/manual_clock.hpp>
#include <promptcache/prompt_cache_pool.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <random>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "catch.hpp"
#include "support/counting_new.hpp"

namespace {

using namespace std::chrono_literals;
using promptcache::ManualClock;
using Ids = std::vector<std::uint32_t>;

bool g_copy_throws = false;
bool g_size_throws = false;

struct Layer {
  int tag = 0;
  Layer() = default;
  explicit Layer(int t) : tag(t) {}
  Layer(const Layer& o) : tag(o.tag) {
    if (g_copy_throws) throw std::runtime_error("LayerCache copy failed");
  }
  Layer& operator=(const Layer&) = default;
  Layer(Layer&&) noexcept = default;
  Layer& operator=(Layer&&) noexcept = default;
  ~Layer() = default;
};

struct LayerBytes {
  std::size_t operator()(const Layer& l) const {
    if (g_size_throws) throw std::runtime_error("size functor failed");
    return static_cast<std::size_t>(l.tag % 7);
  }
};

using Pool = promptcache::PromptCachePool<Layer, std::uint32_t, ManualClock, LayerBytes>;
using Dump = std::vector<std::tuple<Ids, std::uint64_t, int, bool>>;

// Every id sequence the scenarios below can create, in the namespaces they use.
const std::vector<Ids>& universe() {
  static const std::vector<Ids> u{{1, 2, 3},
                                  {1, 2, 3, 4, 5},
                                  {1, 2, 3, 4, 5, 6},
                                  {1, 2, 9, 9},
                                  {1, 2},
                                  {7, 7, 7},
                                  {8},
                                  {1, 2, 3, 4},
                                  {1, 2, 3, 7, 7},
                                  {5, 5, 5, 5, 5},
                                  {6, 6},
                                  {1, 2, 3, 4, 5, 6, 7}};
  return u;
}

Dump dump(const Pool& pool) {
  Dump d;
  for (std::uint64_t ns : {std::uint64_t{0}, std::uint64_t{42}}) {
    for (const Ids& ids : universe()) {
      if (auto e = pool.find_exact(ids, ns)) {
        d.emplace_back(ids, ns, e->caches.at(0).tag, pool.is_pinned(ids, ns));
      }
    }
  }
  return d;
}

void seed_pool(Pool& pool) {
  Pool::InsertOptions pinned;
  pinned.pinned = true;
  pool.insert({1, 2, 3}, {Layer(1)}, pinned);
  pool.insert({1, 2, 3, 4, 5}, {Layer(2)});
  pool.insert({1, 2, 9, 9}, {Layer(3)});
  pool.insert({7, 7, 7}, {Layer(4)});
  pool.insert({8}, {Layer(5)});
}

// Runs `scenario` with the k-th allocation failing, for k = 0, 1, ... until it succeeds;
// after each failure the pool must be exactly as before. Returns how many runs failed.
template <class Scenario>
int fail_every_allocation(Scenario scenario,
                          promptcache::MatchMode mode = promptcache::MatchMode::exact_prefix) {
  int failures = 0;
  for (long k = 0; k < 1000; ++k) {
    ManualClock clock;
    Pool::Options o;
    o.match = mode;
    o.max_entries = 5;
    o.min_cacheable_tokens = 0;
    o.max_bytes = 1000;
    Pool pool(o, clock);
    seed_pool(pool);
    const Dump before = dump(pool);
    const auto stats_before = pool.stats();
    bool threw = false;
    test_alloc::countdown = k;
    try {
      scenario(pool);
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    test_alloc::countdown = -1;
    if (!threw) return failures;
    ++failures;
    INFO("allocation " << k << " failed");
    CHECK(dump(pool) == before);
    CHECK(pool.size() == before.size());
    CHECK(pool.stats().inserted == stats_before.inserted);
    CHECK(pool.stats().evicted_lru == stats_before.evicted_lru);
    CHECK(pool.bytes() == stats_before.bytes);
    pool.check_invariants();
  }
  FAIL("scenario never succeeded");
  return failures;
}

Pool::InsertOptions in_ns(std::uint64_t ns) {
  Pool::InsertOptions o;
  o.ns = ns;
  return o;
}

}  // namespace

TEST_CASE("operator new replacement is active") {
  CHECK(test_alloc::replacement_active());
}

TEST_CASE("strong guarantee: new leaf under an existing node, with an LRU eviction") {
  const int n = fail_every_allocation([](Pool& pool) {
    Ids ids{6, 6};
    std::vector<Layer> c{Layer(9)};
    pool.insert(std::move(ids), std::move(c));
  });
  CHECK(n >= 2);
}

TEST_CASE("strong guarantee: edge split") {
  const int n = fail_every_allocation([](Pool& pool) {
    Ids ids{1, 2, 3, 7, 7};
    std::vector<Layer> c{Layer(9)};
    pool.insert(std::move(ids), std::move(c));
  });
  CHECK(n >= 3);
}

TEST_CASE("strong guarantee: entry ending inside an edge") {
  const int n = fail_every_allocation([](Pool& pool) {
    Ids ids{1, 2, 3, 4};
    std::vector<Layer> c{Layer(9)};
    pool.insert(std::move(ids), std::move(c));
  });
  CHECK(n >= 2);
}

TEST_CASE("strong guarantee: lineage extension") {
  const int n = fail_every_allocation([](Pool& pool) {
    Ids ids{1, 2, 3, 4, 5, 6, 7};
    std::vector<Layer> c{Layer(9)};
    const auto r = pool.insert(std::move(ids), std::move(c));
    test_alloc::countdown = -1;
    REQUIRE(r == Pool::InsertResult::extended);
  });
  CHECK(n >= 2);
}

TEST_CASE("strong guarantee: update of equal ids") {
  const int n = fail_every_allocation([](Pool& pool) {
    Ids ids{7, 7, 7};
    std::vector<Layer> c{Layer(9)};
    const auto r = pool.insert(std::move(ids), std::move(c));
    test_alloc::countdown = -1;
    REQUIRE(r == Pool::InsertResult::updated);
  });
  CHECK(n >= 2);
}

TEST_CASE("strong guarantee: first entry of a new namespace and a new TTL class") {
  const int n = fail_every_allocation([](Pool& pool) {
    Ids ids{5, 5, 5, 5, 5};
    std::vector<Layer> c{Layer(9)};
    Pool::InsertOptions o = in_ns(42);
    o.ttl = std::chrono::hours(1);
    pool.insert(std::move(ids), std::move(c), o);
  });
  CHECK(n >= 4);
}

TEST_CASE("strong guarantee: a failed insert leaves the pool's time alone") {
  // The pool never lets its time go back, so a failed insert that kept its later clock
  // reading would expire an entry the clock, once set back, says is still fresh.
  int failures = 0;
  for (long k = 0; k < 1000; ++k) {
    INFO("allocation " << k << " failed");
    ManualClock clock;
    Pool::Options o;
    o.max_entries = 4;
    o.min_cacheable_tokens = 0;
    o.ttl = 10ns;
    Pool pool(o, clock);
    pool.insert({1, 2}, {Layer(1)});
    clock.set(ManualClock::time_point(100ns));
    bool threw = false;
    test_alloc::countdown = k;
    try {
      pool.insert({7, 8, 9}, {Layer(2)}, in_ns(5));
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    test_alloc::countdown = -1;
    if (!threw) break;
    ++failures;
    clock.set(ManualClock::time_point(5ns));
    const auto hit = pool.find_longest_prefix(Ids{1, 2, 3});
    REQUIRE(hit.has_value());
    CHECK(hit->entry->caches.at(0).tag == 1);
    CHECK(pool.stats().evicted_ttl == 0);
    pool.check_invariants();
  }
  CHECK(failures >= 3);
}

TEST_CASE("strong guarantee in common-prefix mode: leaf, split, extension, new namespace") {
  constexpr auto common = promptcache::MatchMode::common_prefix;
  CHECK(fail_every_allocation(
            [](Pool& pool) {
              Ids ids{6, 6};
              std::vector<Layer> c{Layer(9)};
              pool.insert(std::move(ids), std::move(c));
            },
            common) >= 2);
  CHECK(fail_every_allocation(
            [](Pool& pool) {
              Ids ids{1, 2, 3, 7, 7};
              std::vector<Layer> c{Layer(9)};
              pool.insert(std::move(ids), std::move(c));
            },
            common) >= 3);
  CHECK(fail_every_allocation(
            [](Pool& pool) {
              Ids ids{1, 2, 3, 4, 5, 6, 7};
              std::vector<Layer> c{Layer(9)};
              pool.insert(std::move(ids), std::move(c));
            },
            common) >= 2);
  CHECK(fail_every_allocation(
            [](Pool& pool) {
              Ids ids{5, 5, 5, 5, 5};
              std::vector<Layer> c{Layer(9)};
              pool.insert(std::move(ids), std::move(c), in_ns(42));
            },
            common) >= 3);
}

TEST_CASE("strong guarantee: a throwing size functor changes nothing") {
  ManualClock clock;
  Pool::Options o;
  o.min_cacheable_tokens = 0;
  o.max_bytes = 1000;
  Pool pool(o, clock);
  seed_pool(pool);
  const Dump before = dump(pool);
  const auto stats_before = pool.stats();
  g_size_throws = true;
  CHECK_THROWS_AS(pool.insert({1, 2, 3, 4, 5, 6}, {Layer(3)}), std::runtime_error);
  CHECK_THROWS_AS(pool.insert({6, 6}, {Layer(1), Layer(2)}), std::runtime_error);
  g_size_throws = false;
  CHECK(dump(pool) == before);
  CHECK(pool.stats().inserted == stats_before.inserted);
  CHECK(pool.bytes() == stats_before.bytes);
  pool.check_invariants();
  CHECK(pool.insert({6, 6}, {Layer(1), Layer(2)}) == Pool::InsertResult::inserted);
}

TEST_CASE("the pool never copies a LayerCache: every operation runs with copies throwing") {
  // LayerCache copies are the engine's KV tensors: the pool only moves the caches it is
  // given into the entry and shares the entry afterwards.
  for (const auto mode :
       {promptcache::MatchMode::exact_prefix, promptcache::MatchMode::common_prefix}) {
    ManualClock clock;
    Pool::Options o;
    o.match = mode;
    o.max_entries = 3;
    o.min_cacheable_tokens = 0;
    o.max_bytes = 12;
    Pool pool(o, clock);
    auto layers = [](int a, int b) {  // built before copies throw; moved into the pool below
      std::vector<Layer> v;
      v.reserve(2);
      v.emplace_back(a);
      v.emplace_back(b);
      return v;
    };
    std::vector<Layer> l1 = layers(1, 2), l2 = layers(3, 4), l3 = layers(5, 6), l4 = layers(1, 1),
                       l5 = layers(2, 2), l6 = layers(6, 6);
    g_copy_throws = true;
    CHECK(pool.insert({1, 2, 3}, std::move(l1)) == Pool::InsertResult::inserted);
    CHECK(pool.insert({1, 2, 3, 4}, std::move(l2)) == Pool::InsertResult::extended);
    CHECK(pool.insert({1, 2, 3, 4}, std::move(l3)) == Pool::InsertResult::updated);
    CHECK(pool.insert({7}, std::move(l4)) == Pool::InsertResult::inserted);
    CHECK(pool.insert({8}, std::move(l5)) == Pool::InsertResult::inserted);
    CHECK(pool.insert({9}, std::move(l6)) == Pool::InsertResult::inserted);  // evictions
    CHECK(pool.find_longest_prefix(Ids{9, 9}));
    CHECK(pool.pin(Ids{9}));
    CHECK(pool.unpin(Ids{9}));
    const std::size_t stored = pool.size();
    clock.advance(std::chrono::hours(1));
    CHECK(pool.evict_expired() == stored);
    pool.insert({5}, layers(5, 5));
    pool.clear();
    g_copy_throws = false;
    CHECK(pool.stats().evicted_lru + pool.stats().evicted_bytes > 0);
    pool.check_invariants();
  }
}

namespace {

// A clock whose now() throws while armed (e.g. a clock that reads a time service).
bool g_clock_throws = false;

struct ThrowingClock {
  using rep = ManualClock::rep;
  using period = ManualClock::period;
  using duration = ManualClock::duration;
  using time_point = std::chrono::time_point<ThrowingClock>;
  ManualClock inner;
  time_point now() const {
    if (g_clock_throws) throw std::runtime_error("clock failed");
    return time_point(inner.now().time_since_epoch());
  }
};

using ClockPool = promptcache::PromptCachePool<Layer, std::uint32_t, ThrowingClock, LayerBytes>;

}  // namespace

TEST_CASE(
    "strong guarantee: a throwing clock changes nothing (insert, lookup, pin, unpin, expiry)") {
  for (const auto mode :
       {promptcache::MatchMode::exact_prefix, promptcache::MatchMode::common_prefix}) {
    ThrowingClock clock;
    ClockPool::Options o;
    o.match = mode;
    o.min_cacheable_tokens = 0;
    o.max_entries = 3;
    ClockPool pool(o, clock);
    ClockPool::InsertOptions pinned;
    pinned.pinned = true;
    pool.insert({1, 2, 3}, {Layer(1)}, pinned);
    pool.insert({4, 5}, {Layer(2)});
    pool.insert({6}, {Layer(3)});
    const auto before = pool.stats();

    g_clock_throws = true;
    CHECK_THROWS_AS(pool.insert({1, 2, 3, 4}, {Layer(4)}), std::runtime_error);
    CHECK_THROWS_AS(pool.find_longest_prefix(Ids{4, 5, 6}), std::runtime_error);
    CHECK_THROWS_AS(pool.evict_expired(), std::runtime_error);
    CHECK_THROWS_AS(pool.unpin(Ids{1, 2, 3}), std::runtime_error);
    CHECK_THROWS_AS(pool.pin(Ids{4, 5}), std::runtime_error);
    g_clock_throws = false;

    pool.check_invariants();
    CHECK(pool.is_pinned(Ids{1, 2, 3}));
    CHECK(pool.stats().pinned_entries == before.pinned_entries);
    CHECK(pool.size() == 3);
    // The entry that failed to unpin is still exempt from LRU pressure; the others are not.
    pool.insert({7}, {Layer(5)});
    pool.insert({8}, {Layer(6)});
    CHECK(pool.find_exact(Ids{1, 2, 3}));
    CHECK(pool.size() == 3);
    pool.check_invariants();
  }
}

namespace {

// Two pools fed the same operations must stay indistinguishable when one of them also saw an
// insert that failed (strong guarantee): same results, same stats, same LRU and TTL order.
struct Twin {
  std::uint64_t ns;
  Ids ids;
  int tag;
  bool pinned;
  int ttl_choice;
};

Pool::InsertOptions twin_options(const Twin& t) {
  Pool::InsertOptions o;
  o.ns = t.ns;
  o.pinned = t.pinned;
  if (t.ttl_choice == 1) o.ttl = std::chrono::seconds(5);
  if (t.ttl_choice == 2) o.ttl = std::chrono::seconds(50 + t.tag % 3);
  return o;
}

}  // namespace

TEST_CASE("strong guarantee, randomized: a failed insert leaves no trace in later behaviour") {
  int failures_seen = 0;
  for (const auto mode :
       {promptcache::MatchMode::exact_prefix, promptcache::MatchMode::common_prefix}) {
    for (std::uint32_t seed = 1; seed <= 12; ++seed) {
      std::mt19937 rng(seed);
      auto rnd = [&](std::uint32_t n) { return static_cast<std::uint32_t>(rng() % n); };
      auto random_twin = [&](int tag) {
        Twin t{rnd(3) == 0 ? 42U : 0U, Ids(rnd(6) + 1), tag, rnd(6) == 0, static_cast<int>(rnd(3))};
        for (auto& x : t.ids)
          x = rnd(3);
        return t;
      };
      std::vector<Twin> setup;
      for (int i = 0; i < 25; ++i)
        setup.push_back(random_twin(i + 1));
      const Twin attempt = random_twin(100);
      std::vector<Twin> after;
      for (int i = 0; i < 60; ++i)
        after.push_back(random_twin(200 + i));
      Pool::Options o;
      o.match = mode;
      o.max_entries = 8;
      o.min_cacheable_tokens = 2;
      o.max_bytes = 30;
      o.ttl = std::chrono::seconds(20);
      for (long k = 0; k < 1000; ++k) {
        INFO("mode " << static_cast<int>(mode) << " seed " << seed << " failing allocation " << k);
        ManualClock clock;
        Pool a(o, clock), b(o, clock);
        for (const Twin& t : setup) {
          a.insert(t.ids, {Layer(t.tag)}, twin_options(t));
          b.insert(t.ids, {Layer(t.tag)}, twin_options(t));
          clock.advance(std::chrono::seconds(1));
        }
        Ids ids = attempt.ids;
        std::vector<Layer> caches{Layer(attempt.tag)};
        const Pool::InsertOptions io = twin_options(attempt);
        bool threw = false;
        test_alloc::countdown = k;
        try {
          a.insert(std::move(ids), std::move(caches), io);
        } catch (const std::bad_alloc&) {
          threw = true;
        }
        test_alloc::countdown = -1;
        if (!threw) break;
        ++failures_seen;
        a.check_invariants();
        // The same future on both: every result and counter must agree.
        for (const Twin& t : after) {
          clock.advance(std::chrono::seconds(t.tag % 4));
          switch (t.tag % 4) {
            case 0:
            case 1: {
              const auto ra = a.insert(t.ids, {Layer(t.tag)}, twin_options(t));
              const auto rb = b.insert(t.ids, {Layer(t.tag)}, twin_options(t));
              REQUIRE(ra == rb);
              break;
            }
            case 2: {
              const auto ha = a.find_longest_prefix(t.ids, t.ns);
              const auto hb = b.find_longest_prefix(t.ids, t.ns);
              REQUIRE(ha.has_value() == hb.has_value());
              if (ha) {
                REQUIRE(ha->matched == hb->matched);
                REQUIRE(ha->entry->caches[0].tag == hb->entry->caches[0].tag);
              }
              break;
            }
            default:
              REQUIRE(a.evict_expired() == b.evict_expired());
              break;
          }
        }
        const auto sa = a.stats(), sb = b.stats();
        CHECK(sa.entries == sb.entries);
        CHECK(sa.bytes == sb.bytes);
        CHECK(sa.pinned_entries == sb.pinned_entries);
        CHECK(sa.evicted_lru == sb.evicted_lru);
        CHECK(sa.evicted_bytes == sb.evicted_bytes);
        CHECK(sa.evicted_ttl == sb.evicted_ttl);
        CHECK(sa.superseded == sb.superseded);
        CHECK(sa.inserted == sb.inserted);
        CHECK(sa.extended == sb.extended);
        CHECK(sa.updated == sb.updated);
        CHECK(sa.hits == sb.hits);
        a.check_invariants();
      }
    }
  }
  CHECK(failures_seen > 20);
}
