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
using promptcache::KvEventData;
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

TEST_CASE("a request naming the anchor's path grafts the chain there", "[kv_index][late_join]") {
  KvIndex index(late_join_options());
  const Request q = request(seq(60, 9));
  REQUIRE(index.apply(A, stored(0, q, 0, 6)).ok());
  REQUIRE(index.apply(A, stored(4, q, 6, 8)).view_reset);  // orphans 6, 7 under block 5
  // A request sharing blocks 0..3 only cannot be matched yet: its names do
  // not reach the anchor.
  Request shorter = request(seq(60, 4));
  CHECK(index.find_matches(shorter.tokens, shorter.names).empty());
  // A request through the anchor: its path places the chain.
  CHECK(index.graft_along(q.tokens, q.names) == 8);
  CHECK(index.orphan_count(A) == 0);
  CHECK(index.block_count(A) == 8);
  CHECK(match_of(index.find_matches(shorter.tokens), A) == 4);
  CHECK(match_of(index.find_matches(q.tokens), A) == 8);
  CHECK(index.counters().grafts == 1);
  CHECK(index.graft_along(q.tokens, q.names) == 0);  // nothing left to place
  CHECK(index.check_invariants());
  // A request whose names disagree with A's tree (a held name at another
  // position) grafts nothing: the graft is undone whole.
  REQUIRE(index.apply(A, stored(9, q, 8, 9)).view_reset);  // orphan 8 under block 7
  REQUIRE(index.apply(A, stored(10, q, 0, 3)).ok());       // blocks 0..2 in the tree
  Request bad = q;
  bad.tokens[1] = 4242;  // the same names over other tokens
  CHECK(index.graft_along(bad.tokens, bad.names) == 0);
  CHECK(index.orphan_count(A) == 1);
  CHECK(index.block_count(A) == 3);
  CHECK(index.check_invariants());
  CHECK(index.graft_along(q.tokens, q.names) == 6);  // 3..7 and the orphan
  CHECK(index.orphan_count(A) == 0);
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

namespace {

// A simulated engine rank: the names it caches (closed under prefixes, as a
// prefix cache is) and the universe's parent and tokens of every name.
struct Universe {
  std::map<std::uint64_t, std::uint64_t> parent;  // name -> parent name (0: root)
  std::map<std::uint64_t, std::uint64_t> tokens;  // name -> tokens hash
  std::uint64_t child(std::uint64_t p, std::uint64_t t) {
    const std::uint64_t n = chain_name(p, t);
    parent[n] = p;
    tokens[n] = t;
    return n;
  }
  std::size_t depth(std::uint64_t n) const {
    std::size_t d = 0;
    for (; n != 0; n = parent.at(n))
      ++d;
    return d;
  }
  bool is_ancestor(std::uint64_t a, std::uint64_t n) const {  // a strictly above n
    for (std::uint64_t x = parent.at(n); x != 0; x = parent.at(x))
      if (x == a) return true;
    return false;
  }
};

// What the index must know of one worker after a reset: K, the names the
// events it saw stored (and not removed since), and I, their ancestors
// (implied: a graft may place them).
struct Known {
  std::set<std::uint64_t> stored;
  std::set<std::uint64_t> implied;
};

// Names and parents of a worker's view, read from its dump.
struct View {
  std::set<std::uint64_t> names;
  std::set<std::uint64_t> parents;  // parent_hash of every dumped chain
};

View view_of(const KvIndex& index, const KvWorker& w) {
  View v;
  for (const KvEvent& e : index.dump(w)) {
    const auto& s = std::get<kv_event::Stored>(e.data);
    if (s.parent_hash) v.parents.insert(*s.parent_hash);
    for (const KvBlock& b : s.blocks)
      v.names.insert(b.block_hash);
  }
  return v;
}

}  // namespace

TEST_CASE("random resets, stores and removals against a model of held names",
          "[kv_index][late_join]") {
  std::mt19937_64 rng(20261203);
  const auto pick = [&](std::size_t n) {
    return static_cast<std::size_t>(std::uniform_int_distribution<std::size_t>(0, n - 1U)(rng));
  };
  Universe u;
  constexpr std::size_t workers = 3;
  const KvWorker ws[workers] = {{1, 0}, {2, 0}, {2, 1}};
  std::vector<std::set<std::uint64_t>> engine(workers);  // what each engine caches
  std::vector<Known> known(workers);
  std::vector<std::uint64_t> next_id(workers, 0);
  KvIndex index(late_join_options());
  std::size_t grafts_seen = 0;
  std::size_t orphans_seen = 0;
  for (int step = 0; step < 3000; ++step) {
    const std::size_t wi = pick(workers);
    std::set<std::uint64_t>& cached = engine[wi];
    Known& k = known[wi];
    const std::size_t action = pick(100);
    KvEventData data;
    std::vector<std::uint64_t> removed;
    if (action < 60) {  // serve a request: store the blocks not cached yet
      std::uint64_t at = 0;
      kv_event::Stored s;
      const std::size_t len = 1U + pick(6);
      for (std::size_t i = 0; i < len; ++i) {
        const std::uint64_t n = u.child(at, 1U + pick(4));
        if (s.blocks.empty() && cached.count(n) != 0U) {
          at = n;
          continue;
        }
        if (s.blocks.empty() && at != 0) s.parent_hash = at;
        s.blocks.push_back(KvBlock{n, u.tokens.at(n)});
        at = n;
      }
      if (s.blocks.empty()) continue;
      for (const KvBlock& b : s.blocks)
        cached.insert(b.block_hash);
      data = std::move(s);
    } else if (action < 92) {  // evict a block with everything below it, leaves first
      if (cached.empty()) continue;
      auto it = cached.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(pick(cached.size())));
      const std::uint64_t top = *it;
      std::vector<std::uint64_t> below;
      for (const std::uint64_t n : cached)
        if (u.is_ancestor(top, n)) below.push_back(n);
      // Deeper first.
      std::stable_sort(below.begin(), below.end(),
                       [&](std::uint64_t a, std::uint64_t b) { return u.depth(a) > u.depth(b); });
      below.push_back(top);
      if (pick(2) == 0U) std::reverse(below.begin(), below.end());  // cascades first
      for (const std::uint64_t n : below)
        cached.erase(n);
      removed = below;
      data = kv_event::Removed{below};
    } else if (action < 95) {
      cached.clear();
      data = kv_event::Cleared{};
    } else if (action < 97) {  // the index's own dump round-trips
      const View before = view_of(index, ws[wi]);
      if (next_id[wi] == 0) continue;
      REQUIRE(index.replace_worker(ws[wi], index.dump(ws[wi]), next_id[wi] - 1U).ok);
      // A replace may graft more, never lose anything.
      const View after = view_of(index, ws[wi]);
      REQUIRE(std::includes(after.names.begin(), after.names.end(), before.names.begin(),
                            before.names.end()));
      continue;
    } else {  // the next event of this worker is lost: the index resets
      ++next_id[wi];
      continue;
    }
    const std::uint64_t id = next_id[wi]++;
    const KvEventResult r = index.apply(ws[wi], KvEvent{id, data});
    REQUIRE(r.ok());
    if (r.view_reset) k = Known{};
    if (const auto* s = std::get_if<kv_event::Stored>(&data)) {
      for (const KvBlock& b : s->blocks) {
        k.stored.insert(b.block_hash);
        for (std::uint64_t x = u.parent.at(b.block_hash); x != 0; x = u.parent.at(x))
          k.implied.insert(x);
      }
      orphans_seen += r.blocks_orphaned;
      grafts_seen += r.blocks_grafted;
    } else if (std::holds_alternative<kv_event::Removed>(data)) {
      for (const std::uint64_t n : removed) {
        k.stored.erase(n);
        k.implied.erase(n);
      }
    } else {
      k = Known{};
    }
    REQUIRE(index.check_invariants());
    if (step % 64 == 0) {  // a copy holds the same view
      const KvIndex copy(index);
      REQUIRE(copy.check_invariants());
      REQUIRE(copy.total_orphans() == index.total_orphans());
    }
    // Every worker: K within the view, the view within K and I (and the
    // engine's cache), and matching by names exactly what the view implies.
    for (std::size_t v = 0; v < workers; ++v) {
      const View view = view_of(index, ws[v]);
      for (const std::uint64_t n : known[v].stored)
        REQUIRE(view.names.count(n) == 1U);
      for (const std::uint64_t n : view.names) {
        REQUIRE((known[v].stored.count(n) + known[v].implied.count(n)) != 0U);
        REQUIRE(engine[v].count(n) == 1U);
      }
      REQUIRE(index.block_count(ws[v]) + index.orphan_count(ws[v]) == view.names.size());
    }
    for (int q = 0; q < 4; ++q) {
      Request req;
      std::uint64_t at = 0;
      const std::size_t len = 1U + pick(8);
      for (std::size_t i = 0; i < len; ++i) {
        at = u.child(at, 1U + pick(4));
        req.names.push_back(at);
        req.tokens.push_back(u.tokens.at(at));
      }
      // A router may place orphan chains along the requests it sees.
      if (pick(2) == 0U) grafts_seen += index.graft_along(req.tokens, req.names);
      const auto ms = index.find_matches(req.tokens, req.names);
      const auto tree_only = index.find_matches(req.tokens);
      for (std::size_t v = 0; v < workers; ++v) {
        const View view = view_of(index, ws[v]);
        std::size_t expect = 0;
        for (std::size_t i = 0; i < len; ++i)
          if (view.names.count(req.names[i]) + view.parents.count(req.names[i]) != 0U)
            expect = i + 1U;
        REQUIRE(match_of(ms, ws[v]) == expect);
        REQUIRE(match_of(tree_only, ws[v]) <= expect);
        // At least what the events stored (and their parents) imply.
        std::size_t lower = 0;
        for (std::size_t i = 0; i < len; ++i)
          for (const std::uint64_t n : known[v].stored)
            if (n == req.names[i] || u.parent.at(n) == req.names[i]) lower = i + 1U;
        REQUIRE(expect >= lower);
      }
      for (const KvWorkerMatch& m : ms)
        REQUIRE(m.blocks >= 1U);
    }
  }
  CHECK(orphans_seen > 100);
  CHECK(grafts_seen > 100);
  for (const KvWorker& w : ws)
    index.remove_worker(w);
  CHECK(index.total_orphans() == 0);
  CHECK(index.node_count() == 0);
  CHECK(index.check_invariants());
}

namespace {

// Routes `requests` over two engines that have run for a while: the router's
// index sees their events only from request `join` on (the earlier ones are
// lost to it: it joined late). Returns the routed requests for which no
// worker matched a block (misses).
std::size_t late_join_misses(KvUnknownParent on_unknown_parent, std::size_t requests,
                             std::size_t join) {
  KvIndexOptions o;
  o.on_unknown_parent = on_unknown_parent;
  KvIndex index(o);
  constexpr std::size_t engines = 2;
  constexpr std::size_t prompts = 6;        // hot system prompts
  constexpr std::size_t prompt_blocks = 8;  // their length in blocks
  std::vector<std::set<std::uint64_t>> cached(engines);
  std::vector<std::uint64_t> next_id(engines, 0);
  std::mt19937_64 rng(7);
  std::size_t misses = 0;
  std::size_t rr = 0;
  for (std::size_t q = 0; q < requests; ++q) {
    // A hot prompt (skewed: the first ones are hotter) and a unique question.
    const std::size_t p = std::min<std::size_t>(
        prompts - 1U, static_cast<std::size_t>(std::geometric_distribution<int>(0.4)(rng)));
    Hashes tokens;
    for (std::size_t i = 0; i < prompt_blocks; ++i)
      tokens.push_back(1000U * (p + 1U) + i);
    for (std::size_t i = 0; i < 3; ++i)
      tokens.push_back(1'000'000U + q * 8U + i);
    const Request r = request(tokens);
    std::size_t target = 0;
    if (q >= join) {
      (void)index.graft_along(r.tokens, r.names);
      const auto ms = index.find_matches(r.tokens, r.names);
      std::size_t best = 0;
      for (const KvWorkerMatch& m : ms)
        if (m.blocks > best) {
          best = m.blocks;
          target = static_cast<std::size_t>(m.worker.worker_id);
        }
      if (best == 0) {
        ++misses;
        target = rr++ % engines;
      }
    } else {
      target = rr++ % engines;
    }
    // The engine computes what it does not cache and publishes one Stored.
    std::size_t from = 0;
    while (from < r.names.size() && cached[target].count(r.names[from]) != 0U)
      ++from;
    for (std::size_t i = from; i < r.names.size(); ++i)
      cached[target].insert(r.names[i]);
    const KvEvent e = stored(next_id[target]++, r, from, r.names.size());
    if (q >= join) (void)index.apply(KvWorker{target, 0}, e);
  }
  return misses;
}

}  // namespace

TEST_CASE("a late-joining router routes requests sharing hot prefixes as hits",
          "[kv_index][late_join]") {
  constexpr std::size_t requests = 1200;
  constexpr std::size_t join = 200;
  const std::size_t before = late_join_misses(KvUnknownParent::refuse, requests, join);
  const std::size_t after = late_join_misses(policy, requests, join);
  std::printf("late join: %zu of %zu requests routed as misses before orphan chains, %zu with\n",
              before, requests - join, after);
  CHECK(before > (requests - join) / 2U);
  CHECK(after * 20U < before);
}

TEST_CASE("block_hashes lists a worker's tree blocks and orphans, sorted",
          "[kv_index][late_join]") {
  KvIndex index(late_join_options());
  const Request q = request(seq(10, 8));
  CHECK(index.block_hashes(A).empty());  // unknown worker
  REQUIRE(index.apply(A, stored(0, q, 0, 3)).ok());
  REQUIRE(index.apply(B, stored(0, q, 0, 2)).ok());
  REQUIRE(index.apply(A, stored(2, q, 5, 8)).view_reset);  // orphans 5..7 under block 4
  Hashes want(q.names.begin() + 5, q.names.end());
  std::sort(want.begin(), want.end());
  CHECK(index.block_hashes(A) == want);
  REQUIRE(index.apply(A, stored(3, q, 0, 5)).ok());  // grafts them: all 8 in the tree
  want = q.names;
  std::sort(want.begin(), want.end());
  CHECK(index.block_hashes(A) == want);
  Hashes b(q.names.begin(), q.names.begin() + 2);
  std::sort(b.begin(), b.end());
  CHECK(index.block_hashes(B) == b);
  REQUIRE(index.remove_worker(A));
  CHECK(index.block_hashes(A).empty());
}
