// nats_kv_snapshot_store.hpp against a real nats-server (tests/support/
// nats_server.hpp: loopback, a free port, a temporary store, killed by pid):
// a replica joining from the latest snapshot ends with the index of one that
// read the whole stream, reading only the messages after the snapshot;
// messages at or below the snapshot's sequence are not applied twice; a
// corrupt or truncated snapshot falls back to the stream's first message; a
// snapshot the stream was purged past is restored and the gap filled by the
// publishers; the purge never passes a live replica or the latest snapshot,
// and a stale replica does not hold it back. Every wait is a poll with a
// timeout, bounded by a number of rounds; time is an injected clock.
#include <promptcache/nats_kv_snapshot_store.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "support/kv_wire_views.hpp"
#include "support/nats_server.hpp"

using NatsServer = promptcache_test::NatsServerProcess;
using promptcache::KvIndex;
using promptcache::KvPublisherCounters;
using promptcache::KvSnapshotErrc;
using promptcache::KvWorker;
using promptcache::NatsKvJoinReport;
using promptcache::NatsKvJoinStart;
using promptcache::NatsKvPublisher;
using promptcache::NatsKvPublisherOptions;
using promptcache::NatsKvSnapshotFound;
using promptcache::NatsKvSnapshotStore;
using promptcache::NatsKvSnapshotStoreOptions;
using promptcache::NatsKvSubscriber;
using promptcache::NatsKvSubscriberOptions;
using promptcache_test::apply_direct;
using promptcache_test::require_same;
using namespace std::chrono_literals;

namespace {

const char* const stream_name = "KV_EVENTS";

// [ts, [event], dp rank nil]: a vLLM KVEventBatch of one event.
std::string batch_of(const std::function<void(msgpack::packer<msgpack::sbuffer>&)>& event) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_array(3);
  p.pack(1.5);
  p.pack_array(1);
  event(p);
  p.pack_nil();
  return std::string(buf.data(), buf.size());
}

std::string stored(std::vector<std::uint64_t> names, std::uint64_t parent = 0) {
  return batch_of([&](msgpack::packer<msgpack::sbuffer>& p) {
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
  });
}

std::string removed(std::vector<std::uint64_t> names) {
  return batch_of([&](msgpack::packer<msgpack::sbuffer>& p) {
    p.pack_array(3);
    p.pack(std::string("BlockRemoved"));
    p.pack(names);
    p.pack(std::string("GPU"));
  });
}

// `n` batches of one worker, names offset by `base`: chains of two blocks,
// some extended, every fourth batch removing an earlier block.
std::vector<std::string> worker_stream(std::uint64_t base, std::size_t n) {
  std::vector<std::string> out;
  for (std::uint64_t i = 0; i < n; ++i) {
    if (i % 4 == 3)
      out.push_back(removed({base + 2 * (i - 1) + 2}));
    else if (i % 4 == 1)
      out.push_back(stored({base + 2 * i + 1}, base + 2 * (i - 1) + 2));
    else
      out.push_back(stored({base + 2 * i + 1, base + 2 * i + 2}));
  }
  return out;
}

// `n` batches of `events` stored chains of two blocks each, names from `base`.
std::vector<std::string> multi_event_stream(std::uint64_t base, std::size_t n, std::size_t events) {
  std::vector<std::string> out;
  std::uint64_t name = base;
  for (std::size_t i = 0; i < n; ++i) {
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> p(buf);
    p.pack_array(3);
    p.pack(1.5);
    p.pack_array(static_cast<std::uint32_t>(events));
    for (std::size_t e = 0; e < events; ++e, name += 2) {
      p.pack_array(8);
      p.pack(std::string("BlockStored"));
      p.pack(std::vector<std::uint64_t>{name, name + 1});
      p.pack_nil();
      std::vector<std::uint32_t> tokens;
      for (std::uint64_t b = name; b < name + 2; ++b)
        for (std::uint32_t t = 0; t < 4; ++t)
          tokens.push_back(static_cast<std::uint32_t>(b * 4 + t));
      p.pack(tokens);
      p.pack(4);
      p.pack_nil();
      p.pack(std::string("GPU"));
      p.pack_nil();
    }
    p.pack_nil();
    out.emplace_back(buf.data(), buf.size());
  }
  return out;
}

// The stream sequence a replica document is current at (after the magic and
// the version).
std::uint64_t seq_of(const std::vector<std::byte>& doc) {
  promptcache::detail::NatsReplicaReader r(std::span<const std::byte>(doc).subspan(16, 8));
  return r.u(8);
}

std::string prefix() {
  return promptcache::dynamo_kv_events_subject("test", "backend");
}

NatsKvSubscriberOptions sub_options(const NatsServer& server, const std::string& durable) {
  NatsKvSubscriberOptions o;
  o.connection.url = server.url();
  o.connection.reconnect_wait = 10ms;
  o.prefix = prefix();
  o.jetstream.stream = stream_name;
  o.jetstream.durable = durable;
  return o;
}

// Publishers that do not answer replays: a batch lost across the snapshot
// boundary would reset the worker's view instead of being filled.
NatsKvPublisherOptions pub_options(const NatsServer& server, KvWorker worker, bool replays) {
  NatsKvPublisherOptions o;
  o.connection.url = server.url();
  o.connection.reconnect_wait = 10ms;
  o.prefix = prefix();
  o.worker = worker;
  o.answer_replays = replays;
  return o;
}

NatsKvSnapshotStoreOptions store_options(const NatsServer& server) {
  NatsKvSnapshotStoreOptions o;
  o.connection.url = server.url();
  o.stream = stream_name;
  o.chunk_bytes = 256;  // several chunks even for small indexes
  return o;
}

// The stream, created as the subscribers create it, before anything is published.
void create_stream(const NatsServer& server) {
  const NatsKvSubscriber sub(sub_options(server, "creator"));
}

bool poll_until(NatsKvSubscriber& sub, const std::function<bool()>& done, int rounds = 1000) {
  for (int i = 0; i < rounds; ++i) {
    if (done()) return true;
    sub.poll(10ms);
  }
  return done();
}

bool caught_up(NatsKvSubscriber& sub, NatsKvSnapshotStore& store) {
  const std::uint64_t last = store.stream_bounds().last;
  return poll_until(sub, [&] { return sub.stream_sequence() == last; });
}

// A fleet of three workers publishing `n` batches each, in rounds.
struct Fleet {
  std::vector<KvWorker> workers = {{1, 0}, {2, 0}, {2, 1}};
  std::vector<std::vector<std::string>> batches;
  std::vector<std::unique_ptr<NatsKvPublisher>> pubs;
  Fleet(const NatsServer& server, std::size_t n, bool replays) {
    for (std::size_t i = 0; i < workers.size(); ++i) {
      batches.push_back(worker_stream(1000 * (i + 1), n));
      pubs.push_back(std::make_unique<NatsKvPublisher>(pub_options(server, workers[i], replays)));
    }
  }
  // Publishes seqs [from, to) of every worker, interleaved.
  void publish(std::size_t from, std::size_t to) {
    for (std::size_t s = from; s < to; ++s)
      for (std::size_t i = 0; i < pubs.size(); ++i)
        REQUIRE(pubs[i]->publish(s, batches[i][s]));
    for (auto& p : pubs)
      REQUIRE(p->flush(2000ms));
  }
  KvIndex direct() const {
    KvIndex want;
    for (std::size_t i = 0; i < workers.size(); ++i)
      apply_direct(want, workers[i], batches[i]);
    return want;
  }
};

// Raw access to the bucket and the stream, to damage them.
class Raw {
 public:
  explicit Raw(const NatsServer& server, const std::string& bucket) {
    REQUIRE(natsConnection_ConnectTo(&nc_, server.url().c_str()) == NATS_OK);
    REQUIRE(natsConnection_JetStream(&js_, nc_, nullptr) == NATS_OK);
    REQUIRE(js_KeyValue(&kv_, js_, bucket.c_str()) == NATS_OK);
  }
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;
  ~Raw() {
    kvStore_Destroy(kv_);
    jsCtx_Destroy(js_);
    natsConnection_Destroy(nc_);
  }
  std::vector<std::string> keys(const std::string& starting) {
    kvKeysList list{nullptr, 0};
    REQUIRE(kvStore_Keys(&list, kv_, nullptr) == NATS_OK);
    std::vector<std::string> out;
    for (int i = 0; i < list.Count; ++i)
      if (std::string(list.Keys[i]).rfind(starting, 0) == 0) out.emplace_back(list.Keys[i]);
    kvKeysList_Destroy(&list);
    std::sort(out.begin(), out.end());
    return out;
  }
  std::string get(const std::string& key) {
    kvEntry* e = nullptr;
    REQUIRE(kvStore_Get(&e, kv_, key.c_str()) == NATS_OK);
    std::string v(static_cast<const char*>(kvEntry_Value(e)),
                  static_cast<std::size_t>(kvEntry_ValueLen(e)));
    kvEntry_Destroy(e);
    return v;
  }
  void put(const std::string& key, const std::string& v) {
    REQUIRE(kvStore_Put(nullptr, kv_, key.c_str(), v.data(), static_cast<int>(v.size())) ==
            NATS_OK);
  }
  void purge_key(const std::string& key) {
    REQUIRE(kvStore_Purge(kv_, key.c_str(), nullptr) == NATS_OK);
  }
  // Purges the stream's messages below `seq`.
  void purge_stream_below(std::uint64_t seq) {
    jsOptions o;
    jsOptions_Init(&o);
    o.Stream.Purge.Sequence = seq;
    jsErrCode err = static_cast<jsErrCode>(0);
    REQUIRE(js_PurgeStream(js_, stream_name, &o, &err) == NATS_OK);
  }

 private:
  natsConnection* nc_ = nullptr;
  jsCtx* js_ = nullptr;
  kvStore* kv_ = nullptr;
};

}  // namespace

TEST_CASE("durable replicas: a replica joining from the snapshot equals one that read everything",
          "[nats]") {
  NatsServer server;
  create_stream(server);
  Fleet fleet(server, 40, false);
  NatsKvSnapshotStore store(store_options(server));
  NatsKvJoinReport ra;
  auto a = store.join(sub_options(server, "a"), ra);
  CHECK(ra.start == NatsKvJoinStart::no_snapshot);
  CHECK(ra.start_sequence == 0);
  fleet.publish(0, 25);
  REQUIRE(caught_up(*a, store));
  const std::uint64_t s = a->stream_sequence();
  CHECK(s == 75);
  REQUIRE(store.save(*a));
  CHECK_FALSE(store.save(*a));  // not newer than the latest
  fleet.publish(25, 40);

  NatsKvJoinReport rb;
  auto b = store.join(sub_options(server, "b"), rb);
  CHECK(rb.start == NatsKvJoinStart::snapshot);
  CHECK(rb.snapshot_sequence == s);
  CHECK(rb.start_sequence == s + 1);
  CHECK(rb.restore.ok());
  CHECK(b->stream_sequence() == s);
  // A purge now keeps everything b still reads (it registered at s).
  store.heartbeat("a", s);
  CHECK(store.purge() == s);
  CHECK(store.stream_bounds().first == s + 1);
  REQUIRE(caught_up(*b, store));

  // Only the messages after the snapshot were delivered, none twice, none lost.
  CHECK(b->transport_counters().messages == 120 - s);
  CHECK(b->transport_counters().redelivered == 0);
  const KvPublisherCounters c = b->total_counters();
  CHECK(c.gaps == 0);
  CHECK(c.duplicates == 0);
  CHECK(c.resets == 0);
  CHECK(c.batches_applied == 120 - s);
  for (const KvWorker& w : fleet.workers)
    CHECK(b->last_seq(w) == 39);

  // The replica that read the whole stream (before the purge).
  REQUIRE(caught_up(*a, store));
  require_same(b->index(), a->index());
  require_same(b->index(), fleet.direct());
}

TEST_CASE("durable replicas: messages at or below the snapshot's sequence are not applied twice",
          "[nats]") {
  NatsServer server;
  create_stream(server);
  Fleet fleet(server, 20, false);
  NatsKvSnapshotStore store(store_options(server));
  NatsKvSubscriber a(sub_options(server, "a"));
  fleet.publish(0, 10);
  REQUIRE(caught_up(a, store));
  const std::vector<std::byte> doc = a.snapshot();
  const std::uint64_t s = a.stream_sequence();
  REQUIRE(s == 30);
  fleet.publish(10, 20);

  // Started four messages early: those are acknowledged, not applied.
  auto o = sub_options(server, "d");
  o.jetstream.start_sequence = s - 3;
  NatsKvSubscriber d(o);
  REQUIRE(d.restore(doc).ok());
  CHECK(d.stream_sequence() == s);
  REQUIRE(caught_up(d, store));
  CHECK(d.transport_counters().redelivered == 4);
  CHECK(d.transport_counters().messages == 30);
  const KvPublisherCounters c = d.total_counters();
  CHECK(c.gaps == 0);
  CHECK(c.duplicates == 0);
  CHECK(c.resets == 0);
  CHECK(c.batches_applied == 30);
  require_same(d.index(), fleet.direct());

  // Started one message late: that batch is a gap the publishers (which do
  // not answer) cannot fill: the loss shows, it is not silent.
  auto late = sub_options(server, "late");
  late.jetstream.start_sequence = s + 2;
  NatsKvSubscriber l(late);
  REQUIRE(l.restore(doc).ok());
  REQUIRE(caught_up(l, store));
  CHECK(l.total_counters().gaps_unrecoverable == 1);

  // A restore after a message, or of a damaged document, changes nothing.
  CHECK(d.restore(doc).code == KvSnapshotErrc::index_not_empty);
  NatsKvSubscriber e(sub_options(server, "e"));
  CHECK(e.restore({}).code == KvSnapshotErrc::empty);
  for (std::size_t cut :
       {std::size_t{3}, std::size_t{20}, std::size_t{40}, doc.size() / 2, doc.size() - 1}) {
    INFO("prefix of " << cut << " bytes");
    CHECK_FALSE(e.restore(std::span<const std::byte>(doc).first(cut)).ok());
  }
  std::vector<std::byte> longer = doc;
  longer.push_back(std::byte{0});
  CHECK_FALSE(e.restore(longer).ok());
  for (std::size_t i = 0; i < doc.size(); i += 37) {
    std::vector<std::byte> bad = doc;
    bad[i] ^= std::byte{0x10};
    INFO("byte " << i);
    CHECK_FALSE(e.restore(bad).ok());
  }
  CHECK(e.index().worker_count() == 0);
  CHECK(e.streams().empty());
  CHECK(e.stream_sequence() == 0);
  REQUIRE(e.restore(doc).ok());
  REQUIRE(caught_up(e, store));
  CHECK(e.transport_counters().redelivered == s);
  require_same(e.index(), fleet.direct());
}

TEST_CASE("durable replicas: a corrupt or truncated snapshot falls back to the stream's start",
          "[nats]") {
  NatsServer server;
  create_stream(server);
  Fleet fleet(server, 12, false);
  NatsKvSnapshotStore store(store_options(server));
  NatsKvSubscriber a(sub_options(server, "a"));
  fleet.publish(0, 8);
  REQUIRE(caught_up(a, store));
  REQUIRE(store.save(a));
  fleet.publish(8, 12);
  Raw raw(server, store.options().bucket);
  const std::vector<std::string> chunks = raw.keys("snap.");
  REQUIRE(chunks.size() > 2);

  const auto joins_from_start = [&](const char* name) {
    NatsKvJoinReport r;
    auto b = store.join(sub_options(server, name), r);
    CHECK(r.start == NatsKvJoinStart::corrupt_snapshot);
    CHECK_FALSE(r.restore.ok());
    CHECK(r.start_sequence == 0);
    REQUIRE(caught_up(*b, store));
    CHECK(b->transport_counters().messages == 36);
    CHECK(b->total_counters().resets == 0);
    require_same(b->index(), fleet.direct());
  };
  SECTION("a garbled chunk") {
    std::string v = raw.get(chunks[1]);
    v[v.size() / 2] = static_cast<char>(v[v.size() / 2] ^ 0x01);
    raw.put(chunks[1], v);
    CHECK(store.load_latest().found == NatsKvSnapshotFound::corrupt);
    joins_from_start("b");
  }
  SECTION("a missing chunk") {
    raw.purge_key(chunks[0]);
    CHECK(store.load_latest().found == NatsKvSnapshotFound::corrupt);
    joins_from_start("b");
  }
  SECTION("a manifest that does not parse; a save replaces it") {
    raw.put("latest", "v1 12 x");
    CHECK(store.load_latest().found == NatsKvSnapshotFound::corrupt);
    CHECK(store.purge_floor() == 0);  // nothing purged on a corrupt manifest
    joins_from_start("b");
    REQUIRE(caught_up(a, store));
    REQUIRE(store.save(a));
    CHECK(store.load_latest().found == NatsKvSnapshotFound::ok);
  }
  SECTION("a document that passes the checksum but not the restore") {
    // A store's checksum covers the bytes as saved: a document damaged
    // before it was saved is caught by the restore.
    std::vector<std::byte> doc = a.snapshot();
    doc[doc.size() - 1] ^= std::byte{0x01};
    // Saved newer than the latest.
    REQUIRE(store.save(doc, a.stream_sequence() + 1));
    CHECK(store.load_latest().found == NatsKvSnapshotFound::ok);
    NatsKvJoinReport r;
    auto b = store.join(sub_options(server, "b"), r);
    CHECK(r.start == NatsKvJoinStart::corrupt_snapshot);
    CHECK(r.restore.code == KvSnapshotErrc::bad_checksum);
    REQUIRE(caught_up(*b, store));
    require_same(b->index(), fleet.direct());
  }
}

TEST_CASE("durable replicas: a snapshot older than the stream's first message", "[nats]") {
  NatsServer server;
  create_stream(server);
  Fleet fleet(server, 12, true);  // these answer replays
  NatsKvSnapshotStore store(store_options(server));
  NatsKvSubscriber a(sub_options(server, "a"));
  fleet.publish(0, 6);
  REQUIRE(caught_up(a, store));
  REQUIRE(store.save(a));
  const std::uint64_t s = a.stream_sequence();
  fleet.publish(6, 12);
  Raw raw(server, store.options().bucket);
  raw.purge_stream_below(s + 5);  // four messages after the snapshot are gone

  NatsKvJoinReport r;
  auto b = store.join(sub_options(server, "b"), r);
  CHECK(r.start == NatsKvJoinStart::purged_past_snapshot);
  CHECK(r.restore.ok());
  CHECK(r.start_sequence == 0);
  REQUIRE(caught_up(*b, store));
  const KvPublisherCounters c = b->total_counters();
  CHECK(c.gaps >= 1);
  CHECK(c.gaps == c.gaps_recovered);
  CHECK(c.resets == 0);
  require_same(b->index(), fleet.direct());
}

TEST_CASE("durable replicas: the purge never passes a live replica; a stale one does not hold it",
          "[nats]") {
  NatsServer server;
  create_stream(server);
  Fleet fleet(server, 10, false);
  fleet.publish(0, 10);  // stream sequences 1 to 30
  auto t = std::chrono::system_clock::time_point(std::chrono::hours(24 * 365 * 50));
  auto o = store_options(server);
  o.stale_after = 10s;
  o.clock = [&t] { return t; };
  NatsKvSnapshotStore store(o);
  CHECK(store.stream_bounds().last == 30);

  // No snapshot: a joiner needs the whole stream.
  store.heartbeat("r1", 25);
  CHECK(store.purge() == 0);
  CHECK(store.stream_bounds().first == 1);

  REQUIRE(store.save(std::vector<std::byte>(10, std::byte{1}), 20));
  store.heartbeat("r2", 5);
  CHECK(store.purge_floor() == 5);
  CHECK(store.purge() == 5);
  CHECK(store.stream_bounds().first == 6);

  // r2 falls silent; r1 keeps beating. The snapshot bounds the floor.
  t += 11s;
  store.heartbeat("r1", 28);
  const auto reps = store.replicas();
  REQUIRE(reps.size() == 2);
  CHECK(reps[0].name == "r1");
  CHECK(reps[0].live);
  CHECK(reps[1].name == "r2");
  CHECK_FALSE(reps[1].live);
  CHECK(reps[1].applied == 5);
  CHECK(store.purge() == 20);
  CHECK(store.stream_bounds().first == 21);

  // A registration that does not parse holds nothing; a replica behind the
  // snapshot that beats again holds the floor at its position.
  Raw raw(server, o.bucket);
  raw.put("replica.garbled", "twelve");
  CHECK(store.replicas().size() == 2);
  REQUIRE(store.save(std::vector<std::byte>(10, std::byte{2}), 27));
  store.heartbeat("r2", 22);
  CHECK(store.purge() == 22);
  CHECK(store.stream_bounds().first == 23);
  store.deregister("r2");
  CHECK(store.purge() == 27);
  CHECK(store.stream_bounds().first == 28);
  // A heartbeat ahead of the clock (another host's) is live.
  store.heartbeat("r1", 27);
  t -= 60s;
  CHECK(store.replicas().front().live);
}

TEST_CASE("durable replicas: snapshots taken while the thread applies are at message boundaries",
          "[nats]") {
  NatsServer server;
  create_stream(server);
  Fleet fleet(server, 40, false);
  // Batches of eight events: with one block per lock hold the thread lets
  // readers in between the events of a batch, where no snapshot may be taken.
  for (std::size_t i = 0; i < fleet.batches.size(); ++i)
    fleet.batches[i] = multi_event_stream(100000 * (i + 1), 40, 8);
  NatsKvSnapshotStore store(store_options(server));
  fleet.publish(0, 40);
  const std::uint64_t last = store.stream_bounds().last;
  REQUIRE(last == 120);
  auto ao = sub_options(server, "a");
  ao.max_blocks_per_lock = 1;
  ao.max_messages_per_round = 1;
  NatsKvSubscriber a(ao);
  a.start();
  // Every snapshot's sequence and bytes (hashed): between two messages the
  // state is a function of the sequence, so two snapshots at one sequence
  // with other bytes would be one taken inside a message, or one whose index
  // moved on while it was serialized. A second thread takes snapshots at the
  // same time (they overlap, and the thread must still get its turn), and a
  // third reads the index meanwhile.
  using SeqHash = std::pair<std::uint64_t, std::uint64_t>;
  const auto seq_hash = [](const std::vector<std::byte>& doc) {
    return SeqHash{seq_of(doc), promptcache::detail::xxh3_64(doc.data(), doc.size())};
  };
  std::atomic<bool> done{false};
  std::vector<SeqHash> other_taken;
  std::thread other([&] {
    while (!done.load()) {
      other_taken.push_back(seq_hash(a.snapshot()));
      std::this_thread::yield();
    }
  });
  std::size_t reads = 0;
  std::thread reader([&] {
    while (!done.load()) {
      reads += a.with_index([](const KvIndex& i) { return i.total_blocks() > 0 ? 1U : 0U; });
      std::this_thread::yield();
    }
  });
  std::vector<SeqHash> taken;
  std::vector<std::vector<std::byte>> docs;  // a sample, to restore
  for (int i = 0; i < 1000000 && a.stream_sequence() < last; ++i) {
    std::vector<std::byte> doc = a.snapshot();
    taken.push_back(seq_hash(doc));
    const std::uint64_t s = taken.back().first;
    if ((taken.size() == 1 || s != taken[taken.size() - 2].first) && s >= docs.size() * last / 8 &&
        docs.size() < 8)
      docs.push_back(doc);
    if (i % 64 == 0) (void)store.save(a);
  }
  done.store(true);
  other.join();
  reader.join();
  CHECK(a.stream_sequence() == last);  // the thread got its turns between the snapshots
  a.stop();
  REQUIRE(caught_up(a, store));
  require_same(a.index(), fleet.direct());
  taken.insert(taken.end(), other_taken.begin(), other_taken.end());
  std::sort(taken.begin(), taken.end());
  std::size_t inside_a_message = 0;
  for (std::size_t i = 1; i < taken.size(); ++i)
    if (taken[i].first == taken[i - 1].first && taken[i].second != taken[i - 1].second)
      ++inside_a_message;
  CHECK(inside_a_message == 0);
  CHECK_FALSE(other_taken.empty());
  CHECK(reads > 0);
  CHECK_FALSE(docs.empty());
  for (std::size_t i = 0; i < docs.size(); ++i) {
    auto o = sub_options(server, "r" + std::to_string(i));
    o.jetstream.start_sequence = seq_of(docs[i]) + 1;
    NatsKvSubscriber b(o);
    REQUIRE(b.restore(docs[i]).ok());
    INFO("snapshot at " << b.stream_sequence());
    REQUIRE(caught_up(b, store));
    const KvPublisherCounters c = b.total_counters();
    CHECK(c.gaps == 0);
    CHECK(c.resets == 0);
    require_same(b.index(), fleet.direct());
  }
  // And through the store: the latest snapshot saved while the thread ran.
  NatsKvJoinReport r;
  auto b = store.join(sub_options(server, "b"), r);
  CHECK(r.start == NatsKvJoinStart::snapshot);
  REQUIRE(caught_up(*b, store));
  require_same(b->index(), fleet.direct());
}

TEST_CASE("durable replicas: bad options", "[nats]") {
  NatsServer server;
  create_stream(server);
  auto o = store_options(server);
  o.stream.clear();
  CHECK_THROWS_AS(NatsKvSnapshotStore(o), std::invalid_argument);
  o = store_options(server);
  o.bucket = "a.b";
  CHECK_THROWS_AS(NatsKvSnapshotStore(o), std::invalid_argument);
  o = store_options(server);
  o.chunk_bytes = 0;
  CHECK_THROWS_AS(NatsKvSnapshotStore(o), std::invalid_argument);
  o = store_options(server);
  o.stale_after = 0ms;
  CHECK_THROWS_AS(NatsKvSnapshotStore(o), std::invalid_argument);
  NatsKvSnapshotStore store(store_options(server));
  CHECK_THROWS_AS(store.heartbeat("a.b", 1), std::invalid_argument);
  CHECK_THROWS_AS(store.heartbeat("", 1), std::invalid_argument);
  CHECK_THROWS_AS(store.save(std::vector<std::byte>{}, 5), std::invalid_argument);
  NatsKvJoinReport r;
  CHECK_THROWS_AS(store.join(sub_options(server, ""), r), std::invalid_argument);
  auto other = sub_options(server, "x");
  other.jetstream.stream = "OTHER";
  CHECK_THROWS_AS(store.join(other, r), std::invalid_argument);
  // A subscriber that cannot be constructed: the join's registration goes.
  auto bad = sub_options(server, "y");
  bad.max_pending = 0;
  CHECK_THROWS_AS(store.join(bad, r), std::invalid_argument);
  CHECK(store.load_latest().found == NatsKvSnapshotFound::none);
  CHECK(store.replicas().empty());
}
