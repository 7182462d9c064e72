// KvIndex against the naive per-worker hash-set index on one generated KV
// event workload: 64 workers, block size 16, a few shared system
// prompts, multi-turn conversations mostly sticky to one worker, divergent
// tails, and per-worker LRU caches that evict (leaves first) as they fill.
//
// Reports, for both indexes in the same run: block operations per second
// (stored + removed blocks while replaying the whole event stream) and
// find_matches latency p50 / p99 for 128-block queries, plus the ratios.
//
// With --trace, the workload is a replay of a Mooncake-format trace instead
// (by default the shipped synthetic trace of the Mooncake FAST'25 release):
// one KV block per hash id (512 tokens; only full blocks are cached, as
// engines do), each request routed to the worker already holding the longest
// prefix of it (ties and misses to the worker that served fewest requests),
// each worker an LRU block cache emitting Stored / Removed events; the
// queries are the trace's own prompts.
//
// Usage: kv_index_vs_naive [--replay-only] [--trace[=path]] [--trace-capacity=N]
//                          [requests [runs]]
//   (defaults 60000 and 5: about 6 s; with --trace, requests is ignored, runs
//   defaults to 25 and N, the blocks each worker caches, to 512).
//   --replay-only times just the KvIndex replay (no naive index, no queries):
//   for profilers, e.g.
//   valgrind --tool=callgrind --toggle-collect='*replay_index*'
//            kv_index_vs_naive --replay-only 20000 1
#include <promptcache/block_hash.hpp>
#include <promptcache/kv_index.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <queue>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "bench_platform.hpp"
#include "naive_kv_index.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using promptcache::KvBlock;

constexpr std::uint32_t kWorkers = 64;
constexpr std::size_t kBlockSize = 16;
constexpr std::size_t kQueryBlocks = 128;
constexpr std::size_t kCacheBlocks = 3000;  // per worker
constexpr std::size_t kSystemPrompts = 4;
constexpr std::size_t kActiveConversations = 1500;
constexpr std::size_t kQueries = 20000;
constexpr std::size_t kTraceBlockSize = 512;  // tokens per Mooncake hash id

std::mt19937_64 rng(20261129);

std::size_t uniform(std::size_t lo, std::size_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<std::size_t>(lo, hi)(rng);
}

// Local block hashes of `blocks` blocks of fresh random tokens.
std::vector<std::uint64_t> random_blocks(std::size_t blocks) {
  std::vector<std::uint32_t> tokens(blocks * kBlockSize);
  for (auto& t : tokens)
    t = static_cast<std::uint32_t>(uniform(0, 150000));
  return promptcache::local_block_hashes(tokens, kBlockSize);
}

// One replayable event: a Stored run or a Removed list of one worker.
struct Event {
  std::uint32_t worker;
  std::uint64_t id;
  bool stored;
  std::optional<std::uint64_t> parent;
  std::size_t begin;  // into stored_blocks or removed_names
  std::size_t count;
};

struct Workload {
  std::vector<Event> events;
  std::vector<KvBlock> stored_blocks;
  std::vector<std::uint64_t> removed_names;
  std::size_t block_ops = 0;
  std::vector<std::vector<std::uint64_t>> query_locals;  // 128 blocks each (generated)
  std::vector<std::vector<std::uint64_t>> query_seqs;
  std::size_t requests = 0;
  std::size_t short_requests = 0;  // trace requests without a full block
};

// A worker's prefix cache as the engine sees it: blocks by sequence hash, LRU
// eviction of leaf blocks (a block is evicted only after its children).
class SimWorker {
 public:
  SimWorker(std::uint32_t id, Workload& out, std::size_t capacity)
      : id_(id), out_(out), capacity_(capacity) {}

  // Leading blocks of `seqs` this worker caches.
  [[nodiscard]] std::size_t cached_prefix(const std::vector<std::uint64_t>& seqs) const {
    std::size_t k = 0;
    while (k < seqs.size() && blocks_.count(seqs[k]) != 0U)
      ++k;
    return k;
  }

  void serve(const std::vector<std::uint64_t>& locals, const std::vector<std::uint64_t>& seqs,
             std::uint64_t now) {
    std::size_t k = 0;
    while (k < seqs.size() && blocks_.count(seqs[k]) != 0U)
      blocks_[seqs[k++]].last_used = now;
    if (k < seqs.size()) {
      Event e{id_, next_id_++, true, std::nullopt, out_.stored_blocks.size(), seqs.size() - k};
      if (k > 0) {
        e.parent = seqs[k - 1];
        ++blocks_[seqs[k - 1]].children;
      }
      for (std::size_t i = k; i < seqs.size(); ++i) {
        out_.stored_blocks.push_back(KvBlock{seqs[i], locals[i]});
        blocks_[seqs[i]] =
            Block{i > 0 ? seqs[i - 1] : 0, i > 0, i + 1 < seqs.size() ? 1U : 0U, now};
      }
      out_.events.push_back(e);
      out_.block_ops += e.count;
    }
    if (!seqs.empty()) leaves_.push({now, seqs.back()});
    evict();
  }

 private:
  struct Block {
    std::uint64_t parent;
    bool has_parent;
    std::uint32_t children;
    std::uint64_t last_used;
  };

  void evict() {
    if (blocks_.size() <= capacity_) return;
    Event e{id_, next_id_++, false, std::nullopt, out_.removed_names.size(), 0};
    // Evict down to 90% so removals come in batches, as engines do.
    while (blocks_.size() > capacity_ * 9 / 10 && !leaves_.empty()) {
      const auto [t, s] = leaves_.top();
      leaves_.pop();
      const auto it = blocks_.find(s);
      if (it == blocks_.end() || it->second.children != 0U || it->second.last_used != t) continue;
      const Block b = it->second;
      blocks_.erase(it);
      out_.removed_names.push_back(s);
      ++e.count;
      if (b.has_parent) {
        Block& p = blocks_.at(b.parent);
        if (--p.children == 0U) leaves_.push({p.last_used, b.parent});
      }
    }
    out_.events.push_back(e);
    out_.block_ops += e.count;
  }

  std::uint32_t id_;
  Workload& out_;
  std::size_t capacity_;
  std::uint64_t next_id_ = 0;
  std::unordered_map<std::uint64_t, Block> blocks_;
  using Leaf = std::pair<std::uint64_t, std::uint64_t>;  // (last used, sequence hash)
  std::priority_queue<Leaf, std::vector<Leaf>, std::greater<>> leaves_;
};

struct Conversation {
  std::vector<std::uint64_t> locals;
  std::uint32_t worker = 0;
  std::size_t turns = 0;
};

Workload generate(std::size_t requests) {
  Workload w;
  std::vector<std::vector<std::uint64_t>> systems;
  for (std::size_t s = 0; s < kSystemPrompts; ++s)
    systems.push_back(random_blocks(uniform(16, 48)));
  auto fresh = [&] {
    Conversation c;
    // Skewed: the first system prompt is the most popular.
    const std::size_t s = std::min<std::size_t>(uniform(0, 9) / 3, kSystemPrompts - 1);
    c.locals = systems[s];
    c.worker = static_cast<std::uint32_t>(uniform(0, kWorkers - 1));
    return c;
  };
  std::vector<Conversation> convs(kActiveConversations);
  for (auto& c : convs)
    c = fresh();
  std::vector<SimWorker> workers;
  for (std::uint32_t i = 0; i < kWorkers; ++i)
    workers.emplace_back(i, w, kCacheBlocks);

  w.requests = requests;
  for (std::uint64_t now = 1; now <= requests; ++now) {
    Conversation& c = convs[uniform(0, convs.size() - 1)];
    // The request: history + user message; the response is cached too.
    const auto user = random_blocks(uniform(2, 8));
    const auto reply = random_blocks(uniform(2, 12));
    c.locals.insert(c.locals.end(), user.begin(), user.end());
    c.locals.insert(c.locals.end(), reply.begin(), reply.end());
    const std::uint32_t worker =
        uniform(0, 99) < 85 ? c.worker : static_cast<std::uint32_t>(uniform(0, kWorkers - 1));
    workers[worker].serve(c.locals, promptcache::sequence_hashes(c.locals), now);
    if (++c.turns >= 8 || c.locals.size() > 160) c = fresh();
  }

  // 128-block queries: a live conversation's history, then a new divergent tail.
  for (std::size_t q = 0; q < kQueries; ++q) {
    std::vector<std::uint64_t> locals = convs[uniform(0, convs.size() - 1)].locals;
    if (q % 5 == 0) locals.resize(uniform(1, locals.size()));  // diverges earlier
    const auto tail = random_blocks(kQueryBlocks);
    locals.resize(kQueryBlocks < locals.size() ? kQueryBlocks : locals.size());
    locals.insert(locals.end(), tail.begin(),
                  tail.begin() + static_cast<std::ptrdiff_t>(kQueryBlocks - locals.size()));
    w.query_seqs.push_back(promptcache::sequence_hashes(locals));
    w.query_locals.push_back(std::move(locals));
  }
  return w;
}

// The number after `"key":` in a JSON line, or nullopt.
std::optional<std::uint64_t> json_number(std::string_view line, std::string_view key) {
  const std::size_t at = line.find(key);
  if (at == std::string_view::npos) return std::nullopt;
  std::size_t i = line.find(':', at + key.size());
  if (i == std::string_view::npos) return std::nullopt;
  while (++i < line.size() && line[i] == ' ') {
  }
  if (i == line.size() || line[i] < '0' || line[i] > '9') return std::nullopt;
  return std::strtoull(line.data() + i, nullptr, 10);
}

// One trace request: its input length and hash ids (empty on a bad line).
struct TraceRequest {
  std::uint64_t input_length = 0;
  std::vector<std::uint64_t> hash_ids;
};

// Reads the fields this benchmark needs from a Mooncake-format JSONL line
// ("input_length", "hash_ids"); the tools/replay reader needs a JSON library.
std::optional<TraceRequest> parse_trace_line(const std::string& line) {
  TraceRequest r;
  const auto len = json_number(line, "\"input_length\"");
  const std::size_t key = line.find("\"hash_ids\"");
  if (!len || key == std::string::npos) return std::nullopt;
  r.input_length = *len;
  std::size_t i = line.find('[', key);
  const std::size_t end = line.find(']', key);
  if (i == std::string::npos || end == std::string::npos || end < i) return std::nullopt;
  for (++i; i < end;) {
    if (line[i] >= '0' && line[i] <= '9') {
      char* next = nullptr;
      r.hash_ids.push_back(std::strtoull(line.c_str() + i, &next, 10));
      i = static_cast<std::size_t>(next - line.c_str());
    } else if (line[i] == ',' || line[i] == ' ') {
      ++i;
    } else {
      return std::nullopt;
    }
  }
  return r;
}

// The Mooncake replay: 64 LRU workers of `capacity` blocks, cache-aware
// routing, the trace's prompts as queries. Throws on an unreadable trace.
Workload from_trace(const std::string& path, std::size_t capacity) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open trace " + path);
  Workload w;
  std::vector<SimWorker> workers;
  for (std::uint32_t i = 0; i < kWorkers; ++i)
    workers.emplace_back(i, w, capacity);
  std::vector<std::size_t> served(kWorkers, 0);
  // Block i of hash id h holds the pseudo-tokens h * 512 + j (as tools/replay
  // expands them), so equal ids give equal local hashes.
  std::unordered_map<std::uint64_t, std::uint64_t> local_of_id;
  std::vector<std::uint32_t> tokens(kTraceBlockSize);
  std::string line;
  std::size_t lines = 0, bad = 0;
  std::uint64_t now = 0;
  while (std::getline(in, line)) {
    ++lines;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto r = parse_trace_line(line);
    if (!r) {
      ++bad;
      continue;
    }
    const std::size_t full =
        std::min<std::size_t>(r->hash_ids.size(), r->input_length / kTraceBlockSize);
    if (full == 0U) {  // no full block: nothing to cache or match
      ++w.short_requests;
      continue;
    }
    std::vector<std::uint64_t> locals;
    for (std::size_t b = 0; b < full; ++b) {
      const std::uint64_t id = r->hash_ids[b];
      auto it = local_of_id.find(id);
      if (it == local_of_id.end()) {
        for (std::size_t j = 0; j < kTraceBlockSize; ++j)
          tokens[j] = static_cast<std::uint32_t>(id * kTraceBlockSize + j);
        it = local_of_id.emplace(id, promptcache::local_block_hashes(tokens, kTraceBlockSize)[0])
                 .first;
      }
      locals.push_back(it->second);
    }
    std::vector<std::uint64_t> seqs = promptcache::sequence_hashes(locals);
    std::uint32_t best = 0;
    std::size_t best_match = 0;
    for (std::uint32_t k = 0; k < kWorkers; ++k) {
      const std::size_t m = workers[k].cached_prefix(seqs);
      if (m > best_match || (m == best_match && served[k] < served[best])) {
        best = k;
        best_match = m;
      }
    }
    ++served[best];
    workers[best].serve(locals, seqs, ++now);
    w.query_locals.push_back(std::move(locals));
    w.query_seqs.push_back(std::move(seqs));
  }
  w.requests = static_cast<std::size_t>(now);
  if (bad != 0U)
    std::fprintf(stderr, "trace %s: %zu of %zu lines not usable, skipped\n", path.c_str(), bad,
                 lines);
  if (w.query_locals.empty()) throw std::runtime_error("no usable request in trace " + path);
  return w;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Latency {
  double p50_us, p99_us, mean_us;
};

Latency summarize(std::vector<double>& ns) {
  std::sort(ns.begin(), ns.end());
  double sum = 0;
  for (const double x : ns)
    sum += x;
  return {ns[ns.size() / 2] / 1000.0, ns[ns.size() * 99 / 100] / 1000.0,
          sum / static_cast<double>(ns.size()) / 1000.0};
}

// Replays the whole event stream into `index`; returns the events not applied.
// Not inlined, so a profiler can collect exactly this (see the usage line).
[[gnu::noinline]] std::size_t replay_index(const Workload& w, promptcache::KvIndex& index) {
  std::size_t not_applied = 0;
  for (const Event& e : w.events) {
    const promptcache::KvWorker worker{e.worker, 0};
    const auto r =
        e.stored ? index.store(worker, e.id, e.parent,
                               std::span(w.stored_blocks).subspan(e.begin, e.count))
                 : index.remove(worker, e.id, std::span(w.removed_names).subspan(e.begin, e.count));
    not_applied += r.ok() ? 0U : 1U;
  }
  return not_applied;
}

template <class F>
Latency time_queries(std::size_t n, F&& query) {
  std::vector<double> ns;
  ns.reserve(n);
  for (std::size_t q = 0; q < n; ++q) {
    const auto t0 = Clock::now();
    query(q);
    ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
  }
  return summarize(ns);
}

}  // namespace

int main(int argc, char** argv) {
  bool replay_only = false;
  std::optional<std::string> trace;
  std::size_t trace_capacity = 512;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--replay-only") {
      replay_only = true;
    } else if (a == "--trace") {
      trace = PROMPTCACHE_MOONCAKE_TRACE;
    } else if (a.rfind("--trace=", 0) == 0) {
      trace = a.substr(8);
    } else if (a.rfind("--trace-capacity=", 0) == 0) {
      trace_capacity = std::strtoull(a.c_str() + 17, nullptr, 10);
    } else if (a == "--help" || a == "-h" || a.rfind("--", 0) == 0) {
      std::printf(
          "usage: kv_index_vs_naive [--replay-only] [--trace[=path]] [--trace-capacity=N] "
          "[requests [runs]]\n"
          "  generated workload (default): requests 60000, runs 5\n"
          "  --trace: replay a Mooncake JSONL trace (default %s) over 64 LRU workers of N "
          "blocks (default 512); runs default 25\n",
          PROMPTCACHE_MOONCAKE_TRACE);
      return a == "--help" || a == "-h" ? 0 : 2;
    } else {
      positional.push_back(a);
    }
  }
  if (trace && trace_capacity == 0U) {
    std::fprintf(stderr, "--trace-capacity must be at least 1\n");
    return 2;
  }
  const std::size_t requests =
      !positional.empty() ? std::strtoull(positional[0].c_str(), nullptr, 10) : 60000;
  auto t0 = Clock::now();
  Workload built;
  try {
    built = trace ? from_trace(*trace, trace_capacity) : generate(requests);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  const Workload& w = built;
  if (trace)
    std::printf(
        "workload: Mooncake trace %s, %zu requests with a full block (%zu shorter ones skipped), "
        "%u workers of %zu blocks, block size %zu, %zu events, %zu block ops (built in %.2f s)\n",
        trace->c_str(), w.requests, w.short_requests, kWorkers, trace_capacity, kTraceBlockSize,
        w.events.size(), w.block_ops, seconds_since(t0));
  else
    std::printf(
        "workload: %zu requests, %u workers, block size %zu, %zu events, %zu block ops "
        "(generated in %.2f s)\n",
        requests, kWorkers, kBlockSize, w.events.size(), w.block_ops, seconds_since(t0));

  // Replay the event stream into fresh indexes, alternating between the two,
  // runs times each; the median run counts (the machine is shared).
  const int runs =
      positional.size() > 1 ? std::max(1, std::atoi(positional[1].c_str())) : (trace ? 25 : 5);
  if (replay_only) {
    std::vector<double> times;
    std::size_t failed = 0;
    for (int run = 0; run < runs; ++run) {
      promptcache::KvIndex fresh;
      t0 = Clock::now();
      failed += replay_index(w, fresh);
      times.push_back(seconds_since(t0));
    }
    std::printf(
        "replay only: %zu block ops, median %.2f M ops/s, best %.2f M ops/s, %zu events "
        "not applied\n",
        w.block_ops, static_cast<double>(w.block_ops) / median(times) / 1e6,
        static_cast<double>(w.block_ops) / *std::min_element(times.begin(), times.end()) / 1e6,
        failed);
    return failed == 0 ? 0 : 1;
  }
  // index_faults: minor page faults of each run (0 where getrusage is missing). A replay
  // into a fresh index touches fresh memory as its tables and pools grow; on a VM each
  // first touch is a costly fault, and how many there are depends on whether the
  // allocator hands back memory freed by the previous run, so the count is printed
  // beside the throughput.
  std::vector<double> index_runs, naive_runs, store_runs, remove_runs, index_faults;
  std::size_t not_applied = 0;
  std::size_t stored_ops = 0, removed_ops = 0;
  promptcache::KvIndex index;
  bench::NaiveKvIndex naive(kWorkers);
  for (int run = 0; run < runs; ++run) {
    promptcache::KvIndex fresh;
    const std::uint64_t faults0 = promptcache_bench::minor_faults();
    t0 = Clock::now();
    not_applied += replay_index(w, fresh);
    index_runs.push_back(seconds_since(t0));
    index_faults.push_back(static_cast<double>(promptcache_bench::minor_faults() - faults0));
    if (run == runs - 1) index = std::move(fresh);

    bench::NaiveKvIndex baseline(kWorkers);
    t0 = Clock::now();
    for (const Event& e : w.events) {
      if (e.stored)
        baseline.store(e.worker, e.parent, std::span(w.stored_blocks).subspan(e.begin, e.count));
      else
        baseline.remove(e.worker, std::span(w.removed_names).subspan(e.begin, e.count));
    }
    naive_runs.push_back(seconds_since(t0));
    if (run == runs - 1) naive = std::move(baseline);

    // Once more, timing stores and removals apart.
    promptcache::KvIndex split;
    double store_s = 0, remove_s = 0;
    stored_ops = removed_ops = 0;
    for (const Event& e : w.events) {
      const promptcache::KvWorker worker{e.worker, 0};
      const auto t = Clock::now();
      if (e.stored) {
        (void)split.store(worker, e.id, e.parent,
                          std::span(w.stored_blocks).subspan(e.begin, e.count));
        store_s += seconds_since(t);
        stored_ops += e.count;
      } else {
        (void)split.remove(worker, e.id, std::span(w.removed_names).subspan(e.begin, e.count));
        remove_s += seconds_since(t);
        removed_ops += e.count;
      }
    }
    store_runs.push_back(store_s);
    remove_runs.push_back(remove_s);
  }
  const double index_s = median(index_runs);
  const double naive_s = median(naive_runs);
  const double store_s = median(store_runs);
  const double remove_s = median(remove_runs);
  const double best_index_ops =
      static_cast<double>(w.block_ops) / *std::min_element(index_runs.begin(), index_runs.end());
  const double index_ops = static_cast<double>(w.block_ops) / index_s;
  const double naive_ops = static_cast<double>(w.block_ops) / naive_s;

  // Both must agree on every query before their speed means anything.
  std::size_t mismatches = 0;
  std::size_t total_matched = 0;
  std::vector<promptcache::KvWorkerMatch> got;
  std::vector<std::pair<std::uint32_t, std::size_t>> want;
  for (std::size_t q = 0; q < w.query_locals.size(); ++q) {
    index.find_matches(w.query_locals[q], false, got);
    naive.find_matches(w.query_seqs[q], want);
    std::vector<std::pair<std::uint32_t, std::size_t>> mine;
    for (const auto& m : got)
      mine.emplace_back(static_cast<std::uint32_t>(m.worker.worker_id), m.blocks);
    std::sort(mine.begin(), mine.end());
    mismatches += mine == want ? 0U : 1U;
    total_matched += got.size();
  }

  // Warm up, then time each query alone. The trace has fewer prompts than
  // the generated query set, so they are timed over several passes.
  const std::size_t nq = w.query_locals.size();
  const std::size_t samples = trace ? std::max<std::size_t>(nq, kQueries) : nq;
  for (std::size_t q = 0; q < std::min<std::size_t>(2000, nq); ++q)
    index.find_matches(w.query_locals[q], false, got);
  const Latency lat = time_queries(
      samples, [&](std::size_t q) { index.find_matches(w.query_locals[q % nq], false, got); });
  const Latency lat_early = time_queries(
      samples, [&](std::size_t q) { index.find_matches(w.query_locals[q % nq], true, got); });
  const Latency lat_naive =
      time_queries(samples, [&](std::size_t q) { naive.find_matches(w.query_seqs[q % nq], want); });
  std::size_t query_blocks = 0;
  for (const auto& q : w.query_locals)
    query_blocks += q.size();

  const double pairs = static_cast<double>(index.total_blocks());
  std::printf(
      "state: %zu (worker, block) pairs, %zu tree nodes, %.1f MiB (approx, %.1f B/pair), "
      "%.1f workers matched per query, %zu events not applied, %zu query mismatches\n",
      index.total_blocks(), index.node_count(),
      static_cast<double>(index.approximate_memory_bytes()) / (1024.0 * 1024.0),
      pairs > 0 ? static_cast<double>(index.approximate_memory_bytes()) / pairs : 0.0,
      static_cast<double>(total_matched) / static_cast<double>(nq), not_applied, mismatches);
  // The generated queries are 128 blocks each; the trace's prompts vary.
  char what[64];
  if (trace)
    std::snprintf(what, sizeof what, "find_matches, prompts (avg %.0f blocks)",
                  static_cast<double>(query_blocks) / static_cast<double>(nq));
  else
    std::snprintf(what, sizeof what, "find_matches 128 blocks");
  const auto row = [](const std::string& name, double a, double b) {
    std::printf("%-44s %12.2f %12.2f %9.1fx\n", name.c_str(), a, b, b / a);
  };
  std::printf("\n%-44s %12s %12s %10s\n", "metric", "KvIndex", "naive", "ratio");
  std::printf("%-44s %12.2f %12.2f %9.1fx\n", "block ops/s, store+remove, median (M)",
              index_ops / 1e6, naive_ops / 1e6, index_ops / naive_ops);
  std::printf("%-44s %12.2f %12s\n", "  best of runs (M)", best_index_ops / 1e6, "-");
  std::printf("%-44s %12.0f %12s\n", "  page faults per replay, median", median(index_faults), "-");
  std::printf("%-44s %12.2f %12s\n", "  stored blocks/s (M)",
              static_cast<double>(stored_ops) / store_s / 1e6, "-");
  std::printf("%-44s %12.2f %12s\n", "  removed blocks/s (M)",
              static_cast<double>(removed_ops) / remove_s / 1e6, "-");
  row(std::string(what) + " p50 (us)", lat.p50_us, lat_naive.p50_us);
  row(std::string(what) + " p99 (us)", lat.p99_us, lat_naive.p99_us);
  row(std::string(what) + " mean (us)", lat.mean_us, lat_naive.mean_us);
  std::printf("%-44s %12.2f %12s\n", "  with early_exit p50 (us)", lat_early.p50_us, "-");
  std::printf("%-44s %12.2f %12s\n", "  with early_exit p99 (us)", lat_early.p99_us, "-");

  const bool ok = mismatches == 0 && not_applied == 0;
  std::printf(
      "\ntargets: >= 20 M block ops/s: %s; p99 < 2 us: %s; >= 10x naive (p50 and p99): %s\n",
      index_ops >= 20e6 ? "met" : "MISSED", lat.p99_us < 2.0 ? "met" : "MISSED",
      (lat_naive.p50_us / lat.p50_us >= 10.0 && lat_naive.p99_us / lat.p99_us >= 10.0) ? "met"
                                                                                       : "MISSED");
  return ok ? 0 : 1;
}
