#include <promptcache/cursor.hpp>

#include <cstdint>
#include <limits>
#include <type_traits>
#include <variant>

#include "catch.hpp"

using promptcache::CursorObservation;
using promptcache::CursorState;
namespace cursor = promptcache::cursor;

using State = CursorState<>;
using Obs = CursorObservation<>;

// Compile-time checks: the whole API is usable in constant expressions.
static_assert(std::is_same_v<State, CursorState<std::uint64_t>>);
static_assert(State{} == State::initial());
static_assert(State::initial().is_initial());
static_assert(!State::live(3).is_initial());
static_assert(State::live(3).last_applied_id() == std::optional<std::uint64_t>{3});
static_assert(!State::initial().last_applied_id().has_value());
static_assert(State::initial().observe(7) == Obs{cursor::Initial<std::uint64_t>{7}});
static_assert(State::live(1).observe(2) == Obs{cursor::Contiguous<std::uint64_t>{2}});
static_assert(State::live(1).observe(5) == Obs{cursor::Gap<std::uint64_t>{2, 5}});
static_assert(State::live(5).observe(5) == Obs{cursor::Stale<std::uint64_t>{5, 5}});
static_assert(State::initial().advance_to(4) == State::live(4));
static_assert(State::live(9).advance_to(2) == State::live(2));
static_assert(noexcept(State{}.observe(1)));
static_assert(noexcept(State{}.advance_to(1)));
static_assert(std::is_trivially_copyable_v<CursorState<std::uint32_t>>);

TEST_CASE("initial observation preserves the first id", "[cursor]") {
  CHECK(State::initial().observe(0) == Obs{cursor::Initial<std::uint64_t>{0}});
  CHECK(State::initial().observe(5) == Obs{cursor::Initial<std::uint64_t>{5}});
  CHECK(State{}.observe(std::numeric_limits<std::uint64_t>::max()) ==
        Obs{cursor::Initial<std::uint64_t>{std::numeric_limits<std::uint64_t>::max()}});
}

TEST_CASE("live observation detects contiguous, gap and stale ids", "[cursor]") {
  CHECK(State::live(10).observe(11) == Obs{cursor::Contiguous<std::uint64_t>{11}});
  CHECK(State::live(10).observe(15) == Obs{cursor::Gap<std::uint64_t>{11, 15}});
  CHECK(State::live(10).observe(10) == Obs{cursor::Stale<std::uint64_t>{10, 10}});
  CHECK(State::live(10).observe(9) == Obs{cursor::Stale<std::uint64_t>{9, 10}});
}

TEST_CASE("observe never changes the cursor; advance_to always goes live", "[cursor]") {
  const auto s = State::live(10);
  (void)s.observe(12);
  CHECK(s.last_applied_id() == std::optional<std::uint64_t>{10});
  CHECK(s.advance_to(12).last_applied_id() == std::optional<std::uint64_t>{12});
  // advance_to is the caller's decision: it may even move backwards (a resync).
  CHECK(s.advance_to(3) == State::live(3));
  CHECK(State::initial().advance_to(0) == State::live(0));
  CHECK(State::live(0) != State::initial());
}

TEST_CASE("ids at the type's maximum never wrap", "[cursor]") {
  constexpr auto max64 = std::numeric_limits<std::uint64_t>::max();
  CHECK(State::live(max64).observe(max64) == Obs{cursor::Stale<std::uint64_t>{max64, max64}});
  CHECK(State::live(max64).observe(0) == Obs{cursor::Stale<std::uint64_t>{0, max64}});
  CHECK(State::live(max64 - 1).observe(max64) == Obs{cursor::Contiguous<std::uint64_t>{max64}});
  CHECK(State::live(0).observe(max64) == Obs{cursor::Gap<std::uint64_t>{1, max64}});

  using S8 = CursorState<std::uint8_t>;
  using O8 = CursorObservation<std::uint8_t>;
  STATIC_REQUIRE(S8::live(255).observe(255) ==
                 O8{cursor::Stale<std::uint8_t>{255, std::uint8_t{255}}});
  STATIC_REQUIRE(S8::live(254).observe(255) == O8{cursor::Contiguous<std::uint8_t>{255}});
}

// The specification as plain arithmetic in a wider type, where nothing wraps.
template <class Id>
CursorObservation<Id> reference_observe(std::optional<Id> last, Id got) {
  if (!last) return cursor::Initial<Id>{got};
  const auto wide_last = static_cast<std::uint64_t>(*last);
  const auto wide_got = static_cast<std::uint64_t>(got);
  if (wide_got <= wide_last) return cursor::Stale<Id>{got, last};
  if (wide_got == wide_last + 1) return cursor::Contiguous<Id>{got};
  return cursor::Gap<Id>{static_cast<Id>(wide_last + 1), got};
}

TEST_CASE("every pair of 8-bit ids matches the reference formula", "[cursor]") {
  using Id = std::uint8_t;
  for (unsigned got = 0; got <= 255; ++got) {
    const auto g = static_cast<Id>(got);
    REQUIRE(CursorState<Id>::initial().observe(g) == reference_observe<Id>(std::nullopt, g));
    for (unsigned last = 0; last <= 255; ++last) {
      const auto l = static_cast<Id>(last);
      const auto observed = CursorState<Id>::live(l).observe(g);
      CAPTURE(last, got);
      REQUIRE(observed == reference_observe<Id>(l, g));
      REQUIRE(CursorState<Id>::live(l).advance_to(g).last_applied_id() == std::optional<Id>{g});
    }
  }
}

TEST_CASE("16-bit ids around the edges match the reference formula", "[cursor]") {
  using Id = std::uint16_t;
  constexpr unsigned max = std::numeric_limits<Id>::max();
  const unsigned edges[] = {0, 1, 2, 127, 128, 255, 256, max - 2, max - 1, max};
  for (unsigned last : edges) {
    for (unsigned got : edges) {
      CAPTURE(last, got);
      REQUIRE(CursorState<Id>::live(static_cast<Id>(last)).observe(static_cast<Id>(got)) ==
              reference_observe<Id>(static_cast<Id>(last), static_cast<Id>(got)));
    }
  }
}

TEST_CASE("a consumer loop applies contiguous events, drops stale ones, resyncs on a gap",
          "[cursor]") {
  const std::uint64_t stream[] = {4, 5, 6, 6, 5, 7, 10, 11, 11, 12};
  State state;
  std::uint64_t applied = 0, dropped = 0, resyncs = 0;
  for (std::uint64_t id : stream) {
    std::visit(
        [&](const auto& o) {
          using T = std::decay_t<decltype(o)>;
          if constexpr (std::is_same_v<T, cursor::Stale<std::uint64_t>>) {
            ++dropped;
          } else {
            if constexpr (std::is_same_v<T, cursor::Gap<std::uint64_t>>) {
              CHECK(o.expected == 8);
              ++resyncs;
            }
            ++applied;
            state = state.advance_to(id);
          }
        },
        state.observe(id));
  }
  CHECK(applied == 7);
  CHECK(dropped == 3);
  CHECK(resyncs == 1);
  CHECK(state == State::live(12));
}
