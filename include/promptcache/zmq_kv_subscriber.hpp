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
//   * A gap asks the replay socket for [expected, got). If the buffer no
//     longer starts at `expected` (or there is no replay socket, or it does
//     not answer within the timeout) the worker's view is reset (dropped from
//     the index) and the stream continues from the oldest batch still
//     available; counted as an unrecoverable gap.
//   * seq <= last is a restart when seq <= restart_max_seq and the batch's
//     timestamp is newer than the last applied batch's: the view is reset and
//     the stream restarts at seq 0 (replaying [0, seq) if seq > 0). Otherwise
//     it is a late duplicate and dropped.
//   * A payload that does not decode consumes its seq, applies nothing, and is
//     counted (a replay would return the same bytes).
//
// Two ways to drive it: call poll(timeout) from your own event loop, or
// start() a background thread; with the thread, read the index through
// with_index(). Needs cppzmq and libzmq (and msgpack-cxx, for the decoder).
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
#endif
#if !defined(PROMPTCACHE_ZMQ_KV_SUBSCRIBER_HPP) && \
    (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) >= 202002L
#define PROMPTCACHE_ZMQ_KV_SUBSCRIBER_HPP

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "promptcache/cursor.hpp"
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
  /// How long a replay may take, from request to end marker; past it the gap
  /// counts as unrecoverable.
  std::chrono::milliseconds replay_timeout{2000};
  /// An old seq can be a restart only up to this value (see the header comment).
  std::uint64_t restart_max_seq = 1024;
  /// ZMQ_RCVHWM of the SUB sockets: messages buffered before ZeroMQ drops.
  int receive_hwm = 100000;
  /// At most this many live messages per publisher per poll() round, so one
  /// busy publisher cannot starve the others.
  std::size_t max_messages_per_round = 1024;
};

/// What happened to one publisher's stream, since construction.
struct KvPublisherCounters {
  std::uint64_t messages = 0;            ///< Live messages received.
  std::uint64_t batches_applied = 0;     ///< Batches applied (live and replayed).
  std::uint64_t batches_replayed = 0;    ///< ... of which came from the replay socket.
  std::uint64_t events_applied = 0;      ///< Events given to the index.
  std::uint64_t index_rejected = 0;      ///< ... that the index refused (unknown parent, conflict).
  std::uint64_t duplicates = 0;          ///< Live messages with an applied seq, dropped.
  std::uint64_t already_replayed = 0;    ///< Live messages a replay had applied first, dropped.
  std::uint64_t gaps = 0;                ///< Gaps seen (including a first seq other than 0).
  std::uint64_t gaps_recovered = 0;      ///< Gaps filled completely by replay.
  std::uint64_t gaps_unrecoverable = 0;  ///< Gaps that reset the worker's view.
  std::uint64_t replay_timeouts = 0;     ///< Replays without an end marker in time.
  std::uint64_t restarts = 0;            ///< Publisher restarts detected.
  std::uint64_t resets = 0;              ///< Worker views dropped (restarts, unrecoverable gaps).
  std::uint64_t malformed = 0;           ///< Payloads that did not decode (seq consumed).
  std::uint64_t bad_frames = 0;          ///< Messages with a wrong frame count or seq size.
  std::uint64_t dp_rank_mismatches = 0;  ///< Batches naming another dp rank than configured.
  std::uint64_t unknown_events = 0;      ///< Events with an unknown tag (skipped).
  std::uint64_t ignored_events = 0;      ///< Events skipped by KvWireOptions rules.
  std::uint64_t dropped_blocks = 0;      ///< Stored blocks without full tokens (skipped).
  KvWireErrc last_error = KvWireErrc::ok;  ///< The last decode error.

  /// Adds `o` into this. O(1).
  KvPublisherCounters& operator+=(const KvPublisherCounters& o) noexcept {
    messages += o.messages;
    batches_applied += o.batches_applied;
    batches_replayed += o.batches_replayed;
    events_applied += o.events_applied;
    index_rejected += o.index_rejected;
    duplicates += o.duplicates;
    already_replayed += o.already_replayed;
    gaps += o.gaps;
    gaps_recovered += o.gaps_recovered;
    gaps_unrecoverable += o.gaps_unrecoverable;
    replay_timeouts += o.replay_timeouts;
    restarts += o.restarts;
    resets += o.resets;
    malformed += o.malformed;
    bad_frames += o.bad_frames;
    dp_rank_mismatches += o.dp_rank_mismatches;
    unknown_events += o.unknown_events;
    ignored_events += o.ignored_events;
    dropped_blocks += o.dropped_blocks;
    if (o.last_error != KvWireErrc::ok) last_error = o.last_error;
    return *this;
  }
};

/// Follows N KV event publishers into one KvIndex (owned). Sockets are used by
/// one thread at a time: either the caller's poll() or the start() thread.
/// Construction connects (ZeroMQ connects lazily, so unreachable publishers
/// are not an error); a malformed endpoint throws zmq::error_t.
class ZmqKvSubscriber {
 public:
  /// Subscribes to every publisher of `publishers`. O(publishers).
  explicit ZmqKvSubscriber(std::vector<KvPublisherEndpoint> publishers,
                           ZmqKvSubscriberOptions options = {}, KvIndexOptions index_options = {})
      : options_(options), index_(index_options), decoder_(options.wire) {
    pubs_.reserve(publishers.size());
    for (auto& cfg : publishers) {
      auto p = std::make_unique<Pub>();
      p->cfg = std::move(cfg);
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
  /// (which may wait up to replay_timeout). Returns the live messages handled.
  /// Must not be called while the start() thread runs (throws logic_error).
  std::size_t poll(std::chrono::milliseconds timeout) {
    if (thread_.joinable()) throw std::logic_error("ZmqKvSubscriber::poll with the thread running");
    return poll_once(timeout);
  }

  /// Starts a thread that polls until stop(); read the index with
  /// with_index(). No-op if already running.
  void start() {
    if (thread_.joinable()) return;
    stop_.store(false);
    thread_ = std::thread([this] {
      try {
        while (!stop_.load(std::memory_order_relaxed))
          poll_once(std::chrono::milliseconds(50));
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        thread_error_ = std::current_exception();
      }
    });
  }

  /// Stops the thread started by start() and waits for it (at most about one
  /// poll interval plus a replay in progress). No-op when not running.
  void stop() {
    if (!thread_.joinable()) return;
    stop_.store(true);
    thread_.join();
  }

  /// True while the start() thread runs. O(1).
  [[nodiscard]] bool running() const noexcept { return thread_.joinable(); }

  /// The exception that ended the thread, if any (for example a ZeroMQ error).
  [[nodiscard]] std::exception_ptr thread_error() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return thread_error_;
  }

  /// Calls f(const KvIndex&) with the index locked against the thread's
  /// updates, and returns its result.
  template <class F>
  decltype(auto) with_index(F&& f) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::forward<F>(f)(std::as_const(index_));
  }

  /// The index, for callers that drive poll() themselves (no locking: do not
  /// use while the thread runs; use with_index). O(1).
  [[nodiscard]] const KvIndex& index() const noexcept { return index_; }

  /// Number of publishers. O(1).
  [[nodiscard]] std::size_t publisher_count() const noexcept { return pubs_.size(); }

  /// Counters of publisher `i` (in constructor order). O(1).
  [[nodiscard]] KvPublisherCounters counters(std::size_t i) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pubs_.at(i)->counters;
  }

  /// The sum of every publisher's counters. O(publishers).
  [[nodiscard]] KvPublisherCounters total_counters() const {
    std::lock_guard<std::mutex> lock(mutex_);
    KvPublisherCounters sum;
    for (const auto& p : pubs_)
      sum += p->counters;
    return sum;
  }

  /// The last applied seq of publisher `i`, or nullopt before its first batch
  /// (and right after a reset). O(1).
  [[nodiscard]] std::optional<std::uint64_t> last_seq(std::size_t i) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pubs_.at(i)->cursor.last_applied_id();
  }

 private:
  struct Pub {
    KvPublisherEndpoint cfg;
    zmq::socket_t sub;
    zmq::socket_t replay;
    bool has_replay = false;
    CursorState<> cursor;  // over batch seqs
    double last_ts = -std::numeric_limits<double>::infinity();
    std::uint64_t next_event_id = 0;  // ids the index sees: contiguous per view
    // Seqs the last replay applied: a live copy of one is not a duplicate.
    std::uint64_t replayed_lo = 1;
    std::uint64_t replayed_hi = 0;
    KvPublisherCounters counters;
  };

  // A message's seq and payload bytes.
  struct Frame {
    std::uint64_t seq = 0;
    const zmq::message_t* payload = nullptr;
  };

  static constexpr std::uint64_t end_marker = ~std::uint64_t{0};

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
        std::lock_guard<std::mutex> lock(mutex_);
        ++p.counters.messages;
        const std::optional<std::uint64_t> seq =
            frames_.size() == 3 ? read_seq(frames_[1]) : std::nullopt;
        if (!seq) {
          ++p.counters.bad_frames;
          continue;
        }
        live(p, Frame{*seq, &frames_[2]});
      }
    }
    return handled;
  }

  // Decodes a payload into batch_; false (counted) when it does not decode.
  bool decode(Pub& p, const zmq::message_t& payload) {
    const KvWireStatus st = decoder_.decode(payload.data(), payload.size(), batch_);
    if (st.ok()) return true;
    ++p.counters.malformed;
    p.counters.last_error = st.code;
    return false;
  }

  // Applies the batch at `seq` (decoding it) and advances the cursor.
  void apply(Pub& p, std::uint64_t seq, const zmq::message_t& payload, bool replayed) {
    p.cursor = p.cursor.advance_to(seq);
    if (!decode(p, payload)) return;
    apply_decoded(p, replayed);
  }

  void apply_decoded(Pub& p, bool replayed) {
    KvPublisherCounters& c = p.counters;
    ++c.batches_applied;
    if (replayed) ++c.batches_replayed;
    if (batch_.ts > p.last_ts) p.last_ts = batch_.ts;
    if (batch_.dp_rank && *batch_.dp_rank != p.cfg.worker.dp_rank) ++c.dp_rank_mismatches;
    c.unknown_events += batch_.unknown_events;
    c.ignored_events += batch_.ignored_events;
    c.dropped_blocks += batch_.dropped_blocks;
    for (const KvEventData& e : batch_.events) {
      const KvEventResult r = index_.apply(p.cfg.worker, KvEvent{p.next_event_id++, e});
      ++c.events_applied;
      if (!r.ok()) ++c.index_rejected;
    }
  }

  // Drops the worker's view: the stream starts over.
  void reset(Pub& p) {
    index_.remove_worker(p.cfg.worker);
    p.next_event_id = 0;
    p.cursor = CursorState<>::initial();
    p.last_ts = -std::numeric_limits<double>::infinity();
    ++p.counters.resets;
  }

  void live(Pub& p, const Frame& f) {
    const CursorObservation<> obs = p.cursor.observe(f.seq);
    if (const auto* g = std::get_if<cursor::Gap<std::uint64_t>>(&obs)) {
      recover(p, g->expected, f);
    } else if (std::holds_alternative<cursor::Contiguous<std::uint64_t>>(obs)) {
      apply(p, f.seq, *f.payload, false);
    } else if (std::holds_alternative<cursor::Initial<std::uint64_t>>(obs)) {
      if (f.seq == 0)
        apply(p, f.seq, *f.payload, false);
      else
        recover(p, 0, f);
    } else {
      stale(p, f);
    }
  }

  void stale(Pub& p, const Frame& f) {
    // Only a small seq with a newer timestamp is a restarted publisher: a
    // duplicate (or a batch a replay already applied) carries the timestamp
    // of the batch it repeats.
    if (f.seq <= options_.restart_max_seq && decode(p, *f.payload) && batch_.ts > p.last_ts) {
      ++p.counters.restarts;
      reset(p);
      if (f.seq == 0) {
        p.cursor = p.cursor.advance_to(0);
        apply_decoded(p, false);
      } else {
        recover(p, 0, f);
      }
      return;
    }
    if (f.seq >= p.replayed_lo && f.seq <= p.replayed_hi)
      ++p.counters.already_replayed;
    else
      ++p.counters.duplicates;
  }

  // Fills [from, f.seq) from the replay socket, then applies f.
  void recover(Pub& p, std::uint64_t from, const Frame& f) {
    ++p.counters.gaps;
    bool lost = false;
    p.replayed_lo = 1;
    p.replayed_hi = 0;
    if (p.has_replay && !replay(p, from, lost)) {
      ++p.counters.replay_timeouts;
      // Late replies to this request must not be read as the next one's.
      p.replay.close();
      open_replay(p);
    }
    // The live message itself, unless the replay covered it. If batches
    // before it are still missing, the view starts over from it.
    const CursorObservation<> obs = p.cursor.observe(f.seq);
    if (std::holds_alternative<cursor::Contiguous<std::uint64_t>>(obs)) {
      apply(p, f.seq, *f.payload, false);
    } else if (!std::holds_alternative<cursor::Stale<std::uint64_t>>(obs)) {
      lost = true;
      if (!p.cursor.is_initial()) reset(p);
      apply(p, f.seq, *f.payload, false);
    }
    if (lost)
      ++p.counters.gaps_unrecoverable;
    else
      ++p.counters.gaps_recovered;
  }

  // Requests every buffered batch from `from` on and applies them in order.
  // Returns false when the end marker did not come in time. Sets `lost` (and
  // resets the view once) when a needed batch was no longer buffered.
  bool replay(Pub& p, std::uint64_t from, bool& lost) {
    unsigned char start[8];
    for (std::size_t i = 0; i < 8; ++i)
      start[i] = static_cast<unsigned char>(from >> (56U - 8U * i));
    std::array<zmq::const_buffer, 2> request = {zmq::const_buffer(nullptr, 0),
                                                zmq::const_buffer(start, sizeof start)};
    if (!zmq::send_multipart(p.replay, request, zmq::send_flags::dontwait)) return false;
    const auto deadline = std::chrono::steady_clock::now() + options_.replay_timeout;
    std::vector<zmq::message_t> reply;
    bool first = true;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() < 0) return false;
      zmq::pollitem_t item{p.replay.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, left) == 0) continue;  // re-check the deadline
      reply.clear();
      if (!zmq::recv_multipart(p.replay, std::back_inserter(reply), zmq::recv_flags::dontwait))
        continue;
      // [empty, seq, payload] or [empty, topic, seq, payload].
      if ((reply.size() != 3 && reply.size() != 4) || reply[0].size() != 0) {
        ++p.counters.bad_frames;
        continue;
      }
      const std::size_t at = reply.size() - 2;
      const std::optional<std::uint64_t> seq = read_seq(reply[at]);
      if (!seq) {
        ++p.counters.bad_frames;
        continue;
      }
      if (*seq == end_marker) return true;
      const std::uint64_t r = *seq;
      const CursorObservation<> obs = p.cursor.observe(r);
      if (std::holds_alternative<cursor::Stale<std::uint64_t>>(obs)) continue;  // overlap
      const bool in_order =
          std::holds_alternative<cursor::Contiguous<std::uint64_t>>(obs) ||
          (std::holds_alternative<cursor::Initial<std::uint64_t>>(obs) && r == from);
      if (!in_order || (first && r != from)) {
        // The buffer no longer holds what was lost: start over from here.
        if (!p.cursor.is_initial()) reset(p);
        lost = true;
      }
      first = false;
      apply(p, r, reply[at + 1U], true);
      if (p.replayed_lo > p.replayed_hi) p.replayed_lo = r;
      p.replayed_hi = r;
    }
  }

  ZmqKvSubscriberOptions options_;
  zmq::context_t ctx_;
  std::vector<std::unique_ptr<Pub>> pubs_;
  KvIndex index_;
  KvEventWireDecoder decoder_;
  KvWireBatch batch_;
  std::vector<zmq::message_t> frames_;
  mutable std::mutex mutex_;
  std::exception_ptr thread_error_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace promptcache

#endif  // PROMPTCACHE_ZMQ_KV_SUBSCRIBER_HPP
