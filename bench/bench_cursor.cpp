// Consumer loop over one publisher's stream: observe + advance_to per event.
#include <promptcache/cursor.hpp>

#include <cstdint>
#include <random>
#include <variant>
#include <vector>

#include "catch.hpp"

namespace {

// A million ids, mostly contiguous, with a gap (lost events) about every 1000
// and a stale repeat (a replayed event) about every 500.
std::vector<std::uint64_t> make_stream(std::size_t n) {
  std::mt19937_64 rng(42);
  std::vector<std::uint64_t> ids;
  ids.reserve(n);
  std::uint64_t next = 0;
  while (ids.size() < n) {
    const auto roll = rng() % 1000;
    if (roll == 0) next += 1 + rng() % 8;               // gap
    if (roll < 2 && next > 2) ids.push_back(next - 2);  // stale repeat
    ids.push_back(next++);
  }
  ids.resize(n);
  return ids;
}

struct Tally {
  std::uint64_t applied = 0, stale = 0, gaps = 0;
};

}  // namespace

TEST_CASE("cursor consumer loop", "[bench][cursor]") {
  const auto stream = make_stream(1'000'000);
  BENCHMARK("observe + advance_to, 1M events") {
    promptcache::CursorState<> state;
    Tally t;
    for (const auto id : stream) {
      const auto obs = state.observe(id);
      if (std::holds_alternative<promptcache::cursor::Stale<std::uint64_t>>(obs)) {
        ++t.stale;
        continue;
      }
      if (std::holds_alternative<promptcache::cursor::Gap<std::uint64_t>>(obs)) ++t.gaps;
      ++t.applied;
      state = state.advance_to(id);
    }
    return t.applied + t.stale + t.gaps;
  };
  // The baseline: the same decisions written by hand on a bare integer, with
  // a sentinel for "nothing applied yet" (which a real id could collide with).
  BENCHMARK("baseline: hand-written integer compare, 1M events") {
    std::uint64_t last = ~std::uint64_t{0};
    bool started = false;
    Tally t;
    for (const auto id : stream) {
      if (started && id <= last) {
        ++t.stale;
        continue;
      }
      if (started && id != last + 1) ++t.gaps;
      ++t.applied;
      last = id;
      started = true;
    }
    return t.applied + t.stale + t.gaps;
  };
}
