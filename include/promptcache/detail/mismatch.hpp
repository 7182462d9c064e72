// promptcache: detail/mismatch.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The index of the first differing byte of two buffers: the inner loop of a
// common-prefix lookup, which must find where a query leaves a stored edge.
// memcmp only says "differs"; this says where. On x86 it compares 64 bytes per
// step with AVX2 when the CPU has it (checked once, when the program starts) and
// with SSE2 otherwise; elsewhere 8 bytes per step. Each stage ends with one step
// that overlaps bytes already found equal instead of narrowing down to the end,
// so a short run costs a step or two rather than a chain of loops.
#pragma once
#ifndef PROMPTCACHE_DETAIL_MISMATCH_HPP
#define PROMPTCACHE_DETAIL_MISMATCH_HPP

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#define PROMPTCACHE_DETAIL_SSE2 1
#include <emmintrin.h>
#endif

// With GCC or Clang on x86, AVX2 is chosen at run time (one cached CPU check per call), so a
// portable x86-64 build still uses it on CPUs that have it. Other compilers use AVX2 only when
// the build targets it (MSVC /arch:AVX2); so does clang-cl, whose __builtin_cpu_supports needs
// a compiler-rt that MSVC-style links do not include.
#if defined(PROMPTCACHE_DETAIL_SSE2) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(_MSC_VER) && (defined(__x86_64__) || defined(__i386__))
#define PROMPTCACHE_DETAIL_AVX2 1
#define PROMPTCACHE_DETAIL_AVX2_DISPATCH 1
#elif defined(__AVX2__)
#define PROMPTCACHE_DETAIL_AVX2 1
#endif

// GCC and Clang get the AVX2 operations from vector extensions and their builtins: the
// <immintrin.h> they would otherwise need declares every x86 extension up to AVX-512, about
// half a second of parsing for each translation unit that includes this library (a fifth of
// the umbrella header's cost), for the seven operations used here.
#if defined(PROMPTCACHE_DETAIL_AVX2) && !defined(PROMPTCACHE_DETAIL_AVX2_DISPATCH)
#include <immintrin.h>
#endif

namespace promptcache::detail {

// Each stage advances from `at` over equal bytes in steps of its width and returns either the
// first differing byte (found) or where it stopped: n when it reached the end (a stage ends
// with one step that overlaps bytes already found equal, instead of a loop over narrower
// steps), else a point where fewer bytes than its width are left in all (n below the width).
// Positions travel by value: through a reference, every step would store it, since the byte
// pointers may alias it.
struct MismatchStep {
  std::size_t at;
  bool found;
};

// The index of the lowest-addressed differing byte of two words that differ: the low end on a
// little-endian host, the high end on a big-endian one.
template <class Word>
inline std::size_t first_differing_byte(Word x, Word y) noexcept {
  const Word d = static_cast<Word>(x ^ y);
  const int bit =
      std::endian::native == std::endian::little ? std::countr_zero(d) : std::countl_zero(d);
  return static_cast<std::size_t>(bit) / 8;
}

template <class Word>
inline bool words_differ(const unsigned char* a, const unsigned char* b, std::size_t i,
                         std::size_t& where) noexcept {
  Word x = 0, y = 0;
  std::memcpy(&x, a + i, sizeof(Word));
  std::memcpy(&y, b + i, sizeof(Word));
  if (x == y) return false;
  where = i + first_differing_byte(x, y);
  return true;
}

inline MismatchStep mismatch_words(const unsigned char* a, const unsigned char* b, std::size_t n,
                                   std::size_t i) noexcept {
  std::size_t at = 0;
  for (; n - i >= 8; i += 8)
    if (words_differ<std::uint64_t>(a, b, i, at)) return {at, true};
  if (i == n) return {n, false};
  if (n >= 8) {
    if (words_differ<std::uint64_t>(a, b, n - 8, at)) return {at, true};
    return {n, false};
  }
  if (n - i >= 4) {  // n < 8: at most two 4-byte steps, the second overlapping the first
    if (words_differ<std::uint32_t>(a, b, i, at)) return {at, true};
    if (words_differ<std::uint32_t>(a, b, n - 4, at)) return {at, true};
    return {n, false};
  }
  return {i, false};
}

#if defined(PROMPTCACHE_DETAIL_SSE2)
// Byte equality of a[0, 16) and b[0, 16) (0xFF where equal), and its 16-bit mask.
inline __m128i equal_bytes16(const unsigned char* a, const unsigned char* b) noexcept {
  return _mm_cmpeq_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a)),
                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
}
inline std::uint32_t mask16(__m128i eq) noexcept {
  return static_cast<std::uint32_t>(_mm_movemask_epi8(eq));
}

inline MismatchStep mismatch_sse2(const unsigned char* a, const unsigned char* b, std::size_t n,
                                  std::size_t i) noexcept {
  // The AND of four equality masks says whether 64 bytes are equal; only a differing block
  // pays for assembling the 64-bit mask whose first zero bit is the first differing byte.
  for (; n - i >= 64; i += 64) {
    const __m128i e0 = equal_bytes16(a + i, b + i);
    const __m128i e1 = equal_bytes16(a + i + 16, b + i + 16);
    const __m128i e2 = equal_bytes16(a + i + 32, b + i + 32);
    const __m128i e3 = equal_bytes16(a + i + 48, b + i + 48);
    if (mask16(_mm_and_si128(_mm_and_si128(e0, e1), _mm_and_si128(e2, e3))) != 0xFFFFU) {
      const std::uint64_t eq = std::uint64_t{mask16(e0)} | std::uint64_t{mask16(e1)} << 16 |
                               std::uint64_t{mask16(e2)} << 32 | std::uint64_t{mask16(e3)} << 48;
      i += static_cast<std::size_t>(std::countr_zero(~eq));
      return {i, true};
    }
  }
  for (; n - i >= 16; i += 16) {
    const std::uint32_t eq = mask16(equal_bytes16(a + i, b + i));
    if (eq != 0xFFFFU) return {i + static_cast<std::size_t>(std::countr_zero(~eq)), true};
  }
  if (i == n || n < 16) return {i, false};
  // The last 16 bytes, overlapping equal ones: their mask bits are set, so the first zero bit
  // is still the first difference.
  const std::uint32_t eq = mask16(equal_bytes16(a + n - 16, b + n - 16));
  if (eq != 0xFFFFU) return {n - 16 + static_cast<std::size_t>(std::countr_zero(~eq)), true};
  return {n, false};
}
#endif

#if defined(PROMPTCACHE_DETAIL_AVX2)
#if defined(PROMPTCACHE_DETAIL_AVX2_DISPATCH)
#define PROMPTCACHE_DETAIL_AVX2_TARGET [[gnu::target("avx2")]]
// 32 bytes in a 256-bit register, and the element views the compares and masks take. The
// unaligned, aliasing type is what an unaligned load or store goes through, as _mm256_loadu_si256
// does (vmovdqu).
typedef char Avx2Vec __attribute__((vector_size(32)));
typedef char Avx2VecU __attribute__((vector_size(32), aligned(1), may_alias));
typedef int Avx2Ints __attribute__((vector_size(32)));
typedef float Avx2Floats __attribute__((vector_size(32)));
PROMPTCACHE_DETAIL_AVX2_TARGET inline Avx2Vec avx2_load(const void* p) noexcept {
  return *static_cast<const Avx2VecU*>(p);
}
PROMPTCACHE_DETAIL_AVX2_TARGET inline void avx2_store(void* p, Avx2Vec v) noexcept {
  *static_cast<Avx2VecU*>(p) = v;
}
// Comparisons give 0 or -1 per element (0xFF bytes where equal).
PROMPTCACHE_DETAIL_AVX2_TARGET inline Avx2Vec avx2_eq8(Avx2Vec x, Avx2Vec y) noexcept {
  return reinterpret_cast<Avx2Vec>(x == y);
}
PROMPTCACHE_DETAIL_AVX2_TARGET inline Avx2Vec avx2_eq32(Avx2Vec x, Avx2Vec y) noexcept {
  return reinterpret_cast<Avx2Vec>(reinterpret_cast<Avx2Ints>(x) == reinterpret_cast<Avx2Ints>(y));
}
PROMPTCACHE_DETAIL_AVX2_TARGET inline Avx2Vec avx2_and(Avx2Vec x, Avx2Vec y) noexcept {
  return x & y;
}
// The top bit of each byte (32 bits), of each 4-byte element (8 bits).
PROMPTCACHE_DETAIL_AVX2_TARGET inline std::uint32_t avx2_mask8(Avx2Vec v) noexcept {
  return static_cast<std::uint32_t>(__builtin_ia32_pmovmskb256(v));
}
PROMPTCACHE_DETAIL_AVX2_TARGET inline std::uint32_t avx2_mask32(Avx2Vec v) noexcept {
  return static_cast<std::uint32_t>(__builtin_ia32_movmskps256(reinterpret_cast<Avx2Floats>(v)));
}
#else
#define PROMPTCACHE_DETAIL_AVX2_TARGET
using Avx2Vec = __m256i;
inline Avx2Vec avx2_load(const void* p) noexcept {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
inline void avx2_store(void* p, Avx2Vec v) noexcept {
  _mm256_storeu_si256(static_cast<__m256i*>(p), v);
}
inline Avx2Vec avx2_eq8(Avx2Vec x, Avx2Vec y) noexcept {
  return _mm256_cmpeq_epi8(x, y);
}
inline Avx2Vec avx2_eq32(Avx2Vec x, Avx2Vec y) noexcept {
  return _mm256_cmpeq_epi32(x, y);
}
inline Avx2Vec avx2_and(Avx2Vec x, Avx2Vec y) noexcept {
  return _mm256_and_si256(x, y);
}
inline std::uint32_t avx2_mask8(Avx2Vec v) noexcept {
  return static_cast<std::uint32_t>(_mm256_movemask_epi8(v));
}
inline std::uint32_t avx2_mask32(Avx2Vec v) noexcept {
  return static_cast<std::uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(v)));
}
#endif
// Byte equality of a[0, 32) and b[0, 32) (0xFF where equal), and its mask: bit k set when
// byte k is equal.
PROMPTCACHE_DETAIL_AVX2_TARGET inline Avx2Vec equal_bytes32(const unsigned char* a,
                                                            const unsigned char* b) noexcept {
  return avx2_eq8(avx2_load(a), avx2_load(b));
}
PROMPTCACHE_DETAIL_AVX2_TARGET inline std::uint32_t mask32_avx2(const unsigned char* a,
                                                                const unsigned char* b) noexcept {
  return avx2_mask8(equal_bytes32(a, b));
}

PROMPTCACHE_DETAIL_AVX2_TARGET inline MismatchStep mismatch_avx2(const unsigned char* a,
                                                                 const unsigned char* b,
                                                                 std::size_t n,
                                                                 std::size_t i) noexcept {
  // 128 bytes per step while they last: one branch per four compares keeps a long equal run
  // at the speed of the loads.
  for (; n - i >= 128; i += 128) {
    const Avx2Vec e0 = equal_bytes32(a + i, b + i);
    const Avx2Vec e1 = equal_bytes32(a + i + 32, b + i + 32);
    const Avx2Vec e2 = equal_bytes32(a + i + 64, b + i + 64);
    const Avx2Vec e3 = equal_bytes32(a + i + 96, b + i + 96);
    if (avx2_mask8(avx2_and(avx2_and(e0, e1), avx2_and(e2, e3))) != 0xFFFFFFFFU) break;
  }
  for (; n - i >= 64; i += 64) {
    const Avx2Vec e0 = equal_bytes32(a + i, b + i);
    const Avx2Vec e1 = equal_bytes32(a + i + 32, b + i + 32);
    if (avx2_mask8(avx2_and(e0, e1)) != 0xFFFFFFFFU) {
      const std::uint64_t eq = std::uint64_t{avx2_mask8(e0)} | std::uint64_t{avx2_mask8(e1)} << 32;
      i += static_cast<std::size_t>(std::countr_zero(~eq));
      return {i, true};
    }
  }
  if (i == n || n < 32) return {i, false};
  if (n - i > 32) {  // 33 to 63 bytes left: one step, then the overlapping last one
    const std::uint32_t eq = mask32_avx2(a + i, b + i);
    if (eq != 0xFFFFFFFFU) return {i + static_cast<std::size_t>(std::countr_zero(~eq)), true};
  }
  // The last 32 bytes, overlapping equal ones (their mask bits are set).
  const std::uint32_t eq = mask32_avx2(a + n - 32, b + n - 32);
  if (eq != 0xFFFFFFFFU) return {n - 32 + static_cast<std::size_t>(std::countr_zero(~eq)), true};
  return {n, false};
}

// The 8 elements of p from element e (unaligned).
PROMPTCACHE_DETAIL_AVX2_TARGET inline Avx2Vec load8_avx2(const std::uint32_t* p,
                                                         std::size_t e) noexcept {
  return avx2_load(p + e);
}
PROMPTCACHE_DETAIL_AVX2_TARGET inline void store8_avx2(std::uint32_t* p, std::size_t e,
                                                       Avx2Vec v) noexcept {
  avx2_store(p + e, v);
}

// The fused compare and copy of mismatch_copy() for 4-byte elements: one pass that reads a, b
// and src together and writes dst, instead of a compare over a and b followed by a copy that
// starts a third stream cold. A step stores its ids only once its tokens are known equal, so
// dst past the first difference is never written. Requires n >= 8.
PROMPTCACHE_DETAIL_AVX2_TARGET inline std::size_t mismatch_copy32_avx2(const void* pa,
                                                                       const void* pb,
                                                                       const void* psrc, void* pdst,
                                                                       std::size_t n) noexcept {
  const auto* a = static_cast<const std::uint32_t*>(pa);
  const auto* b = static_cast<const std::uint32_t*>(pb);
  const auto* src = static_cast<const std::uint32_t*>(psrc);
  auto* dst = static_cast<std::uint32_t*>(pdst);
  std::size_t i = 0;
  // 32 elements (128 token bytes) per step while they last: one branch per four compares.
  for (; n - i >= 32; i += 32) {
    const Avx2Vec e0 = avx2_eq32(load8_avx2(a, i), load8_avx2(b, i));
    const Avx2Vec e1 = avx2_eq32(load8_avx2(a, i + 8), load8_avx2(b, i + 8));
    const Avx2Vec e2 = avx2_eq32(load8_avx2(a, i + 16), load8_avx2(b, i + 16));
    const Avx2Vec e3 = avx2_eq32(load8_avx2(a, i + 24), load8_avx2(b, i + 24));
    if (avx2_mask8(avx2_and(avx2_and(e0, e1), avx2_and(e2, e3))) != 0xFFFFFFFFU) break;
    store8_avx2(dst, i, load8_avx2(src, i));
    store8_avx2(dst, i + 8, load8_avx2(src, i + 8));
    store8_avx2(dst, i + 16, load8_avx2(src, i + 16));
    store8_avx2(dst, i + 24, load8_avx2(src, i + 24));
  }
  for (; n - i >= 8; i += 8) {
    const std::uint32_t eq = avx2_mask32(avx2_eq32(load8_avx2(a, i), load8_avx2(b, i)));
    if (eq != 0xFFU) {
      const std::size_t end = i + static_cast<std::size_t>(std::countr_zero(~eq));
      std::memcpy(dst + i, src + i, (end - i) * sizeof(std::uint32_t));
      return end;
    }
    store8_avx2(dst, i, load8_avx2(src, i));
  }
  if (i == n) return n;
  // The last 8 elements, overlapping the equal ones below i: their lanes are taken as equal
  // without their compare (dst may be b's own storage, a caller matching into the query's
  // buffer, so they may already hold ids), and their ids are stored again with the same values.
  const std::size_t j = n - 8;
  const std::uint32_t eq =
      avx2_mask32(avx2_eq32(load8_avx2(a, j), load8_avx2(b, j))) | ((1U << (i - j)) - 1U);
  if (eq != 0xFFU) {
    const std::size_t end = j + static_cast<std::size_t>(std::countr_zero(~eq));
    std::memcpy(dst + i, src + i, (end - i) * sizeof(std::uint32_t));
    return end;
  }
  store8_avx2(dst, j, load8_avx2(src, j));
  return n;
}
#undef PROMPTCACHE_DETAIL_AVX2_TARGET
#endif

#if defined(PROMPTCACHE_DETAIL_AVX2_DISPATCH)
// Asks the CPU (about as costly as a cache miss): for the tests, and to set cpu_avx2.
inline bool cpu_has_avx2() noexcept {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") != 0;
}
// Set when the program starts, so the dispatch costs a load instead of the guard check of a
// function-local static. Read before then (by a static initializer) it is false, which only
// means the SSE2 path.
inline const bool cpu_avx2 = cpu_has_avx2();
#endif

/// The index of the first byte where a[0, n) and b[0, n) differ, or n if they are equal.
/// Never reads outside [0, n); the last step of a run may re-read up to one step of equal
/// bytes instead of narrowing down to the end. O(n).
inline std::size_t mismatch(const void* pa, const void* pb, std::size_t n) noexcept {
  const auto* a = static_cast<const unsigned char*>(pa);
  const auto* b = static_cast<const unsigned char*>(pb);
  MismatchStep r{0, false};
#if defined(PROMPTCACHE_DETAIL_AVX2_DISPATCH)
  // Before static initialization cpu_avx2 reads false: the SSE2 path is as correct.
  if (n >= 32 && cpu_avx2) r = mismatch_avx2(a, b, n, 0);
#elif defined(PROMPTCACHE_DETAIL_AVX2)
  r = mismatch_avx2(a, b, n, 0);
#endif
#if defined(PROMPTCACHE_DETAIL_SSE2)
  if (!r.found && r.at < n) r = mismatch_sse2(a, b, n, r.at);
#endif
  if (!r.found && r.at < n) r = mismatch_words(a, b, n, r.at);
  if (r.found) return r.at;
  std::size_t i = r.at;
  while (i < n && a[i] == b[i])
    ++i;
  return i;
}

/// The number of leading equal elements of the token arrays a[0, n) and b[0, n), having
/// copied src[i] to dst[i] for each of them: a prefix compare that hands back the ids stored
/// beside the matched tokens in the same pass. dst is written at [0, result) only; src and dst
/// must not overlap. 4-byte ids take one fused AVX2 pass where the CPU has it; otherwise a
/// compare, then a copy. O(n).
template <class Id>
inline std::size_t mismatch_copy(const std::uint32_t* a, const std::uint32_t* b, const Id* src,
                                 Id* dst, std::size_t n) noexcept {
#if defined(PROMPTCACHE_DETAIL_AVX2)
  if constexpr (sizeof(Id) == 4) {
#if defined(PROMPTCACHE_DETAIL_AVX2_DISPATCH)
    if (n >= 8 && cpu_avx2) return mismatch_copy32_avx2(a, b, src, dst, n);
#else
    if (n >= 8) return mismatch_copy32_avx2(a, b, src, dst, n);
#endif
  }
#endif
  std::size_t same = n;
  if (n != 0 && std::memcmp(a, b, n * sizeof(std::uint32_t)) != 0)
    same = mismatch(a, b, n * sizeof(std::uint32_t)) / sizeof(std::uint32_t);
  if (same != 0) std::memcpy(dst, src, same * sizeof(Id));
  return same;
}

}  // namespace promptcache::detail

#endif  // PROMPTCACHE_DETAIL_MISMATCH_HPP
