// Tests of ManualClock: copies are handles to one shared time.
#include <promptcache/manual_clock.hpp>

#include <chrono>
#include <cstdint>
#include <limits>
#include <ratio>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "catch.hpp"

using namespace std::chrono_literals;
using promptcache::ManualClock;

namespace {

// Four threads advance copies of `clock` (which share its time) by 1 ns, 1000 times each.
void advance_from_four_threads(const ManualClock& clock) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([clock] {
      for (int i = 0; i < 1000; ++i)
        clock.advance(1ns);
    });
  }
  for (auto& t : threads)
    t.join();
}

}  // namespace

TEST_CASE("ManualClock starts at the epoch and only moves when told") {
  ManualClock c;
  CHECK(c.now().time_since_epoch() == 0ns);
  CHECK(c.now() == c.now());
  c.advance(1500ms);
  CHECK(c.now().time_since_epoch() == 1500ms);
  c.advance(-500ms);
  CHECK(c.now().time_since_epoch() == 1s);
  STATIC_REQUIRE(ManualClock::is_steady);
}

TEST_CASE("ManualClock copies share one time; separate clocks do not") {
  ManualClock a;
  ManualClock b = a;
  a.advance(5s);
  CHECK(b.now().time_since_epoch() == 5s);
  b.set(ManualClock::time_point(1s));
  CHECK(a.now().time_since_epoch() == 1s);
  ManualClock other;
  CHECK(other.now().time_since_epoch() == 0s);
  const ManualClock c = a;  // advancing through a const handle still moves the shared time
  c.advance(1min);
  CHECK(a.now().time_since_epoch() == 61s);
}

TEST_CASE("ManualClock can be advanced from several threads") {
  ManualClock clock;
  advance_from_four_threads(clock);
  CHECK(clock.now().time_since_epoch() == 4000ns);
}

TEST_CASE("ManualClock: a moved-from handle still shares the time (moving is copying)") {
  ManualClock a;
  ManualClock b = std::move(a);  // e.g. handed to a pool by std::move, then used by the test
  a.advance(2s);                 // NOLINT(bugprone-use-after-move): a handle stays valid
  CHECK(b.now().time_since_epoch() == 2s);
  ManualClock c;
  c = std::move(b);
  b.advance(1s);  // NOLINT(bugprone-use-after-move)
  CHECK(c.now().time_since_epoch() == 3s);
  CHECK(a.now() == b.now());
  STATIC_REQUIRE(std::is_nothrow_copy_constructible_v<ManualClock>);
}

namespace {

std::int64_t after_advance(ManualClock::time_point start, auto d) {
  ManualClock c;
  c.set(start);
  c.advance(d);
  return c.now().time_since_epoch().count();
}

std::int64_t from_epoch(auto d) {
  return after_advance(ManualClock::time_point{}, d);
}

}  // namespace

TEST_CASE("ManualClock: advance saturates at time_point::max() and min() for any duration type") {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  const ManualClock::time_point top = ManualClock::time_point::max();
  const ManualClock::time_point bottom = ManualClock::time_point::min();
  const ManualClock probe;
  const std::chrono::hours hour(1);
  const std::chrono::duration<double> second(1);
  STATIC_REQUIRE(noexcept(probe.advance(hour)));
  STATIC_REQUIRE(noexcept(probe.advance(second)));

  // Durations beyond nanoseconds' range (duration_cast would overflow).
  CHECK(from_epoch(std::chrono::seconds::max()) == kMax);
  CHECK(from_epoch(std::chrono::years(300)) == kMax);
  CHECK(from_epoch(std::chrono::hours::min()) == kMin);
  CHECK(from_epoch(std::chrono::duration<std::uint64_t>(
            std::numeric_limits<std::uint64_t>::max())) == kMax);
  // Sums past the top or the bottom (fetch_add would wrap).
  CHECK(after_advance(top - 5ns, 10ns) == kMax);
  CHECK(after_advance(top, 1ns) == kMax);
  CHECK(after_advance(bottom + 5ns, -10ns) == kMin);
  CHECK(after_advance(top - 1s, std::chrono::seconds::max()) == kMax);
  CHECK(after_advance(bottom + 1s, std::chrono::seconds::min()) == kMin);
  // Saturation is not sticky: the time moves on from the bound.
  CHECK(after_advance(top, -1s) == kMax - 1000000000);
  CHECK(after_advance(bottom, 1s) == kMin + 1000000000);
  // Floating point: out of range and infinities saturate, NaN moves nothing, the rest truncates
  // toward zero as duration_cast does.
  CHECK(from_epoch(std::chrono::duration<double>(1e300)) == kMax);
  CHECK(from_epoch(std::chrono::duration<double>(-1e300)) == kMin);
  CHECK(from_epoch(std::chrono::duration<float>(std::numeric_limits<float>::infinity())) == kMax);
  CHECK(from_epoch(std::chrono::duration<double, std::nano>(9223372036854775808.0)) == kMax);
  CHECK(from_epoch(std::chrono::duration<double, std::nano>(-9223372036854775808.0)) == kMin);
  CHECK(after_advance(ManualClock::time_point(7ns),
                      std::chrono::duration<double>(std::numeric_limits<double>::quiet_NaN())) ==
        7);
  CHECK(from_epoch(std::chrono::duration<double>(1.5)) == 1500000000);
  CHECK(from_epoch(std::chrono::duration<float, std::milli>(-2.25F)) == -2250000);
  CHECK(from_epoch(std::chrono::duration<double, std::nano>(-0.9)) == 0);
  // Within range the result is exact, truncated toward zero, also where count * num overflows
  // 64 bits (a period of 1/999999999989 s: duration_cast would overflow its intermediate).
  CHECK(from_epoch(std::chrono::duration<std::int64_t, std::ratio<1, 3>>(4)) == 1333333333);
  CHECK(from_epoch(std::chrono::duration<std::int64_t, std::ratio<1, 3>>(-4)) == -1333333333);
  CHECK(from_epoch(std::chrono::duration<int, std::pico>(-1500)) == -1);
  CHECK(from_epoch(std::chrono::duration<unsigned, std::milli>(5)) == 5000000);
  using Odd = std::chrono::duration<std::int64_t, std::ratio<1, 999999999989>>;
  CHECK(from_epoch(Odd(999999999988)) == 999999999);
  CHECK(from_epoch(Odd(kMax)) == 9223372036956232);
  CHECK(from_epoch(Odd(kMin)) == -9223372036956232);
  CHECK(from_epoch(Odd(12345678901234567)) == 12345678901370);
}

TEST_CASE("ManualClock: set with a coarser time point saturates like advance") {
  ManualClock c;
  c.set(std::chrono::time_point<ManualClock, std::chrono::seconds>(std::chrono::seconds::max()));
  CHECK(c.now() == ManualClock::time_point::max());
  c.set(std::chrono::time_point<ManualClock, std::chrono::hours>(std::chrono::hours::min()));
  CHECK(c.now() == ManualClock::time_point::min());
  c.set(std::chrono::time_point<ManualClock, std::chrono::minutes>(2min));
  CHECK(c.now().time_since_epoch() == 120s);
  c.set(ManualClock::time_point::max());  // a nanosecond time point is stored as it is
  CHECK(c.now() == ManualClock::time_point::max());
}

TEST_CASE("ManualClock: concurrent advances near the top all land and saturate") {
  // Each thread's advances are all applied (none lost to a race), and the sum saturates
  // instead of wrapping however they interleave.
  ManualClock clock;
  clock.set(ManualClock::time_point::max() - 3000ns);
  advance_from_four_threads(clock);
  CHECK(clock.now() == ManualClock::time_point::max());
  clock.advance(-4000ns);
  CHECK(clock.now() == ManualClock::time_point::max() - 4000ns);
}
