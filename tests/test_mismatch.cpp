// Tests of detail::mismatch, the first-differing-byte search under common-prefix lookups: a
// wrong position would be a wrong Hit::matched, so every stage (AVX2, SSE2, 8-byte words,
// bytes) is checked against a byte loop at every length, difference position and alignment
// that crosses its step boundaries.
#include <promptcache/detail/mismatch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "catch.hpp"

namespace {

namespace d = promptcache::detail;

std::size_t reference(const unsigned char* a, const unsigned char* b, std::size_t n) {
  std::size_t i = 0;
  while (i < n && a[i] == b[i])
    ++i;
  return i;
}

// Buffers with slack in front, so the same contents can start at every offset in a vector
// register (the loads are unaligned; this makes sure of it).
struct Buffers {
  std::vector<unsigned char> a, b;
  explicit Buffers(std::size_t n) : a(n + 64), b(n + 64) {}
};

// Every length up to 300 bytes (past four 64-byte steps and every tail), every difference
// position (and none), at three alignments of each buffer.
template <class Search>
void check_all(Search search) {
  constexpr std::size_t kMax = 300;
  Buffers buf(kMax);
  std::size_t checked = 0;
  for (std::size_t off_a : {std::size_t{0}, std::size_t{1}, std::size_t{13}}) {
    for (std::size_t off_b : {std::size_t{0}, std::size_t{7}, std::size_t{32}}) {
      for (std::size_t n = 0; n <= kMax; ++n) {
        unsigned char* a = buf.a.data() + off_a;
        unsigned char* b = buf.b.data() + off_b;
        for (std::size_t i = 0; i < n; ++i)
          a[i] = b[i] = static_cast<unsigned char>((i * 37 + 11) & 0xFF);
        // Also diff == n: equal buffers.
        for (std::size_t diff = 0; diff <= n; ++diff) {
          if (diff < n) b[diff] = static_cast<unsigned char>(a[diff] ^ 0x80);
          // A second difference after the first must not be reported instead of it.
          if (diff + 5 < n) b[diff + 5] = static_cast<unsigned char>(a[diff + 5] ^ 1);
          // One assertion per failure, not per case: 400,000 cases stay fast under ASan.
          const std::size_t got = search(a, b, n);
          if (got != diff || reference(a, b, n) != diff) {
            INFO("offsets " << off_a << "/" << off_b << ", n " << n << ", first difference "
                            << diff);
            REQUIRE(got == diff);
          }
          ++checked;
          if (diff < n) b[diff] = a[diff];
          if (diff + 5 < n) b[diff + 5] = a[diff + 5];
        }
      }
    }
  }
  CHECK(checked > 400000);
}

// Runs one stage and finishes the rest with the reference, as mismatch() chains them: a stage
// must either report the first difference or stop at a point before it.
template <class Stage>
auto finish_with_reference(Stage stage) {
  return [stage](const unsigned char* a, const unsigned char* b, std::size_t n) {
    const d::MismatchStep r = stage(a, b, n, 0);
    if (r.found) return r.at;
    // Stopped short: it may only have skipped equal bytes. Else report an impossible answer.
    if (r.at > n || reference(a, b, r.at) != r.at) return n + 1;
    return r.at + reference(a + r.at, b + r.at, n - r.at);
  };
}

}  // namespace

TEST_CASE("mismatch: the first differing byte, at every length, position and alignment") {
  check_all([](const unsigned char* a, const unsigned char* b, std::size_t n) {
    return d::mismatch(a, b, n);
  });
}

TEST_CASE("mismatch: the 8-byte word stage alone") {
  check_all(finish_with_reference(d::mismatch_words));
}

#if defined(PROMPTCACHE_DETAIL_SSE2)
TEST_CASE("mismatch: the SSE2 stage alone") {
  check_all(finish_with_reference(d::mismatch_sse2));
}
#endif

#if defined(PROMPTCACHE_DETAIL_AVX2)
TEST_CASE("mismatch: the AVX2 stage alone, where the CPU has AVX2") {
#if defined(PROMPTCACHE_DETAIL_AVX2_DISPATCH)
  if (!d::cpu_has_avx2()) return;  // nothing to run here; the dispatch never calls it
#endif
  check_all(finish_with_reference(d::mismatch_avx2));
}
#endif

TEST_CASE("mismatch: empty and one-byte inputs, and a null pointer with length 0") {
  // Buffers longer than the lengths asked for: with 1-byte arrays, GCC's -O2 -Warray-bounds
  // flags the 8-byte loads of a loop that cannot run.
  unsigned char x[16] = {1}, y[16] = {2}, z[16] = {1};
  CHECK(d::mismatch(nullptr, nullptr, 0) == 0);
  CHECK(d::mismatch(x, y, 0) == 0);
  CHECK(d::mismatch(x, y, 1) == 0);
  CHECK(d::mismatch(x, z, 1) == 1);
}

TEST_CASE("mismatch: tokens wider than a byte report the byte, the caller divides") {
  std::vector<std::uint32_t> a(100), b(100);
  for (std::uint32_t i = 0; i < 100; ++i)
    a[i] = b[i] = 0x01020304U * (i + 1);
  b[70] ^= 0x00FF0000U;  // a high byte of token 70 differs
  const std::size_t byte = d::mismatch(a.data(), b.data(), a.size() * sizeof(std::uint32_t));
  CHECK(byte / sizeof(std::uint32_t) == 70);
}

namespace {

// mismatch_copy at every length up to 100 elements (past three 32-element steps and every
// tail), every difference position (and none), at several element offsets of each array:
// the count must be the first difference, dst must hold src's ids below it and be untouched
// from it on (a later difference must not be reported instead).
template <class Id, class Search>
void check_copy(Search search) {
  constexpr std::size_t kMax = 100;
  constexpr Id unset = static_cast<Id>(0x5A5A5A5A5A5A5A5AULL);
  std::vector<std::uint32_t> abuf(kMax + 8), bbuf(kMax + 8);
  std::vector<Id> sbuf(kMax + 8), dbuf(kMax + 16);
  std::size_t checked = 0;
  for (std::size_t off : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {
    for (std::size_t off_d : {std::size_t{0}, std::size_t{5}}) {
      std::uint32_t* a = abuf.data() + off;
      std::uint32_t* b = bbuf.data() + (off + 2) % 4;
      const Id* src = sbuf.data() + (off + 1) % 4;
      for (std::size_t i = 0; i < kMax; ++i) {
        a[i] = b[i] = static_cast<std::uint32_t>(i * 2654435761U);
        sbuf[i + (off + 1) % 4] = static_cast<Id>(1000 + i);
      }
      for (std::size_t n = 0; n <= kMax; ++n) {
        for (std::size_t diff = 0; diff <= n; ++diff) {
          if (diff < n) b[diff] ^= 0x00010000U;
          if (diff + 3 < n) b[diff + 3] ^= 1U;
          std::fill(dbuf.begin(), dbuf.end(), unset);
          Id* dst = dbuf.data() + off_d;
          const std::size_t got = search(a, b, src, dst, n);
          bool ok = got == diff;
          for (std::size_t i = 0; i < dbuf.size(); ++i) {
            const bool written = i >= off_d && i < off_d + diff;
            ok = ok && dbuf[i] == (written ? src[i - off_d] : unset);
          }
          if (!ok) {
            INFO("offset " << off << "/" << off_d << ", n " << n << ", first difference " << diff
                           << ", got " << got);
            REQUIRE(ok);
          }
          ++checked;
          if (diff < n) b[diff] = a[diff];
          if (diff + 3 < n) b[diff + 3] = a[diff + 3];
        }
      }
    }
  }
  CHECK(checked > 30000);
}

}  // namespace

TEST_CASE("mismatch_copy: ids of the equal prefix only, at every length, position and offset") {
  const auto search = [](const std::uint32_t* a, const std::uint32_t* b, const auto* src, auto* dst,
                         std::size_t n) { return d::mismatch_copy(a, b, src, dst, n); };
  check_copy<std::uint32_t>(search);  // the fused pass where the CPU has AVX2
  check_copy<std::uint64_t>(search);  // compare, then copy
  check_copy<std::uint16_t>(search);
  std::uint32_t x = 0;
  CHECK(d::mismatch_copy<std::uint32_t>(nullptr, nullptr, nullptr, nullptr, 0) == 0);
  CHECK(d::mismatch_copy(&x, &x, &x, &x, 0) == 0);
}

#if defined(PROMPTCACHE_DETAIL_AVX2)
TEST_CASE("mismatch_copy: the fused AVX2 pass alone, where the CPU has AVX2") {
#if defined(PROMPTCACHE_DETAIL_AVX2_DISPATCH)
  if (!d::cpu_has_avx2()) return;  // nothing to run here; the dispatch never calls it
#endif
  check_copy<std::uint32_t>([](const std::uint32_t* a, const std::uint32_t* b,
                               const std::uint32_t* src, std::uint32_t* dst, std::size_t n) {
    if (n < 8) return d::mismatch_copy(a, b, src, dst, n);  // the pass needs 8 elements
    return d::mismatch_copy32_avx2(a, b, src, dst, n);
  });
}
#endif

TEST_CASE("mismatch_copy: dst may be b's own storage, the ids overwriting the tokens they match") {
  // A caller matching into the query's buffer: every lane compared before its id lands there.
  constexpr std::size_t kMax = 100;
  std::vector<std::uint32_t> a(kMax), b(kMax), src(kMax);
  for (std::size_t i = 0; i < kMax; ++i) {
    a[i] = static_cast<std::uint32_t>(i * 2654435761U);
    src[i] = static_cast<std::uint32_t>(1000 + i);
  }
  for (std::size_t n = 0; n <= kMax; ++n) {
    for (std::size_t diff = 0; diff <= n; ++diff) {
      std::copy(a.begin(), a.end(), b.begin());
      if (diff < n) b[diff] ^= 0x00010000U;
      const std::vector<std::uint32_t> query = b;
      const std::size_t got = d::mismatch_copy(a.data(), b.data(), src.data(), b.data(), n);
      bool ok = got == diff;
      for (std::size_t i = 0; i < kMax; ++i)
        ok = ok && b[i] == (i < diff ? src[i] : query[i]);
      if (!ok) {
        INFO("n " << n << ", first difference " << diff << ", got " << got);
        REQUIRE(ok);
      }
    }
  }
}
