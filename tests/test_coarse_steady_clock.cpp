// Tests of CoarseSteadyClock: a std::chrono steady clock the pool can use. No sleeps and no
// timing assertions: only the clock's type requirements, monotonicity, and a pool driven by it.
#include <promptcache/coarse_steady_clock.hpp>
#include <promptcache/prompt_cache_pool.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <ratio>
#include <type_traits>
#include <utility>
#include <vector>

#include "catch.hpp"

#if defined(__linux__)
#include <time.h>
#endif

namespace {

using promptcache::CoarseSteadyClock;

struct Layer {
  int tag = 0;
};

using Pool = promptcache::PromptCachePool<Layer, std::uint32_t, CoarseSteadyClock>;
using Ids = std::vector<std::uint32_t>;

// What the pool (and std::chrono) needs of a Clock.
static_assert(CoarseSteadyClock::is_steady);
static_assert(
    std::is_same_v<CoarseSteadyClock::duration,
                   std::chrono::duration<CoarseSteadyClock::rep, CoarseSteadyClock::period>>);
static_assert(std::is_same_v<CoarseSteadyClock::time_point::clock, CoarseSteadyClock>);
static_assert(std::is_same_v<CoarseSteadyClock::time_point::duration, CoarseSteadyClock::duration>);
static_assert(std::is_signed_v<CoarseSteadyClock::rep>);
static_assert(std::is_same_v<decltype(CoarseSteadyClock::now()), CoarseSteadyClock::time_point>);
static_assert(noexcept(CoarseSteadyClock::now()));
static_assert(noexcept(std::declval<const CoarseSteadyClock&>().now()));  // as the pool calls it
static_assert(std::is_nothrow_default_constructible_v<CoarseSteadyClock>);
static_assert(std::is_nothrow_copy_constructible_v<CoarseSteadyClock>);
static_assert(std::is_trivially_copyable_v<CoarseSteadyClock>);
#if defined(__cpp_lib_chrono) && __cpp_lib_chrono >= 201907L && !defined(_LIBCPP_VERSION)
static_assert(std::chrono::is_clock_v<CoarseSteadyClock>);
#endif
// The pool's TTLs (minutes) convert to the clock's duration without a cast.
static_assert(std::is_convertible_v<std::chrono::minutes, Pool::duration>);

}  // namespace

TEST_CASE("CoarseSteadyClock is monotonic over many reads") {
  const CoarseSteadyClock clock;
  CoarseSteadyClock::time_point prev = clock.now();
  CHECK(prev.time_since_epoch() > CoarseSteadyClock::duration::zero());
  std::size_t backwards = 0;
  for (int i = 0; i < 200000; ++i) {
    const CoarseSteadyClock::time_point t = CoarseSteadyClock::now();
    if (t < prev) ++backwards;
    prev = t;
  }
  CHECK(backwards == 0);
}

namespace {

#if defined(__linux__) && defined(CLOCK_MONOTONIC_COARSE)
// The clock the header reads, straight from the kernel, in nanoseconds.
std::int64_t raw_coarse_ns() {
  timespec ts{};
  REQUIRE(::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) == 0);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + static_cast<std::int64_t>(ts.tv_nsec);
}
#endif

}  // namespace

TEST_CASE("CoarseSteadyClock counts the source clock's time in nanoseconds") {
  // A value check, not a timing one: a reading lies between two readings of the source clock
  // taken around it, which a wrong unit or a wrong epoch would not.
  for (int i = 0; i < 1000; ++i) {
#if defined(__linux__) && defined(CLOCK_MONOTONIC_COARSE)
    const std::int64_t before = raw_coarse_ns();
    const std::int64_t now = CoarseSteadyClock::now().time_since_epoch().count();
    const std::int64_t after = raw_coarse_ns();
#else
    const auto source = [] {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
    const std::int64_t before = source();
    const std::int64_t now = CoarseSteadyClock::now().time_since_epoch().count();
    const std::int64_t after = source();
#endif
    if (now < before || now > after) {
      INFO("source before " << before << " ns, CoarseSteadyClock " << now << " ns, source after "
                            << after << " ns");
      REQUIRE(before <= now);
      REQUIRE(now <= after);
    }
  }
#if defined(__linux__) && defined(CLOCK_MONOTONIC_COARSE)
  timespec res{};
  REQUIRE(::clock_getres(CLOCK_MONOTONIC_COARSE, &res) == 0);
  CHECK(CoarseSteadyClock::resolution().count() ==
        static_cast<std::int64_t>(res.tv_sec) * 1000000000 +
            static_cast<std::int64_t>(res.tv_nsec));
#endif
}

TEST_CASE("CoarseSteadyClock reports a positive resolution") {
  const CoarseSteadyClock::duration res = CoarseSteadyClock::resolution();
  CHECK(res > CoarseSteadyClock::duration::zero());
  // A coarse tick is at most a second on any sane kernel (typically 1-4 ms).
  CHECK(res <= std::chrono::seconds(1));
}

TEST_CASE("PromptCachePool works with CoarseSteadyClock") {
  Pool::Options o;
  o.max_entries = 4;
  o.ttl = std::chrono::minutes(5);
  o.min_cacheable_tokens = 2;
  Pool pool(o);

  const Ids a{1, 2, 3, 4};
  const Ids b{1, 2, 9};
  CHECK(pool.insert(a, {Layer{1}}) == Pool::InsertResult::inserted);
  CHECK(pool.insert(b, {Layer{2}}) == Pool::InsertResult::inserted);
  REQUIRE(pool.size() == 2);

  const Ids query{1, 2, 3, 4, 5};
  auto hit = pool.find_longest_prefix(query);
  REQUIRE(hit.has_value());
  CHECK(hit->matched == 4);
  CHECK(hit->entry->caches.at(0).tag == 1);
  CHECK_FALSE(pool.find_longest_prefix(Ids{7, 8, 9}).has_value());

  // Nothing is five minutes old yet.
  CHECK(pool.evict_expired() == 0);
  CHECK(pool.size() == 2);
  pool.check_invariants();
}

TEST_CASE("PromptCachePool with CoarseSteadyClock: ttl 0 expires every unpinned entry") {
  Pool::Options o;
  o.max_entries = 8;
  o.ttl = CoarseSteadyClock::duration::zero();
  o.min_cacheable_tokens = 1;
  Pool pool(o);

  CHECK(pool.insert_or_update(Ids{1, 2, 3}, {Layer{1}}, 0, 0, false) ==
        Pool::InsertResult::inserted);
  CHECK(pool.insert_or_update(Ids{4, 5, 6}, {Layer{2}}, 0, 0, true) ==
        Pool::InsertResult::inserted);
  CHECK(pool.insert_or_update(Ids{7, 8}, {Layer{3}}, 0, 0, false) == Pool::InsertResult::inserted);
  REQUIRE(pool.size() == 3);

  // Even within one coarse tick (no time has to pass), a zero TTL expires the unpinned ones.
  CHECK(pool.evict_expired() == 2);
  CHECK(pool.size() == 1);
  auto pinned = pool.find_longest_prefix(Ids{4, 5, 6, 7});
  REQUIRE(pinned.has_value());
  CHECK(pinned->matched == 3);
  CHECK_FALSE(pool.find_longest_prefix(Ids{1, 2, 3}).has_value());
  pool.check_invariants();
}

namespace {

// A LayerCache type of its own (internal linkage), so this pool's insert has one call site and
// GCC inlines it as far as an engine's single call site would be.
struct Handle {
  std::uint64_t id = 0;
};

}  // namespace

TEST_CASE("PromptCachePool with CoarseSteadyClock: inserts with default InsertOptions in a loop") {
  // Also a compile-time check: built at -O2 with -Werror (the opt preset), this inlines insert
  // far enough that GCC 12 warned of an uninitialized std::optional payload (the TTL of a
  // default InsertOptions{}); the pool silences that false positive where it arises.
  using HandlePool = promptcache::PromptCachePool<Handle, std::uint32_t, CoarseSteadyClock>;
  HandlePool::Options o;
  o.max_entries = 64;
  o.min_cacheable_tokens = 0;
  auto pool = std::make_unique<HandlePool>(o);
  for (std::uint32_t i = 0; i < 100; ++i) {
    Ids ids{1, 2, i};
    pool->insert(std::move(ids), {Handle{i}});
  }
  CHECK(pool->size() == 64);
  const auto hit = pool->find_longest_prefix(Ids{1, 2, 99, 5});
  REQUIRE(hit.has_value());
  CHECK(hit->entry->caches[0].id == 99);
  pool->check_invariants();
}
