// SynchronizedPromptCachePool: the operations behave like PromptCachePool's, and 8 threads
// doing random operations (a few hundred thousand in total) keep every invariant: entry and
// byte budgets, no pinned entry lost, every hit consistent with its query. Meant to run
// under ThreadSanitizer too (the tsan preset runs tests whose name contains
// "synchronized").
#include <promptcache/manual_clock.hpp>
#include <promptcache/synchronized_prompt_cache_pool.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "catch.hpp"

namespace {

using namespace std::chrono_literals;
using promptcache::ManualClock;
using promptcache::MatchMode;
using Ids = std::vector<std::uint32_t>;

// The payload carries a digest of the ids it was stored for, so a hit can be checked
// against the entry's ids (a torn or mixed-up entry would not match).
struct Layer {
  std::uint64_t digest = 0;
  std::size_t bytes = 0;
  std::shared_ptr<int> shared;  // refcounted, like real KV handles: exercises release paths
};

struct LayerBytes {
  std::size_t operator()(const Layer& l) const noexcept { return l.bytes; }
};

std::uint64_t digest(const Ids& ids) {
  std::uint64_t h = 1469598103934665603ULL;
  for (auto t : ids)
    h = (h ^ t) * 1099511628211ULL;
  return h;
}

using Pool =
    promptcache::SynchronizedPromptCachePool<Layer, std::uint32_t, ManualClock, LayerBytes>;
using R = Pool::InsertResult;

// Neither copied nor moved (it owns a mutex and a pool that cannot move).
static_assert(!std::is_copy_constructible_v<Pool> && !std::is_copy_assignable_v<Pool>);
static_assert(!std::is_move_constructible_v<Pool> && !std::is_move_assignable_v<Pool>);

std::vector<Layer> payload(const Ids& ids, std::size_t bytes) {
  return {Layer{digest(ids), bytes, std::make_shared<int>(1)}};
}

}  // namespace

TEST_CASE("synchronized pool: single-threaded behaviour matches the plain pool") {
  ManualClock clock;
  Pool pool(2, 10s, 0, clock);
  CHECK(pool.insert_or_update({1, 2, 3}, payload({1, 2, 3}, 0), 0, 0, false) == R::inserted);
  CHECK(pool.insert_or_update({1, 2, 3, 4}, payload({1, 2, 3, 4}, 0), 0, 0, false) == R::extended);
  CHECK(pool.insert_or_update({9}, payload({9}, 0), 0, 0, true) == R::inserted);
  CHECK(pool.insert_or_update({}, {}, 0, 0, false) == R::rejected_empty);
  auto hit = pool.find_longest_prefix(Ids{1, 2, 3, 4, 5});
  REQUIRE(hit);
  CHECK(hit->matched == 4);
  CHECK(pool.size() == 2);
  CHECK(pool.is_pinned(Ids{9}));
  CHECK(pool.unpin(Ids{9}));
  CHECK(pool.pin(Ids{9}));
  clock.advance(11s);
  CHECK(pool.evict_expired() == 1);
  CHECK(pool.find_exact(Ids{9}));
  CHECK(pool.stats().evicted_ttl == 1);
  pool.reset_stats();
  CHECK(pool.stats().lookups == 0);
  CHECK(pool.erase(Ids{9}));
  CHECK(pool.empty());
  CHECK(pool.bytes() == 0);
  CHECK(pool.memory_usage().id_bytes == 0);
  CHECK(pool.options().max_entries == 2);
  pool.insert({5}, payload({5}, 0), {});
  CHECK(pool.erase_namespace(0) == 1);
  pool.insert({5}, payload({5}, 0), {});
  pool.clear();
  CHECK(pool.empty());
  pool.check_invariants();
  CHECK(pool.entry_bytes(payload({1}, 7)) == 7);
  auto defaults = Pool::with_defaults();
  CHECK(defaults.options().max_entries == 16);
  CHECK(defaults.options().ttl == std::chrono::minutes(5));
  CHECK(defaults.options().min_cacheable_tokens == 8);
}

TEST_CASE("synchronized pool: a hit stays usable while other threads evict it") {
  ManualClock clock;
  Pool pool(1, 10s, 0, clock);
  pool.insert({1, 2}, payload({1, 2}, 0));
  auto hit = pool.find_longest_prefix(Ids{1, 2, 3});
  REQUIRE(hit);
  std::thread t([&] {
    for (std::uint32_t i = 10; i < 200; ++i)
      pool.insert({i}, payload({i}, 0));
  });
  t.join();
  CHECK(hit->entry->ids == Ids{1, 2});
  CHECK(hit->entry->caches[0].digest == digest(Ids{1, 2}));
}

namespace {

// A LayerCache whose destructor and size functor call back into the pool: if either ran under
// the pool's lock, the callback would deadlock (std::mutex is not recursive).
struct Reentrant;
struct ReentrantBytes {
  std::size_t operator()(const Reentrant& r) const;
};
using ReentrantPool =
    promptcache::SynchronizedPromptCachePool<Reentrant, std::uint32_t, ManualClock, ReentrantBytes>;
ReentrantPool* g_reentrant_pool = nullptr;
int g_callbacks = 0;

struct Reentrant {
  bool armed = false;
  Reentrant() = default;
  explicit Reentrant(bool a) : armed(a) {}
  Reentrant(const Reentrant&) = default;
  Reentrant(Reentrant&& o) noexcept : armed(std::exchange(o.armed, false)) {}
  Reentrant& operator=(const Reentrant&) = default;
  Reentrant& operator=(Reentrant&&) noexcept = default;
  ~Reentrant() {
    if (armed && g_reentrant_pool != nullptr) {
      (void)g_reentrant_pool->size();
      ++g_callbacks;
    }
  }
};

std::size_t ReentrantBytes::operator()(const Reentrant&) const {
  if (g_reentrant_pool != nullptr) (void)g_reentrant_pool->size();
  return 1;
}

}  // namespace

TEST_CASE("synchronized pool: size functor and LayerCache destructors run without the lock") {
  ManualClock clock;
  ReentrantPool::Options o;
  o.max_entries = 1;
  o.min_cacheable_tokens = 0;
  o.max_bytes = 10;
  o.ttl = 5s;
  ReentrantPool pool(o, clock);
  g_reentrant_pool = &pool;
  g_callbacks = 0;
  {
    std::vector<Reentrant> a;
    a.emplace_back(true);
    pool.insert({1}, std::move(a));
  }
  {
    std::vector<Reentrant> b;
    b.emplace_back(true);
    pool.insert({2}, std::move(b));  // LRU-evicts [1]: its destructor runs after unlocking
  }
  CHECK(g_callbacks == 1);
  {
    std::vector<Reentrant> c;
    c.emplace_back(true);
    pool.insert({2}, std::move(c));  // update: the replaced snapshot dies after unlocking
  }
  CHECK(g_callbacks == 2);
  clock.advance(6s);
  CHECK_FALSE(pool.find_longest_prefix(Ids{2}));  // TTL eviction inside a lookup
  CHECK(g_callbacks == 3);
  {
    std::vector<Reentrant> d;
    d.emplace_back(true);
    pool.insert({3}, std::move(d));
  }
  CHECK(pool.erase(Ids{3}));
  CHECK(g_callbacks == 4);
  g_reentrant_pool = nullptr;
}

namespace {

struct StressConfig {
  MatchMode mode;
  std::size_t max_bytes;
};

void stress(const StressConfig& cfg, int ops_per_thread) {
  constexpr int kThreads = 8;
  constexpr std::size_t kMaxEntries = 24;
  ManualClock clock;
  Pool::Options o;
  o.max_entries = kMaxEntries;
  o.ttl = 200ns;
  o.min_cacheable_tokens = 2;
  o.match = cfg.mode;
  o.max_bytes = cfg.max_bytes;
  Pool pool(o, clock);

  // Each thread owns one pinned anchor (tokens 1000 + thread); nobody erases or unpins it.
  std::vector<Ids> anchors;
  for (std::uint32_t t = 0; t < kThreads; ++t) {
    anchors.push_back({1000 + t, 7, 7, 7});
    Pool::InsertOptions pin;
    pin.pinned = true;
    REQUIRE(pool.insert(anchors.back(), payload(anchors.back(), 3), pin) == R::inserted);
  }

  std::atomic<int> failures{0};
  std::atomic<std::uint64_t> hits{0};
  auto worker = [&](std::uint32_t self) {
    std::mt19937 rng(self * 7919 + 1);
    auto rnd = [&](std::uint32_t n) { return static_cast<std::uint32_t>(rng() % n); };
    auto random_ids = [&]() {
      // Mostly lineages off some anchor (shared prefixes across threads), sometimes free.
      Ids ids;
      if (rnd(4) != 0) {
        ids = anchors[rnd(kThreads)];
      } else {
        ids.push_back(rnd(3));
      }
      for (std::uint32_t k = rnd(6); k > 0; --k)
        ids.push_back(rnd(3));
      return ids;
    };
    for (int op = 0; op < ops_per_thread; ++op) {
      const std::uint32_t what = rnd(100);
      const std::uint64_t ns = rnd(8) == 0 ? 7 : 0;  // namespace 7 holds no anchors
      if (what < 40) {
        const Ids ids = random_ids();
        Pool::InsertOptions io;
        io.ns = ns;
        io.pinned = false;
        if (rnd(4) == 0) io.ttl = std::chrono::nanoseconds(1000 + rnd(40));  // TTL lists reused
        const R r = pool.insert(ids, payload(ids, rnd(20)), io);
        if (r == R::rejected_empty) failures.fetch_add(1);
      } else if (what < 80) {
        const Ids q = random_ids();
        auto hit = pool.find_longest_prefix(q, ns);
        if (hit) {
          hits.fetch_add(1, std::memory_order_relaxed);
          const Ids& e = hit->entry->ids;
          const bool consistent =
              hit->entry->caches.size() == 1 && hit->entry->caches[0].digest == digest(e) &&
              hit->matched > 0 && hit->matched <= e.size() && hit->matched <= q.size() &&
              std::equal(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(hit->matched),
                         e.begin()) &&
              (cfg.mode == MatchMode::common_prefix || hit->matched == e.size());
          if (!consistent) failures.fetch_add(1);
        }
      } else if (what < 86) {
        clock.advance(std::chrono::nanoseconds(rnd(50)));
      } else if (what < 90) {
        Ids ids = random_ids();
        if (std::find(anchors.begin(), anchors.end(), ids) == anchors.end()) pool.erase(ids, ns);
      } else if (what < 94) {
        Ids ids = random_ids();
        if (std::find(anchors.begin(), anchors.end(), ids) == anchors.end()) {
          if (rnd(2) == 0) {
            pool.pin(ids, ns);
          } else {
            pool.unpin(ids, ns);
          }
        }
      } else if (what < 96) {
        pool.evict_expired();
      } else if (what < 97) {
        pool.erase_namespace(7);
      } else {
        const auto s = pool.stats();
        // Budgets: unpinned entries only exist within the limits.
        if (s.entries > std::max(kMaxEntries, s.pinned_entries)) failures.fetch_add(1);
        if (cfg.max_bytes != 0 && s.bytes > cfg.max_bytes && s.entries != s.pinned_entries) {
          failures.fetch_add(1);
        }
        if (s.pinned_entries < kThreads) failures.fetch_add(1);
        if (rnd(64) == 0) pool.check_invariants();
      }
      // My anchor is never lost.
      if (op % 64 == 0 && !pool.is_pinned(anchors[self])) failures.fetch_add(1);
    }
  };
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < kThreads; ++t)
    threads.emplace_back(worker, t);
  for (auto& t : threads)
    t.join();

  CHECK(failures.load() == 0);
  CHECK(hits.load() > 0);
  pool.check_invariants();
  for (const Ids& a : anchors) {
    auto e = pool.find_exact(a);
    REQUIRE(e);
    CHECK(e->caches[0].digest == digest(a));
    CHECK(pool.is_pinned(a));
  }
  const auto s = pool.stats();
  CHECK(s.entries <= std::max(kMaxEntries, s.pinned_entries));
  CHECK(s.lookups > 0);
}

}  // namespace

TEST_CASE("synchronized pool: 8-thread random-operation stress, exact-prefix mode") {
  stress({MatchMode::exact_prefix, 0}, 30000);
}

TEST_CASE("synchronized pool: 8-thread random-operation stress, common-prefix + byte budget") {
  stress({MatchMode::common_prefix, 150}, 30000);
}

TEST_CASE("synchronized pool: bad input gets the plain pool's results and stores nothing") {
  ManualClock clock;
  Pool::Options o;
  o.max_entries = 4;
  o.min_cacheable_tokens = 2;
  o.max_bytes = 100;
  Pool pool(o, clock);
  REQUIRE(pool.insert({1, 2}, payload({1, 2}, 10)) == R::inserted);
  CHECK(pool.insert({}, payload({}, 1)) == R::rejected_empty);
  CHECK(pool.insert({7}, payload({7}, 1)) == R::rejected_too_short);
  CHECK(pool.insert({3, 4}, payload({3, 4}, 101)) == R::rejected_too_large);
  CHECK_FALSE(pool.find_longest_prefix(Ids{}));
  CHECK_FALSE(pool.find_longest_prefix(Ids{1, 2}, 99));
  CHECK_FALSE(pool.erase(Ids{}));
  CHECK_FALSE(pool.pin(Ids{9, 9}));
  CHECK_FALSE(pool.unpin(Ids{9, 9}));
  CHECK(pool.erase_namespace(99) == 0);
  CHECK(pool.size() == 1);
  CHECK(pool.bytes() == 10);
  pool.check_invariants();
  // A byte budget needs a size functor: without one every entry would weigh 0.
  using Unsized = promptcache::SynchronizedPromptCachePool<Layer, std::uint32_t, ManualClock>;
  Unsized::Options u;
  u.max_bytes = 1;
  CHECK_THROWS_AS(Unsized(u, clock), std::invalid_argument);
}
