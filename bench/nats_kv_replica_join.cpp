// A router replica joining a fleet over JetStream (nats_kv_snapshot_store.hpp):
// 8 workers have published about 1 M blocks (batches of 4 stored chains of
// 64 blocks) into the stream; a first replica reads it all and saves its
// snapshot; the workers publish a tail (1% more by default). Then, per round:
//   - from the snapshot: NatsKvSnapshotStore::join (load the chunks, restore)
//     and read the tail: time to routable (the stream's last message applied)
//     and its parts;
//   - replaying the whole stream: a new consumer from the first message into
//     an empty index, the baseline;
// and, on both, a querying thread calls with_index(find_matches) every
// 100 us from the moment the replica exists until it has caught up (lock
// waits included), against the same queries on the caught-up index with
// nothing applying (the machine's noise floor). Medians over the rounds.
// The same thread also queries the first replica while it takes its snapshot.
//
// Needs a nats-server with JetStream (nats-server -js); the stream and the
// bucket get this process's pid in their names and are deleted at the end.
//
// Usage: nats_kv_replica_join <url> [rounds=3] [blocks=1048576] [tail_percent=1]
#include <promptcache/block_hash.hpp>
#include <promptcache/nats_kv_snapshot_store.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "vllm_chain_batches.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

using bench::block_size;
using bench::chain_blocks;
using bench::chain_tokens;
using bench::events_per_batch;
using bench::make_batch;
constexpr std::uint64_t workers = 8;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void wait_caught_up(const promptcache::NatsKvSubscriber& sub, std::uint64_t last) {
  const auto t0 = Clock::now();
  while (sub.stream_sequence() < last) {
    if (auto e = sub.thread_error()) std::rethrow_exception(e);
    if (Clock::now() - t0 > 600s) {
      std::fprintf(stderr, "no catch-up within 600 s (at %llu of %llu)\n",
                   static_cast<unsigned long long>(sub.stream_sequence()),
                   static_cast<unsigned long long>(last));
      std::exit(1);
    }
    std::this_thread::sleep_for(200us);
  }
}

// Queries `*sub` (once set) every 100 us until told to stop.
class Querier {
 public:
  explicit Querier(std::vector<std::uint64_t> query) : query_(std::move(query)) {
    thread_ = std::thread([this] {
      std::vector<promptcache::KvWorkerMatch> out;
      while (!stop_.load()) {
        promptcache::NatsKvSubscriber* s = sub_.load();
        if (s != nullptr) {
          const auto t0 = Clock::now();
          s->with_index([&](const promptcache::KvIndex& i) {
            i.find_matches(query_, false, out);
            return out.size();
          });
          lat_.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        }
        std::this_thread::sleep_for(100us);
      }
    });
  }
  Querier(const Querier&) = delete;
  Querier& operator=(const Querier&) = delete;
  ~Querier() { finish(); }
  void target(promptcache::NatsKvSubscriber* s) { sub_.store(s); }
  std::vector<double> finish() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    return lat_;
  }

 private:
  std::vector<std::uint64_t> query_;
  std::atomic<promptcache::NatsKvSubscriber*> sub_{nullptr};
  std::atomic<bool> stop_{false};
  std::vector<double> lat_;
  std::thread thread_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: nats_kv_replica_join <url> [rounds=3] [blocks=1048576] "
                 "[tail_percent=1]\n");
    return 2;
  }
  const std::string url = argv[1];
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  const std::size_t blocks = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 1048576;
  const double tail_percent = argc > 4 ? std::atof(argv[4]) : 1.0;
  const std::size_t per_batch = std::size_t{events_per_batch} * chain_blocks;
  const std::size_t main_batches = std::max<std::size_t>(workers, blocks / per_batch);
  const auto tail_batches = std::max<std::size_t>(
      workers, static_cast<std::size_t>(static_cast<double>(main_batches) * tail_percent / 100.0));

  const std::string tag = std::to_string(getpid());
  promptcache::NatsKvSubscriberOptions so;
  so.connection.url = url;
  so.prefix = promptcache::dynamo_kv_events_subject("bench" + tag, "backend");
  so.jetstream.stream = "BENCH_" + tag;
  so.jetstream.ack_wait = 600000ms;
  promptcache::NatsKvSnapshotStoreOptions sto;
  sto.connection.url = url;
  sto.stream = so.jetstream.stream;
  sto.bucket = "bench_snapshots_" + tag;
  promptcache::NatsKvSnapshotStore store(sto);

  // The stream exists before anything is published.
  promptcache::NatsKvJoinReport report;
  so.jetstream.durable = "first";
  std::unique_ptr<promptcache::NatsKvSubscriber> first = store.join(so, report);

  std::vector<std::unique_ptr<promptcache::NatsKvPublisher>> pubs;
  for (std::uint64_t w = 0; w < workers; ++w) {
    promptcache::NatsKvPublisherOptions po;
    po.connection.url = url;
    po.prefix = so.prefix;
    po.worker = {w, 0};
    po.buffer_batches = 16;
    pubs.push_back(std::make_unique<promptcache::NatsKvPublisher>(po));
  }
  std::vector<std::uint64_t> next_seq(workers, 0);
  std::uint64_t next_chain = 0;
  const auto publish = [&](std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t w = i % workers;
      const std::string b = make_batch(next_chain, 0);
      next_chain += events_per_batch;
      while (!pubs[w]->publish(next_seq[w], b))
        std::this_thread::sleep_for(1ms);  // the reconnect buffer is full
      ++next_seq[w];
      if (i % 256 == 255) pubs[w]->flush(10000ms);  // keeps JetStream's intake bounded
    }
    for (auto& p : pubs)
      p->flush(10000ms);
  };

  auto t0 = Clock::now();
  publish(main_batches);
  const double publish_ms = ms_since(t0);
  std::uint64_t last = store.stream_bounds().last;
  while (last < main_batches) {
    std::this_thread::sleep_for(1ms);
    last = store.stream_bounds().last;
  }
  t0 = Clock::now();
  first->start();
  wait_caught_up(*first, last);
  const double first_ms = ms_since(t0);
  // The query: worker 0's first chain, as a router hashes a request's prompt.
  const std::vector<std::uint64_t> query =
      promptcache::local_block_hashes(chain_tokens(0), block_size);

  // The first replica keeps answering while it serializes its snapshot.
  Querier during_snapshot(query);
  during_snapshot.target(first.get());
  t0 = Clock::now();
  const std::vector<std::byte> doc = first->snapshot();
  const double snapshot_ms = ms_since(t0);
  const std::vector<double> snapshot_lat = during_snapshot.finish();
  t0 = Clock::now();
  if (!store.save(doc, first->stream_sequence())) return 1;
  const double save_ms = ms_since(t0);
  publish(tail_batches);
  last = store.stream_bounds().last;
  while (last < main_batches + tail_batches) {
    std::this_thread::sleep_for(1ms);
    last = store.stream_bounds().last;
  }
  wait_caught_up(*first, last);
  const std::size_t want_blocks = first->with_index(
      [](const promptcache::KvIndex& i) { return static_cast<std::size_t>(i.total_blocks()); });

  std::printf(
      "%zu blocks in %zu batches over %llu workers (+ a tail of %zu batches, %.1f%%), "
      "stream %llu messages\n",
      main_batches * per_batch, main_batches, static_cast<unsigned long long>(workers),
      tail_batches, tail_percent, static_cast<unsigned long long>(last));
  std::printf(
      "publish %.0f ms; first replica read it in %.0f ms; snapshot %.0f ms, %zu bytes; "
      "save to the bucket %.0f ms\n",
      publish_ms, first_ms, snapshot_ms, doc.size(), save_ms);
  std::printf(
      "find_matches on the first replica while snapshot() ran: %zu queries, p50 %.1f us, "
      "p99 %.1f us, max %.1f us\n",
      snapshot_lat.size(), pct(snapshot_lat, 0.5), pct(snapshot_lat, 0.99),
      snapshot_lat.empty() ? 0.0 : *std::max_element(snapshot_lat.begin(), snapshot_lat.end()));

  std::vector<double> snap_load, snap_total, snap_join, snap_tail, snap_p50, snap_p99, snap_max,
      snap_q;
  std::vector<double> full_total, full_p50, full_p99, full_max, full_q, idle_p99, idle_max;
  for (int r = 0; r < rounds; ++r) {
    // From the snapshot.
    {
      // The load alone (the join loads again): the chunks' transfer.
      t0 = Clock::now();
      if (store.load_latest().found != promptcache::NatsKvSnapshotFound::ok) return 1;
      snap_load.push_back(ms_since(t0));
      Querier q(query);
      so.jetstream.durable = "snap" + std::to_string(r);
      t0 = Clock::now();
      std::unique_ptr<promptcache::NatsKvSubscriber> s = store.join(so, report);
      const double join_ms = ms_since(t0);
      if (report.start != promptcache::NatsKvJoinStart::snapshot) {
        std::fprintf(stderr, "join did not start from the snapshot\n");
        return 1;
      }
      q.target(s.get());
      const auto t1 = Clock::now();
      s->start();
      wait_caught_up(*s, last);
      snap_total.push_back(ms_since(t0));
      snap_join.push_back(join_ms);
      snap_tail.push_back(ms_since(t1));
      const std::vector<double> lat = q.finish();
      snap_p50.push_back(pct(lat, 0.5));
      snap_p99.push_back(pct(lat, 0.99));
      snap_max.push_back(lat.empty() ? 0 : *std::max_element(lat.begin(), lat.end()));
      snap_q.push_back(static_cast<double>(lat.size()));
      s->stop();
      const std::size_t got = s->with_index(
          [](const promptcache::KvIndex& i) { return static_cast<std::size_t>(i.total_blocks()); });
      if (got != want_blocks) {
        std::fprintf(stderr, "snapshot joiner holds %zu blocks, expected %zu\n", got, want_blocks);
        return 1;
      }
    }
    // The whole stream.
    {
      Querier q(query);
      auto fo = so;
      fo.jetstream.durable = "full" + std::to_string(r);
      t0 = Clock::now();
      auto f = std::make_unique<promptcache::NatsKvSubscriber>(fo);
      q.target(f.get());
      f->start();
      wait_caught_up(*f, last);
      full_total.push_back(ms_since(t0));
      std::vector<double> lat = q.finish();
      full_p50.push_back(pct(lat, 0.5));
      full_p99.push_back(pct(lat, 0.99));
      full_max.push_back(lat.empty() ? 0 : *std::max_element(lat.begin(), lat.end()));
      full_q.push_back(static_cast<double>(lat.size()));
      // The noise floor: the same queries, nothing applying, for 1 s.
      Querier idle(query);
      idle.target(f.get());
      std::this_thread::sleep_for(1s);
      lat = idle.finish();
      idle_p99.push_back(pct(lat, 0.99));
      idle_max.push_back(lat.empty() ? 0 : *std::max_element(lat.begin(), lat.end()));
      f->stop();
      const std::size_t got = f->with_index(
          [](const promptcache::KvIndex& i) { return static_cast<std::size_t>(i.total_blocks()); });
      if (got != want_blocks) {
        std::fprintf(stderr, "full replayer holds %zu blocks, expected %zu\n", got, want_blocks);
        return 1;
      }
    }
  }
  std::printf("%d rounds, medians (ranges)\n", rounds);
  std::printf(
      "from the snapshot: routable in %.0f ms (%.0f-%.0f): join %.0f ms (the load alone %.0f ms), "
      "tail %.0f ms\n",
      median(snap_total), *std::min_element(snap_total.begin(), snap_total.end()),
      *std::max_element(snap_total.begin(), snap_total.end()), median(snap_join), median(snap_load),
      median(snap_tail));
  std::printf("replaying the whole stream: routable in %.0f ms (%.0f-%.0f)\n", median(full_total),
              *std::min_element(full_total.begin(), full_total.end()),
              *std::max_element(full_total.begin(), full_total.end()));
  std::printf("ratio: %.1fx faster from the snapshot\n", median(full_total) / median(snap_total));
  std::printf("find_matches (%u blocks) on the joining replica, us: %-28s %8s %8s %8s %8s\n",
              chain_blocks, "", "queries", "p50", "p99", "max");
  std::printf("  %-60s %8.0f %8.1f %8.1f %8.1f\n", "during the snapshot joiner's tail",
              median(snap_q), median(snap_p50), median(snap_p99), median(snap_max));
  std::printf("  %-60s %8.0f %8.1f %8.1f %8.1f\n", "during the whole-stream replay", median(full_q),
              median(full_p50), median(full_p99), median(full_max));
  std::printf("  %-60s %8s %8s %8.1f %8.1f\n", "caught up, nothing applying (1 s)", "", "",
              median(idle_p99), median(idle_max));

  first->stop();
  first.reset();
  // Leave the server as found.
  natsConnection* nc = nullptr;
  jsCtx* js = nullptr;
  if (natsConnection_ConnectTo(&nc, url.c_str()) == NATS_OK &&
      natsConnection_JetStream(&js, nc, nullptr) == NATS_OK) {
    (void)js_DeleteStream(js, so.jetstream.stream.c_str(), nullptr, nullptr);
    (void)js_DeleteKeyValue(js, sto.bucket.c_str());
  }
  if (js != nullptr) jsCtx_Destroy(js);
  if (nc != nullptr) natsConnection_Destroy(nc);
  return 0;
}
