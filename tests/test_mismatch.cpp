// Tests of detail::mismatch, the first-differing-byte search under common-prefix lookups: a
// wrong position would be a wrong Hit::matched, so every stage (AVX2, SSE2, 8-byte words,
// bytes) is checked against a byte loop at every length, difference position and alignment
// that crosses its step boundaries. The inputs sit against inaccessible memory, so a vector
// load that strays outside [0, n) faults instead of reading slack.
#include <promptcache/detail/mismatch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <ostream>
#include <vector>

#include "catch.hpp"

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#define PROMPTCACHE_TEST_GUARD_PAGES 1
#endif

namespace {

namespace d = promptcache::detail;

std::size_t reference(const unsigned char* a, const unsigned char* b, std::size_t n) {
  std::size_t i = 0;
  while (i < n && a[i] == b[i])
    ++i;
  return i;
}

// A page of memory between two inaccessible pages (POSIX): a read or write before its first
// byte or past its last one faults, where slack around the data would hide it. Elsewhere, a
// heap block of exactly one page, whose ends AddressSanitizer guards.
class GuardedPage {
 public:
  GuardedPage() {
#if defined(PROMPTCACHE_TEST_GUARD_PAGES)
    size_ = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    void* p =
        ::mmap(nullptr, 3 * size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    mapping_ = static_cast<unsigned char*>(p);
    REQUIRE(::mprotect(mapping_, size_, PROT_NONE) == 0);
    REQUIRE(::mprotect(mapping_ + 2 * size_, size_, PROT_NONE) == 0);
    begin_ = mapping_ + size_;
#else
    size_ = 4096;
    heap_ = std::make_unique<unsigned char[]>(size_);
    begin_ = heap_.get();
#endif
  }
  ~GuardedPage() {
#if defined(PROMPTCACHE_TEST_GUARD_PAGES)
    ::munmap(mapping_, 3 * size_);
#endif
  }
  GuardedPage(const GuardedPage&) = delete;
  GuardedPage& operator=(const GuardedPage&) = delete;

  // Elements of T from `off` elements after the inaccessible memory in front.
  template <class T>
  T* front(std::size_t off) const {
    return reinterpret_cast<T*>(begin_) + off;
  }
  // `count` elements of T ending right at the inaccessible memory behind.
  template <class T>
  T* back(std::size_t count) const {
    return reinterpret_cast<T*>(begin_ + size_) - count;
  }

 private:
  std::size_t size_ = 0;
  unsigned char* begin_ = nullptr;
#if defined(PROMPTCACHE_TEST_GUARD_PAGES)
  unsigned char* mapping_ = nullptr;
#else
  std::unique_ptr<unsigned char[]> heap_;
#endif
};

// Where a buffer of n elements sits in its page: against the inaccessible memory behind it
// (an over-read faults; its start's alignment changes with n), or `off` elements after the
// inaccessible memory in front (an under-read faults when off is 0; a fixed alignment).
struct Place {
  bool back;
  std::size_t off;
  template <class T>
  T* in(const GuardedPage& page, std::size_t n) const {
    return back ? page.back<T>(n) : page.front<T>(off);
  }
};
constexpr Place kBack{true, 0};
constexpr Place front(std::size_t off) {
  return Place{false, off};
}

std::ostream& operator<<(std::ostream& os, const Place& p) {
  return p.back ? os << "back" : os << "front+" << p.off;
}

// Where the three input arrays of mismatch_copy sit.
struct Layout {
  Place a, b, src;
};

// Every length up to 300 bytes (past four 64-byte steps and every tail), every difference
// position (and none), with each buffer against the inaccessible memory behind it (so at
// every alignment as n grows) or in front of it, or at a fixed offset.
template <class Search>
void check_all(Search search) {
  constexpr std::size_t kMax = 300;
  const GuardedPage page_a, page_b;
  std::size_t checked = 0;
  for (const Place place_a : {kBack, front(0), front(13)}) {
    for (const Place place_b : {kBack, front(0), front(7)}) {
      for (std::size_t n = 0; n <= kMax; ++n) {
        unsigned char* a = place_a.in<unsigned char>(page_a, n);
        unsigned char* b = place_b.in<unsigned char>(page_b, n);
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
            INFO("a at " << place_a << ", b at " << place_b << ", n " << n << ", first difference "
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
// tail), every difference position (and none), with the arrays against inaccessible memory
// behind or in front of them or at element offsets: the count must be the first difference,
// dst must hold src's ids below it and be untouched from it on (a later difference must not be
// reported instead), and no array may be read or written outside [0, n).
template <class Id, class Search>
void check_copy(Search search) {
  constexpr std::size_t kMax = 100;
  constexpr std::size_t kMargin = 16;  // dst elements checked on each side of [0, n)
  constexpr Id unset = static_cast<Id>(0x5A5A5A5A5A5A5A5AULL);
  const GuardedPage page_a, page_b, page_src, page_dst;
  std::size_t checked = 0;
  for (const Layout& at : {Layout{kBack, kBack, kBack}, Layout{front(0), front(2), front(1)},
                           Layout{front(1), kBack, front(3)}, Layout{kBack, front(3), kBack}}) {
    for (const Place place_dst : {kBack, front(0), front(5)}) {
      for (std::size_t n = 0; n <= kMax; ++n) {
        std::uint32_t* a = at.a.in<std::uint32_t>(page_a, n);
        std::uint32_t* b = at.b.in<std::uint32_t>(page_b, n);
        Id* src = at.src.in<Id>(page_src, n);
        for (std::size_t i = 0; i < n; ++i) {
          a[i] = b[i] = static_cast<std::uint32_t>(i * 2654435761U);
          src[i] = static_cast<Id>(1000 + i);
        }
        Id* dst = place_dst.in<Id>(page_dst, n);
        // The elements of dst's page around [0, n): all must stay unset but the copied ones.
        Id* lo = dst - std::min(kMargin, static_cast<std::size_t>(dst - page_dst.front<Id>(0)));
        Id* hi =
            dst + n + std::min(kMargin, static_cast<std::size_t>(page_dst.back<Id>(0) - (dst + n)));
        for (std::size_t diff = 0; diff <= n; ++diff) {
          if (diff < n) b[diff] ^= 0x00010000U;
          if (diff + 3 < n) b[diff + 3] ^= 1U;
          std::fill(lo, hi, unset);
          const std::size_t got = search(a, b, static_cast<const Id*>(src), dst, n);
          bool ok = got == diff;
          for (Id* p = lo; p != hi; ++p) {
            const bool written = p >= dst && p < dst + diff;
            ok = ok && *p == (written ? src[p - dst] : unset);
          }
          if (!ok) {
            INFO("a at " << at.a << ", b at " << at.b << ", src at " << at.src << ", dst at "
                         << place_dst << ", n " << n << ", first difference " << diff << ", got "
                         << got);
            REQUIRE(ok);
          }
          ++checked;
          if (diff < n) b[diff] = a[diff];
          if (diff + 3 < n) b[diff + 3] = a[diff + 3];
        }
      }
    }
  }
  CHECK(checked > 60000);
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
  const GuardedPage page_a, page_b, page_src;
  for (const Place place_b : {kBack, front(0)}) {
    for (std::size_t n = 0; n <= kMax; ++n) {
      std::uint32_t* a = page_a.back<std::uint32_t>(n);
      std::uint32_t* src = page_src.back<std::uint32_t>(n);
      std::uint32_t* b = place_b.in<std::uint32_t>(page_b, n);
      for (std::size_t i = 0; i < n; ++i) {
        a[i] = static_cast<std::uint32_t>(i * 2654435761U);
        src[i] = static_cast<std::uint32_t>(1000 + i);
      }
      for (std::size_t diff = 0; diff <= n; ++diff) {
        std::copy(a, a + n, b);
        if (diff < n) b[diff] ^= 0x00010000U;
        const std::vector<std::uint32_t> query(b, b + n);
        const std::size_t got =
            d::mismatch_copy(a, b, static_cast<const std::uint32_t*>(src), b, n);
        bool ok = got == diff;
        for (std::size_t i = 0; i < n; ++i)
          ok = ok && b[i] == (i < diff ? src[i] : query[i]);
        if (!ok) {
          INFO((place_b.back ? "b at the back" : "b at the front")
               << ", n " << n << ", first difference " << diff << ", got " << got);
          REQUIRE(ok);
        }
      }
    }
  }
}
