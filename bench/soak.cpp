// Soak of the two long-lived structures, with resident memory sampled along the way.
//
//   soak kv [events]   KvIndex fed by 64 simulated workers (default 10,000,000 events).
//   soak pool [ops]    PromptCachePool under constant insert / lookup / evict at its byte
//                      budget (default 4,000,000 operations).
//
// Each worker of the kv soak is an engine with an LRU block cache of its own: requests of
// skewed popularity store chains of blocks (named as Dynamo names them, so workers share
// tree nodes), evictions emit Removed events, and now and then a worker clears its cache,
// loses an event (the index reports the gap and the worker is resynced from a dump of its
// cache with replace_worker), is resynced without a gap, or leaves (remove_worker) and
// later rejoins as a new publisher. The pool soak runs conversations that grow turn by
// turn (lineage extension), new ones that replace finished ones, and a lookup before every
// insert, with real payloads so that the byte budget is real memory.
//
// Resident memory (/proc/self/statm) is sampled every 1% of the run. Pass: once warm
// (after the first 20% of the run) every sample is within 10% of the median of the warm
// samples (the steady state), and after every worker leaves (the pool is cleared) the
// resident memory is back at the level measured with the empty structure, within 10% of
// what the structure added at its steady state. The level is reported before and after
// malloc_trim(0), which separates memory the structure still holds from memory the
// allocator keeps cached for the process.
#include <promptcache/kv_index.hpp>
#include <promptcache/prompt_cache_pool.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include <unistd.h>

#include "bench_platform.hpp"

namespace {

using promptcache::KvBlock;
using promptcache::KvEvent;
using promptcache::KvEventStatus;
using promptcache::KvIndex;
using promptcache::KvWorker;
namespace kv_event = promptcache::kv_event;

double rss_mib() {
  long pages = 0, resident = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / 1048576.0;
}

// Samples and the pass/fail rule shared by both soaks.
struct Memory {
  double empty = 0;  // RSS with the empty structure
  std::vector<std::pair<std::uint64_t, double>> samples;
  std::vector<std::pair<std::uint64_t, std::size_t>> own;  // the structure's own accounting

  bool report(const char* what, std::uint64_t total, double after, double after_trim) const {
    std::vector<double> warm;
    for (const auto& [step, rss] : samples)
      if (step >= total / 5) warm.push_back(rss);
    std::vector<double> sorted = warm;
    std::sort(sorted.begin(), sorted.end());
    const double steady = sorted[sorted.size() / 2];
    const double lo = sorted.front(), hi = sorted.back();
    const bool stable = lo >= steady * 0.9 && hi <= steady * 1.1;
    const double added = steady - empty;
    const bool returned = after_trim - empty <= 0.1 * added;
    std::printf("%s: RSS samples (MiB) every %llu steps:\n", what,
                static_cast<unsigned long long>(total / 100));
    for (std::size_t i = 0; i < samples.size(); ++i) {
      std::printf(" %7.1f", samples[i].second);
      if (i % 10 == 9) std::printf("\n");
    }
    std::printf("\n%s: structure's own accounting (MiB) at 20%%, 50%%, 100%%:", what);
    for (const auto& [step, bytes] : own)
      std::printf(" %.1f", static_cast<double>(bytes) / 1048576.0);
    std::printf(
        "\n%s: empty %.1f MiB; steady (median once warm) %.1f MiB, warm range %.1f .. %.1f"
        " (%+.1f%% .. %+.1f%%) -> %s\n",
        what, empty, steady, lo, hi, (lo / steady - 1) * 100, (hi / steady - 1) * 100,
        stable ? "within 10%" : "NOT within 10%");
    std::printf(
        "%s: after emptying %.1f MiB, after malloc_trim(0) %.1f MiB (empty level %.1f, "
        "steady added %.1f) -> %s\n",
        what, after, after_trim, empty, added,
        returned ? "back to the empty level" : "NOT back to the empty level");
    return stable && returned;
  }
};

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "soak: %s diverged from the simulated engine\n", what);
  std::abort();
}

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// One simulated engine: an LRU cache of prompt families, each held as a chain of blocks
// from the root (depth = blocks held). Names are content-derived, as Dynamo's sequence
// hashes are, so every worker names a block the same way.
struct Engine {
  static constexpr std::size_t capacity = 2048;  // blocks
  std::list<std::uint32_t> lru;                  // families, most recent first
  std::unordered_map<std::uint32_t, std::pair<std::uint32_t, std::list<std::uint32_t>::iterator>>
      held;  // family -> (depth, position in lru)
  std::size_t blocks = 0;
  std::uint64_t next_id = 0;
  bool online = true;
  bool lost = false;  // an event was lost and no later event revealed the gap yet
  std::uint64_t offline_until = 0;

  static std::uint64_t name(std::uint32_t family, std::uint32_t depth) {
    return mix((std::uint64_t{family} << 20) | depth);
  }
  static std::uint64_t tokens(std::uint32_t family, std::uint32_t depth) {
    return mix(~((std::uint64_t{family} << 20) | depth));
  }
  void reset() {
    lru.clear();
    held.clear();
    blocks = 0;
  }
  std::vector<KvEvent> dump() const {
    std::vector<KvEvent> out;
    for (const auto& [family, h] : held) {
      kv_event::Stored s;
      for (std::uint32_t d = 0; d < h.first; ++d)
        s.blocks.push_back(KvBlock{name(family, d), tokens(family, d)});
      out.push_back(KvEvent{out.size(), std::move(s)});
    }
    return out;
  }
};

int soak_kv(std::uint64_t total) {
  constexpr std::size_t workers = 64;
  constexpr std::uint32_t families = 30000;
  std::mt19937_64 rng(12345);
  auto uniform = [&](std::uint64_t n) { return rng() % n; };
  auto skewed_family = [&]() {  // popular families are shared by many workers
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    return static_cast<std::uint32_t>(families * u * u * u);
  };

  Memory mem;
  KvIndex index;
  std::vector<Engine> engines(workers);
  mem.empty = rss_mib();
  std::uint64_t events = 0, gaps = 0, resyncs = 0, leaves = 0, clears = 0, removed_events = 0;
  std::uint64_t next_sample = 0;
  const auto start = std::chrono::steady_clock::now();

  // Delivers one event of worker w (or loses it), resyncing on a reported gap.
  auto deliver = [&](std::size_t w, Engine& e, KvEvent ev) {
    const KvWorker worker{w + 1, 0};
    ev.event_id = e.next_id++;
    // Lost in transit (never the first event: a consumer takes any first id as the start).
    if (ev.event_id != 0 && uniform(3000) == 0) {
      e.lost = true;
      return;
    }
    const auto r = index.apply(worker, ev);
    ++events;
    if (r.status == KvEventStatus::gap) {
      ++gaps;
      const auto res = index.replace_worker(worker, e.dump(), ev.event_id);
      if (!res.ok || res.blocks != e.blocks) fail("resync after a gap");
      e.lost = false;
    } else if (!r.ok()) {
      std::fprintf(stderr, "unexpected status %d\n", static_cast<int>(r.status));
      std::abort();
    }
    if (!e.lost && index.block_count(worker) != e.blocks) fail("block count");
  };

  while (events < total) {
    if (events >= next_sample) {
      mem.samples.emplace_back(events, rss_mib());
      if (mem.samples.size() == 21 || mem.samples.size() == 51)
        mem.own.emplace_back(events, index.approximate_memory_bytes());
      next_sample += total / 100;
    }
    const std::size_t w = uniform(workers);
    Engine& e = engines[w];
    const KvWorker worker{w + 1, 0};
    if (!e.online) {
      if (events < e.offline_until) continue;
      e.online = true;  // rejoins as a new publisher: ids start again at 0
      e.next_id = 0;
    }
    const std::uint64_t roll = uniform(100000);
    if (roll < 3) {  // leaves
      const bool known = index.contains(worker);
      if (index.remove_worker(worker) != known) fail("remove_worker");
      e.lost = false;
      e.reset();
      e.online = false;
      e.offline_until = events + 20000;
      ++leaves;
      continue;
    }
    if (roll < 6 && e.next_id > 0) {  // resynced from a dump without a gap (a router restart)
      const auto res = index.replace_worker(worker, e.dump(), e.next_id - 1);
      if (!res.ok || res.blocks != e.blocks) fail("resync without a gap");
      e.lost = false;
      ++resyncs;
      continue;
    }
    if (roll < 8) {  // drops its whole cache
      e.reset();
      deliver(w, e, KvEvent{0, kv_event::Cleared{}});
      ++clears;
      continue;
    }
    // A request: a family's prefix of 1..32 blocks; store what is missing.
    const std::uint32_t family = skewed_family();
    const auto want = static_cast<std::uint32_t>(1 + uniform(32));
    auto it = e.held.find(family);
    const std::uint32_t have = it == e.held.end() ? 0U : it->second.first;
    if (it != e.held.end()) e.lru.erase(it->second.second);
    e.lru.push_front(family);
    e.held[family] = {std::max(have, want), e.lru.begin()};
    if (want <= have) continue;  // a cache hit: no event
    kv_event::Stored s;
    if (have > 0) s.parent_hash = Engine::name(family, have - 1);
    for (std::uint32_t d = have; d < want; ++d)
      s.blocks.push_back(KvBlock{Engine::name(family, d), Engine::tokens(family, d)});
    e.blocks += want - have;
    deliver(w, e, KvEvent{0, std::move(s)});
    // Evict least recently used chains, tail first, until back under capacity.
    while (e.blocks > Engine::capacity) {
      const std::uint32_t victim = e.lru.back();
      auto& h = e.held[victim];
      const auto drop = static_cast<std::uint32_t>(
          std::min<std::size_t>(h.first, e.blocks - Engine::capacity + 8));
      kv_event::Removed r;
      for (std::uint32_t k = 0; k < drop; ++k)
        r.block_hashes.push_back(Engine::name(victim, h.first - 1 - k));
      h.first -= drop;
      e.blocks -= drop;
      if (h.first == 0) {
        e.lru.pop_back();
        e.held.erase(victim);
      }
      deliver(w, e, KvEvent{0, std::move(r)});
      ++removed_events;
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  mem.own.emplace_back(events, index.approximate_memory_bytes());
  for (std::size_t w = 0; w < workers; ++w)  // the index follows every worker's cache
    if (!engines[w].lost && index.contains(KvWorker{w + 1, 0}) &&
        index.block_count(KvWorker{w + 1, 0}) != engines[w].blocks)
      fail("final block counts");
  std::printf(
      "kv: %llu events in %.1f s (%llu removed events, %llu gaps resynced, %llu resyncs "
      "without a gap, %llu leaves, %llu clears); %zu workers, %zu nodes, %zu blocks, "
      "%.1f MiB by approximate_memory_bytes()\n",
      static_cast<unsigned long long>(events), secs,
      static_cast<unsigned long long>(removed_events), static_cast<unsigned long long>(gaps),
      static_cast<unsigned long long>(resyncs), static_cast<unsigned long long>(leaves),
      static_cast<unsigned long long>(clears), index.worker_count(), index.node_count(),
      index.total_blocks(), static_cast<double>(index.approximate_memory_bytes()) / 1048576.0);
  for (std::size_t w = 0; w < workers; ++w)
    index.remove_worker(w + 1);
  const double after = rss_mib();
  promptcache_bench::trim_heap();
  const double after_trim = rss_mib();
  std::printf(
      "kv: every worker left: %zu workers, %zu nodes, %zu blocks, %zu bytes by "
      "approximate_memory_bytes()\n",
      index.worker_count(), index.node_count(), index.total_blocks(),
      index.approximate_memory_bytes());
  const bool ok = index.node_count() == 0 && index.total_blocks() == 0 &&
                  mem.report("kv", total, after, after_trim);
  std::printf("kv: %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

struct Payload {
  std::vector<std::uint8_t> data;
};
struct PayloadBytes {
  std::size_t operator()(const Payload& p) const noexcept { return p.data.size(); }
};

int soak_pool(std::uint64_t total) {
  using Pool =
      promptcache::PromptCachePool<Payload, std::uint32_t, std::chrono::steady_clock, PayloadBytes>;
  constexpr std::size_t conversations = 4000;
  constexpr std::size_t bytes_per_token = 32;
  constexpr std::size_t layers = 4;
  Pool::Options o;
  o.max_entries = 1U << 20;  // the byte budget binds first
  o.max_bytes = std::size_t{128} << 20;
  o.ttl = std::chrono::hours(1);
  o.min_cacheable_tokens = 1;
  std::mt19937_64 rng(777);
  auto uniform = [&](std::uint64_t n) { return rng() % n; };

  Memory mem;
  std::vector<std::vector<std::uint32_t>> convs(conversations);
  std::uint32_t next_token = 1;
  const auto holder = std::make_unique<Pool>(o);  // pools do not move
  Pool& pool = *holder;
  mem.empty = rss_mib();
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t ops = 0, hits = 0, next_sample = 0;
  while (ops < total) {
    if (ops >= next_sample) {
      mem.samples.emplace_back(ops, rss_mib());
      if (mem.samples.size() == 21 || mem.samples.size() == 51)
        mem.own.emplace_back(
            ops, pool.bytes() + pool.memory_usage().index_bytes + pool.memory_usage().id_bytes);
      next_sample += total / 100;
    }
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    auto& conv = convs[static_cast<std::size_t>(conversations * u * u)];
    if (conv.size() > 3000 || conv.empty()) {  // a new conversation, some with a shared prompt
      conv.clear();
      const std::size_t shared = uniform(4) == 0 ? 0 : 64 * (1 + uniform(8));
      for (std::size_t i = 0; i < shared; ++i)
        conv.push_back(static_cast<std::uint32_t>(i));
      conv.push_back(1000000 + next_token++);
    }
    const std::size_t turn = 16 + uniform(200);
    for (std::size_t i = 0; i < turn; ++i)
      conv.push_back(static_cast<std::uint32_t>(uniform(50000)));
    if (pool.find_longest_prefix(conv)) ++hits;
    ++ops;
    std::vector<Payload> caches(layers);
    for (auto& c : caches)
      c.data.assign(conv.size() * bytes_per_token / layers, std::uint8_t{1});
    pool.insert(conv, std::move(caches));
    ++ops;
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto st = pool.stats();
  mem.own.emplace_back(
      ops, pool.bytes() + pool.memory_usage().index_bytes + pool.memory_usage().id_bytes);
  std::printf(
      "pool: %llu operations in %.1f s (%llu hits, %llu extended, %llu inserted, "
      "%llu evicted for bytes); %zu entries, %.1f MiB of payload (budget %.0f MiB)\n",
      static_cast<unsigned long long>(ops), secs, static_cast<unsigned long long>(hits),
      static_cast<unsigned long long>(st.extended), static_cast<unsigned long long>(st.inserted),
      static_cast<unsigned long long>(st.evicted_bytes), pool.size(),
      static_cast<double>(pool.bytes()) / 1048576.0, static_cast<double>(o.max_bytes) / 1048576.0);
  pool.clear();
  std::vector<std::vector<std::uint32_t>>().swap(convs);  // the driver's own token lists
  const double after = rss_mib();
  promptcache_bench::trim_heap();
  const double after_trim = rss_mib();
  const auto m = pool.memory_usage();
  std::printf("pool: cleared: %zu entries, index %zu bytes, ids %zu bytes\n", pool.size(),
              m.index_bytes, m.id_bytes);
  const bool ok = pool.empty() && mem.report("pool", total, after, after_trim);
  std::printf("pool: %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  const std::uint64_t n = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 0;
  if (what == "kv") return soak_kv(n != 0 ? n : 10000000);
  if (what == "pool") return soak_pool(n != 0 ? n : 4000000);
  std::fprintf(stderr, "usage: soak kv [events] | soak pool [operations]\n");
  return 2;
}
