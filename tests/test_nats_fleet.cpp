// A fleet over one nats-server (loopback, a free port): 8 engines, each a
// PagedPrefixCache under seeded random traffic (prompts sharing system
// prefixes, matches, inserts, evictions) publishing its KV events as vLLM
// KVEventBatch payloads through a NatsKvPublisher, and 3 router replicas, each
// a NatsKvSubscriber with its own KvIndex (one on its own thread, two polled).
// After each fault every replica's view of every worker must equal that
// engine's cache, block for block (KvIndex::block_hashes against
// PagedPrefixCache::block_hashes):
//   (c) a replica joining after at least 100 000 events,
//   (a) nats-server killed with SIGKILL mid-stream and started again on the
//       same port,
//   (b) a replica destroyed and constructed again,
//   (d) an engine restarting (a new cache and publisher, same worker id, seq
//       from 0) while the others keep publishing,
//   (e) duplicate and reordered deliveries, sent by a second connection
//       (a batch sent again, recent or old; a batch held back and sent after
//       the next one).
// Every wait polls with a deadline; the number of steps is fixed. The
// engines' replay buffers hold their whole run, so a replica that starts late
// can be exact; with buffers too short for that, a second case checks that
// the late replica's views are subsets of the engines' caches (never a block
// an engine does not hold).
#include <promptcache/nats_kv_subscriber.hpp>
#include <promptcache/paged_prefix_cache.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "support/nats_server.hpp"

using promptcache::KvEvent;
using promptcache::KvIndex;
using promptcache::KvPublisherCounters;
using promptcache::KvWorker;
using promptcache::NatsKvPublisher;
using promptcache::NatsKvPublisherOptions;
using promptcache::NatsKvSubscriber;
using promptcache::NatsKvSubscriberOptions;
using promptcache::PagedPrefixCache;
using promptcache_test::NatsServerProcess;
using namespace std::chrono_literals;
namespace kv_event = promptcache::kv_event;

namespace {

using Clock = std::chrono::steady_clock;
using Cache = PagedPrefixCache<std::uint32_t>;

constexpr std::size_t page_size = 4;
const std::string prefix = promptcache::dynamo_kv_events_subject("fleet", "backend");

// ---- the engines' payloads: vLLM KVEventBatch, array layout ----

// [ts, [event], data_parallel_rank]. A Stored event carries the token ids of
// its pages (`tokens`), from which the router computes the tokens hashes.
std::string encode_batch(const kv_event::Stored* st, const kv_event::Removed* rm, double ts,
                         std::span<const std::uint32_t> tokens) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_array(3);
  p.pack(ts);
  p.pack_array(1);
  if (st != nullptr) {
    p.pack_array(8);
    p.pack(std::string("BlockStored"));
    p.pack_array(static_cast<std::uint32_t>(st->blocks.size()));
    for (const auto& b : st->blocks)
      p.pack(b.block_hash);
    if (st->parent_hash)
      p.pack(*st->parent_hash);
    else
      p.pack_nil();
    p.pack_array(static_cast<std::uint32_t>(tokens.size()));
    for (const std::uint32_t t : tokens)
      p.pack(t);
    p.pack(page_size);
    p.pack_nil();
    p.pack(std::string("GPU"));
    p.pack_nil();
  } else if (rm != nullptr) {
    p.pack_array(3);
    p.pack(std::string("BlockRemoved"));
    p.pack(rm->block_hashes);
    p.pack(std::string("GPU"));
  } else {
    p.pack_array(1);
    p.pack(std::string("AllBlocksCleared"));
  }
  p.pack_nil();
  return std::string(buf.data(), buf.size());
}

// A second connection that sends batches on an engine's subject behind its
// publisher's back: duplicates and late copies.
class Chaos {
 public:
  explicit Chaos(const std::string& url) {
    natsOptions* o = nullptr;
    REQUIRE(natsOptions_Create(&o) == NATS_OK);
    natsOptions_SetURL(o, url.c_str());
    natsOptions_SetMaxReconnect(o, -1);
    natsOptions_SetReconnectWait(o, 10);
    const natsStatus s = natsConnection_Connect(&nc_, o);
    natsOptions_Destroy(o);
    REQUIRE(s == NATS_OK);
  }
  Chaos(const Chaos&) = delete;
  Chaos& operator=(const Chaos&) = delete;
  ~Chaos() { natsConnection_Destroy(nc_); }

  void send(std::uint64_t worker, std::uint64_t seq, const std::string& payload) {
    const std::string subject = prefix + "." + std::to_string(worker);
    natsMsg* m = nullptr;
    REQUIRE(natsMsg_Create(&m, subject.c_str(), nullptr, payload.data(),
                           static_cast<int>(payload.size())) == NATS_OK);
    REQUIRE(natsMsgHeader_Set(m, promptcache::nats_kv_seq_header, std::to_string(seq).c_str()) ==
            NATS_OK);
    REQUIRE(natsMsgHeader_Set(m, promptcache::nats_kv_dp_rank_header, "0") == NATS_OK);
    REQUIRE(natsConnection_PublishMsg(nc_, m) == NATS_OK);
    natsMsg_Destroy(m);
    ++sent_;
  }
  bool flush() { return natsConnection_FlushTimeout(nc_, 2000) == NATS_OK; }
  std::uint64_t sent() const { return sent_; }

 private:
  natsConnection* nc_ = nullptr;
  std::uint64_t sent_ = 0;
};

// One engine: a paged prefix cache whose events go out through a publisher,
// seq 0, 1, ... from its (re)start.
class Engine {
 public:
  Engine(std::string url, std::uint64_t id, std::uint64_t seed, std::size_t capacity_pages,
         std::size_t buffer_batches)
      : url_(std::move(url)),
        id_(id),
        rng_(seed),
        capacity_(capacity_pages),
        buffer_batches_(buffer_batches) {
    restart();
  }

  // A new process behind the same worker id: an empty cache, a new publisher
  // (the old one stops answering replays first), seq from 0.
  void restart() {
    pub_.reset();
    cache_.reset();
    NatsKvPublisherOptions o;
    o.connection.url = url_;
    o.connection.reconnect_wait = 10ms;
    o.prefix = prefix;
    o.worker = KvWorker{id_, 0};
    o.buffer_batches = buffer_batches_;
    pub_ = std::make_unique<NatsKvPublisher>(o);
    cache_ = std::make_unique<Cache>(page_size, promptcache::eviction::Lru{},
                                     [this](const KvEvent& e) { on_event(e); });
    seq_ = 0;
    held_.reset();
    history_.clear();
  }

  // One request: match its prompt, store it, evict down to capacity; now and
  // then the whole cache is cleared. Returns the batches published.
  std::size_t step() {
    const std::uint64_t before = seq_;
    // 24 system prompts of 3 pages, then 1 to 4 pages over a small alphabet
    // (so that suffixes are shared too).
    std::vector<std::uint32_t> tokens;
    const auto system = static_cast<std::uint32_t>(rng_() % 24);
    for (std::uint32_t i = 0; i < 3 * page_size; ++i)
      tokens.push_back(1000 + system * 100 + i);
    const std::size_t extra = 1 + rng_() % 4;
    for (std::size_t pg = 0; pg < extra; ++pg) {
      const auto v = static_cast<std::uint32_t>(rng_() % 6);
      for (std::size_t i = 0; i < page_size; ++i)
        tokens.push_back(v * 10 + static_cast<std::uint32_t>(i));
    }
    const Cache::MatchResult m = cache_->match(tokens);
    std::vector<std::uint32_t> pages = m.pages;
    while (pages.size() < tokens.size() / page_size)
      pages.push_back(next_page_++);
    current_ = tokens;
    cache_->insert(tokens, pages);
    if (cache_->cached_pages() > capacity_) cache_->evict(cache_->cached_pages() - capacity_ / 2);
    if (rng_() % 20000 == 0) cache_->clear();
    return static_cast<std::size_t>(seq_ - before);
  }

  // Steps until at least one batch was published.
  void step_until_published() {
    for (int i = 0; i < 1000; ++i)
      if (step() > 0) return;
    FAIL("engine " << id_ << " published nothing in 1000 requests");
  }

  // The next batch is held back and sent (by `chaos`) after the one that
  // follows it.
  void swap_next(Chaos* chaos) { swap_ = chaos; }
  // Sends the batch `back` batches before the newest again, through `chaos`.
  void duplicate(Chaos& chaos, std::size_t back) {
    if (history_.empty()) return;
    const auto& [seq, bytes] = history_[history_.size() - 1 - std::min(back, history_.size() - 1)];
    chaos.send(id_, seq, bytes);
  }

  bool flush() { return pub_->flush(2000ms); }
  bool connected() const { return pub_->connected(); }
  KvWorker worker() const { return KvWorker{id_, 0}; }
  std::uint64_t published() const { return seq_; }
  std::uint64_t published_in_all() const { return total_; }
  std::vector<std::uint64_t> blocks() const { return cache_->block_hashes(); }
  const NatsKvPublisher& publisher() const { return *pub_; }

 private:
  void on_event(const KvEvent& e) {
    std::string bytes;
    const double ts = 1.0e9 + static_cast<double>(++clock_) * 1e-3;
    if (const auto* st = std::get_if<kv_event::Stored>(&e.data)) {
      // The stored pages are the tail of the page-aligned prompt.
      const std::size_t q = current_.size() / page_size;
      const std::size_t n = st->blocks.size();
      bytes = encode_batch(
          st, nullptr, ts,
          std::span<const std::uint32_t>(current_).subspan((q - n) * page_size, n * page_size));
    } else if (const auto* rm = std::get_if<kv_event::Removed>(&e.data)) {
      bytes = encode_batch(nullptr, rm, ts, {});
    } else {
      bytes = encode_batch(nullptr, nullptr, ts, {});
    }
    const std::uint64_t seq = seq_++;
    ++total_;
    history_.emplace_back(seq, bytes);
    if (history_.size() > 4096) history_.pop_front();
    if (swap_ != nullptr && !held_) {
      pub_->remember(seq, bytes);  // buffered for replays in order, sent later
      held_.emplace(seq, std::move(bytes));
      return;
    }
    (void)pub_->publish(seq, bytes);
    if (held_) {
      // The server has the later batch before the earlier one is sent.
      REQUIRE(pub_->flush(2000ms));
      swap_->send(id_, held_->first, held_->second);
      held_.reset();
      swap_ = nullptr;
    }
  }

  std::string url_;
  std::uint64_t id_;
  std::mt19937_64 rng_;
  std::size_t capacity_;
  std::size_t buffer_batches_;
  std::unique_ptr<NatsKvPublisher> pub_;
  std::unique_ptr<Cache> cache_;
  std::uint64_t seq_ = 0;
  std::uint64_t total_ = 0;  // over restarts
  std::uint32_t next_page_ = 0;
  std::uint64_t clock_ = 0;
  std::vector<std::uint32_t> current_;
  Chaos* swap_ = nullptr;
  std::optional<std::pair<std::uint64_t, std::string>> held_;
  std::deque<std::pair<std::uint64_t, std::string>> history_;
};

// A router replica: its own subscriber and index, on its own thread or polled
// by the test.
class Replica {
 public:
  Replica(std::string url, bool threaded) : url_(std::move(url)), threaded_(threaded) { restart(); }
  void restart() {
    sub_.reset();
    NatsKvSubscriberOptions o;
    o.connection.url = url_;
    o.connection.reconnect_wait = 10ms;
    o.prefix = prefix;
    sub_ = std::make_unique<NatsKvSubscriber>(o);
    if (threaded_) sub_->start();
  }
  void poll(std::chrono::milliseconds timeout) {
    if (!threaded_) sub_->poll(timeout);
  }
  std::vector<std::uint64_t> blocks(const KvWorker& w) const {
    return sub_->with_index([&](const KvIndex& index) { return index.block_hashes(w); });
  }
  NatsKvSubscriber& sub() { return *sub_; }
  bool threaded() const { return threaded_; }

 private:
  std::string url_;
  bool threaded_;
  std::unique_ptr<NatsKvSubscriber> sub_;
};

struct Fleet {
  // By default the engines' replay buffers hold their whole run, so that a
  // replica that starts late replays it all.
  explicit Fleet(std::uint64_t seed, std::size_t replicas_at_start,
                 std::size_t buffer_batches = 1U << 17) {
    for (std::uint64_t i = 0; i < 8; ++i)
      engines.push_back(
          std::make_unique<Engine>(server.url(), 100 + i, seed * 1000 + i, 160, buffer_batches));
    for (std::size_t r = 0; r < replicas_at_start; ++r)
      add_replica();
  }
  void add_replica() {
    // The first replica runs on its own thread; the others are polled.
    replicas.push_back(std::make_unique<Replica>(server.url(), replicas.empty()));
  }

  // `steps` requests on every engine, the replicas polled in between.
  void traffic(std::size_t steps) {
    for (std::size_t s = 0; s < steps; ++s) {
      for (auto& e : engines)
        e->step();
      if (s % 8 == 0)
        for (auto& r : replicas)
          r->poll(0ms);
    }
  }

  std::uint64_t events() const {
    std::uint64_t n = 0;
    for (const auto& e : engines)
      n += e->published_in_all();
    return n;
  }

  // Each engine publishes at least once more (a batch lost at the very end of
  // a stream shows as a gap only on the next one), and flushes.
  void settle() {
    for (auto& e : engines) {
      e->step_until_published();
      REQUIRE(e->flush());
    }
  }

  bool converged(std::string* why) {
    for (std::size_t r = 0; r < replicas.size(); ++r)
      for (const auto& e : engines)
        if (replicas[r]->blocks(e->worker()) != e->blocks()) {
          if (why != nullptr) {
            const KvPublisherCounters c = replicas[r]->sub().counters(e->worker());
            *why = "replica " + std::to_string(r) + " worker " +
                   std::to_string(e->worker().worker_id) + ": " +
                   std::to_string(replicas[r]->blocks(e->worker()).size()) + " blocks, engine " +
                   std::to_string(e->blocks().size()) + "; gaps " + std::to_string(c.gaps) +
                   " unrecoverable " + std::to_string(c.gaps_unrecoverable) + " resets " +
                   std::to_string(c.resets) + " restarts " + std::to_string(c.restarts);
          }
          return false;
        }
    return true;
  }

  // Polls every replica until each one's view of each worker equals the
  // engine's cache; returns the time it took (from `since`). Fails after
  // `limit`.
  std::chrono::milliseconds wait_converged(const char* fault, Clock::time_point since,
                                           std::chrono::seconds limit = 30s) {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      bool idle = true;
      for (auto& r : replicas)
        if (!r->threaded() && r->sub().poll(2ms) > 0) idle = false;
      if (idle && converged(nullptr)) {
        const auto took =
            std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since);
        KvPublisherCounters c;
        for (auto& r : replicas)
          c += r->sub().total_counters();
        std::cout << "fleet: " << fault << ": every replica equals every engine after "
                  << took.count() << " ms (" << events() << " events so far; over the replicas "
                  << c.gaps << " gaps, " << c.gaps_recovered << " recovered, " << c.batches_replayed
                  << " batches replayed, " << c.resets << " resets, " << c.restarts << " restarts, "
                  << c.duplicates + c.already_replayed << " duplicates)\n";
        return took;
      }
    }
    std::string why;
    converged(&why);
    FAIL(fault << ": the replicas did not converge within " << limit.count() << " s: " << why);
    return {};
  }

  NatsServerProcess server;
  std::vector<std::unique_ptr<Engine>> engines;
  std::vector<std::unique_ptr<Replica>> replicas;
};

KvPublisherCounters sum_counters(Fleet& f) {
  KvPublisherCounters c;
  for (auto& r : f.replicas)
    c += r->sub().total_counters();
  return c;
}

void run_fleet(std::uint64_t seed, std::uint64_t join_after_events, std::size_t fault_steps) {
  const auto t0 = Clock::now();
  Fleet f(seed, 2);

  // (c) The third replica joins after join_after_events events.
  for (int round = 0; round < 100000 && f.events() < join_after_events; ++round)
    f.traffic(256);
  REQUIRE(f.events() >= join_after_events);
  f.settle();
  f.wait_converged("warm-up (2 replicas)", t0);
  auto t = Clock::now();
  f.add_replica();
  f.settle();
  f.wait_converged("(c) a replica joining late", t);
  CHECK(f.replicas[2]->sub().total_counters().batches_replayed >= join_after_events);

  // (a) SIGKILL of the server mid-stream, a restart on the same port.
  f.traffic(fault_steps);
  f.server.kill_now();
  f.traffic(fault_steps / 4);  // buffered by libnats while the server is away
  f.server.start();
  t = Clock::now();
  const auto reconnect_deadline = Clock::now() + 30s;
  const auto all_connected = [&] {
    for (auto& e : f.engines)
      if (!e->connected()) return false;
    for (auto& r : f.replicas)
      if (!r->sub().connected() || r->sub().transport_counters().reconnects == 0) return false;
    return true;
  };
  while (!all_connected() && Clock::now() < reconnect_deadline)
    for (auto& r : f.replicas)
      r->poll(2ms);
  REQUIRE(all_connected());
  f.traffic(fault_steps / 4);
  f.settle();
  f.wait_converged("(a) nats-server killed and restarted", t);

  // (b) A replica destroyed mid-stream and constructed again.
  f.traffic(fault_steps / 2);
  f.replicas[0]->restart();  // the threaded one
  f.traffic(fault_steps / 2);
  t = Clock::now();
  f.settle();
  f.wait_converged("(b) a replica restarted", t);

  // (d) An engine restarts while the others keep publishing.
  f.traffic(fault_steps / 2);
  Engine& restarted = *f.engines[3];
  restarted.restart();
  t = Clock::now();
  f.traffic(fault_steps / 2);
  f.settle();
  f.wait_converged("(d) an engine restarted", t);
  for (auto& r : f.replicas)
    CHECK(r->sub().counters(restarted.worker()).restarts >= 1);

  // (e) Duplicates (recent and old) and swapped pairs, from a second connection.
  Chaos chaos(f.server.url());
  const KvPublisherCounters before = sum_counters(f);
  std::mt19937_64 rng(seed);
  t = Clock::now();
  for (std::size_t s = 0; s < fault_steps; ++s) {
    for (auto& e : f.engines) {
      const auto dice = rng() % 64;
      if (dice == 0) e->swap_next(&chaos);
      e->step();
      if (dice == 1) e->duplicate(chaos, 0);
      if (dice == 2) e->duplicate(chaos, 1 + rng() % 8);
      if (dice == 3 && s % 16 == 0) e->duplicate(chaos, 1500 + rng() % 1000);  // not remembered
    }
    if (s % 8 == 0)
      for (auto& r : f.replicas)
        r->poll(0ms);
  }
  // A batch still held back goes out with the engine's next one.
  f.settle();
  REQUIRE(chaos.flush());
  f.wait_converged("(e) duplicates and reordered deliveries", t);
  const KvPublisherCounters after = sum_counters(f);
  CHECK(chaos.sent() > 0);
  CHECK(after.duplicates + after.already_replayed > before.duplicates + before.already_replayed);
  CHECK(after.restarts == before.restarts);  // no copy was taken for a restart
  CHECK(after.resets == before.resets);

  // Every replica answers every routing question the same way: each system
  // prompt, and each with one more page.
  std::size_t routed = 0;
  for (std::uint32_t system = 0; system < 24; ++system) {
    std::vector<std::uint32_t> tokens;
    for (std::uint32_t i = 0; i < 4 * page_size; ++i)
      tokens.push_back(i < 3 * page_size ? 1000 + system * 100 + i : i % page_size);
    for (const std::size_t pages : {std::size_t{3}, std::size_t{4}}) {
      const std::vector<std::uint64_t> locals = promptcache::local_block_hashes(
          std::span<const std::uint32_t>(tokens).first(pages * page_size), page_size);
      const std::vector<std::uint64_t> names = promptcache::sequence_hashes(locals);
      std::vector<std::vector<promptcache::KvWorkerMatch>> answers;
      for (auto& r : f.replicas) {
        auto m = r->sub().with_index(
            [&](const KvIndex& index) { return index.find_matches(locals, names); });
        std::sort(m.begin(), m.end());
        answers.push_back(std::move(m));
      }
      for (const auto& a : answers)
        CHECK(a == answers.front());
      if (!answers.front().empty()) ++routed;
    }
  }
  CHECK(routed > 0);
  for (auto& r : f.replicas)
    CHECK(r->sub().thread_error() == nullptr);
  std::cout << "fleet: " << f.events() << " events, 8 engines, 3 replicas, "
            << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count()
            << " ms in all\n";
}

}  // namespace

TEST_CASE("nats fleet: 8 engines, 3 replicas; after each fault every replica equals every engine",
          "[nats][fleet]") {
  run_fleet(1, 100000, 400);
}

TEST_CASE("nats fleet: a replica joining past the replay buffers names no block an engine lacks",
          "[nats][fleet]") {
  // Buffers of 16 batches against 2 500 per engine: the late replica's view
  // of each worker starts from the oldest batch still buffered.
  Fleet f(4, 1, 16);
  for (int round = 0; round < 1000 && f.events() < 20000; ++round)
    f.traffic(64);
  f.settle();
  f.wait_converged("the replica following from the start", Clock::now());
  f.add_replica();
  f.settle();
  Replica& late = *f.replicas[1];
  const auto applied_all = [&] {
    for (const auto& e : f.engines)
      if (late.sub().last_seq(e->worker()) != e->published() - 1) return false;
    return true;
  };
  for (int i = 0; i < 5000 && !applied_all(); ++i)
    late.poll(2ms);
  REQUIRE(applied_all());
  std::size_t missing = 0;
  std::size_t orphans = 0;
  for (const auto& e : f.engines) {
    const std::vector<std::uint64_t> cache = e->blocks();
    const std::vector<std::uint64_t> view = late.blocks(e->worker());
    INFO("worker " << e->worker().worker_id);
    CHECK(std::includes(cache.begin(), cache.end(), view.begin(), view.end()));
    missing += cache.size() - view.size();
    orphans += late.sub().index().orphan_count(e->worker());
    CHECK(late.sub().counters(e->worker()).gaps_unrecoverable == 1);
  }
  std::cout << "fleet: a replica joining past the buffers misses " << missing
            << " cached blocks of 8 engines and holds " << orphans << " as orphans\n";
  CHECK(missing > 0);  // the buffers did not reach: not exact, but never wrong
}

// What this adds to the first case is convergence over longer streams and other
// seeds, a property of the protocol: it runs optimized, where the first case's run
// under ASan already covers the same code ([soak], see tests/CMakeLists.txt).
TEST_CASE("nats fleet: a longer run, other seeds", "[soak]") {
  for (std::uint64_t seed = 2; seed <= 3; ++seed)
    run_fleet(seed, 200000, 1000);
}
