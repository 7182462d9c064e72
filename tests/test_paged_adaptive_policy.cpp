// Unit tests of eviction::Adaptive in PagedPrefixCache and of its ghost history:
// ARC's rules on small sequences worked out by hand (page size 1, so a page is
// one token), the leaf-only fallbacks, and every bad input of the policy.
#include <promptcache/paged_prefix_cache.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <vector>

#include "catch.hpp"

using promptcache::PagedPrefixCache;
namespace eviction = promptcache::eviction;
using promptcache::detail::PagedGhostHistory;
using promptcache::detail::PagedShadowCache;

namespace {

using Tokens = std::vector<std::uint32_t>;
using Pages = std::vector<std::uint32_t>;
using Cache = PagedPrefixCache<std::uint32_t, eviction::Adaptive>;
// ARC's rule alone: the cases worked out by hand for ARC pin it.
constexpr auto Arc = eviction::Adaptive::Mode::arc;

std::vector<std::uint32_t> evict(Cache& c, std::size_t n) {
  std::vector<std::uint32_t> got;
  c.evict(n, [&](std::uint32_t p) noexcept { got.push_back(p); });
  return got;
}

}  // namespace

TEST_CASE("adaptive: pages used again outlive older pages used once; ghosts move the target") {
  // capacity 4 pages, 2 x 4 ghosts, full ARC steps.
  Cache c(1, eviction::Adaptive(4, 2.0, 1.0, Arc));
  c.insert(Tokens{1}, Pages{10});            // A: used once (T1)
  c.insert(Tokens{2}, Pages{11});            // B: T1
  REQUIRE(c.match(Tokens{1}).matched == 1);  // A used again: T2
  c.insert(Tokens{3}, Pages{12});            // C: T1
  c.insert(Tokens{4}, Pages{13});            // D: T1
  CHECK(c.class_pages(0) == 3);
  CHECK(c.class_pages(1) == 1);
  CHECK(c.policy().target() == 0.0);

  // |T1| = 3 > p = 0: the least recent page of T1 goes (B), not A, which LRU
  // would take (A's last use is older than B's insert).
  CHECK(evict(c, 1) == std::vector<std::uint32_t>{11});
  CHECK(c.policy().ghosts_once() == 1);

  // B comes back while on B1: p += max(|B2| / |B1|, 1) = 1, and B is filed as used again.
  c.insert(Tokens{2}, Pages{14});
  CHECK(c.policy().target() == 1.0);
  CHECK(c.policy().ghosts_once() == 0);
  CHECK(c.class_pages(0) == 2);  // C, D
  CHECK(c.class_pages(1) == 2);  // A, B

  // |T1| = 2 > 1: C (T1's least recent). Then |T1| = 1 = p: T2's least recent, A.
  CHECK(evict(c, 2) == std::vector<std::uint32_t>{12, 10});
  CHECK(c.policy().ghosts_once() == 1);    // C
  CHECK(c.policy().ghosts_reused() == 1);  // A

  // A comes back while on B2: p -= max(|B1| / |B2|, 1) = 1.
  c.insert(Tokens{1}, Pages{15});
  CHECK(c.policy().target() == 0.0);
  CHECK(c.policy().ghosts_reused() == 0);
  CHECK(c.class_pages(1) == 2);  // B and A, back
  CHECK(c.class_pages(0) == 1);  // D
  CHECK(c.check_invariants());
}

TEST_CASE("adaptive: a ghost step is ARC's ratio of the ghost lists, bounded by the capacity") {
  // Three used-again pages go to B2, then one used-once page to B1; its return
  // moves p by |B2| / |B1| = 3 / 1, capped at the capacity of 2.
  Cache c(1, eviction::Adaptive(2, 4.0, 1.0));
  for (std::uint32_t t = 1; t <= 3; ++t) {
    c.insert(Tokens{t}, Pages{t});
    CHECK(c.match(Tokens{t}).matched == 1);
  }
  c.insert(Tokens{9}, Pages{9});
  CHECK(evict(c, 4).size() == 4);  // T1 first (9), then T2
  CHECK(c.policy().ghosts_once() == 1);
  CHECK(c.policy().ghosts_reused() == 3);
  c.insert(Tokens{9}, Pages{19});
  CHECK(c.policy().target() == 2.0);
}

TEST_CASE("adaptive: the class is picked again before every page of a leaf") {
  Cache c(1, eviction::Adaptive(8, 2.0, 1.0, Arc));
  c.insert(Tokens{1}, Pages{1});
  CHECK(evict(c, 1) == std::vector<std::uint32_t>{1});
  c.insert(Tokens{1}, Pages{2});  // back from B1: p = 1, used again
  REQUIRE(c.policy().target() == 1.0);
  c.insert(Tokens{7, 8, 9}, Pages{20, 21, 22});  // one T1 leaf of 3 pages
  // 3 > 1 and 2 > 1: the leaf's tail pages; then |T1| = 1 = p: T2's page.
  CHECK(evict(c, 3) == std::vector<std::uint32_t>{22, 21, 2});
  CHECK(c.match(Tokens{7, 8, 9}).matched == 1);  // the leaf's head stayed
  CHECK(c.check_invariants());
}

TEST_CASE("adaptive: only leaves are evicted, and a class without one yields to the other") {
  Cache c(1, eviction::Adaptive(8));
  c.insert(Tokens{1, 2}, Pages{1, 2});
  REQUIRE(c.match(Tokens{1}).matched == 1);  // splits: [1] used again, [2] still once
  // [1, 2] was stored cold (2 new pages, no prefix): T1 is classes 0 and 2.
  CHECK(c.class_pages(2) == 1);
  CHECK(c.class_pages(1) == 1);
  // T1 first: [2]; then T1 is empty and [1] (a leaf now) goes.
  CHECK(evict(c, 2) == std::vector<std::uint32_t>{2, 1});

  // The picked class (T1) holds only a locked page: T2 gives its page instead.
  Cache d(1, eviction::Adaptive(8));
  const auto x = d.insert(Tokens{5}, Pages{5});
  REQUIRE(d.lock(x.handle));
  d.insert(Tokens{6}, Pages{6});
  CHECK(d.match(Tokens{6}).matched == 1);
  CHECK(d.class_pages(0) + d.class_pages(2) == 1);
  CHECK(evict(d, 2) == std::vector<std::uint32_t>{6});  // only what is evictable
  CHECK(d.cached_pages() == 1);
  CHECK(d.check_invariants());
}

TEST_CASE("adaptive: without a capacity there is no history and pages used again stay") {
  Cache c(1, eviction::Adaptive(0, 8.0, 1.0, Arc));
  CHECK(c.policy().ghost_capacity() == 0);
  c.insert(Tokens{1}, Pages{1});
  CHECK(c.match(Tokens{1}).matched == 1);
  c.insert(Tokens{2}, Pages{2});
  CHECK(evict(c, 1) == std::vector<std::uint32_t>{2});
  c.insert(Tokens{2}, Pages{3});  // nothing remembered: used once again, p unmoved
  CHECK(c.class_pages(0) == 1);
  CHECK(c.policy().target() == 0.0);
  CHECK(evict(c, 2) == std::vector<std::uint32_t>{3, 1});
}

TEST_CASE("adaptive: ghosts are per namespace and per page position") {
  Cache c(1, eviction::Adaptive(8, 2.0, 1.0));
  c.insert(Tokens{1, 2}, Pages{1, 2});
  CHECK(evict(c, 2) == std::vector<std::uint32_t>{2, 1});
  CHECK(c.policy().ghosts_once() == 2);
  c.insert(Tokens{2}, Pages{3}, 7);  // token 2 at depth 0 in namespace 7: not a ghost
  c.insert(Tokens{2}, Pages{4});     // token 2 at depth 0 in namespace 0: not a ghost either
  CHECK(c.policy().ghosts_once() == 2);
  CHECK(c.policy().target() == 0.0);
  c.insert(Tokens{1, 2}, Pages{5, 6});  // both pages come back
  CHECK(c.policy().ghosts_once() == 0);
  CHECK(c.class_pages(1) == 2);
}

TEST_CASE("adaptive: a run of pages that brings new ones is filed as used once") {
  Cache c(1, eviction::Adaptive(8, 2.0, 1.0));
  c.insert(Tokens{1, 2}, Pages{1, 2});
  CHECK(evict(c, 2) == std::vector<std::uint32_t>{2, 1});
  // [1, 2] come back with a new page 3 behind them: one node, used once; both
  // ghosts still move the target.
  c.insert(Tokens{1, 2, 3}, Pages{4, 5, 6});
  CHECK(c.class_pages(0) + c.class_pages(2) == 3);
  CHECK(c.class_pages(1) == 0);
  CHECK(c.policy().target() == 2.0);
  CHECK(c.policy().ghosts_once() == 0);
}

TEST_CASE("adaptive: bad parameters are refused") {
  CHECK_THROWS_AS(eviction::Adaptive(8, -1.0), std::invalid_argument);
  CHECK_THROWS_AS(eviction::Adaptive(8, std::nan("")), std::invalid_argument);
  CHECK_THROWS_AS(eviction::Adaptive(8, std::numeric_limits<double>::infinity()),
                  std::invalid_argument);
  CHECK_THROWS_AS(eviction::Adaptive(8, 6.0, -0.5), std::invalid_argument);
  CHECK_THROWS_AS(eviction::Adaptive(std::numeric_limits<std::size_t>::max()), std::length_error);
  // A zero factor or step is allowed: no history, or a target that never moves.
  CHECK(eviction::Adaptive(8, 0.0).ghost_capacity() == 0);
  Cache c(1, eviction::Adaptive(8, 2.0, 0.0));
  c.insert(Tokens{1}, Pages{1});
  evict(c, 1);
  c.insert(Tokens{1}, Pages{2});
  CHECK(c.policy().target() == 0.0);
  CHECK(c.class_pages(1) == 1);  // still recognized
}

TEST_CASE("adaptive: factors and steps up to 10^9 are accepted, larger or non-finite ones not") {
  const double inf = std::numeric_limits<double>::infinity();
  CHECK_THROWS_AS(eviction::Adaptive(8, 2e9), std::invalid_argument);
  CHECK_THROWS_AS(eviction::Adaptive(8, 2.0, 2e9), std::invalid_argument);
  CHECK_THROWS_AS(eviction::Adaptive(8, 2.0, inf), std::invalid_argument);
  CHECK_THROWS_AS(eviction::Adaptive(8, 2.0, std::nan("")), std::invalid_argument);
  // Large factors are refused by the size of the history they ask for, not by the check.
  CHECK_THROWS_AS(eviction::Adaptive(2, 1e9), std::length_error);
  CHECK(eviction::Adaptive(0, 1e9).ghost_capacity() == 0);

  // The largest step: one ghost moves the target to a bound at once.
  Cache c(1, eviction::Adaptive(4, 2.0, 1e9));
  c.insert(Tokens{1}, Pages{1});
  CHECK(evict(c, 1) == std::vector<std::uint32_t>{1});
  c.insert(Tokens{1}, Pages{2});  // back from B1
  CHECK(c.policy().target() == 4.0);
  CHECK(c.match(Tokens{1}).matched == 1);
  CHECK(evict(c, 1) == std::vector<std::uint32_t>{2});
  CHECK(c.policy().ghosts_reused() == 1);
  c.insert(Tokens{1}, Pages{3});  // back from B2
  CHECK(c.policy().target() == 0.0);
  CHECK(c.check_invariants());
}

TEST_CASE("adaptive: a ghost factor of 0 keeps no history, as a capacity of 0 does") {
  Cache c(1, eviction::Adaptive(8, 0.0, 1.0, Arc));
  CHECK(c.policy().ghost_capacity() == 0);
  c.insert(Tokens{1}, Pages{1});
  CHECK(c.match(Tokens{1}).matched == 1);  // used again
  c.insert(Tokens{2}, Pages{2});
  CHECK(evict(c, 1) == std::vector<std::uint32_t>{2});
  CHECK(c.policy().ghosts_once() + c.policy().ghosts_reused() == 0);
  c.insert(Tokens{2}, Pages{3});  // not recognized: used once again, the target unmoved
  CHECK(c.class_pages(0) == 1);
  CHECK(c.policy().target() == 0.0);
  // Pages used again are kept over pages used once, however old.
  CHECK(evict(c, 2) == std::vector<std::uint32_t>{3, 1});
  CHECK(c.check_invariants());
}

TEST_CASE("ghost history: keeps the newest G ghosts and forgets those that came back") {
  PagedGhostHistory g(2);
  CHECK(g.capacity() == 2);
  g.push(100, 1);
  g.push(200, 1);
  g.push(300, 2);  // third ghost: the oldest (100) is forgotten
  CHECK(g.size(1) == 1);
  CHECK(g.size(2) == 1);
  CHECK(g.take(100) == 0);
  CHECK(g.take(200) == 1);
  CHECK(g.take(200) == 0);  // taken once
  CHECK(g.take(300) == 2);
  CHECK(g.size(1) + g.size(2) == 0);

  // Re-recording a fingerprint keeps one ghost, with the newest tag.
  g.push(5, 1);
  g.push(5, 2);
  CHECK(g.size(1) == 0);
  CHECK(g.size(2) == 1);
  CHECK(g.take(5) == 2);
}

TEST_CASE("ghost history: holes of returned ghosts are reused, oldest slot first") {
  PagedGhostHistory g(2);  // 2 ghosts, 4 ring slots
  g.push(1, 1);
  g.push(2, 1);
  CHECK(g.take(2) == 1);
  g.push(3, 1);
  CHECK(g.take(3) == 1);
  g.push(4, 1);
  CHECK(g.take(4) == 1);
  // Ring: 1, hole, hole, hole. One ghost live, but the ring is full: the next
  // ghost reuses the oldest slot, and ghost 1 goes although only one was held.
  g.push(5, 2);
  CHECK(g.take(1) == 0);
  CHECK(g.take(5) == 2);

  // Colliding index positions (same low bits) survive each other's removal.
  PagedGhostHistory h(4);
  const std::uint64_t base = 3, stride = std::uint64_t{1} << 32;
  for (std::uint64_t i = 0; i < 4; ++i)
    h.push(base + i * stride, 1);
  CHECK(h.take(base + stride) == 1);
  CHECK(h.take(base) == 1);
  CHECK(h.take(base + 3 * stride) == 1);
  CHECK(h.take(base + 2 * stride) == 1);

  PagedGhostHistory none(0);
  none.push(1, 1);
  CHECK(none.take(1) == 0);
  CHECK_THROWS_AS(PagedGhostHistory(std::size_t{1} << 31), std::length_error);
}

TEST_CASE("ghost history: a moved-from history holds nothing") {
  PagedGhostHistory g(4);
  g.push(9, 1);
  PagedGhostHistory h(std::move(g));
  CHECK(h.take(9) == 1);
  CHECK(g.capacity() == 0);  // NOLINT(bugprone-use-after-move): the documented state
  g.push(1, 1);
  CHECK(g.take(1) == 0);
}

TEST_CASE("adaptive: a moved-from policy has no history and a target of 0") {
  Cache c(1, eviction::Adaptive(4, 2.0, 1.0, Arc));
  c.insert(Tokens{1}, Pages{10});
  c.insert(Tokens{2}, Pages{11});
  REQUIRE(evict(c, 1) == std::vector<std::uint32_t>{10});
  c.insert(Tokens{1}, Pages{12});  // back from B1: the target rises
  REQUIRE(c.policy().target() == 1.0);
  // |T1| = 1 is not above p = 1: T2's page goes, onto B2.
  REQUIRE(evict(c, 1) == std::vector<std::uint32_t>{12});
  REQUIRE(c.policy().ghosts_reused() == 1);

  Cache b(std::move(c));  // the policy's move constructor
  CHECK(b.policy().target() == 1.0);
  CHECK(b.policy().ghosts_reused() == 1);
  CHECK(c.policy().target() == 0.0);
  CHECK(c.policy().ghost_capacity() == 0);
  Cache d(1, eviction::Adaptive(4));
  d = std::move(b);  // the policy's move assignment
  CHECK(d.policy().target() == 1.0);
  CHECK(d.policy().ghosts_reused() == 1);
  CHECK(b.policy().target() == 0.0);
  CHECK(b.policy().ghost_capacity() == 0);
  // A moved-from policy still runs: with no history the target stays 0.
  b.insert(Tokens{2}, Pages{20});
  CHECK(evict(b, 1) == std::vector<std::uint32_t>{20});
  b.insert(Tokens{2}, Pages{21});
  CHECK(b.policy().target() == 0.0);
  CHECK(b.check_invariants());
  // Self-move assignment keeps everything.
  eviction::Adaptive p(4, 2.0);
  eviction::Adaptive& alias = p;
  p = std::move(alias);
  CHECK(p.ghost_capacity() == 8);
}

TEST_CASE("adaptive (learned): LRU leads at first and sees each class's next victim") {
  for (const auto mode : {eviction::Adaptive::Mode::learned, Arc}) {
    Cache c(1, eviction::Adaptive(4, 8.0, 1.0, mode));
    CHECK(c.policy().leader() == (mode == Arc ? 1U : 0U));
    c.insert(Tokens{1}, Pages{1});             // A
    REQUIRE(c.match(Tokens{1}).matched == 1);  // A used again (T2), tick 2
    c.insert(Tokens{2}, Pages{2});             // B: T1, tick 3
    c.insert(Tokens{3}, Pages{3});             // C: T1, tick 4
    // LRU: T2's next victim (A, tick 2) is older than T1's (B, tick 3), so A
    // goes, as eviction::Lru would do, from the first eviction on. ARC keeps A
    // and takes B.
    if (mode == Arc)
      CHECK(evict(c, 1) == std::vector<std::uint32_t>{2});
    else
      CHECK(evict(c, 1) == std::vector<std::uint32_t>{1});
    CHECK(c.check_invariants());
  }
}

TEST_CASE("ghost history: tags keep the caller's bits and take() tells the age") {
  PagedGhostHistory g(4);
  g.push(1, 1 | (5 << 2));
  g.push(2, 2);
  g.push(3, 1);
  CHECK(g.size(1) == 2);
  CHECK(g.size(2) == 1);
  std::size_t age = 99;
  CHECK(g.take(1, age) == (1 | (5 << 2)));
  CHECK(age == 2);
  CHECK(g.take(3, age) == 1);
  CHECK(age == 0);
  age = 7;
  CHECK(g.take(42, age) == 0);
  CHECK(age == 7);  // untouched without a ghost
  CHECK(g.size(1) == 0);
}

TEST_CASE("adaptive (learned): without a capacity there is no history and LRU decides") {
  Cache c(1, eviction::Adaptive(0));
  CHECK(c.policy().ghost_capacity() == 0);
  c.insert(Tokens{1}, Pages{1});
  REQUIRE(c.match(Tokens{1}).matched == 1);  // A: used again
  c.insert(Tokens{2}, Pages{2});             // B: used once, newer
  // The older page goes, whatever its class, with no probe: A before B, then
  // C, D and E in their order.
  c.insert(Tokens{3}, Pages{3});
  c.insert(Tokens{4}, Pages{4});
  c.insert(Tokens{5}, Pages{5});
  CHECK(evict(c, 5) == std::vector<std::uint32_t>{1, 2, 3, 4, 5});
  CHECK(c.policy().leader() == 0);
  CHECK(c.policy().target() == 0.0);
  CHECK(c.check_invariants());
}

namespace {

// Serves `tokens` as an engine does (match, evict what the new pages need,
// insert) with a pool of `free` page ids; returns the tokens matched.
template <class C>
std::size_t serve(C& c, const Tokens& tokens, std::vector<std::uint32_t>& free) {
  const std::size_t hit = c.match(tokens).matched;
  const std::size_t need = tokens.size() - hit;
  if (free.size() < need)
    c.evict(need - free.size(), [&](std::uint32_t p) noexcept { free.push_back(p); });
  Pages pages;
  for (std::size_t i = 0; i < need; ++i) {
    pages.push_back(free.back());
    free.pop_back();
  }
  Pages all(hit, 0);  // the matched pages keep theirs: insert reads only the new ones
  all.insert(all.end(), pages.begin(), pages.end());
  c.insert(tokens, all);
  return hit;
}

}  // namespace

TEST_CASE("adaptive (learned): following LRU evicts exactly as eviction::Lru does") {
  // No ghost history: the policy follows its LRU expert with no probe. It sees
  // each class's next victim, so it evicts the same pages as eviction::Lru on
  // any traffic (judging a class by its last eviction instead went wrong each
  // time a class had not been evicted from for a while).
  PagedPrefixCache<std::uint32_t, eviction::Lru> lru(1);
  Cache ad(1, eviction::Adaptive(0));
  std::vector<std::uint32_t> free_lru, free_ad;
  for (std::uint32_t p = 0; p < 12; ++p) {
    free_lru.push_back(p);
    free_ad.push_back(p);
  }
  std::uint64_t x = 12345;
  auto next = [&] {  // splitmix64
    x += 0x9e3779b97f4a7c15ULL;
    std::uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  std::size_t hits_lru = 0, hits_ad = 0;
  for (int i = 0; i < 3000; ++i) {
    // A prompt: one of 6 prefixes of 1-3 pages, then 0-3 pages of 3 tails.
    const auto prefix = static_cast<std::uint32_t>(next() % 6);
    Tokens t;
    for (std::uint32_t j = 0; j <= prefix % 3; ++j)
      t.push_back(100 * prefix + j);
    const auto tail = static_cast<std::uint32_t>(next() % 3);
    for (std::uint32_t j = 0; j < next() % 4; ++j)
      t.push_back(1000 + 100 * tail + j);
    if (next() % 4 == 0) {
      (void)lru.match(t);  // a match alone: an access with no store
      (void)ad.match(t);
      continue;
    }
    hits_lru += serve(lru, t, free_lru);
    hits_ad += serve(ad, t, free_ad);
    REQUIRE(hits_ad == hits_lru);
    REQUIRE(free_ad.size() == free_lru.size());
  }
  CHECK(hits_lru > 0);
  CHECK(ad.policy().leader() == 0);
  CHECK(ad.check_invariants());
}

TEST_CASE("adaptive (learned): a thrashing cache keeps pages used again") {
  // 6 pages return every round, each after 18 one-off pages: 24 pages between
  // two uses of a page, more than 2 x the 8 pages of the cache. LRU never hits;
  // the returns come back far, so the policy follows used-once first, which
  // keeps the returning pages (back from the ghosts: T2) and lets the one-off
  // pages (T1) go.
  PagedPrefixCache<std::uint32_t, eviction::Lru> lru(1);
  Cache ad(1, eviction::Adaptive(8));
  std::vector<std::uint32_t> free_lru, free_ad;
  for (std::uint32_t p = 0; p < 8; ++p) {
    free_lru.push_back(p);
    free_ad.push_back(p);
  }
  std::uint32_t once = 1000;
  std::size_t hits_lru = 0, late_ad = 0;
  for (int round = 0; round < 40; ++round) {
    for (std::uint32_t k = 0; k < 6; ++k) {
      const std::size_t l = serve(lru, Tokens{k}, free_lru);
      const std::size_t a = serve(ad, Tokens{k}, free_ad);
      hits_lru += l;
      if (round >= 20) late_ad += a;
      for (int j = 0; j < 3; ++j, ++once) {
        (void)serve(lru, Tokens{once}, free_lru);
        (void)serve(ad, Tokens{once}, free_ad);
      }
    }
    if (round == 1) {  // the 6 pages came back once, all far: thrashing
      CHECK(ad.policy().thrashing());
      CHECK(ad.policy().leader() == 2);
    }
  }
  CHECK(hits_lru == 0);
  CHECK(late_ad >= 100);  // of 120 uses in the last 20 rounds
  CHECK(ad.check_invariants());
}

TEST_CASE("adaptive (learned): choose_class with too few tops or classes falls back") {
  eviction::Adaptive p(0);  // no history: the LRU rule decides
  const std::size_t pages[3] = {3, 2, 0};
  const std::uint64_t older = 5, newer = 9;
  const std::uint64_t* tops[3] = {&newer, &older, nullptr};
  // With every top, the class whose next victim is older: T2.
  CHECK(p.choose_class(pages, std::span<const std::uint64_t* const>(tops)) == 1);
  // A class with no evictable leaf is never the LRU rule's choice.
  const std::uint64_t* t1_only[3] = {&newer, nullptr, nullptr};
  CHECK(p.choose_class(pages, std::span<const std::uint64_t* const>(t1_only)) == 0);
  const std::uint64_t* cold_only[3] = {nullptr, nullptr, &older};
  CHECK(p.choose_class(pages, std::span<const std::uint64_t* const>(cold_only)) == 2);
  // Too few tops: as choose_class(pages), which knows no evictions yet (every
  // class at key 0) and takes T1.
  CHECK(p.choose_class(pages, std::span<const std::uint64_t* const>(tops, 1)) == 0);
  CHECK(p.choose_class(pages, std::span<const std::uint64_t* const>()) == 0);
  CHECK(p.choose_class(std::span<const std::size_t>(pages)) == 0);
  // Too few page counts: class 0 unless the only count given is of an empty T1.
  CHECK(p.choose_class(std::span<const std::size_t>(pages, 2)) == 0);
  const std::size_t empty_t1[2] = {0, 4};
  CHECK(p.choose_class(std::span<const std::size_t>(empty_t1)) == 1);
  CHECK(p.choose_class(std::span<const std::size_t>()) == 0);
  CHECK(p.choose_class(std::span<const std::size_t>(pages, 2),
                       std::span<const std::uint64_t* const>(tops)) == 0);
}

TEST_CASE("adaptive (learned): the rule whose miniature serves more leads, without thrashing") {
  // 4 pages return every round, each after 8 one-off pages: 12 pages between
  // two uses of a page, more than the 8 pages of the cache, so LRU never hits.
  // They come back 4 evictions after they left, not far (under 2 x 8): the
  // cache does not thrash. Used-once first keeps them (back from the ghosts:
  // T2) and cycles the one-off pages through T1; its miniature (every page:
  // the cache is small) sees that and the policy follows a rule that keeps them.
  PagedPrefixCache<std::uint32_t, eviction::Lru> lru(1);
  Cache ad(1, eviction::Adaptive(8));
  REQUIRE(ad.policy().sample_shift() == 0);
  REQUIRE(ad.policy().sampled_capacity() == 8);
  std::vector<std::uint32_t> free_lru, free_ad;
  for (std::uint32_t p = 0; p < 8; ++p) {
    free_lru.push_back(p);
    free_ad.push_back(p);
  }
  std::uint32_t once = 1000;
  std::size_t hits_lru = 0, late_ad = 0;
  for (int round = 0; round < 40; ++round) {
    for (std::uint32_t k = 0; k < 4; ++k) {
      hits_lru += serve(lru, Tokens{k}, free_lru);
      const std::size_t a = serve(ad, Tokens{k}, free_ad);
      if (round >= 20) late_ad += a;
      for (int j = 0; j < 2; ++j, ++once) {
        (void)serve(lru, Tokens{once}, free_lru);
        (void)serve(ad, Tokens{once}, free_ad);
      }
    }
  }
  CHECK(hits_lru == 0);
  CHECK_FALSE(ad.policy().thrashing());
  CHECK(ad.policy().sampled_hits(0) == 0.0);
  CHECK(ad.policy().sampled_hits(2) > 0.0);
  CHECK(ad.policy().leader() != 0);
  CHECK(late_ad >= 70);  // of 80 uses in the last 20 rounds
  CHECK(ad.check_invariants());
}

TEST_CASE("adaptive (learned): large caches sample 1 page in 2^k for miniatures of <= 2048") {
  CHECK(eviction::Adaptive(2048).sample_shift() == 0);
  CHECK(eviction::Adaptive(2048).sampled_capacity() == 2048);
  CHECK(eviction::Adaptive(2049).sample_shift() == 1);
  CHECK(eviction::Adaptive(2049).sampled_capacity() == 1024);
  CHECK(eviction::Adaptive(5000).sample_shift() == 2);
  CHECK(eviction::Adaptive(5000).sampled_capacity() == 1250);
  // No history, or ARC's rule alone: no miniatures.
  CHECK(eviction::Adaptive(0).sampled_capacity() == 0);
  CHECK(eviction::Adaptive(100, 0.0).sampled_capacity() == 0);
  CHECK(eviction::Adaptive(100, 8.0, 1.0, Arc).sampled_capacity() == 0);
  // The move leaves the source without miniatures and its hits with the target.
  eviction::Adaptive a(100);
  eviction::Adaptive b(std::move(a));
  CHECK(b.sampled_capacity() == 100);
  CHECK(a.sampled_capacity() == 0);
  CHECK(a.sampled_hits(0) == 0.0);
}

TEST_CASE("adaptive (learned): bad contexts and expert numbers feed nothing") {
  eviction::Adaptive p(16);
  const std::uint32_t tokens[5] = {1, 2, 3, 4, 5};
  promptcache::PagedPolicyContext c;
  c.tick = 1;
  c.tokens = std::span<const std::uint32_t>(tokens);
  c.page_size = 0;  // no page size: no page to see
  auto m = p.on_create(c);
  p.on_match(m, c);
  p.on_insert_hit(m, c);
  p.on_evict(m, c);
  c.page_size = 8;  // tokens shorter than a page: no whole page
  m = p.on_create(c);
  p.on_match(m, c);
  p.on_evict(m, c);
  for (std::size_t e = 0; e < eviction::Adaptive::experts; ++e)
    CHECK(p.sampled_hits(e) == 0.0);
  CHECK(p.ghosts_once() + p.ghosts_reused() == 0);
  CHECK(p.sampled_hits(eviction::Adaptive::experts) == 0.0);  // no such expert
  CHECK(p.sampled_hits(std::numeric_limits<std::size_t>::max()) == 0.0);
  c.page_size = 5;  // one whole page, matched twice: the second match is a hit
  m = p.on_create(c);
  p.on_match(m, c);
  CHECK(p.sampled_hits(0) == 1.0);
  CHECK(p.sampled_hits(1) == 1.0);
  CHECK(p.sampled_hits(2) == 1.0);
}

TEST_CASE("shadow cache: a path touched at one tick leaves deepest first; rules pick the list") {
  // LRU: one order over both lists.
  PagedShadowCache s(3, PagedShadowCache::Rule::lru);
  CHECK_FALSE(s.access(1, 0, 1, 0.0));  // a path 1 -> 2 -> 3 stored at tick 1
  CHECK_FALSE(s.access(2, 0, 1, 0.0));
  CHECK_FALSE(s.access(3, 1, 1, 0.0));
  CHECK(s.size(0) == 3);                // Rule::lru keeps one list
  CHECK_FALSE(s.access(4, 0, 2, 0.0));  // full: the deepest page of tick 1 goes (3)
  CHECK(s.access(1, 0, 3, 0.0));
  CHECK(s.access(2, 0, 3, 0.0));
  CHECK_FALSE(s.access(3, 0, 3, 0.0));  // 3 was evicted; 4 (tick 2) goes now
  CHECK_FALSE(s.access(4, 0, 4, 0.0));  // so 4 misses, evicting 3 (deepest of tick 3)
  CHECK(s.access(1, 0, 5, 0.0));
  CHECK(s.access(2, 0, 5, 0.0));

  // Used once first: list 0 goes while it has entries.
  PagedShadowCache u(2, PagedShadowCache::Rule::used_once);
  CHECK_FALSE(u.access(10, 1, 1, 0.0));  // used again
  CHECK_FALSE(u.access(11, 0, 2, 0.0));  // used once, newer
  CHECK_FALSE(u.access(12, 0, 3, 0.0));  // evicts 11, not the older 10
  CHECK(u.access(10, 1, 4, 0.0));
  CHECK_FALSE(u.access(11, 0, 5, 0.0));
  CHECK(u.size(0) == 1);
  CHECK(u.size(1) == 1);

  // ARC: list 0 while it holds more than the target, else list 1.
  PagedShadowCache a(2, PagedShadowCache::Rule::arc);
  CHECK_FALSE(a.access(20, 1, 1, 1.0));
  CHECK_FALSE(a.access(21, 0, 2, 1.0));
  CHECK_FALSE(a.access(22, 0, 3, 1.0));  // |list 0| = 1, not above 1: 20 goes
  CHECK(a.access(21, 0, 4, 1.0));
  CHECK_FALSE(a.access(20, 1, 5, 0.0));  // target 0: list 0's oldest (22) goes
  CHECK(a.access(21, 0, 6, 0.0));

  // No capacity: every access misses; a moved-from shadow has none.
  PagedShadowCache z(0, PagedShadowCache::Rule::lru);
  CHECK_FALSE(z.access(1, 0, 1, 0.0));
  CHECK_FALSE(z.access(1, 0, 2, 0.0));
  PagedShadowCache moved(std::move(u));
  CHECK(moved.capacity() == 2);
  CHECK(u.capacity() == 0);
  CHECK_FALSE(u.access(10, 1, 9, 0.0));
}

TEST_CASE("shadow cache: many keys through a small shadow keep the index consistent") {
  PagedShadowCache s(64, PagedShadowCache::Rule::used_once);
  std::uint64_t x = 7;
  std::size_t hits = 0;
  for (std::uint64_t t = 1; t <= 20000; ++t) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const std::uint64_t key = (x >> 33) % 200;  // 200 keys, collisions in the index
    hits += s.access(key * 0x9e3779b97f4a7c15ULL, key % 2, t, 0.0) ? 1U : 0U;
    REQUIRE(s.size(0) + s.size(1) <= 64);
  }
  CHECK(s.size(0) + s.size(1) == 64);
  CHECK(hits > 0);
}

TEST_CASE("adaptive (learned): long one-off runs stored cold leave growing conversations cached") {
  // Two conversations under a shared first page, each turn adding one page to
  // its previous prompt (restarting after 6 pages), each turn followed by a
  // one-off prompt of 5 new pages: LRU lets the one-off pages push out every
  // conversation before its next turn. The one-off runs bring more new pages
  // than the prefix they extend (none), so they are stored cold; following
  // cold first evicts them before anything else, and the conversations stay.
  // Used-once first would also evict each conversation's newest page (used
  // once), which its next turn needs: its miniature serves fewer hits.
  PagedPrefixCache<std::uint32_t, eviction::Lru> lru(1);
  Cache ad(1, eviction::Adaptive(12));
  std::vector<std::uint32_t> free_lru, free_ad;
  for (std::uint32_t p = 0; p < 12; ++p) {
    free_lru.push_back(p);
    free_ad.push_back(p);
  }
  std::uint32_t once = 100000, fresh = 1000;
  Tokens conv[2] = {{7}, {7}};
  std::size_t hits_lru = 0, hits_ad = 0;
  for (int round = 0; round < 200; ++round) {
    for (Tokens& t : conv) {
      if (t.size() >= 6) t = {7};
      t.push_back(fresh++);
      hits_lru += serve(lru, t, free_lru);
      hits_ad += serve(ad, t, free_ad);
      Tokens o;
      for (int j = 0; j < 5; ++j)
        o.push_back(once++);
      (void)serve(lru, o, free_lru);
      (void)serve(ad, o, free_ad);
    }
  }
  CHECK(ad.policy().leader() == 3);
  for (std::size_t e = 0; e < 3; ++e)
    CHECK(ad.policy().sampled_hits(3) > ad.policy().sampled_hits(e));
  CHECK(hits_ad > 2 * hits_lru);
  CHECK(ad.check_invariants());
}
