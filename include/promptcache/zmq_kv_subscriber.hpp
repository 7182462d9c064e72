// promptcache: zmq_kv_subscriber.hpp
// SPDX-License-Identifier: Apache-2.0
//
// A router's ingestion of the KV event streams vLLM and SGLang publish over
// ZeroMQ: subscribes to N publishers (one per engine data-parallel rank),
// follows each one's batch sequence numbers with a CursorState, fetches lost
// batches from the publisher's replay socket, tells a publisher restart from a
// late duplicate, and applies every batch, in sequence order, to a KvIndex.
//
// Wire protocol (the engines' kv_events.py):
//   live:   PUB -> SUB, multipart [topic, seq (8 bytes big-endian), payload]
//   replay: DEALER sends [empty, start seq (8 bytes big-endian)] to the
//           publisher's ROUTER, which streams [empty, seq, payload] (some
//           versions: [empty, topic, seq, payload]) for every buffered batch
//           with seq >= start, then [empty, -1 (8 bytes), empty].
//
// Rules (docs/kv_event_wire.md has the details):
//   * seq = last + 1 applies. The first batch of a publisher is expected at
//     seq 0; anything else is a gap from 0 (a router joining late catches up
//     from the replay buffer).
//   * A gap asks the replay socket for every batch from the last applied seq
//     L on (from 0 before the first batch). A reply for L whose bytes differ
//     from the batch applied as L is a restarted publisher: the view is reset
//     and the replay asked again from 0. If the buffer no longer reaches back
//     to L + 1 (or there is no replay socket, or it falls silent for
//     replay_timeout) the worker's view is reset (dropped from the index) and
//     the stream continues from the oldest batch still available; counted as
//     an unrecoverable gap. A live seq beyond the newest batch the replay
//     returned was never published: it is dropped (bad_frames), as is a live
//     seq of 2^64 - 1, the replay's end marker.
//   * seq <= last is a late duplicate or a restarted publisher, told by the
//     bytes, never by the batch timestamps (the engine's wall clock, which
//     may step back across a restart): the same process resends the exact
//     bytes it published. In order, (1) when seq is one of the last
//     remembered_batches applied, the bytes applied there decide: the same
//     bytes are a duplicate, other bytes a restart; (2) otherwise the replay
//     socket, asked from L, decides: other bytes for L, or nothing from L
//     on, is a restart, the bytes applied as L a duplicate; (3) with no
//     answer (no replay socket, or it falls silent: not asked again until
//     the cursor moves), seq <= restart_max_seq is a restart and a larger
//     seq a duplicate. A
//     restart resets the view and the learned attention groups, and the
//     stream restarts at seq 0 (replaying [0, seq) if seq > 0).
//   * A payload that does not decode consumes its seq, applies nothing, and is
//     counted (a replay would return the same bytes).
//   * After a gap the replay could not fill (but did answer), the subscriber
//     asks for the publisher's state dump (start seq 2^64 - 2, see
//     kv_event_publisher.hpp): when one comes, the worker's view is replaced
//     with it (KvIndex::replace_worker) and the stream continues from the seq
//     it is current at. vLLM answers with the end marker alone: nothing changes.
//
// Two ways to drive it: call poll(timeout) from your own event loop, or
// start() a background thread; with the thread, read the index through
// with_index(). Applying holds the index lock for at most
// max_blocks_per_lock blocks (whole events; at least one) and never while
// waiting on a socket, so routing queries keep being answered during a long
// replay or catch-up; they may see a batch (or a catch-up) partly applied,
// event by event, as they would see the same events arrive in separate
// batches. Needs cppzmq and libzmq (and msgpack-cxx, for the decoder).
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
#endif
#if !defined(PROMPTCACHE_ZMQ_KV_SUBSCRIBER_HPP) && \
    (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) >= 202002L
#define PROMPTCACHE_ZMQ_KV_SUBSCRIBER_HPP

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "promptcache/detail/kv_stream_follower.hpp"
#include "promptcache/kv_event_wire.hpp"
#include "promptcache/kv_index.hpp"

namespace promptcache {

/// One publisher to follow: an engine's (worker's) data-parallel rank.
struct KvPublisherEndpoint {
  std::string endpoint;         ///< Its PUB address, e.g. "tcp://10.0.0.5:5557" (port + dp rank).
  std::string replay_endpoint;  ///< Its ROUTER replay address; empty: no replay (gaps reset).
  KvWorker worker;              ///< The index worker its events feed.
  std::string topic;            ///< Subscription prefix; "" receives every topic.
};

/// Subscriber settings shared by all publishers.
struct ZmqKvSubscriberOptions {
  KvWireOptions wire;  ///< Payload decoding options.
  /// How long a replay may stay silent (from the request to its first reply,
  /// and between replies) before it is given up (replay_timeouts). >= 0.
  std::chrono::milliseconds replay_timeout{2000};
  /// An old seq that neither the remembered bytes nor the replay socket can
  /// place is a restart up to this value, a duplicate above it (see the
  /// header comment).
  std::uint64_t restart_max_seq = 1024;
  /// The payload hashes of this many last applied seqs are kept per
  /// publisher (16 bytes each), to tell a late duplicate (same bytes) from a
  /// restarted publisher (other bytes) without the replay socket. 0: none.
  std::size_t remembered_batches = 1024;
  /// The index lock is released after at most this many blocks (counting an
  /// event without blocks as one) are applied under it, between two events,
  /// so with_index() callers wait for at most one slice. An event is never
  /// split. 0: no limit (a whole batch, or replay, under one hold).
  std::size_t max_blocks_per_lock = 4096;
  /// ZMQ_RCVHWM of the SUB sockets: messages buffered before ZeroMQ drops
  /// (0: no limit). >= 0.
  int receive_hwm = 100000;
  /// At most this many live messages per publisher per poll() round, so one
  /// busy publisher cannot starve the others. Must be at least 1 (the
  /// constructor throws std::invalid_argument for 0).
  std::size_t max_messages_per_round = 1024;
  /// The time source of replay_timeout; empty: std::chrono::steady_clock.
  /// Called on the polling thread; an exception it throws ends poll() (or the
  /// start() thread, kept in thread_error()).
  std::function<std::chrono::steady_clock::time_point()> clock;
  /// After a gap the replay buffer cannot fill (a late join, a long outage, a restart
  /// whose first batches are gone), ask the publisher's replay socket for its state dump
  /// (docs/kv_event_publisher.md) and replace the worker's view with it. A publisher
  /// without dumps (vLLM, SGLang) answers with the end marker alone: one round trip,
  /// then the view continues as it would without this option.
  bool state_dumps = true;
};

namespace detail {

// One publisher: the follower's stream state plus its sockets.
struct ZmqKvStream : KvStream {
  KvPublisherEndpoint cfg;
  zmq::socket_t sub;
  zmq::socket_t replay;
  bool has_replay = false;
};

}  // namespace detail

/// Follows N KV event publishers into one KvIndex (owned). Sockets are used by
/// one thread at a time: either the caller's poll() or the start() thread.
/// Construction connects (ZeroMQ connects lazily, so unreachable publishers
/// are not an error); a malformed endpoint throws zmq::error_t.
class ZmqKvSubscriber : private detail::KvStreamFollower<ZmqKvSubscriber, detail::ZmqKvStream> {
  using Follower = detail::KvStreamFollower<ZmqKvSubscriber, detail::ZmqKvStream>;
  friend Follower;
  using Pub = detail::ZmqKvStream;

 public:
  /// Subscribes to every publisher of `publishers`. O(publishers). Throws
  /// std::invalid_argument when options.max_messages_per_round is 0 or
  /// replay_timeout or receive_hwm is negative. The index keeps orphan chains
  /// by default: after a late join or a reset, a block stored under a prefix
  /// the view never saw is routable by name (KvIndex::find_matches with block
  /// names) and grafted once any worker places its parent.
  explicit ZmqKvSubscriber(
      std::vector<KvPublisherEndpoint> publishers, ZmqKvSubscriberOptions options = {},
      KvIndexOptions index_options = {.on_gap = KvGapPolicy::report,
                                      .on_unknown_parent = KvUnknownParent::keep_orphan})
      : Follower(detail::KvFollowerRules{options.restart_max_seq, options.remembered_batches,
                                         options.max_blocks_per_lock},
                 index_options),
        options_(std::move(options)),
        decoder_(options_.wire) {
    state_dumps_ = options_.state_dumps;
    // 0 would read nothing, and the start() thread would spin.
    if (options_.max_messages_per_round == 0)
      throw std::invalid_argument("ZmqKvSubscriber: max_messages_per_round must be at least 1");
    // A negative timeout would give every replay up at once, so every gap
    // would reset the view.
    if (options_.replay_timeout.count() < 0)
      throw std::invalid_argument("ZmqKvSubscriber: replay_timeout must not be negative");
    if (options_.receive_hwm < 0)
      throw std::invalid_argument("ZmqKvSubscriber: receive_hwm must not be negative");
    pubs_.reserve(publishers.size());
    for (auto& cfg : publishers) {
      auto p = std::make_unique<Pub>();
      p->cfg = std::move(cfg);
      p->worker = p->cfg.worker;
      init_stream(*p);
      p->sub = zmq::socket_t(ctx_, zmq::socket_type::sub);
      p->sub.set(zmq::sockopt::linger, 0);
      p->sub.set(zmq::sockopt::rcvhwm, options_.receive_hwm);
      p->sub.set(zmq::sockopt::subscribe, p->cfg.topic);
      p->sub.connect(p->cfg.endpoint);
      if (!p->cfg.replay_endpoint.empty()) open_replay(*p);
      pubs_.push_back(std::move(p));
    }
  }

  ZmqKvSubscriber(const ZmqKvSubscriber&) = delete;
  ZmqKvSubscriber& operator=(const ZmqKvSubscriber&) = delete;

  /// Stops the thread (if started) and closes the sockets.
  ~ZmqKvSubscriber() { stop(); }

  /// Waits up to `timeout` for messages, then handles what arrived (at most
  /// max_messages_per_round per publisher), including any replay a gap needs
  /// (read to its end, given up after replay_timeout of silence). Returns the
  /// live messages handled.
  /// Must not be called while the start() thread runs (throws logic_error);
  /// after that thread ended on an exception, poll() joins it and goes on.
  std::size_t poll(std::chrono::milliseconds timeout) {
    before_poll("ZmqKvSubscriber::poll with the thread running");
    return poll_once(timeout);
  }

  /// Starts a thread that polls until stop(); read the index with
  /// with_index(). No-op if already running. After the thread ended on an
  /// exception, joins it, clears thread_error() and starts a new one.
  void start() { start_thread(); }

  /// Stops the thread started by start() and waits for it (at most about one
  /// poll interval plus a replay in progress). No-op when not running.
  void stop() { stop_thread(); }

  /// True while the start() thread runs: false once stop() returned or the
  /// thread ended on an exception (see thread_error()). O(1).
  [[nodiscard]] bool running() const noexcept { return Follower::running(); }

  /// The exception that ended the thread, if any (for example a ZeroMQ error).
  [[nodiscard]] std::exception_ptr thread_error() const { return thread_error_locked(); }

  /// Calls f(const KvIndex&) with the index locked against the thread's
  /// updates, and returns its result. Waits for at most one slice of
  /// max_blocks_per_lock blocks (or one event, or one worker reset).
  template <class F>
  decltype(auto) with_index(F&& f) const {
    const auto lock = reader_lock();
    return std::forward<F>(f)(std::as_const(index_));
  }

  /// The index, for callers that drive poll() themselves (no locking: do not
  /// use while the thread runs; use with_index). O(1).
  [[nodiscard]] const KvIndex& index() const noexcept { return index_; }

  /// Number of publishers. O(1).
  [[nodiscard]] std::size_t publisher_count() const noexcept { return pubs_.size(); }

  /// Counters of publisher `i` (in constructor order). O(1).
  [[nodiscard]] KvPublisherCounters counters(std::size_t i) const {
    const auto lock = reader_lock();
    return pubs_.at(i)->counters;
  }

  /// The sum of every publisher's counters. O(publishers).
  [[nodiscard]] KvPublisherCounters total_counters() const {
    const auto lock = reader_lock();
    KvPublisherCounters sum;
    for (const auto& p : pubs_)
      sum += p->counters;
    return sum;
  }

  /// The last applied seq of publisher `i`, or nullopt before its first batch
  /// (and right after a reset). O(1).
  [[nodiscard]] std::optional<std::uint64_t> last_seq(std::size_t i) const {
    const auto lock = reader_lock();
    return pubs_.at(i)->cursor.last_applied_id();
  }

 private:
  std::chrono::steady_clock::time_point now() const {
    return options_.clock ? options_.clock() : std::chrono::steady_clock::now();
  }

  void open_replay(Pub& p) {
    p.replay = zmq::socket_t(ctx_, zmq::socket_type::dealer);
    p.replay.set(zmq::sockopt::linger, 0);
    p.replay.connect(p.cfg.replay_endpoint);
    p.has_replay = true;
  }

  static std::optional<std::uint64_t> read_seq(const zmq::message_t& m) noexcept {
    if (m.size() != 8) return std::nullopt;
    const auto* b = static_cast<const unsigned char*>(m.data());
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < 8; ++i)
      v = (v << 8) | b[i];
    return v;
  }

  static detail::KvPayload bytes_of(const zmq::message_t& m) noexcept {
    return {static_cast<const std::byte*>(m.data()), m.size()};
  }

  std::size_t poll_once(std::chrono::milliseconds timeout) {
    std::vector<zmq::pollitem_t> items;
    items.reserve(pubs_.size());
    for (auto& p : pubs_)
      items.push_back(zmq::pollitem_t{p->sub.handle(), 0, ZMQ_POLLIN, 0});
    zmq::poll(items.data(), items.size(), timeout);
    std::size_t handled = 0;
    for (std::size_t i = 0; i < pubs_.size(); ++i) {
      if ((items[i].revents & ZMQ_POLLIN) == 0) continue;
      Pub& p = *pubs_[i];
      for (std::size_t n = 0; n < options_.max_messages_per_round; ++n) {
        frames_.clear();
        const auto got =
            zmq::recv_multipart(p.sub, std::back_inserter(frames_), zmq::recv_flags::dontwait);
        if (!got) break;
        ++handled;
        std::unique_lock<std::mutex> lock = applier_lock();
        const Holding holding(*this, lock);
        ++p.counters.messages;
        const std::optional<std::uint64_t> seq =
            frames_.size() == 3 ? read_seq(frames_[1]) : std::nullopt;
        // The end marker is never a batch: taken for one it would move the
        // cursor past every seq the publisher will ever send.
        if (!seq || *seq == end_marker) {
          ++p.counters.bad_frames;
          continue;
        }
        live(p, *seq, bytes_of(frames_[2]));
      }
    }
    return handled;
  }

  // ---- the follower's transport ----

  KvWireStatus decode_payload(Pub& /*p*/, detail::KvPayload payload, KvWireBatch& out,
                              KvWireStreamState& state) {
    return decoder_.decode(payload, out, state);
  }

  static bool has_replay(const Pub& p) noexcept { return p.has_replay; }

  // A new DEALER: the rest of an answer not read to its end marker must not
  // be read as the next one's.
  void replay_abandon(Pub& p) {
    p.replay.close();
    open_replay(p);
  }

  // Sends [empty, from (8 bytes big-endian)] to the publisher's ROUTER.
  bool replay_send(Pub& p, std::uint64_t from) {
    unsigned char start[8];
    for (std::size_t i = 0; i < 8; ++i)
      start[i] = static_cast<unsigned char>(from >> (56U - 8U * i));
    std::array<zmq::const_buffer, 2> request = {zmq::const_buffer(nullptr, 0),
                                                zmq::const_buffer(start, sizeof start)};
    if (!zmq::send_multipart(p.replay, request, zmq::send_flags::dontwait)) return false;
    // replay_timeout bounds silence, not the whole replay: a large buffer
    // that keeps streaming is read to its end.
    replay_deadline_ = now() + options_.replay_timeout;
    return true;
  }

  // The next reply of the answer: [empty, seq, payload] or [empty, topic,
  // seq, payload]; other shapes are counted as bad_frames and skipped.
  detail::KvReplayStep replay_next(Pub& p, std::uint64_t& seq, detail::KvPayload& payload) {
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(replay_deadline_ - now());
      if (left.count() < 0) return detail::KvReplayStep::silent;
      zmq::pollitem_t item{p.replay.handle(), 0, ZMQ_POLLIN, 0};
      int ready = 0;
      {
        const auto unlocked = unlocked_wait();
        ready = zmq::poll(&item, 1, left);
      }
      if (ready == 0) continue;  // re-check the deadline
      reply_.clear();
      if (!zmq::recv_multipart(p.replay, std::back_inserter(reply_), zmq::recv_flags::dontwait))
        continue;
      replay_deadline_ = now() + options_.replay_timeout;
      if ((reply_.size() != 3 && reply_.size() != 4) || reply_[0].size() != 0) {
        ++p.counters.bad_frames;
        continue;
      }
      const std::size_t at = reply_.size() - 2;
      const std::optional<std::uint64_t> r = read_seq(reply_[at]);
      if (!r) {
        ++p.counters.bad_frames;
        continue;
      }
      if (*r == end_marker) return detail::KvReplayStep::end;
      seq = *r;
      payload = bytes_of(reply_[at + 1U]);
      return detail::KvReplayStep::batch;
    }
  }

  ZmqKvSubscriberOptions options_;
  zmq::context_t ctx_;
  std::vector<std::unique_ptr<Pub>> pubs_;
  KvEventWireDecoder decoder_;
  std::vector<zmq::message_t> frames_;
  std::vector<zmq::message_t> reply_;  // the replay reply being read
  std::chrono::steady_clock::time_point replay_deadline_{};
};

}  // namespace promptcache

#endif  // PROMPTCACHE_ZMQ_KV_SUBSCRIBER_HPP
