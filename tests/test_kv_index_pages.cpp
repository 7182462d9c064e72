// detail::KvPagedArray, the paged storage of KvIndex's node and hold pools:
// contents, element addresses that never move, capacity in whole pages, and
// copies, moves and clearing.
#include <promptcache/detail/kv_index_pages.hpp>

#include <cstdint>
#include <utility>
#include <vector>

#include "catch.hpp"

namespace {
using Pages = promptcache::detail::KvPagedArray<std::uint64_t, 4>;  // 16 per page
}

TEST_CASE("paged array: contents and stable addresses", "[kv_index]") {
  Pages a;
  CHECK(a.empty());
  CHECK(a.capacity() == 0U);
  CHECK(a.memory_bytes() == 0U);
  std::vector<const std::uint64_t*> where;
  for (std::uint64_t i = 0; i < 100; ++i) {
    a.push_back(i * 3U);
    where.push_back(&a[i]);
    REQUIRE(a.size() == i + 1U);
    REQUIRE(a.capacity() == (i / 16U + 1U) * 16U);  // whole pages, no more
  }
  for (std::uint64_t i = 0; i < 100; ++i) {
    REQUIRE(a[i] == i * 3U);
    REQUIRE(&a[i] == where[i]);  // growing moved nothing
  }
  CHECK(a.memory_bytes() >= 7U * 16U * sizeof(std::uint64_t));
  a[42] = 7;
  CHECK(a[42] == 7U);
}

TEST_CASE("paged array: reserve makes room without changing contents", "[kv_index]") {
  Pages a;
  a.push_back(1);
  a.reserve(0);
  CHECK(a.capacity() == 16U);
  a.reserve(40);
  CHECK(a.capacity() == 48U);
  CHECK(a.size() == 1U);
  CHECK(a[0] == 1U);
  const std::uint64_t* first = &a[0];
  for (std::uint64_t i = 1; i < 40; ++i)
    a.push_back(i);
  CHECK(a.capacity() == 48U);  // no page added past the reservation
  CHECK(&a[0] == first);
}

TEST_CASE("paged array: copies, moves and clear", "[kv_index]") {
  Pages a;
  for (std::uint64_t i = 0; i < 20; ++i)
    a.push_back(i);
  Pages b(a);
  b[0] = 99;
  CHECK(a[0] == 0U);  // a deep copy
  CHECK(b.size() == 20U);
  CHECK(b[19] == 19U);
  Pages c(std::move(b));
  CHECK(c.size() == 20U);
  CHECK(c[0] == 99U);
  CHECK(b.size() == 0U);  // NOLINT(bugprone-use-after-move): moved-from is empty
  CHECK(b.memory_bytes() == 0U);
  b = c;
  CHECK(b.size() == 20U);
  CHECK(b[0] == 99U);
  a = std::move(c);
  CHECK(a[0] == 99U);
  CHECK(c.empty());  // NOLINT(bugprone-use-after-move)
  a.clear();
  CHECK(a.size() == 0U);
  CHECK(a.memory_bytes() == 0U);
  a.push_back(5);
  CHECK(a[0] == 5U);
  a.swap(b);
  CHECK(a.size() == 20U);
  CHECK(b.size() == 1U);
}

TEST_CASE("paged array: a copy takes the elements and the capacity", "[kv_index]") {
  // Pages past the last element (reserved, never written) are copied as
  // capacity only; a full page, a partial one and empty ones in turn.
  for (const std::size_t n : {std::size_t{0}, std::size_t{16}, std::size_t{21}}) {
    Pages a;
    a.reserve(64);
    for (std::uint64_t i = 0; i < n; ++i)
      a.push_back(i * 3U + 1U);
    const Pages b(a);
    CHECK(b.size() == n);
    CHECK(b.capacity() == a.capacity());
    for (std::size_t i = 0; i < n; ++i)
      CHECK(b[i] == i * 3U + 1U);
    Pages c(b);
    for (std::uint64_t i = n; i < 64; ++i)
      c.push_back(i);
    CHECK(c.capacity() == 64U);  // the copied capacity is usable
    CHECK(c[63] == 63U);
  }
}
