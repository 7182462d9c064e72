// Fuzz harness for PromptCachePool (and SynchronizedPromptCachePool, which must
// behave identically on one thread). The input chooses the options (match mode,
// entry and byte budgets, default TTL, minimum lengths, keep-one-token), the
// token type (16-bit, or signed 8-bit so ids meet at both extremes) and then a
// sequence of inserts (fresh ids, extensions, truncations and divergences of
// earlier ids, in several namespaces, pinned or not, with per-entry TTLs and
// sizes, some near SIZE_MAX), lookups, clock advances (and clock settings back or near
// the end of its range), erases, pins, unpins, expiry, namespace drops
// and clears. After every operation each observable result, every counter and
// every stored entry is compared with the linear-scan model of
// tests/support/pool_model.hpp, and check_invariants() runs (after every operation
// while the pool is small).
#include <fuzzer/FuzzedDataProvider.h>
#include <promptcache/manual_clock.hpp>
#include <promptcache/prompt_cache_pool.hpp>
#include <promptcache/synchronized_prompt_cache_pool.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "fuzz_support.hpp"
#include "support/pool_model.hpp"

namespace {

using pool_model::Layer;
using pool_model::LayerBytes;
using pool_model::Model;
using pool_model::ns_t;
using promptcache::ManualClock;
using promptcache::MatchMode;
using ModelOptions = pool_model::Pool::Options;

fuzz::OperationReport report{"fuzz_prompt_cache_pool"};

// The shared comparisons abort on a divergence, naming the failed comparison.
constexpr auto check = [](bool ok, const char* what, const char* file, int line) {
  if (!ok) fuzz::fail(what, file, line);
};

template <class Tok, class P>
void run(FuzzedDataProvider& in, const ModelOptions& mo) {
  using Ids = std::vector<Tok>;
  ManualClock clock;
  P pool(pool_model::pool_options<P>(mo), clock);
  Model<Tok> model(mo);
  const int namespaces = in.ConsumeIntegralInRange<int>(1, 3);
  const std::uint32_t alphabet = in.ConsumeIntegralInRange<std::uint32_t>(2, 6);

  auto token = [&]() {
    return pool_model::palette<Tok>(in.ConsumeIntegralInRange<std::uint32_t>(0, alphabet));
  };
  auto fresh_ids = [&]() {
    Ids v(in.ConsumeIntegralInRange<std::size_t>(0, 12));
    for (auto& t : v)
      t = token();
    return v;
  };
  std::vector<Ids> seen{fresh_ids()};
  auto derived = [&]() {
    Ids v = seen[in.ConsumeIntegralInRange<std::size_t>(0, seen.size() - 1)];
    switch (in.ConsumeIntegralInRange<int>(0, 5)) {
      case 0:
      case 1:  // extend
        for (std::size_t k = in.ConsumeIntegralInRange<std::size_t>(1, 4); k > 0; --k)
          v.push_back(token());
        break;
      case 2:  // a long extension: edges compared in long blocks
        v.insert(v.end(), in.ConsumeIntegralInRange<std::size_t>(1, 1100), token());
        break;
      case 3:  // truncate
        v.resize(in.ConsumeIntegralInRange<std::size_t>(0, v.size()));
        break;
      case 4:  // diverge at one point
        if (!v.empty()) {
          Tok& t = v[in.ConsumeIntegralInRange<std::size_t>(0, v.size() - 1)];
          t = static_cast<Tok>(t ^ Tok{1});
        }
        break;
      default:
        break;
    }
    if (v.size() > 2400) v.resize(2400);
    return v;
  };
  auto pick_ids = [&]() {
    return in.ConsumeIntegralInRange<int>(0, 4) == 0 ? fresh_ids() : derived();
  };
  auto pick_ns = [&]() {
    return pool_model::namespace_id(
        in.ConsumeIntegralInRange<std::uint32_t>(0, static_cast<std::uint32_t>(namespaces - 1)));
  };
  auto pick_ttl = [&]() -> std::int64_t {
    const auto edge = pool_model::edge_ttl(in.ConsumeIntegralInRange<std::uint32_t>(0, 5));
    return edge ? *edge : in.ConsumeIntegralInRange<std::int64_t>(1, 120);
  };

  int tag = 0;
  std::uint64_t steps = 0;
  while (in.remaining_bytes() > 0) {
    ++fuzz::operations();
    const int op = in.ConsumeIntegralInRange<int>(0, 19);
    if (op < 8) {  // insert
      const Ids ids = pick_ids();
      typename P::InsertOptions o;
      o.pinned = in.ConsumeIntegralInRange<int>(0, 7) == 0;
      std::optional<std::int64_t> ttl;
      if (in.ConsumeBool()) ttl = pick_ttl();
      if (ttl) o.ttl = ManualClock::duration(*ttl);
      o.ns = pick_ns();
      constexpr std::size_t kMaxBytes = std::numeric_limits<std::size_t>::max();
      std::size_t bytes = 0;
      std::vector<Layer> caches{Layer{++tag, 0}};
      switch (in.ConsumeIntegralInRange<int>(0, 31)) {
        case 0:
          // An entry's size saturates at SIZE_MAX: two layers summing past it under a small
          // budget (rejected as too large; the model compares one layer per stored entry),
          // one layer of SIZE_MAX otherwise.
          bytes = kMaxBytes;
          if (mo.max_bytes != 0 && mo.max_bytes < kMaxBytes) {
            caches = {Layer{tag, bytes - 1}, Layer{tag, 2}};
          } else {
            caches[0].bytes = bytes;
          }
          break;
        case 1:
        case 2:
        case 3:  // near SIZE_MAX: a few such entries carry the byte sum past the gauge's range
          bytes = kMaxBytes - in.ConsumeIntegralInRange<std::size_t>(0, 2);
          caches[0].bytes = bytes;
          break;
        default:
          bytes = in.ConsumeIntegralInRange<std::size_t>(
              0, mo.max_bytes != 0 && mo.max_bytes < 1000 ? mo.max_bytes + 2 : 200);
          caches[0].bytes = bytes;
          break;
      }
      const auto got = pool.insert(ids, caches, o);
      const auto want = model.insert(ids, tag, o.pinned, ttl, o.ns, bytes);
      FUZZ_CHECK(static_cast<int>(got) == static_cast<int>(want));
      seen.push_back(ids);
      if (seen.size() > 48) seen.erase(seen.begin());
    } else if (op < 13) {  // lookup
      const Ids q = pick_ids();
      const ns_t ns = pick_ns();
      const auto got = pool.find_longest_prefix(q, ns);
      pool_model::compare_lookup(got, model.lookup(q, ns), q, check);
    } else if (op < 15) {  // time passes, or the clock is set back or near its end
      constexpr std::int64_t kEnd = std::numeric_limits<std::int64_t>::max();
      std::int64_t t = 0;
      switch (in.ConsumeIntegralInRange<int>(0, 15)) {
        case 0:  // near the end of the clock's range (the pool keeps it: time stays there)
          t = kEnd - in.ConsumeIntegralInRange<std::int64_t>(0, 130);
          break;
        case 1:
        case 2:  // back, possibly before the epoch
          t = model.now - in.ConsumeIntegralInRange<std::int64_t>(0, 200);
          break;
        default: {
          const std::int64_t dt = in.ConsumeIntegralInRange<std::int64_t>(0, 60);
          t = model.now > kEnd - dt ? kEnd : model.now + dt;
          break;
        }
      }
      clock.set(ManualClock::time_point(ManualClock::duration(t)));
      model.now = t;
    } else if (op == 15) {
      const Ids ids = derived();
      const ns_t ns = pick_ns();
      FUZZ_CHECK(pool.erase(ids, ns) == model.erase(ids, ns));
    } else if (op == 16) {
      FUZZ_CHECK(pool.evict_expired() == model.expire());
    } else if (op == 17) {
      const Ids ids = derived();
      const ns_t ns = pick_ns();
      const bool on = in.ConsumeBool();
      const bool got = on ? pool.pin(ids, ns) : pool.unpin(ids, ns);
      FUZZ_CHECK(got == model.pin(ids, ns, on));
    } else if (op == 18) {
      const ns_t ns = pick_ns();
      FUZZ_CHECK(pool.erase_namespace(ns) == model.erase_namespace(ns));
    } else {
      switch (in.ConsumeIntegralInRange<int>(0, 3)) {
        case 0: {
          pool.clear();
          for (int i = 0; i < namespaces; ++i)
            model.erase_namespace(pool_model::namespace_id(static_cast<std::uint32_t>(i)));
          break;
        }
        case 1:
          pool.reset_stats();
          model.stats = promptcache::PoolStats{};
          break;
        case 2: {  // memory accounting sees at least the stored ids
          const auto m = pool.memory_usage();
          std::size_t ids = 0;
          for (const auto& e : model.entries())
            ids = std::max(ids, e.ids.size());
          FUZZ_CHECK(m.id_bytes >= ids * sizeof(Tok));
          FUZZ_CHECK(m.index_bytes > 0);
          break;
        }
        default:  // the byte size of an entry, saturating
        {
          const std::size_t a = in.ConsumeIntegral<std::size_t>();
          const std::size_t b = in.ConsumeIntegral<std::size_t>();
          const std::size_t want = a > std::numeric_limits<std::size_t>::max() - b
                                       ? std::numeric_limits<std::size_t>::max()
                                       : a + b;
          FUZZ_CHECK(pool.entry_bytes({Layer{0, a}, Layer{0, b}}) == want);
          break;
        }
      }
    }
    pool_model::compare_state(pool, model, check);
    // check_invariants() (throws std::logic_error) walks every node and entry: after every
    // operation while the pool is small, every 8th beyond, and at the end of the input.
    if (pool.size() <= 8 || ++steps % 8 == 0) pool.check_invariants();
  }
  pool.check_invariants();
}

template <class Tok>
void run_token(FuzzedDataProvider& in, const ModelOptions& mo, bool synchronized_pool) {
  if (synchronized_pool) {
    run<Tok, promptcache::SynchronizedPromptCachePool<Layer, Tok, ManualClock, LayerBytes>>(in, mo);
  } else {
    run<Tok, pool_model::PoolT<Tok>>(in, mo);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  ModelOptions mo;
  mo.match = in.ConsumeBool() ? MatchMode::common_prefix : MatchMode::exact_prefix;
  mo.max_entries = in.ConsumeIntegralInRange<std::size_t>(0, 24);
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      mo.ttl = ManualClock::duration(0);
      break;
    case 1:
      mo.ttl = ManualClock::duration(std::numeric_limits<std::int64_t>::max());
      break;
    default:
      mo.ttl = ManualClock::duration(in.ConsumeIntegralInRange<std::int64_t>(1, 200));
      break;
  }
  mo.min_cacheable_tokens = in.ConsumeIntegralInRange<std::size_t>(0, 5);
  mo.keep_one_token = in.ConsumeBool();
  mo.min_match_tokens = in.ConsumeIntegralInRange<std::size_t>(0, 3);
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
    case 1:
      mo.max_bytes = 0;
      break;
    case 2:
      mo.max_bytes = std::numeric_limits<std::size_t>::max();
      break;
    default:
      mo.max_bytes = in.ConsumeIntegralInRange<std::size_t>(1, 200);
      break;
  }
  const bool synchronized_pool = in.ConsumeIntegralInRange<int>(0, 7) == 0;
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0)
    run_token<std::int8_t>(in, mo, synchronized_pool);
  else
    run_token<std::uint16_t>(in, mo, synchronized_pool);
  return 0;
}
