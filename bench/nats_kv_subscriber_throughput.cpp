// Blocks per second from NatsKvPublisher::publish to applied in
// NatsKvSubscriber's index, through a nats-server, against the same batches
// decoded and applied straight into a KvIndex in the same run (the
// baseline: what the transport adds is the difference). Batches hold 4
// stored chains of 64 blocks (256 blocks, ~22 KB of msgpack each).
//
// Each round: a fresh subscriber (its own thread) and publisher; the clock
// runs from the first publish to the last batch applied. A subscriber that
// loses messages (max_pending, slow consumer) recovers them by replay, which
// is counted and reported. Figures are the medians over the rounds, in wall
// time and per second of this process's CPU time (std::clock: every thread
// of the process, the publisher's and the NATS client's included, not the
// server's), which a loaded machine disturbs far less than wall time.
//
// Usage: nats_kv_subscriber_throughput <nats url> [rounds=5] [batches=2000]
// (start a server first, e.g. nats-server -a 127.0.0.1 -p 4222)
#include <promptcache/nats_kv_subscriber.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "vllm_chain_batches.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

using bench::block_size;
using bench::chain_blocks;
using bench::events_per_batch;
using bench::make_batch;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <nats url> [rounds=5] [batches=2000]\n", argv[0]);
    return 2;
  }
  const std::string url = argv[1];
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  const std::uint64_t n = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 2000;
  if (rounds <= 0 || n == 0) return 2;
  std::vector<std::string> batches;
  for (std::uint64_t s = 0; s < n; ++s)
    batches.push_back(make_batch(s * events_per_batch, s));
  const double blocks = static_cast<double>(n) * events_per_batch * chain_blocks;
  std::size_t bytes = 0;
  for (const auto& b : batches)
    bytes += b.size();
  const promptcache::KvWorker w{1, 0};

  std::vector<double> direct_bps;
  std::vector<double> nats_bps;
  std::vector<double> direct_cpu_bps;  // blocks per CPU second
  std::vector<double> nats_cpu_bps;
  const auto cpu_seconds = [](std::clock_t from) {
    return static_cast<double>(std::clock() - from) / CLOCKS_PER_SEC;
  };
  std::uint64_t replayed = 0;
  std::uint64_t gaps = 0;
  for (int r = 0; r < rounds; ++r) {
    {
      promptcache::KvIndex index;
      promptcache::KvEventWireDecoder decoder;
      promptcache::KvWireStreamState state;
      promptcache::KvWireBatch batch;
      std::uint64_t id = 0;
      const auto t0 = Clock::now();
      const std::clock_t c0 = std::clock();
      for (const auto& b : batches) {
        if (!decoder.decode(b.data(), b.size(), batch, state).ok()) return 1;
        for (const auto& e : batch.events)
          (void)index.apply(w, promptcache::KvEvent{id++, e});
      }
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      direct_cpu_bps.push_back(blocks / cpu_seconds(c0));
      direct_bps.push_back(blocks / s);
    }
    promptcache::NatsKvSubscriberOptions so;
    so.connection.url = url;
    so.prefix = "bench.kv-events";
    promptcache::NatsKvSubscriber sub(so);
    sub.start();
    promptcache::NatsKvPublisherOptions po;
    po.connection.url = url;
    po.prefix = so.prefix;
    po.worker = w;
    po.buffer_batches = n;
    promptcache::NatsKvPublisher pub(po);
    const auto t0 = Clock::now();
    const std::clock_t c0 = std::clock();
    for (std::uint64_t s = 0; s < n; ++s)
      pub.publish(s, batches[s]);
    const auto deadline = t0 + 120s;
    while (sub.last_seq(w) != n - 1 && Clock::now() < deadline)
      std::this_thread::sleep_for(200us);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    nats_cpu_bps.push_back(blocks / cpu_seconds(c0));
    sub.stop();
    if (sub.last_seq(w) != n - 1) {
      std::fprintf(stderr, "round %d: not caught up\n", r);
      return 1;
    }
    const auto c = sub.counters(w);
    replayed += c.batches_replayed;
    gaps += c.gaps;
    nats_bps.push_back(blocks / s);
  }
  const double d = median(direct_bps);
  const double t = median(nats_bps);
  std::printf("%llu batches x %u blocks (%.1f MB), %d rounds\n", static_cast<unsigned long long>(n),
              events_per_batch * chain_blocks, static_cast<double>(bytes) / 1e6, rounds);
  const double dc = median(direct_cpu_bps);
  const double tc = median(nats_cpu_bps);
  std::printf("direct decode + apply:            %10.0f blocks/s, %10.0f blocks per CPU second\n",
              d, dc);
  std::printf(
      "publish -> nats-server -> applied: %10.0f blocks/s, %10.0f blocks per CPU second "
      "(%.2fx / %.2fx the direct rates)\n",
      t, tc, t / d, tc / dc);
  std::printf("gaps %llu, batches replayed %llu (over all rounds)\n",
              static_cast<unsigned long long>(gaps), static_cast<unsigned long long>(replayed));
  return 0;
}
