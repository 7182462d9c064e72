// Tests of ManualClock: copies are handles to one shared time.
#include <promptcache/manual_clock.hpp>

#include <chrono>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "catch.hpp"

using namespace std::chrono_literals;
using promptcache::ManualClock;

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
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([clock] {
      for (int i = 0; i < 1000; ++i)
        clock.advance(1ns);
    });
  }
  for (auto& t : threads)
    t.join();
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
