// Randomized differential test of PromptCachePool against the linear-scan reference model
// of support/pool_model.hpp (obviously correct, O(entries x length)). Long
// random sequences of inserts (lineages sharing random prefixes, some pinned), lookups,
// time advances, erases, pins and namespace drops must give identical observable results
// after every step, in exact-prefix and common-prefix mode, with and without budgets.
#include <promptcache/manual_clock.hpp>
#include <promptcache/prompt_cache_pool.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "catch.hpp"
#include "support/pool_model.hpp"

namespace {

using namespace pool_model;  // NOLINT: the model and its pool types
using promptcache::ManualClock;
using promptcache::MatchMode;

// Catch2's REQUIRE for the shared comparisons, with the failed comparison's text. A step
// makes a hundred or more comparisons: the message is built only for one that fails
// (Catch2 formats an INFO when it is declared, which took most of the run under ASan).
constexpr auto require = [](bool ok, const char* what, const char* file, int line) {
  if (ok) return;
  INFO(file << ":" << line << ": " << what);
  REQUIRE(ok);
};

struct Config {
  const char* name;
  Pool::Options options;
  int namespaces;
  bool per_entry_ttl;
  bool sized;
  std::uint32_t alphabet = 3;     // token values drawn from the first `alphabet` of palette()
  std::uint32_t pinned_pct = 10;  // share of inserts that pin
  std::size_t max_layer_bytes = 40;
  std::uint32_t max_len = 10;    // length of fresh random ids
  std::uint32_t max_extend = 4;  // tokens an extension appends
  std::size_t cap = 24;          // longest ids inserted
  // Share of steps forced to be lookups. Lookup-heavy runs pile up the heap sifts a hit defers
  // (stale children) before the next insert or removal has to settle them.
  std::uint32_t extra_lookup_pct = 0;
  int invariants_every = 16;  // steps between check_invariants() calls
  // The clock is sometimes set back, and in the second half of a run near the end of its range
  // (the pool keeps its latest reading, so time then stays there).
  bool wild_clock = false;
  // Some entries are sized near SIZE_MAX, so the byte sum carries past the gauge's range.
  bool huge_sizes = false;
};

template <class Tok = std::uint16_t>
void run(const Config& cfg, std::uint32_t seed, int steps) {
  using Ids = std::vector<Tok>;
  using P = PoolT<Tok>;
  INFO("config " << cfg.name << " seed " << seed);
  ManualClock clock;
  P pool(pool_options<P>(cfg.options), clock);
  Model<Tok> model(cfg.options);
  std::mt19937 rng(seed);
  auto rnd = [&](std::uint32_t n) { return static_cast<std::uint32_t>(rng() % n); };
  auto token = [&]() { return palette<Tok>(rnd(cfg.alphabet)); };
  auto random_ids = [&](std::size_t max_len) {
    Ids v(rnd(static_cast<std::uint32_t>(max_len)) + 1);
    for (auto& t : v)
      t = rnd(4) == 0 ? std::numeric_limits<Tok>::max() : token();
    return v;
  };
  // Queries and inserts mostly grow from what was seen, so lineages share prefixes.
  std::vector<Ids> seen{random_ids(6)};
  auto derived = [&]() {
    Ids v = seen[rnd(static_cast<std::uint32_t>(seen.size()))];
    switch (rnd(4)) {
      case 0:  // extend
        for (std::uint32_t k = rnd(cfg.max_extend) + 1; k > 0; --k)
          v.push_back(token());
        break;
      case 1:  // truncate
        v.resize(rnd(static_cast<std::uint32_t>(v.size()) + 1));
        break;
      case 2:  // diverge at a random point
        if (!v.empty()) {
          Tok& t = v[rnd(static_cast<std::uint32_t>(v.size()))];
          t = static_cast<Tok>(t ^ Tok{1});
        }
        break;
      default:
        break;
    }
    return v;
  };
  auto pick_ns = [&]() { return namespace_id(rnd(static_cast<std::uint32_t>(cfg.namespaces))); };
  // Per-entry TTLs: the usual ones and those at the edges.
  auto pick_ttl = [&]() -> std::int64_t {
    const auto edge = edge_ttl(rnd(6));
    return edge ? *edge : static_cast<std::int64_t>(rnd(3)) * 40;
  };
  int tag = 0;
  for (int step = 0; step < steps; ++step) {
    CAPTURE(step);
    std::uint32_t op = rnd(100);
    if (cfg.extra_lookup_pct != 0 && rnd(100) < cfg.extra_lookup_pct) op = 60;  // a lookup
    if (op < 45) {
      Ids ids = rnd(5) == 0 ? random_ids(cfg.max_len) : derived();
      if (ids.size() > cfg.cap) ids.resize(cfg.cap);
      const bool pinned = rnd(100) < cfg.pinned_pct;
      std::optional<std::int64_t> ttl;
      if (cfg.per_entry_ttl && rnd(3) == 0) ttl = pick_ttl();
      const ns_t ns = pick_ns();
      std::size_t bytes = cfg.sized ? rnd(static_cast<std::uint32_t>(cfg.max_layer_bytes) + 1) : 0;
      if (cfg.huge_sizes && rnd(4) == 0) bytes = std::numeric_limits<std::size_t>::max() - rnd(3);
      ++tag;
      typename P::InsertOptions o;
      o.pinned = pinned;
      if (ttl) o.ttl = ManualClock::duration(*ttl);
      o.ns = ns;
      const auto got = pool.insert(ids, {Layer{tag, bytes}}, o);
      const R want = model.insert(ids, tag, pinned, ttl, ns, bytes);
      REQUIRE(static_cast<int>(got) == static_cast<int>(want));
      seen.push_back(ids);
      if (seen.size() > 64) seen.erase(seen.begin());
    } else if (op < 80) {
      const Ids q = derived();
      const ns_t ns = pick_ns();
      const auto got = pool.find_longest_prefix(q, ns);
      compare_lookup(got, model.lookup(q, ns), q, require);
    } else if (op < 88) {
      constexpr std::int64_t kEnd = std::numeric_limits<std::int64_t>::max();
      const std::uint32_t how = cfg.wild_clock ? rnd(16) : 15;
      std::int64_t t = 0;
      if (how == 0 && 2 * step > steps) {
        t = kEnd - rnd(100);  // near the end of the clock's range
      } else if (how < 3) {
        t = model.now - rnd(200);  // back
      } else {
        const std::int64_t dt = rnd(30);
        t = model.now > kEnd - dt ? kEnd : model.now + dt;
      }
      clock.set(ManualClock::time_point(ManualClock::duration(t)));
      model.now = t;
    } else if (op < 91) {
      const Ids ids = derived();
      const ns_t ns = pick_ns();
      REQUIRE(pool.erase(ids, ns) == model.erase(ids, ns));
    } else if (op < 93) {
      REQUIRE(pool.evict_expired() == model.expire());
    } else if (op < 98) {
      const Ids ids = derived();
      const ns_t ns = pick_ns();
      const bool on = rnd(2) == 0;
      const bool got = on ? pool.pin(ids, ns) : pool.unpin(ids, ns);
      REQUIRE(got == model.pin(ids, ns, on));
    } else if (op < 99 || cfg.namespaces == 1) {
      if (rnd(20) == 0) {
        pool.clear();
        for (int i = 0; i < cfg.namespaces; ++i)
          model.erase_namespace(namespace_id(static_cast<std::uint32_t>(i)));
      }
    } else {
      const ns_t ns = pick_ns();
      REQUIRE(pool.erase_namespace(ns) == model.erase_namespace(ns));
    }
    compare_state(pool, model, require);
    if (step % cfg.invariants_every == 0) pool.check_invariants();
  }
  pool.check_invariants();
}

Pool::Options opts(std::size_t max_entries, std::int64_t ttl, std::size_t min_tokens) {
  Pool::Options o;
  o.max_entries = max_entries;
  o.ttl = ManualClock::duration(ttl);
  o.min_cacheable_tokens = min_tokens;
  return o;
}

}  // namespace

TEST_CASE("differential: exact-prefix pool matches the linear-scan model") {
  const Config cfg{"exact", opts(8, 60, 3), 1, false, false};
  for (std::uint32_t seed = 1; seed <= 6; ++seed)
    run(cfg, seed, 4000);
}

TEST_CASE("differential: exact-prefix pool with a large capacity and no TTL pressure") {
  const Config cfg{"exact-large", opts(40, 1000000, 0), 1, false, false};
  for (std::uint32_t seed = 11; seed <= 13; ++seed)
    run(cfg, seed, 4000);
}

TEST_CASE("differential: wide fan-out (child tables grow and shrink)") {
  Pool::Options o = opts(300, 400, 0);
  const Config cfg{"exact-wide", o, 1, false, false, 200};
  for (std::uint32_t seed = 51; seed <= 52; ++seed)
    run(cfg, seed, 3000);
  o.match = MatchMode::common_prefix;
  const Config common{"common-wide", o, 2, true, false, 200};
  for (std::uint32_t seed = 53; seed <= 54; ++seed)
    run(common, seed, 3000);
}

TEST_CASE("differential: namespaces, per-entry TTLs, keep-one-token, min match, byte budget") {
  Pool::Options o = opts(10, 60, 2);
  o.keep_one_token = true;
  o.min_match_tokens = 2;
  o.max_bytes = 120;
  const Config cfg{"exact-everything", o, 3, true, true};
  for (std::uint32_t seed = 21; seed <= 25; ++seed)
    run(cfg, seed, 4000);
}

TEST_CASE("differential: common-prefix mode") {
  Pool::Options o = opts(8, 60, 2);
  o.match = MatchMode::common_prefix;
  const Config cfg{"common", o, 1, false, false};
  for (std::uint32_t seed = 31; seed <= 35; ++seed)
    run(cfg, seed, 4000);
}

TEST_CASE("differential: common-prefix mode, lookup-heavy (deferred heap sifts)", "[long]") {
  // A hit leaves its ancestors' heap items stale until the next change to that heap; a removal
  // that makes a stale child's best worse once left a heap out of order (found in review: a
  // longer entry won over a shorter one sharing as much). Many lookups between changes, wide
  // and narrow fan-out, invariants after every step.
  for (const std::uint32_t extra : {50U, 85U}) {
    Pool::Options narrow = opts(60, 100000, 0);
    narrow.match = MatchMode::common_prefix;
    Config a{"common-lookups", narrow, 1, false, false, 4, 50};
    a.extra_lookup_pct = extra;
    a.invariants_every = 1;
    Pool::Options wide = opts(1000, 100000, 0);
    wide.match = MatchMode::common_prefix;
    Config b{"common-lookups-wide", wide, 1, false, false, 200, 5};
    b.max_len = 3;
    b.extra_lookup_pct = extra;
    b.invariants_every = 1;
    for (std::uint32_t seed = 1; seed <= 6; ++seed) {
      run(a, seed, 2000);
      run(b, seed, 2000);
    }
  }
}

TEST_CASE("differential: common-prefix mode with every option") {
  Pool::Options o = opts(12, 60, 1);
  o.match = MatchMode::common_prefix;
  o.keep_one_token = true;
  o.min_match_tokens = 2;
  o.max_bytes = 150;
  const Config cfg{"common-everything", o, 3, true, true};
  for (std::uint32_t seed = 41; seed <= 45; ++seed)
    run(cfg, seed, 4000);
}

TEST_CASE("differential: signed 8-bit tokens at both extremes, exact and common-prefix") {
  Pool::Options o = opts(10, 60, 2);
  const Config exact{"int8-exact", o, 2, true, false, 6};
  for (std::uint32_t seed = 61; seed <= 62; ++seed)
    run<std::int8_t>(exact, seed, 3000);
  o.match = MatchMode::common_prefix;
  o.keep_one_token = true;
  const Config common{"int8-common", o, 2, true, false, 6};
  for (std::uint32_t seed = 63; seed <= 64; ++seed)
    run<std::int8_t>(common, seed, 3000);
}

TEST_CASE("differential: signed 32-bit and 64-bit tokens at both extremes") {
  Pool::Options o = opts(12, 60, 1);
  o.match = MatchMode::common_prefix;
  const Config common{"int32-common", o, 1, false, false, 5};
  run<std::int32_t>(common, 71, 3000);
  o.match = MatchMode::exact_prefix;
  const Config exact{"int64-exact", o, 1, false, false, 5};
  run<std::int64_t>(exact, 72, 3000);
}

TEST_CASE("differential: tiny max_entries (0, 1, 2)") {
  for (std::size_t max_entries : {std::size_t{0}, std::size_t{1}, std::size_t{2}}) {
    Pool::Options o = opts(max_entries, 60, 0);
    const Config exact{"tiny-exact", o, 2, true, false};
    run(exact, 80 + static_cast<std::uint32_t>(max_entries), 2000);
    o.match = MatchMode::common_prefix;
    const Config common{"tiny-common", o, 2, true, false};
    run(common, 90 + static_cast<std::uint32_t>(max_entries), 2000);
  }
}

TEST_CASE("differential: everything (or almost everything) pinned") {
  for (std::uint32_t pct : {100U, 70U}) {
    Pool::Options o = opts(4, 30, 1);
    o.max_bytes = 60;
    const Config exact{"pinned-exact", o, 2, true, true, 3, pct};
    run(exact, 100 + pct, 2000);
    o.match = MatchMode::common_prefix;
    const Config common{"pinned-common", o, 2, true, true, 3, pct};
    run(common, 200 + pct, 2000);
  }
}

TEST_CASE("differential: zero TTL, with and without per-entry TTLs") {
  Pool::Options o = opts(8, 0, 1);
  const Config exact{"ttl0-exact", o, 1, true, false};
  run(exact, 301, 2000);
  o.match = MatchMode::common_prefix;
  const Config common{"ttl0-common", o, 2, false, false};
  run(common, 302, 2000);
}

TEST_CASE("differential: a tight byte budget (entries close to max_bytes)") {
  Pool::Options o = opts(50, 200, 1);
  o.max_bytes = 3;
  const Config exact{"tight-bytes-exact", o, 2, true, true, 3, 10, 4};
  run(exact, 401, 2500);
  o.match = MatchMode::common_prefix;
  const Config common{"tight-bytes-common", o, 2, true, true, 3, 10, 4};
  run(common, 402, 2500);
}

TEST_CASE("differential: the clock set back and near the end of its range") {
  Pool::Options o = opts(10, 60, 1);
  Config exact{"wild-clock-exact", o, 2, true, false};
  exact.wild_clock = true;
  run(exact, 601, 2000);
  o.match = MatchMode::common_prefix;
  Config common{"wild-clock-common", o, 2, true, false};
  common.wild_clock = true;
  run(common, 602, 2000);
}

TEST_CASE("differential: sizes near SIZE_MAX with no byte budget and with a budget of SIZE_MAX") {
  for (const std::size_t max_bytes : {std::size_t{0}, std::numeric_limits<std::size_t>::max()}) {
    Pool::Options o = opts(10, 60, 1);
    o.max_bytes = max_bytes;
    Config exact{"huge-sizes-exact", o, 2, true, true, 3, 20};
    exact.huge_sizes = true;
    run(exact, 701 + (max_bytes == 0 ? 0U : 10U), 1500);
    o.match = MatchMode::common_prefix;
    Config common{"huge-sizes-common", o, 2, true, true, 3, 20};
    common.huge_sizes = true;
    run(common, 702 + (max_bytes == 0 ? 0U : 10U), 1500);
  }
}

TEST_CASE("differential: long ids (edges compared in 1024-, 128- and 8-token blocks)") {
  Pool::Options o = opts(10, 400, 4);
  Config exact{"long-exact", o, 1, true, false, 2};
  exact.max_len = 700;
  exact.max_extend = 1300;
  exact.cap = 4000;
  run(exact, 501, 3000);
  o.match = MatchMode::common_prefix;
  o.keep_one_token = true;
  Config common = exact;
  common.name = "long-common";
  common.options = o;
  run(common, 502, 3000);
}
