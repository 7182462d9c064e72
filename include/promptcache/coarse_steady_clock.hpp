// promptcache: coarse_steady_clock.hpp
// SPDX-License-Identifier: Apache-2.0
//
// A steady clock that trades resolution for speed, for PromptCachePool's Clock parameter.
// The pool reads its clock on every lookup and insert (TTL expiry and the hit's last-use
// time), and on a small pool with short queries std::chrono::steady_clock::now() (a
// clock_gettime(CLOCK_MONOTONIC) of ~20 ns on a VM) can be the largest single cost of a
// lookup. The pool's TTLs are minutes and its LRU order is a use counter, not a time, so a
// clock with millisecond resolution loses nothing there: on Linux this one reads
// CLOCK_MONOTONIC_COARSE (the kernel's last tick, ~3 ns, resolution one tick: 1-4 ms).
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
#endif
#if !defined(PROMPTCACHE_COARSE_STEADY_CLOCK_HPP) && \
    (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) >= 202002L
#define PROMPTCACHE_COARSE_STEADY_CLOCK_HPP

#include <chrono>
#include <cstdint>
#include <ratio>

#if defined(__linux__)
#include <time.h>
#endif

namespace promptcache {

/// A std::chrono steady clock read from CLOCK_MONOTONIC_COARSE on Linux (about 3 ns per
/// call instead of about 20 ns for steady_clock on a VM; resolution one kernel tick, 1-4 ms)
/// and from std::chrono::steady_clock elsewhere. Stateless, thread-safe, never throws.
/// Use it as `PromptCachePool<Layer, Token, CoarseSteadyClock>`. Resolution caveat: times
/// advance in whole ticks, so a TTL shorter than the tick is in effect rounded up to it (an
/// entry can live up to one tick past its TTL), and a TTL of zero still expires every
/// unpinned entry at the next check. Its time points have their own type: they do not mix
/// with steady_clock's (the epochs may differ).
class CoarseSteadyClock {
 public:
  using rep = std::int64_t;                   ///< Nanosecond count.
  using period = std::nano;                   ///< Unit: 1 ns (not the resolution).
  using duration = std::chrono::nanoseconds;  ///< Clock duration.
  using time_point = std::chrono::time_point<CoarseSteadyClock>;  ///< Clock time point.
  /// Never goes back: CLOCK_MONOTONIC_COARSE and steady_clock are both monotonic.
  static constexpr bool is_steady = true;

  /// The current time, truncated to the last kernel tick on Linux (so two reads within one
  /// tick are equal). O(1), no system call on Linux (vDSO), ~3 ns; noexcept. If the kernel
  /// does not support the coarse clock (Linux < 2.6.32), falls back to steady_clock.
  [[nodiscard]] static time_point now() noexcept {
#if defined(__linux__) && defined(CLOCK_MONOTONIC_COARSE)
    timespec ts{};
    if (::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) == 0) {
      return time_point(
          duration(static_cast<rep>(ts.tv_sec) * 1000000000 + static_cast<rep>(ts.tv_nsec)));
    }
#endif
    return time_point(
        std::chrono::duration_cast<duration>(std::chrono::steady_clock::now().time_since_epoch()));
  }

  /// The clock's resolution: one kernel tick on Linux (typically 1-4 ms), steady_clock's
  /// period elsewhere (reported as 1 ns). O(1), noexcept. TTLs below this are rounded up to it.
  [[nodiscard]] static duration resolution() noexcept {
#if defined(__linux__) && defined(CLOCK_MONOTONIC_COARSE)
    timespec ts{};
    if (::clock_getres(CLOCK_MONOTONIC_COARSE, &ts) == 0) {
      return duration(static_cast<rep>(ts.tv_sec) * 1000000000 + static_cast<rep>(ts.tv_nsec));
    }
#endif
    const duration one =
        std::chrono::duration_cast<duration>(std::chrono::steady_clock::duration(1));
    return one > duration::zero() ? one : duration(1);
  }
};

}  // namespace promptcache

#endif  // PROMPTCACHE_COARSE_STEADY_CLOCK_HPP
