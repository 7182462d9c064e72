// Exception safety of PagedPrefixCache: every allocation an operation makes is
// made to fail in turn (the node vector's over-aligned growth included); after each
// failure the cache must satisfy its invariants and be exactly as before (the strong
// guarantee the header promises), and the successful run must leave the state of a run
// without failures. Each case runs with LRU and with the adaptive policy, whose ghost
// history and target must not move on a failure either.
#include <promptcache/paged_prefix_cache.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <span>
#include <type_traits>
#include <vector>

#include "catch.hpp"
#include "support/counting_new.hpp"

namespace {

using promptcache::KvEvent;
using LruCache = promptcache::PagedPrefixCache<std::uint32_t>;
using AdaptiveCache = promptcache::PagedPrefixCache<std::uint32_t, promptcache::eviction::Adaptive>;
using Tokens = std::vector<std::uint32_t>;

// A cache of `page_size`-token pages, with a sink when asked.
template <class Cache>
std::unique_ptr<Cache> make_cache(std::size_t page_size, bool sink) {
  typename Cache::event_sink s;
  if (sink) s = [](const KvEvent&) {};
  if constexpr (std::is_same_v<Cache, AdaptiveCache>)
    return std::make_unique<Cache>(page_size, promptcache::eviction::Adaptive(16, 2.0), s);
  else
    return std::make_unique<Cache>(page_size, promptcache::eviction::Lru{}, s);
}

Tokens seq(std::uint32_t from, std::size_t n) {
  Tokens t(n);
  for (std::size_t i = 0; i < n; ++i)
    t[i] = from + static_cast<std::uint32_t>(i);
  return t;
}

Tokens cat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<std::uint32_t> ids(std::uint32_t from, std::size_t n) {
  return seq(from, n);
}

const std::vector<Tokens>& queries() {
  static const std::vector<Tokens> q{seq(0, 12),  cat(seq(0, 4), seq(50, 8)), seq(100, 8),
                                     seq(200, 8), cat(seq(0, 6), seq(70, 4)), seq(300, 4),
                                     seq(0, 2)};
  return q;
}

// Everything observable about a cache without changing it.
struct Snapshot {
  std::vector<std::size_t> peeks;  // per namespace 0, 1, 5, 7 and query
  std::size_t cached = 0, locked = 0, evictable = 0, nodes = 0, namespaces = 0;
  std::uint64_t next_event = 0;
  std::uint64_t seed5 = 0;
  double target = 0;  // the adaptive policy's state
  std::size_t ghosts_once = 0, ghosts_reused = 0;
  bool operator==(const Snapshot&) const = default;
};

template <class Cache>
Snapshot snapshot(const Cache& c) {
  Snapshot s;
  for (const std::uint64_t ns : {0U, 1U, 5U, 7U})
    for (const Tokens& q : queries())
      s.peeks.push_back(c.peek(q, ns));
  s.cached = c.cached_pages();
  s.locked = c.locked_pages();
  s.evictable = c.evictable_pages();
  s.nodes = c.node_count();
  s.namespaces = c.namespace_count();
  s.next_event = c.next_event_id();
  s.seed5 = c.namespace_seed(5);
  if constexpr (std::is_same_v<Cache, AdaptiveCache>) {
    s.target = c.policy().target();
    s.ghosts_once = c.policy().ghosts_once();
    s.ghosts_reused = c.policy().ghosts_reused();
  }
  return s;
}

// Pages in two namespaces, one of them locked; with the adaptive policy, ghosts of evicted
// pages (the new namespace's insert below brings one back).
template <class Cache>
std::unique_ptr<Cache> base() {
  auto c = make_cache<Cache>(2, true);
  c->insert(seq(400, 2), ids(90, 1), 7);
  c->evict(1);
  c->erase_namespace(7);
  c->insert(seq(0, 12), ids(0, 6));
  c->insert(cat(seq(0, 4), seq(50, 8)), ids(10, 6));
  c->insert(seq(100, 8), ids(20, 4), 0, 1);
  c->insert(seq(300, 4), ids(30, 2), 1);
  const auto m = c->match(seq(0, 12));
  c->lock(m.handle);
  return c;
}

// Runs `op` on a fresh base cache with allocation k failing, for k = 0, 1, ...
// until it succeeds; returns how many runs failed.
template <class Cache>
int fail_every_allocation(const std::function<void(Cache&)>& op, bool split_may_remain = false) {
  auto clean = base<Cache>();
  op(*clean);
  const Snapshot want = snapshot(*clean);
  int failures = 0;
  for (long k = 0; k < 1000; ++k) {
    auto c = base<Cache>();
    const Snapshot before = snapshot(*c);
    bool threw = false;
    test_alloc::countdown = k;
    try {
      op(*c);
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    test_alloc::countdown = -1;
    INFO("allocation " << k << " failed");
    REQUIRE(c->check_invariants());
    if (!threw) {
      CHECK(snapshot(*c) == want);
      return failures;
    }
    ++failures;
    Snapshot now = snapshot(*c);
    if (split_may_remain && now.nodes == before.nodes + 1) now.nodes = before.nodes;
    CHECK(now == before);
  }
  FAIL("operation never succeeded");
  return failures;
}

}  // namespace

TEST_CASE("paged cache exceptions: the replaced allocator is in use") {
  REQUIRE(test_alloc::replacement_active());
}

TEST_CASE("paged cache exceptions: an aligned size too large to round up is refused") {
  // Rounding SIZE_MAX - 1 up to 64 bytes wraps: the allocator must fail, not hand out a
  // tiny block.
  // volatile: the size is a run-time value, as in the code this allocator serves.
  volatile std::size_t at_run_time = std::numeric_limits<std::size_t>::max() - 1;
  const std::size_t huge = at_run_time;
  CHECK_THROWS_AS(::operator new (huge, std::align_val_t{64}), std::bad_alloc);
  CHECK(::operator new (huge, std::align_val_t{64}, std::nothrow) == nullptr);
}

TEMPLATE_TEST_CASE("paged cache exceptions: insert is all or nothing", "", LruCache,
                   AdaptiveCache) {
  using Cache = TestType;
  // New pages below a split, with a Stored event.
  CHECK(fail_every_allocation<Cache>(
            [](Cache& c) { c.insert(cat(seq(0, 6), seq(70, 4)), ids(40, 5)); }) > 0);
  // New pages at the root.
  CHECK(fail_every_allocation<Cache>([](Cache& c) { c.insert(seq(200, 8), ids(50, 4)); }) > 0);
  // A new namespace.
  CHECK(fail_every_allocation<Cache>([](Cache& c) { c.insert(seq(400, 4), ids(60, 2), 7); }) > 0);
  // Duplicates reported for an already cached prefix.
  CHECK(fail_every_allocation<Cache>([](Cache& c) { c.insert(seq(0, 12), ids(80, 6)); }) > 0);
}

TEMPLATE_TEST_CASE("paged cache exceptions: evict, erase_namespace and configure_namespace", "",
                   LruCache, AdaptiveCache) {
  using Cache = TestType;
  CHECK(fail_every_allocation<Cache>([](Cache& c) { c.evict(5); }) > 0);
  CHECK(fail_every_allocation<Cache>([](Cache& c) { c.erase_namespace(1); }) > 0);
  CHECK(fail_every_allocation<Cache>([](Cache& c) { c.configure_namespace(5, "lora", "salt"); }) >
        0);
}

TEMPLATE_TEST_CASE("paged cache exceptions: a match that splits leaves the tree as it was", "",
                   LruCache, AdaptiveCache) {
  using Cache = TestType;
  // The walked pages' access times may have been refreshed, and a split made
  // before the failure (growing the result) may remain: it changes no answer.
  CHECK(fail_every_allocation<Cache>([](Cache& c) { (void)c.match(seq(100, 4)); }, true) > 0);
}

TEMPLATE_TEST_CASE("paged cache exceptions: a split that compacts allocates both blocks first", "",
                   LruCache, AdaptiveCache) {
  using Cache = TestType;
  // In the base cache seq(0, 12)'s second node holds 4 live pages of its 6-page block: a
  // split after its first page leaves 3 in the block, so the split compacts them too and
  // needs two blocks. Either failing leaves the tree as it was.
  const auto bounded = [](const Cache& c) {
    return c.memory().token_bytes <= 2 * c.cached_pages() * c.page_size() * 4;
  };
  CHECK(fail_every_allocation<Cache>(
            [&](Cache& c) {
              (void)c.match(seq(0, 6));
              CHECK(bounded(c));
            },
            true) >= 2);
  CHECK(fail_every_allocation<Cache>([&](Cache& c) {
          c.insert(cat(seq(0, 6), seq(700, 4)), ids(300, 5));
          CHECK(bounded(c));
        }) >= 2);
}

TEMPLATE_TEST_CASE("paged cache exceptions: a split while matching into a table at page size 1", "",
                   LruCache, AdaptiveCache) {
  using Cache = TestType;
  // One token per page: the compare writes the ids as it goes, so a failed split may leave
  // the ids of the pages matched so far in the table, but nothing past them.
  constexpr std::uint32_t unset = 0xFFFFFFFFU;
  const auto make = [] {
    auto c = make_cache<Cache>(1, true);
    c->insert(cat(seq(0, 10), seq(50, 20)), ids(100, 30));
    c->insert(cat(seq(0, 10), seq(80, 20)), ids(200, 30));
    return c;
  };
  // The query leaves the first request inside its own 20 pages: the match splits there.
  const Tokens q = cat(cat(seq(0, 10), seq(50, 12)), seq(900, 3));
  std::vector<std::uint32_t> want(q.size() + 2, unset);
  auto clean = make();
  const std::uint64_t splits = clean->stats().splits;
  const auto done = clean->match(q, 0, std::span<std::uint32_t>(want));
  REQUIRE(done.matched == 22);
  REQUIRE(clean->stats().splits == splits + 1);
  int failures = 0;
  for (long k = 0; k < 1000; ++k) {
    auto c = make();
    const std::size_t nodes = c->node_count();
    std::vector<std::uint32_t> table(q.size() + 2, unset);
    bool threw = false;
    test_alloc::countdown = k;
    try {
      (void)c->match(q, 0, std::span<std::uint32_t>(table));
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    test_alloc::countdown = -1;
    INFO("allocation " << k << " failed");
    REQUIRE(c->check_invariants());
    if (!threw) {
      CHECK(table == want);
      break;
    }
    ++failures;
    CHECK(c->node_count() == nodes);
    CHECK(c->peek(q) == 22);
    // A prefix of the ids a successful match writes, then entries as they were.
    std::size_t i = 0;
    while (i < table.size() && table[i] != unset)
      ++i;
    CHECK(std::equal(table.begin(), table.begin() + static_cast<std::ptrdiff_t>(i), want.begin()));
    CHECK(i <= 22);
    CHECK(std::all_of(table.begin() + static_cast<std::ptrdiff_t>(i), table.end(),
                      [](std::uint32_t p) { return p == unset; }));
  }
  CHECK(failures > 0);
}
