// Randomized differential test of KvIndex against the naive model of
// support/kv_index_model.hpp: per worker rank, the set of root-to-block paths it
// holds and the name of each. Some streams also make allocations fail inside
// the index's calls (support/counting_new.hpp): the call must then change
// nothing, and the stream goes on with the call repeated.
#include <promptcache/kv_index.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <new>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "catch.hpp"
#include "support/counting_new.hpp"
#include "support/kv_index_model.hpp"

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

namespace {

using namespace kv_index_model;  // NOLINT: Path, ModelWorker, Outcome, Model

std::uint64_t name_of(const Path& path, std::uint64_t salt) {
  std::uint64_t h = 0x1234567U ^ salt;
  for (const std::uint64_t t : path)
    h = (h ^ t) * 0x100000001b3ULL + 0x9e37U;
  return h;
}

// What a stream looks like beyond its seed and workers.
struct Shape {
  std::uint64_t max_blocks = 4;  // blocks per Stored event: 0 .. max_blocks
  std::uint64_t alphabet = 3;    // tokens hashes 1 .. alphabet (small: much sharing)
  bool fail_allocs = false;      // make an allocation of some index calls fail
};

// What a failed call must leave as it was, as far as the worker `w` shows.
struct Snapshot {
  promptcache::KvIndexCounters counters;
  std::size_t total = 0, nodes = 0, workers = 0, blocks = 0;
  std::optional<promptcache::CursorState<>> cursor;
  std::vector<KvEvent> dump;

  Snapshot(const KvIndex& index, const KvWorker& w)
      : counters(index.counters()),
        total(index.total_blocks()),
        nodes(index.node_count()),
        workers(index.worker_count()),
        blocks(index.block_count(w)),
        cursor(index.cursor(w)),
        dump(index.dump(w)) {}
  bool operator==(const Snapshot&) const = default;
};

class Driver {
 public:
  Driver(std::uint32_t seed, std::uint32_t worker_ids, KvGapPolicy policy, Shape shape = {})
      : rng_(seed), model_(policy), index_(KvIndexOptions{policy}), shape_(shape) {
    for (std::uint32_t w = 0; w < worker_ids; ++w) {
      workers_.push_back(KvWorker{w * 11U + 1U, 0});
      if (w % 3 == 0) workers_.push_back(KvWorker{w * 11U + 1U, 1});  // a second dp rank
    }
    next_id_.assign(workers_.size(), 0);
  }

  std::uint64_t pick(std::uint64_t n) {
    return std::uniform_int_distribution<std::uint64_t>(0, n - 1)(rng_);
  }

  const Path* random_path(const KvWorker& w) {
    const ModelWorker* mw = model_.get(w);
    if (mw == nullptr || mw->paths.empty()) return nullptr;
    auto it = mw->paths.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(pick(mw->paths.size())));
    return &it->first;
  }

  KvEvent make_event(std::size_t wi) {
    const KvWorker& w = workers_[wi];
    // Ids: mostly contiguous, some duplicates (stale), some skips (gaps).
    std::uint64_t id = next_id_[wi];
    const std::uint64_t roll = pick(100);
    if (roll < 4 && id > 0)
      id -= 1 + pick(std::min<std::uint64_t>(id, 3));
    else if (roll < 7)
      id += 1 + pick(3);
    next_id_[wi] = std::max(next_id_[wi], id + 1);

    const std::uint64_t salt = w.worker_id % 2 == 0 ? 0U : w.worker_id;  // naming schemes differ
    const std::uint64_t kind = pick(100);
    if (kind < 55) {
      kv_event::Stored s;
      Path path;
      const Path* base = random_path(w);
      if (base != nullptr && pick(3) != 0) {
        path = *base;
        s.parent_hash = name_of(path, salt);
      } else if (pick(20) == 0) {
        s.parent_hash = pick(1000);  // almost surely unknown
      }
      const std::uint64_t n = pick(shape_.max_blocks + 1U);
      for (std::uint64_t i = 0; i < n; ++i) {
        path.push_back(1 + pick(shape_.alphabet));
        std::uint64_t name = name_of(path, salt);
        if (pick(60) == 0) name = pick(8);  // a stray name: conflicts
        s.blocks.push_back(KvBlock{name, path.back()});
      }
      return KvEvent{id, std::move(s)};
    }
    if (kind < 93) {
      kv_event::Removed r;
      const std::uint64_t n = 1 + pick(3);
      for (std::uint64_t i = 0; i < n; ++i) {
        const Path* p = random_path(w);
        if (p != nullptr && pick(6) != 0)
          r.block_hashes.push_back(name_of(*p, salt));
        else
          r.block_hashes.push_back(pick(8));
      }
      return KvEvent{id, std::move(r)};
    }
    return KvEvent{id, kv_event::Cleared{}};
  }

  Path random_query() {
    Path q;
    const KvWorker& w = workers_[pick(workers_.size())];
    if (const Path* p = random_path(w)) q = *p;
    const std::uint64_t extra = pick(4);
    for (std::uint64_t i = 0; i < extra; ++i)
      q.push_back(1 + pick(shape_.alphabet));
    if (!q.empty() && pick(4) == 0) q[pick(q.size())] = 1 + pick(shape_.alphabet);
    return q;
  }

  void check_queries() {
    for (int i = 0; i < 3; ++i) {
      const Path q = random_query();
      const bool early = pick(2) == 0;
      auto got = index_.find_matches(q, early);
      std::sort(got.begin(), got.end());
      const auto want = model_.find(q, early);
      CAPTURE(q, early);
      REQUIRE(got.size() == want.size());
      for (std::size_t k = 0; k < got.size(); ++k) {
        REQUIRE(got[k].worker == want[k].worker);
        REQUIRE(got[k].blocks == want[k].blocks);
      }
    }
  }

  void step(std::size_t step_no) {
    const std::size_t wi = pick(workers_.size());
    const KvWorker& w = workers_[wi];
    const std::uint64_t action = pick(1000);
    if (action < 4) {  // the worker goes away
      CHECK(index_.remove_worker(w) == model_.contains(w));
      model_.erase(w);
      next_id_[wi] = 0;
    } else if (action < 12 && model_.contains(w)) {  // resync from the model's dump
      const std::uint64_t last = next_id_[wi] + pick(3);
      const auto dump = model_.dump(w);
      const auto res = call(w, [&] { return index_.replace_worker(w, dump, last); });
      REQUIRE(res.ok);
      model_.replace(w, last);
      REQUIRE(res.blocks == model_.get(w)->names.size());
      next_id_[wi] = last + 1;
    } else if (action < 16 && model_.contains(w)) {  // the index's own dump round-trips
      const auto own = index_.dump(w);
      const auto res = call(w, [&] { return index_.replace_worker(w, own, next_id_[wi] - 1); });
      REQUIRE(res.ok);
      if (next_id_[wi] > 0) model_.replace(w, next_id_[wi] - 1);
    } else if (action < 20) {  // a dump that cannot apply changes nothing
      auto dump = model_.dump(w);
      const std::size_t bad = pick(dump.size() + 1U);
      const std::uint64_t t = 1U + pick(shape_.alphabet);
      dump.insert(dump.begin() + static_cast<std::ptrdiff_t>(bad),
                  KvEvent{0, kv_event::Stored{0xBAD0000 + pick(100), {KvBlock{7, t}}}});
      const Snapshot before(index_, w);
      const auto res = call(w, [&] { return index_.replace_worker(w, dump, next_id_[wi]); });
      REQUIRE_FALSE(res.ok);
      REQUIRE(res.failed_event == bad);
      REQUIRE(res.failure == KvEventStatus::parent_not_found);
      REQUIRE(Snapshot(index_, w) == before);
    } else {
      const KvEvent e = make_event(wi);
      const KvEventResult r = call(w, [&] { return index_.apply(w, e); });
      const Outcome o = model_.apply(w, e);
      CAPTURE(step_no, w.worker_id, w.dp_rank, e.event_id);
      REQUIRE(r.status == o.status);
      REQUIRE(r.view_reset == o.reset);
      REQUIRE(r.blocks_stored == o.stored);
      REQUIRE(r.blocks_already_held == o.already);
      REQUIRE(r.blocks_removed == o.removed);
      REQUIRE(r.blocks_cascaded == o.cascaded);
      REQUIRE(r.blocks_not_held == o.not_held);
      if (r.status == KvEventStatus::gap) next_id_[wi] = e.event_id;  // keep the gap open
      cascades_ += r.blocks_cascaded;
      already_ += r.blocks_already_held;
    }
    const ModelWorker* mw = model_.get(w);
    REQUIRE(index_.block_count(w) == (mw != nullptr ? mw->names.size() : 0U));
    if (mw != nullptr && mw->last) REQUIRE(index_.cursor(w)->last_applied_id() == mw->last);
    check_queries();
    if (step_no % 64 == 0) REQUIRE(index_.check_invariants());
  }

  // Stores and then removes, for a worker rank the model does not know, long
  // chains of tokens the streams never use (so no query reaches them) until
  // the index holds `pairs` more pairs and back: the edge table and the rank's
  // name table cross the size where they switch between their roomy and
  // compact loads, both ways, with the stream's blocks live.
  void flood(std::size_t pairs) {
    const KvWorker bulk{0xF100D, 0};
    constexpr std::uint64_t chain = 16384;
    std::vector<std::uint64_t> heads;
    std::uint64_t id = next_flood_id_;
    const std::size_t before = index_.total_blocks();
    for (std::uint64_t c = 0; c * chain < pairs; ++c) {
      kv_event::Stored s;
      const std::uint64_t base = (std::uint64_t{1} << 40U) + (flood_chains_++ << 20U);
      for (std::uint64_t i = 0; i < chain; ++i)
        s.blocks.push_back(KvBlock{base + i, base + i});
      heads.push_back(base);
      REQUIRE(index_.apply(bulk, KvEvent{id++, std::move(s)}).ok());
    }
    REQUIRE(index_.total_blocks() >= before + pairs);
    REQUIRE(index_.check_invariants());
    check_queries();
    for (const std::uint64_t h : heads)
      REQUIRE(index_.apply(bulk, KvEvent{id++, kv_event::Removed{{h}}}).ok());
    REQUIRE(index_.total_blocks() == before);
    REQUIRE(index_.check_invariants());
    check_queries();
    next_flood_id_ = id;
  }

  void finish(bool expect_gaps_reported) {
    index_.remove_worker(KvWorker{0xF100D, 0});
    // The stream exercised every rule.
    const auto& c = index_.counters();
    CHECK(c.events_applied > 100);
    CHECK(c.events_stale > 0);
    CHECK(c.gaps > 0);
    CHECK(c.parent_not_found > 0);
    CHECK(c.block_conflicts > 0);
    CHECK(c.workers_replaced > 0);
    CHECK((c.views_reset > 0) != expect_gaps_reported);
    CHECK(cascades_ > 0);
    CHECK(already_ > 0);
    if (shape_.fail_allocs) CHECK(failed_calls_ > 0);
    REQUIRE(index_.check_invariants());
    std::size_t total = 0;
    for (const auto& [w, mw] : model_.all())
      total += mw.names.size();
    REQUIRE(index_.total_blocks() == total);
    for (const KvWorker& w : workers_)
      index_.remove_worker(w.worker_id);
    CHECK(index_.worker_count() == 0);
    CHECK(index_.total_blocks() == 0);
    CHECK(index_.node_count() == 0);  // back to the root
    CHECK(index_.find_matches(Path{1, 2, 3}).empty());
    REQUIRE(index_.check_invariants());
  }

 private:
  // Runs f() (an index call for worker `w`); with fail_allocs, first once with
  // one of its first allocations made to fail, which must leave everything
  // as it was (strong guarantee).
  template <class F>
  auto call(const KvWorker& w, F&& f) -> decltype(f()) {
    if (shape_.fail_allocs && pick(4) == 0) {
      const Snapshot before(index_, w);
      test_alloc::countdown = static_cast<long>(pick(12));
      bool failed = false;
      try {
        auto r = f();
        test_alloc::countdown = -1;
        return r;  // no allocation failed: done
      } catch (const std::bad_alloc&) {
        failed = true;
      }
      test_alloc::countdown = -1;
      REQUIRE(failed);
      ++failed_calls_;
      REQUIRE(Snapshot(index_, w) == before);
      REQUIRE(index_.check_invariants());
    }
    return f();
  }

  std::mt19937_64 rng_;
  Model model_;
  KvIndex index_;
  std::vector<KvWorker> workers_;
  std::vector<std::uint64_t> next_id_;
  Shape shape_;
  std::size_t cascades_ = 0;
  std::size_t already_ = 0;
  std::size_t failed_calls_ = 0;
  std::uint64_t next_flood_id_ = 0;
  std::uint64_t flood_chains_ = 0;
};

}  // namespace

TEST_CASE("random event streams match the naive model", "[kv_index][random]") {
  for (std::uint32_t seed = 1; seed <= 4; ++seed) {
    CAPTURE(seed);
    Driver d(seed, 4, KvGapPolicy::report);
    for (std::size_t i = 0; i < 5000; ++i)
      d.step(i);
    d.finish(true);
  }
}

TEST_CASE("random streams in degraded mode match the naive model", "[kv_index][random]") {
  Driver d(99, 4, KvGapPolicy::reset_and_apply);
  for (std::size_t i = 0; i < 5000; ++i)
    d.step(i);
  d.finish(false);
}

TEST_CASE("random streams with more than 64 worker ranks", "[kv_index][random]") {
  Driver d(7, 60, KvGapPolicy::report);  // 60 ids, 20 of them with a second rank
  for (std::size_t i = 0; i < 8000; ++i)
    d.step(i);
  d.finish(true);
}

TEST_CASE("random streams with hundreds of worker ranks", "[kv_index][random]") {
  // 400 ranks: holder sets in all three forms (word, sorted array, bitset),
  // and bitsets wider than 128 slots.
  Driver d(11, 300, KvGapPolicy::report);
  for (std::size_t i = 0; i < 12000; ++i)
    d.step(i);
  d.finish(true);
}

TEST_CASE("random streams with long events and a large alphabet cross the table loads", "[long]") {
  // Chains of up to 40 blocks over 50 tokens, and a flood of 600,000 pairs
  // from another rank: past the 2^19 pairs where the tables turn compact,
  // then back under the 2^18 where they turn roomy.
  Driver d(21, 6, KvGapPolicy::report, Shape{40, 50, false});
  for (std::size_t i = 0; i < 3000; ++i) {
    d.step(i);
    if (i == 1500) d.flood(600000);
  }
  d.finish(true);
}

TEST_CASE("random streams with failing allocations change nothing when a call fails",
          "[kv_index][random]") {
  // A quarter of the calls first run with one of their first 12 allocations
  // failing; after that the call is repeated and must match the model.
  for (const KvGapPolicy policy : {KvGapPolicy::report, KvGapPolicy::reset_and_apply}) {
    Driver d(31, 4, policy, Shape{12, 6, true});
    for (std::size_t i = 0; i < 3000; ++i)
      d.step(i);
    d.finish(policy == KvGapPolicy::report);
  }
}

TEST_CASE("random streams with failing allocations and more than 64 ranks", "[kv_index][random]") {
  // 80 ranks: replace_worker's temporary slot and new ranks switch the holder
  // sets between their forms and widths; allocations fail in those too.
  Driver d(41, 60, KvGapPolicy::report, Shape{8, 8, true});
  for (std::size_t i = 0; i < 4000; ++i)
    d.step(i);
  d.finish(true);
}
