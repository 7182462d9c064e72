#include <promptcache/kv_index.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <variant>
#include <vector>

#include "catch.hpp"

using promptcache::KvBlock;
using promptcache::KvEvent;
using promptcache::KvEventResult;
using promptcache::KvEventStatus;
using promptcache::KvGapPolicy;
using promptcache::KvIndex;
using promptcache::KvIndexOptions;
using promptcache::KvWorker;
using promptcache::KvWorkerMatch;
namespace kv_event = promptcache::kv_event;
namespace cursor = promptcache::cursor;

namespace {

using Hashes = std::vector<std::uint64_t>;
constexpr std::uint64_t u64max = std::numeric_limits<std::uint64_t>::max();

// Blocks named like an engine would: block hash = tokens hash + `salt`.
std::vector<KvBlock> blocks(const Hashes& tokens, std::uint64_t salt = 1000) {
  std::vector<KvBlock> out;
  for (const std::uint64_t t : tokens)
    out.push_back(KvBlock{t + salt, t});
  return out;
}

KvEvent stored(std::uint64_t id, const Hashes& tokens, std::optional<std::uint64_t> parent = {},
               std::uint64_t salt = 1000) {
  return KvEvent{id, kv_event::Stored{parent, blocks(tokens, salt)}};
}
KvEvent removed(std::uint64_t id, const Hashes& names) {
  return KvEvent{id, kv_event::Removed{names}};
}
KvEvent cleared(std::uint64_t id) {
  return KvEvent{id, kv_event::Cleared{}};
}

std::vector<KvWorkerMatch> matches(const KvIndex& index, const Hashes& query,
                                   bool early_exit = false) {
  auto m = index.find_matches(query, early_exit);
  std::sort(m.begin(), m.end());
  return m;
}

std::size_t match_of(const KvIndex& index, const Hashes& query, KvWorker w) {
  for (const auto& m : index.find_matches(query))
    if (m.worker == w) return m.blocks;
  return 0;
}

const KvWorker A{1, 0};
const KvWorker B{2, 0};
const KvWorker C{3, 0};

}  // namespace

TEST_CASE("an empty index matches nothing and is its root", "[kv_index]") {
  KvIndex index;
  CHECK(index.find_matches(Hashes{}).empty());
  CHECK(index.find_matches(Hashes{1, 2, 3}).empty());
  CHECK(index.find_matches(Hashes{1, 2, 3}, true).empty());
  CHECK(index.node_count() == 0);
  CHECK(index.worker_count() == 0);
  CHECK(index.total_blocks() == 0);
  CHECK(index.dump(A).empty());
  CHECK_FALSE(index.cursor(A).has_value());
  CHECK_FALSE(index.remove_worker(A));
  CHECK(index.remove_worker(std::uint64_t{1}) == 0);
  CHECK(index.check_invariants());
}

TEST_CASE("stored blocks are matched as leading blocks", "[kv_index]") {
  KvIndex index;
  const KvEventResult r = index.apply(A, stored(0, {1, 2, 3}));
  CHECK(r.ok());
  CHECK(std::holds_alternative<cursor::Initial<std::uint64_t>>(r.observation));
  CHECK(r.blocks_stored == 3);
  CHECK(index.node_count() == 3);
  CHECK(index.block_count(A) == 3);
  CHECK(matches(index, {1, 2, 3, 4}) == std::vector<KvWorkerMatch>{{A, 3}});
  CHECK(matches(index, {1, 2}) == std::vector<KvWorkerMatch>{{A, 2}});
  CHECK(matches(index, {1, 9, 3}) == std::vector<KvWorkerMatch>{{A, 1}});
  CHECK(matches(index, {2, 3}).empty());  // keyed by the path, not by the block alone
  CHECK(matches(index, {9}).empty());
  CHECK(index.cursor(A) == promptcache::CursorState<>::live(0));
  CHECK(index.counters().events_applied == 1);
  CHECK(index.check_invariants());
}

TEST_CASE("a stored chain continues below its parent", "[kv_index]") {
  KvIndex index;
  REQUIRE(index.apply(A, stored(0, {1, 2})).ok());
  REQUIRE(index.apply(A, stored(1, {3, 4}, 1002)).ok());  // parent: block of tokens 2
  CHECK(matches(index, {1, 2, 3, 4}) == std::vector<KvWorkerMatch>{{A, 4}});
  // A parent in the middle of the chain starts a branch.
  REQUIRE(index.apply(A, stored(2, {7}, 1001)).ok());
  CHECK(matches(index, {1, 7}) == std::vector<KvWorkerMatch>{{A, 2}});
  CHECK(index.node_count() == 5);
  CHECK(index.check_invariants());
}

TEST_CASE("a stored event with an unknown parent changes nothing", "[kv_index]") {
  KvIndex index;
  REQUIRE(index.apply(A, stored(0, {1, 2})).ok());
  const KvEventResult r = index.apply(A, stored(1, {3}, 999));
  CHECK(r.status == KvEventStatus::parent_not_found);
  CHECK_FALSE(r.ok());
  CHECK(r.blocks_stored == 0);
  CHECK(index.node_count() == 2);
  CHECK(index.block_count(A) == 2);
  CHECK(index.counters().parent_not_found == 1);
  CHECK(index.counters().events_applied == 1);
  // The id was received in order, so it is consumed: the next one is contiguous.
  CHECK(index.cursor(A) == promptcache::CursorState<>::live(1));
  CHECK(index.apply(A, stored(2, {3}, 1002)).ok());
  // A parent held by another worker does not count.
  CHECK(index.apply(B, stored(0, {4}, 1002)).status == KvEventStatus::parent_not_found);
  // Even with no blocks the parent must be held.
  CHECK(index.apply(B, stored(1, {}, 5)).status == KvEventStatus::parent_not_found);
  CHECK(index.block_count(B) == 0);
  CHECK(index.check_invariants());
}

TEST_CASE("storing held blocks again is idempotent", "[kv_index]") {
  KvIndex index;
  REQUIRE(index.apply(A, stored(0, {1, 2, 3})).ok());
  const KvEventResult r = index.apply(A, stored(1, {1, 2, 3, 4}));
  CHECK(r.ok());
  CHECK(r.blocks_already_held == 3);
  CHECK(r.blocks_stored == 1);
  const KvEventResult again = index.apply(A, stored(2, {1, 2, 3, 4}));
  CHECK(again.blocks_already_held == 4);
  CHECK(again.blocks_stored == 0);
  CHECK(index.node_count() == 4);
  CHECK(index.block_count(A) == 4);
  CHECK(index.check_invariants());
}

TEST_CASE("removing a block that is not held is a reported no-op", "[kv_index]") {
  KvIndex index;
  REQUIRE(index.apply(A, stored(0, {1, 2})).ok());
  const KvEventResult r = index.apply(A, removed(1, {424242, 1001 + 5}));
  CHECK(r.ok());
  CHECK(r.blocks_not_held == 2);
  CHECK(r.blocks_removed == 0);
  CHECK(index.node_count() == 2);
  // Another worker's block is not this worker's to remove.
  const KvEventResult other = index.apply(B, removed(0, {1001}));
  CHECK(other.blocks_not_held == 1);
  CHECK(index.block_count(A) == 2);
  CHECK(index.check_invariants());
}

TEST_CASE("names that an earlier name of the same Removed event cascaded are not held",
          "[kv_index]") {
  KvIndex index;
  REQUIRE(index.apply(A, stored(0, {1, 2, 3, 4})).ok());
  // 1002 takes 1003 and 1004 with it; then 1003 and the repeated 1002 are gone.
  const KvEventResult r = index.apply(A, removed(1, {1002, 1003, 1002, 1001}));
  CHECK(r.ok());
  CHECK(r.blocks_removed == 2);
  CHECK(r.blocks_cascaded == 2);
  CHECK(r.blocks_not_held == 2);
  CHECK(index.block_count(A) == 0);
  CHECK(index.node_count() == 0);
  CHECK(index.check_invariants());
  // The freed holds and names are reused by the next store.
  REQUIRE(index.apply(A, stored(2, {1, 2})).ok());
  CHECK(index.apply(A, removed(3, {1002, 1002})).blocks_not_held == 1);
  CHECK(index.block_count(A) == 1);
  CHECK(index.check_invariants());
}

TEST_CASE("removal cascades to the worker's descendants only", "[kv_index]") {
  KvIndex index;
  REQUIRE(index.apply(A, stored(0, {1, 2, 3, 4})).ok());
  REQUIRE(index.apply(A, stored(1, {8}, 1002)).ok());  // a branch below block 2
  REQUIRE(index.apply(B, stored(0, {1, 2, 3})).ok());
  const KvEventResult r = index.apply(A, removed(2, {1002}));
  CHECK(r.ok());
  CHECK(r.blocks_removed == 1);
  CHECK(r.blocks_cascaded == 3);  // 3, 4 and 8
  CHECK(index.block_count(A) == 1);
  CHECK(matches(index, {1, 2, 3, 4}) == std::vector<KvWorkerMatch>{{A, 1}, {B, 3}});
  CHECK(index.node_count() == 3);  // 4 and 8 had no other holder
  // The cascaded names are gone too.
  CHECK(index.apply(A, removed(3, {1003, 1004})).blocks_not_held == 2);
  CHECK(index.check_invariants());
}

TEST_CASE("a removed block can be stored again", "[kv_index]") {
  KvIndex index;
  REQUIRE(index.apply(A, stored(0, {1, 2, 3})).ok());
  REQUIRE(index.apply(A, removed(1, {1003})).ok());
  CHECK(matches(index, {1, 2, 3}) == std::vector<KvWorkerMatch>{{A, 2}});
  CHECK(index.node_count() == 2);
  const KvEventResult r = index.apply(A, stored(2, {3}, 1002));
  CHECK(r.blocks_stored == 1);
  CHECK(matches(index, {1, 2, 3}) == std::vector<KvWorkerMatch>{{A, 3}});
  // And with a different name for the same position, once the old one is gone.
  REQUIRE(index.apply(A, removed(3, {1003})).ok());
  CHECK(index.apply(A, KvEvent{4, kv_event::Stored{1002, {{77, 3}}}}).ok());
  CHECK(matches(index, {1, 2, 3}) == std::vector<KvWorkerMatch>{{A, 3}});
  CHECK(index.check_invariants());
}

TEST_CASE("two workers share a prefix and diverge", "[kv_index]") {
  KvIndex index;
  REQUIRE(index.apply(A, stored(0, {1, 2, 3, 4})).ok());
  REQUIRE(index.apply(B, stored(0, {1, 2, 5}, std::nullopt, 5000)).ok());  // own names
  REQUIRE(index.apply(C, stored(0, {1})).ok());
  CHECK(index.node_count() == 5);  // 1, 2 shared; 3, 4, 5
  CHECK(matches(index, {1, 2, 3, 4}) == std::vector<KvWorkerMatch>{{A, 4}, {B, 2}, {C, 1}});
  CHECK(matches(index, {1, 2, 5, 6}) == std::vector<KvWorkerMatch>{{A, 2}, {B, 3}, {C, 1}});
  CHECK(matches(index, {1, 7}) == std::vector<KvWorkerMatch>{{A, 1}, {B, 1}, {C, 1}});
  // Early exit stops once one worker is left; it gets the depth reached.
  CHECK(matches(index, {1, 2, 3, 4}, true) == std::vector<KvWorkerMatch>{{A, 3}, {B, 2}, {C, 1}});
  CHECK(matches(index, {1, 2, 5}, true) == std::vector<KvWorkerMatch>{{A, 2}, {B, 3}, {C, 1}});
  // B leaving frees only its own branch.
  CHECK(index.remove_worker(B));
  CHECK(index.node_count() == 4);
  CHECK(matches(index, {1, 2, 5}) == std::vector<KvWorkerMatch>{{A, 2}, {C, 1}});
  CHECK(index.check_invariants());
}

TEST_CASE("stale and duplicate events are dropped", "[kv_index]") {
  KvIndex index;
  REQUIRE(index.apply(A, stored(0, {1})).ok());
  REQUIRE(index.apply(A, stored(1, {2}, 1001)).ok());
  const KvEventResult dup = index.apply(A, removed(1, {1002}));
  CHECK(dup.status == KvEventStatus::stale);
  CHECK(dup.observation ==
        promptcache::CursorObservation<>{cursor::Stale<std::uint64_t>{1, std::uint64_t{1}}});
  const KvEventResult old = index.apply(A, cleared(0));
  CHECK(old.status == KvEventStatus::stale);
  CHECK(index.block_count(A) == 2);
  CHECK(index.counters().events_stale == 2);
  CHECK(index.cursor(A) == promptcache::CursorState<>::live(1));
  CHECK(index.apply(A, removed(2, {1002})).ok());
  CHECK(index.check_invariants());
}

TEST_CASE("a gap is reported and replace_worker recovers", "[kv_index]") {
  KvIndex index;
  REQUIRE(index.apply(A, stored(0, {1, 2})).ok());
  const KvEventResult r = index.apply(A, stored(2, {9}));
  CHECK(r.status == KvEventStatus::gap);
  REQUIRE(r.gap().has_value());
  CHECK(*r.gap() == cursor::Gap<std::uint64_t>{1, 2});
  CHECK(matches(index, {9}).empty());
  CHECK(index.cursor(A) == promptcache::CursorState<>::live(0));  // not advanced
  CHECK(index.apply(A, stored(3, {9})).gap() == cursor::Gap<std::uint64_t>{1, 3});
  CHECK(index.counters().gaps == 2);

  // The worker's dump as of event 5: blocks 1, 2 gone, 4 -> 5 and 9 held.
  const std::vector<KvEvent> dump{stored(0, {4, 5}), stored(1, {9})};
  const auto res = index.replace_worker(A, dump, 5);
  CHECK(res.ok);
  CHECK(res.blocks == 3);
  CHECK(matches(index, {1, 2}).empty());
  CHECK(matches(index, {4, 5}) == std::vector<KvWorkerMatch>{{A, 2}});
  CHECK(index.node_count() == 3);
  CHECK(index.cursor(A) == promptcache::CursorState<>::live(5));
  CHECK(index.apply(A, stored(5, {7})).status == KvEventStatus::stale);
  CHECK(index.apply(A, stored(6, {7}, 1005)).ok());
  CHECK(matches(index, {4, 5, 7}) == std::vector<KvWorkerMatch>{{A, 3}});
  CHECK(index.counters().workers_replaced == 1);
  CHECK(index.check_invariants());
}

TEST_CASE("replace_worker with a bad dump keeps the old view", "[kv_index]") {
  KvIndex index;
  REQUIRE(index.apply(A, stored(0, {1, 2})).ok());
  REQUIRE(index.apply(B, stored(0, {1})).ok());
  const std::vector<KvEvent> dump{stored(0, {4}), stored(1, {5}, 31337)};
  const auto res = index.replace_worker(A, dump, 9);
  CHECK_FALSE(res.ok);
  CHECK(res.failed_event == 1);
  CHECK(res.failure == KvEventStatus::parent_not_found);
  CHECK(matches(index, {1, 2}) == std::vector<KvWorkerMatch>{{A, 2}, {B, 1}});
  CHECK(matches(index, {4}).empty());
  CHECK(index.cursor(A) == promptcache::CursorState<>::live(0));
  CHECK(index.worker_count() == 2);
  CHECK(index.node_count() == 2);
  CHECK(index.counters().workers_replaced == 0);
  CHECK(index.check_invariants());
}

TEST_CASE("replace_worker accepts unknown workers and empty dumps", "[kv_index]") {
  KvIndex index;
  const auto res = index.replace_worker(C, std::vector<KvEvent>{stored(0, {1, 2})}, 41);
  CHECK(res.ok);
  CHECK(index.contains(C));
  CHECK(index.cursor(C) == promptcache::CursorState<>::live(41));
  CHECK(index.replace_worker(C, {}, u64max).ok);
  CHECK(index.block_count(C) == 0);
  CHECK(index.node_count() == 0);
  CHECK(index.apply(C, stored(0, {1})).status == KvEventStatus::stale);  // max is final
  // A dump may contain removals and clears; they apply in order.
  const std::vector<KvEvent> dump{stored(0, {1, 2, 3}), removed(1, {1003}), cleared(2),
                                  stored(3, {5})};
  CHECK(index.replace_worker(C, dump, 3).blocks == 1);
  CHECK(matches(index, {5}) == std::vector<KvWorkerMatch>{{C, 1}});
  CHECK(index.check_invariants());
}

TEST_CASE("degraded mode resets the view on a gap and applies the event", "[kv_index]") {
  KvIndex index(KvIndexOptions{KvGapPolicy::reset_and_apply});
  REQUIRE(index.apply(A, stored(0, {1, 2})).ok());
  REQUIRE(index.apply(B, stored(0, {1})).ok());
  const KvEventResult r = index.apply(A, stored(5, {7}));
  CHECK(r.ok());
  CHECK(r.view_reset);
  CHECK(r.blocks_cascaded == 2);
  CHECK(r.gap() == cursor::Gap<std::uint64_t>{1, 5});
  CHECK(matches(index, {1, 2}) == std::vector<KvWorkerMatch>{{B, 1}});
  CHECK(matches(index, {7}) == std::vector<KvWorkerMatch>{{A, 1}});
  CHECK(index.cursor(A) == promptcache::CursorState<>::live(5));
  CHECK(index.counters().views_reset == 1);
  CHECK(index.counters().gaps == 1);
  // After a reset nothing is held, so a chained event cannot find its parent.
  CHECK(index.apply(A, stored(9, {3}, 1002)).status == KvEventStatus::parent_not_found);
  CHECK(index.check_invariants());
}

TEST_CASE("dp ranks of one worker are kept apart", "[kv_index]") {
  KvIndex index;
  const KvWorker r0{7, 0};
  const KvWorker r1{7, 1};
  REQUIRE(index.apply(r0, stored(0, {1, 2})).ok());
  REQUIRE(index.apply(r1, stored(0, {1, 3})).ok());  // same name 1001 for block 1: own stream
  REQUIRE(index.apply(r1, stored(1, {4}, 1003)).ok());
  CHECK(index.apply(r0, stored(1, {4}, 1003)).status == KvEventStatus::parent_not_found);
  CHECK(matches(index, {1, 2}) == std::vector<KvWorkerMatch>{{r0, 2}, {r1, 1}});
  CHECK(matches(index, {1, 3, 4}) == std::vector<KvWorkerMatch>{{r0, 1}, {r1, 3}});
  // Removing a name in one rank leaves the other rank's block of that name.
  REQUIRE(index.apply(r1, removed(2, {1001})).ok());
  CHECK(matches(index, {1, 3, 4}) == std::vector<KvWorkerMatch>{{r0, 1}});
  CHECK(index.cursor(r0) == promptcache::CursorState<>::live(1));
  CHECK(index.cursor(r1) == promptcache::CursorState<>::live(2));
  REQUIRE(index.apply(KvWorker{8, 0}, stored(0, {1})).ok());
  CHECK(index.remove_worker(KvWorker{7, 1}));
  CHECK(index.worker_count() == 2);
  REQUIRE(index.apply(r1, stored(0, {1})).ok());  // comes back as a new stream
  CHECK(index.remove_worker(std::uint64_t{7}) == 2);
  CHECK(index.workers() == std::vector<KvWorker>{KvWorker{8, 0}});
  CHECK(index.check_invariants());
}

TEST_CASE("cleared drops the worker's blocks and keeps its cursor", "[kv_index]") {
  KvIndex index;
  REQUIRE(index.apply(A, stored(0, {1, 2, 3})).ok());
  REQUIRE(index.apply(A, stored(1, {5}, 1001)).ok());
  const KvEventResult r = index.apply(A, cleared(2));
  CHECK(r.ok());
  CHECK(r.blocks_cascaded == 4);
  CHECK(index.node_count() == 0);
  CHECK(index.contains(A));
  CHECK(index.block_count(A) == 0);
  CHECK(index.cursor(A) == promptcache::CursorState<>::live(2));
  CHECK(index.apply(A, stored(3, {1})).ok());
  CHECK(index.check_invariants());
}

TEST_CASE("conflicting names are rejected without any change", "[kv_index]") {
  KvIndex index;
  REQUIRE(index.apply(A, stored(0, {1, 2})).ok());
  const std::size_t nodes = index.node_count();
  SECTION("a held name at another position") {
    const auto r = index.apply(A, KvEvent{1, kv_event::Stored{std::nullopt, {{50, 5}, {1002, 6}}}});
    CHECK(r.status == KvEventStatus::block_conflict);
  }
  SECTION("a held position under another name") {
    const auto r = index.apply(A, KvEvent{1, kv_event::Stored{1001, {{77, 2}}}});
    CHECK(r.status == KvEventStatus::block_conflict);
  }
  SECTION("one name twice in one event") {
    const auto r = index.apply(A, KvEvent{1, kv_event::Stored{1002, {{60, 3}, {61, 4}, {60, 5}}}});
    CHECK(r.status == KvEventStatus::block_conflict);
  }
  CHECK(index.node_count() == nodes);
  CHECK(index.block_count(A) == 2);
  CHECK(matches(index, {1, 2, 3, 4, 5}) == std::vector<KvWorkerMatch>{{A, 2}});
  CHECK(matches(index, {5, 6}).empty());
  CHECK(index.counters().block_conflicts == 1);
  CHECK(index.cursor(A) == promptcache::CursorState<>::live(1));
  CHECK(index.check_invariants());
}

TEST_CASE("ids, hashes and worker ids at their maximum", "[kv_index]") {
  KvIndex index;
  const KvWorker big{u64max, std::numeric_limits<std::uint32_t>::max()};
  const KvEvent first{u64max - 1, kv_event::Stored{std::nullopt, {{u64max, u64max}, {0, 0}}}};
  CHECK(index.apply(big, first).ok());
  CHECK(matches(index, {u64max, 0, u64max}) == std::vector<KvWorkerMatch>{{big, 2}});
  CHECK(index.apply(big, removed(u64max, {0})).ok());
  CHECK(index.apply(big, removed(u64max, {u64max})).status == KvEventStatus::stale);
  CHECK(index.apply(big, cleared(0)).status == KvEventStatus::stale);
  CHECK(matches(index, {u64max, 0}) == std::vector<KvWorkerMatch>{{big, 1}});
  CHECK(index.check_invariants());
}

TEST_CASE("empty events advance the cursor and change nothing", "[kv_index]") {
  KvIndex index;
  CHECK(index.apply(A, stored(3, {})).ok());  // any first id is accepted
  CHECK(index.apply(A, removed(4, {})).ok());
  CHECK(index.apply(A, cleared(5)).ok());
  CHECK(index.node_count() == 0);
  CHECK(index.block_count(A) == 0);
  CHECK(index.cursor(A) == promptcache::CursorState<>::live(5));
  CHECK(index.counters().events_applied == 3);
  CHECK(index.check_invariants());
}

TEST_CASE("dump rebuilds the view", "[kv_index]") {
  KvIndex index;
  REQUIRE(index.apply(A, stored(0, {1, 2, 3, 4})).ok());
  REQUIRE(index.apply(A, stored(1, {5, 6}, 1002)).ok());
  REQUIRE(index.apply(A, stored(2, {7}, 1002)).ok());
  REQUIRE(index.apply(A, stored(3, {8})).ok());
  REQUIRE(index.apply(B, stored(0, {1, 2, 9})).ok());
  const std::vector<KvEvent> dump = index.dump(A);
  std::size_t blocks_in_dump = 0;
  for (std::size_t i = 0; i < dump.size(); ++i) {
    CHECK(dump[i].event_id == i);
    REQUIRE(std::holds_alternative<kv_event::Stored>(dump[i].data));
    blocks_in_dump += std::get<kv_event::Stored>(dump[i].data).blocks.size();
  }
  CHECK(blocks_in_dump == 8);
  CHECK(dump.size() == 4);  // one per chain: 1-4, 5-6, 7, 8

  KvIndex copy;
  for (const KvEvent& e : dump)
    REQUIRE(copy.apply(A, e).ok());
  const std::vector<Hashes> queries{{1, 2, 3, 4}, {1, 2, 5, 6}, {1, 2, 7}, {8}, {1, 2, 9}};
  for (const Hashes& q : queries)
    CHECK(match_of(copy, q, A) == match_of(index, q, A));

  // replace_worker with its own dump is a no-op on the view.
  const std::size_t nodes = index.node_count();
  CHECK(index.replace_worker(A, dump, 3).ok);
  CHECK(index.node_count() == nodes);
  CHECK(index.block_count(A) == 8);
  for (const Hashes& q : queries)
    CHECK(match_of(copy, q, A) == match_of(index, q, A));
  CHECK(index.check_invariants());
}

TEST_CASE("more than 64 worker ranks", "[kv_index]") {
  KvIndex index;
  for (std::uint32_t w = 0; w < 150; ++w) {
    const Hashes tokens{1, 2, 100 + w};
    REQUIRE(index.apply(KvWorker{w, 0}, stored(0, tokens)).ok());
    if (w == 63 || w == 64 || w == 149) REQUIRE(index.check_invariants());
  }
  auto all = index.find_matches(Hashes{1, 2, 3});
  CHECK(all.size() == 150);
  CHECK(std::all_of(all.begin(), all.end(), [](const KvWorkerMatch& m) { return m.blocks == 2; }));
  const auto early = index.find_matches(Hashes{1, 2, 100 + 130}, true);
  CHECK(early.size() == 150);
  for (const KvWorkerMatch& m : early)
    CHECK(m.blocks == (m.worker.worker_id == 130 ? 3U : 2U));
  for (std::uint32_t w = 0; w < 150; w += 2)
    CHECK(index.remove_worker(KvWorker{w, 0}));
  CHECK(index.find_matches(Hashes{1}).size() == 75);
  REQUIRE(index.apply(KvWorker{1000, 0}, stored(0, {1, 2, 3})).ok());  // reuses a free slot
  CHECK(match_of(index, {1, 2, 3}, KvWorker{1000, 0}) == 3);
  CHECK(index.check_invariants());
  for (std::uint32_t w = 1; w < 150; w += 2)
    CHECK(index.remove_worker(KvWorker{w, 0}));
  CHECK(index.remove_worker(KvWorker{1000, 0}));
  CHECK(index.node_count() == 0);
  CHECK(index.check_invariants());
}

TEST_CASE("a node's memory does not grow with the worker ranks", "[kv_index]") {
  // 4,096 ranks, each holding a private chain and one shared prefix block: a
  // bitset of one bit per rank on every node would take 512 bytes per node.
  KvIndex index;
  for (std::uint32_t w = 0; w < 4096; ++w) {
    Hashes tokens{1};
    for (std::uint64_t i = 0; i < 8; ++i)
      tokens.push_back(10 + w * 8 + i);
    REQUIRE(index.apply(KvWorker{w, 0}, stored(0, tokens)).ok());
  }
  CHECK(index.total_blocks() == 4096U * 9U);
  CHECK(index.approximate_memory_bytes() / index.total_blocks() < 200U);
  CHECK(index.find_matches(Hashes{1}).size() == 4096U);
  const auto one = index.find_matches(Hashes{1, 10 + 4095 * 8, 10 + 4095 * 8 + 1});
  CHECK(one.size() == 4096U);
  for (const KvWorkerMatch& m : one)
    CHECK(m.blocks == (m.worker.worker_id == 4095 ? 3U : 1U));
  CHECK(index.check_invariants());
}

TEST_CASE("holder sets change form as holders come and go", "[kv_index]") {
  // 300 ranks: a node held by at most 8 of them keeps a sorted array, by
  // more a bitset, by at most 2 the holder word itself.
  KvIndex index;
  for (std::uint32_t w = 0; w < 300; ++w)
    REQUIRE(index.apply(KvWorker{w, 0}, stored(0, {})).ok());
  // Worker w holds 1, 2, ..., and a depth that grows with its number, so node
  // k (depth k) is held by every worker with w % 40 >= k - 1.
  for (std::uint32_t w = 0; w < 300; ++w) {
    Hashes tokens;
    for (std::uint64_t d = 0; d <= w % 40; ++d)
      tokens.push_back(d + 1);
    REQUIRE(index.apply(KvWorker{w, 0}, stored(1, tokens)).ok());
  }
  REQUIRE(index.check_invariants());
  Hashes all(40);
  for (std::uint64_t d = 0; d < 40; ++d)
    all[d] = d + 1;
  auto check_depths = [&] {
    auto got = index.find_matches(all);
    std::sort(got.begin(), got.end());
    std::vector<KvWorkerMatch> want;
    for (std::uint32_t w = 0; w < 300; ++w)
      if (index.block_count(KvWorker{w, 0}) > 0)
        want.push_back(KvWorkerMatch{KvWorker{w, 0}, index.block_count(KvWorker{w, 0})});
    CHECK(got == want);
  };
  check_depths();
  // Removing the deep blocks one rank at a time walks each node's set down
  // through every form.
  for (std::uint32_t w = 0; w < 300; ++w) {
    if (w % 40 < 2) continue;
    REQUIRE(index.apply(KvWorker{w, 0}, removed(2, {1002})).ok());
    if (w % 37 == 0) {
      REQUIRE(index.check_invariants());
      check_depths();
    }
  }
  REQUIRE(index.check_invariants());
  check_depths();
  CHECK(index.node_count() == 2U);
  // A replaced worker keeps its slot: its holder entries move in place.
  REQUIRE(index.replace_worker(KvWorker{41, 0}, std::vector<KvEvent>{stored(0, {1, 2, 77})}, 9).ok);
  CHECK(match_of(index, {1, 2, 77}, KvWorker{41, 0}) == 3);
  REQUIRE(index.check_invariants());
}

TEST_CASE("holder sets leave the word form past 64 ranks and return to it", "[kv_index]") {
  // Up to 64 ranks every holder set is a 64-bit bitset in its node's row; a
  // 65th rank moves every set to the sparse form (kept in the row, a sorted
  // array or a bitset in the arena) and dropping it moves them back. Node k
  // of the shared chain is held by the ranks with w % 64 >= k - 1, so the
  // chain has sets of every size from 64 holders down to 1.
  KvIndex index;
  for (std::uint32_t w = 0; w < 64; ++w) {
    Hashes tokens;
    for (std::uint64_t d = 0; d <= w; ++d)
      tokens.push_back(d + 1);
    tokens.push_back(1000 + w);  // and a private block below it
    REQUIRE(index.apply(KvWorker{w, 0}, stored(0, tokens)).ok());
  }
  Hashes query(64);
  for (std::uint64_t d = 0; d < 64; ++d)
    query[d] = d + 1;
  const auto want = matches(index, query);
  const auto want_early = matches(index, query, true);
  REQUIRE(want.size() == 64);
  REQUIRE(index.check_invariants());
  for (int round = 0; round < 2; ++round) {
    // The 65th rank holds a block of its own and two of the shared chain.
    REQUIRE(index.apply(KvWorker{64, 0}, stored(0, {1, 2, 5000})).ok());
    REQUIRE(index.check_invariants());
    auto with = want;
    with.push_back(KvWorkerMatch{KvWorker{64, 0}, 2});
    std::sort(with.begin(), with.end());
    CHECK(matches(index, query) == with);
    CHECK(match_of(index, {1, 2, 5000}, KvWorker{64, 0}) == 3);
    CHECK(index.remove_worker(KvWorker{64, 0}));
    REQUIRE(index.check_invariants());
    CHECK(matches(index, query) == want);
    CHECK(matches(index, query, true) == want_early);
  }
  // Holders change in the word form too: drop ranks' private blocks and
  // parts of the chain, then restore one.
  for (std::uint32_t w = 0; w < 64; w += 3)
    REQUIRE(index.apply(KvWorker{w, 0}, removed(1, {1000 + 1000 + w})).ok());
  REQUIRE(index.apply(KvWorker{63, 0}, removed(2, {1000 + 40})).ok());
  REQUIRE(index.check_invariants());
  CHECK(match_of(index, query, KvWorker{63, 0}) == 39);
  CHECK(match_of(index, query, KvWorker{62, 0}) == 63);
  REQUIRE(index.apply(KvWorker{63, 0}, stored(3, {40, 41}, 1000 + 39)).ok());
  CHECK(match_of(index, query, KvWorker{63, 0}) == 41);
  REQUIRE(index.check_invariants());
}

TEST_CASE("long chains are removed without recursion", "[kv_index]") {
  KvIndex index;
  Hashes tokens(20000);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = i * 7919U + 1U;
  REQUIRE(index.apply(A, stored(0, tokens)).ok());
  REQUIRE(index.apply(B, stored(0, tokens)).ok());
  CHECK(match_of(index, tokens, A) == tokens.size());
  const auto r = index.apply(A, removed(1, {tokens[0] + 1000}));
  CHECK(r.blocks_cascaded == tokens.size() - 1);
  CHECK(index.node_count() == tokens.size());  // B still holds all of them
  CHECK(index.apply(B, cleared(1)).blocks_cascaded == tokens.size());
  CHECK(index.node_count() == 0);
  CHECK(index.check_invariants());
}

TEST_CASE("memory follows the live blocks", "[kv_index]") {
  KvIndex index;
  const std::size_t empty = index.approximate_memory_bytes();
  for (std::uint64_t round = 0; round < 3; ++round) {
    for (std::uint32_t w = 0; w < 8; ++w) {
      Hashes tokens;
      for (std::uint64_t i = 0; i < 2000; ++i)
        tokens.push_back(i * (w + 1) + round);
      REQUIRE(index.apply(KvWorker{w, 0}, stored(round, tokens)).ok());
    }
    CHECK(index.approximate_memory_bytes() > empty + 16000 * 32);
    CHECK(index.total_blocks() == 16000);
    for (std::uint32_t w = 0; w < 8; ++w)
      REQUIRE(index.apply(KvWorker{w, 0}, cleared(round + 1)).ok());
    CHECK(index.node_count() == 0);
    CHECK(index.total_blocks() == 0);
    CHECK(index.check_invariants());
    for (std::uint32_t w = 0; w < 8; ++w)
      REQUIRE(index.remove_worker(KvWorker{w, 0}));
  }
  CHECK(index.worker_count() == 0);
  // What is left is per-worker bookkeeping (slots), not blocks.
  CHECK(index.approximate_memory_bytes() <= empty + 4096);
}

TEST_CASE("storing held blocks again grows nothing", "[kv_index]") {
  KvIndex index;
  kv_event::Stored s;
  for (std::uint64_t i = 0; i < 100000; ++i)
    s.blocks.push_back({i + 1, i + 1});
  REQUIRE(index.apply(A, {0, s}).ok());
  const std::size_t before = index.approximate_memory_bytes();
  const KvEventResult r = index.apply(A, {1, s});
  REQUIRE(r.ok());
  CHECK(r.blocks_already_held == s.blocks.size());
  CHECK(index.approximate_memory_bytes() == before);
  // A worker that shares the whole chain adds holds and names, no nodes.
  REQUIRE(index.apply(B, {0, s}).ok());
  const std::size_t shared = index.approximate_memory_bytes();
  REQUIRE(index.apply(B, {1, s}).blocks_already_held == s.blocks.size());
  CHECK(index.approximate_memory_bytes() == shared);
  CHECK(index.check_invariants());
}

TEST_CASE("new nodes take no holder-set room at any number of ranks", "[kv_index]") {
  // Past 64 ranks holder sets of three or more holders live in an arena, at
  // up to a bitset over every rank each; a new node's only holder sits in its
  // row. Two indexes get the same long chain of new nodes: one with 1,100
  // ranks holding its parent, one with a single rank. The chain must cost the
  // same in both, while it lives and after it is removed.
  constexpr std::uint64_t ranks = 1100;
  KvIndex big;
  KvIndex one;
  for (std::uint64_t w = 0; w < ranks; ++w)
    REQUIRE(big.apply(KvWorker{w, 0}, {0, kv_event::Stored{{}, {{w, 7}}}}).ok());
  REQUIRE(one.apply(KvWorker{0, 0}, {0, kv_event::Stored{{}, {{0, 7}}}}).ok());
  kv_event::Stored chain;
  chain.parent_hash = 0;
  for (std::uint64_t i = 0; i < 100000; ++i)
    chain.blocks.push_back({1000000 + i, i + 1});
  const std::size_t big_before = big.approximate_memory_bytes();
  const std::size_t one_before = one.approximate_memory_bytes();
  REQUIRE(big.apply(KvWorker{0, 0}, {1, chain}).ok());
  REQUIRE(one.apply(KvWorker{0, 0}, {1, chain}).ok());
  CHECK(big.approximate_memory_bytes() - big_before <=
        (one.approximate_memory_bytes() - one_before) * 5U / 4U);
  REQUIRE(big.apply(KvWorker{0, 0}, {2, kv_event::Removed{{1000000}}}).ok());
  REQUIRE(one.apply(KvWorker{0, 0}, {2, kv_event::Removed{{1000000}}}).ok());
  CHECK(big.node_count() == 1);
  CHECK(big.approximate_memory_bytes() - big_before <=
        (one.approximate_memory_bytes() - one_before) * 5U / 4U);
  CHECK(big.check_invariants());
}

TEST_CASE("a holder joining shared nodes reserves the blocks its sets move to", "[kv_index]") {
  // With 1,100 ranks a bitset costs 256 bytes; a set growing from two holders
  // to three moves to a 16-byte array. Two indexes, one with 1,100 ranks and
  // one with 3, get the same chain from workers 0, 1 and then 2: the third
  // store may cost the larger one its arrays (twice, for the arena's
  // doubling), not a bitset per block.
  constexpr std::uint64_t blocks_n = 20000;
  kv_event::Stored chain;
  chain.parent_hash = 7;
  for (std::uint64_t i = 0; i < blocks_n; ++i)
    chain.blocks.push_back({1000000 + i, i + 1});
  std::size_t growth[2] = {};
  for (const std::uint64_t ranks : {std::uint64_t{1100}, std::uint64_t{3}}) {
    KvIndex index;
    for (std::uint64_t w = 0; w < ranks; ++w)
      REQUIRE(index.apply(KvWorker{w, 0}, {0, kv_event::Stored{{}, {{7, 7}}}}).ok());
    REQUIRE(index.apply(KvWorker{0, 0}, {1, chain}).ok());
    REQUIRE(index.apply(KvWorker{1, 0}, {1, chain}).ok());
    const std::size_t before = index.approximate_memory_bytes();
    REQUIRE(index.apply(KvWorker{2, 0}, {1, chain}).blocks_stored == blocks_n);
    growth[ranks == 3 ? 1 : 0] = index.approximate_memory_bytes() - before;
    CHECK(index.check_invariants());
  }
  CHECK(growth[0] <= growth[1] + 2U * blocks_n * 16U);
}

TEST_CASE("table loads switch with hysteresis between 2^18 and 2^19 pairs", "[long]") {
  // Two indexes end at 400,000 pairs (between the thresholds) after the same
  // peak of 600,000 (so their pools have the same size). One came down to
  // 300,000 and grew its tables again compact, as they were at the peak; the
  // other went under 2^18 first, where its tables turned roomy, and grows
  // them roomy on its way back up. The roomy tables take more bytes.
  constexpr std::uint64_t chain = 50000;
  std::uint64_t ids[2] = {0, 0};
  KvIndex ix[2];
  const auto put = [&](int k, std::uint64_t c) {
    kv_event::Stored s;
    for (std::uint64_t j = 0; j < chain; ++j)
      s.blocks.push_back({(c << 20U) + j + 1U, (c << 20U) + j + 1U});
    REQUIRE(ix[k].apply(A, {ids[k]++, s}).ok());
  };
  const auto drop = [&](int k, std::uint64_t c) {
    REQUIRE(ix[k].apply(A, {ids[k]++, kv_event::Removed{{(c << 20U) + 1U}}}).ok());
  };
  for (int k = 0; k < 2; ++k)
    for (std::uint64_t c = 0; c < 12; ++c)
      put(k, c);
  for (std::uint64_t c = 0; c < 6; ++c)
    drop(0, c);
  for (std::uint64_t c = 0; c < 10; ++c)
    drop(1, c);
  put(0, 30);
  put(0, 31);
  for (std::uint64_t c = 20; c < 26; ++c)
    put(1, c);
  CHECK(ix[0].total_blocks() == 8 * chain);
  CHECK(ix[1].total_blocks() == 8 * chain);
  CHECK(ix[0].approximate_memory_bytes() + 8 * chain * 16 < ix[1].approximate_memory_bytes());
  CHECK(ix[0].check_invariants());
  CHECK(ix[1].check_invariants());
}

TEST_CASE("the span entry points match apply", "[kv_index]") {
  KvIndex index;
  const std::vector<KvBlock> chain{{11, 1}, {12, 2}};
  CHECK(index.store(A, 0, std::nullopt, chain).blocks_stored == 2);
  const std::vector<std::uint64_t> names{12};
  CHECK(index.remove(A, 1, names).blocks_removed == 1);
  CHECK(index.clear(A, 2).blocks_cascaded == 1);
  CHECK(index.node_count() == 0);
  std::vector<KvWorkerMatch> out{{B, 9}};
  index.find_matches(Hashes{1}, false, out);
  CHECK(out.empty());
}

TEST_CASE("a reused result vector holds exactly the matches of each query", "[kv_index]") {
  KvIndex index;
  REQUIRE(index.apply(A, stored(0, {1, 2, 3, 4, 5})).ok());
  REQUIRE(index.apply(B, stored(0, {1, 2, 3}, std::nullopt, 2000)).ok());
  REQUIRE(index.apply(C, stored(0, {1}, std::nullopt, 3000)).ok());
  // Longer, shorter, empty and regrown results in turn, into one vector that
  // starts with stale entries.
  std::vector<KvWorkerMatch> out(10, KvWorkerMatch{C, 99});
  const auto sorted = [&] {
    auto m = out;
    std::sort(m.begin(), m.end());
    return m;
  };
  const std::vector<KvWorkerMatch> all{{A, 5}, {B, 3}, {C, 1}};
  index.find_matches(Hashes{1, 2, 3, 4, 5, 6}, false, out);
  CHECK(sorted() == all);
  index.find_matches(Hashes{1, 2}, false, out);
  CHECK(sorted() == std::vector<KvWorkerMatch>{{A, 2}, {B, 2}, {C, 1}});
  index.find_matches(Hashes{1, 2, 3, 4}, true, out);
  CHECK(sorted() == std::vector<KvWorkerMatch>{{A, 4}, {B, 3}, {C, 1}});
  index.find_matches(Hashes{2, 3}, false, out);
  CHECK(out.empty());
  out.shrink_to_fit();
  index.find_matches(Hashes{1, 2, 3, 4, 5}, false, out);
  CHECK(sorted() == all);
  REQUIRE(index.apply(C, removed(1, {3001})).ok());
  index.find_matches(Hashes{1, 2, 3}, false, out);
  CHECK(sorted() == std::vector<KvWorkerMatch>{{A, 3}, {B, 3}});
}

TEST_CASE("replace_worker with every slot in use keeps the other views", "[kv_index]") {
  KvIndex index;
  for (std::uint32_t w = 0; w < 64; ++w)
    REQUIRE(index.apply(KvWorker{w, 0}, stored(0, {1, 2, 3 + w})).ok());
  const KvWorker w5{5, 0};
  const auto res = index.replace_worker(w5, std::vector<KvEvent>{stored(0, {1, 9, 8})}, 7);
  REQUIRE(res.ok);
  CHECK(index.check_invariants());
  CHECK(match_of(index, {1, 9, 8}, w5) == 3);
  CHECK(match_of(index, {1, 2, 3 + 5}, w5) == 1);
  CHECK(match_of(index, {1, 2, 3 + 6}, KvWorker{6, 0}) == 3);
  CHECK(index.find_matches(Hashes{1}).size() == 64);
  // A failed replacement also leaves everything as it was.
  CHECK_FALSE(index.replace_worker(w5, std::vector<KvEvent>{stored(0, {4}, 12345)}, 8).ok);
  CHECK(match_of(index, {1, 9, 8}, w5) == 3);
  // A 65th rank, then removing it again.
  REQUIRE(index.apply(KvWorker{64, 0}, stored(0, {1, 2})).ok());
  CHECK(index.find_matches(Hashes{1, 2}).size() == 65);
  CHECK(index.remove_worker(KvWorker{64, 0}));
  CHECK(index.check_invariants());
  CHECK(index.find_matches(Hashes{1, 2}).size() == 64);
  CHECK(index.counters().workers_replaced == 1);
}

TEST_CASE("an index is a value: copies are independent", "[kv_index]") {
  KvIndex index;
  REQUIRE(index.apply(A, stored(0, {1, 2, 3})).ok());
  KvIndex copy = index;
  REQUIRE(copy.apply(A, removed(1, {1002})).ok());
  REQUIRE(copy.apply(B, stored(0, {1})).ok());
  CHECK(matches(index, {1, 2, 3}) == std::vector<KvWorkerMatch>{{A, 3}});
  CHECK(matches(copy, {1, 2, 3}) == std::vector<KvWorkerMatch>{{A, 1}, {B, 1}});
  KvIndex moved = std::move(copy);
  CHECK(moved.check_invariants());
  CHECK(index.check_invariants());
  CHECK(index.cursor(A) == promptcache::CursorState<>::live(0));
}

TEST_CASE("long stores and queries across internal chunk boundaries", "[kv_index]") {
  KvIndex index;
  Hashes chain;
  for (std::uint64_t i = 0; i < 150; ++i)
    chain.push_back(i * 31U + 7U);
  const auto prefix = [&](std::size_t n) {
    return Hashes(chain.begin(), chain.begin() + static_cast<std::ptrdiff_t>(n));
  };
  REQUIRE(index.apply(B, stored(0, prefix(70), std::nullopt, 5000)).ok());
  REQUIRE(index.apply(C, stored(0, prefix(33), std::nullopt, 9000)).ok());
  // A walks 70 existing nodes (across the 64-block chunk) and adds 80 new ones.
  const auto r = index.apply(A, stored(0, chain));
  CHECK(r.blocks_stored == 150);
  CHECK(index.node_count() == 150);
  CHECK(matches(index, chain) == std::vector<KvWorkerMatch>{{A, 150}, {B, 70}, {C, 33}});
  CHECK(matches(index, chain, true) == std::vector<KvWorkerMatch>{{A, 71}, {B, 70}, {C, 33}});
  CHECK(matches(index, prefix(64)) == std::vector<KvWorkerMatch>{{A, 64}, {B, 64}, {C, 33}});
  CHECK(matches(index, prefix(65)) == std::vector<KvWorkerMatch>{{A, 65}, {B, 65}, {C, 33}});

  // A conflict deep in a long store (a name reused at block 100) undoes every
  // block of the event, across chunks.
  std::vector<KvBlock> bad;
  for (std::uint64_t i = 0; i < 120; ++i)
    bad.push_back(KvBlock{70000 + i, 900000 + i});
  bad[100].block_hash = 70000 + 10;
  const auto rb = index.apply(B, KvEvent{1, kv_event::Stored{std::nullopt, bad}});
  CHECK(rb.status == KvEventStatus::block_conflict);
  CHECK(index.node_count() == 150);
  CHECK(index.block_count(B) == 70);
  CHECK(index.check_invariants());
}

TEST_CASE("long removals across internal chunk boundaries", "[kv_index]") {
  KvIndex index;
  Hashes chain;
  for (std::uint64_t i = 0; i < 150; ++i)
    chain.push_back(i * 31U + 7U);
  REQUIRE(index.apply(A, stored(0, chain)).ok());
  REQUIRE(index.apply(B, stored(0, Hashes(chain.begin(), chain.begin() + 70), std::nullopt, 5000))
              .ok());
  // Leaves first, as an LRU evicts: 140 names in one event, with an unknown
  // name first and a name removed earlier in the same event.
  Hashes names{424242};
  for (std::size_t i = 149; i >= 10; --i) {
    names.push_back(chain[i] + 1000);
    if (i == 50) names.push_back(chain[149] + 1000);
  }
  const auto r = index.apply(A, removed(1, names));
  CHECK(r.status == KvEventStatus::applied);
  CHECK(r.blocks_removed == 140);
  CHECK(r.blocks_not_held == 2);
  CHECK(r.blocks_cascaded == 0);
  CHECK(index.block_count(A) == 10);
  CHECK(index.node_count() == 70);
  CHECK(matches(index, chain) == std::vector<KvWorkerMatch>{{A, 10}, {B, 70}});
  CHECK(index.check_invariants());

  // A cascade past the first chunk, then a name it took away.
  REQUIRE(index.apply(A, stored(2, Hashes(chain.begin() + 10, chain.end()), chain[9] + 1000)).ok());
  Hashes late;
  for (std::uint64_t i = 0; i < 100; ++i)
    late.push_back(900000 + i);
  late.push_back(chain[5] + 1000);
  late.push_back(chain[140] + 1000);
  const auto c = index.apply(A, removed(3, late));
  CHECK(c.blocks_removed == 1);
  CHECK(c.blocks_cascaded == 144);
  CHECK(c.blocks_not_held == 101);
  CHECK(index.block_count(A) == 5);
  CHECK(index.node_count() == 70);
  CHECK(matches(index, chain) == std::vector<KvWorkerMatch>{{A, 5}, {B, 70}});
  CHECK(index.check_invariants());
}

TEST_CASE("a moved-from index is empty and usable", "[kv_index]") {
  STATIC_REQUIRE(std::is_nothrow_default_constructible_v<KvIndex>);
  STATIC_REQUIRE(std::is_nothrow_move_constructible_v<KvIndex>);
  STATIC_REQUIRE(std::is_nothrow_move_assignable_v<KvIndex>);
  STATIC_REQUIRE(std::is_nothrow_swappable_v<KvIndex>);
  KvIndex index(KvIndexOptions{KvGapPolicy::reset_and_apply});
  REQUIRE(index.apply(A, stored(0, {1, 2, 3})).ok());
  REQUIRE(index.apply(B, stored(0, {1, 4})).ok());
  SECTION("move construction") {
    KvIndex moved = std::move(index);
    CHECK(matches(moved, {1, 2, 3}) == std::vector<KvWorkerMatch>{{A, 3}, {B, 1}});
    CHECK(moved.check_invariants());
  }
  SECTION("move assignment") {
    KvIndex moved;
    REQUIRE(moved.apply(C, stored(0, {9})).ok());
    moved = std::move(index);
    CHECK(matches(moved, {1, 2, 3}) == std::vector<KvWorkerMatch>{{A, 3}, {B, 1}});
    CHECK(matches(moved, {9}).empty());
    CHECK(moved.check_invariants());
  }
  // NOLINTBEGIN(bugprone-use-after-move): the moved-from state is the point.
  CHECK(index.check_invariants());
  CHECK(index.worker_count() == 0);
  CHECK(index.node_count() == 0);
  CHECK(index.total_blocks() == 0);
  CHECK(index.find_matches(Hashes{1, 2}).empty());
  REQUIRE(index.apply(A, stored(0, {1, 2})).ok());
  REQUIRE(index.apply(A, stored(1, {5}, 1002)).ok());
  CHECK(matches(index, {1, 2, 5}) == std::vector<KvWorkerMatch>{{A, 3}});
  CHECK(index.node_count() == 3);
  CHECK(index.total_blocks() == 3);
  CHECK(index.check_invariants());
  CHECK(index.remove_worker(A));
  CHECK(index.node_count() == 0);
  CHECK(index.check_invariants());
  // NOLINTEND(bugprone-use-after-move)
}

TEST_CASE("copy assignment replaces the whole index", "[kv_index]") {
  KvIndex index;
  REQUIRE(index.apply(A, stored(0, {1, 2, 3})).ok());
  KvIndex other;
  for (std::uint32_t w = 0; w < 70; ++w)  // wider bitsets than `index`
    REQUIRE(other.apply(KvWorker{100 + w, 0}, stored(0, {1, 7 + w})).ok());
  other = index;
  CHECK(other.check_invariants());
  CHECK(matches(other, {1, 2, 3}) == std::vector<KvWorkerMatch>{{A, 3}});
  CHECK(other.worker_count() == 1);
  const KvIndex& same = index;
  index = same;  // self-assignment keeps everything
  CHECK(index.check_invariants());
  CHECK(matches(index, {1, 2, 3}) == std::vector<KvWorkerMatch>{{A, 3}});
}

TEST_CASE("degraded mode: a reset that stores nothing frees like a Cleared event", "[kv_index]") {
  Hashes tokens;
  for (std::uint64_t i = 0; i < 3000; ++i)
    tokens.push_back(i * 7919U + 3U);
  KvIndex index(KvIndexOptions{KvGapPolicy::reset_and_apply});
  REQUIRE(index.apply(A, stored(0, tokens)).ok());
  KvIndex cleared_twin(KvIndexOptions{KvGapPolicy::reset_and_apply});
  REQUIRE(cleared_twin.apply(A, stored(0, tokens)).ok());
  REQUIRE(cleared_twin.apply(A, cleared(1)).ok());
  SECTION("the event's parent went with the view") {
    const KvEventResult r = index.apply(A, stored(5, {1}, tokens[10] + 1000));
    CHECK(r.view_reset);
    CHECK(r.status == KvEventStatus::parent_not_found);
  }
  SECTION("an empty Stored event") {
    const KvEventResult r = index.apply(A, stored(5, {}));
    CHECK(r.view_reset);
    CHECK(r.ok());
  }
  CHECK(index.node_count() == 0);
  CHECK(index.total_blocks() == 0);
  CHECK(index.check_invariants());
  CHECK(index.approximate_memory_bytes() <= cleared_twin.approximate_memory_bytes());
}

TEST_CASE("pools refuse to grow past 32-bit indices before allocating", "[kv_index]") {
  // A store reserves first and then mutates without exceptions; past 2^32 - 2
  // nodes or holds the reservation itself must fail (std::length_error, with
  // the index unchanged), not the allocation inside the noexcept mutation.
  constexpr auto npos = promptcache::detail::kv_npos;
  promptcache::detail::KvNodeStore nodes;
  REQUIRE_THROWS_AS(nodes.reserve_extra(npos), std::length_error);
  REQUIRE_THROWS_AS(nodes.reserve_extra(std::numeric_limits<std::size_t>::max()),
                    std::length_error);
  CHECK(nodes.memory_bytes() == 0);
  nodes.reserve_extra(3);
  const std::uint32_t n = nodes.allocate(1, 0);
  CHECK(n == 1);
  REQUIRE_THROWS_AS(nodes.reserve_extra(npos - 2U), std::length_error);
  CHECK(nodes.live() == 1);

  promptcache::detail::KvHoldStore holds;
  REQUIRE_THROWS_AS(holds.reserve_extra(npos), std::length_error);
  REQUIRE_THROWS_AS(holds.reserve_extra(std::numeric_limits<std::size_t>::max()),
                    std::length_error);
  CHECK(holds.memory_bytes() == 0);

  struct Identity {
    static constexpr std::uint64_t hash(std::uint64_t key, std::uint32_t) noexcept { return key; }
  };
  promptcache::detail::KvPackedTable<Identity> table;
  table.insert(5, 0, 1);
  REQUIRE_THROWS_AS(table.reserve_extra(std::numeric_limits<std::size_t>::max()),
                    std::length_error);
  REQUIRE_THROWS_AS(table.reserve_extra(std::numeric_limits<std::size_t>::max() / 2U),
                    std::length_error);
  CHECK(table.size() == 1);
  CHECK(table.find(5, 0) == 1);
}

TEST_CASE("bad input: unknown workers, parents and names in every entry point", "[kv_index]") {
  KvIndex index;
  // A first event of any kind creates the worker; Removed names it never held are no-ops.
  const auto r = index.remove(A, 7, std::vector<std::uint64_t>{1, 2, u64max});
  CHECK(r.ok());
  CHECK(r.blocks_not_held == 3);
  CHECK(index.contains(A));
  CHECK(index.cursor(A) == promptcache::CursorState<>::live(7));
  // Stored under a parent this worker never held (another worker's block does not count).
  CHECK(index.store(B, 0, std::nullopt, std::vector<KvBlock>{{10, 100}}).ok());
  const auto orphan = index.store(A, 8, std::uint64_t{10}, std::vector<KvBlock>{{11, 101}});
  CHECK(orphan.status == KvEventStatus::parent_not_found);
  CHECK(index.cursor(A) == promptcache::CursorState<>::live(8));  // the id is consumed
  CHECK(index.block_count(A) == 0);
  // Queries and dumps about workers that never sent anything.
  const KvWorker nobody{u64max, 3};
  CHECK_FALSE(index.contains(nobody));
  CHECK(index.block_count(nobody) == 0);
  CHECK_FALSE(index.cursor(nobody).has_value());
  CHECK(index.dump(nobody).empty());
  CHECK_FALSE(index.remove_worker(nobody));
  CHECK(index.remove_worker(u64max) == 0);
  CHECK(index.find_matches(Hashes{}).empty());
  CHECK(index.worker_count() == 2);
  CHECK(index.total_blocks() == 1);
  CHECK(index.check_invariants());
}
