// Fuzz harness for KvIndex. The input chooses the gap policy, a set of worker
// ranks (a few, or more than 64 so the holder masks take several words; ids and
// ranks at their type's maximum included) and then a sequence of operations:
// Stored / Removed / Cleared events with contiguous, duplicate, out-of-order,
// skipped and maximal ids, known and unknown parents, shared and conflicting
// block names; replace_worker with good and broken dumps (the model's or the
// index's own); remove_worker for one rank or all ranks of an id; copies and
// moves of the whole index; and find_matches queries with and without early
// exit. Every result, block count, cursor and counter is compared with the
// naive model of tests/support/kv_index_model.hpp, and check_invariants() runs
// (after every operation while the index is small). A second index that keeps
// orphan chains (KvUnknownParent::keep_orphan) gets the same calls, plus
// graft_along and find_matches by names: it must keep its invariants, never
// refuse a non-empty chain as parent_not_found, and end empty.
#include <fuzzer/FuzzedDataProvider.h>
#include <promptcache/kv_index.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <optional>
#include <utility>
#include <variant>
#include <vector>

#include "fuzz_support.hpp"
#include "support/kv_index_model.hpp"

namespace {

using kv_index_model::Model;
using kv_index_model::ModelWorker;
using kv_index_model::Outcome;
using kv_index_model::Path;
using promptcache::KvBlock;
using promptcache::KvEvent;
using promptcache::KvEventResult;
using promptcache::KvEventStatus;
using promptcache::KvGapPolicy;
using promptcache::KvIndex;
using promptcache::KvIndexCounters;
using promptcache::KvIndexOptions;
using promptcache::KvWorker;
using promptcache::KvWorkerMatch;
namespace kv_event = promptcache::kv_event;
namespace cursor = promptcache::cursor;

constexpr std::uint64_t u64max = std::numeric_limits<std::uint64_t>::max();

fuzz::OperationReport report{"fuzz_kv_index"};

std::uint64_t name_of(const Path& path, std::uint64_t salt) {
  std::uint64_t h = 0x1234567U ^ salt;
  for (const std::uint64_t t : path)
    h = (h ^ t) * 0x100000001b3ULL + 0x9e37U;
  return h;
}

class Harness {
 public:
  Harness(FuzzedDataProvider& in, KvGapPolicy policy)
      : in_(in),
        model_(policy),
        index_(KvIndexOptions{policy}),
        orphans_(KvIndexOptions{policy, promptcache::KvUnknownParent::keep_orphan}) {
    const std::size_t ids = in_.ConsumeBool() ? in_.ConsumeIntegralInRange<std::size_t>(1, 5)
                                              : in_.ConsumeIntegralInRange<std::size_t>(30, 40);
    for (std::size_t w = 0; w < ids; ++w) {
      const std::uint64_t id = w == 0 && in_.ConsumeBool() ? u64max : w * 11U + 1U;
      workers_.push_back(KvWorker{id, 0});
      if (w % 2 == 0) workers_.push_back(KvWorker{id, w == 0 ? ~std::uint32_t{0} : 1U});
    }
    next_id_.assign(workers_.size(), 0);
  }

  void step() {
    const std::size_t wi = in_.ConsumeIntegralInRange<std::size_t>(0, workers_.size() - 1);
    const KvWorker w = workers_[wi];
    const int action = in_.ConsumeIntegralInRange<int>(0, 31);
    if (action == 0) {  // one rank goes away
      FUZZ_CHECK(index_.remove_worker(w) == model_.contains(w));
      (void)orphans_.remove_worker(w);
      model_.erase(w);
      next_id_[wi] = 0;
    } else if (action == 1) {  // every rank of the id goes away
      std::size_t ranks = 0;
      for (std::size_t k = 0; k < workers_.size(); ++k) {
        if (workers_[k].worker_id != w.worker_id) continue;
        ranks += model_.contains(workers_[k]) ? 1U : 0U;
        model_.erase(workers_[k]);
        next_id_[k] = 0;
      }
      FUZZ_CHECK(index_.remove_worker(w.worker_id) == ranks);
      (void)orphans_.remove_worker(w.worker_id);
    } else if (action == 2) {  // resync from the model's dump (possibly broken)
      replace(wi, model_.dump(w));
    } else if (action == 3) {  // the index's own dump round-trips
      replace(wi, index_.dump(w));
    } else if (action == 4) {  // a dump of random events (mostly fails)
      std::vector<KvEvent> dump;
      for (std::size_t n = in_.ConsumeIntegralInRange<std::size_t>(0, 4); n > 0; --n)
        dump.push_back(make_event(wi, 0));
      replace(wi, dump);
    } else if (action == 5) {  // copies are independent values; moves leave an empty index
      copy_and_move();
    } else if (action < 10) {
      query();
    } else {
      apply(wi);
    }
    const ModelWorker* mw = model_.get(w);
    FUZZ_CHECK(index_.contains(w) == (mw != nullptr));
    FUZZ_CHECK(index_.block_count(w) == (mw != nullptr ? mw->names.size() : 0U));
    const auto c = index_.cursor(w);
    FUZZ_CHECK(c.has_value() == (mw != nullptr));
    if (mw != nullptr) FUZZ_CHECK(c->last_applied_id() == mw->last);
    FUZZ_CHECK(index_.counters() == counters_);
    // check_invariants() walks everything: after every step while the index is small (where
    // most bugs show), every 16th step beyond, and always at the end of the input.
    if (index_.node_count() <= 64 || ++steps_ % 16 == 0) {
      FUZZ_CHECK(index_.check_invariants());
      FUZZ_CHECK(orphans_.check_invariants());
    }
  }

  void finish() {
    std::size_t total = 0, ranks = 0;
    for (const auto& [w, mw] : model_.all()) {
      total += mw.names.size();
      ++ranks;
    }
    FUZZ_CHECK(index_.total_blocks() == total);
    FUZZ_CHECK(index_.worker_count() == ranks);
    FUZZ_CHECK(index_.workers().size() == ranks);
    for (const KvWorker& w : workers_)
      index_.remove_worker(w.worker_id);
    FUZZ_CHECK(index_.worker_count() == 0);
    FUZZ_CHECK(index_.total_blocks() == 0);
    FUZZ_CHECK(index_.node_count() == 0);
    FUZZ_CHECK(index_.check_invariants());
    FUZZ_CHECK(orphans_.check_invariants());
    for (const KvWorker& w : workers_)
      orphans_.remove_worker(w.worker_id);
    FUZZ_CHECK(orphans_.worker_count() == 0);
    FUZZ_CHECK(orphans_.total_orphans() == 0);
    FUZZ_CHECK(orphans_.node_count() == 0);
    FUZZ_CHECK(orphans_.check_invariants());
  }

 private:
  const Path* random_path(const KvWorker& w) {
    const ModelWorker* mw = model_.get(w);
    if (mw == nullptr || mw->paths.empty()) return nullptr;
    auto it = mw->paths.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(
                         in_.ConsumeIntegralInRange<std::size_t>(0, mw->paths.size() - 1)));
    return &it->first;
  }

  std::uint64_t pick_event_id(std::size_t wi) {
    std::uint64_t id = next_id_[wi];
    switch (in_.ConsumeIntegralInRange<int>(0, 15)) {
      case 0:  // duplicate or out of order
        id -= std::min<std::uint64_t>(id, in_.ConsumeIntegralInRange<std::uint64_t>(1, 3));
        break;
      case 1:  // a few events lost
        id += in_.ConsumeIntegralInRange<std::uint64_t>(1, 3);
        break;
      case 2:  // the last id there is, or close to it
        id = u64max - in_.ConsumeIntegralInRange<std::uint64_t>(0, 2);
        break;
      default:
        break;
    }
    if (id != u64max) next_id_[wi] = std::max(next_id_[wi], id + 1);
    return id;
  }

  KvEvent make_event(std::size_t wi, std::uint64_t id) {
    const KvWorker& w = workers_[wi];
    const std::uint64_t salt = w.worker_id % 2 == 0 ? 0U : w.worker_id;  // naming schemes differ
    const int kind = in_.ConsumeIntegralInRange<int>(0, 19);
    if (kind < 11) {
      kv_event::Stored s;
      Path path;
      const Path* base = random_path(w);
      const int parent = in_.ConsumeIntegralInRange<int>(0, 7);
      if (base != nullptr && parent < 6) {
        path = *base;
        s.parent_hash = name_of(path, salt);
      } else if (parent == 6) {
        s.parent_hash =
            in_.ConsumeBool() ? u64max : in_.ConsumeIntegralInRange<std::uint64_t>(0, 9);
      }
      const std::size_t n = in_.ConsumeIntegralInRange<int>(0, 15) == 0
                                ? in_.ConsumeIntegralInRange<std::size_t>(0, 70)
                                : in_.ConsumeIntegralInRange<std::size_t>(0, 4);
      for (std::size_t i = 0; i < n; ++i) {
        const int t = in_.ConsumeIntegralInRange<int>(0, 15);
        path.push_back(t == 15 ? u64max : static_cast<std::uint64_t>(1 + t % 3));
        std::uint64_t name = name_of(path, salt);
        const int stray = in_.ConsumeIntegralInRange<int>(0, 39);
        if (stray == 0) name = in_.ConsumeIntegralInRange<std::uint64_t>(0, 7);  // conflicts
        if (stray == 1) name = u64max;
        s.blocks.push_back(KvBlock{name, path.back()});
      }
      return KvEvent{id, std::move(s)};
    }
    if (kind < 19) {
      kv_event::Removed r;
      for (std::size_t n = in_.ConsumeIntegralInRange<std::size_t>(0, 3); n > 0; --n) {
        const Path* p = random_path(w);
        if (p != nullptr && in_.ConsumeIntegralInRange<int>(0, 5) != 0)
          r.block_hashes.push_back(name_of(*p, salt));
        else
          r.block_hashes.push_back(in_.ConsumeIntegralInRange<std::uint64_t>(0, 7));
      }
      return KvEvent{id, std::move(r)};
    }
    return KvEvent{id, kv_event::Cleared{}};
  }

  void apply(std::size_t wi) {
    const KvWorker w = workers_[wi];
    const std::uint64_t id = pick_event_id(wi);
    const KvEvent e = make_event(wi, id);
    const ModelWorker* before = model_.get(w);
    const std::optional<std::uint64_t> last = before != nullptr ? before->last : std::nullopt;
    KvEventResult r;
    switch (in_.ConsumeIntegralInRange<int>(0, 3)) {  // apply() and the span entry points
      case 0:
        if (const auto* s = std::get_if<kv_event::Stored>(&e.data)) {
          r = index_.store(w, id, s->parent_hash, s->blocks);
        } else if (const auto* rm = std::get_if<kv_event::Removed>(&e.data)) {
          r = index_.remove(w, id, rm->block_hashes);
        } else {
          r = index_.clear(w, id);
        }
        break;
      default:
        r = index_.apply(w, e);
        break;
    }
    const Outcome o = model_.apply(w, e);
    const KvEventResult kept = orphans_.apply(w, e);
    if (const auto* s = std::get_if<kv_event::Stored>(&e.data); s != nullptr && !s->blocks.empty())
      FUZZ_CHECK(kept.status != KvEventStatus::parent_not_found);
    FUZZ_CHECK(r.status == o.status);
    FUZZ_CHECK(r.ok() == (o.status == KvEventStatus::applied));
    FUZZ_CHECK(r.view_reset == o.reset);
    FUZZ_CHECK(r.blocks_stored == o.stored);
    FUZZ_CHECK(r.blocks_already_held == o.already);
    FUZZ_CHECK(r.blocks_removed == o.removed);
    FUZZ_CHECK(r.blocks_cascaded == o.cascaded);
    FUZZ_CHECK(r.blocks_not_held == o.not_held);
    // The observation, computed without the cursor.
    if (!last) {
      FUZZ_CHECK(std::holds_alternative<cursor::Initial<std::uint64_t>>(r.observation));
    } else if (id <= *last) {
      FUZZ_CHECK(r.observation ==
                 (promptcache::CursorObservation<>{cursor::Stale<std::uint64_t>{id, last}}));
    } else if (id == *last + 1) {
      FUZZ_CHECK(std::holds_alternative<cursor::Contiguous<std::uint64_t>>(r.observation));
    } else {
      FUZZ_CHECK(r.gap().has_value() && r.gap()->expected == *last + 1 && r.gap()->got == id);
    }
    switch (o.status) {
      case KvEventStatus::applied:
        ++counters_.events_applied;
        break;
      case KvEventStatus::stale:
        ++counters_.events_stale;
        break;
      case KvEventStatus::gap:
        ++counters_.gaps;
        next_id_[wi] = id;  // keep the gap open until a resync
        break;
      case KvEventStatus::parent_not_found:
        ++counters_.parent_not_found;
        break;
      case KvEventStatus::block_conflict:
        ++counters_.block_conflicts;
        break;
    }
    if (o.reset) {
      ++counters_.gaps;
      ++counters_.views_reset;
    }
  }

  void replace(std::size_t wi, const std::vector<KvEvent>& dump) {
    const KvWorker w = workers_[wi];
    // What the dump rebuilds, or the first event that cannot apply.
    ModelWorker rebuilt;
    std::optional<std::size_t> failed;
    KvEventStatus failure = KvEventStatus::applied;
    for (std::size_t i = 0; i < dump.size() && !failed; ++i) {
      Outcome o;
      Model::content(rebuilt, dump[i].data, o);
      if (o.status != KvEventStatus::applied) {
        failed = i;
        failure = o.status;
      }
    }
    std::uint64_t last = next_id_[wi] + in_.ConsumeIntegralInRange<std::uint64_t>(0, 2);
    if (in_.ConsumeIntegralInRange<int>(0, 15) == 0) last = u64max;
    const auto res = index_.replace_worker(w, dump, last);
    (void)orphans_.replace_worker(w, dump, last);
    // Its own dump (it may fail where conflicting names left a chain an
    // orphan chain under a parent the worker holds).
    (void)orphans_.replace_worker(w, orphans_.dump(w), last);
    FUZZ_CHECK(res.ok == !failed.has_value());
    if (failed) {
      FUZZ_CHECK(res.failed_event == *failed);
      FUZZ_CHECK(res.failure == failure);
      return;
    }
    rebuilt.last = last;
    model_.all()[w] = std::move(rebuilt);
    FUZZ_CHECK(res.blocks == model_.get(w)->names.size());
    ++counters_.workers_replaced;
    next_id_[wi] = last == u64max ? u64max : last + 1;
  }

  Path random_query() {
    Path q;
    const KvWorker& w = workers_[in_.ConsumeIntegralInRange<std::size_t>(0, workers_.size() - 1)];
    if (const Path* p = random_path(w)) q = *p;
    for (std::size_t n = in_.ConsumeIntegralInRange<std::size_t>(0, 3); n > 0; --n)
      q.push_back(1 + in_.ConsumeIntegralInRange<std::uint64_t>(0, 2));
    if (!q.empty() && in_.ConsumeIntegralInRange<int>(0, 3) == 0)
      q[in_.ConsumeIntegralInRange<std::size_t>(0, q.size() - 1)] =
          in_.ConsumeIntegralInRange<std::uint64_t>(0, 3);
    return q;
  }

  void check_query(const KvIndex& index, const Path& q, bool early) {
    auto got = index.find_matches(q, early);
    std::sort(got.begin(), got.end());
    FUZZ_CHECK(got == model_.find(q, early));
  }

  void query() {
    const Path q = random_query();
    const bool early = in_.ConsumeBool();
    check_query(index_, q, early);
    // The overload that reuses the caller's vector clears it first.
    std::vector<KvWorkerMatch> out(3, KvWorkerMatch{KvWorker{7, 7}, 7});
    index_.find_matches(q, early, out);
    std::sort(out.begin(), out.end());
    FUZZ_CHECK(out == model_.find(q, early));
    // The orphan-keeping index, by names (one worker's naming scheme).
    const std::uint64_t salt = in_.ConsumeBool() ? 0U : workers_[1 % workers_.size()].worker_id;
    std::vector<std::uint64_t> names;
    Path prefix;
    for (const std::uint64_t t : q) {
      prefix.push_back(t);
      names.push_back(name_of(prefix, salt));
    }
    if (in_.ConsumeBool()) (void)orphans_.graft_along(q, names);
    const auto by_name = orphans_.find_matches(q, names, early);
    const auto by_tokens = orphans_.find_matches(q, early);
    for (const KvWorkerMatch& m : by_name)
      FUZZ_CHECK(m.blocks >= 1U && m.blocks <= q.size());
    if (!early)
      for (const KvWorkerMatch& m : by_tokens) {
        const auto it = std::find_if(by_name.begin(), by_name.end(),
                                     [&](const KvWorkerMatch& x) { return x.worker == m.worker; });
        FUZZ_CHECK(it != by_name.end() && it->blocks >= m.blocks);
      }
  }

  void copy_and_move() {
    KvIndex copy = index_;
    FUZZ_CHECK(copy.check_invariants());
    FUZZ_CHECK(copy.total_blocks() == index_.total_blocks());
    FUZZ_CHECK(copy.node_count() == index_.node_count());
    check_query(copy, random_query(), false);
    switch (in_.ConsumeIntegralInRange<int>(0, 2)) {
      case 0: {  // move construction round trip
        KvIndex moved(std::move(index_));
        FUZZ_CHECK(index_.worker_count() == 0 && index_.node_count() == 0);
        FUZZ_CHECK(index_.check_invariants());
        index_ = std::move(moved);
        break;
      }
      case 1:  // copy assignment over a changed index
        index_.clear(workers_[0], u64max);
        index_ = copy;
        break;
      default:
        swap(index_, copy);
        break;
    }
    FUZZ_CHECK(index_.check_invariants());
    check_query(index_, random_query(), in_.ConsumeBool());
  }

  FuzzedDataProvider& in_;
  Model model_;
  KvIndex index_;
  KvIndex orphans_;  // keeps orphan chains; no model, invariants only
  KvIndexCounters counters_;
  std::vector<KvWorker> workers_;
  std::vector<std::uint64_t> next_id_;
  std::uint64_t steps_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  const KvGapPolicy policy = in.ConsumeBool() ? KvGapPolicy::reset_and_apply : KvGapPolicy::report;
  Harness h(in, policy);
  while (in.remaining_bytes() > 0) {
    ++fuzz::operations();
    h.step();
  }
  h.finish();
  return 0;
}
