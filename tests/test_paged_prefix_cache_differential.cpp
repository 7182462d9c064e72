// Randomized differential test of PagedPrefixCache against a naive model, in
// every shipped eviction policy. The model (tests/support/paged_model.hpp,
// shared with the fuzz harness) is written from the rules alone. After every
// step the test compares every answer, the counters, check_invariants(), and a
// KvIndex fed only by the cache's events against the cache (the mirror
// property).
#include <promptcache/paged_prefix_cache.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "support/any_paged_cache.hpp"
#include "support/paged_model.hpp"

using promptcache::KvEvent;
using promptcache::KvIndex;
using promptcache::KvWorker;
using promptcache::PagedPrefixHandle;
namespace eviction = promptcache::eviction;

namespace {

using paged_model::AnyPagedCache;
using paged_model::Arc;
using paged_model::CacheOf;
using paged_model::Model;
using paged_model::ModelHandle;
using paged_model::PageId;
using paged_model::Pol;
using paged_model::Tokens;

// The size of the generated documents and which operations run. The defaults give
// documents of a few pages; long documents make nodes whose compares are at least 256
// bytes even at page sizes of a few tokens.
struct Shape {
  std::size_t docs = 12;            ///< Documents that queries and inserts are drawn from.
  std::size_t min_extra_pages = 0;  ///< Each document ends in this many pages of fresh tokens
  std::size_t extra_pages = 8;      ///< plus up to this many more.
  std::size_t max_pages = 0;        ///< Longest document, in pages (0: no limit).
  std::size_t evict_pages = 0;      ///< An eviction asks for fewer pages than 6 + 4 * page + this.
  std::size_t cut_pages = 0;  ///< Shared prefixes are whole multiples of this (0: any length).
  bool moves = false;         ///< Also move the cache away and back (needs a default policy).
};

// The steps reach the cache through AnyPagedCache (support/any_paged_cache.hpp), so that
// they compile once for every policy.
void run_steps(AnyPagedCache& cache, std::vector<KvEvent>& events, Pol pol, std::size_t page_size,
               std::uint32_t seed, int steps, Arc arc, Shape shape);

template <class Policy>
void run(Pol pol, std::size_t page_size, std::uint32_t seed, int steps, Policy policy = Policy{},
         Arc arc = {}, Shape shape = {}) {
  // The second cache of a move-assignment is built with a default policy.
  if constexpr (!std::is_default_constructible_v<Policy>) REQUIRE_FALSE(shape.moves);
  std::vector<KvEvent> events;
  CacheOf<Policy> cache(page_size, std::move(policy),
                        [&events](const KvEvent& e) { events.push_back(e); });
  run_steps(cache, events, pol, page_size, seed, steps, arc, shape);
}

void run_steps(AnyPagedCache& cache, std::vector<KvEvent>& events, Pol pol, std::size_t page_size,
               std::uint32_t seed, int steps, Arc arc, Shape shape) {
  std::mt19937 rng(seed);
  Model model(page_size, pol, arc);
  KvIndex index;
  const KvWorker worker{7, 0};
  std::vector<std::uint64_t> namespaces{0, 1, 2};
  cache.configure_namespace(2, "adapter");

  // Documents that queries and inserts are drawn from: shared prefixes, pages
  // that differ only after their first token, small alphabets.
  std::vector<Tokens> docs;
  const auto rnd = [&](std::size_t n) {
    return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
  };
  const std::size_t grain = shape.cut_pages == 0 ? 1 : shape.cut_pages * page_size;
  for (std::size_t d = 0; d < shape.docs; ++d) {
    Tokens t;
    if (d > 0 && rnd(2) == 0) {
      const Tokens& base = docs[rnd(docs.size())];
      const std::size_t cuts = base.size() / grain;
      const std::size_t cut = shape.cut_pages == 0 ? rnd(cuts + 1) : cuts == 0 ? 0 : 1 + rnd(cuts);
      t.assign(base.begin(), base.begin() + long(cut * grain));
    }
    const std::size_t extra =
        shape.min_extra_pages * page_size + 1 + rnd(shape.extra_pages * page_size);
    if (shape.max_pages != 0 && t.size() + extra > shape.max_pages * page_size)
      t.resize((shape.max_pages * page_size - extra) / grain * grain);
    for (std::size_t i = 0; i < extra; ++i)
      t.push_back(static_cast<std::uint32_t>(rnd(3)));
    docs.push_back(t);
  }
  const auto query = [&] {
    Tokens t = docs[rnd(docs.size())];
    t.resize(rnd(t.size() + 1));
    if (!t.empty() && rnd(4) == 0) t[rnd(t.size())] ^= 1U;
    if (rnd(3) == 0)
      for (std::size_t i = rnd(3 * page_size); i > 0; --i)
        t.push_back(static_cast<std::uint32_t>(rnd(3)));
    return t;
  };

  struct Held {
    PagedPrefixHandle real;
    ModelHandle model;
  };
  std::vector<Held> held;
  PageId next_id = 1;

  const auto mirror_ok = [&](const Tokens& t, std::uint64_t ns) {
    promptcache::BlockHashOptions o;
    o.seed = cache.namespace_seed(ns);
    const auto hashes = promptcache::local_block_hashes(t, page_size, o);
    const auto m = index.find_matches(hashes);
    const std::size_t routed = m.empty() ? 0 : m.at(0).blocks;
    return routed * page_size == cache.peek(t, ns);
  };

  for (int step = 0; step < steps; ++step) {
    const std::size_t op = rnd(shape.moves ? 110 : 100);
    const std::uint64_t ns = namespaces[rnd(namespaces.size())];
    INFO("step " << step << " op " << op);
    if (op < 30) {  // match through one of its overloads, sometimes keep the handle
      const Tokens t = query();
      const std::size_t form = rnd(3);
      if (form < 2) {
        auto r = cache.match(t, ns);
        if (form == 1) {  // into a reused vector holding stale ids
          std::vector<PageId> pages(3, 7);
          r = cache.match(t, ns, pages);
          r.pages = pages;
        }
        const auto m = model.match(t, ns);
        REQUIRE(r.matched == m.matched);
        REQUIRE(r.pages == m.pages);
        REQUIRE(cache.valid(r.handle));
        if (rnd(2) == 0) held.push_back({r.handle, m.handle});
      } else {  // into a caller's table, sometimes shorter than the query: a shorter query
        const std::size_t q_pages = t.size() / page_size;
        const std::size_t room = rnd(2) == 0 ? q_pages + rnd(2) : rnd(q_pages + 1);
        constexpr PageId unset = std::numeric_limits<PageId>::max();
        std::vector<PageId> table(room + 1, unset);
        const auto r = cache.match(t, ns, std::span<PageId>(table.data(), room));
        const std::size_t used = std::min(room, q_pages) * page_size;
        const auto m = model.match(Tokens(t.begin(), t.begin() + long(used)), ns);
        REQUIRE(r.matched == m.matched);
        REQUIRE(std::equal(m.pages.begin(), m.pages.end(), table.begin()));
        REQUIRE(std::all_of(table.begin() + long(m.pages.size()), table.end(),
                            [](PageId p) { return p == unset; }));
        REQUIRE(cache.valid(r.handle));
        if (rnd(2) == 0) held.push_back({r.handle, m.handle});
      }
    } else if (op < 55) {  // insert: cached ids for what matches, fresh ids after
      const Tokens t = query();
      const auto m = model.peek(t, ns) / page_size;
      std::vector<PageId> ids;
      const auto known = cache.match(t, ns).pages;  // (a lookup first, as an engine does)
      model.match(t, ns);
      REQUIRE(known.size() == m);
      for (std::size_t i = 0; i < t.size() / page_size + rnd(2); ++i)
        ids.push_back(i < known.size() && rnd(4) != 0 ? known[i] : next_id++);
      const std::int64_t prio = static_cast<std::int64_t>(rnd(3));
      const auto r = cache.insert(t, ids, ns, prio);
      const auto e = model.insert(t, ids, ns, prio);
      REQUIRE(r.cached_pages == e.cached);
      REQUIRE(r.inserted_pages == e.inserted);
      REQUIRE(r.duplicates == e.duplicates);
      if (rnd(2) == 0 && !r.handle.empty()) held.push_back({r.handle, e.handle});
    } else if (op < 67 && !held.empty()) {  // lock
      const Held& h = held[rnd(held.size())];
      REQUIRE(cache.lock(h.real) == model.lock(h.model));
    } else if (op < 80 && !held.empty()) {  // unlock (below zero included)
      const std::size_t i = rnd(held.size());
      REQUIRE(cache.unlock(held[i].real) == model.unlock(held[i].model));
      if (rnd(3) == 0) held.erase(held.begin() + long(i));
    } else if (op < 95) {  // evict
      const std::size_t n = rnd(6 + 4 * page_size + shape.evict_pages);
      std::vector<PageId> got;
      const std::size_t k = cache.evict(n, got);
      const auto want = model.evict(n);
      REQUIRE(got == want);
      REQUIRE(k == got.size());
      REQUIRE(model.ties() == 0);
    } else if (op < 98) {  // erase a namespace
      std::multiset<PageId> got;
      const bool ok = cache.erase_namespace(ns, got);
      const auto want = model.drop(ns);
      REQUIRE(ok == want.has_value());
      if (ok) REQUIRE(got == *want);
      if (ok && ns == 2) cache.configure_namespace(2, "adapter");
    } else if (op < 100) {  // clear
      std::multiset<PageId> got;
      const bool ok = cache.clear(got);
      const auto want = model.drop(std::nullopt);
      REQUIRE(ok == want.has_value());
      if (ok) REQUIRE(got == *want);
    } else if (op < 105) {  // move-construct away and move-assign back into the moved-from
      REQUIRE(cache.move_round_trip().moved_to_valid);
    } else {
      // Move-assign over a cache holding pages of its own (dropped silently), and back.
      REQUIRE(cache.move_over(docs[rnd(docs.size())], next_id));
    }
    // Counters and invariants after every step.
    REQUIRE(cache.cached_pages() == model.cached());
    REQUIRE(cache.locked_pages() == model.locked());
    REQUIRE(cache.evictable_pages() == model.cached() - model.locked());
    for (const Held& h : held)
      REQUIRE(cache.valid(h.real) == model.valid(h.model));
    REQUIRE(cache.check_invariants());
    if (const auto a = cache.adaptive()) REQUIRE(a->target == model.target());
    // The mirror: a KvIndex fed only by the events answers what the cache matches.
    for (const KvEvent& e : events)
      REQUIRE(index.apply(worker, e).ok());
    events.clear();
    REQUIRE(index.block_count(worker) == cache.cached_pages());
    REQUIRE(index.block_hashes(worker) == cache.block_hashes());
    for (const Tokens& d : docs)
      for (const std::uint64_t n : namespaces)
        REQUIRE(mirror_ok(d, n));
    for (int i = 0; i < 3; ++i)
      REQUIRE(mirror_ok(query(), namespaces[rnd(namespaces.size())]));
  }
}

}  // namespace

TEST_CASE("paged cache differential: every policy and page size agrees with the model") {
  const int steps = 1500;
  for (const std::size_t ps : {1U, 2U, 4U}) {
    for (std::uint32_t seed = 1; seed <= 3; ++seed) {
      INFO("page size " << ps << " seed " << seed);
      SECTION("lru " + std::to_string(ps) + "/" + std::to_string(seed)) {
        run<eviction::Lru>(Pol::lru, ps, seed, steps);
      }
      SECTION("lfu " + std::to_string(ps) + "/" + std::to_string(seed)) {
        run<eviction::Lfu>(Pol::lfu, ps, seed, steps);
      }
      SECTION("fifo " + std::to_string(ps) + "/" + std::to_string(seed)) {
        run<eviction::Fifo>(Pol::fifo, ps, seed, steps);
      }
      SECTION("priority " + std::to_string(ps) + "/" + std::to_string(seed)) {
        run<eviction::Priority>(Pol::priority, ps, seed, steps);
      }
      SECTION("slru " + std::to_string(ps) + "/" + std::to_string(seed)) {
        run<eviction::Slru>(Pol::slru, ps, seed, steps);
      }
      SECTION("mru " + std::to_string(ps) + "/" + std::to_string(seed)) {
        run<eviction::Mru>(Pol::mru, ps, seed, steps);
      }
      SECTION("filo " + std::to_string(ps) + "/" + std::to_string(seed)) {
        run<eviction::Filo>(Pol::filo, ps, seed, steps);
      }
      // A small capacity and full ARC steps, so that the target moves both
      // ways and the ghost history wraps; then the default factor and step.
      SECTION("adaptive " + std::to_string(ps) + "/" + std::to_string(seed)) {
        run<eviction::Adaptive>(Pol::adaptive, ps, seed, steps,
                                eviction::Adaptive(6, 1.0, 1.0, eviction::Adaptive::Mode::arc),
                                {6, 1.0, 1.0});
      }
      SECTION("adaptive defaults " + std::to_string(ps) + "/" + std::to_string(seed)) {
        run<eviction::Adaptive>(Pol::adaptive, ps, seed, steps,
                                eviction::Adaptive(12, 8.0, 1.0, eviction::Adaptive::Mode::arc),
                                {12, 8.0, 1.0});
      }
    }
  }
}

// Pages of 64 tokens: every compare is at least 256 bytes, which is where a match looks
// the next level up (and prefetches its node) while it compares the current one. With a
// 3-token alphabet, siblings often share their first token, so the looked-up chain heads
// are followed through their same-first-token links too.
TEST_CASE("paged cache differential: long pages, where match looks a level ahead") {
  const int steps = 600;
  for (std::uint32_t seed = 1; seed <= 3; ++seed) {
    INFO("seed " << seed);
    SECTION("lru 64/" + std::to_string(seed)) {
      run<eviction::Lru>(Pol::lru, 64, seed, steps);
    }
    SECTION("priority 64/" + std::to_string(seed)) {
      run<eviction::Priority>(Pol::priority, 64, seed, steps);
    }
    SECTION("slru 64/" + std::to_string(seed)) {
      run<eviction::Slru>(Pol::slru, 64, seed, steps);
    }
  }
}

// Documents of up to 200 pages of 1 to 3 tokens that share long prefixes: their shared
// runs make nodes of 64 tokens and more, whose compares are at least 256 bytes, so
// matches crossing them look the next level up while they compare, at page sizes where
// the documents above never reach it. The cache is also moved away and back, which must
// carry the edge slots' token addresses (the look-ahead's hints) over intact.
TEST_CASE("paged cache differential: long documents of short pages, with moves") {
  const int steps = 100;
  Shape shape;
  shape.docs = 6;
  shape.min_extra_pages = 64;
  shape.extra_pages = 100;
  shape.max_pages = 200;
  shape.evict_pages = 40;
  shape.cut_pages = 96;
  shape.moves = true;
  const std::uint32_t seed = 2;
  for (const std::size_t ps : {1U, 2U, 3U}) {
    INFO("page size " << ps);
    SECTION("lru " + std::to_string(ps)) {
      run<eviction::Lru>(Pol::lru, ps, seed, steps, {}, {}, shape);
    }
    SECTION("slru " + std::to_string(ps)) {
      run<eviction::Slru>(Pol::slru, ps, seed, steps, {}, {}, shape);
    }
    SECTION("priority " + std::to_string(ps)) {
      run<eviction::Priority>(Pol::priority, ps, seed, steps, {}, {}, shape);
    }
  }
}
