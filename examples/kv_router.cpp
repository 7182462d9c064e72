// A KV-aware router in miniature: three workers publish KV events, the router
// feeds them into a KvIndex and routes each request with KvRouter, weighing
// the prefix each worker already holds against the decode load it carries (as
// Dynamo's default selector does), notices a lost event, and resyncs that
// worker from a dump with replace_worker.
//
// Blocks are named the way Dynamo's engines name them: the tree is keyed by
// the local block hashes of block_hash.hpp, and each worker's own block names
// are the chained sequence hashes.
#include <promptcache/block_hash.hpp>
#include <promptcache/kv_index.hpp>
#include <promptcache/kv_router.hpp>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace pc = promptcache;

constexpr std::size_t kBlockSize = 16;
// A request decodes while this many later requests are routed, then finishes.
constexpr std::size_t kInFlightFor = 3;

// The engine side: which blocks a worker caches, and the events it publishes.
class Worker {
 public:
  explicit Worker(std::uint64_t id) : id_{id, 0} {}
  [[nodiscard]] const pc::KvWorker& id() const { return id_; }

  // Runs a prompt; returns the Stored event for the blocks it had to compute.
  std::optional<pc::KvEvent> serve(const std::vector<std::uint64_t>& locals) {
    const std::vector<std::uint64_t> names = pc::sequence_hashes(locals);
    std::size_t cached = 0;
    while (cached < names.size() && holds(names[cached]))
      ++cached;
    if (cached == names.size()) return std::nullopt;
    pc::kv_event::Stored stored;
    if (cached > 0) stored.parent_hash = names[cached - 1];
    for (std::size_t i = cached; i < names.size(); ++i) {
      stored.blocks.push_back(pc::KvBlock{names[i], locals[i]});
      blocks_.push_back({i > 0 ? std::optional(names[i - 1]) : std::nullopt, names[i], locals[i]});
    }
    return pc::KvEvent{next_id_++, std::move(stored)};
  }

  // Its whole cache as events, parents first, and the id of its last event.
  [[nodiscard]] std::vector<pc::KvEvent> dump() const {
    std::vector<pc::KvEvent> events;
    for (const Block& b : blocks_)
      events.push_back({events.size(), pc::kv_event::Stored{b.parent, {{b.name, b.local}}}});
    return events;
  }
  [[nodiscard]] std::uint64_t last_event_id() const { return next_id_ - 1; }
  [[nodiscard]] std::size_t cached_blocks() const { return blocks_.size(); }

 private:
  struct Block {
    std::optional<std::uint64_t> parent;
    std::uint64_t name;
    std::uint64_t local;
  };
  [[nodiscard]] bool holds(std::uint64_t name) const {
    for (const Block& b : blocks_)
      if (b.name == name) return true;
    return false;
  }
  pc::KvWorker id_;
  std::uint64_t next_id_ = 0;
  std::vector<Block> blocks_;
};

// Tokens of a prompt made of named parts: each part is a few blocks of tokens
// derived from its name, so equal parts give equal blocks.
std::vector<std::uint64_t> prompt(const std::vector<std::string>& parts) {
  std::vector<std::uint32_t> tokens;
  for (const std::string& part : parts)
    for (std::size_t i = 0; i < 3 * kBlockSize; ++i)
      tokens.push_back(static_cast<std::uint32_t>(std::hash<std::string>{}(part) % 50000U + i));
  return pc::local_block_hashes(tokens, kBlockSize);
}

int main() {
  std::vector<Worker> workers{Worker{10}, Worker{11}, Worker{12}};
  pc::KvIndex router;
  bool drop_next_event_of_12 = false;

  // Requests in flight: the worker and the names of the blocks (chained
  // hashes) each one holds until it finishes.
  struct InFlight {
    std::size_t worker;
    std::set<std::uint64_t> blocks;
    std::size_t finishes_at;
  };
  std::vector<InFlight> in_flight;
  std::size_t step = 0;
  const pc::KvRouter kv_router(
      pc::KvRouterConfig{/*overlap_weight*/ 1.0, /*temperature*/ 0.0, kBlockSize});

  // The router asks the index for each worker's cached prefix, builds each
  // worker's load the way docs/kv_router.md describes (distinct blocks of the
  // requests in flight on it plus the request's blocks not among them;
  // prefills finish at once here, so no prefill tokens are queued), lets
  // KvRouter pick, and the chosen worker runs the prompt; its event travels
  // back to the router.
  auto route = [&](const char* what, const std::vector<std::uint64_t>& locals) {
    ++step;
    std::erase_if(in_flight, [&](const InFlight& r) { return r.finishes_at <= step; });
    const std::vector<std::uint64_t> names = pc::sequence_hashes(locals);
    std::vector<pc::KvWorkerLoad> loads;
    for (std::size_t i = 0; i < workers.size(); ++i) {
      std::set<std::uint64_t> busy;
      for (const InFlight& r : in_flight)
        if (r.worker == i) busy.insert(r.blocks.begin(), r.blocks.end());
      std::size_t decode = busy.size();
      for (const std::uint64_t name : names)
        decode += busy.count(name) == 0 ? 1U : 0U;
      loads.push_back({workers[i].id(), decode, router.block_count(workers[i].id()), 0});
    }
    const std::size_t request_tokens = locals.size() * kBlockSize;
    const std::vector<pc::KvWorkerMatch> matches = router.find_matches(locals);
    const pc::KvRouteDecision d = *kv_router.select(request_tokens, matches, loads);
    const std::size_t best = d.index;  // loads lists the workers in order
    std::printf("%-31s %6zu  ", what, locals.size());
    for (const pc::KvRouteCandidate& c : kv_router.candidates(request_tokens, matches, loads))
      std::printf("  %2zu/%2.0f/%2.0f", c.matched_blocks, c.decode_blocks, c.cost);
    std::printf("  -> worker %llu\n", static_cast<unsigned long long>(d.chosen.worker.worker_id));
    in_flight.push_back({best, {names.begin(), names.end()}, step + kInFlightFor});
    const std::optional<pc::KvEvent> event = workers[best].serve(locals);
    if (!event) return;
    if (workers[best].id().worker_id == 12 && drop_next_event_of_12) {
      drop_next_event_of_12 = false;
      std::printf("  (event %llu of worker 12 is lost on the way)\n",
                  static_cast<unsigned long long>(event->event_id));
      return;
    }
    const pc::KvEventResult r = router.apply(workers[best].id(), *event);
    if (const auto gap = r.gap()) {
      std::printf("  gap on worker %llu: expected event %llu, got %llu; asking for a dump\n",
                  static_cast<unsigned long long>(workers[best].id().worker_id),
                  static_cast<unsigned long long>(gap->expected),
                  static_cast<unsigned long long>(gap->got));
      const pc::KvReplaceResult res = router.replace_worker(
          workers[best].id(), workers[best].dump(), workers[best].last_event_id());
      std::printf("  replace_worker: %s, worker now holds %zu blocks\n", res.ok ? "ok" : "failed",
                  res.blocks);
    }
  };

  std::printf("cost = blocks to prefill + load (distinct blocks in flight, this request added)\n");
  std::printf("%-31s %6s  %s\n", "request", "blocks", "cached/load/cost on workers 10, 11, 12");
  route("system A + chat 1", prompt({"system A", "chat 1"}));
  route("system B + chat 2", prompt({"system B", "chat 2"}));
  route("system C + chat 3", prompt({"system C", "chat 3"}));
  route("system A + chat 1 + turn 2", prompt({"system A", "chat 1", "turn 2"}));
  route("system B + chat 4", prompt({"system B", "chat 4"}));
  drop_next_event_of_12 = true;
  route("system C + chat 3 + turn 2", prompt({"system C", "chat 3", "turn 2"}));
  // Worker 12 holds part of this prompt, but an idle worker costs less.
  route("system C + chat 5", prompt({"system C", "chat 5"}));
  // Worker 12's next event reveals the lost one.
  route("system C + chat 3 + turn 2 + 3", prompt({"system C", "chat 3", "turn 2", "turn 3"}));

  const pc::KvIndexCounters& c = router.counters();
  std::printf(
      "\nrouter: %zu workers, %zu blocks, %zu tree nodes; events applied %llu, gaps %llu, "
      "workers replaced %llu\n",
      router.worker_count(), router.total_blocks(), router.node_count(),
      static_cast<unsigned long long>(c.events_applied), static_cast<unsigned long long>(c.gaps),
      static_cast<unsigned long long>(c.workers_replaced));
  return c.workers_replaced == 1 ? 0 : 1;
}
