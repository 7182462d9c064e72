// promptcache: manual_clock.hpp
// SPDX-License-Identifier: Apache-2.0
//
// A clock that only moves when told to, for driving PromptCachePool's TTLs in
// tests and simulations without sleeping. Copies are handles to one shared
// time, so a test can hand a copy to the pool and keep advancing its own.
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
#endif
#if !defined(PROMPTCACHE_MANUAL_CLOCK_HPP) && \
    (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) >= 202002L
#define PROMPTCACHE_MANUAL_CLOCK_HPP

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <ratio>

namespace promptcache {

/// A steady clock whose time is set by hand. Copies share the same time (a
/// shared_ptr to an atomic counter), so advancing any copy advances all of
/// them; reading and advancing are thread-safe.
class ManualClock {
 public:
  using rep = std::int64_t;                                 ///< Nanosecond count.
  using period = std::nano;                                 ///< Resolution: 1 ns.
  using duration = std::chrono::nanoseconds;                ///< Clock duration.
  using time_point = std::chrono::time_point<ManualClock>;  ///< Clock time point.
  static constexpr bool is_steady = true;                   ///< Time never goes back unless set().

  /// A new, independent time starting at the epoch (0 ns). Allocates once.
  ManualClock() : now_(std::make_shared<std::atomic<rep>>(0)) {}
  /// Another handle to the same time. O(1), never allocates. There is no move constructor:
  /// moving copies, so a handle moved into a pool keeps driving its time (never null).
  ManualClock(const ManualClock&) noexcept = default;
  /// Makes this a handle to `other`'s time. O(1).
  ManualClock& operator=(const ManualClock&) noexcept = default;
  /// Drops this handle; the time lives while any handle does.
  ~ManualClock() = default;

  /// The current time of this handle's shared timeline. O(1), noexcept.
  [[nodiscard]] time_point now() const noexcept {
    return time_point(duration(now_->load(std::memory_order_acquire)));
  }

  /// Moves the shared time forward by `d` (a negative `d` moves it back). O(1).
  template <class Rep, class Period>
  void advance(std::chrono::duration<Rep, Period> d) const noexcept {
    now_->fetch_add(std::chrono::duration_cast<duration>(d).count(), std::memory_order_acq_rel);
  }

  /// Sets the shared time to `t`. O(1).
  void set(time_point t) const noexcept {
    now_->store(t.time_since_epoch().count(), std::memory_order_release);
  }

 private:
  std::shared_ptr<std::atomic<rep>> now_;
};

}  // namespace promptcache

#endif  // PROMPTCACHE_MANUAL_CLOCK_HPP
