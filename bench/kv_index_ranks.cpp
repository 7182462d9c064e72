// KvIndex at 64 to 4,096 worker ranks with the same number of live (worker,
// block) pairs in total: what one more rank costs in memory, block operation
// throughput and find_matches latency.
//
// Workload: every rank runs an LRU prefix cache of live / ranks blocks. A few
// system prompts (32 blocks each, skewed popularity) are held by nearly every
// rank; conversations grow by a turn (4 to 20 blocks) per request and are
// served by their own rank 90% of the time, by a random other rank (which then
// stores the whole history) otherwise, so most conversation blocks have one or
// two holders. A rank over its capacity evicts its least recently used
// conversations (leaves first), down to 97%. Block hashes are derived from
// (conversation, position), so the generator keeps no per-block state.
//
// Phases per rank count: fill (until the caches are full and evicting), then
// a steady phase of stores and evictions, timed in batches replayed from a
// buffer (generation is not timed); then 20,000 find_matches of 128-block
// queries (a live conversation's prefix and a fresh tail), each timed alone.
// Block operations are timed in thread CPU time; each query's latency is its
// best of three rounds (wall clock).
//
// Usage: kv_index_ranks [live_pairs [ranks...]]  (defaults 10000000 and
//   64 256 1024 4096). Prints one table row per rank count, and VmHWM.
#include <promptcache/kv_index.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <list>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using promptcache::KvBlock;

constexpr std::size_t kSystemPrompts = 8;
constexpr std::size_t kSystemBlocks = 32;
constexpr std::size_t kQueryBlocks = 128;
constexpr std::size_t kQueries = 20000;
constexpr std::size_t kMaxConversationBlocks = 160;
constexpr std::size_t kBatchOps = 1U << 18U;

std::uint64_t mix(std::uint64_t k) {
  k ^= k >> 33U;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33U;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33U;
  return k;
}

KvBlock system_block(std::size_t s, std::size_t i) {
  const std::uint64_t t = mix(0x5151000000000000ULL + (s << 16U) + i);
  return KvBlock{mix(t ^ 0xabcdefULL), t};
}
KvBlock conversation_block(std::uint64_t c, std::size_t i) {
  const std::uint64_t t = mix(0x2323000000000000ULL + (c << 16U) + i);
  return KvBlock{mix(t ^ 0xabcdefULL), t};
}

struct Event {
  std::uint32_t rank;
  std::uint64_t id;
  bool stored;
  std::optional<std::uint64_t> parent;
  std::size_t begin;
  std::size_t count;
};

struct Batch {
  std::vector<Event> events;
  std::vector<KvBlock> blocks;
  std::vector<std::uint64_t> names;
  std::size_t stored = 0;
  std::size_t removed = 0;
  void clear() {
    events.clear();
    blocks.clear();
    names.clear();
    stored = removed = 0;
  }
};

struct Conversation {
  std::uint64_t id = 0;
  std::uint32_t system = 0;
  std::uint32_t rank = 0;
  std::uint32_t length = 0;
  std::uint32_t turns = 0;
};

class Simulation {
 public:
  Simulation(std::uint32_t ranks, std::size_t capacity, std::uint64_t seed)
      : rng_(seed), ranks_(ranks), capacity_(capacity), state_(ranks) {
    for (auto& r : state_)
      r.has_system.assign(kSystemPrompts, false);
    active_.resize(std::max<std::size_t>(256, std::size_t{ranks} * 4U));
    for (auto& c : active_)
      c = fresh();
  }

  // Serves requests until `batch` has at least `ops` block operations.
  void run(Batch& batch, std::size_t ops) {
    while (batch.stored + batch.removed < ops)
      request(batch);
  }

  std::size_t evicting_ranks() const {
    return static_cast<std::size_t>(
        std::count_if(state_.begin(), state_.end(), [](const Rank& r) { return r.evicted; }));
  }

  // A 128-block query: an active conversation's prefix, then a fresh tail.
  std::vector<std::uint64_t> query() {
    const Conversation& c = active_[uniform(0, active_.size() - 1)];
    std::vector<std::uint64_t> q;
    for (std::size_t i = 0; i < kSystemBlocks; ++i)
      q.push_back(system_block(c.system, i).tokens_hash);
    std::size_t keep = c.length;
    if (uniform(0, 4) == 0) keep = uniform(0, keep);
    for (std::size_t i = 0; i < keep && q.size() < kQueryBlocks; ++i)
      q.push_back(conversation_block(c.id, i).tokens_hash);
    while (q.size() < kQueryBlocks)
      q.push_back(mix(rng_()));
    return q;
  }

 private:
  struct Held {
    std::uint32_t length;
    std::list<std::uint64_t>::iterator lru;
  };
  struct Rank {
    std::unordered_map<std::uint64_t, Held> convs;
    std::list<std::uint64_t> lru;  // most recent first
    std::vector<bool> has_system;
    std::unordered_map<std::uint64_t, std::uint32_t> system_of;
    std::size_t blocks = 0;
    std::uint64_t next_id = 0;
    bool evicted = false;
  };

  std::size_t uniform(std::size_t lo, std::size_t hi) {
    return std::uniform_int_distribution<std::size_t>(lo, hi)(rng_);
  }

  Conversation fresh() {
    Conversation c;
    c.id = next_conversation_++;
    // Skewed: system prompt 0 in about half the conversations.
    const std::size_t roll = uniform(0, 99);
    c.system = roll < 50 ? 0U : static_cast<std::uint32_t>(1U + roll % (kSystemPrompts - 1U));
    c.rank = static_cast<std::uint32_t>(uniform(0, ranks_ - 1U));
    return c;
  }

  void request(Batch& b) {
    Conversation& c = active_[uniform(0, active_.size() - 1)];
    c.length += static_cast<std::uint32_t>(uniform(2, 8) + uniform(2, 12));
    const std::uint32_t r =
        uniform(0, 99) < 90 ? c.rank : static_cast<std::uint32_t>(uniform(0, ranks_ - 1U));
    serve(r, c, b);
    if (++c.turns >= 8 || c.length > kMaxConversationBlocks - 20U) c = fresh();
  }

  void serve(std::uint32_t r, const Conversation& c, Batch& b) {
    Rank& rank = state_[r];
    std::uint32_t held = 0;
    auto it = rank.convs.find(c.id);
    if (it != rank.convs.end()) {
      held = it->second.length;
      rank.lru.erase(it->second.lru);
    }
    rank.lru.push_front(c.id);
    if (held < c.length) {
      Event e{r, rank.next_id++, true, std::nullopt, b.blocks.size(), 0};
      if (held > 0) {
        e.parent = conversation_block(c.id, held - 1U).block_hash;
      } else if (rank.has_system[c.system]) {
        e.parent = system_block(c.system, kSystemBlocks - 1U).block_hash;
      } else {
        for (std::size_t i = 0; i < kSystemBlocks; ++i)
          b.blocks.push_back(system_block(c.system, i));
        rank.has_system[c.system] = true;
        rank.blocks += kSystemBlocks;
      }
      for (std::uint32_t i = held; i < c.length; ++i)
        b.blocks.push_back(conversation_block(c.id, i));
      rank.blocks += c.length - held;
      e.count = b.blocks.size() - e.begin;
      b.stored += e.count;
      b.events.push_back(e);
    }
    rank.convs[c.id] = Held{c.length, rank.lru.begin()};
    if (rank.blocks > capacity_) evict(r, b);
  }

  // Evicts whole least recently used conversations, leaves first; the system
  // prompts stay (every conversation of the rank starts with one).
  void evict(std::uint32_t r, Batch& b) {
    Rank& rank = state_[r];
    rank.evicted = true;
    Event e{r, rank.next_id++, false, std::nullopt, b.names.size(), 0};
    while (rank.blocks > capacity_ * 97U / 100U && rank.lru.size() > 1U) {
      const std::uint64_t victim = rank.lru.back();
      rank.lru.pop_back();
      const auto it = rank.convs.find(victim);
      for (std::uint32_t i = it->second.length; i-- > 0U;)
        b.names.push_back(conversation_block(victim, i).block_hash);
      rank.blocks -= it->second.length;
      rank.convs.erase(it);
    }
    e.count = b.names.size() - e.begin;
    b.removed += e.count;
    b.events.push_back(e);
  }

  std::mt19937_64 rng_;
  std::uint32_t ranks_;
  std::size_t capacity_;
  std::vector<Rank> state_;
  std::vector<Conversation> active_;
  std::uint64_t next_conversation_ = 1;
};

// CPU seconds of this thread: on a shared machine, unlike wall time, they do
// not count the time other processes had the core.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Applies the batch; returns the CPU seconds it took. Events that do not apply
// are counted in `failed`.
[[gnu::noinline]] double replay(const Batch& b, promptcache::KvIndex& index, std::size_t& failed) {
  const double t0 = cpu_seconds();
  for (const Event& e : b.events) {
    const promptcache::KvWorker w{e.rank, 0};
    const auto r =
        e.stored ? index.store(w, e.id, e.parent, std::span(b.blocks).subspan(e.begin, e.count))
                 : index.remove(w, e.id, std::span(b.names).subspan(e.begin, e.count));
    failed += r.ok() ? 0U : 1U;
  }
  return cpu_seconds() - t0;
}

std::size_t status_kib(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::strtoull(line.c_str() + std::strlen(key), nullptr, 10);
  return 0;
}

struct Row {
  std::uint32_t ranks;
  std::size_t pairs, nodes;
  double bytes_per_pair, rss_per_pair;
  double fill_ops, steady_ops;
  double p50, p99, mean_matches;
  std::size_t failed;
};

Row measure(std::uint32_t ranks, std::size_t live) {
  Row row{};
  row.ranks = ranks;
  const std::size_t rss0 = status_kib("VmRSS:");
  Simulation sim(ranks, live / ranks, 20261201U + ranks);
  Batch batch;
  std::size_t ops = 0;
  double seconds = 0;
  {
    promptcache::KvIndex index;
    // Fill: until every rank has evicted once.
    while (sim.evicting_ranks() < ranks) {
      batch.clear();
      sim.run(batch, kBatchOps);
      seconds += replay(batch, index, row.failed);
      ops += batch.stored + batch.removed;
    }
    row.fill_ops = static_cast<double>(ops) / seconds;
    // Steady state: half the live pairs again in stores and evictions.
    ops = 0;
    seconds = 0;
    while (ops < live / 2U) {
      batch.clear();
      sim.run(batch, kBatchOps);
      seconds += replay(batch, index, row.failed);
      ops += batch.stored + batch.removed;
    }
    row.steady_ops = static_cast<double>(ops) / seconds;
    batch = Batch{};
    row.pairs = index.total_blocks();
    row.nodes = index.node_count();
    row.bytes_per_pair =
        static_cast<double>(index.approximate_memory_bytes()) / static_cast<double>(row.pairs);
    row.rss_per_pair =
        static_cast<double>(status_kib("VmRSS:") - rss0) * 1024.0 / static_cast<double>(row.pairs);

    std::vector<std::vector<std::uint64_t>> queries;
    for (std::size_t q = 0; q < kQueries; ++q)
      queries.push_back(sim.query());
    std::vector<promptcache::KvWorkerMatch> out;
    std::size_t matched = 0;
    for (std::size_t q = 0; q < 2000; ++q)
      index.find_matches(queries[q], false, out);
    // Each query's time is its best of three rounds, so that a preemption
    // (the machine may be shared) does not pass for a slow query.
    std::vector<double> ns(kQueries, 1e300);
    for (int round = 0; round < 3; ++round)
      for (std::size_t q = 0; q < kQueries; ++q) {
        const auto t0 = Clock::now();
        index.find_matches(queries[q], false, out);
        ns[q] =
            std::min(ns[q], std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
        if (round == 0) matched += out.size();
      }
    std::sort(ns.begin(), ns.end());
    row.p50 = ns[ns.size() / 2] / 1000.0;
    row.p99 = ns[ns.size() * 99 / 100] / 1000.0;
    row.mean_matches = static_cast<double>(matched) / static_cast<double>(kQueries);
  }
  return row;
}

// A whole positive decimal number no larger than `max`, or nothing. Digits only: strtoull
// would also take leading blanks and a sign (" -5" as 2^64 - 5), and saturates on overflow.
std::optional<std::uint64_t> positive(const char* text, std::uint64_t max) {
  if (text[0] < '0' || text[0] > '9') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (*end != '\0' || errno == ERANGE || v == 0 || v > max) return std::nullopt;
  return static_cast<std::uint64_t>(v);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t live = 10000000U;
  std::vector<std::uint32_t> ranks;
  for (int i = 1; i < argc; ++i) {
    const auto v = positive(argv[i], i == 1 ? SIZE_MAX : UINT32_MAX);
    if (!v) {
      std::fprintf(stderr, "usage: kv_index_ranks [live_pairs [ranks...]] (positive numbers)\n");
      return 2;
    }
    if (i == 1)
      live = static_cast<std::size_t>(*v);
    else
      ranks.push_back(static_cast<std::uint32_t>(*v));
  }
  if (ranks.empty()) ranks = {64, 256, 1024, 4096};
  std::printf("%zu live (worker, block) pairs in total; 128-block queries\n\n", live);
  std::printf("%6s %10s %10s %9s %9s %9s %9s %8s %8s %9s %6s\n", "ranks", "pairs", "nodes",
              "B/pair", "RSS/pair", "fill M/s", "steady M/s", "p50 us", "p99 us", "matches",
              "fail");
  bool ok = true;
  for (const std::uint32_t r : ranks) {
    const Row x = measure(r, live);
    std::printf("%6u %10zu %10zu %9.1f %9.1f %9.2f %9.2f %8.2f %8.2f %9.1f %6zu\n", x.ranks,
                x.pairs, x.nodes, x.bytes_per_pair, x.rss_per_pair, x.fill_ops / 1e6,
                x.steady_ops / 1e6, x.p50, x.p99, x.mean_matches, x.failed);
    std::fflush(stdout);
    ok = ok && x.failed == 0;
  }
  std::printf("\npeak RSS (VmHWM): %.1f MiB\n", static_cast<double>(status_kib("VmHWM:")) / 1024.0);
  return ok ? 0 : 1;
}
