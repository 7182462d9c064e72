// promptcache: nats_kv_subscriber.hpp
// SPDX-License-Identifier: Apache-2.0
//
// KV event streams over NATS, the event plane NVIDIA Dynamo deployments run:
// NatsKvSubscriber follows every worker publishing under a subject prefix
// into one KvIndex, with the sequence rules of ZmqKvSubscriber (gap ->
// replay, restart told by the payload bytes, reset when nothing can help);
// NatsKvPublisher is the engine side: it publishes already-encoded batches
// with their seq and answers replay requests from a buffer of recent ones.
//
// Subjects (prefix P, by default Dynamo's event subject
// "namespace.<ns>.component.<component>.kv-events"):
//   live:   P.<worker_id> (decimal), one message per batch: the payload is
//           the batch's bytes, header Kv-Seq the batch seq (decimal) and
//           header Kv-Dp-Rank the data-parallel rank (decimal, default 0).
//           The subscriber listens on P.* (or on P.<id> for a fixed list).
//   replay: a request on P.<worker_id>.replay with payload [from seq (8 bytes
//           big-endian), dp rank (4 bytes big-endian, optional: 0)] and a
//           reply subject; the publisher of that rank sends every buffered
//           batch with seq >= from to the reply subject (header Kv-Seq,
//           payload the batch), then an end marker (Kv-Seq
//           18446744073709551615, empty payload). Other ranks stay silent.
//           Without a responder the server answers "no responders" at once
//           and the gap resets the view, as a silent replay does after
//           replay_timeout.
//
// The rules, state per (worker, dp rank), are ZmqKvSubscriber's
// (docs/kv_event_wire.md#sequence-rules): seq = last + 1 applies; a gap asks
// the replay from the last applied seq L and checks the bytes returned for L
// (other bytes: a restarted publisher); an old seq is a duplicate when its
// bytes are the ones applied there, a restart otherwise.
//
// Payloads are decoded by a pluggable NatsKvDecoder, which names the stream
// (worker, dp rank) and seq of each message and turns its payload into
// events; NatsKvBatchDecoder (the default) reads vLLM / SGLang KVEventBatch
// payloads (kv_event_wire.hpp) with the stream and seq from the subject and
// headers. A decoder of Dynamo's own RouterEvent, which carries worker id,
// dp rank and event id in the payload, plugs in the same way.
//
// Connections reconnect by themselves (libnats reconnect options); batches
// lost while the server was away surface as a gap on the next batch and are
// replayed. Durable mode (options.jetstream) reads a JetStream stream over
// P.* through a durable pull consumer instead, acknowledging each batch once
// applied: the server keeps what a subscriber has not yet read, and a
// subscriber constructed again with the same consumer name resumes after the
// last batch acknowledged (its new index then fills the rest from the
// publishers' replay, as any gap). A replica of a fleet instead restores
// another's snapshot() (current at stream_sequence() S) and reads from S + 1:
// nats_kv_snapshot_store.hpp. Driving it: poll(timeout) from your own
// loop, or start() a thread and read through with_index(), exactly as
// ZmqKvSubscriber.
// Needs the NATS C client (libnats) besides msgpack-cxx and xxHash.
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
#endif
#if !defined(PROMPTCACHE_NATS_KV_SUBSCRIBER_HPP) && \
    (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) >= 202002L
#define PROMPTCACHE_NATS_KV_SUBSCRIBER_HPP

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nats/nats.h>

#include "promptcache/detail/kv_stream_follower.hpp"
#include "promptcache/kv_event_wire.hpp"
#include "promptcache/kv_index.hpp"
#include "promptcache/kv_index_snapshot.hpp"

namespace promptcache {

/// The header carrying a batch's seq (decimal) on live and replayed messages.
inline constexpr const char* nats_kv_seq_header = "Kv-Seq";
/// The header carrying the publisher's data-parallel rank (decimal) on live messages.
inline constexpr const char* nats_kv_dp_rank_header = "Kv-Dp-Rank";

/// Dynamo's KV event subject of component `component` in namespace `ns`:
/// "namespace.<ns>.component.<component>.kv-events". O(length).
inline std::string dynamo_kv_events_subject(std::string_view ns, std::string_view component) {
  std::string s = "namespace.";
  s.append(ns).append(".component.").append(component).append(".kv-events");
  return s;
}

/// A libnats call failed (connecting, subscribing); status() is its natsStatus.
class NatsKvError : public std::runtime_error {
 public:
  /// `what`: the call that failed; the status text is appended. O(1).
  NatsKvError(const std::string& what, natsStatus s)
      : std::runtime_error(what + ": " + natsStatus_GetText(s)), status_(s) {}
  /// The libnats status. O(1).
  [[nodiscard]] natsStatus status() const noexcept { return status_; }

 private:
  natsStatus status_;
};

/// One received message, as a decoder sees it. Views into the message: valid
/// during the decoder call only.
struct NatsKvEnvelope {
  std::string_view subject;                     ///< The subject it arrived on.
  std::optional<std::uint64_t> subject_worker;  ///< The decimal token after the prefix, if any.
  std::optional<std::uint64_t> seq;             ///< The Kv-Seq header, if present and decimal.
  std::optional<std::uint32_t> dp_rank;         ///< The Kv-Dp-Rank header, if present and decimal.
  std::span<const std::byte> payload;           ///< The message data.
};

/// Which stream a message belongs to and its seq in that stream.
struct NatsKvBatchId {
  KvWorker worker;        ///< Worker id and dp rank: one stream (one CursorState) each.
  std::uint64_t seq = 0;  ///< The batch seq (0, 1, ... per stream).
};

/// Turns messages into (worker id, dp rank, seq, events). identify() runs on
/// every message; decode() only on the batches that are applied (never on a
/// duplicate), with the stream's KvWireStreamState, which it may update.
/// Called on the polling thread only.
class NatsKvDecoder {
 public:
  /// Virtual: owned through a pointer to the base.
  virtual ~NatsKvDecoder() = default;
  /// The stream and seq of `m`; nullopt when it is not a batch (counted in
  /// NatsKvTransportCounters::unidentified, nothing else changes).
  virtual std::optional<NatsKvBatchId> identify(const NatsKvEnvelope& m) = 0;
  /// The events of an identified payload, into `out` (cleared first). A
  /// status other than ok consumes the seq and applies nothing (malformed).
  virtual KvWireStatus decode(std::span<const std::byte> payload, KvWireBatch& out,
                              KvWireStreamState& state) = 0;
};

/// The vLLM / SGLang KVEventBatch decoder (kv_event_wire.hpp): worker id from
/// the subject, seq from Kv-Seq, dp rank from Kv-Dp-Rank (0 without it).
class NatsKvBatchDecoder final : public NatsKvDecoder {
 public:
  /// Decodes with `options`. O(1).
  explicit NatsKvBatchDecoder(KvWireOptions options = {}) : decoder_(options) {}
  /// nullopt without a decimal worker token in the subject or a Kv-Seq. O(1).
  std::optional<NatsKvBatchId> identify(const NatsKvEnvelope& m) override {
    if (!m.subject_worker || !m.seq) return std::nullopt;
    return NatsKvBatchId{KvWorker{*m.subject_worker, m.dp_rank.value_or(0)}, *m.seq};
  }
  /// KvEventWireDecoder::decode. O(payload).
  KvWireStatus decode(std::span<const std::byte> payload, KvWireBatch& out,
                      KvWireStreamState& state) override {
    return decoder_.decode(payload, out, state);
  }

 private:
  KvEventWireDecoder decoder_;
};

/// Connection settings shared by the subscriber and the publisher.
struct NatsKvConnectionOptions {
  std::string url = "nats://127.0.0.1:4222";  ///< Server URL(s), comma separated.
  std::string name;                           ///< Connection name shown by the server.
  /// Wait between reconnect attempts after the server went away. >= 0.
  std::chrono::milliseconds reconnect_wait{100};
  /// Reconnect attempts per server before the connection closes; -1: forever.
  int max_reconnects = -1;
  /// Bound of the first connect (the constructor throws NatsKvError after it). > 0.
  std::chrono::milliseconds connect_timeout{2000};
};

/// JetStream (durable) mode of the subscriber: a stream keeps the batches
/// published on P.*, and the subscriber reads it through a durable pull
/// consumer, acknowledging each batch once applied.
struct NatsKvJetStreamOptions {
  /// The stream's name; empty: core NATS (no JetStream, the default).
  std::string stream;
  /// The durable consumer's name (no '.', '*', '>' or spaces); required with
  /// a stream. A subscriber constructed again with the same name resumes at
  /// the first batch not acknowledged.
  std::string durable;
  /// Create the stream over P.* (file storage) when it does not exist.
  bool create_stream = true;
  /// A batch fetched but not acknowledged within this is delivered again. > 0.
  std::chrono::milliseconds ack_wait{30000};
  /// The stream sequence a consumer this subscriber creates starts at (a
  /// replica restored from a snapshot current at S starts at S + 1); 0: the
  /// stream's first message. A consumer that exists keeps its position.
  std::uint64_t start_sequence = 0;
};

/// Subscriber settings.
struct NatsKvSubscriberOptions {
  NatsKvConnectionOptions connection;  ///< Where and how to connect.
  /// Subject prefix P: workers publish on P.<worker_id>. No wildcards.
  std::string prefix = dynamo_kv_events_subject("dynamo", "backend");
  /// Workers to follow (P.<id> each); empty: every worker (P.*).
  std::vector<std::uint64_t> workers;
  /// Subjects to subscribe to instead of those `workers` implies, e.g. P
  /// itself, where Dynamo publishes every worker's RouterEvent (a decoder
  /// then names the worker). Wildcards allowed. In durable mode at most one.
  std::vector<std::string> subjects;
  /// Payload decoder; empty: NatsKvBatchDecoder(wire).
  std::shared_ptr<NatsKvDecoder> decoder;
  KvWireOptions wire;  ///< Options of the default decoder.
  /// Ask publishers for lost batches (P.<id>.replay); false: every gap resets.
  bool replay = true;
  /// How long a replay may stay silent (to its first reply, between replies)
  /// before it is given up (replay_timeouts). >= 0.
  std::chrono::milliseconds replay_timeout{2000};
  /// As ZmqKvSubscriberOptions::restart_max_seq.
  std::uint64_t restart_max_seq = 1024;
  /// As ZmqKvSubscriberOptions::remembered_batches (per stream).
  std::size_t remembered_batches = 1024;
  /// As ZmqKvSubscriberOptions::max_blocks_per_lock.
  std::size_t max_blocks_per_lock = 4096;
  /// Messages received but not yet handled, at most; more are dropped
  /// (NatsKvTransportCounters::dropped) and surface as gaps. >= 1.
  std::size_t max_pending = 1000000;
  /// At most this many messages per poll() round. >= 1.
  std::size_t max_messages_per_round = 4096;
  /// The time source of replay_timeout; empty: std::chrono::steady_clock.
  std::function<std::chrono::steady_clock::time_point()> clock;
  /// Durable mode; by default off (core NATS subscriptions).
  NatsKvJetStreamOptions jetstream;
};

/// What the subscriber's connection saw, beyond the per-stream counters.
struct NatsKvTransportCounters {
  std::uint64_t messages = 0;      ///< Messages handled (live, all streams).
  std::uint64_t unidentified = 0;  ///< Messages the decoder could not place (dropped).
  std::uint64_t dropped = 0;       ///< Messages over max_pending, or libnats slow-consumer drops.
  std::uint64_t disconnects = 0;   ///< Times the connection was lost.
  std::uint64_t reconnects = 0;    ///< Times it was re-established.
  /// JetStream messages at or below stream_sequence() (delivered again, or
  /// before a restored snapshot's position): acknowledged, not applied.
  std::uint64_t redelivered = 0;
};

/// One stream's state, as streams() reports it.
struct NatsKvStreamInfo {
  KvWorker worker;  ///< Worker id and dp rank.
  std::optional<std::uint64_t>
      last_seq;                  ///< Last applied seq; nullopt before any (or after a reset).
  KvPublisherCounters counters;  ///< Since the stream's first message.
};

namespace detail {

struct NatsMsgDeleter {
  void operator()(natsMsg* m) const noexcept { natsMsg_Destroy(m); }
};
using NatsMsgPtr = std::unique_ptr<natsMsg, NatsMsgDeleter>;

struct NatsSubscriptionDeleter {
  void operator()(natsSubscription* s) const noexcept { natsSubscription_Destroy(s); }
};
// A synchronous subscription (no handler runs on libnats's threads).
using NatsSyncSubscriptionPtr = std::unique_ptr<natsSubscription, NatsSubscriptionDeleter>;

struct NatsJsDeleter {
  void operator()(jsCtx* js) const noexcept { jsCtx_Destroy(js); }
};
using NatsJsPtr = std::unique_ptr<jsCtx, NatsJsDeleter>;

inline std::optional<std::uint64_t> nats_parse_u64(std::string_view s) noexcept {
  if (s.empty() || s.size() > 20) return std::nullopt;
  std::uint64_t v = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (~std::uint64_t{0} - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

inline std::optional<std::uint64_t> nats_header_u64(natsMsg* m, const char* key) noexcept {
  const char* v = nullptr;
  if (natsMsgHeader_Get(m, key, &v) != NATS_OK || v == nullptr) return std::nullopt;
  return nats_parse_u64(v);
}

inline std::span<const std::byte> nats_payload(natsMsg* m) noexcept {
  return {reinterpret_cast<const std::byte*>(natsMsg_GetData(m)),
          static_cast<std::size_t>(natsMsg_GetDataLength(m))};
}

// The JetStream stream sequence of a message a consumer delivered; 0 for
// any other message.
inline std::uint64_t nats_stream_sequence(natsMsg* m) noexcept {
  jsMsgMetaData* meta = nullptr;
  if (natsMsg_GetMetaData(&meta, m) != NATS_OK || meta == nullptr) return 0;
  const std::uint64_t seq = meta->Sequence.Stream;
  jsMsgMetaData_Destroy(meta);
  return seq;
}

inline void nats_check(natsStatus s, const char* what) {
  if (s != NATS_OK) throw NatsKvError(what, s);
}

inline void nats_check_subject(const std::string& s, const char* who) {
  if (s.empty() || s.front() == '.' || s.back() == '.' ||
      s.find_first_of("*> \t\r\n") != std::string::npos || s.find("..") != std::string::npos)
    throw std::invalid_argument(std::string(who) + ": prefix must be a subject without wildcards");
}

// A message with the batch headers, to `subject` (reply subject `reply`).
inline NatsMsgPtr nats_batch_msg(const std::string& subject, const char* reply, std::uint64_t seq,
                                 std::optional<std::uint32_t> dp_rank,
                                 std::span<const std::byte> payload) {
  natsMsg* m = nullptr;
  nats_check(
      natsMsg_Create(&m, subject.c_str(), reply, reinterpret_cast<const char*>(payload.data()),
                     static_cast<int>(payload.size())),
      "natsMsg_Create");
  NatsMsgPtr msg(m);
  nats_check(natsMsgHeader_Set(m, nats_kv_seq_header, std::to_string(seq).c_str()),
             "natsMsgHeader_Set");
  if (dp_rank)
    nats_check(natsMsgHeader_Set(m, nats_kv_dp_rank_header, std::to_string(*dp_rank).c_str()),
               "natsMsgHeader_Set");
  return msg;
}

// One connection with reconnects counted; closing waits for libnats's last
// callback, which holds a pointer to this.
class NatsConnection {
 public:
  explicit NatsConnection(const NatsKvConnectionOptions& o, const char* who) {
    if (o.reconnect_wait.count() < 0)
      throw std::invalid_argument(std::string(who) + ": reconnect_wait must not be negative");
    if (o.connect_timeout.count() <= 0)
      throw std::invalid_argument(std::string(who) + ": connect_timeout must be positive");
    natsOptions* opts = nullptr;
    nats_check(natsOptions_Create(&opts), "natsOptions_Create");
    const std::unique_ptr<natsOptions, void (*)(natsOptions*)> guard(opts, natsOptions_Destroy);
    nats_check(natsOptions_SetURL(opts, o.url.c_str()), "natsOptions_SetURL");
    if (!o.name.empty())
      nats_check(natsOptions_SetName(opts, o.name.c_str()), "natsOptions_SetName");
    nats_check(natsOptions_SetTimeout(opts, o.connect_timeout.count()), "natsOptions_SetTimeout");
    nats_check(natsOptions_SetAllowReconnect(opts, true), "natsOptions_SetAllowReconnect");
    nats_check(natsOptions_SetMaxReconnect(opts, o.max_reconnects), "natsOptions_SetMaxReconnect");
    nats_check(natsOptions_SetReconnectWait(opts, o.reconnect_wait.count()),
               "natsOptions_SetReconnectWait");
    // Jitter would add up to 100 ms to every attempt.
    nats_check(natsOptions_SetReconnectJitter(opts, 0, 0), "natsOptions_SetReconnectJitter");
    nats_check(natsOptions_SetDisconnectedCB(opts, &NatsConnection::on_disconnected, this),
               "natsOptions_SetDisconnectedCB");
    nats_check(natsOptions_SetReconnectedCB(opts, &NatsConnection::on_reconnected, this),
               "natsOptions_SetReconnectedCB");
    nats_check(natsOptions_SetClosedCB(opts, &NatsConnection::on_closed, this),
               "natsOptions_SetClosedCB");
    nats_check(natsConnection_Connect(&nc_, opts), "natsConnection_Connect");
  }
  NatsConnection(const NatsConnection&) = delete;
  NatsConnection& operator=(const NatsConnection&) = delete;
  ~NatsConnection() {
    natsConnection_Close(nc_);
    {
      // The closed callback comes last, from libnats's callback thread.
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait_for(lock, std::chrono::seconds(5), [this] { return closed_; });
    }
    natsConnection_Destroy(nc_);
  }

  natsConnection* get() const noexcept { return nc_; }
  bool connected() const noexcept {
    return natsConnection_Status(nc_) == NATS_CONN_STATUS_CONNECTED;
  }
  std::uint64_t disconnects() const noexcept { return disconnects_.load(); }
  std::uint64_t reconnects() const noexcept { return reconnects_.load(); }

 private:
  static void on_disconnected(natsConnection*, void* self) {
    static_cast<NatsConnection*>(self)->disconnects_.fetch_add(1);
  }
  static void on_reconnected(natsConnection*, void* self) {
    static_cast<NatsConnection*>(self)->reconnects_.fetch_add(1);
  }
  static void on_closed(natsConnection*, void* self) {
    auto* c = static_cast<NatsConnection*>(self);
    std::lock_guard<std::mutex> lock(c->mutex_);
    c->closed_ = true;
    c->cv_.notify_all();
  }

  natsConnection* nc_ = nullptr;
  std::atomic<std::uint64_t> disconnects_{0};
  std::atomic<std::uint64_t> reconnects_{0};
  std::mutex mutex_;
  std::condition_variable cv_;
  bool closed_ = false;
};

// An asynchronous subscription whose handler is known to have returned for
// good once it is destroyed (the handler's closure may then be freed).
class NatsAsyncSubscription {
 public:
  NatsAsyncSubscription(natsConnection* nc, const std::string& subject, natsMsgHandler handler,
                        void* closure) {
    nats_check(natsConnection_Subscribe(&sub_, nc, subject.c_str(), handler, closure),
               "natsConnection_Subscribe");
    const natsStatus s =
        natsSubscription_SetOnCompleteCB(sub_, &NatsAsyncSubscription::on_complete, this);
    if (s != NATS_OK) {
      natsSubscription_Unsubscribe(sub_);
      natsSubscription_Destroy(sub_);
      throw NatsKvError("natsSubscription_SetOnCompleteCB", s);
    }
  }
  NatsAsyncSubscription(const NatsAsyncSubscription&) = delete;
  NatsAsyncSubscription& operator=(const NatsAsyncSubscription&) = delete;
  ~NatsAsyncSubscription() {
    if (natsSubscription_Unsubscribe(sub_) == NATS_OK) {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait_for(lock, std::chrono::seconds(5), [this] { return done_; });
    }
    natsSubscription_Destroy(sub_);
  }
  natsSubscription* get() const noexcept { return sub_; }

 private:
  static void on_complete(void* self) {
    auto* s = static_cast<NatsAsyncSubscription*>(self);
    std::lock_guard<std::mutex> lock(s->mutex_);
    s->done_ = true;
    s->cv_.notify_all();
  }
  natsSubscription* sub_ = nullptr;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
};

// One (worker, dp rank) stream of the subscriber.
struct NatsKvStream : KvStream {
  std::string replay_subject;  // P.<worker>.replay
};

// ---- the replica document (NatsKvSubscriber::snapshot) ----
// Little-endian throughout:
//   8 bytes magic, u64 version (1), u64 stream sequence S, u32 stream count N,
//   N stream records of nats_replica_record bytes, ordered by (worker, rank):
//     u64 worker id, u32 dp rank, u8 flags (1: a seq was applied), u64 last
//     seq, u64 next event id, u64 XXH3-64 of the last batch's bytes,
//     4 x u64 groups known, 4 x u64 groups main (KvWireStreamState),
//   u64 length L, L bytes of kv_index_snapshot(index, S),
//   u64 XXH3-64 (seed 0) of every byte before it.
inline constexpr std::string_view nats_replica_magic = "pcnatsr1";
inline constexpr std::size_t nats_replica_groups = KvWireStreamState::max_groups / 64U;
inline constexpr std::size_t nats_replica_record =
    8 + 4 + 1 + 8 + 8 + 8 + 2 * 8 * nats_replica_groups;
inline constexpr std::size_t nats_replica_head = 8 + 8 + 8 + 4;

struct NatsReplicaStream {
  KvWorker worker;
  std::optional<std::uint64_t> last_seq;
  std::uint64_t next_event_id = 0;
  std::uint64_t last_hash = 0;
  KvWireStreamState wire;
};

class NatsReplicaWriter {
 public:
  explicit NatsReplicaWriter(std::vector<std::byte>& out) noexcept : out_(out) {}
  void u(std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i)
      out_.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xFFU));
  }

 private:
  std::vector<std::byte>& out_;
};

class NatsReplicaReader {
 public:
  explicit NatsReplicaReader(std::span<const std::byte> in) noexcept : in_(in) {}
  std::uint64_t u(int bytes) noexcept {
    std::uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i)
      v = (v << 8) | static_cast<std::uint64_t>(in_[at_ + static_cast<std::size_t>(i)]);
    at_ += static_cast<std::size_t>(bytes);
    return v;
  }
  std::size_t at() const noexcept { return at_; }

 private:
  std::span<const std::byte> in_;
  std::size_t at_ = 0;
};

}  // namespace detail

/// Follows the KV event streams of every worker under a NATS subject prefix
/// into one KvIndex (owned). One stream (CursorState, counters) per
/// (worker, dp rank), created at its first message. Messages arrive on
/// libnats's threads into a bounded queue; handling them is the caller's
/// poll() or the start() thread, one at a time.
class NatsKvSubscriber : private detail::KvStreamFollower<NatsKvSubscriber, detail::NatsKvStream> {
  using Follower = detail::KvStreamFollower<NatsKvSubscriber, detail::NatsKvStream>;
  friend Follower;
  using Stream = detail::NatsKvStream;

 public:
  /// Connects and subscribes (P.* or P.<id> per worker, and a reply inbox for
  /// replays), or in durable mode binds the durable consumer (creating it and
  /// the stream when missing). Throws std::invalid_argument for a prefix with
  /// wildcards or empty, a negative replay_timeout, max_pending or
  /// max_messages_per_round of 0, or jetstream options out of range;
  /// NatsKvError when the server cannot be reached within
  /// connection.connect_timeout or refuses the stream or consumer. O(workers).
  /// The index keeps chains stored under a prefix it never saw as orphan chains
  /// (KvUnknownParent::keep_orphan) by default: a replica that joins late, or a view
  /// reset by a gap, routes to a worker as soon as it stores a block extending a prefix.
  explicit NatsKvSubscriber(
      NatsKvSubscriberOptions options,
      KvIndexOptions index_options = {.on_gap = KvGapPolicy::report,
                                      .on_unknown_parent = KvUnknownParent::keep_orphan})
      : Follower(detail::KvFollowerRules{options.restart_max_seq, options.remembered_batches,
                                         options.max_blocks_per_lock},
                 index_options),
        options_(std::move(options)) {
    detail::nats_check_subject(options_.prefix, "NatsKvSubscriber");
    for (const std::string& subject : options_.subjects)
      if (subject.empty() || subject.find_first_of(" \t\r\n") != std::string::npos)
        throw std::invalid_argument("NatsKvSubscriber: an empty subject, or one with spaces");
    if (options_.replay_timeout.count() < 0)
      throw std::invalid_argument("NatsKvSubscriber: replay_timeout must not be negative");
    if (options_.max_pending == 0)
      throw std::invalid_argument("NatsKvSubscriber: max_pending must be at least 1");
    if (options_.max_messages_per_round == 0)
      throw std::invalid_argument("NatsKvSubscriber: max_messages_per_round must be at least 1");
    if (const NatsKvJetStreamOptions& j = options_.jetstream; !j.stream.empty()) {
      if (j.durable.empty() || j.durable.find_first_of(".*> \t\r\n") != std::string::npos)
        throw std::invalid_argument(
            "NatsKvSubscriber: jetstream.durable must be a name without '.'");
      if (j.ack_wait.count() <= 0)
        throw std::invalid_argument("NatsKvSubscriber: jetstream.ack_wait must be positive");
      // A consumer filters on one subject (before nats-server 2.10).
      if (options_.subjects.size() > 1 ||
          (options_.subjects.empty() && options_.workers.size() > 1))
        throw std::invalid_argument("NatsKvSubscriber: jetstream follows one subject");
    }
    if (!options_.decoder) options_.decoder = std::make_shared<NatsKvBatchDecoder>(options_.wire);
    conn_ = std::make_unique<detail::NatsConnection>(options_.connection, "NatsKvSubscriber");
    if (options_.replay) {
      natsInbox* inbox = nullptr;
      detail::nats_check(natsInbox_Create(&inbox), "natsInbox_Create");
      inbox_ = inbox;
      natsInbox_Destroy(inbox);
      natsSubscription* rs = nullptr;
      detail::nats_check(natsConnection_SubscribeSync(&rs, conn_->get(), (inbox_ + ".*").c_str()),
                         "natsConnection_SubscribeSync");
      replay_sub_.reset(rs);
      // Replies are read as they come; a long replay must not be cut short.
      natsSubscription_SetPendingLimits(rs, -1, -1);
    }
    std::vector<std::string> subjects = options_.subjects;
    if (subjects.empty() && options_.workers.empty()) subjects.push_back(options_.prefix + ".*");
    if (options_.subjects.empty())
      for (const std::uint64_t w : options_.workers)
        subjects.push_back(options_.prefix + "." + std::to_string(w));
    if (!options_.jetstream.stream.empty()) {
      open_jetstream(subjects.front());
      subjects.clear();
    }
    for (const auto& s : subjects) {
      subs_.push_back(std::make_unique<detail::NatsAsyncSubscription>(
          conn_->get(), s, &NatsKvSubscriber::on_message, this));
      natsSubscription_SetPendingLimits(subs_.back()->get(), -1, -1);
    }
    // The subscriptions are known to the server before the constructor
    // returns: a batch published afterwards is received.
    detail::nats_check(
        natsConnection_FlushTimeout(conn_->get(), options_.connection.connect_timeout.count()),
        "natsConnection_FlushTimeout");
  }

  NatsKvSubscriber(const NatsKvSubscriber&) = delete;
  NatsKvSubscriber& operator=(const NatsKvSubscriber&) = delete;

  /// Stops the thread, unsubscribes (waiting for libnats's handlers to
  /// return) and closes the connection.
  ~NatsKvSubscriber() {
    stop();
    subs_.clear();
    replay_sub_.reset();
    if (pull_sub_ != nullptr) {
      // The acknowledgements sent are known to the server: a durable consumer
      // resumes after them. Destroyed without unsubscribing, which would
      // delete the consumer.
      natsConnection_FlushTimeout(conn_->get(), 1000);
      pull_sub_.reset();
    }
    js_.reset();
    conn_.reset();
    for (natsMsg* m : queue_)
      natsMsg_Destroy(m);
  }

  /// Waits up to `timeout` for messages, then handles what arrived (at most
  /// max_messages_per_round), including any replay a gap needs. Returns the
  /// messages handled. Throws logic_error while the start() thread runs.
  std::size_t poll(std::chrono::milliseconds timeout) {
    before_poll("NatsKvSubscriber::poll with the thread running");
    return poll_once(timeout);
  }

  /// Starts a thread that polls until stop(); read with with_index(). No-op
  /// if running; after the thread ended on an exception, starts a new one.
  void start() { start_thread(); }

  /// Stops the start() thread and waits for it. No-op when not running.
  void stop() { stop_thread(); }

  /// True while the start() thread runs. O(1).
  [[nodiscard]] bool running() const noexcept { return Follower::running(); }

  /// The exception that ended the thread, if any.
  [[nodiscard]] std::exception_ptr thread_error() const { return thread_error_locked(); }

  /// Calls f(const KvIndex&) with the index locked against the thread's
  /// updates and returns its result; waits for at most one slice of
  /// max_blocks_per_lock blocks.
  template <class F>
  decltype(auto) with_index(F&& f) const {
    const auto lock = reader_lock();
    return std::forward<F>(f)(std::as_const(index_));
  }

  /// The index, for callers that drive poll() themselves (no locking). O(1).
  [[nodiscard]] const KvIndex& index() const noexcept { return index_; }

  /// Every stream seen so far, ordered by worker. O(streams).
  [[nodiscard]] std::vector<NatsKvStreamInfo> streams() const {
    const auto lock = reader_lock();
    std::vector<NatsKvStreamInfo> out;
    out.reserve(streams_.size());
    for (const auto& [w, s] : streams_)
      out.push_back(NatsKvStreamInfo{w, s->cursor.last_applied_id(), s->counters});
    return out;
  }

  /// Counters of stream `w`; all zero for a stream not seen. O(log streams).
  [[nodiscard]] KvPublisherCounters counters(const KvWorker& w) const {
    const auto lock = reader_lock();
    const auto it = streams_.find(w);
    return it == streams_.end() ? KvPublisherCounters{} : it->second->counters;
  }

  /// The sum of every stream's counters. O(streams).
  [[nodiscard]] KvPublisherCounters total_counters() const {
    const auto lock = reader_lock();
    KvPublisherCounters sum;
    for (const auto& [w, s] : streams_)
      sum += s->counters;
    return sum;
  }

  /// The last applied seq of stream `w`; nullopt before its first batch,
  /// after a reset, or for a stream not seen. O(log streams).
  [[nodiscard]] std::optional<std::uint64_t> last_seq(const KvWorker& w) const {
    const auto lock = reader_lock();
    const auto it = streams_.find(w);
    return it == streams_.end() ? std::nullopt : it->second->cursor.last_applied_id();
  }

  /// The connection's counters. O(1).
  [[nodiscard]] NatsKvTransportCounters transport_counters() const {
    NatsKvTransportCounters c;
    {
      const auto lock = reader_lock();
      c.messages = messages_;
      c.unidentified = unidentified_;
      c.redelivered = redelivered_;
    }
    c.dropped = dropped_.load();
    for (const auto& s : subs_) {
      int64_t d = 0;
      if (natsSubscription_GetDropped(s->get(), &d) == NATS_OK && d > 0)
        c.dropped += static_cast<std::uint64_t>(d);
    }
    c.disconnects = conn_->disconnects();
    c.reconnects = conn_->reconnects();
    return c;
  }

  /// True while connected to a server (false while reconnecting). O(1).
  [[nodiscard]] bool connected() const noexcept { return conn_->connected(); }

  /// In durable mode, the JetStream stream sequence of the last message
  /// handled (applied, dropped or found malformed), or the restored
  /// snapshot's: every message at or below it is in the index, none above.
  /// 0 before any, and in core mode. O(1).
  [[nodiscard]] std::uint64_t stream_sequence() const {
    const auto lock = reader_lock();
    return stream_seq_;
  }

  /// The replica document: the index (kv_index_snapshot), every stream's
  /// seq cursor and decoder state, current at stream_sequence(), which it
  /// carries. Taken between two messages (it waits for the one being
  /// handled). The polling thread applies nothing until it returns (O(blocks
  /// held), about 0.1-0.2 s per million pairs on an idle core); with_index()
  /// and the other readers are answered meanwhile: the index lock is held only
  /// to copy the streams' state. Throws only std::bad_alloc.
  /// docs/nats_kv_subscriber.md#durable-replicas.
  [[nodiscard]] std::vector<std::byte> snapshot() const {
    auto lock = reader_lock();
    // Turns, so that neither side waits long: a message the polling thread has
    // taken up goes before this snapshot (snapshots back to back would
    // otherwise hold it off, while it competes with the readers for the
    // lock), and a snapshot waiting for the end of a message goes before the
    // next message.
    if (message_pending_.load(std::memory_order_relaxed)) {
      const std::uint64_t started = messages_started_;
      boundary_cv_.wait(lock, [this, started] {
        return messages_started_ != started || !message_pending_.load(std::memory_order_relaxed);
      });
    }
    if (in_message_) {
      ++boundary_waiters_;
      boundary_cv_.wait(lock, [this] { return !in_message_; });
      --boundary_waiters_;
    }
    std::vector<std::byte> out;
    std::vector<std::byte> index;
    detail::NatsReplicaWriter w(out);
    {
      // Its end, on every exit (a throw included), lets the next message in.
      const SnapshotPause pause(*this, lock);
      write_streams(out);
      // Serialized without the lock, which readers take meanwhile: the index
      // only changes inside a message or a restore, and both wait for the
      // pause to end. Concurrent const reads of a KvIndex are safe.
      const std::uint64_t seq = stream_seq_;
      lock.unlock();
      index = kv_index_snapshot(index_, seq);
    }
    lock.unlock();
    out.reserve(out.size() + 16 + index.size());
    w.u(index.size(), 8);
    out.insert(out.end(), index.begin(), index.end());
    w.u(detail::xxh3_64(out.data(), out.size()), 8);
    return out;
  }

  /// Restores a replica document (snapshot()) into this subscriber, which
  /// must not have handled a message: index, streams and stream_sequence()
  /// are then the snapshotted replica's (counters start at zero), and
  /// messages at or below that sequence are acknowledged without being
  /// applied (construct with jetstream.start_sequence = stream_sequence() + 1
  /// to skip them server-side). All or nothing: on any error nothing changes and the
  /// status says why (index_not_empty after a message). Throws logic_error
  /// while the start() thread runs. O(document + blocks restored).
  KvSnapshotStatus restore(std::span<const std::byte> document) {
    before_poll("NatsKvSubscriber::restore with the thread running");
    using E = KvSnapshotErrc;
    auto lock = reader_lock();
    // A snapshot() on another thread reads the index without the lock.
    boundary_cv_.wait(lock, [this] { return snapshots_ == 0; });
    if (document.empty()) return {E::empty, "no bytes"};
    if (messages_ != 0 || !streams_.empty() || index_.worker_count() != 0U)
      return {E::index_not_empty, "the subscriber handled messages"};
    const std::size_t n = document.size();
    if (n < detail::nats_replica_magic.size() ||
        std::memcmp(document.data(), detail::nats_replica_magic.data(),
                    detail::nats_replica_magic.size()) != 0)
      return {E::bad_magic, "not a replica document"};
    if (n < detail::nats_replica_head) return {E::truncated, "bytes end inside the header"};
    detail::NatsReplicaReader r(document);
    (void)r.u(8);
    if (r.u(8) != 1) return {E::unsupported_version, "unknown replica document version"};
    const std::uint64_t seq = r.u(8);
    const std::uint64_t count = r.u(4);
    if ((n - r.at()) / detail::nats_replica_record < count)
      return {E::truncated, "bytes end inside the streams"};
    const std::size_t index_at =
        r.at() + static_cast<std::size_t>(count) * detail::nats_replica_record;
    if (n - index_at < 8) return {E::truncated, "bytes end before the index"};
    detail::NatsReplicaReader li(document.subspan(index_at));
    const std::uint64_t index_len = li.u(8);
    if (n - index_at - 8 < 8 || index_len > n - index_at - 16)
      return {E::truncated, "bytes end inside the index"};
    if (index_len != n - index_at - 16) return {E::trailing_bytes, "bytes after the document"};
    detail::NatsReplicaReader cr(document.subspan(n - 8));
    if (detail::xxh3_64(document.data(), n - 8) != cr.u(8))
      return {E::bad_checksum, "checksum mismatch"};
    try {
      std::vector<detail::NatsReplicaStream> states;
      states.reserve(static_cast<std::size_t>(count));
      for (std::uint64_t i = 0; i < count; ++i) {
        detail::NatsReplicaStream st;
        st.worker.worker_id = r.u(8);
        st.worker.dp_rank = static_cast<std::uint32_t>(r.u(4));
        const std::uint64_t flags = r.u(1);
        const std::uint64_t last = r.u(8);
        if (flags > 1U) return {E::bad_format, "stream flags"};
        if (flags == 1U) st.last_seq = last;
        st.next_event_id = r.u(8);
        st.last_hash = r.u(8);
        std::uint64_t known[detail::nats_replica_groups] = {};
        for (std::uint64_t& k : known)
          k = r.u(8);
        for (std::size_t w = 0; w < detail::nats_replica_groups; ++w) {
          const std::uint64_t main = r.u(8);
          if ((main & ~known[w]) != 0U) return {E::bad_format, "a main group not known"};
          for (std::uint32_t b = 0; b < 64U; ++b)
            if ((known[w] >> b) & 1U) st.wire.learn(w * 64U + b, ((main >> b) & 1U) != 0U);
        }
        if (!states.empty() && !(states.back().worker < st.worker))
          return {E::bad_format, "streams not in strictly increasing order"};
        states.push_back(st);
      }
      KvIndex built(index_.options());
      KvSnapshotInfo info;
      const KvSnapshotStatus st = restore_kv_index(
          document.subspan(index_at + 8, static_cast<std::size_t>(index_len)), built, info);
      if (!st.ok()) return st;
      if (info.stream_sequence != seq)
        return {E::bad_format, "the index is current at another sequence"};
      std::map<KvWorker, std::unique_ptr<Stream>> made;
      for (const detail::NatsReplicaStream& x : states) {
        auto p = std::make_unique<Stream>();
        p->worker = x.worker;
        p->replay_subject = options_.prefix + "." + std::to_string(x.worker.worker_id) + ".replay";
        init_stream(*p);
        if (x.last_seq) {
          p->cursor = CursorState<>::initial().advance_to(*x.last_seq);
          p->last_hash = x.last_hash;
          if (!p->recent.empty())
            p->recent[static_cast<std::size_t>(*x.last_seq % p->recent.size())] = {
                *x.last_seq, x.last_hash, true};
        }
        p->next_event_id = x.next_event_id;
        p->wire = x.wire;
        made.emplace(x.worker, std::move(p));
      }
      index_.swap(built);
      streams_.swap(made);
      stream_seq_ = seq;
      return {};
    } catch (const std::bad_alloc&) {
      return {E::out_of_memory, "allocation failed"};
    }
  }

 private:
  // The replica document's head and stream records, current at stream_seq_.
  // Under the lock.
  void write_streams(std::vector<std::byte>& out) const {
    detail::NatsReplicaWriter w(out);
    out.reserve(detail::nats_replica_head + streams_.size() * detail::nats_replica_record + 16);
    for (const char c : detail::nats_replica_magic)
      out.push_back(static_cast<std::byte>(c));
    w.u(1, 8);
    w.u(stream_seq_, 8);
    w.u(streams_.size(), 4);
    for (const auto& [worker, p] : streams_) {
      const std::optional<std::uint64_t> last = p->cursor.last_applied_id();
      w.u(worker.worker_id, 8);
      w.u(worker.dp_rank, 4);
      w.u(last ? 1 : 0, 1);
      w.u(last.value_or(0), 8);
      w.u(p->next_event_id, 8);
      w.u(p->last_hash, 8);
      std::uint64_t known[detail::nats_replica_groups] = {};
      std::uint64_t main[detail::nats_replica_groups] = {};
      for (std::uint32_t g = 0; g < KvWireStreamState::max_groups; ++g)
        if (const std::optional<bool> m = p->wire.is_main_group(g)) {
          known[g / 64U] |= std::uint64_t{1} << (g % 64U);
          if (*m) main[g / 64U] |= std::uint64_t{1} << (g % 64U);
        }
      for (const std::uint64_t k : known)
        w.u(k, 8);
      for (const std::uint64_t m : main)
        w.u(m, 8);
    }
  }

  // While the polling thread handles one message, which may release the lock
  // between slices and during replay waits: a snapshot waits for its end, and
  // a message waits for the snapshots being serialized (without the lock).
  struct MessageBoundary {
    MessageBoundary(NatsKvSubscriber& s, std::unique_lock<std::mutex>& lock) : sub(s) {
      sub.boundary_cv_.wait(lock,
                            [this] { return sub.snapshots_ == 0 && sub.boundary_waiters_ == 0; });
      sub.in_message_ = true;
      ++sub.messages_started_;
      sub.message_pending_.store(false, std::memory_order_relaxed);
      // The snapshots that waited for it to start now wait for its end.
      sub.boundary_cv_.notify_all();
    }
    ~MessageBoundary() {
      sub.in_message_ = false;
      sub.boundary_cv_.notify_all();
    }
    MessageBoundary(const MessageBoundary&) = delete;
    MessageBoundary& operator=(const MessageBoundary&) = delete;
    NatsKvSubscriber& sub;
  };

  // The polling thread's lock for the message it has taken up, which goes before any
  // snapshot started after this call; a MessageBoundary (or a skip) ends the claim.
  std::unique_lock<std::mutex> message_lock() {
    message_pending_.store(true, std::memory_order_relaxed);
    return applier_lock();
  }

  // A snapshot being taken: counted from its construction (under the lock)
  // until its destruction, which takes the lock back if the snapshot let it
  // go, and wakes a waiting message or restore.
  struct SnapshotPause {
    SnapshotPause(const NatsKvSubscriber& s, std::unique_lock<std::mutex>& l) noexcept
        : sub(s), lock(l) {
      ++sub.snapshots_;
    }
    ~SnapshotPause() {
      if (!lock.owns_lock()) lock.lock();
      --sub.snapshots_;
      sub.boundary_cv_.notify_all();
    }
    SnapshotPause(const SnapshotPause&) = delete;
    SnapshotPause& operator=(const SnapshotPause&) = delete;
    const NatsKvSubscriber& sub;
    std::unique_lock<std::mutex>& lock;
  };

  // libnats's delivery thread: queue the message for the polling thread.
  static void on_message(natsConnection*, natsSubscription*, natsMsg* msg, void* self) {
    auto* s = static_cast<NatsKvSubscriber*>(self);
    try {
      std::lock_guard<std::mutex> lock(s->queue_mutex_);
      if (s->queue_.size() < s->options_.max_pending) {
        s->queue_.push_back(msg);
        msg = nullptr;
      }
    } catch (const std::bad_alloc&) {
      // Counted as dropped: the gap shows on the stream's next batch.
    }
    if (msg != nullptr) {
      s->dropped_.fetch_add(1);
      natsMsg_Destroy(msg);
      return;
    }
    s->queue_cv_.notify_one();
  }

  std::chrono::steady_clock::time_point now() const {
    return options_.clock ? options_.clock() : std::chrono::steady_clock::now();
  }

  // Creates the stream (if asked) and the durable consumer when missing, and
  // binds a pull subscription to the consumer: bound rather than created by
  // the subscription, it outlives the subscriber.
  void open_jetstream(const std::string& filter) {
    const NatsKvJetStreamOptions& j = options_.jetstream;
    jsCtx* js = nullptr;
    detail::nats_check(natsConnection_JetStream(&js, conn_->get(), nullptr),
                       "natsConnection_JetStream");
    js_.reset(js);
    jsErrCode err = static_cast<jsErrCode>(0);
    if (j.create_stream) {
      jsStreamConfig cfg;
      jsStreamConfig_Init(&cfg);
      const std::string all = options_.prefix + ".*";
      const char* subjects[1] = {all.c_str()};
      cfg.Name = j.stream.c_str();
      cfg.Subjects = subjects;
      cfg.SubjectsLen = 1;
      cfg.Storage = js_FileStorage;
      jsStreamInfo* si = nullptr;
      const natsStatus s = js_AddStream(&si, js, &cfg, nullptr, &err);
      if (si != nullptr) jsStreamInfo_Destroy(si);
      if (s != NATS_OK && err != JSStreamNameExistErr) throw NatsKvError("js_AddStream", s);
    }
    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    cc.Durable = j.durable.c_str();
    cc.AckPolicy = js_AckExplicit;
    cc.DeliverPolicy = js_DeliverAll;
    if (j.start_sequence != 0) {
      cc.DeliverPolicy = js_DeliverByStartSequence;
      cc.OptStartSeq = j.start_sequence;
    }
    cc.AckWait = static_cast<std::int64_t>(j.ack_wait.count()) * 1000000;
    cc.FilterSubject = filter.c_str();
    jsConsumerInfo* ci = nullptr;
    err = static_cast<jsErrCode>(0);
    const natsStatus s = js_AddConsumer(&ci, js, j.stream.c_str(), &cc, nullptr, &err);
    if (ci != nullptr) jsConsumerInfo_Destroy(ci);
    if (s != NATS_OK && err != JSConsumerNameExistErr) throw NatsKvError("js_AddConsumer", s);
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = j.stream.c_str();
    so.Consumer = j.durable.c_str();
    natsSubscription* ps = nullptr;
    detail::nats_check(
        js_PullSubscribe(&ps, js, filter.c_str(), j.durable.c_str(), nullptr, &so, &err),
        "js_PullSubscribe");
    pull_sub_.reset(ps);
  }

  // Fetches up to max_messages_per_round batches, applies them, and
  // acknowledges each once applied.
  std::size_t poll_jetstream(std::chrono::milliseconds timeout) {
    natsMsgList list{nullptr, 0};
    const int batch = static_cast<int>(
        std::min<std::size_t>(options_.max_messages_per_round, std::numeric_limits<int>::max()));
    const natsStatus s = natsSubscription_Fetch(
        &list, pull_sub_.get(), batch, std::max<std::int64_t>(timeout.count(), 1), nullptr);
    work_.clear();
    for (int i = 0; i < list.Count; ++i) {
      work_.emplace_back(list.Msgs[i]);
      list.Msgs[i] = nullptr;
    }
    natsMsgList_Destroy(&list);
    if (s != NATS_OK && s != NATS_TIMEOUT && work_.empty()) {
      // Disconnected: wait out the timeout rather than spin.
      std::unique_lock<std::mutex> q(queue_mutex_);
      queue_cv_.wait_for(q, timeout);
      return 0;
    }
    std::size_t handled = 0;
    for (auto& m : work_) {
      ++handled;
      const std::uint64_t at = detail::nats_stream_sequence(m.get());
      {
        std::unique_lock<std::mutex> lock = message_lock();
        if (at != 0 && at <= stream_seq_) {
          // Applied already: by this subscriber before a redelivery, or by
          // the replica whose snapshot was restored.
          ++redelivered_;
          message_pending_.store(false, std::memory_order_relaxed);
          boundary_cv_.notify_all();
        } else {
          const Holding holding(*this, lock);
          const MessageBoundary boundary(*this, lock);
          handle(m.get());
          stream_seq_ = std::max(stream_seq_, at);
        }
      }
      natsMsg_Ack(m.get(), nullptr);
      m.reset();
    }
    work_.clear();
    return handled;
  }

  std::size_t poll_once(std::chrono::milliseconds timeout) {
    if (pull_sub_ != nullptr) return poll_jetstream(timeout);
    work_.clear();
    {
      std::unique_lock<std::mutex> q(queue_mutex_);
      queue_cv_.wait_for(q, timeout, [this] { return !queue_.empty(); });
      while (!queue_.empty() && work_.size() < options_.max_messages_per_round) {
        work_.emplace_back(queue_.front());
        queue_.pop_front();
      }
    }
    std::size_t handled = 0;
    for (auto& m : work_) {
      ++handled;
      std::unique_lock<std::mutex> lock = message_lock();
      const Holding holding(*this, lock);
      const MessageBoundary boundary(*this, lock);
      const detail::NatsMsgPtr msg = std::move(m);
      handle(msg.get());
    }
    work_.clear();
    return handled;
  }

  // The worker token of a subject P.<decimal>.
  std::optional<std::uint64_t> subject_worker(std::string_view subject) const noexcept {
    const std::string_view p = options_.prefix;
    if (subject.size() <= p.size() + 1 || subject.substr(0, p.size()) != p ||
        subject[p.size()] != '.')
      return std::nullopt;
    return detail::nats_parse_u64(subject.substr(p.size() + 1));
  }

  void handle(natsMsg* m) {
    ++messages_;
    NatsKvEnvelope env;
    const char* subject = natsMsg_GetSubject(m);
    env.subject = subject != nullptr ? subject : "";
    env.subject_worker = subject_worker(env.subject);
    env.seq = detail::nats_header_u64(m, nats_kv_seq_header);
    if (const auto r = detail::nats_header_u64(m, nats_kv_dp_rank_header);
        r && *r <= std::numeric_limits<std::uint32_t>::max())
      env.dp_rank = static_cast<std::uint32_t>(*r);
    env.payload = detail::nats_payload(m);
    const std::optional<NatsKvBatchId> id = options_.decoder->identify(env);
    if (!id) {
      ++unidentified_;
      return;
    }
    Stream& p = stream(id->worker);
    ++p.counters.messages;
    // The end marker is never a batch: taken for one it would move the
    // cursor past every seq the publisher will ever send.
    if (id->seq == end_marker) {
      ++p.counters.bad_frames;
      return;
    }
    live(p, id->seq, env.payload);
  }

  Stream& stream(const KvWorker& w) {
    auto it = streams_.find(w);
    if (it == streams_.end()) {
      auto s = std::make_unique<Stream>();
      s->worker = w;
      s->replay_subject = options_.prefix + "." + std::to_string(w.worker_id) + ".replay";
      init_stream(*s);
      it = streams_.emplace(w, std::move(s)).first;
    }
    return *it->second;
  }

  // ---- the follower's transport ----

  KvWireStatus decode_payload(Stream& /*p*/, detail::KvPayload payload, KvWireBatch& out,
                              KvWireStreamState& state) {
    return options_.decoder->decode(payload, out, state);
  }

  bool has_replay(const Stream& /*p*/) const noexcept { return replay_sub_ != nullptr; }

  // Replies to an abandoned request carry its reply subject, which no later
  // request uses: they are skipped.
  void replay_abandon(Stream& /*p*/) noexcept { reply_.reset(); }

  bool replay_send(Stream& p, std::uint64_t from) {
    reply_subject_ = inbox_ + "." + std::to_string(++request_id_);
    unsigned char req[12];
    for (std::size_t i = 0; i < 8; ++i)
      req[i] = static_cast<unsigned char>(from >> (56U - 8U * i));
    for (std::size_t i = 0; i < 4; ++i)
      req[8 + i] = static_cast<unsigned char>(p.worker.dp_rank >> (24U - 8U * i));
    if (natsConnection_PublishRequest(conn_->get(), p.replay_subject.c_str(),
                                      reply_subject_.c_str(), req,
                                      static_cast<int>(sizeof req)) != NATS_OK)
      return false;
    replay_deadline_ = now() + options_.replay_timeout;
    return true;
  }

  detail::KvReplayStep replay_next(Stream& p, std::uint64_t& seq, detail::KvPayload& payload) {
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(replay_deadline_ - now());
      if (left.count() < 0) return detail::KvReplayStep::silent;
      natsMsg* raw = nullptr;
      natsStatus s = NATS_OK;
      {
        const auto unlocked = unlocked_wait();
        s = natsSubscription_NextMsg(&raw, replay_sub_.get(),
                                     std::max<std::int64_t>(left.count(), 1));
      }
      if (s == NATS_TIMEOUT) continue;                        // re-check the deadline
      if (s != NATS_OK) return detail::KvReplayStep::silent;  // closed, slow consumer
      detail::NatsMsgPtr m(raw);
      const char* subject = natsMsg_GetSubject(raw);
      if (subject == nullptr || reply_subject_ != subject) continue;  // an older request's
      // Nobody serves the replay subject: no answer will come.
      if (natsMsg_IsNoResponders(raw)) return detail::KvReplayStep::silent;
      replay_deadline_ = now() + options_.replay_timeout;
      const std::optional<std::uint64_t> r = detail::nats_header_u64(raw, nats_kv_seq_header);
      if (!r) {
        ++p.counters.bad_frames;
        continue;
      }
      if (*r == end_marker) return detail::KvReplayStep::end;
      seq = *r;
      reply_ = std::move(m);
      payload = detail::nats_payload(reply_.get());
      return detail::KvReplayStep::batch;
    }
  }

  NatsKvSubscriberOptions options_;
  std::unique_ptr<detail::NatsConnection> conn_;
  std::vector<std::unique_ptr<detail::NatsAsyncSubscription>> subs_;
  detail::NatsSyncSubscriptionPtr replay_sub_;
  detail::NatsJsPtr js_;
  detail::NatsSyncSubscriptionPtr pull_sub_;  // the durable consumer's, in JetStream mode
  std::string inbox_;
  std::string reply_subject_;
  std::uint64_t request_id_ = 0;
  detail::NatsMsgPtr reply_;  // the replay reply being applied
  std::chrono::steady_clock::time_point replay_deadline_{};
  std::map<KvWorker, std::unique_ptr<Stream>> streams_;
  std::uint64_t messages_ = 0;
  std::uint64_t unidentified_ = 0;
  std::uint64_t redelivered_ = 0;
  std::uint64_t stream_seq_ = 0;              // the JetStream sequence of the last message handled
  bool in_message_ = false;                   // the polling thread is inside handle()
  std::uint64_t messages_started_ = 0;        // messages handled (MessageBoundary), under the lock
  std::atomic<bool> message_pending_{false};  // from message_lock() to the start or skip
  mutable std::size_t snapshots_ = 0;         // snapshot() calls past their wait
  mutable std::size_t boundary_waiters_ = 0;  // snapshot() calls waiting for a message's end
  mutable std::condition_variable boundary_cv_;
  std::atomic<std::uint64_t> dropped_{0};
  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<natsMsg*> queue_;
  std::vector<detail::NatsMsgPtr> work_;
};

/// Publisher settings.
struct NatsKvPublisherOptions {
  NatsKvConnectionOptions connection;  ///< Where and how to connect.
  /// Subject prefix P (as NatsKvSubscriberOptions::prefix).
  std::string prefix = dynamo_kv_events_subject("dynamo", "backend");
  KvWorker worker;  ///< This publisher's worker id (subject P.<id>) and dp rank.
  /// Batches kept for replay requests (the newest); 0: none (requests get
  /// the end marker alone).
  std::size_t buffer_batches = 4096;
  /// Answer replay requests on P.<id>.replay.
  bool answer_replays = true;
};

/// What a publisher did, since construction.
struct NatsKvPublisherCounters {
  std::uint64_t published = 0;         ///< Batches handed to the connection.
  std::uint64_t publish_failures = 0;  ///< Batches the connection refused (still buffered).
  std::uint64_t replay_requests = 0;   ///< Replay requests answered (this dp rank).
  std::uint64_t batches_replayed = 0;  ///< Batches sent in answers.
  std::uint64_t bad_requests = 0;      ///< Requests without a reply subject or of the wrong size.
};

/// The engine side: publishes encoded batches on P.<worker_id> with their
/// seq and dp rank, keeps the newest buffer_batches for replay, and answers
/// replay requests. publish() may be called from any one thread at a time;
/// answers run on libnats's thread.
class NatsKvPublisher {
 public:
  /// Connects and (with answer_replays) subscribes to P.<id>.replay. Throws
  /// std::invalid_argument for a bad prefix, NatsKvError when the server
  /// cannot be reached within connection.connect_timeout.
  explicit NatsKvPublisher(NatsKvPublisherOptions options) : options_(std::move(options)) {
    detail::nats_check_subject(options_.prefix, "NatsKvPublisher");
    subject_ = options_.prefix + "." + std::to_string(options_.worker.worker_id);
    replay_subject_ = subject_ + ".replay";
    conn_ = std::make_unique<detail::NatsConnection>(options_.connection, "NatsKvPublisher");
    if (options_.answer_replays) {
      replay_sub_ = std::make_unique<detail::NatsAsyncSubscription>(
          conn_->get(), replay_subject_, &NatsKvPublisher::on_request, this);
      detail::nats_check(
          natsConnection_FlushTimeout(conn_->get(), options_.connection.connect_timeout.count()),
          "natsConnection_FlushTimeout");
    }
  }
  NatsKvPublisher(const NatsKvPublisher&) = delete;
  NatsKvPublisher& operator=(const NatsKvPublisher&) = delete;
  /// Stops answering (waits for an answer in progress), then closes.
  ~NatsKvPublisher() {
    replay_sub_.reset();
    conn_.reset();
  }

  /// Buffers batch `payload` as `seq` and publishes it. False when the
  /// connection refused it (closed, its reconnect buffer full, or larger than
  /// the server's max_payload): it stays buffered, for a replay. Throws
  /// std::length_error (buffering nothing) above 2^31 - 1 bytes, which no
  /// NATS message can hold. O(payload).
  bool publish(std::uint64_t seq, std::span<const std::byte> payload) {
    if (payload.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()))
      throw std::length_error("NatsKvPublisher: a batch above 2^31 - 1 bytes");
    remember(seq, payload);
    const detail::NatsMsgPtr m =
        detail::nats_batch_msg(subject_, nullptr, seq, options_.worker.dp_rank, payload);
    const bool ok = natsConnection_PublishMsg(conn_->get(), m.get()) == NATS_OK;
    std::lock_guard<std::mutex> lock(mutex_);
    ++(ok ? counters_.published : counters_.publish_failures);
    return ok;
  }

  /// publish() of a string's bytes. O(payload).
  bool publish(std::uint64_t seq, std::string_view payload) {
    return publish(seq, std::as_bytes(std::span<const char>(payload.data(), payload.size())));
  }

  /// Buffers batch `payload` as `seq` for replays without publishing it (a
  /// batch sent another way, or whose send failed). Drops the oldest beyond
  /// buffer_batches. O(payload).
  void remember(std::uint64_t seq, std::span<const std::byte> payload) {
    if (options_.buffer_batches == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    buffer_.emplace_back(seq, std::vector<std::byte>(payload.begin(), payload.end()));
    while (buffer_.size() > options_.buffer_batches)
      buffer_.pop_front();
  }

  /// remember() of a string's bytes. O(payload).
  void remember(std::uint64_t seq, std::string_view payload) {
    remember(seq, std::as_bytes(std::span<const char>(payload.data(), payload.size())));
  }

  /// Waits until the server has everything published so far; false after
  /// `timeout` or while disconnected.
  bool flush(std::chrono::milliseconds timeout) {
    return natsConnection_FlushTimeout(conn_->get(), std::max<std::int64_t>(timeout.count(), 1)) ==
           NATS_OK;
  }

  /// True while connected (false while reconnecting). O(1).
  [[nodiscard]] bool connected() const noexcept { return conn_->connected(); }

  /// The live subject, P.<worker_id>. O(1).
  [[nodiscard]] const std::string& subject() const noexcept { return subject_; }
  /// The replay request subject, P.<worker_id>.replay. O(1).
  [[nodiscard]] const std::string& replay_subject() const noexcept { return replay_subject_; }

  /// The counters. O(1).
  [[nodiscard]] NatsKvPublisherCounters counters() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return counters_;
  }

 private:
  static void on_request(natsConnection* nc, natsSubscription*, natsMsg* raw, void* self) {
    const detail::NatsMsgPtr m(raw);
    try {
      static_cast<NatsKvPublisher*>(self)->answer(nc, raw);
    } catch (...) {
      // Out of memory (here or in libnats): the requester times out and resets.
    }
  }

  void answer(natsConnection* nc, natsMsg* m) {
    const char* reply = natsMsg_GetReply(m);
    const auto req = detail::nats_payload(m);
    if (reply == nullptr || *reply == '\0' || (req.size() != 8 && req.size() != 12)) {
      std::lock_guard<std::mutex> lock(mutex_);
      ++counters_.bad_requests;
      return;
    }
    std::uint64_t from = 0;
    for (std::size_t i = 0; i < 8; ++i)
      from = (from << 8) | static_cast<std::uint8_t>(req[i]);
    std::uint32_t rank = 0;
    for (std::size_t i = 8; i < req.size(); ++i)
      rank = (rank << 8) | static_cast<std::uint8_t>(req[i]);
    if (rank != options_.worker.dp_rank) return;  // another rank's publisher answers
    std::vector<std::pair<std::uint64_t, std::vector<std::byte>>> out;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++counters_.replay_requests;
      for (const auto& b : buffer_)
        if (b.first >= from) out.push_back(b);
      counters_.batches_replayed += out.size();
    }
    const std::string to(reply);
    for (const auto& [seq, payload] : out) {
      const detail::NatsMsgPtr r = detail::nats_batch_msg(to, nullptr, seq, std::nullopt, payload);
      if (natsConnection_PublishMsg(nc, r.get()) != NATS_OK) return;
    }
    const detail::NatsMsgPtr end =
        detail::nats_batch_msg(to, nullptr, ~std::uint64_t{0}, std::nullopt, {});
    natsConnection_PublishMsg(nc, end.get());
  }

  NatsKvPublisherOptions options_;
  std::string subject_;
  std::string replay_subject_;
  std::unique_ptr<detail::NatsConnection> conn_;
  std::unique_ptr<detail::NatsAsyncSubscription> replay_sub_;
  mutable std::mutex mutex_;
  std::deque<std::pair<std::uint64_t, std::vector<std::byte>>> buffer_;
  NatsKvPublisherCounters counters_;
};

}  // namespace promptcache

#endif  // PROMPTCACHE_NATS_KV_SUBSCRIBER_HPP
