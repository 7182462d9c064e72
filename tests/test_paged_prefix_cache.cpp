// Unit tests of PagedPrefixCache: match, lock, insert, evict, events, stats and
// every bad input of the documentation's table.
#include <promptcache/paged_prefix_cache.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "catch.hpp"

using promptcache::KvEvent;
using promptcache::KvIndex;
using promptcache::KvWorker;
using promptcache::PagedPrefixCache;
using promptcache::PagedPrefixHandle;
namespace eviction = promptcache::eviction;
namespace kv_event = promptcache::kv_event;

namespace {

using Tokens = std::vector<std::uint32_t>;
using Pages = std::vector<std::uint32_t>;

Tokens seq(std::uint32_t from, std::size_t n) {
  Tokens t(n);
  std::iota(t.begin(), t.end(), from);
  return t;
}

Tokens cat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Pages ids(std::uint32_t from, std::size_t n) {
  Pages p(n);
  std::iota(p.begin(), p.end(), from);
  return p;
}

struct Recorder {
  std::vector<KvEvent> events;
  auto sink() {
    return [this](const KvEvent& e) { events.push_back(e); };
  }
};

}  // namespace

TEST_CASE("paged cache: construction rejects a zero page size") {
  CHECK_THROWS_AS(PagedPrefixCache<>(0), std::invalid_argument);
  CHECK_THROWS_AS(PagedPrefixCache<>((std::size_t{1} << 20) + 1), std::invalid_argument);
  PagedPrefixCache<> c(4);
  CHECK(c.page_size() == 4);
  CHECK(c.cached_pages() == 0);
  CHECK(c.check_invariants());
}

TEST_CASE("paged cache: match returns the longest cached page-aligned prefix") {
  PagedPrefixCache<> c(4);
  const Tokens t = seq(100, 10);  // two whole pages and a partial one
  auto ins = c.insert(t, ids(1, 3));
  CHECK(ins.cached_pages == 0);
  CHECK(ins.inserted_pages == 2);
  CHECK(ins.duplicates.empty());
  CHECK(c.cached_pages() == 2);

  auto m = c.match(t);
  CHECK(m.matched == 8);
  CHECK(m.pages == Pages{1, 2});
  CHECK(m.handle == ins.handle);

  // A query diverging inside the second page matches only the first.
  Tokens q = t;
  q[6] = 999;
  m = c.match(q);
  CHECK(m.matched == 4);
  CHECK(m.pages == Pages{1});
  CHECK(c.stats().splits == 1);
  CHECK(c.check_invariants());

  // Partial query pages never match.
  CHECK(c.match(seq(100, 3)).matched == 0);
  CHECK(c.match(Tokens{}).matched == 0);
  CHECK(c.match(Tokens{}).handle.empty());
  // Another namespace sees nothing.
  CHECK(c.match(t, 7).matched == 0);
  CHECK(c.peek(t) == 8);
  CHECK(c.peek(q) == 4);
}

TEST_CASE("paged cache: insert keeps cached pages and reports the engine's duplicates") {
  PagedPrefixCache<> c(2);
  c.insert(seq(0, 6), ids(10, 3));
  // Same first two pages (one passed back as the cached id, one as a fresh page),
  // then a new one.
  const Pages mine{10, 77, 78, 79};
  auto r = c.insert(cat(seq(0, 4), Tokens{50, 51, 52, 53}), mine);
  CHECK(r.cached_pages == 2);
  CHECK(r.inserted_pages == 2);
  CHECK(r.duplicates == Pages{77});
  auto m = c.match(cat(seq(0, 4), Tokens{50, 51, 52, 53}));
  CHECK(m.pages == Pages{10, 11, 78, 79});
  CHECK(c.match(seq(0, 6)).pages == Pages{10, 11, 12});
  CHECK(c.cached_pages() == 5);
  CHECK(c.stats().duplicate_pages == 1);
  CHECK(c.check_invariants());

  // Fewer page ids than whole pages: invalid_argument, nothing changed.
  CHECK_THROWS_AS(c.insert(seq(200, 6), ids(1, 2)), std::invalid_argument);
  CHECK(c.cached_pages() == 5);
  CHECK(c.peek(seq(200, 6)) == 0);
  // Extra page ids (the partial page's) are ignored.
  r = c.insert(seq(300, 5), ids(90, 3));
  CHECK(r.inserted_pages == 2);
  CHECK(c.match(seq(300, 5)).pages == Pages{90, 91});
  CHECK(c.check_invariants());
}

TEST_CASE("paged cache: locked pages are never evicted; unlock below zero is refused") {
  PagedPrefixCache<> c(1);
  auto a = c.insert(seq(0, 4), ids(0, 4));
  auto b = c.insert(cat(seq(0, 2), seq(50, 2)), Pages{0, 1, 20, 21});
  CHECK(c.cached_pages() == 6);
  auto m = c.match(seq(0, 4));
  REQUIRE(c.lock(m.handle));
  CHECK(c.locked_pages() == 4);
  CHECK(c.evictable_pages() == 2);
  std::vector<std::uint32_t> freed;
  CHECK(c.evict(100, [&](std::uint32_t p) { freed.push_back(p); }) == 2);
  std::sort(freed.begin(), freed.end());
  CHECK(freed == Pages{20, 21});
  CHECK(c.cached_pages() == 4);
  CHECK(c.evict(1) == 0);
  CHECK(c.valid(m.handle));
  CHECK_FALSE(c.valid(b.handle));
  CHECK(c.unlock(m.handle));
  CHECK_FALSE(c.unlock(m.handle));  // below zero: refused
  CHECK(c.locked_pages() == 0);
  CHECK(c.evictable_pages() == 4);
  CHECK_FALSE(c.lock(b.handle));  // stale
  CHECK(c.lock(PagedPrefixHandle{}));
  CHECK(c.unlock(PagedPrefixHandle{}));
  CHECK(c.check_invariants());
  (void)a;
}

TEST_CASE("paged cache: evict frees exactly n pages, tail first, in LRU order") {
  PagedPrefixCache<> c(1);
  c.insert(seq(0, 5), ids(0, 5));      // older
  c.insert(seq(100, 3), ids(100, 3));  // newer
  std::vector<std::uint32_t> freed;
  auto rec = [&](std::uint32_t p) { freed.push_back(p); };
  CHECK(c.evict(2, rec) == 2);
  CHECK(freed == Pages{4, 3});             // the older leaf's tail, deepest first
  CHECK(c.match(seq(0, 5)).matched == 3);  // and now it is the most recent
  freed.clear();
  CHECK(c.evict(4, rec) == 4);
  CHECK(freed == Pages{102, 101, 100, 2});
  CHECK(c.cached_pages() == 2);
  CHECK(c.evict(0) == 0);
  CHECK(c.check_invariants());
}

TEST_CASE("paged cache: events mirror the cache into a KvIndex") {
  Recorder rec;
  PagedPrefixCache<std::uint32_t> c(2, eviction::Lru{}, rec.sink());
  KvIndex index;
  const KvWorker w{1, 0};
  const auto feed = [&] {
    for (const auto& e : rec.events)
      REQUIRE(index.apply(w, e).ok());
    rec.events.clear();
  };
  const auto routed = [&](const Tokens& t, std::uint64_t ns) {
    promptcache::BlockHashOptions o;
    o.seed = c.namespace_seed(ns);
    const auto hashes = promptcache::local_block_hashes(t, 2, o);
    const auto m = index.find_matches(hashes);
    return m.empty() ? std::size_t{0} : m[0].blocks;
  };
  c.configure_namespace(3, "lora-a", "salt");
  c.insert(seq(0, 8), ids(0, 4));
  c.insert(cat(seq(0, 4), seq(40, 4)), Pages{0, 1, 9, 8});
  c.insert(seq(0, 8), ids(0, 4), 3);
  feed();
  CHECK(rec.events.empty());
  CHECK(routed(seq(0, 8), 0) == 4);
  CHECK(routed(cat(seq(0, 4), seq(40, 4)), 0) == 4);
  CHECK(routed(seq(0, 8), 3) == 4);
  // A split (match inside a node) publishes nothing.
  const auto before = c.next_event_id();
  CHECK(c.match(cat(seq(0, 2), Tokens{7, 7})).matched == 2);
  CHECK(c.next_event_id() == before);
  c.evict(3);
  feed();
  for (const Tokens& t : {seq(0, 8), cat(seq(0, 4), seq(40, 4))})
    for (std::uint64_t ns : {0U, 3U})
      CHECK(routed(t, ns) * 2 == c.peek(t, ns));
  CHECK(c.erase_namespace(3));
  feed();
  CHECK(routed(seq(0, 8), 3) == 0);
  CHECK(c.clear());
  feed();
  CHECK(index.block_count(w) == 0);
  CHECK(c.check_invariants());
}
