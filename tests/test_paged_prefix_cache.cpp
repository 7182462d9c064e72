// Unit tests of PagedPrefixCache: match, lock, insert, evict, events, stats and
// every bad input of the documentation's table.
#include <promptcache/paged_prefix_cache.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <span>
#include <stdexcept>
#include <type_traits>
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

TEST_CASE("paged cache: match into a caller's table writes only the matched ids") {
  PagedPrefixCache<> c(2);
  const Tokens t = seq(10, 8);  // four pages
  c.insert(t, ids(100, 4));
  constexpr std::uint32_t unset = 0xFFFFFFFFU;

  // Room for more than the query: the matched ids, the rest untouched.
  Pages table(6, unset);
  auto e = c.match(cat(t, seq(90, 2)), 0, std::span<std::uint32_t>(table));
  CHECK(e.matched == 8);
  CHECK(table == Pages{100, 101, 102, 103, unset, unset});
  CHECK(e.handle == c.match(t).handle);

  // A table shorter than the query caps the match, as a shorter query would: the node is
  // split where the table ends and the handle names exactly the pages written.
  table.assign(6, unset);
  e = c.match(t, 0, std::span<std::uint32_t>(table.data(), 3));
  CHECK(e.matched == 6);
  CHECK(table == Pages{100, 101, 102, unset, unset, unset});
  CHECK(c.stats().splits == 1);
  CHECK(e.handle == c.match(seq(10, 6)).handle);
  CHECK(c.check_invariants());

  // No room: nothing matched, nothing written, the empty handle.
  table.assign(1, unset);
  e = c.match(t, 0, std::span<std::uint32_t>(table.data(), 0));
  CHECK(e.matched == 0);
  CHECK(e.handle.empty());
  CHECK(table == Pages{unset});
  // Unknown namespace, empty query: nothing written either.
  CHECK(c.match(t, 3, std::span<std::uint32_t>(table)).matched == 0);
  CHECK(c.match(Tokens{}, 0, std::span<std::uint32_t>(table)).matched == 0);
  CHECK(table == Pages{unset});
  CHECK(c.stats().lookups == 7);
}

namespace {

// Matches a query held in `storage` into the same bytes, ids of type Id at page size ps:
// 12 pages, then a 13-page tail (no node a multiple of the fused compare's 8-token steps),
// then one page the cache does not hold.
template <class Id>
void match_in_place(std::size_t ps) {
  PagedPrefixCache<Id> c(ps);
  const Tokens head = seq(1, 12 * ps);
  const Tokens full = cat(head, seq(500, 13 * ps));
  std::vector<Id> want(25);
  std::iota(want.begin(), want.end(), Id{100});
  c.insert(head, std::span<const Id>(want.data(), 12));
  c.insert(full, want);
  const std::size_t nodes = c.node_count();
  const Tokens query = cat(full, seq(900, ps));
  const std::size_t bytes = query.size() * sizeof(std::uint32_t);
  std::vector<std::uint64_t> storage(bytes / sizeof(std::uint64_t) + 1);
  std::memcpy(storage.data(), query.data(), bytes);
  const auto* tokens = reinterpret_cast<const std::uint32_t*>(storage.data());
  auto* out = reinterpret_cast<Id*>(storage.data());
  const auto e = c.match(std::span<const std::uint32_t>(tokens, query.size()), 0,
                         std::span<Id>(out, query.size() / ps));
  INFO("page size " << ps << ", " << sizeof(Id) << "-byte ids");
  CHECK(e.matched == 25 * ps);
  std::vector<Id> got(25);
  std::memcpy(got.data(), storage.data(), 25 * sizeof(Id));
  CHECK(got == want);
  // Past the ids, the query's bytes as they were.
  const auto* b = reinterpret_cast<const unsigned char*>(storage.data());
  const auto* q = reinterpret_cast<const unsigned char*>(query.data());
  CHECK(std::equal(b + 25 * sizeof(Id), b + bytes, q + 25 * sizeof(Id)));
  CHECK(c.node_count() == nodes);  // no split
  CHECK(c.check_invariants());
}

}  // namespace

TEST_CASE("paged cache: match into the query's own buffer, the ids overwriting the tokens") {
  // The ids of a node are written while (page size 1) or after its tokens are compared, and
  // never ahead of the tokens still to compare while ids are at most 4 bytes or pages at
  // least 2 tokens: one buffer can then be the query and the table.
  for (const std::size_t ps : {std::size_t{1}, std::size_t{2}}) {
    match_in_place<std::uint32_t>(ps);
    match_in_place<std::uint16_t>(ps);
    match_in_place<std::int8_t>(ps);
  }
  for (const std::size_t ps : {std::size_t{2}, std::size_t{3}})
    match_in_place<std::uint64_t>(ps);
}

TEST_CASE("paged cache: a namespace's slot reused by another namespace is not matched") {
  // match() remembers the last namespace slot it used; erasing the namespace and creating
  // another in the same slot must not let a query of the old id see the new one's pages.
  PagedPrefixCache<> c(1);
  const Tokens t = seq(1, 4);
  c.insert(t, ids(10, 4), 5);
  CHECK(c.match(t, 5).matched == 4);
  CHECK(c.erase_namespace(5));
  CHECK(c.match(t, 5).matched == 0);
  c.insert(t, ids(20, 4), 7);  // takes the freed slot
  CHECK(c.match(t, 5).matched == 0);
  CHECK(c.peek(t, 5) == 0);
  CHECK(c.match(t, 7).pages == ids(20, 4));
  CHECK(c.match(t, 5).matched == 0);  // right after a match of 7
  c.insert(t, ids(30, 4), 5);
  CHECK(c.match(t, 5).pages == ids(30, 4));
  CHECK(c.match(t, 7).pages == ids(20, 4));
  CHECK(c.check_invariants());
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

TEST_CASE("paged cache: stale handles and evictions that free nothing change and publish nothing") {
  Recorder rec;
  PagedPrefixCache<> c(2, eviction::Lru{}, rec.sink());
  auto gone = c.insert(seq(0, 4), ids(0, 2));
  auto kept = c.insert(seq(10, 4), ids(10, 2));
  REQUIRE(c.evict(2) == 2);  // the older prefix, whole
  rec.events.clear();
  CHECK_FALSE(c.valid(gone.handle));
  CHECK_FALSE(c.lock(gone.handle));
  CHECK_FALSE(c.unlock(gone.handle));
  CHECK(c.lock_count(gone.handle) == 0);
  CHECK(c.locked_pages() == 0);

  // evict(0), and evict(n) while every page is locked: 0 pages, no callback, no event.
  std::vector<std::uint32_t> freed;
  CHECK(c.evict(0, [&](std::uint32_t p) { freed.push_back(p); }) == 0);
  REQUIRE(c.lock(kept.handle));
  CHECK(c.evict(5, [&](std::uint32_t p) { freed.push_back(p); }) == 0);
  CHECK(freed.empty());
  CHECK(rec.events.empty());
  CHECK(c.cached_pages() == 2);
  CHECK(c.stats().evicted_pages == 2);
  CHECK(c.unlock(kept.handle));
  CHECK(c.check_invariants());
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

TEST_CASE("paged cache: empty and partial inputs store nothing and publish nothing") {
  Recorder rec;
  PagedPrefixCache<> c(4, eviction::Lru{}, rec.sink());
  auto r = c.insert(Tokens{}, Pages{});
  CHECK(r.inserted_pages == 0);
  CHECK(r.handle.empty());
  r = c.insert(seq(0, 3), Pages{});  // a partial page only: no page id needed
  CHECK(r.inserted_pages == 0);
  CHECK(c.cached_pages() == 0);
  CHECK(c.namespace_count() == 0);  // no namespace was created
  CHECK(rec.events.empty());
  CHECK(c.stats().inserts == 2);
  CHECK(c.evict(10) == 0);
  CHECK(c.check_invariants());
}

TEST_CASE("paged cache: ids at their type's limits are stored as given") {
  SECTION("u64 page ids and u32 token ids at the maximum") {
    PagedPrefixCache<std::uint64_t> c(2);
    const std::uint64_t top = std::numeric_limits<std::uint64_t>::max();
    const std::uint32_t tmax = std::numeric_limits<std::uint32_t>::max();
    const Tokens t{tmax, tmax, tmax, 0};
    c.insert(t, std::vector<std::uint64_t>{top, top - 1});
    CHECK(c.match(t).pages == std::vector<std::uint64_t>{top, top - 1});
    std::vector<std::uint64_t> freed;
    c.evict(2, [&](std::uint64_t p) { freed.push_back(p); });
    CHECK(freed == std::vector<std::uint64_t>{top - 1, top});
  }
  SECTION("signed 8-bit page ids, negative ones included") {
    PagedPrefixCache<std::int8_t> c(1);
    c.insert(seq(0, 3), std::vector<std::int8_t>{-128, 127, -1});
    CHECK(c.match(seq(0, 3)).pages == std::vector<std::int8_t>{-128, 127, -1});
    CHECK(c.check_invariants());
  }
  SECTION("namespace ids at the maximum") {
    PagedPrefixCache<> c(1);
    const std::uint64_t ns = std::numeric_limits<std::uint64_t>::max();
    c.insert(seq(0, 2), ids(0, 2), ns);
    CHECK(c.match(seq(0, 2), ns).matched == 2);
    CHECK(c.match(seq(0, 2), 0).matched == 0);
    CHECK(c.namespace_seed(ns) == promptcache::block_hash_seed("", "18446744073709551615"));
  }
}

TEST_CASE("paged cache: namespace seeds") {
  PagedPrefixCache<> c(1);
  CHECK(c.namespace_seed(0) == promptcache::block_hash_seed());
  CHECK(c.namespace_seed(9) == promptcache::block_hash_seed("", "9"));
  c.configure_namespace(5, "lora", "s");
  CHECK(c.namespace_seed(5) == promptcache::block_hash_seed("lora", "s"));
  c.configure_namespace(5, "lora", "s");  // same seed: no-op
  // Another namespace may not take the seed.
  CHECK_THROWS_AS(c.configure_namespace(6, "lora", "s"), std::invalid_argument);
  CHECK(c.namespace_count() == 1);
  // No namespace may take another id's default seed, used or not.
  CHECK_THROWS_AS(c.configure_namespace(8, "", "7"), std::invalid_argument);
  CHECK_THROWS_AS(c.configure_namespace(8, "", ""), std::invalid_argument);  // namespace 0's
  CHECK_THROWS_AS(c.configure_namespace(5, "", "18446744073709551615"), std::invalid_argument);
  CHECK(c.namespace_count() == 1);
  CHECK(c.namespace_seed(5) == promptcache::block_hash_seed("lora", "s"));
  CHECK(c.namespace_seed(8) == promptcache::block_hash_seed("", "8"));
  // Its own default, a LoRA name, or a salt that is no id in decimal are accepted.
  c.configure_namespace(8, "", "8");
  c.configure_namespace(0, "", "");
  c.configure_namespace(9, "lora", "7");
  c.configure_namespace(10, "", "07");
  c.configure_namespace(11, "", "0");
  c.configure_namespace(12, "", "18446744073709551616");
  c.configure_namespace(13, "", "+7");
  CHECK(c.namespace_count() == 8);
  // A namespace holding pages cannot change its seed; an empty one can.
  c.insert(seq(0, 2), ids(0, 2), 5);
  CHECK_THROWS_AS(c.configure_namespace(5, "other"), std::invalid_argument);
  CHECK(c.namespace_seed(5) == promptcache::block_hash_seed("lora", "s"));
  CHECK(c.erase_namespace(5));
  CHECK(c.namespace_seed(5) == promptcache::block_hash_seed("", "5"));  // forgotten
  c.configure_namespace(5, "other");
  CHECK(c.namespace_seed(5) == promptcache::block_hash_seed("other"));
  CHECK(c.erase_namespace(12345));  // unknown: nothing to do
  CHECK(c.check_invariants());
}

TEST_CASE("paged cache: clear and erase_namespace refuse while pages are locked") {
  Recorder rec;
  PagedPrefixCache<> c(1, eviction::Lru{}, rec.sink());
  c.insert(seq(0, 3), ids(0, 3));
  auto r = c.insert(seq(10, 2), ids(10, 2), 4);
  REQUIRE(c.lock(r.handle));
  rec.events.clear();
  std::vector<std::uint32_t> freed;
  CHECK_FALSE(c.erase_namespace(4, [&](std::uint32_t p) { freed.push_back(p); }));
  CHECK_FALSE(c.clear([&](std::uint32_t p) { freed.push_back(p); }));
  CHECK(freed.empty());
  CHECK(rec.events.empty());
  CHECK(c.cached_pages() == 5);
  CHECK(c.erase_namespace(0, [&](std::uint32_t p) { freed.push_back(p); }));
  CHECK(freed == Pages{2, 1, 0});
  REQUIRE(rec.events.size() == 1);
  CHECK(std::get<kv_event::Removed>(rec.events[0].data).block_hashes.size() == 3);
  CHECK(c.unlock(r.handle));
  freed.clear();
  CHECK(c.clear([&](std::uint32_t p) { freed.push_back(p); }));
  std::sort(freed.begin(), freed.end());
  CHECK(freed == Pages{10, 11});
  CHECK(std::holds_alternative<kv_event::Cleared>(rec.events.back().data));
  CHECK(c.stats().erased_pages == 3);
  CHECK(c.stats().cleared_pages == 2);
  CHECK_FALSE(c.valid(r.handle));
  CHECK(c.namespace_count() == 1);  // clear keeps namespaces
  CHECK(c.check_invariants());
}

TEST_CASE("paged cache: a handle survives splits of its node and nests locks") {
  PagedPrefixCache<> c(1);
  auto r = c.insert(seq(0, 6), ids(0, 6));
  REQUIRE(c.lock(r.handle));
  REQUIRE(c.lock(r.handle));
  CHECK(c.lock_count(r.handle) == 2);
  // Splits at 2 and 4 leave the handle naming the same end.
  auto a = c.match(seq(0, 2));
  auto b = c.insert(cat(seq(0, 4), Tokens{99}), Pages{0, 1, 2, 3, 50});
  CHECK(c.stats().splits == 2);
  CHECK(c.valid(r.handle));
  CHECK(c.lock_count(a.handle) == 0);
  CHECK_FALSE(c.unlock(a.handle));  // locks of a longer prefix do not count
  CHECK(c.locked_pages() == 6);
  CHECK(c.evictable_pages() == 1);
  CHECK(c.unlock(r.handle));
  CHECK(c.locked_pages() == 6);
  CHECK(c.unlock(r.handle));
  CHECK(c.locked_pages() == 0);
  CHECK(c.evictable_pages() == 7);
  CHECK(c.check_invariants());
  (void)b;
}

TEST_CASE("paged cache: LFU, FIFO, priority and SLRU order") {
  std::vector<std::uint32_t> freed;
  auto rec = [&](std::uint32_t p) { freed.push_back(p); };
  SECTION("LFU: fewer inserts first, then least recent") {
    PagedPrefixCache<std::uint32_t, eviction::Lfu> c(1);
    c.insert(Tokens{1}, Pages{1});
    c.insert(Tokens{2}, Pages{2});
    c.insert(Tokens{1}, Pages{1});  // a second hit on 1
    (void)c.match(Tokens{2});       // a match is not a hit
    c.insert(Tokens{3}, Pages{3});
    c.evict(3, rec);
    CHECK(freed == Pages{2, 3, 1});
  }
  SECTION("FIFO: creation order, accesses ignored") {
    PagedPrefixCache<std::uint32_t, eviction::Fifo> c(1);
    c.insert(Tokens{1}, Pages{1});
    c.insert(Tokens{2}, Pages{2});
    c.insert(Tokens{1}, Pages{1});
    (void)c.match(Tokens{1});
    c.evict(2, rec);
    CHECK(freed == Pages{1, 2});
  }
  SECTION("priority: lower priority first, raised by later inserts through the node") {
    PagedPrefixCache<std::uint32_t, eviction::Priority> c(1);
    c.insert(Tokens{1}, Pages{1}, 0, 5);
    c.insert(Tokens{2}, Pages{2}, 0, 1);
    c.insert(Tokens{3}, Pages{3}, 0, 1);
    c.insert(Tokens{2}, Pages{2}, 0, 9);  // raises 2
    (void)c.match(Tokens{3});
    c.evict(3, rec);
    CHECK(freed == Pages{3, 1, 2});
  }
  SECTION("SLRU: probationary before protected") {
    PagedPrefixCache<std::uint32_t, eviction::Slru> c(1, eviction::Slru{3});
    c.insert(Tokens{1}, Pages{1});
    c.insert(Tokens{1}, Pages{1});
    c.insert(Tokens{1}, Pages{1});  // three hits: protected
    c.insert(Tokens{2}, Pages{2});
    c.insert(Tokens{2}, Pages{2});  // two hits: still probationary with threshold 3
    c.evict(2, rec);
    CHECK(freed == Pages{2, 1});
  }
}

namespace {

// A policy written outside the library against the documented interface: the
// deepest pages go first, and it records what the cache tells it.
struct DeepestFirst {
  struct meta_type {
    std::uint64_t depth_end = 0;
  };
  using key_type = std::uint64_t;
  static constexpr bool monotone_keys = true;
  std::vector<std::size_t>* evicted_tokens = nullptr;

  meta_type on_create(const promptcache::PagedPolicyContext& c) noexcept {
    return {c.depth_pages + c.tokens.size()};
  }
  void on_match(meta_type&, const promptcache::PagedPolicyContext&) noexcept {}
  void on_insert_hit(meta_type&, const promptcache::PagedPolicyContext&) noexcept {}
  void on_evict(const meta_type&, const promptcache::PagedPolicyContext& c) noexcept {
    evicted_tokens->push_back(c.tokens.size());
  }
  key_type key(const meta_type& m) const noexcept { return ~m.depth_end; }
};

}  // namespace

TEST_CASE("paged cache: a policy defined outside the library plugs in") {
  std::vector<std::size_t> told;
  PagedPrefixCache<std::uint32_t, DeepestFirst> c(1, DeepestFirst{&told});
  c.insert(seq(0, 5), ids(0, 5));
  c.insert(seq(100, 2), ids(100, 2));
  std::vector<std::uint32_t> freed;
  c.evict(4, [&](std::uint32_t p) { freed.push_back(p); });
  // Metadata stays with a trimmed node: its key is unchanged, so it goes on.
  CHECK(freed == Pages{4, 3, 2, 1});
  CHECK(told == std::vector<std::size_t>{4});
  c.evict(2, [&](std::uint32_t p) { freed.push_back(p); });
  CHECK(freed == Pages{4, 3, 2, 1, 0, 101});
  CHECK(told == std::vector<std::size_t>{4, 1, 1});
  CHECK(c.check_invariants());
}

namespace {

// A policy with two key classes whose answers are out of range: leaves created at odd
// ticks claim class 7, and choose_class always answers 9.
struct OutOfRangeClasses {
  static constexpr std::size_t key_classes = 2;
  struct meta_type {
    std::uint64_t created = 0;
  };
  using key_type = std::uint64_t;
  static constexpr bool monotone_keys = true;

  meta_type on_create(const promptcache::PagedPolicyContext& c) noexcept { return {c.tick}; }
  void on_match(meta_type&, const promptcache::PagedPolicyContext&) noexcept {}
  void on_insert_hit(meta_type&, const promptcache::PagedPolicyContext&) noexcept {}
  void on_evict(const meta_type&, const promptcache::PagedPolicyContext&) noexcept {}
  key_type key(const meta_type& m) const noexcept { return m.created; }
  std::size_t key_class(const meta_type& m) const noexcept { return m.created % 2 == 0 ? 0 : 7; }
  std::size_t choose_class(std::span<const std::size_t>) const noexcept { return 9; }
};

}  // namespace

TEST_CASE("paged cache: a policy's out-of-range key class or choice counts as the last class") {
  PagedPrefixCache<std::uint32_t, OutOfRangeClasses> c(1);
  for (std::uint32_t t = 1; t <= 4; ++t)
    c.insert(Tokens{t}, Pages{t});  // ticks 1 to 4: pages 1 and 3 claim class 7
  CHECK(c.class_pages(0) == 2);
  CHECK(c.class_pages(1) == 2);
  CHECK(c.class_pages(7) == 0);
  CHECK(c.check_invariants());
  // The choice 9 is class 1: its oldest leaves first, then class 0's.
  std::vector<std::uint32_t> freed;
  CHECK(c.evict(4, [&](std::uint32_t p) { freed.push_back(p); }) == 4);
  CHECK(freed == Pages{1, 3, 2, 4});
  CHECK(c.check_invariants());
}

TEST_CASE("paged cache: a configured seed never answers for another namespace's id") {
  // A router asking for namespace 7 (or 0) must not find the blocks of namespace 5.
  KvIndex router;
  const KvWorker w{1, 0};
  PagedPrefixCache<> c(1, eviction::Lru{}, [&](const KvEvent& e) { router.apply(w, e); });
  const Tokens t = seq(1, 3);
  for (const char* salt : {"7", ""}) {
    CHECK_THROWS_AS(c.configure_namespace(5, "", salt), std::invalid_argument);
    CHECK(c.namespace_count() == 0);
  }
  c.insert(t, ids(10, 3), 5);
  for (const std::uint64_t other : {0U, 7U}) {
    promptcache::BlockHashOptions o;
    o.seed = c.namespace_seed(other);
    const auto m = router.find_matches(promptcache::local_block_hashes(t, 1, o));
    CHECK((m.empty() ? 0 : m[0].blocks) == c.peek(t, other));
    CHECK(c.peek(t, other) == 0);
  }
  CHECK(c.check_invariants());
}

TEST_CASE("paged cache: a throwing sink on insert leaves the cache unchanged, the id consumed") {
  bool fail = true;
  std::size_t delivered = 0;
  PagedPrefixCache<> c(1, eviction::Lru{}, [&](const KvEvent&) {
    if (fail) throw std::runtime_error("sink down");
    ++delivered;
  });
  // A new namespace: it is withdrawn again.
  CHECK_THROWS_AS(c.insert(seq(0, 2), ids(0, 2), 3), std::runtime_error);
  CHECK(c.cached_pages() == 0);
  CHECK(c.namespace_count() == 0);
  CHECK(c.next_event_id() == 1);
  CHECK(c.check_invariants());
  fail = false;
  c.insert(seq(0, 4), ids(0, 4));
  c.insert(cat(seq(0, 2), seq(50, 2)), ids(10, 4));  // two nodes under a split
  // Duplicates, a split and new pages: the engine's pages stay the engine's.
  const Tokens q = cat(seq(0, 3), seq(70, 3));
  const auto before = c.stats();
  const std::size_t nodes = c.node_count();
  const std::uint64_t next = c.next_event_id();
  fail = true;
  CHECK_THROWS_AS(c.insert(q, ids(100, 6)), std::runtime_error);
  CHECK(c.peek(q) == 3);
  CHECK(c.peek(seq(0, 4)) == 4);
  CHECK(c.cached_pages() == 6);
  CHECK(c.node_count() == nodes);
  CHECK(c.next_event_id() == next + 1);
  auto after = c.stats();
  CHECK(after.events == before.events + 1);  // the id is consumed
  after.events = before.events;
  CHECK(std::memcmp(&after, &before, sizeof after) == 0);
  CHECK(c.check_invariants());
  fail = false;
  const auto r = c.insert(q, ids(100, 6));
  CHECK(r.cached_pages == 3);
  CHECK(r.inserted_pages == 3);
  CHECK(r.duplicates == Pages{100, 101, 102});
  CHECK(c.lock(r.handle));
  CHECK(c.peek(q) == 6);
  CHECK(c.stats().splits == before.splits + 1);
  CHECK(delivered == 3);
  CHECK(c.check_invariants());
}

TEST_CASE("paged cache: a throwing sink on evict, erase or clear keeps the change") {
  bool fail = false;
  PagedPrefixCache<> c(1, eviction::Lru{}, [&](const KvEvent&) {
    if (fail) throw std::runtime_error("sink down");
  });
  c.insert(seq(0, 4), ids(0, 4));
  c.insert(seq(10, 2), ids(10, 2), 1);
  c.insert(seq(20, 2), ids(20, 2), 2);
  fail = true;
  std::vector<std::uint32_t> freed;
  const auto keep = [&](std::uint32_t p) { freed.push_back(p); };
  CHECK_THROWS_AS(c.evict(1, keep), std::runtime_error);
  CHECK(c.cached_pages() == 7);
  CHECK_THROWS_AS(c.erase_namespace(1, keep), std::runtime_error);
  CHECK(c.cached_pages() == 5);
  CHECK(c.namespace_count() == 2);
  CHECK_THROWS_AS(c.clear(keep), std::runtime_error);
  CHECK(c.cached_pages() == 0);
  CHECK(freed.size() == 8);  // the callbacks ran for every freed page
  CHECK(c.next_event_id() == 6);
  CHECK(c.check_invariants());
}

TEST_CASE("paged cache: statistics and memory") {
  PagedPrefixCache<> c(2);
  c.insert(seq(0, 8), ids(0, 4));
  c.insert(seq(0, 8), Pages{0, 9, 2, 3});
  (void)c.match(seq(0, 5));
  (void)c.match(seq(50, 4));
  c.evict(1);
  const auto& s = c.stats();
  CHECK(s.lookups == 2);
  CHECK(s.query_tokens == 9);
  CHECK(s.hit_tokens == 4);
  CHECK(s.inserts == 2);
  CHECK(s.inserted_pages == 4);
  CHECK(s.duplicate_pages == 1);
  CHECK(s.evicted_pages == 1);
  CHECK(s.cached_pages == 3);
  CHECK(s.splits == 1);  // the match of 5 tokens ends inside the first node
  CHECK(s.nodes == 2);
  CHECK(s.nodes == c.node_count());
  CHECK(s.locked_pages == 0);
  CHECK(s.events == 0);  // no sink
  CHECK_FALSE(c.publishes_events());
  const auto m = c.memory();
  CHECK(m.token_bytes >= 3 * 2 * sizeof(std::uint32_t));
  CHECK(m.index_bytes >= 3 * sizeof(std::uint32_t));
  const auto h = c.match(seq(0, 4)).handle;
  CHECK(c.lock(h));
  CHECK(c.stats().locked_pages == 2);
  CHECK(c.unlock(h));
  CHECK(c.stats().locked_pages == 0);
  CHECK(c.clear());
  CHECK(c.stats().nodes == 0);
  Recorder rec;
  PagedPrefixCache<> e(2, eviction::Lru{}, rec.sink());
  e.insert(seq(0, 8), ids(0, 4));
  e.evict(1);
  e.clear();
  CHECK(e.stats().events == 3);
  CHECK(e.stats().events == rec.events.size());
  CHECK(e.stats().nodes == 0);
}

TEST_CASE("paged cache: a moved-from cache's handles work in the new one") {
  PagedPrefixCache<> a(1);
  auto r = a.insert(seq(0, 3), ids(0, 3));
  PagedPrefixCache<> b(std::move(a));
  CHECK(b.lock(r.handle));
  CHECK(b.locked_pages() == 3);
  CHECK(b.unlock(r.handle));
  CHECK(b.check_invariants());
}

namespace {

// Page ids of the cache's own type.
template <class Cache>
std::vector<typename Cache::page_id> pids(std::uint32_t from, std::size_t n) {
  std::vector<typename Cache::page_id> p(n);
  std::iota(p.begin(), p.end(), typename Cache::page_id{from});
  return p;
}

// A moved-from cache is an empty cache of the same page size, without a sink: every
// operation works on it.
template <class Cache>
void check_moved_from_usable(Cache& c, std::size_t ps) {
  CHECK(c.check_invariants());
  CHECK(c.page_size() == ps);
  CHECK_FALSE(c.publishes_events());
  CHECK(c.cached_pages() == 0);
  CHECK(c.node_count() == 0);
  CHECK(c.namespace_count() == 0);
  CHECK(c.evictable_pages() == 0);
  CHECK(c.next_event_id() == 0);
  CHECK(c.stats().inserts == 0);
  CHECK(c.memory().token_bytes == 0);
  CHECK(c.peek(seq(0, 4 * ps)) == 0);
  CHECK(c.match(seq(0, 4 * ps)).matched == 0);
  CHECK(c.evict(3) == 0);
  CHECK(c.clear());
  const auto r = c.insert(seq(0, 4 * ps), pids<Cache>(0, 4), 2);
  CHECK(r.inserted_pages == 4);
  c.insert(cat(seq(0, 2 * ps), seq(90, 2 * ps)), pids<Cache>(10, 4), 2);
  CHECK(c.match(seq(0, 3 * ps), 2).matched == 3 * ps);
  CHECK(c.lock(r.handle));
  CHECK(c.evict(10) == 2);  // all but the locked path
  CHECK(c.unlock(r.handle));
  CHECK(c.evict(1) == 1);
  CHECK(c.cached_pages() == 3);
  CHECK(c.check_invariants());
  CHECK(c.erase_namespace(2));
  c.configure_namespace(4, "lora");
  c.insert(seq(0, ps), pids<Cache>(0, 1), 4);
  CHECK(c.cached_pages() == 1);
  CHECK(c.check_invariants());
}

// A cache with pages, locks, namespaces and free node slots (evicted and split nodes).
template <class Cache>
void fill(Cache& c, std::size_t ps) {
  c.configure_namespace(3, "lora", "x");
  c.insert(seq(0, 6 * ps), pids<Cache>(0, 6));
  c.insert(cat(seq(0, 3 * ps), seq(40, 3 * ps)), pids<Cache>(10, 6));
  c.insert(seq(100, 2 * ps), pids<Cache>(20, 2), 3);
  c.insert(seq(200, 2 * ps), pids<Cache>(30, 2), 1);
  (void)c.match(seq(0, ps));
  c.lock(c.match(seq(0, 6 * ps)).handle);
  c.evict(4);  // frees whole leaves: their slots go on the free list
  REQUIRE(c.check_invariants());
}

template <class Cache, class Make>
void moved_from_cases(Make make, std::size_t ps) {
  {  // move construction
    Cache a = make();
    fill(a, ps);
    const std::size_t cached = a.cached_pages();
    Cache b(std::move(a));
    CHECK(b.cached_pages() == cached);
    CHECK(b.check_invariants());
    check_moved_from_usable(a, ps);  // NOLINT(bugprone-use-after-move)
    CHECK(b.check_invariants());
  }
  {  // move assignment
    Cache a = make();
    fill(a, ps);
    Cache b = make();
    b.insert(seq(500, 3 * ps), pids<Cache>(50, 3));
    const std::size_t cached = a.cached_pages();
    b = std::move(a);
    CHECK(b.cached_pages() == cached);
    CHECK(b.check_invariants());
    check_moved_from_usable(a, ps);  // NOLINT(bugprone-use-after-move)
    // And moving into the moved-from cache works too.
    a = std::move(b);
    CHECK(a.cached_pages() == cached);
    CHECK(a.check_invariants());
    check_moved_from_usable(b, ps);  // NOLINT(bugprone-use-after-move)
  }
  {  // self-move assignment changes nothing
    Cache a = make();
    fill(a, ps);
    const std::size_t cached = a.cached_pages();
    Cache& self = a;
    a = std::move(self);
    CHECK(a.cached_pages() == cached);
    CHECK(a.check_invariants());
  }
}

}  // namespace

TEST_CASE("paged cache: a moved-from cache is empty and usable") {
  // Moves throw only where a member's would: a vector of caches moves them when it grows.
  STATIC_REQUIRE(std::is_nothrow_move_constructible_v<PagedPrefixCache<>>);
  STATIC_REQUIRE(std::is_nothrow_move_assignable_v<PagedPrefixCache<>>);
  STATIC_REQUIRE(
      std::is_nothrow_move_constructible_v<PagedPrefixCache<std::uint64_t, eviction::Adaptive>>);
  for (const std::size_t ps : {std::size_t{1}, std::size_t{3}}) {
    INFO("page size " << ps);
    moved_from_cases<PagedPrefixCache<>>([ps] { return PagedPrefixCache<>(ps); }, ps);
    Recorder rec;
    moved_from_cases<PagedPrefixCache<std::uint64_t, eviction::Adaptive>>(
        [ps, &rec] {
          return PagedPrefixCache<std::uint64_t, eviction::Adaptive>(ps, eviction::Adaptive(8),
                                                                     rec.sink());
        },
        ps);
  }
}

namespace {

// Calls every non-const member of `c` (each overload) from inside its event sink and
// counts the ones refused as documented: std::logic_error, or false from lock/unlock.
// Checks that the refusals changed nothing the const members can see.
struct Reentrant {
  PagedPrefixCache<>* c = nullptr;
  bool armed = false;
  std::size_t refused = 0;
  std::size_t calls = 0;
  bool unchanged = true;
  PagedPrefixHandle held;  // a handle valid when the sink runs

  void probe() {
    const auto before = c->stats();
    const std::uint64_t next = c->next_event_id();
    const std::size_t namespaces = c->namespace_count();
    const Tokens q = seq(0, 2);
    const Pages p = ids(900, 2);
    std::vector<std::uint32_t> out(4);
    const auto expect_throw = [&](auto&& call) {
      ++calls;
      try {
        call();
      } catch (const std::logic_error&) {
        ++refused;
      }
    };
    expect_throw([&] { (void)c->match(q); });
    expect_throw([&] { (void)c->match(q, 0, out); });
    expect_throw([&] { (void)c->match(q, 0, std::span<std::uint32_t>(out)); });
    expect_throw([&] { (void)c->insert(seq(500, 2), p); });
    expect_throw([&] { (void)c->insert(seq(500, 2), p, 77); });
    expect_throw([&] { (void)c->evict(1); });
    expect_throw([&] { (void)c->evict(1, [](std::uint32_t) noexcept {}); });
    expect_throw([&] { (void)c->clear(); });
    expect_throw([&] { (void)c->clear([](std::uint32_t) noexcept {}); });
    expect_throw([&] { (void)c->erase_namespace(0); });
    expect_throw([&] { (void)c->erase_namespace(0, [](std::uint32_t) noexcept {}); });
    expect_throw([&] { c->configure_namespace(78, "lora"); });
    calls += 2;
    refused += c->lock(held) ? 0U : 1U;
    refused += c->unlock(held) ? 0U : 1U;
    // Const members still answer.
    (void)c->peek(q);
    unchanged = unchanged && c->stats().lookups == before.lookups &&
                c->stats().inserts == before.inserts && c->stats().events == before.events &&
                c->next_event_id() == next && c->namespace_count() == namespaces &&
                c->lock_count(held) == (held.empty() ? 0U : 1U) && c->valid(held);
  }

  auto sink() {
    return [this](const KvEvent&) {
      if (armed) probe();
    };
  }
};

}  // namespace

TEST_CASE("paged cache: a non-const call from the event sink is refused and changes nothing") {
  Reentrant re;
  PagedPrefixCache<> c(1, eviction::Lru{}, re.sink());
  re.c = &c;
  c.insert(seq(1, 4), ids(10, 4));
  c.insert(seq(0, 2), ids(0, 2));
  c.insert(seq(40, 3), ids(40, 3), 5);
  re.held = c.insert(seq(0, 2), ids(0, 2)).handle;
  REQUIRE(c.lock(re.held));
  const std::size_t per_event = 14;

  SECTION("from insert, across a split") {
    re.armed = true;
    const auto r = c.insert(Tokens{1, 2, 9}, Pages{10, 11, 20});
    CHECK(r.cached_pages == 2);
    CHECK(r.inserted_pages == 1);
    re.armed = false;
    CHECK(c.check_invariants());
    const auto m = c.match(Tokens{1, 2, 3, 9});
    CHECK(m.matched == 3);
    CHECK(m.pages == Pages{10, 11, 12});
    CHECK(c.match(Tokens{1, 2, 9}).pages == Pages{10, 11, 20});
  }
  SECTION("from insert into a new namespace") {
    re.armed = true;
    c.insert(seq(60, 2), ids(60, 2), 9);
    re.armed = false;
    CHECK(c.namespace_count() == 3);
    CHECK(c.peek(seq(60, 2), 9) == 2);
  }
  SECTION("from evict") {
    re.armed = true;
    CHECK(c.evict(2) == 2);
    re.armed = false;
    CHECK(c.cached_pages() == 7);
  }
  SECTION("from erase_namespace") {
    re.armed = true;
    CHECK(c.erase_namespace(5));
    re.armed = false;
    CHECK(c.namespace_count() == 1);
    CHECK(c.cached_pages() == 6);
  }
  SECTION("from clear") {
    REQUIRE(c.unlock(re.held));
    re.held = {};  // an empty handle: lock and unlock are refused all the same
    re.armed = true;
    CHECK(c.clear());
    re.armed = false;
    CHECK(c.cached_pages() == 0);
  }
  CHECK(re.calls == per_event);
  CHECK(re.refused == per_event);
  CHECK(re.unchanged);
  CHECK(c.check_invariants());
  // Outside the sink every member works again.
  CHECK(c.lock(re.held));
  CHECK(c.unlock(re.held));
  (void)c.match(seq(0, 2));
  CHECK(c.check_invariants());
}

namespace {

// Lru whose move assignment throws when armed (so the cache's is not noexcept).
struct ThrowingMoveLru : eviction::Lru {
  static inline bool arm = false;
  ThrowingMoveLru() = default;
  ThrowingMoveLru(const ThrowingMoveLru&) = default;
  ThrowingMoveLru(ThrowingMoveLru&&) = default;
  ThrowingMoveLru& operator=(const ThrowingMoveLru&) = default;
  ThrowingMoveLru& operator=(ThrowingMoveLru&&) {
    if (arm) throw std::runtime_error("policy move");
    return *this;
  }
  ~ThrowingMoveLru() = default;
};

}  // namespace

TEST_CASE("paged cache: a move assignment whose policy move throws changes nothing") {
  using Cache = PagedPrefixCache<std::uint32_t, ThrowingMoveLru>;
  STATIC_REQUIRE(!std::is_nothrow_move_assignable_v<Cache>);
  Cache a(4);
  Cache b(1);
  const Tokens t = seq(0, 8);
  a.insert(t, ids(100, 2));
  b.insert(seq(50, 3), ids(50, 3));
  ThrowingMoveLru::arm = true;
  CHECK_THROWS_AS(a = std::move(b), std::runtime_error);
  ThrowingMoveLru::arm = false;
  CHECK(a.page_size() == 4);
  CHECK(a.cached_pages() == 2);
  CHECK(a.check_invariants());
  const auto m = a.match(t);
  CHECK(m.matched == 8);
  CHECK(m.pages == Pages{100, 101});
  CHECK(b.page_size() == 1);
  CHECK(b.cached_pages() == 3);
  CHECK(b.check_invariants());
  a = std::move(b);
  CHECK(a.page_size() == 1);
  CHECK(a.peek(seq(50, 3)) == 3);
}

TEST_CASE("paged cache: block_hashes equals the block names a KvIndex fed by its events holds") {
  Recorder rec;
  PagedPrefixCache<std::uint32_t> c(2, eviction::Lru{}, rec.sink());
  PagedPrefixCache<std::uint32_t> silent(2);  // no sink: hashes computed from the tokens alone
  KvIndex index;
  const KvWorker w{1, 0};
  const auto feed = [&] {
    for (const auto& e : rec.events)
      REQUIRE(index.apply(w, e).ok());
    rec.events.clear();
  };
  CHECK(c.block_hashes().empty());
  c.configure_namespace(3, "lora-a", "salt");
  silent.configure_namespace(3, "lora-a", "salt");
  std::uint32_t page = 0;
  std::uint64_t rng = 7;
  for (int i = 0; i < 300; ++i) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    // Prompts share one of four 4-token prefixes, then 2 to 9 tokens of their own.
    const auto prefix = static_cast<std::uint32_t>((rng >> 33) % 4);
    Tokens t = cat(seq(prefix * 100, 4), seq(static_cast<std::uint32_t>((rng >> 40) % 50),
                                             2 + static_cast<std::size_t>((rng >> 20) % 8)));
    const std::uint64_t ns = (rng >> 50) % 3 == 0 ? 3 : 0;
    for (auto* cache : {&c, &silent}) {
      cache->insert(t, ids(page, t.size()), ns);
      if (cache->cached_pages() > 20) cache->evict(cache->cached_pages() - 16);
    }
    page += static_cast<std::uint32_t>(t.size());
    if (i % 50 == 0) {
      feed();
      REQUIRE(c.block_hashes() == index.block_hashes(w));
      REQUIRE(silent.block_hashes() == c.block_hashes());
    }
  }
  feed();
  const std::vector<std::uint64_t> hashes = c.block_hashes();
  CHECK(hashes.size() == c.cached_pages());
  CHECK(std::is_sorted(hashes.begin(), hashes.end()));
  CHECK(hashes == index.block_hashes(w));
  CHECK(silent.block_hashes() == hashes);
  CHECK(c.clear());
  CHECK(c.block_hashes().empty());
}
