// Routing latency while ZmqKvSubscriber catches up: a router joins an engine
// whose replay buffer holds about 1 M blocks (batches of stored chains), so
// its first live message starts a replay of all of them, applied on the
// subscriber's thread. Meanwhile a querying thread calls with_index(
// find_matches) every 100 us, as a router answering requests does, and
// records how long each call took (lock wait included). Reports, per mode,
// the catch-up time and the queries' p50 / p99 / max, then the p99 / max of
// the same queries for as long again after the catch-up (the subscriber idle:
// the noise floor of the machine, the baseline for the catch-up figures).
//
// Modes: max_blocks_per_lock = 0 (a whole batch per lock hold) and the
// default (4096 blocks per hold). Built against a subscriber without that
// option (before bounded slices), it runs one mode with what that
// subscriber does.
//
// Publisher and subscriber share the process (loopback TCP); the figures
// are wall time, the medians of the per-round percentiles over the rounds.
//
// Usage: zmq_kv_subscriber_catchup [rounds=3] [blocks=1048576]
#include <promptcache/block_hash.hpp>
#include <promptcache/zmq_kv_subscriber.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
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

std::string seq_bytes(std::uint64_t seq) {
  std::string s(8, '\0');
  for (std::size_t i = 0; i < 8; ++i)
    s[i] = static_cast<char>((seq >> (56U - 8U * i)) & 0xffU);
  return s;
}

// XPUB (to know the subscription arrived) and a ROUTER serving the buffer.
class Publisher {
 public:
  explicit Publisher(const std::vector<std::string>& batches)
      : batches_(batches),
        pub_(ctx_, zmq::socket_type::xpub),
        router_(ctx_, zmq::socket_type::router) {
    pub_.set(zmq::sockopt::linger, 0);
    router_.set(zmq::sockopt::linger, 0);
    router_.set(zmq::sockopt::sndhwm, 0);
    pub_.bind("tcp://127.0.0.1:*");
    router_.bind("tcp://127.0.0.1:*");
    pub_ep = pub_.get(zmq::sockopt::last_endpoint);
    replay_ep = router_.get(zmq::sockopt::last_endpoint);
    server_ = std::thread([this] {
      while (!stop_.load()) {
        zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
        if (zmq::poll(&item, 1, 20ms) == 0) continue;
        std::vector<zmq::message_t> req;
        if (!zmq::recv_multipart(router_, std::back_inserter(req)) || req.size() != 3) continue;
        std::uint64_t start = 0;
        for (std::size_t i = 0; i < 8; ++i)
          start = (start << 8) | static_cast<const unsigned char*>(req[2].data())[i];
        for (std::uint64_t s = start; s < batches_.size(); ++s) {
          const std::string sb = seq_bytes(s);
          std::vector<zmq::const_buffer> reply = {zmq::buffer(req[0].data(), req[0].size()),
                                                  zmq::const_buffer(nullptr, 0), zmq::buffer(sb),
                                                  zmq::buffer(batches_[s])};
          zmq::send_multipart(router_, reply);
        }
        const std::string end = seq_bytes(~std::uint64_t{0});
        std::vector<zmq::const_buffer> reply = {zmq::buffer(req[0].data(), req[0].size()),
                                                zmq::const_buffer(nullptr, 0), zmq::buffer(end),
                                                zmq::const_buffer(nullptr, 0)};
        zmq::send_multipart(router_, reply);
      }
    });
  }
  ~Publisher() {
    stop_.store(true);
    server_.join();
  }
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  void wait_for_subscriber() {
    zmq::pollitem_t item{pub_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, 10000ms) != 1) {
      std::fprintf(stderr, "no subscription\n");
      std::exit(1);
    }
    zmq::message_t m;
    (void)pub_.recv(m);
  }

  // Sends the newest batch live: the subscriber's first message, a gap from 0.
  void send_last() {
    const std::uint64_t s = batches_.size() - 1;
    const std::string sb = seq_bytes(s);
    std::vector<zmq::const_buffer> parts = {zmq::str_buffer("kv"), zmq::buffer(sb),
                                            zmq::buffer(batches_[s])};
    zmq::send_multipart(pub_, parts);
  }

  std::string pub_ep, replay_ep;

 private:
  const std::vector<std::string>& batches_;
  zmq::context_t ctx_;
  zmq::socket_t pub_;
  zmq::socket_t router_;
  std::atomic<bool> stop_{false};
  std::thread server_;
};

struct Result {
  double catchup_ms = 0;
  double p50_us = 0, p99_us = 0, max_us = 0;
  std::size_t queries = 0;
  double idle_p99_us = 0, idle_max_us = 0;  // the same queries after the catch-up
};

double pct(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
}

template <class Options>
void set_slice(Options& o, std::size_t blocks) {
  if constexpr (requires { o.max_blocks_per_lock; }) o.max_blocks_per_lock = blocks;
}

template <class Options>
std::vector<std::pair<const char*, std::size_t>> modes_of() {
  if constexpr (requires(Options o) { o.max_blocks_per_lock; })
    return {{"max_blocks_per_lock = 0 (a batch per hold)", 0},
            {"max_blocks_per_lock = 4096 (default)", Options{}.max_blocks_per_lock}};
  else
    return {{"before slices (lock held through the replay)", 0}};
}

Result run(const std::vector<std::string>& batches, std::size_t slice,
           const std::vector<std::uint64_t>& query) {
  Publisher pub(batches);
  promptcache::ZmqKvSubscriberOptions o;
  set_slice(o, slice);
  o.replay_timeout = 10000ms;
  promptcache::ZmqKvSubscriber sub({{pub.pub_ep, pub.replay_ep, {1, 0}, ""}}, o);
  pub.wait_for_subscriber();
  sub.start();
  const std::uint64_t last = batches.size() - 1;
  std::atomic<int> phase{0};  // 0: catching up, 1: idle, 2: stop
  std::vector<double> lat, idle;
  lat.reserve(100000);
  idle.reserve(100000);
  std::thread reader([&] {
    std::vector<promptcache::KvWorkerMatch> out;
    for (int ph = 0; (ph = phase.load()) != 2;) {
      const auto t0 = Clock::now();
      sub.with_index([&](const promptcache::KvIndex& i) {
        i.find_matches(query, false, out);
        return out.size();
      });
      (ph == 0 ? lat : idle)
          .push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      std::this_thread::sleep_for(100us);
    }
  });
  const auto t0 = Clock::now();
  pub.send_last();
  while (sub.last_seq(0) != last)
    std::this_thread::sleep_for(200us);
  const auto t1 = Clock::now();
  // As long again with the subscriber idle: the machine's own noise floor.
  phase.store(1);
  std::this_thread::sleep_for(t1 - t0);
  phase.store(2);
  reader.join();
  sub.stop();
  Result r;
  r.catchup_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  r.queries = lat.size();
  r.max_us = lat.empty() ? 0 : *std::max_element(lat.begin(), lat.end());
  r.p50_us = pct(lat, 0.50);
  r.p99_us = pct(lat, 0.99);
  r.idle_p99_us = pct(idle, 0.99);
  r.idle_max_us = idle.empty() ? 0 : *std::max_element(idle.begin(), idle.end());
  const auto blocks = sub.with_index([](const promptcache::KvIndex& i) {
    return i.block_count({1, 0});
  });
  if (blocks != batches.size() * events_per_batch * chain_blocks) {
    std::fprintf(stderr, "caught up %zu blocks, expected %zu\n", static_cast<std::size_t>(blocks),
                 batches.size() * events_per_batch * chain_blocks);
    std::exit(1);
  }
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  const std::size_t blocks = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1048576;
  const std::size_t per_batch = std::size_t{events_per_batch} * chain_blocks;
  const std::size_t n_batches = std::max<std::size_t>(1, blocks / per_batch);
  std::vector<std::string> batches;
  batches.reserve(n_batches);
  for (std::size_t s = 0; s < n_batches; ++s)
    batches.push_back(make_batch(s * events_per_batch, s));
  // The query: chain 0's blocks, as a router hashes a request's prompt.
  const std::vector<std::uint64_t> query =
      promptcache::local_block_hashes(chain_tokens(0), block_size);

  // The longest single event: what no slicing can split (index growth
  // included), measured on a KvIndex alone.
  double event_max_us = 0;
  {
    promptcache::KvIndex index;
    promptcache::KvEventWireDecoder decoder;
    promptcache::KvWireBatch b;
    std::uint64_t id = 0;
    for (const std::string& payload : batches) {
      if (!decoder.decode(payload.data(), payload.size(), b).ok()) return 1;
      for (const promptcache::KvEventData& e : b.events) {
        const auto t0 = Clock::now();
        (void)index.apply({1, 0}, promptcache::KvEvent{id++, e});
        event_max_us = std::max(
            event_max_us, std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
    }
  }

  const auto modes = modes_of<promptcache::ZmqKvSubscriberOptions>();
  std::printf("catch-up of %zu blocks (%zu batches of %u events x %u blocks), %d rounds\n",
              n_batches * per_batch, n_batches, events_per_batch, chain_blocks, rounds);
  std::printf("%-50s %11s %8s %8s %9s %9s %9s %9s\n", "mode", "catch-up ms", "queries", "p50 us",
              "p99 us", "max us", "idle p99", "idle max");
  for (const auto& [name, slice] : modes) {
    std::vector<double> c, p50, p99, mx, q, ip99, imx;
    for (int r = 0; r < rounds; ++r) {
      const Result res = run(batches, slice, query);
      c.push_back(res.catchup_ms);
      p50.push_back(res.p50_us);
      p99.push_back(res.p99_us);
      mx.push_back(res.max_us);
      q.push_back(static_cast<double>(res.queries));
      ip99.push_back(res.idle_p99_us);
      imx.push_back(res.idle_max_us);
    }
    std::printf("%-50s %11.0f %8.0f %8.1f %9.1f %9.1f %9.1f %9.1f\n", name, median(c), median(q),
                median(p50), median(p99), median(mx), median(ip99), median(imx));
  }
  std::printf("longest single event apply (KvIndex alone): %.1f us\n", event_max_us);
  return 0;
}
