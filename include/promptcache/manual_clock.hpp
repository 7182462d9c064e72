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
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <ratio>
#include <type_traits>

namespace promptcache {

/// A steady clock whose time is set by hand. Copies share the same time (a
/// shared_ptr to an atomic counter), so advancing any copy advances all of
/// them; reading and advancing are thread-safe. Time saturates at
/// time_point::min() and max() instead of wrapping: no argument is undefined behaviour.
class ManualClock {
 public:
  using rep = std::int64_t;                                 ///< Nanosecond count.
  using period = std::nano;                                 ///< Resolution: 1 ns.
  using duration = std::chrono::nanoseconds;                ///< Clock duration.
  using time_point = std::chrono::time_point<ManualClock>;  ///< Clock time point.
  /// Declared steady for the pool's sake: time moves only when told, but a negative advance()
  /// or an earlier set() does move it back.
  static constexpr bool is_steady = true;

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

  /// Moves the shared time by `d` (a negative `d` moves it back), saturating at
  /// time_point::max() and min(). `d` of any std::chrono duration: converted to nanoseconds
  /// truncating toward zero, as duration_cast does, but beyond nanoseconds' range it saturates
  /// (an infinity too) and a NaN moves nothing. O(1): one compare-and-swap loop.
  template <class Rep, class Period>
  void advance(std::chrono::duration<Rep, Period> d) const noexcept {
    const rep delta = saturated_count(d);
    rep cur = now_->load(std::memory_order_relaxed);
    while (!now_->compare_exchange_weak(cur, saturated_add(cur, delta), std::memory_order_acq_rel,
                                        std::memory_order_relaxed)) {
    }
  }

  /// Sets the shared time to `t`. O(1).
  void set(time_point t) const noexcept {
    now_->store(t.time_since_epoch().count(), std::memory_order_release);
  }

  /// Sets the shared time to `t` of another duration, converted as advance() converts (a time
  /// beyond nanoseconds' range saturates). O(1).
  template <class Duration>
  void set(std::chrono::time_point<ManualClock, Duration> t) const noexcept {
    now_->store(saturated_count(t.time_since_epoch()), std::memory_order_release);
  }

 private:
  static constexpr rep kMax = std::numeric_limits<rep>::max();
  static constexpr rep kMin = std::numeric_limits<rep>::min();

  static constexpr rep saturated_add(rep a, rep b) noexcept {
    if (b > 0 && a > kMax - b) return kMax;
    if (b < 0 && a < kMin - b) return kMin;
    return a + b;
  }

  // floor(a * b / d) for a < d < 2^63, without a wider type: long multiplication, one bit of
  // `a` at a time, keeping (bits so far) * b == q * d + r with r < d (so 2r never overflows).
  static constexpr std::uint64_t mul_div(std::uint64_t a, std::uint64_t b,
                                         std::uint64_t d) noexcept {
    const std::uint64_t bq = b / d;
    const std::uint64_t br = b % d;
    std::uint64_t q = 0;
    std::uint64_t r = 0;
    for (int bit = 63; bit >= 0; --bit) {
      q *= 2;
      r *= 2;
      if (r >= d) {
        r -= d;
        ++q;
      }
      if (((a >> bit) & 1U) != 0) {
        q += bq;
        r += br;
        if (r >= d) {
          r -= d;
          ++q;
        }
      }
    }
    return q;
  }

  // The nanosecond count of `d`, truncated toward zero and clamped to [kMin, kMax].
  // duration_cast would multiply in intmax_t (overflowing for counts beyond nanoseconds'
  // range, and for some in range when both terms of the ratio exceed 1) or convert an
  // out-of-range floating-point value to an integer; both are undefined behaviour.
  template <class Rep, class Period>
  static rep saturated_count(std::chrono::duration<Rep, Period> d) noexcept {
    static_assert(std::is_arithmetic_v<Rep>, "ManualClock takes durations of arithmetic types");
    using ratio = std::ratio_divide<Period, std::nano>;  // ns = count * num / den, reduced
    constexpr auto num = static_cast<std::uint64_t>(ratio::num);
    constexpr auto den = static_cast<std::uint64_t>(ratio::den);
    if constexpr (std::is_floating_point_v<Rep>) {
      const long double ns = static_cast<long double>(d.count()) * static_cast<long double>(num) /
                             static_cast<long double>(den);
      constexpr long double two_63 = 9223372036854775808.0L;  // exact in any long double
      if (std::isnan(ns)) return 0;
      if (ns >= two_63) return kMax;
      if (ns <= -two_63) return kMin;
      return static_cast<rep>(ns);  // |ns| < 2^63: truncation toward zero fits
    } else {
      // count = q * den + r with |r| < den, so ns = q * num + trunc(r * num / den), each term
      // with the count's sign: the first saturates when |q| > kMax / num, the second is below num.
      using wide = std::common_type_t<Rep, std::intmax_t>;
      const auto count = static_cast<wide>(d.count());
      const wide q = count / static_cast<wide>(den);
      constexpr rep limit = kMax / static_cast<rep>(num);
      if (q > static_cast<wide>(limit)) return kMax;
      if constexpr (std::is_signed_v<wide>) {
        if (q < -static_cast<wide>(limit)) return kMin;
      }
      const rep high = static_cast<rep>(q) * static_cast<rep>(num);
      if constexpr (den == 1 || num == 1) {
        return high;  // no fractional part (den 1), or it is below one nanosecond (num 1)
      } else {
        const wide r = count % static_cast<wide>(den);
        bool negative = false;
        std::uint64_t r_abs = 0;
        if constexpr (std::is_signed_v<wide>) {
          negative = r < 0;
          r_abs = static_cast<std::uint64_t>(negative ? -r : r);
        } else {
          r_abs = static_cast<std::uint64_t>(r);
        }
        std::uint64_t low = 0;  // below num, so it fits in rep
        if constexpr (num <= std::numeric_limits<std::uint64_t>::max() / den) {
          low = r_abs * num / den;
        } else {
          low = mul_div(r_abs, num, den);
        }
        const auto signed_low = static_cast<rep>(low);
        return saturated_add(high, negative ? -signed_low : signed_low);
      }
    }
  }

  std::shared_ptr<std::atomic<rep>> now_;
};

}  // namespace promptcache

#endif  // PROMPTCACHE_MANUAL_CLOCK_HPP
