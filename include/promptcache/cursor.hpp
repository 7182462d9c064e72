// promptcache: cursor.hpp
// SPDX-License-Identifier: Apache-2.0
//
// Gap, stale and contiguity detection for one monotonically increasing event
// stream (one per KV-event publisher). A router keeps one CursorState per
// publisher and asks it, for every incoming event id, whether the event can be
// applied, must be dropped, or reveals that events were lost.
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
#endif
#if !defined(PROMPTCACHE_CURSOR_HPP) && (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) >= 202002L
#define PROMPTCACHE_CURSOR_HPP

#include <concepts>
#include <cstdint>
#include <limits>
#include <optional>
#include <variant>

namespace promptcache {

/// The kinds of observation a CursorState can make about an incoming id.
namespace cursor {

/// The cursor had seen nothing yet: any first id is accepted as the start.
template <std::unsigned_integral Id>
struct Initial {
  Id got;  ///< The id that was observed.
  /// Memberwise equality. O(1).
  friend constexpr bool operator==(const Initial&, const Initial&) = default;
};

/// `got` is exactly one past the last applied id: apply it.
template <std::unsigned_integral Id>
struct Contiguous {
  Id got;  ///< The id that was observed.
  /// Memberwise equality. O(1).
  friend constexpr bool operator==(const Contiguous&, const Contiguous&) = default;
};

/// `got` skips ahead: ids in [expected, got) were lost, resync before applying.
template <std::unsigned_integral Id>
struct Gap {
  Id expected;  ///< The id that should have come next (last applied + 1).
  Id got;       ///< The id that was observed instead.
  /// Memberwise equality. O(1).
  friend constexpr bool operator==(const Gap&, const Gap&) = default;
};

/// `got` is not newer than the last applied id (a duplicate or a replay): drop it.
template <std::unsigned_integral Id>
struct Stale {
  Id got;                          ///< The id that was observed.
  std::optional<Id> last_applied;  ///< The cursor's last applied id.
  /// Memberwise equality. O(1).
  friend constexpr bool operator==(const Stale&, const Stale&) = default;
};

}  // namespace cursor

/// What CursorState::observe concluded about one id; exactly one alternative holds.
template <std::unsigned_integral Id = std::uint64_t>
using CursorObservation =
    std::variant<cursor::Initial<Id>, cursor::Contiguous<Id>, cursor::Gap<Id>, cursor::Stale<Id>>;

/// Position of a consumer in one publisher's event stream: either nothing
/// applied yet, or the last applied id. A value type: observe and advance_to
/// return results instead of mutating, so a caller can decide per event.
/// Every operation is O(1), constexpr and noexcept, and no id (including
/// `std::numeric_limits<Id>::max()`) makes any computation wrap.
template <std::unsigned_integral Id = std::uint64_t>
class CursorState {
 public:
  /// The state before any event: same as initial(). O(1).
  constexpr CursorState() noexcept = default;

  /// A cursor that has applied nothing; the next observe() yields Initial. O(1).
  [[nodiscard]] static constexpr CursorState initial() noexcept { return CursorState{}; }

  /// A cursor whose last applied event is `last_applied`. O(1).
  [[nodiscard]] static constexpr CursorState live(Id last_applied) noexcept {
    CursorState s;
    s.last_ = last_applied;
    return s;
  }

  /// True until the first advance_to. O(1).
  [[nodiscard]] constexpr bool is_initial() const noexcept { return !last_.has_value(); }

  /// The last applied id, or nullopt for an initial cursor. O(1).
  [[nodiscard]] constexpr std::optional<Id> last_applied_id() const noexcept { return last_; }

  /// Classifies `got` against this cursor without changing it. O(1).
  /// After `max()` nothing can be contiguous, so every later id is Stale
  /// (ids never wrap back to 0 in a live stream; a restart is a new cursor).
  [[nodiscard]] constexpr CursorObservation<Id> observe(Id got) const noexcept {
    if (!last_) return cursor::Initial<Id>{got};
    const Id last = *last_;
    if (got <= last) return cursor::Stale<Id>{got, last_};
    // Here got > last, so last < max() and last + 1 cannot wrap.
    const Id expected = static_cast<Id>(last + 1U);
    if (got == expected) return cursor::Contiguous<Id>{got};
    return cursor::Gap<Id>{expected, got};
  }

  /// The cursor after applying event `id` (whatever this cursor was). O(1).
  [[nodiscard]] constexpr CursorState advance_to(Id id) const noexcept { return live(id); }

  /// Two cursors are equal when both are initial or both hold the same id. O(1).
  friend constexpr bool operator==(const CursorState&, const CursorState&) = default;

 private:
  std::optional<Id> last_;
};

}  // namespace promptcache

#endif  // PROMPTCACHE_CURSOR_HPP
