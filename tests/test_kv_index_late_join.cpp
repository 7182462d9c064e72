// KvIndex after a reset or a late join: blocks stored under a parent the
// index does not know for the worker are kept as orphan chains, routable by
// name and grafted into the tree once their parent's position is known.
#include <promptcache/kv_index.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "catch.hpp"

using promptcache::KvBlock;
using promptcache::KvEvent;
using promptcache::KvEventResult;
using promptcache::KvEventStatus;
using promptcache::KvGapPolicy;
using promptcache::KvIndex;
using promptcache::KvIndexOptions;
using promptcache::KvUnknownParent;
using promptcache::KvWorker;
using promptcache::KvWorkerMatch;
namespace kv_event = promptcache::kv_event;

namespace {

using Hashes = std::vector<std::uint64_t>;

// The policy under test; KvUnknownParent::refuse is the behaviour before
// orphan chains (every test below fails with it).
constexpr KvUnknownParent policy = KvUnknownParent::keep_orphan;

KvIndexOptions late_join_options() {
  KvIndexOptions o;
  o.on_gap = KvGapPolicy::reset_and_apply;
  o.on_unknown_parent = policy;
  return o;
}

// A chained block name, as engines compute them: equal names mean equal
// prefixes.
std::uint64_t chain_name(std::uint64_t parent, std::uint64_t tokens) {
  std::uint64_t x = parent * 0x9E3779B97F4A7C15ULL ^ (tokens + 0x632BE59BD9B4E019ULL);
  x ^= x >> 31U;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 29U;
  return x | 1U;  // never 0 (the root's "name" below)
}

// A request: its tokens hashes and block names.
struct Request {
  Hashes tokens;
  Hashes names;
};

Request request(const Hashes& tokens) {
  Request r{tokens, {}};
  std::uint64_t parent = 0;
  for (const std::uint64_t t : tokens)
    r.names.push_back(parent = chain_name(parent, t));
  return r;
}

// Blocks [from, to) of `r` as a Stored event (parent: block from - 1).
KvEvent stored(std::uint64_t id, const Request& r, std::size_t from, std::size_t to) {
  kv_event::Stored s;
  if (from > 0) s.parent_hash = r.names[from - 1U];
  for (std::size_t i = from; i < to; ++i)
    s.blocks.push_back(KvBlock{r.names[i], r.tokens[i]});
  return KvEvent{id, std::move(s)};
}

std::size_t match_of(const std::vector<KvWorkerMatch>& ms, const KvWorker& w) {
  for (const KvWorkerMatch& m : ms)
    if (m.worker == w) return m.blocks;
  return 0;
}

const KvWorker A{1, 0};
const KvWorker B{2, 0};

Hashes seq(std::uint64_t from, std::size_t n) {
  Hashes h;
  for (std::size_t i = 0; i < n; ++i)
    h.push_back(from + i);
  return h;
}

}  // namespace

TEST_CASE("after a reset, blocks extending a pre-reset prefix are routable by name",
          "[kv_index][late_join]") {
  KvIndex index(late_join_options());
  const Request sys = request(seq(100, 8));  // 6 blocks of system prompt + 2 of a question
  REQUIRE(index.apply(A, stored(0, sys, 0, 6)).ok());
  // Events 1..4 are lost; event 5 extends the system prompt.
  const KvEventResult r = index.apply(A, stored(5, sys, 6, 8));
  CHECK(r.view_reset);
  CHECK(r.status == KvEventStatus::applied);
  CHECK(r.blocks_orphaned == 2);
  CHECK(index.orphan_count(A) == 2);
  CHECK(index.block_count(A) == 0);
  CHECK(index.counters().orphan_stores == 1);
  CHECK(index.counters().parent_not_found == 0);
  // Holding block 7 implies holding blocks 0..7.
  CHECK(match_of(index.find_matches(sys.tokens, sys.names), A) == 8);
  // A request that shares the prefix up to block 6 only: the orphan's parent
  // (block 5) is implied too.
  Request other = request(seq(100, 6));
  other = request([&] {
    Hashes t = other.tokens;
    t.push_back(999);
    return t;
  }());
  CHECK(match_of(index.find_matches(other.tokens, other.names), A) == 6);
  // The tokens-only query cannot place them yet.
  CHECK(index.find_matches(sys.tokens).empty());
  CHECK(index.check_invariants());
}

TEST_CASE("a later store extending an orphan chain extends it", "[kv_index][late_join]") {
  KvIndex index(late_join_options());
  const Request q = request(seq(7, 12));
  REQUIRE(index.apply(A, stored(0, q, 0, 4)).ok());
  REQUIRE(index.apply(A, stored(3, q, 4, 6)).view_reset);
  const KvEventResult r = index.apply(A, stored(4, q, 6, 9));
  CHECK(r.ok());
  CHECK(r.blocks_orphaned == 3);
  CHECK(index.orphan_count(A) == 5);
  CHECK(match_of(index.find_matches(q.tokens, q.names), A) == 9);
  // Storing held orphans again is idempotent.
  const KvEventResult again = index.apply(A, stored(5, q, 6, 9));
  CHECK(again.ok());
  CHECK(again.blocks_already_held == 3);
  CHECK(again.blocks_orphaned == 0);
  CHECK(index.check_invariants());
}

TEST_CASE("an orphan chain is grafted once another worker places its parent",
          "[kv_index][late_join]") {
  KvIndex index(late_join_options());
  const Request q = request(seq(50, 10));
  REQUIRE(index.apply(A, stored(0, q, 0, 4)).ok());
  REQUIRE(index.apply(A, stored(7, q, 4, 7)).view_reset);  // orphan chain 4..6 under block 3
  CHECK(index.find_matches(q.tokens).empty());
  // Worker B stores blocks 0..5: block 3, the anchor, is placed.
  const KvEventResult r = index.apply(B, stored(0, q, 0, 6));
  CHECK(r.ok());
  CHECK(r.blocks_grafted == 7);  // A's implied blocks 0..3 and its chain 4..6
  CHECK(index.counters().grafts == 1);
  CHECK(index.orphan_count(A) == 0);
  CHECK(index.block_count(A) == 7);
  // Routable by tokens alone now, for the whole prefix.
  const auto ms = index.find_matches(q.tokens);
  CHECK(match_of(ms, A) == 7);
  CHECK(match_of(ms, B) == 6);
  CHECK(index.check_invariants());
  // A's later stores extend the tree normally.
  CHECK(index.apply(A, stored(8, q, 7, 10)).blocks_stored == 3);
  CHECK(match_of(index.find_matches(q.tokens), A) == 10);
}

TEST_CASE("an orphan chain is grafted when its anchor is already placed by another worker",
          "[kv_index][late_join]") {
  KvIndex index(late_join_options());
  const Request q = request(seq(30, 6));
  REQUIRE(index.apply(B, stored(0, q, 0, 3)).ok());
  // A joins late: its first event extends block 2.
  const KvEventResult r = index.apply(A, stored(40, q, 3, 5));
  CHECK(r.ok());
  CHECK(r.blocks_orphaned == 2);
  CHECK(r.blocks_grafted == 5);
  CHECK(index.orphan_count(A) == 0);
  CHECK(match_of(index.find_matches(q.tokens), A) == 5);
  CHECK(index.check_invariants());
}

TEST_CASE("the worker's own store of the parent grafts its orphans", "[kv_index][late_join]") {
  KvIndex index(late_join_options());
  const Request q = request(seq(10, 8));
  REQUIRE(index.apply(A, stored(0, q, 0, 2)).ok());
  REQUIRE(index.apply(A, stored(2, q, 5, 8)).view_reset);  // orphans 5..7 under block 4
  CHECK(index.orphan_count(A) == 3);
  // The engine stores blocks 0..4 again (evicted and recomputed): everything
  // is placed.
  const KvEventResult r = index.apply(A, stored(3, q, 0, 5));
  CHECK(r.blocks_stored == 5);
  CHECK(r.blocks_grafted == 3);
  CHECK(index.orphan_count(A) == 0);
  CHECK(index.block_count(A) == 8);
  CHECK(match_of(index.find_matches(q.tokens), A) == 8);
  // A store that places an orphan itself promotes it (its children follow).
  REQUIRE(index.apply(A, stored(9, q, 6, 8)).view_reset);  // orphans 6, 7 under block 5
  const KvEventResult p = index.apply(A, stored(10, q, 0, 7));
  CHECK(p.blocks_stored == 7);
  CHECK(index.orphan_count(A) == 0);
  CHECK(index.block_count(A) == 8);
  CHECK(index.check_invariants());
}

TEST_CASE("removals, clears, resets and remove_worker drop orphans exactly",
          "[kv_index][late_join]") {
  KvIndex index(late_join_options());
  const Request q = request(seq(70, 10));
  const Request branch = request([&] {
    Hashes t(q.tokens.begin(), q.tokens.begin() + 6);
    t.push_back(5000);
    t.push_back(5001);
    return t;
  }());
  REQUIRE(index.apply(A, stored(0, q, 0, 1)).ok());
  REQUIRE(index.apply(A, stored(5, q, 4, 9)).view_reset);  // orphans 4..8 under 3
  REQUIRE(index.apply(A, stored(6, branch, 6, 8)).ok());   // branch under orphan 5
  CHECK(index.orphan_count(A) == 7);

  SECTION("Removed of an orphan drops it and its orphan descendants") {
    const KvEventResult r =
        index.apply(A, KvEvent{7, kv_event::Removed{{q.names[6], q.names[6], 12345}}});
    CHECK(r.blocks_removed == 1);
    CHECK(r.blocks_cascaded == 2);      // 7, 8
    CHECK(r.blocks_not_held == 2);      // the repeat, and an unknown name
    CHECK(index.orphan_count(A) == 4);  // 4, 5 and the branch
    CHECK(match_of(index.find_matches(q.tokens, q.names), A) == 6);
    CHECK(match_of(index.find_matches(branch.tokens, branch.names), A) == 8);
    const KvEventResult r2 = index.apply(A, KvEvent{8, kv_event::Removed{{q.names[4]}}});
    CHECK(r2.blocks_removed == 1);
    CHECK(r2.blocks_cascaded == 3);
    CHECK(index.orphan_count(A) == 0);
    CHECK(index.find_matches(q.tokens, q.names).empty());
  }
  SECTION("Cleared drops them") {
    const KvEventResult r = index.apply(A, KvEvent{7, kv_event::Cleared{}});
    CHECK(r.blocks_cascaded == 7);
    CHECK(index.orphan_count(A) == 0);
  }
  SECTION("a reset drops them") {
    const KvEventResult r = index.apply(A, KvEvent{9, kv_event::Removed{{}}});
    CHECK(r.view_reset);
    CHECK(r.blocks_cascaded == 7);
    CHECK(index.orphan_count(A) == 0);
  }
  SECTION("remove_worker drops them") {
    CHECK(index.remove_worker(A));
    CHECK(index.total_orphans() == 0);
    CHECK(index.find_matches(q.tokens, q.names).empty());
  }
  CHECK(index.check_invariants());
}

TEST_CASE("conflicting orphan stores are refused whole", "[kv_index][late_join]") {
  KvIndex index(late_join_options());
  const Request q = request(seq(90, 6));
  REQUIRE(index.apply(A, stored(0, q, 2, 4)).ok());  // orphans 2, 3 under 1
  // An orphan name under another parent.
  kv_event::Stored moved{q.names[0], {KvBlock{q.names[3], q.tokens[3]}}};
  CHECK(index.apply(A, KvEvent{1, moved}).status == KvEventStatus::block_conflict);
  // The chain's anchor stored under its own descendant: a cycle.
  kv_event::Stored cycle{q.names[3], {KvBlock{q.names[1], q.tokens[1]}}};
  CHECK(index.apply(A, KvEvent{2, cycle}).status == KvEventStatus::block_conflict);
  // A name twice.
  kv_event::Stored twice{q.names[3], {KvBlock{77, 1}, KvBlock{77, 1}}};
  CHECK(index.apply(A, KvEvent{3, twice}).status == KvEventStatus::block_conflict);
  CHECK(index.orphan_count(A) == 2);
  CHECK(index.counters().block_conflicts == 3);
  // A Stored event with no blocks under an unknown parent keeps nothing.
  CHECK(index.apply(A, KvEvent{4, kv_event::Stored{12345, {}}}).status ==
        KvEventStatus::parent_not_found);
  CHECK(index.check_invariants());
}

TEST_CASE("dump, replace_worker, copies, moves and swaps keep orphans", "[kv_index][late_join]") {
  KvIndex index(late_join_options());
  const Request q = request(seq(20, 9));
  const Request branch = request([&] {
    Hashes t(q.tokens.begin(), q.tokens.begin() + 7);
    t.push_back(777);
    return t;
  }());
  REQUIRE(index.apply(A, stored(0, q, 0, 3)).ok());
  REQUIRE(index.apply(B, stored(0, request(seq(900, 3)), 0, 3)).ok());
  REQUIRE(index.apply(A, stored(5, q, 5, 9)).view_reset);  // orphans 5..8 under 4
  REQUIRE(index.apply(A, stored(6, branch, 7, 8)).ok());   // branch under orphan 6
  REQUIRE(index.apply(A, stored(7, q, 0, 2)).ok());        // and two placed blocks
  const auto dump = index.dump(A);
  CHECK(dump.size() == 3);  // the placed chain, the orphan chain, its branch

  KvIndex rebuilt(late_join_options());
  REQUIRE(rebuilt.replace_worker(A, dump, 7).ok);
  CHECK(rebuilt.orphan_count(A) == 5);
  CHECK(rebuilt.block_count(A) == 2);
  CHECK(match_of(rebuilt.find_matches(branch.tokens, branch.names), A) == 8);
  CHECK(rebuilt.check_invariants());

  // replace_worker in place (the worker keeps its slot and its orphans move).
  REQUIRE(index.replace_worker(A, dump, 7).ok);
  CHECK(index.orphan_count(A) == 5);
  CHECK(index.dump(A).size() == 3);
  CHECK(index.check_invariants());

  KvIndex copy(index);
  CHECK(copy.orphan_count(A) == 5);
  CHECK(match_of(copy.find_matches(q.tokens, q.names), A) == 9);
  KvIndex moved(std::move(copy));
  CHECK(moved.orphan_count(A) == 5);
  CHECK(copy.total_orphans() == 0);  // NOLINT(bugprone-use-after-move): left empty
  KvIndex other(late_join_options());
  swap(other, moved);
  CHECK(other.orphan_count(A) == 5);
  CHECK(moved.total_orphans() == 0);
  CHECK(other.check_invariants());
}

TEST_CASE("under KvUnknownParent::refuse nothing is kept (the previous behaviour)",
          "[kv_index][late_join]") {
  KvIndexOptions o;
  o.on_gap = KvGapPolicy::reset_and_apply;
  KvIndex index(o);
  const Request q = request(seq(100, 8));
  REQUIRE(index.apply(A, stored(0, q, 0, 6)).ok());
  const KvEventResult r = index.apply(A, stored(5, q, 6, 8));
  CHECK(r.status == KvEventStatus::parent_not_found);
  CHECK(index.find_matches(q.tokens, q.names).empty());
  CHECK(index.total_orphans() == 0);
}
