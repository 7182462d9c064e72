// nats_kv_subscriber.hpp against a real nats-server (started here on
// loopback with a free port and a temporary store directory, stopped by its
// pid at the end of each case, also when the case fails): stored, removed and
// cleared batches through the server equal a direct apply; a lost batch is
// replayed over request-reply; a replay nobody answers resets; a restarted
// publisher (seq back to 0) is a reset; a restarted subscriber catches up
// from the replay buffer; and a server killed (SIGKILL) mid-stream and
// started again: both sides reconnect and the subscriber recovers exactly.
// Every wait is a poll with a timeout, bounded by a number of rounds.
#include <promptcache/nats_kv_subscriber.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "catch.hpp"
#include "support/kv_wire_views.hpp"
#include "support/nats_server.hpp"

using promptcache::KvEventWireDecoder;
using promptcache::KvIndex;
using promptcache::KvPublisherCounters;
using promptcache::KvWireBatch;
using promptcache::KvWireStreamState;
using promptcache::KvWorker;
using promptcache::NatsKvPublisher;
using promptcache::NatsKvPublisherOptions;
using promptcache::NatsKvSubscriber;
using promptcache::NatsKvSubscriberOptions;
using namespace std::chrono_literals;

namespace {

using NatsServer = promptcache_test::NatsServerProcess;
using promptcache_test::apply_direct;
using promptcache_test::require_same;

// ---- batches (vLLM KVEventBatch, array layout) ----

// [ts, events, data_parallel_rank]: the events follow, then finish().
void pack_header(msgpack::packer<msgpack::sbuffer>& p, std::size_t events) {
  p.pack_array(3);
  p.pack(1.5);
  p.pack_array(static_cast<std::uint32_t>(events));
}

std::string finish(msgpack::sbuffer& buf, msgpack::packer<msgpack::sbuffer>& p) {
  p.pack_nil();
  return std::string(buf.data(), buf.size());
}

// A batch storing the chain `names` (each block's tokens derived from its
// name) under `parent` (0: a root).
std::string stored(std::vector<std::uint64_t> names, std::uint64_t parent = 0) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  pack_header(p, 1);
  p.pack_array(8);
  p.pack(std::string("BlockStored"));
  p.pack(names);
  if (parent != 0)
    p.pack(parent);
  else
    p.pack_nil();
  std::vector<std::uint32_t> tokens;
  for (const std::uint64_t n : names)
    for (std::uint32_t i = 0; i < 4; ++i)
      tokens.push_back(static_cast<std::uint32_t>(n * 4 + i));
  p.pack(tokens);
  p.pack(4);
  p.pack_nil();
  p.pack(std::string("GPU"));
  p.pack_nil();
  return finish(buf, p);
}

std::string removed(std::vector<std::uint64_t> names) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  pack_header(p, 1);
  p.pack_array(3);
  p.pack(std::string("BlockRemoved"));
  p.pack(names);
  p.pack(std::string("GPU"));
  return finish(buf, p);
}

std::string cleared() {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  pack_header(p, 1);
  p.pack_array(1);
  p.pack(std::string("AllBlocksCleared"));
  return finish(buf, p);
}

// A stream of batches with stores, removals and a clear, names offset by `base`.
std::vector<std::string> mixed_stream(std::uint64_t base) {
  return {stored({base + 1, base + 2, base + 3}),
          stored({base + 4}, base + 3),
          removed({base + 4}),
          stored({base + 5, base + 6}, base + 2),
          cleared(),
          stored({base + 7, base + 8}),
          removed({base + 8}),
          stored({base + 9}, base + 7)};
}

// An index with the subscriber's default options: chains under a parent it
// never saw are kept as orphan chains.
KvIndex subscriber_index() {
  return KvIndex(
      promptcache::KvIndexOptions{.on_gap = promptcache::KvGapPolicy::report,
                                  .on_unknown_parent = promptcache::KvUnknownParent::keep_orphan});
}

NatsKvSubscriberOptions sub_options(const NatsServer& server) {
  NatsKvSubscriberOptions o;
  o.connection.url = server.url();
  o.connection.reconnect_wait = 10ms;
  o.prefix = promptcache::dynamo_kv_events_subject("test", "backend");
  return o;
}

NatsKvPublisherOptions pub_options(const NatsServer& server, KvWorker worker) {
  NatsKvPublisherOptions o;
  o.connection.url = server.url();
  o.connection.reconnect_wait = 10ms;
  o.prefix = promptcache::dynamo_kv_events_subject("test", "backend");
  o.worker = worker;
  return o;
}

// Polls until `done` (at most `rounds` rounds of up to 10 ms each).
bool poll_until(NatsKvSubscriber& sub, const std::function<bool()>& done, int rounds = 500) {
  for (int i = 0; i < rounds; ++i) {
    if (done()) return true;
    sub.poll(10ms);
  }
  return done();
}

bool reached(NatsKvSubscriber& sub, const KvWorker& w, std::uint64_t seq) {
  return poll_until(sub, [&] { return sub.last_seq(w) == seq; });
}

}  // namespace

TEST_CASE("nats: stored, removed and cleared through nats-server equal a direct apply", "[nats]") {
  NatsServer server;
  NatsKvSubscriber sub(sub_options(server));
  const std::vector<KvWorker> workers = {{7, 0}, {7, 1}, {9, 0}};
  std::vector<std::unique_ptr<NatsKvPublisher>> pubs;
  for (const auto& w : workers)
    pubs.push_back(std::make_unique<NatsKvPublisher>(pub_options(server, w)));
  CHECK(pubs[0]->subject() == "namespace.test.component.backend.kv-events.7");
  CHECK(pubs[0]->replay_subject() == "namespace.test.component.backend.kv-events.7.replay");

  KvIndex want = subscriber_index();
  for (std::size_t i = 0; i < workers.size(); ++i) {
    const auto batches = mixed_stream(100 * (i + 1));
    for (std::size_t s = 0; s < batches.size(); ++s)
      REQUIRE(pubs[i]->publish(s, batches[s]));
    apply_direct(want, workers[i], batches);
  }
  for (const auto& w : workers)
    REQUIRE(reached(sub, w, 7));
  require_same(sub.index(), want);
  const KvPublisherCounters c = sub.total_counters();
  CHECK(c.batches_applied == 24);
  CHECK(c.gaps == 0);
  CHECK(c.malformed == 0);
  CHECK(c.index_rejected == 0);
  CHECK(c.resets == 0);
  CHECK(sub.streams().size() == 3);
  CHECK(sub.transport_counters().messages == 24);
}

TEST_CASE("nats: a lost batch is replayed over request-reply", "[nats]") {
  NatsServer server;
  NatsKvSubscriber sub(sub_options(server));
  const KvWorker w{5, 0};
  NatsKvPublisher pub(pub_options(server, w));
  const auto batches = mixed_stream(0);
  for (std::size_t s = 0; s < batches.size(); ++s) {
    if (s == 2 || s == 3)
      pub.remember(s, batches[s]);  // never reaches the server
    else
      REQUIRE(pub.publish(s, batches[s]));
  }
  REQUIRE(reached(sub, w, 7));
  KvIndex want = subscriber_index();
  apply_direct(want, w, batches);
  require_same(sub.index(), want);
  const KvPublisherCounters c = sub.counters(w);
  CHECK(c.gaps == 1);
  CHECK(c.gaps_recovered == 1);
  CHECK(c.batches_applied == 8);
  // The answer brings every buffered batch after the last applied one: the
  // live copies of those published before it are not applied twice.
  CHECK(c.batches_replayed >= 2);
  CHECK(c.duplicates == 0);
  CHECK(c.resets == 0);
  CHECK(pub.counters().replay_requests == 1);
}

TEST_CASE("nats: a worker list limits the subjects; only the lost rank's publisher answers",
          "[nats]") {
  NatsServer server;
  auto so = sub_options(server);
  so.workers = {7};
  NatsKvSubscriber sub(so);
  NatsKvPublisher rank0(pub_options(server, KvWorker{7, 0}));
  NatsKvPublisher rank1(pub_options(server, KvWorker{7, 1}));
  NatsKvPublisher other(pub_options(server, KvWorker{8, 0}));
  const auto a = mixed_stream(0);
  const auto b = mixed_stream(1000);
  for (std::size_t s = 0; s < a.size(); ++s) {
    REQUIRE(rank0.publish(s, a[s]));
    if (s == 1)
      rank1.remember(s, b[s]);
    else
      REQUIRE(rank1.publish(s, b[s]));
    REQUIRE(other.publish(s, a[s]));
  }
  REQUIRE(reached(sub, KvWorker{7, 0}, 7));
  REQUIRE(reached(sub, KvWorker{7, 1}, 7));
  KvIndex want = subscriber_index();
  apply_direct(want, KvWorker{7, 0}, a);
  apply_direct(want, KvWorker{7, 1}, b);
  require_same(sub.index(), want);
  CHECK(sub.streams().size() == 2);
  CHECK(sub.counters(KvWorker{7, 1}).gaps_recovered == 1);
  CHECK(rank1.counters().replay_requests == 1);
  CHECK(rank0.counters().replay_requests == 0);
}

TEST_CASE("nats: a replay buffer that no longer reaches the gap resets the view", "[nats]") {
  NatsServer server;
  NatsKvSubscriber sub(sub_options(server));
  const KvWorker w{5, 0};
  auto po = pub_options(server, w);
  po.buffer_batches = 2;
  NatsKvPublisher pub(po);
  std::vector<std::string> batches;
  for (std::uint64_t i = 0; i < 8; ++i)
    batches.push_back(i == 0 ? stored({1}) : stored({i + 1}, i));
  REQUIRE(pub.publish(0, batches[0]));
  REQUIRE(reached(sub, w, 0));
  for (std::size_t s = 1; s < 6; ++s)
    pub.remember(s, batches[s]);        // lost
  REQUIRE(pub.publish(6, batches[6]));  // the buffer keeps 5 and 6 only
  REQUIRE(reached(sub, w, 6));
  const KvPublisherCounters c = sub.counters(w);
  CHECK(c.gaps == 1);
  CHECK(c.gaps_unrecoverable == 1);
  CHECK(c.resets == 1);
  // The view starts over from the oldest batch still buffered; its chain,
  // stored under a parent the view never saw, is kept as an orphan chain.
  KvIndex want = subscriber_index();
  apply_direct(want, w, {batches[5], batches[6]});
  require_same(sub.index(), want);
  CHECK(sub.index().orphan_count(w) == 2);
  CHECK(sub.index().block_hashes(w) == std::vector<std::uint64_t>{6, 7});
}

TEST_CASE("nats: a late subscriber routes to a worker once it stores a block extending a prefix",
          "[nats]") {
  NatsServer server;
  const KvWorker w{8, 0};
  auto po = pub_options(server, w);
  po.buffer_batches = 0;  // the history is gone for a late joiner
  NatsKvPublisher pub(po);
  // The engine stores blocks 1..6 (a shared system prompt) before the router starts.
  REQUIRE(pub.publish(0, stored({1, 2, 3, 4, 5, 6})));
  REQUIRE(pub.flush(2000ms));
  NatsKvSubscriber sub(sub_options(server));
  // Then a request extends the prefix by two blocks.
  REQUIRE(pub.publish(1, stored({7, 8}, 6)));
  REQUIRE(reached(sub, w, 1));
  CHECK(sub.index().orphan_count(w) == 2);
  CHECK(sub.counters(w).index_rejected == 0);
  // A request naming blocks 1..8 (block names are chained: holding block 8
  // implies holding its prefix) is routed to the worker for all 8.
  const std::vector<std::uint64_t> names = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<std::uint64_t> tokens;
  for (const std::uint64_t n : names) {
    std::vector<std::uint32_t> t;
    for (std::uint32_t i = 0; i < 4; ++i)
      t.push_back(static_cast<std::uint32_t>(n * 4 + i));
    tokens.push_back(promptcache::local_block_hashes(t, 4).front());
  }
  const auto m = sub.index().find_matches(tokens, names);
  REQUIRE(m.size() == 1);
  CHECK(m[0].worker == w);
  CHECK(m[0].blocks == 8);
}

TEST_CASE("nats: a replay nobody answers resets the view", "[nats]") {
  NatsServer server;
  NatsKvSubscriber sub(sub_options(server));
  const KvWorker w{5, 0};
  auto po = pub_options(server, w);
  po.answer_replays = false;
  NatsKvPublisher pub(po);
  const auto batches = mixed_stream(0);
  REQUIRE(pub.publish(0, batches[0]));
  REQUIRE(pub.publish(1, batches[1]));
  REQUIRE(reached(sub, w, 1));
  REQUIRE(pub.publish(3, batches[3]));  // 2 is lost
  REQUIRE(reached(sub, w, 3));
  const KvPublisherCounters c = sub.counters(w);
  CHECK(c.gaps == 1);
  CHECK(c.gaps_unrecoverable == 1);
  CHECK(c.replay_timeouts == 1);
  CHECK(c.resets == 1);
  // The view starts over from batch 3.
  KvIndex want = subscriber_index();
  apply_direct(want, w, {batches[3]});
  require_same(sub.index(), want);
}

TEST_CASE("nats: a publisher restart (seq back to 0) is a reset", "[nats]") {
  NatsServer server;
  NatsKvSubscriber sub(sub_options(server));
  const KvWorker w{11, 2};
  const auto first = mixed_stream(0);
  {
    NatsKvPublisher pub(pub_options(server, w));
    for (std::size_t s = 0; s < 4; ++s)
      REQUIRE(pub.publish(s, first[s]));
    REQUIRE(reached(sub, w, 3));
  }
  const auto second = mixed_stream(500);
  NatsKvPublisher pub(pub_options(server, w));
  for (std::size_t s = 0; s < 3; ++s)
    REQUIRE(pub.publish(s, second[s]));
  REQUIRE(poll_until(sub, [&] { return sub.counters(w).batches_applied == 7; }));
  CHECK(sub.last_seq(w) == 2);
  KvIndex want = subscriber_index();
  apply_direct(want, w, {second.begin(), second.begin() + 3});
  require_same(sub.index(), want);
  const KvPublisherCounters c = sub.counters(w);
  CHECK(c.restarts == 1);
  CHECK(c.resets == 1);
  CHECK(c.duplicates == 0);
}

TEST_CASE("nats: a restarted subscriber catches up from the replay buffer", "[nats]") {
  NatsServer server;
  const KvWorker w{3, 0};
  NatsKvPublisher pub(pub_options(server, w));
  const auto batches = mixed_stream(0);
  {
    NatsKvSubscriber sub(sub_options(server));
    for (std::size_t s = 0; s < 4; ++s)
      REQUIRE(pub.publish(s, batches[s]));
    REQUIRE(reached(sub, w, 3));
  }
  for (std::size_t s = 4; s < 7; ++s)
    REQUIRE(pub.publish(s, batches[s]));  // nobody listens
  REQUIRE(pub.flush(2000ms));
  NatsKvSubscriber sub(sub_options(server));
  REQUIRE(pub.publish(7, batches[7]));
  REQUIRE(reached(sub, w, 7));
  KvIndex want = subscriber_index();
  apply_direct(want, w, batches);
  require_same(sub.index(), want);
  const KvPublisherCounters c = sub.counters(w);
  CHECK(c.gaps == 1);
  CHECK(c.gaps_recovered == 1);
  CHECK(c.batches_applied == 8);
  CHECK(c.batches_replayed >= 7);
  CHECK(c.resets == 0);
}

TEST_CASE("nats: a server killed mid-stream and restarted: reconnect and exact recovery",
          "[nats]") {
  NatsServer server;
  NatsKvSubscriber sub(sub_options(server));
  const KvWorker w{21, 0};
  NatsKvPublisher pub(pub_options(server, w));
  std::vector<std::string> batches;
  for (std::uint64_t i = 0; i < 30; ++i)
    batches.push_back(i == 0 ? stored({1}) : stored({i + 1}, i));
  for (std::size_t s = 0; s < 10; ++s)
    REQUIRE(pub.publish(s, batches[s]));
  REQUIRE(reached(sub, w, 9));

  server.kill_now();
  // Published while the server is away: kept in libnats's reconnect buffer
  // (and in the replay buffer), delivered or replayed once it is back.
  for (std::size_t s = 10; s < 20; ++s)
    (void)pub.publish(s, batches[s]);
  server.start();
  // The reconnected callback runs on libnats's callback thread, after the
  // status already reads connected.
  REQUIRE(poll_until(sub, [&] {
    return sub.connected() && pub.connected() && sub.transport_counters().reconnects >= 1;
  }));
  // The replay subscription is known to the server again.
  REQUIRE(pub.flush(2000ms));
  // So is the subscriber's, sent again on its own connection: nothing orders it
  // before the publisher's next messages, which the server would drop unrouted
  // (with nothing published after them, no gap would ever show). A probe that
  // reaches the subscriber was routed after its subscription was in place.
  natsConnection* nc = nullptr;
  REQUIRE(natsConnection_ConnectTo(&nc, server.url().c_str()) == NATS_OK);
  const std::string probe = promptcache::dynamo_kv_events_subject("test", "backend") + ".probe";
  const std::uint64_t unidentified = sub.transport_counters().unidentified;
  REQUIRE(poll_until(sub, [&] {
    if (sub.transport_counters().unidentified > unidentified) return true;
    (void)natsConnection_PublishString(nc, probe.c_str(), "x");
    (void)natsConnection_Flush(nc);
    return false;
  }));
  natsConnection_Destroy(nc);
  for (std::size_t s = 20; s < 30; ++s)
    REQUIRE(pub.publish(s, batches[s]));
  REQUIRE(reached(sub, w, 29));

  KvIndex want = subscriber_index();
  apply_direct(want, w, batches);
  require_same(sub.index(), want);
  const KvPublisherCounters c = sub.counters(w);
  UNSCOPED_INFO("gaps " << c.gaps << ", replayed " << c.batches_replayed);
  CHECK(c.resets == 0);
  CHECK(c.gaps == c.gaps_recovered);
  CHECK(c.batches_applied == 30);
  CHECK(c.index_rejected == 0);
  CHECK(sub.transport_counters().disconnects >= 1);
}

TEST_CASE("nats: messages the decoder cannot place, and bad options", "[nats]") {
  NatsServer server;
  NatsKvSubscriber sub(sub_options(server));
  natsConnection* nc = nullptr;
  REQUIRE(natsConnection_ConnectTo(&nc, server.url().c_str()) == NATS_OK);
  const std::string prefix = promptcache::dynamo_kv_events_subject("test", "backend");
  // No Kv-Seq header; a worker token that is not a number.
  REQUIRE(natsConnection_PublishString(nc, (prefix + ".4").c_str(), "x") == NATS_OK);
  REQUIRE(natsConnection_PublishString(nc, (prefix + ".abc").c_str(), "x") == NATS_OK);
  REQUIRE(natsConnection_Flush(nc) == NATS_OK);
  REQUIRE(poll_until(sub, [&] { return sub.transport_counters().messages == 2; }));
  CHECK(sub.transport_counters().unidentified == 2);
  CHECK(sub.streams().empty());
  CHECK(sub.index().worker_count() == 0);

  // A live seq equal to the replay's end marker is never a batch.
  natsMsg* m = nullptr;
  REQUIRE(natsMsg_Create(&m, (prefix + ".4").c_str(), nullptr, "x", 1) == NATS_OK);
  REQUIRE(natsMsgHeader_Set(m, promptcache::nats_kv_seq_header, "18446744073709551615") == NATS_OK);
  REQUIRE(natsConnection_PublishMsg(nc, m) == NATS_OK);
  natsMsg_Destroy(m);
  REQUIRE(poll_until(sub, [&] { return sub.transport_counters().messages == 3; }));
  CHECK(sub.counters(KvWorker{4, 0}).bad_frames == 1);
  CHECK(sub.last_seq(KvWorker{4, 0}) == std::nullopt);

  // A replay request of the wrong size is not answered.
  NatsKvPublisher pub(pub_options(server, KvWorker{4, 0}));
  natsMsg* reply = nullptr;
  CHECK(natsConnection_Request(&reply, nc, pub.replay_subject().c_str(), "abc", 3, 200) ==
        NATS_TIMEOUT);
  CHECK(pub.counters().bad_requests == 1);
  natsConnection_Destroy(nc);

  auto o = sub_options(server);
  o.prefix = "a.*.b";
  CHECK_THROWS_AS(NatsKvSubscriber(o), std::invalid_argument);
  o.prefix = "";
  CHECK_THROWS_AS(NatsKvSubscriber(o), std::invalid_argument);
  o.prefix = "a..b";
  CHECK_THROWS_AS(NatsKvSubscriber(o), std::invalid_argument);
  o = sub_options(server);
  o.max_messages_per_round = 0;
  CHECK_THROWS_AS(NatsKvSubscriber(o), std::invalid_argument);
  o = sub_options(server);
  o.max_pending = 0;
  CHECK_THROWS_AS(NatsKvSubscriber(o), std::invalid_argument);
  o = sub_options(server);
  o.replay_timeout = -1ms;
  CHECK_THROWS_AS(NatsKvSubscriber(o), std::invalid_argument);
  o = sub_options(server);
  o.connection.url = "nats://127.0.0.1:1";
  o.connection.connect_timeout = 200ms;
  CHECK_THROWS_AS(NatsKvSubscriber(o), promptcache::NatsKvError);
}

TEST_CASE("nats jetstream: a durable subscriber restarted resumes where it acknowledged",
          "[nats]") {
  NatsServer server;
  const KvWorker w{3, 0};
  NatsKvPublisher pub(pub_options(server, w));
  auto so = sub_options(server);
  so.jetstream.stream = "KV_EVENTS";
  so.jetstream.durable = "router";
  const auto batches = mixed_stream(0);
  {
    NatsKvSubscriber sub(so);
    for (std::size_t s = 0; s < 4; ++s)
      REQUIRE(pub.publish(s, batches[s]));
    REQUIRE(reached(sub, w, 3));
    CHECK(sub.counters(w).messages == 4);
  }
  for (std::size_t s = 4; s < 8; ++s)
    REQUIRE(pub.publish(s, batches[s]));  // kept by the stream meanwhile
  REQUIRE(pub.flush(2000ms));
  NatsKvSubscriber sub(so);
  REQUIRE(reached(sub, w, 7));
  // Only the batches not acknowledged were delivered; the ones the new
  // index lacks (0 to 3) came from the publisher's replay.
  const KvPublisherCounters c = sub.counters(w);
  CHECK(c.messages == 4);
  CHECK(c.gaps == 1);
  CHECK(c.gaps_recovered == 1);
  CHECK(c.resets == 0);
  CHECK(c.batches_applied == 8);
  KvIndex want = subscriber_index();
  apply_direct(want, w, batches);
  require_same(sub.index(), want);
}

TEST_CASE("nats jetstream: a server killed and restarted keeps the stream and the consumer",
          "[nats]") {
  NatsServer server;
  const KvWorker w{21, 0};
  NatsKvPublisher pub(pub_options(server, w));
  auto so = sub_options(server);
  so.jetstream.stream = "KV_EVENTS";
  so.jetstream.durable = "router";
  NatsKvSubscriber sub(so);
  std::vector<std::string> batches;
  for (std::uint64_t i = 0; i < 30; ++i)
    batches.push_back(i == 0 ? stored({1}) : stored({i + 1}, i));
  for (std::size_t s = 0; s < 10; ++s)
    REQUIRE(pub.publish(s, batches[s]));
  REQUIRE(reached(sub, w, 9));
  server.kill_now();
  for (std::size_t s = 10; s < 20; ++s)
    (void)pub.publish(s, batches[s]);
  server.start();
  REQUIRE(poll_until(sub, [&] {
    return sub.connected() && pub.connected() && sub.transport_counters().reconnects >= 1;
  }));
  REQUIRE(pub.flush(2000ms));
  for (std::size_t s = 20; s < 30; ++s)
    REQUIRE(pub.publish(s, batches[s]));
  REQUIRE(reached(sub, w, 29));
  KvIndex want = subscriber_index();
  apply_direct(want, w, batches);
  require_same(sub.index(), want);
  const KvPublisherCounters c = sub.counters(w);
  CHECK(c.resets == 0);
  CHECK(c.gaps == c.gaps_recovered);
  CHECK(c.batches_applied == 30);
}

TEST_CASE("nats jetstream: bad options", "[nats]") {
  NatsServer server;
  auto o = sub_options(server);
  o.jetstream.stream = "KV_EVENTS";
  CHECK_THROWS_AS(NatsKvSubscriber(o), std::invalid_argument);  // no durable name
  o.jetstream.durable = "a.b";
  CHECK_THROWS_AS(NatsKvSubscriber(o), std::invalid_argument);
  o.jetstream.durable = "router";
  o.workers = {1, 2};
  CHECK_THROWS_AS(NatsKvSubscriber(o), std::invalid_argument);
  o.workers = {};
  o.jetstream.ack_wait = 0ms;
  CHECK_THROWS_AS(NatsKvSubscriber(o), std::invalid_argument);
}

namespace {

// A codec whose messages name their stream in the payload, as Dynamo's
// RouterEvent does: [worker id, dp rank, seq] (8 + 4 + 8 bytes, big-endian),
// then a KVEventBatch.
class NamedStreamDecoder final : public promptcache::NatsKvDecoder {
 public:
  std::optional<promptcache::NatsKvBatchId> identify(
      const promptcache::NatsKvEnvelope& m) override {
    if (m.payload.size() < 20) return std::nullopt;
    const auto u = [&](std::size_t at, std::size_t n) {
      std::uint64_t v = 0;
      for (std::size_t i = 0; i < n; ++i)
        v = (v << 8) | static_cast<std::uint8_t>(m.payload[at + i]);
      return v;
    };
    return promptcache::NatsKvBatchId{KvWorker{u(0, 8), static_cast<std::uint32_t>(u(8, 4))},
                                      u(12, 8)};
  }
  promptcache::KvWireStatus decode(std::span<const std::byte> payload, KvWireBatch& out,
                                   KvWireStreamState& state) override {
    return decoder_.decode(payload.subspan(20), out, state);
  }

 private:
  KvEventWireDecoder decoder_;
};

std::string named(const KvWorker& w, std::uint64_t seq, const std::string& batch) {
  std::string s;
  for (int i = 7; i >= 0; --i)
    s.push_back(static_cast<char>((w.worker_id >> (8 * i)) & 0xffU));
  for (int i = 3; i >= 0; --i)
    s.push_back(static_cast<char>((w.dp_rank >> (8 * i)) & 0xffU));
  for (int i = 7; i >= 0; --i)
    s.push_back(static_cast<char>((seq >> (8 * i)) & 0xffU));
  return s + batch;
}

}  // namespace

TEST_CASE("nats: a decoder that names the stream in the payload, on one shared subject", "[nats]") {
  NatsServer server;
  auto o = sub_options(server);
  o.subjects = {o.prefix};  // every worker on the prefix itself, as Dynamo publishes
  o.decoder = std::make_shared<NamedStreamDecoder>();
  o.replay = false;
  NatsKvSubscriber sub(o);
  natsConnection* nc = nullptr;
  REQUIRE(natsConnection_ConnectTo(&nc, server.url().c_str()) == NATS_OK);
  const auto a = mixed_stream(0);
  const auto b = mixed_stream(700);
  const KvWorker wa{40, 0};
  const KvWorker wb{41, 3};
  for (std::size_t s = 0; s < a.size(); ++s) {
    const std::string ma = named(wa, s, a[s]);
    const std::string mb = named(wb, s, b[s]);
    REQUIRE(natsConnection_Publish(nc, o.prefix.c_str(), ma.data(), static_cast<int>(ma.size())) ==
            NATS_OK);
    REQUIRE(natsConnection_Publish(nc, o.prefix.c_str(), mb.data(), static_cast<int>(mb.size())) ==
            NATS_OK);
  }
  REQUIRE(natsConnection_Flush(nc) == NATS_OK);
  natsConnection_Destroy(nc);
  REQUIRE(reached(sub, wa, 7));
  REQUIRE(reached(sub, wb, 7));
  KvIndex want = subscriber_index();
  apply_direct(want, wa, a);
  apply_direct(want, wb, b);
  require_same(sub.index(), want);
  CHECK(sub.total_counters().gaps == 0);
}
