// Exception safety of KvIndex: every allocation an operation makes is made to
// fail in turn (a replaced global operator new throws on the k-th call while
// armed); after each failure the index must be valid and, where the header
// promises the strong guarantee, exactly as before.
#include <promptcache/kv_index.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <optional>
#include <tuple>
#include <vector>

#include "catch.hpp"
#include "support/counting_new.hpp"

namespace {

using promptcache::KvBlock;
using promptcache::KvEvent;
using promptcache::KvEventStatus;
using promptcache::KvGapPolicy;
using promptcache::KvIndex;
using promptcache::KvIndexOptions;
using promptcache::KvWorker;
using promptcache::KvWorkerMatch;
namespace kv_event = promptcache::kv_event;
using Hashes = std::vector<std::uint64_t>;

KvEvent stored(std::uint64_t id, const Hashes& tokens, std::optional<std::uint64_t> parent = {}) {
  std::vector<KvBlock> blocks;
  for (const std::uint64_t t : tokens)
    blocks.push_back(KvBlock{t + 1000, t});
  return KvEvent{id, kv_event::Stored{parent, std::move(blocks)}};
}

const KvWorker A{1, 0};
const KvWorker B{2, 0};
const KvWorker C{3, 7};
const KvWorker Fresh{99, 0};

// Everything observable about an index.
struct Snapshot {
  std::vector<std::tuple<KvWorker, std::vector<KvEvent>, std::optional<std::uint64_t>, std::size_t>>
      workers;
  std::vector<std::vector<KvWorkerMatch>> matches;
  std::size_t nodes = 0;
  std::size_t blocks = 0;
  promptcache::KvIndexCounters counters;
  bool operator==(const Snapshot&) const = default;
};

const std::vector<Hashes>& queries() {
  static const std::vector<Hashes> q{{1, 2, 3, 4, 5, 6}, {1, 2, 8, 9}, {1, 7},           {5, 6},
                                     {20, 21, 22},       {30},         {1, 2, 3, 40, 41}};
  return q;
}

Snapshot snapshot(const KvIndex& index) {
  Snapshot s;
  auto ws = index.workers();
  std::sort(ws.begin(), ws.end());
  for (const KvWorker& w : ws) {
    const auto cur = index.cursor(w);
    s.workers.emplace_back(w, index.dump(w), cur ? cur->last_applied_id() : std::nullopt,
                           index.block_count(w));
  }
  for (const Hashes& q : queries()) {
    auto m = index.find_matches(q);
    std::sort(m.begin(), m.end());
    s.matches.push_back(std::move(m));
  }
  s.nodes = index.node_count();
  s.blocks = index.total_blocks();
  s.counters = index.counters();
  return s;
}

// `extra_workers` more worker ranks with no blocks (3 + 61 = 64 fills the
// slots of the word form, 3 + 125 = 128 the slots a holder bitset of the
// smallest class covers).
KvIndex base_index(KvGapPolicy policy, std::uint32_t extra_workers = 0) {
  KvIndex index(KvIndexOptions{policy});
  for (std::uint32_t w = 0; w < extra_workers; ++w)
    REQUIRE(index.apply(KvWorker{500 + w, 0}, stored(0, {})).ok());
  REQUIRE(index.apply(A, stored(0, {1, 2, 3, 4})).ok());
  REQUIRE(index.apply(A, stored(1, {8, 9}, 1002)).ok());
  REQUIRE(index.apply(B, stored(0, {1, 2, 3})).ok());
  REQUIRE(index.apply(B, stored(1, {5, 6})).ok());
  REQUIRE(index.apply(C, stored(4, {20, 21})).ok());
  return index;
}

bool g_expectations_met = true;
// What an operation expects of its own results; not a Catch assertion, which
// would swallow the exception the test is about.
void expect(bool met) {
  g_expectations_met = g_expectations_met && met;
}

// Runs `op` on a copy of the base index with allocation k failing, for k = 0,
// 1, ... until it succeeds. After each failure the index must satisfy its
// invariants and be exactly as before. The successful run must leave the same
// state as a run without any failure. Returns how many runs failed.
template <class Op>
int fail_every_allocation_on(const KvIndex& base, Op op) {
  KvIndex clean = base;
  op(clean);
  const Snapshot want = snapshot(clean);
  const Snapshot before = snapshot(base);
  int failures = 0;
  for (long k = 0; k < 1000; ++k) {
    KvIndex index = base;
    bool threw = false;
    g_expectations_met = true;
    test_alloc::countdown = k;
    try {
      op(index);
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    test_alloc::countdown = -1;
    INFO("allocation " << k << " failed");
    REQUIRE(index.check_invariants());
    if (!threw) {
      CHECK(g_expectations_met);
      CHECK(snapshot(index) == want);
      return failures;
    }
    ++failures;
    CHECK(snapshot(index) == before);
  }
  FAIL("operation never succeeded");
  return failures;
}

template <class Op>
int fail_every_allocation(KvGapPolicy policy, Op op, std::uint32_t extra_workers = 0,
                          void (*setup)(KvIndex&) = nullptr) {
  KvIndex base = base_index(policy, extra_workers);
  if (setup != nullptr) setup(base);
  return fail_every_allocation_on(base, op);
}

// The base index with orphan chains kept: A's view was reset and it stored
// blocks 3 and 4 again under the unknown parent 1002 (orphans), then a
// branch 50 under the orphan 1003.
KvIndex orphan_index() {
  KvIndexOptions o;
  o.on_gap = KvGapPolicy::reset_and_apply;
  o.on_unknown_parent = promptcache::KvUnknownParent::keep_orphan;
  KvIndex index(o);
  REQUIRE(index.apply(A, stored(0, {1, 2, 3, 4})).ok());
  REQUIRE(index.apply(B, stored(0, {5, 6})).ok());
  REQUIRE(index.apply(A, stored(3, {3, 4}, 1002)).view_reset);
  REQUIRE(index.apply(A, stored(4, {50}, 1003)).ok());
  REQUIRE(index.orphan_count(A) == 3);
  return index;
}

}  // namespace

TEST_CASE("operator new replacement is active", "[kv_index]") {
  CHECK(test_alloc::replacement_active());
}

TEST_CASE("store: strong guarantee", "[kv_index]") {
  SECTION("below a shared prefix") {
    CHECK(fail_every_allocation(KvGapPolicy::report, [](KvIndex& index) {
            expect(index.apply(B, stored(2, {40, 41, 42}, 1003)).ok());
          }) >= 1);
  }
  SECTION("a long chain") {
    Hashes chain;
    for (std::uint64_t i = 0; i < 300; ++i)
      chain.push_back(100 + i);
    CHECK(fail_every_allocation(KvGapPolicy::report, [&](KvIndex& index) {
            expect(index.apply(C, stored(5, chain)).ok());
          }) >= 1);
  }
  SECTION("the first event of a new worker") {
    CHECK(fail_every_allocation(KvGapPolicy::report, [](KvIndex& index) {
            expect(index.apply(Fresh, stored(0, {1, 2, 30})).ok());
          }) >= 1);
  }
  SECTION("a chain longer than a page of holds") {
    // More new holds than the worker's first page has room for: the store
    // must reserve the next page before its first change.
    Hashes chain;
    for (std::uint64_t i = 0; i < 5000; ++i)
      chain.push_back(100 + i);
    CHECK(fail_every_allocation(KvGapPolicy::report, [&](KvIndex& index) {
            expect(index.apply(A, stored(2, chain, 1004)).ok());
          }) >= 1);
  }
  SECTION("a third holder on shared nodes past the word form") {
    // 3 + 62 = 65 ranks: holder sets are sparse. Two holders sit in each
    // node's row; a third spills every set of the chain to the arena, which
    // the store must reserve before its first change.
    CHECK(
        fail_every_allocation(
            KvGapPolicy::report,
            [](KvIndex& index) {
              expect(index.apply(KvWorker{502, 0}, stored(1, {200, 201, 202, 203, 204, 205})).ok());
            },
            62,
            [](KvIndex& index) {
              for (std::uint64_t w = 500; w < 502; ++w)
                REQUIRE(
                    index.apply(KvWorker{w, 0}, stored(1, {200, 201, 202, 203, 204, 205})).ok());
            }) >= 1);
  }
  SECTION("a new worker whose slot ends the word form") {
    // 61 + 3 = 64 ranks fill the word form; nodes 1..3 get a third holder
    // first, so the switch to the sparse form must spill them to the arena.
    CHECK(fail_every_allocation(
              KvGapPolicy::report,
              [](KvIndex& index) {
                expect(index.apply(Fresh, stored(0, {1, 2, 30})).ok());
              },
              61,
              [](KvIndex& index) {
                REQUIRE(index.apply(KvWorker{500, 0}, stored(1, {1, 2, 3})).ok());
              }) >= 1);
  }
  SECTION("a new worker whose slot widens the bitsets") {
    // Nodes 1..3 get a third holder first, so they have bitsets to widen.
    CHECK(fail_every_allocation(
              KvGapPolicy::report,
              [](KvIndex& index) {
                expect(index.apply(Fresh, stored(0, {1, 2, 30})).ok());
              },
              125,
              [](KvIndex& index) {
                REQUIRE(index.apply(KvWorker{500, 0}, stored(1, {1, 2, 3})).ok());
              }) >= 1);
  }
}

TEST_CASE("remove, clear and gap reports never allocate", "[kv_index]") {
  const KvEvent removal{2, kv_event::Removed{{1002, 77}}};
  const KvEvent clearing{2, kv_event::Cleared{}};
  const KvEvent beyond_gap = stored(9, {1});
  CHECK(fail_every_allocation(KvGapPolicy::report, [&](KvIndex& index) {
          expect(index.apply(A, removal).ok());
          expect(index.apply(B, clearing).ok());
          expect(index.apply(C, beyond_gap).status == KvEventStatus::gap);
        }) == 0);
}

TEST_CASE("remove_worker never throws, also on a copy", "[kv_index]") {
  // A copy's vectors have exactly their size as capacity: removing a worker
  // from it must still not need an allocation.
  CHECK(fail_every_allocation(KvGapPolicy::report, [](KvIndex& index) {
          expect(index.remove_worker(B));
          expect(index.remove_worker(C));
        }) == 0);
}

TEST_CASE("replace_worker: strong guarantee", "[kv_index]") {
  SECTION("a known worker") {
    CHECK(fail_every_allocation(KvGapPolicy::report, [](KvIndex& index) {
            const std::vector<KvEvent> dump{stored(0, {1, 2, 50}), stored(1, {51}, 1050)};
            expect(index.replace_worker(A, dump, 10).ok);
          }) >= 1);
  }
  SECTION("an unknown worker") {
    CHECK(fail_every_allocation(KvGapPolicy::report, [](KvIndex& index) {
            expect(index.replace_worker(Fresh, std::vector<KvEvent>{stored(0, {1, 2, 3})}, 4).ok);
          }) >= 1);
  }
}

TEST_CASE("copy assignment: strong guarantee", "[kv_index]") {
  KvIndex source = base_index(KvGapPolicy::report);
  REQUIRE(source.apply(Fresh, stored(0, {60, 61, 62})).ok());
  CHECK(fail_every_allocation(KvGapPolicy::report, [&](KvIndex& index) { index = source; }) >= 1);
}

TEST_CASE("degraded mode: a gap's reset happens only with the event", "[kv_index]") {
  // The view is dropped and the event applied in one step: a failed
  // allocation leaves the old view, cursor and counters.
  SECTION("a store that needs new nodes after the reset") {
    CHECK(fail_every_allocation(KvGapPolicy::reset_and_apply, [](KvIndex& index) {
            const auto r = index.apply(A, stored(7, {70, 71, 72, 73}));
            expect(r.ok() && r.view_reset);
          }) >= 1);
  }
  SECTION("a store into the emptied tree") {
    CHECK(fail_every_allocation(
              KvGapPolicy::reset_and_apply,
              [](KvIndex& index) {
                const auto r = index.apply(B, stored(5, {1, 2, 3}));
                expect(r.ok() && r.view_reset);
              },
              0,
              [](KvIndex& index) {  // B alone holds blocks
                REQUIRE(index.remove_worker(A));
                REQUIRE(index.remove_worker(C));
              }) >= 1);
  }
  SECTION("a reset and a chain longer than a page of holds") {
    Hashes chain;
    for (std::uint64_t i = 0; i < 5000; ++i)
      chain.push_back(100 + i);
    CHECK(fail_every_allocation(KvGapPolicy::reset_and_apply, [&](KvIndex& index) {
            const auto r = index.apply(A, stored(7, chain));
            expect(r.ok() && r.view_reset);
          }) >= 1);
  }
  SECTION("a reset that returns a holder set to its row, and the store that spills it again") {
    // 3 + 127 = 130 ranks: spilled sets are bitsets. Nodes 301 and 302 have
    // five holders, then three; the reset takes worker 502's holder back out,
    // which returns their sets to the row and frees their bitsets, and the
    // small blocks freed earlier are used up by other sets. Re-adding 502's
    // holder then needs new arena room, which the store must reserve before
    // the reset.
    CHECK(fail_every_allocation(
              KvGapPolicy::reset_and_apply,
              [](KvIndex& index) {
                const auto r = index.apply(KvWorker{502, 0}, stored(5, {301, 302}));
                expect(r.ok() && r.view_reset);
              },
              127,
              [](KvIndex& index) {
                for (std::uint64_t w = 500; w < 627; ++w)
                  REQUIRE(index.apply(KvWorker{w, 0}, stored(1, {5000 + w})).ok());
                for (std::uint64_t w = 500; w < 505; ++w)
                  REQUIRE(index.apply(KvWorker{w, 0}, stored(2, {301, 302})).ok());
                for (std::uint64_t w = 503; w < 505; ++w)
                  REQUIRE(index.apply(KvWorker{w, 0}, KvEvent{3, kv_event::Removed{{1301}}}).ok());
                for (std::uint64_t w = 510; w < 513; ++w)
                  REQUIRE(index.apply(KvWorker{w, 0}, stored(2, {311, 312})).ok());
              }) >= 1);
  }
  SECTION("a store back onto holder sets that the reset shrank") {
    // With a third holder, nodes 1..3 keep their holders out of line; the
    // reset takes them back into the node, the store out again: that must
    // use the room reserved before the reset, not a new allocation.
    CHECK(fail_every_allocation(
              KvGapPolicy::reset_and_apply,
              [](KvIndex& index) {
                const auto r = index.apply(A, stored(7, {1, 2, 3}));
                expect(r.ok() && r.view_reset);
              },
              0,
              [](KvIndex& index) {
                REQUIRE(index.apply(Fresh, stored(0, {1, 2, 3})).ok());
              }) >= 1);
  }
}

TEST_CASE("orphan chains: strong guarantee", "[kv_index]") {
  const KvIndex base = orphan_index();
  SECTION("a new orphan chain") {
    CHECK(fail_every_allocation_on(base, [](KvIndex& index) {
            const auto r = index.apply(B, stored(1, {7, 8, 9}, 4242));
            expect(r.ok() && r.blocks_orphaned == 3);
          }) >= 1);
  }
  SECTION("an orphan chain after a reset") {
    CHECK(fail_every_allocation_on(base, [](KvIndex& index) {
            const auto r = index.apply(B, stored(9, {7, 8}, 1006));
            expect(r.ok() && r.view_reset && r.blocks_orphaned == 2);
          }) >= 1);
  }
  SECTION("extending an orphan chain") {
    CHECK(fail_every_allocation_on(base, [](KvIndex& index) {
            const auto r = index.apply(A, stored(5, {5, 6}, 1004));
            expect(r.ok() && r.blocks_orphaned == 2);
          }) >= 1);
  }
  SECTION("removing orphans and clearing never allocate") {
    KvIndex index = base;
    const KvEvent removed{5, kv_event::Removed{{1003}}};
    const KvEvent cleared{6, kv_event::Cleared{}};
    test_alloc::countdown = 0;
    const auto r = index.apply(A, removed);
    const auto c = index.apply(A, cleared);
    test_alloc::countdown = -1;
    CHECK(r.blocks_removed == 1);
    CHECK(r.blocks_cascaded == 2);
    CHECK(c.ok());
    CHECK(index.total_orphans() == 0);
  }
  SECTION("replace_worker with a dump that has orphans") {
    const auto dump = base.dump(A);
    CHECK(fail_every_allocation_on(
              base, [&](KvIndex& index) { expect(index.replace_worker(A, dump, 9).ok); }) >= 1);
  }
  SECTION("copy assignment") {
    CHECK(fail_every_allocation_on(KvIndex{}, [&](KvIndex& index) { index = base; }) >= 1);
  }
}

TEST_CASE("orphan chains: a graft that fails leaves the chain an orphan chain", "[kv_index]") {
  // A graft is best effort: the event applies whatever happens to it, and a
  // graft that cannot allocate is undone whole, its chain kept as orphans.
  const KvIndex base = orphan_index();
  bool grafted_clean = false;
  int kept = 0;  // runs where the graft failed but the event applied
  for (long k = 0; k < 1000; ++k) {
    KvIndex index = base;
    bool threw = false;
    std::optional<promptcache::KvEventResult> r;
    test_alloc::countdown = k;
    try {
      r = index.apply(B, stored(1, {1, 2}));  // places 1002, the anchor of A's chain
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    test_alloc::countdown = -1;
    INFO("allocation " << k << " failed");
    REQUIRE(index.check_invariants());
    if (threw) {
      CHECK(snapshot(index) == snapshot(base));
      continue;
    }
    REQUIRE(r->ok());
    // Either grafted (A holds 1, 2 and its chain) or still orphans.
    const bool grafted = index.orphan_count(KvWorker{1, 0}) == 0U;
    CHECK(index.block_count(KvWorker{1, 0}) + index.orphan_count(KvWorker{1, 0}) ==
          (grafted ? 5U : 3U));
    if (grafted) {
      grafted_clean = true;
      break;
    }
    ++kept;
  }
  CHECK(grafted_clean);
  CHECK(kept >= 1);
}
