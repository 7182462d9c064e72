// The subscriber's rules one by one, against an in-process publisher on
// loopback (ephemeral ports): bad frames, undecodable payloads, gaps without
// a replay socket, a replay socket that never answers or falls silent,
// replies carrying a topic frame, duplicates versus restarts (also restarts
// only a replay reveals), seqs the publisher never sent, dp rank mismatches,
// and the background thread. Every wait polls with a timeout under a
// deadline; replay timeouts run on a ManualClock the publisher advances.
#include <promptcache/manual_clock.hpp>
#include <promptcache/zmq_kv_subscriber.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"

using promptcache::KvPublisherCounters;
using promptcache::KvWorker;
using promptcache::ZmqKvSubscriber;
using namespace std::chrono_literals;

namespace {

const KvWorker W{3, 0};

std::string seq_bytes(std::uint64_t seq) {
  std::string s(8, '\0');
  for (std::size_t i = 0; i < 8; ++i)
    s[i] = static_cast<char>((seq >> (56U - 8U * i)) & 0xffU);
  return s;
}

// A batch storing one block `name` (under `parent` when non-zero), SGLang
// layout, with timestamp `ts` and dp rank `rank`.
std::string batch(double ts, std::uint64_t name, std::uint64_t parent = 0, std::uint32_t rank = 0) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_array(3);
  p.pack(ts);
  p.pack_array(1);
  p.pack_array(8);
  p.pack(std::string("BlockStored"));
  p.pack_array(1);
  p.pack(name);
  if (parent != 0)
    p.pack(parent);
  else
    p.pack_nil();
  p.pack(std::vector<std::uint32_t>{static_cast<std::uint32_t>(name), 2, 3, 4});
  p.pack(4);
  p.pack_nil();
  p.pack(std::string("GPU"));
  p.pack_nil();
  p.pack(rank);
  return std::string(buf.data(), buf.size());
}

// A publisher: XPUB (so the test knows when the subscription arrived) and a
// ROUTER replay socket served by a thread from a buffer of (seq, payload).
class FakePublisher {
 public:
  explicit FakePublisher(bool answer_replays = true, bool topic_in_replies = false)
      : pub_(ctx_, zmq::socket_type::xpub), router_(ctx_, zmq::socket_type::router) {
    pub_.set(zmq::sockopt::linger, 0);
    router_.set(zmq::sockopt::linger, 0);
    pub_.bind("tcp://127.0.0.1:*");
    router_.bind("tcp://127.0.0.1:*");
    pub_ep_ = pub_.get(zmq::sockopt::last_endpoint);
    replay_ep_ = router_.get(zmq::sockopt::last_endpoint);
    server_ = std::thread([this, answer_replays, topic_in_replies] {
      while (!stop_.load()) {
        zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
        if (zmq::poll(&item, 1, 20ms) == 0) continue;
        std::vector<zmq::message_t> req;
        if (!zmq::recv_multipart(router_, std::back_inserter(req))) continue;
        ++requests;
        if (!answer_replays || req.size() != 3) continue;
        std::uint64_t start = 0;
        for (std::size_t i = 0; i < 8; ++i)
          start = (start << 8) | static_cast<const unsigned char*>(req[2].data())[i];
        std::lock_guard<std::mutex> lock(mutex_);
        for (const auto& [seq, payload] : buffer_) {
          if (seq < start) continue;
          if (before_reply_ && !before_reply_(seq)) continue;
          std::vector<zmq::const_buffer> reply = {zmq::buffer(req[0].data(), req[0].size()),
                                                  zmq::const_buffer(nullptr, 0)};
          if (topic_in_replies) reply.push_back(zmq::str_buffer("kv"));
          const std::string s = seq_bytes(seq);
          reply.push_back(zmq::buffer(s));
          reply.push_back(zmq::buffer(payload));
          zmq::send_multipart(router_, reply);
        }
        if (before_reply_ && !before_reply_(~std::uint64_t{0})) continue;
        const std::string end = seq_bytes(~std::uint64_t{0});
        std::vector<zmq::const_buffer> reply = {zmq::buffer(req[0].data(), req[0].size()),
                                                zmq::const_buffer(nullptr, 0), zmq::buffer(end),
                                                zmq::const_buffer(nullptr, 0)};
        zmq::send_multipart(router_, reply);
      }
    });
  }
  ~FakePublisher() {
    stop_.store(true);
    server_.join();
  }

  const std::string& endpoint() const { return pub_ep_; }
  const std::string& replay_endpoint() const { return replay_ep_; }

  void wait_for_subscriber() {
    zmq::pollitem_t item{pub_.handle(), 0, ZMQ_POLLIN, 0};
    REQUIRE(zmq::poll(&item, 1, 10000ms) == 1);
    zmq::message_t m;
    REQUIRE(pub_.recv(m));
  }

  // Buffers and (unless `drop`) sends batch `payload` as `seq`.
  void publish(std::uint64_t seq, const std::string& payload, bool drop = false) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      buffer_.emplace_back(seq, payload);
    }
    if (!drop) send_frames({"kv", seq_bytes(seq), payload});
  }

  void send_frames(const std::vector<std::string>& frames) {
    std::vector<zmq::const_buffer> parts;
    for (const auto& f : frames)
      parts.push_back(zmq::buffer(f));
    REQUIRE(zmq::send_multipart(pub_, parts));
  }

  void clear_buffer() {
    std::lock_guard<std::mutex> lock(mutex_);
    buffer_.clear();
  }

  // Forgets the buffered batches below `seq`, as a full replay buffer does.
  void evict_before(std::uint64_t seq) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(buffer_, [seq](const auto& b) { return b.first < seq; });
  }

  // Called (on the replay thread) before each replay reply with its seq, the
  // end marker's included; the reply is sent only if it returns true.
  void before_reply(std::function<bool(std::uint64_t)> f) {
    std::lock_guard<std::mutex> lock(mutex_);
    before_reply_ = std::move(f);
  }

  std::atomic<int> requests{0};

 private:
  zmq::context_t ctx_;
  zmq::socket_t pub_;
  zmq::socket_t router_;
  std::string pub_ep_, replay_ep_;
  std::mutex mutex_;
  std::vector<std::pair<std::uint64_t, std::string>> buffer_;
  std::function<bool(std::uint64_t)> before_reply_;
  std::atomic<bool> stop_{false};
  std::thread server_;
};

void poll_until(ZmqKvSubscriber& sub, const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!done()) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    sub.poll(20ms);
  }
}

std::size_t messages(const ZmqKvSubscriber& sub) {
  return sub.counters(0).messages;
}

// The subscriber's clock, read from `clock`. Once the publisher is silent for
// good (`silent`), every reading moves it on by 50 ms, so a wait for a replay
// runs out without real time passing.
std::function<std::chrono::steady_clock::time_point()> silence_clock(
    promptcache::ManualClock clock, std::shared_ptr<std::atomic<bool>> silent) {
  return [clock, silent] {
    if (silent->load()) clock.advance(50ms);
    return std::chrono::steady_clock::time_point(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            clock.now().time_since_epoch()));
  };
}

// Publishes seqs 0..4, a chain of blocks 10..14 at ts 1.0..1.4, and polls
// until the subscriber applied them all.
void apply_chain(FakePublisher& pub, ZmqKvSubscriber& sub) {
  for (std::uint64_t s = 0; s < 5; ++s)
    pub.publish(s, batch(1.0 + 0.1 * static_cast<double>(s), 10 + s, s == 0 ? 0 : 9 + s));
  poll_until(sub, [&] { return sub.last_seq(0) == 4U; });
}

}  // namespace

TEST_CASE("bad frames and undecodable payloads are counted and skipped", "[zmq_kv_subscriber]") {
  FakePublisher pub;
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}});
  pub.wait_for_subscriber();
  pub.send_frames({"kv", seq_bytes(0)});                      // two frames
  pub.send_frames({"kv", "1234", batch(1.0, 10)});            // a 4-byte seq
  pub.send_frames({"kv", seq_bytes(0), batch(1.0, 10), ""});  // four frames
  poll_until(sub, [&] { return messages(sub) == 3; });
  CHECK(sub.counters(0).bad_frames == 3);
  CHECK_FALSE(sub.last_seq(0).has_value());
  CHECK(sub.index().block_count(W) == 0);

  pub.publish(0, batch(1.0, 10));
  pub.publish(1, "\xc1 not msgpack");
  pub.publish(2, batch(1.2, 11, 10));
  poll_until(sub, [&] { return sub.last_seq(0) == 2U; });
  const KvPublisherCounters c = sub.counters(0);
  CHECK(c.malformed == 1);
  CHECK(c.last_error == promptcache::KvWireErrc::invalid_msgpack);
  CHECK(c.gaps == 0);  // the bad payload consumed its seq
  CHECK(c.batches_applied == 2);
  CHECK(sub.index().block_count(W) == 2);
}

TEST_CASE("without a replay socket a gap resets the view and continues", "[zmq_kv_subscriber]") {
  FakePublisher pub;
  ZmqKvSubscriber sub({{pub.endpoint(), "", W, ""}});
  pub.wait_for_subscriber();
  pub.publish(0, batch(1.0, 10));
  pub.publish(1, batch(1.1, 11, 10), true);  // lost
  pub.publish(2, batch(1.2, 12));
  poll_until(sub, [&] { return sub.last_seq(0) == 2U; });
  const KvPublisherCounters c = sub.counters(0);
  CHECK(c.gaps == 1);
  CHECK(c.gaps_unrecoverable == 1);
  CHECK(c.resets == 1);
  CHECK(sub.index().block_count(W) == 1);  // only block 12: block 10 went with the reset
}

TEST_CASE("a replay socket that never answers times out into a reset", "[zmq_kv_subscriber]") {
  FakePublisher pub(false);
  promptcache::ZmqKvSubscriberOptions o;
  o.replay_timeout = 100ms;
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}}, o);
  pub.wait_for_subscriber();
  pub.publish(0, batch(1.0, 10));
  pub.publish(1, batch(1.1, 11, 10), true);
  pub.publish(2, batch(1.2, 12));
  poll_until(sub, [&] { return sub.last_seq(0) == 2U; });
  const KvPublisherCounters c = sub.counters(0);
  CHECK(pub.requests.load() == 1);
  CHECK(c.replay_timeouts == 1);
  CHECK(c.gaps_unrecoverable == 1);
  CHECK(sub.index().block_count(W) == 1);
}

TEST_CASE("replay replies with a topic frame are accepted", "[zmq_kv_subscriber]") {
  FakePublisher pub(true, true);
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}});
  pub.wait_for_subscriber();
  pub.publish(0, batch(1.0, 10));
  pub.publish(1, batch(1.1, 11, 10), true);
  pub.publish(2, batch(1.2, 12, 11));
  poll_until(sub, [&] { return sub.last_seq(0) == 2U; });
  const KvPublisherCounters c = sub.counters(0);
  CHECK(c.gaps_recovered == 1);
  CHECK(c.batches_replayed == 2);  // 1 and 2 (then the live 2 is already applied)
  CHECK(c.bad_frames == 0);
  CHECK(sub.index().block_count(W) == 3);
  CHECK(sub.index().counters().parent_not_found == 0);
}

TEST_CASE("an old seq with the bytes applied there is a duplicate; other bytes are a restart",
          "[zmq_kv_subscriber]") {
  FakePublisher pub;
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}});
  pub.wait_for_subscriber();
  apply_chain(pub, sub);
  REQUIRE(sub.index().block_count(W) == 5);

  pub.send_frames({"kv", seq_bytes(1), batch(1.1, 11, 10)});  // a late duplicate
  poll_until(sub, [&] { return messages(sub) == 6; });
  CHECK(sub.counters(0).duplicates == 1);
  CHECK(sub.counters(0).restarts == 0);
  CHECK(pub.requests.load() == 0);  // the remembered bytes decide

  // The publisher restarts with its wall clock stepped back: every new
  // timestamp is older than the last applied one (1.4). Its seq 0 is lost.
  pub.clear_buffer();
  pub.publish(0, batch(0.5, 100), true);
  pub.publish(1, batch(0.6, 101, 100));
  poll_until(sub, [&] { return sub.counters(0).restarts == 1 && sub.last_seq(0) == 1U; });
  const KvPublisherCounters c = sub.counters(0);
  CHECK(c.resets == 1);
  CHECK(c.gaps_recovered == 1);
  CHECK(c.duplicates == 1);
  CHECK(sub.index().block_count(W) == 2);  // only the new run's blocks
}

TEST_CASE("a restart with a clock stepped back, beyond the remembered bytes",
          "[zmq_kv_subscriber]") {
  promptcache::ZmqKvSubscriberOptions o;
  o.remembered_batches = 0;
  o.restart_max_seq = 2;
  SECTION("the replay socket tells: nothing from the last applied seq on") {
    FakePublisher pub;
    ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}}, o);
    pub.wait_for_subscriber();
    apply_chain(pub, sub);
    pub.send_frames({"kv", seq_bytes(3), batch(1.3, 13, 12)});  // a late duplicate
    poll_until(sub, [&] { return messages(sub) == 6; });
    CHECK(sub.counters(0).duplicates == 1);  // the replay returned the bytes applied as 4
    pub.clear_buffer();
    for (std::uint64_t s = 0; s < 4; ++s)
      pub.publish(s, batch(0.1 * static_cast<double>(s), 200 + s, s == 0 ? 0 : 199 + s), s < 3);
    poll_until(sub, [&] { return sub.counters(0).restarts == 1 && sub.last_seq(0) == 3U; });
    const KvPublisherCounters c = sub.counters(0);
    CHECK(c.duplicates == 1);
    CHECK(c.index_rejected == 0);
    CHECK(sub.index().block_count(W) == 4);  // 200..203
  }
  SECTION("without a replay socket: a small seq is a restart, a larger one a duplicate") {
    FakePublisher pub;
    ZmqKvSubscriber sub({{pub.endpoint(), "", W, ""}}, o);
    pub.wait_for_subscriber();
    apply_chain(pub, sub);
    pub.send_frames({"kv", seq_bytes(3), batch(1.3, 13, 12)});  // above restart_max_seq
    poll_until(sub, [&] { return messages(sub) == 6; });
    CHECK(sub.counters(0).duplicates == 1);
    CHECK(sub.counters(0).restarts == 0);
    pub.publish(0, batch(0.5, 300));  // the restarted engine, clock behind
    poll_until(sub, [&] { return sub.counters(0).restarts == 1; });
    CHECK(sub.last_seq(0) == 0U);
    CHECK(sub.index().block_count(W) == 1);
  }
}

TEST_CASE("a first batch other than seq 0 catches up from the replay buffer",
          "[zmq_kv_subscriber]") {
  FakePublisher pub;
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}});
  pub.wait_for_subscriber();
  pub.publish(0, batch(1.0, 10), true);
  pub.publish(1, batch(1.1, 11, 10), true);
  pub.publish(2, batch(1.2, 12, 11), false);
  poll_until(sub, [&] { return sub.last_seq(0) == 2U; });
  CHECK(sub.counters(0).gaps_recovered == 1);
  CHECK(sub.index().block_count(W) == 3);
}

TEST_CASE("dp rank mismatches are counted; the configured worker gets the events",
          "[zmq_kv_subscriber]") {
  FakePublisher pub;
  ZmqKvSubscriber sub({{pub.endpoint(), "", W, "kv"}});
  pub.wait_for_subscriber();
  pub.publish(0, batch(1.0, 10, 0, 5));
  poll_until(sub, [&] { return sub.last_seq(0) == 0U; });
  CHECK(sub.counters(0).dp_rank_mismatches == 1);
  CHECK(sub.index().block_count(W) == 1);
}

TEST_CASE("thread mode applies in the background; with_index reads under the lock",
          "[zmq_kv_subscriber]") {
  FakePublisher pub;
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}});
  pub.wait_for_subscriber();
  sub.start();
  CHECK(sub.running());
  CHECK_THROWS_AS(sub.poll(0ms), std::logic_error);
  for (std::uint64_t s = 0; s < 20; ++s)
    pub.publish(s, batch(1.0, 10 + s, s == 0 ? 0 : 9 + s), s == 7);
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (sub.with_index([](const promptcache::KvIndex& i) { return i.block_count(W); }) < 20) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::yield();
  }
  sub.stop();
  CHECK_FALSE(sub.running());
  CHECK(sub.thread_error() == nullptr);
  CHECK(sub.counters(0).gaps_recovered == 1);
  CHECK(sub.total_counters().batches_applied == 20);
}

TEST_CASE("with the thread, index reads are answered while a replay is awaited",
          "[zmq_kv_subscriber]") {
  FakePublisher pub;
  std::atomic<bool> read{false};
  // The replay answers only once the index was read (or after 10 s, well past
  // replay_timeout: a subscriber that holds the lock while it waits for the
  // reply gives the replay up first).
  pub.before_reply([&read](std::uint64_t) {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!read.load() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    return true;
  });
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}});
  pub.wait_for_subscriber();
  for (std::uint64_t s = 0; s < 3; ++s)
    pub.publish(s, batch(1.0, 10 + s, s == 0 ? 0 : 9 + s), true);
  sub.start();
  pub.publish(3, batch(1.3, 13, 12));
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (pub.requests.load() == 0) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::yield();
  }
  const std::size_t seen =
      sub.with_index([](const promptcache::KvIndex& i) { return i.block_count(W); });
  read.store(true);
  deadline = std::chrono::steady_clock::now() + 20s;
  while (sub.last_seq(0) != 3U) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::yield();
  }
  sub.stop();
  const KvPublisherCounters c = sub.counters(0);
  CHECK(seen == 0);
  CHECK(c.replay_timeouts == 0);
  CHECK(c.gaps_recovered == 1);
  CHECK(sub.index().block_count(W) == 4);
}

// A batch of `events` stored events of `per_event` blocks each, continuing the
// chain whose last block is `parent` (0: a new chain) with names from `first`.
std::string chain_batch(std::uint64_t first, std::uint64_t parent, std::uint32_t events,
                        std::uint32_t per_event) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_array(2);
  p.pack(1.0);
  p.pack_array(events);
  std::uint64_t name = first;
  for (std::uint32_t e = 0; e < events; ++e) {
    p.pack_array(5);
    p.pack(std::string("BlockStored"));
    p.pack_array(per_event);
    for (std::uint32_t b = 0; b < per_event; ++b)
      p.pack(name + b);
    if (parent != 0)
      p.pack(parent);
    else
      p.pack_nil();
    std::vector<std::uint32_t> tokens;
    for (std::uint32_t t = 0; t < 4 * per_event; ++t)
      tokens.push_back(static_cast<std::uint32_t>(name) + t);
    p.pack(tokens);
    p.pack(4);
    parent = name + per_event - 1;
    name += per_event;
  }
  return std::string(buf.data(), buf.size());
}

TEST_CASE("a catch-up applied in slices never shows half of an event", "[zmq_kv_subscriber]") {
  FakePublisher pub;
  promptcache::ZmqKvSubscriberOptions o;
  o.max_blocks_per_lock = 1;  // the lock is released between any two events
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}}, o);
  pub.wait_for_subscriber();
  constexpr std::uint64_t batches = 40;
  for (std::uint64_t s = 0; s < batches; ++s)
    pub.publish(s, chain_batch(1 + 12 * s, s == 0 ? 0 : 12 * s, 4, 3), s + 1 < batches);
  sub.start();
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  std::size_t reads = 0;
  for (;;) {
    const auto [blocks, ok] = sub.with_index([](const promptcache::KvIndex& i) {
      return std::pair<std::size_t, bool>(i.block_count(W), i.check_invariants());
    });
    ++reads;
    REQUIRE(ok);
    REQUIRE(blocks % 3 == 0);  // whole events only
    if (blocks == 12 * batches) break;
    REQUIRE(std::chrono::steady_clock::now() < deadline);
  }
  sub.stop();
  CHECK(sub.counters(0).index_rejected == 0);
  CHECK(sub.counters(0).gaps_recovered == 1);
  CHECK(reads >= 1);
}

TEST_CASE("a live seq of 2^64 - 1 (the replay's end marker) is a bad frame, not a batch",
          "[zmq_kv_subscriber]") {
  FakePublisher pub;
  promptcache::ZmqKvSubscriberOptions o;
  o.restart_max_seq = 2;  // a stream already past the restart bound
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}}, o);
  pub.wait_for_subscriber();
  apply_chain(pub, sub);
  pub.send_frames({"kv", seq_bytes(~std::uint64_t{0}), ""});
  for (std::uint64_t s = 5; s < 10; ++s)
    pub.publish(s, batch(1.0 + 0.1 * static_cast<double>(s), 10 + s, 9 + s));
  poll_until(sub, [&] { return messages(sub) == 11; });
  const KvPublisherCounters c = sub.counters(0);
  CHECK(sub.last_seq(0) == 9U);
  CHECK(sub.index().block_count(W) == 10);
  CHECK(c.bad_frames == 1);
  CHECK(c.gaps == 0);
  CHECK(c.duplicates == 0);
  CHECK(c.resets == 0);
  CHECK(pub.requests.load() == 0);
}

TEST_CASE("a huge live seq the publisher never sent is dropped once its replay ends below it",
          "[zmq_kv_subscriber]") {
  FakePublisher pub;
  promptcache::ZmqKvSubscriberOptions o;
  o.restart_max_seq = 2;
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}}, o);
  pub.wait_for_subscriber();
  apply_chain(pub, sub);

  // Alone: the replay returns only seq 4, the last one applied.
  pub.send_frames({"kv", seq_bytes(std::uint64_t{1} << 40), batch(9.0, 77)});
  poll_until(sub, [&] { return messages(sub) == 6; });
  CHECK(sub.counters(0).bad_frames == 1);
  CHECK(sub.last_seq(0) == 4U);

  // After a real loss: the replay fills seq 5, then the stray seq is dropped.
  pub.publish(5, batch(1.5, 15, 14), true);
  pub.send_frames({"kv", seq_bytes(~std::uint64_t{0} - 1U), batch(9.0, 78)});
  for (std::uint64_t s = 6; s < 10; ++s)
    pub.publish(s, batch(1.0 + 0.1 * static_cast<double>(s), 10 + s, 9 + s));
  poll_until(sub, [&] { return messages(sub) == 11; });
  const KvPublisherCounters c = sub.counters(0);
  CHECK(pub.requests.load() == 2);
  CHECK(sub.last_seq(0) == 9U);
  CHECK(sub.index().block_count(W) == 10);  // 10..19; neither 77 nor 78
  CHECK(c.bad_frames == 2);
  CHECK(c.batches_applied == 10);  // each of 0..9 once, 5 from the replay
  CHECK(c.duplicates == 0);
  CHECK(c.resets == 0);
  CHECK(c.gaps_unrecoverable == 0);
}

TEST_CASE("a restart whose first batches were lost is found by the replay of the last applied seq",
          "[zmq_kv_subscriber]") {
  FakePublisher pub;
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}});
  pub.wait_for_subscriber();
  pub.publish(0, batch(1.0, 100));
  pub.publish(1, batch(1.1, 101, 100));
  pub.publish(2, batch(1.2, 102, 101));
  poll_until(sub, [&] { return sub.last_seq(0) == 2U; });

  // A new process: seqs from 0 again, its first six batches lost.
  pub.clear_buffer();
  for (std::uint64_t s = 0; s < 5; ++s)
    pub.publish(s, batch(10.0 + static_cast<double>(s), 200 + s, s == 0 ? 0 : 199 + s), true);
  pub.publish(5, batch(15.0, 205, 204));
  poll_until(sub, [&] { return messages(sub) == 4; });
  const KvPublisherCounters c = sub.counters(0);
  CHECK(pub.requests.load() == 2);  // from seq 2, then from 0 once the restart is known
  CHECK(c.restarts == 1);
  CHECK(c.resets == 1);
  CHECK(c.gaps == 1);
  CHECK(c.gaps_recovered == 1);
  CHECK(c.index_rejected == 0);
  CHECK(sub.last_seq(0) == 5U);
  CHECK(sub.index().block_count(W) == 6);  // 200..205 only
  CHECK(sub.index().find_matches(std::vector<std::uint64_t>{100}).empty());
}

TEST_CASE("a replay buffer that no longer holds the last applied seq", "[zmq_kv_subscriber]") {
  FakePublisher pub;
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}});
  pub.wait_for_subscriber();
  for (std::uint64_t s = 0; s < 3; ++s)
    pub.publish(s, batch(1.0 + 0.1 * static_cast<double>(s), 10 + s));
  poll_until(sub, [&] { return sub.last_seq(0) == 2U; });

  SECTION("but still holds the next one: nothing was lost") {
    pub.publish(3, batch(1.3, 13), true);
    pub.evict_before(3);
    pub.publish(4, batch(1.4, 14));
    poll_until(sub, [&] { return sub.last_seq(0) == 4U; });
    const KvPublisherCounters c = sub.counters(0);
    CHECK(c.gaps_recovered == 1);
    CHECK(c.resets == 0);
    CHECK(c.restarts == 0);
    CHECK(sub.index().block_count(W) == 5);
  }
  SECTION("nor the next one: the view is reset (a long loss, or a restart past its buffer)") {
    pub.clear_buffer();
    for (std::uint64_t s = 0; s < 10; ++s)
      pub.publish(s, batch(10.0 + static_cast<double>(s), 200 + s), true);
    pub.evict_before(5);
    pub.publish(10, batch(20.0, 210));
    poll_until(sub, [&] { return sub.last_seq(0) == 10U; });
    const KvPublisherCounters c = sub.counters(0);
    CHECK(c.gaps_unrecoverable == 1);
    CHECK(c.resets == 1);
    CHECK(c.restarts == 0);
    CHECK(sub.index().block_count(W) == 6);  // 205..210: the oldest still buffered on
  }
}

TEST_CASE("a restart that loses exactly its first L + 1 batches looks contiguous (not detected)",
          "[zmq_kv_subscriber]") {
  // Documented limit: seq L + 1 follows L, so nothing asks the replay socket,
  // and the timestamp only moves forward, as it does after any idle spell.
  FakePublisher pub;
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}});
  pub.wait_for_subscriber();
  pub.publish(0, batch(1.0, 100));
  pub.publish(1, batch(1.1, 101, 100));
  poll_until(sub, [&] { return sub.last_seq(0) == 1U; });
  pub.clear_buffer();
  pub.publish(0, batch(10.0, 200), true);
  pub.publish(1, batch(11.0, 201, 200), true);
  pub.publish(2, batch(12.0, 202, 201));
  poll_until(sub, [&] { return sub.last_seq(0) == 2U; });
  const KvPublisherCounters c = sub.counters(0);
  CHECK(c.gaps == 0);
  CHECK(c.resets == 0);
  CHECK(c.index_rejected == 0);
  CHECK(sub.index().orphan_count(W) == 1);  // 202's parent is not held: kept as an orphan
  CHECK(sub.index().block_count(W) == 2);   // the old run's blocks stay
  CHECK(pub.requests.load() == 0);
}

TEST_CASE("an undecodable duplicate is counted once, as a duplicate", "[zmq_kv_subscriber]") {
  FakePublisher pub;
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}});
  pub.wait_for_subscriber();
  pub.publish(0, batch(1.0, 10));
  pub.publish(1, "\xc1 not msgpack");
  pub.publish(2, batch(1.2, 11, 10));
  poll_until(sub, [&] { return sub.last_seq(0) == 2U; });
  REQUIRE(sub.counters(0).malformed == 1);
  pub.send_frames({"kv", seq_bytes(1), "\xc1 not msgpack"});  // seq 1 again
  poll_until(sub, [&] { return messages(sub) == 4; });
  const KvPublisherCounters c = sub.counters(0);
  CHECK(c.duplicates == 1);
  CHECK(c.malformed == 1);
  CHECK(c.last_error == promptcache::KvWireErrc::invalid_msgpack);
  CHECK(c.restarts == 0);
}

TEST_CASE("max_messages_per_round = 0 is rejected", "[zmq_kv_subscriber]") {
  FakePublisher pub;
  promptcache::ZmqKvSubscriberOptions o;
  o.max_messages_per_round = 0;
  CHECK_THROWS_AS(ZmqKvSubscriber({{pub.endpoint(), pub.replay_endpoint(), W, ""}}, o),
                  std::invalid_argument);
  o.max_messages_per_round = 1;
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}}, o);
  pub.wait_for_subscriber();
  pub.publish(0, batch(1.0, 10));
  pub.publish(1, batch(1.1, 11, 10));
  poll_until(sub, [&] { return sub.last_seq(0) == 1U; });
  CHECK(sub.index().block_count(W) == 2);
}

TEST_CASE("a negative replay_timeout or receive_hwm is rejected", "[zmq_kv_subscriber]") {
  FakePublisher pub;
  promptcache::ZmqKvSubscriberOptions o;
  o.replay_timeout = -1ms;
  CHECK_THROWS_AS(ZmqKvSubscriber({{pub.endpoint(), pub.replay_endpoint(), W, ""}}, o),
                  std::invalid_argument);
  o.replay_timeout = 0ms;
  o.receive_hwm = -1;
  CHECK_THROWS_AS(ZmqKvSubscriber({{pub.endpoint(), pub.replay_endpoint(), W, ""}}, o),
                  std::invalid_argument);
  o.receive_hwm = 0;  // no limit
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}}, o);
  pub.wait_for_subscriber();
  pub.publish(0, batch(1.0, 10));
  poll_until(sub, [&] { return sub.last_seq(0) == 0U; });
  CHECK(sub.index().block_count(W) == 1);
}

TEST_CASE("replay_timeout bounds the silence between replies, not the whole replay",
          "[zmq_kv_subscriber]") {
  FakePublisher pub;
  promptcache::ManualClock clock;
  auto silent = std::make_shared<std::atomic<bool>>(false);
  promptcache::ZmqKvSubscriberOptions o;
  o.replay_timeout = 200ms;
  o.clock = silence_clock(clock, silent);
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}}, o);
  pub.wait_for_subscriber();
  pub.publish(0, batch(1.0, 10));
  poll_until(sub, [&] { return sub.last_seq(0) == 0U; });

  SECTION("a slow replay that keeps answering is read to its end") {
    // Each reply comes 120 ms after the one before: 720 ms in all.
    pub.before_reply([clock](std::uint64_t) {
      clock.advance(120ms);
      return true;
    });
    for (std::uint64_t s = 1; s < 4; ++s)
      pub.publish(s, batch(1.0 + 0.1 * static_cast<double>(s), 10 + s, 9 + s), true);
    pub.publish(4, batch(1.4, 14, 13));
    poll_until(sub, [&] { return sub.last_seq(0) == 4U; });
    const KvPublisherCounters c = sub.counters(0);
    CHECK(c.replay_timeouts == 0);
    CHECK(c.gaps_recovered == 1);
    CHECK(c.resets == 0);
    CHECK(sub.index().block_count(W) == 5);
  }
  SECTION("a replay that falls silent after filling the gap is a timeout, not a recovery") {
    pub.before_reply([clock, silent](std::uint64_t seq) {
      if (seq == ~std::uint64_t{0}) {
        silent->store(true);  // the end marker never comes
        return false;
      }
      clock.advance(120ms);
      return true;
    });
    pub.publish(1, batch(1.1, 11, 10), true);
    pub.publish(2, batch(1.2, 12, 11));
    poll_until(sub, [&] { return sub.counters(0).replay_timeouts == 1; });
    const KvPublisherCounters c = sub.counters(0);
    CHECK(c.gaps == 1);
    CHECK(c.gaps_recovered == 0);
    CHECK(c.gaps_unrecoverable == 0);
    CHECK(c.resets == 0);
    CHECK(sub.last_seq(0) == 2U);
    CHECK(sub.index().block_count(W) == 3);
  }
}

TEST_CASE("a thread ended by an exception is not running; start() begins anew",
          "[zmq_kv_subscriber]") {
  FakePublisher pub;
  auto fail = std::make_shared<std::atomic<bool>>(false);
  promptcache::ZmqKvSubscriberOptions o;
  o.clock = [fail] {
    if (fail->load()) throw std::runtime_error("clock failed");
    return std::chrono::steady_clock::now();
  };
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}}, o);
  pub.wait_for_subscriber();
  const auto blocks = [&] {
    return sub.with_index([](const promptcache::KvIndex& i) { return i.block_count(W); });
  };
  const auto wait = [](const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (!done()) {
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::yield();
    }
  };
  sub.start();
  pub.publish(0, batch(1.0, 10));
  wait([&] { return blocks() == 1; });
  fail->store(true);
  pub.publish(1, batch(1.1, 11, 10), true);
  pub.publish(2, batch(1.2, 12, 11));  // its gap's replay reads the clock
  wait([&] { return !sub.running(); });
  REQUIRE(sub.thread_error() != nullptr);
  CHECK_THROWS_WITH(std::rethrow_exception(sub.thread_error()), "clock failed");
  CHECK_NOTHROW(sub.poll(0ms));  // joins the ended thread

  fail->store(false);
  sub.start();
  CHECK(sub.running());
  CHECK(sub.thread_error() == nullptr);
  pub.publish(3, batch(1.3, 13, 12));  // a gap from 0: the replay brings 1 and 2
  wait([&] { return blocks() == 4; });
  sub.stop();
  CHECK_FALSE(sub.running());
  CHECK(sub.counters(0).gaps_recovered == 1);
}

namespace {

// vLLM's map layout: one event storing (or removing) block `name` in KV cache
// group `group`; a store names the group's kind unless `kind` is null (a
// removal never does).
std::string group_batch(double ts, bool stored, std::uint64_t name, std::uint64_t group,
                        const char* kind = "full_attention") {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_map(2);
  p.pack(std::string("ts"));
  p.pack(ts);
  p.pack(std::string("events"));
  p.pack_array(1);
  p.pack_map(stored ? (kind != nullptr ? 8U : 7U) : 4U);
  p.pack(std::string("type"));
  p.pack(std::string(stored ? "BlockStored" : "BlockRemoved"));
  p.pack(std::string("block_hashes"));
  p.pack(std::vector<std::uint64_t>{name});
  p.pack(std::string("medium"));
  p.pack(std::string("GPU"));
  p.pack(std::string("group_idx"));
  p.pack(group);
  if (stored) {
    p.pack(std::string("parent_block_hash"));
    p.pack_nil();
    p.pack(std::string("token_ids"));
    p.pack(std::vector<std::uint32_t>{1, 2, 3, 4});
    p.pack(std::string("block_size"));
    p.pack(4U);
    if (kind != nullptr) {
      p.pack(std::string("kv_cache_spec_kind"));
      p.pack(std::string(kind));
    }
  }
  return std::string(buf.data(), buf.size());
}

}  // namespace

TEST_CASE("removals in a main attention group other than group 0 apply; a restart forgets groups",
          "[zmq_kv_subscriber]") {
  // A hybrid model: group 0 is a sliding window, group 1 full attention.
  FakePublisher pub;
  promptcache::ZmqKvSubscriberOptions o;
  o.restart_max_seq = 4;
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}}, o);
  pub.wait_for_subscriber();
  pub.publish(0, group_batch(1.0, true, 7, 0, "sliding_window"));
  pub.publish(1, group_batch(1.1, true, 8, 1));
  poll_until(sub, [&] { return sub.last_seq(0) == 1U; });
  CHECK(sub.index().block_count(W) == 1);         // the window's block is not routed on
  pub.publish(2, group_batch(1.2, false, 7, 0));  // the window's removal: skipped
  pub.publish(3, group_batch(1.3, false, 8, 1));  // the main group's removal: applied
  poll_until(sub, [&] { return sub.last_seq(0) == 3U; });
  CHECK(sub.index().block_count(W) == 0);
  CHECK(sub.counters(0).ignored_events == 2);
  CHECK(sub.counters(0).index_rejected == 0);

  // The publisher restarts (its first batch is replayed). What the old process
  // taught is forgotten: a store in group 1 that names no kind follows the
  // stateless rule again (only group 0 is the main one) and is skipped.
  pub.clear_buffer();
  pub.publish(0, group_batch(5.0, true, 20, 0), true);
  pub.publish(1, group_batch(5.1, true, 21, 1, nullptr));
  poll_until(sub, [&] { return sub.counters(0).restarts == 1 && sub.last_seq(0) == 1U; });
  CHECK(sub.index().block_count(W) == 1);
  CHECK(sub.counters(0).ignored_events == 3);
  pub.publish(2, group_batch(5.2, false, 20, 0));
  poll_until(sub, [&] { return sub.last_seq(0) == 2U; });
  CHECK(sub.index().block_count(W) == 0);
}

TEST_CASE("a restart that lost more than restart_max_seq batches is found by the replay",
          "[zmq_kv_subscriber]") {
  FakePublisher pub;
  promptcache::ZmqKvSubscriberOptions o;
  o.restart_max_seq = 2;
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}}, o);
  pub.wait_for_subscriber();
  for (std::uint64_t s = 0; s < 6; ++s)
    pub.publish(s, batch(1.0 + 0.1 * static_cast<double>(s), 100 + s, s == 0 ? 0 : 99 + s));
  poll_until(sub, [&] { return sub.last_seq(0) == 5U; });

  // The engine restarts and its first 4 batches are lost: 4 is above the bound
  // and not above the last applied seq 5, so it is an old seq with a newer
  // timestamp, and the replay from 5 (other bytes, or none) tells.
  pub.clear_buffer();
  for (std::uint64_t s = 0; s < 4; ++s)
    pub.publish(s, batch(10.0 + static_cast<double>(s), 200 + s, s == 0 ? 0 : 199 + s), true);
  for (std::uint64_t s = 4; s < 9; ++s)
    pub.publish(s, batch(10.0 + static_cast<double>(s), 200 + s, 199 + s));
  poll_until(sub, [&] { return messages(sub) == 11 && sub.last_seq(0) == 8U; });
  const KvPublisherCounters c = sub.counters(0);
  CHECK(c.restarts == 1);
  CHECK(c.index_rejected == 0);
  CHECK(sub.index().block_count(W) == 9);  // the new run's blocks only
}

TEST_CASE("a stray seq after a real loss counts the gap its replay filled", "[zmq_kv_subscriber]") {
  FakePublisher pub;
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}});
  pub.wait_for_subscriber();
  apply_chain(pub, sub);
  pub.publish(5, batch(1.5, 15, 14), true);
  pub.send_frames({"kv", seq_bytes(std::uint64_t{1} << 40), batch(9.0, 77)});
  poll_until(sub, [&] { return messages(sub) == 6; });
  const KvPublisherCounters c = sub.counters(0);
  CHECK(sub.last_seq(0) == 5U);
  CHECK(c.bad_frames == 1);
  CHECK(c.gaps == 1);
  CHECK(c.gaps_recovered == 1);
  CHECK(c.gaps_unrecoverable == 0);
  CHECK(sub.index().block_count(W) == 6);
}

TEST_CASE("an unrecoverable gap keeps the attention groups learned", "[zmq_kv_subscriber]") {
  FakePublisher pub;
  ZmqKvSubscriber sub({{pub.endpoint(), "", W, ""}});  // no replay: a gap resets the view
  pub.wait_for_subscriber();
  pub.publish(0, group_batch(1.0, true, 7, 0, "sliding_window"));
  pub.publish(1, group_batch(1.1, true, 7, 1));
  poll_until(sub, [&] { return sub.last_seq(0) == 1U; });
  pub.publish(2, group_batch(1.2, true, 9, 1), true);  // lost
  pub.publish(3, group_batch(1.3, true, 8, 1));        // the gap resets the view
  pub.publish(4, group_batch(1.4, false, 8, 0));       // the window evicts its copy of 8
  poll_until(sub, [&] { return sub.last_seq(0) == 4U; });
  const KvPublisherCounters c = sub.counters(0);
  CHECK(c.resets == 1);
  CHECK(c.restarts == 0);
  CHECK(sub.index().block_count(W) == 1);  // the main group still holds 8
}

TEST_CASE("a silent replay socket is asked about an old seq once per applied batch",
          "[zmq_kv_subscriber]") {
  FakePublisher pub;
  promptcache::ManualClock clock;
  auto silent = std::make_shared<std::atomic<bool>>(false);
  promptcache::ZmqKvSubscriberOptions o;
  o.restart_max_seq = 2;
  o.remembered_batches = 0;  // the replay socket is the only evidence
  o.replay_timeout = 200ms;
  o.clock = silence_clock(clock, silent);
  ZmqKvSubscriber sub({{pub.endpoint(), pub.replay_endpoint(), W, ""}}, o);
  pub.wait_for_subscriber();
  apply_chain(pub, sub);
  silent->store(true);
  pub.before_reply([](std::uint64_t) { return false; });
  // Old seqs above the bound with other bytes (a restarted engine whose
  // replay socket does not answer): the first asks and times out, the rest
  // get the same answer at once; above the bound, no answer is a duplicate.
  for (std::uint64_t s = 3; s < 5; ++s)
    pub.send_frames({"kv", seq_bytes(s), batch(10.0 + static_cast<double>(s), 200 + s)});
  poll_until(sub, [&] { return messages(sub) == 7; });
  KvPublisherCounters c = sub.counters(0);
  CHECK(pub.requests.load() == 1);
  CHECK(c.replay_timeouts == 1);
  CHECK(c.duplicates == 2);
  CHECK(c.restarts == 0);
  CHECK(c.gaps == 0);
  CHECK(sub.index().block_count(W) == 5);

  // Once the cursor moves, the question is asked again.
  silent->store(false);
  pub.before_reply(nullptr);
  pub.publish(5, batch(1.5, 15, 14));
  poll_until(sub, [&] { return sub.last_seq(0) == 5U; });
  pub.send_frames({"kv", seq_bytes(4), batch(20.0, 300)});
  poll_until(sub, [&] { return messages(sub) == 9; });
  c = sub.counters(0);
  CHECK(pub.requests.load() == 2);
  CHECK(c.duplicates == 3);  // the replay returned the bytes applied as 5
  CHECK(c.restarts == 0);
}
