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

#include "promptcache/block_hash.hpp"  // detail::xxh3_64
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
  std::uint64_t gaps_recovered = 0;      ///< Gaps filled completely by a replay that ended.
  std::uint64_t gaps_unrecoverable = 0;  ///< Gaps that reset the worker's view.
  std::uint64_t replay_timeouts = 0;     ///< Replays that fell silent before their end marker.
  std::uint64_t restarts = 0;            ///< Publisher restarts detected.
  std::uint64_t resets = 0;              ///< Worker views dropped (restarts, unrecoverable gaps).
  std::uint64_t malformed = 0;           ///< Payloads that did not decode (seq consumed).
  std::uint64_t bad_frames = 0;          ///< Messages with a wrong frame count or seq size, or a
                                         ///< seq the publisher never sent (see the header comment).
  std::uint64_t dp_rank_mismatches = 0;  ///< Batches naming another dp rank than configured.
  std::uint64_t unknown_events = 0;      ///< Events with an unknown tag (skipped).
  std::uint64_t ignored_events = 0;      ///< Events skipped by KvWireOptions rules.
  std::uint64_t dropped_blocks = 0;      ///< Stored blocks without full tokens (skipped).
  std::uint64_t dumps = 0;               ///< Views replaced by the publisher's state dump.
  std::uint64_t dumps_unavailable = 0;   ///< Dumps asked for but not applied (none offered,
                                         ///< silent, malformed, or refused by the index).
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
    dumps += o.dumps;
    dumps_unavailable += o.dumps_unavailable;
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
  /// Subscribes to every publisher of `publishers`. O(publishers). Throws
  /// std::invalid_argument when options.max_messages_per_round is 0 or
  /// replay_timeout or receive_hwm is negative.
  explicit ZmqKvSubscriber(std::vector<KvPublisherEndpoint> publishers,
                           ZmqKvSubscriberOptions options = {}, KvIndexOptions index_options = {})
      : options_(std::move(options)), index_(index_options), decoder_(options_.wire) {
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
      p->recent.resize(options_.remembered_batches);
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
    if (running()) throw std::logic_error("ZmqKvSubscriber::poll with the thread running");
    if (thread_.joinable()) thread_.join();
    return poll_once(timeout);
  }

  /// Starts a thread that polls until stop(); read the index with
  /// with_index(). No-op if already running. After the thread ended on an
  /// exception, joins it, clears thread_error() and starts a new one.
  void start() {
    if (running()) return;
    if (thread_.joinable()) thread_.join();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      thread_error_ = nullptr;
    }
    stop_.store(false);
    alive_.store(true);
    try {
      thread_ = std::thread([this] {
        try {
          while (!stop_.load(std::memory_order_relaxed))
            poll_once(std::chrono::milliseconds(50));
        } catch (...) {
          std::lock_guard<std::mutex> lock(mutex_);
          thread_error_ = std::current_exception();
        }
        // Last: a caller that sees running() false finds the error set.
        alive_.store(false);
      });
    } catch (...) {
      alive_.store(false);
      throw;
    }
  }

  /// Stops the thread started by start() and waits for it (at most about one
  /// poll interval plus a replay in progress). No-op when not running.
  void stop() {
    if (!thread_.joinable()) return;
    stop_.store(true);
    thread_.join();
  }

  /// True while the start() thread runs: false once stop() returned or the
  /// thread ended on an exception (see thread_error()). O(1).
  [[nodiscard]] bool running() const noexcept { return alive_.load(); }

  /// The exception that ended the thread, if any (for example a ZeroMQ error).
  [[nodiscard]] std::exception_ptr thread_error() const {
    const auto lock = reader_lock();
    return thread_error_;
  }

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
  struct Pub {
    KvPublisherEndpoint cfg;
    zmq::socket_t sub;
    zmq::socket_t replay;
    bool has_replay = false;
    CursorState<> cursor;  // over batch seqs
    // The attention groups this publisher's stored events have named: a
    // removal names only its group, whose kind an earlier store told.
    KvWireStreamState wire;
    // Hash of the payload bytes applied as the cursor's last seq: a replay
    // returning other bytes for that seq comes from a restarted publisher.
    std::uint64_t last_hash = 0;
    // The cursor's last seq came from a state dump: its bytes are unknown, so the
    // first replay reply for it is taken as its bytes rather than checked.
    bool last_unverified = false;
    // An unrecoverable gap since the last message: ask for a state dump.
    bool want_dump = false;
    // The last applied batch a replay question about fell silent: asked
    // about once.
    bool verified = false;
    std::uint64_t verified_seq = 0;
    std::uint64_t verified_hash = 0;
    // The payload hashes of the last applied seqs, at seq % size.
    struct Applied {
      std::uint64_t seq = 0;
      std::uint64_t hash = 0;
      bool valid = false;
    };
    std::vector<Applied> recent;
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
  // The start seq that asks for a state dump (no batch ever has it).
  static constexpr std::uint64_t dump_request = ~std::uint64_t{0} - 1U;

  // How a replay ended.
  enum class ReplayEnd : std::uint8_t { done, timed_out, restarted };

  static std::uint64_t payload_hash(const zmq::message_t& m) noexcept {
    return detail::xxh3_64(m.data(), m.size());
  }

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
        wait_for_readers();
        std::unique_lock<std::mutex> lock(mutex_);
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
        live(p, Frame{*seq, &frames_[2]});
        if (p.want_dump) {
          p.want_dump = false;
          try {
            resync_from_dump(p);
          } catch (...) {
            // The rest of the answer must not be read as the next request's.
            reopen_replay(p);
            throw;
          }
        }
      }
    }
    return handled;
  }

  // Decodes a payload into batch_; false (counted) when it does not decode.
  // Duplicates are never decoded: their bytes were counted when first applied.
  bool decode(Pub& p, const zmq::message_t& payload) {
    // Decoded against a copy: only an applied batch teaches the publisher's state.
    decoded_wire_ = p.wire;
    const KvWireStatus st = decoder_.decode(payload.data(), payload.size(), batch_, decoded_wire_);
    if (st.ok()) return true;
    ++p.counters.malformed;
    p.counters.last_error = st.code;
    return false;
  }

  // Advances the cursor to `seq`, remembering the bytes applied there.
  static void consume(Pub& p, std::uint64_t seq, const zmq::message_t& payload) noexcept {
    p.cursor = p.cursor.advance_to(seq);
    p.last_hash = payload_hash(payload);
    p.last_unverified = false;
    if (!p.recent.empty())
      p.recent[static_cast<std::size_t>(seq % p.recent.size())] = {seq, p.last_hash, true};
  }

  // Whether `hash` is what was applied as `seq`; nullopt when not remembered.
  static std::optional<bool> same_as_applied(const Pub& p, std::uint64_t seq,
                                             std::uint64_t hash) noexcept {
    if (p.recent.empty()) return std::nullopt;
    const Pub::Applied& a = p.recent[static_cast<std::size_t>(seq % p.recent.size())];
    if (!a.valid || a.seq != seq) return std::nullopt;
    return a.hash == hash;
  }

  // The lock the polling thread holds while it handles a message, so that
  // applying and replay waits can let readers in.
  struct Holding {
    Holding(ZmqKvSubscriber& s, std::unique_lock<std::mutex>& lock) noexcept : sub(s) {
      sub.held_ = &lock;
      sub.held_blocks_ = 0;
    }
    ~Holding() { sub.held_ = nullptr; }
    Holding(const Holding&) = delete;
    Holding& operator=(const Holding&) = delete;
    ZmqKvSubscriber& sub;
  };

  // A reader's lock. std::mutex is not fair: the count tells the polling
  // thread that someone waits, so that it steps aside between slices.
  std::unique_lock<std::mutex> reader_lock() const {
    readers_waiting_.fetch_add(1, std::memory_order_relaxed);
    std::unique_lock<std::mutex> lock(mutex_);
    readers_waiting_.fetch_sub(1, std::memory_order_relaxed);
    return lock;
  }

  // Lets the readers waiting for the lock take it first (bounded, so a
  // stream of readers cannot stall the stream). Called without the lock.
  void wait_for_readers() const noexcept {
    for (int i = 0; i < 256 && readers_waiting_.load(std::memory_order_relaxed) != 0; ++i)
      std::this_thread::yield();
  }

  // Releases the lock until the readers waiting for it had it, then takes it
  // back.
  void let_readers_in() {
    held_blocks_ = 0;
    if (held_ == nullptr) return;
    held_->unlock();
    wait_for_readers();
    held_->lock();
  }

  // Unlocked for the scope of a socket wait.
  struct Unlocked {
    explicit Unlocked(std::unique_lock<std::mutex>* l) : lock(l) {
      if (lock != nullptr) lock->unlock();
    }
    ~Unlocked() {
      if (lock != nullptr) lock->lock();
    }
    Unlocked(const Unlocked&) = delete;
    Unlocked& operator=(const Unlocked&) = delete;
    std::unique_lock<std::mutex>* lock;
  };

  static std::size_t blocks_of(const KvEventData& e) noexcept {
    if (const auto* s = std::get_if<kv_event::Stored>(&e)) return s->blocks.size();
    if (const auto* r = std::get_if<kv_event::Removed>(&e)) return r->block_hashes.size();
    return 0;
  }

  // Applies the batch at `seq` (decoding it) and advances the cursor.
  void apply(Pub& p, std::uint64_t seq, const zmq::message_t& payload, bool replayed) {
    consume(p, seq, payload);
    if (!decode(p, payload)) return;
    apply_decoded(p, replayed);
  }

  void apply_decoded(Pub& p, bool replayed) {
    KvPublisherCounters& c = p.counters;
    p.wire = decoded_wire_;
    ++c.batches_applied;
    if (replayed) ++c.batches_replayed;
    if (batch_.dp_rank && *batch_.dp_rank != p.cfg.worker.dp_rank) ++c.dp_rank_mismatches;
    c.unknown_events += batch_.unknown_events;
    c.ignored_events += batch_.ignored_events;
    c.dropped_blocks += batch_.dropped_blocks;
    const std::size_t slice = options_.max_blocks_per_lock;
    for (const KvEventData& e : batch_.events) {
      // Each event applies whole; the lock may be released between two.
      const std::size_t n = std::max<std::size_t>(blocks_of(e), 1);
      if (slice != 0 && held_blocks_ != 0 && held_blocks_ + n > slice) let_readers_in();
      held_blocks_ += n;
      const KvEventResult r = index_.apply(p.cfg.worker, KvEvent{p.next_event_id++, e});
      ++c.events_applied;
      if (!r.ok()) ++c.index_rejected;
    }
  }

  // Drops the worker's view: the stream starts over. The attention groups
  // stay: the same process still numbers them the same way after a gap.
  void reset(Pub& p) {
    index_.remove_worker(p.cfg.worker);
    p.next_event_id = 0;
    p.cursor = CursorState<>::initial();
    p.replayed_lo = 1;
    p.replayed_hi = 0;
    p.verified = false;
    ++p.counters.resets;
  }

  // A new process behind the publisher: its view, its groups and the bytes
  // remembered start over.
  void restart(Pub& p) {
    ++p.counters.restarts;
    reset(p);
    p.wire.reset();
    std::fill(p.recent.begin(), p.recent.end(), Pub::Applied{});
  }

  void live(Pub& p, const Frame& f) {
    const CursorObservation<> obs = p.cursor.observe(f.seq);
    if (std::holds_alternative<cursor::Gap<std::uint64_t>>(obs)) {
      recover(p, f);
    } else if (std::holds_alternative<cursor::Contiguous<std::uint64_t>>(obs)) {
      apply(p, f.seq, *f.payload, false);
    } else if (std::holds_alternative<cursor::Initial<std::uint64_t>>(obs)) {
      if (f.seq == 0)
        apply(p, f.seq, *f.payload, false);
      else
        recover(p, f);
    } else {
      stale(p, f);
    }
  }

  void stale(Pub& p, const Frame& f) {
    // A duplicate (or a batch a replay already applied) carries the bytes of
    // the batch it repeats. Timestamps are not evidence: the engine's wall
    // clock may step back across its restart.
    bool restarted = false;
    if (const std::optional<bool> same = same_as_applied(p, f.seq, payload_hash(*f.payload))) {
      restarted = !*same;
    } else {
      const std::optional<bool> answer = restarted_per_replay(p);
      restarted = answer ? *answer : f.seq <= options_.restart_max_seq;
    }
    if (restarted) {
      restart(p);
      if (f.seq == 0) {
        // Decoded again: the new process's groups are learned from nothing.
        apply(p, 0, *f.payload, false);
      } else {
        recover(p, f);
      }
      return;
    }
    if (f.seq >= p.replayed_lo && f.seq <= p.replayed_hi)
      ++p.counters.already_replayed;
    else
      ++p.counters.duplicates;
  }

  // Fills the gap before f from the replay socket, then applies f.
  void recover(Pub& p, const Frame& f) {
    KvPublisherCounters& c = p.counters;
    const std::uint64_t replayed_before = c.batches_replayed;
    bool lost = false;
    bool timed_out = false;
    std::optional<std::uint64_t> newest;  // the highest seq the replay returned
    if (p.has_replay) {
      ReplayEnd end = replay_or_reopen(p, lost, newest);
      if (end == ReplayEnd::restarted) {
        // The new process's stream is asked for from its start.
        restart(p);
        lost = false;
        newest.reset();
        end = replay_or_reopen(p, lost, newest);
      }
      if (end != ReplayEnd::done) {
        timed_out = true;
        ++c.replay_timeouts;
      }
    }
    // The publisher buffers every batch it sends, so a complete replay that
    // ends below f.seq means f.seq was never sent (a stray or corrupt frame):
    // moving the cursor there would make every real batch after it stale.
    // An empty replay says nothing: the publisher may buffer nothing.
    if (!timed_out && newest && *newest < f.seq) {
      ++c.bad_frames;
      // The replay may still have filled (or failed to fill) a real gap.
      if (lost || c.batches_replayed != replayed_before) {
        ++c.gaps;
        ++(lost ? c.gaps_unrecoverable : c.gaps_recovered);
      }
      if (lost) p.want_dump = true;
      return;
    }
    ++c.gaps;
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
    // A replay that fell silent after filling the gap kept the view: it
    // counts in replay_timeouts only.
    if (lost)
      ++c.gaps_unrecoverable;
    else if (!timed_out)
      ++c.gaps_recovered;
    // A replay that answered but no longer reaches back: the dump, if offered,
    // restores what was lost. A silent one would leave the dump silent too.
    if (lost && !timed_out) p.want_dump = true;
  }

  // Whether the publisher restarted, asked of its replay buffer when an old
  // seq's bytes are not remembered: a publisher keeps its newest batches, so
  // the same process returns the bytes applied as the last seq L, and a new
  // one returns other bytes, or nothing from L on when it has not yet reached
  // L. Batches after L that the reply brings are applied as in a gap (but
  // were not lost: no gap is counted unless the buffer no longer reaches
  // L + 1). nullopt: no answer (no replay socket, or it fell silent).
  // A question that fell silent is not asked again until the cursor moves (a
  // silent replay socket would otherwise cost replay_timeout per frame). One
  // that was answered is asked again: the publisher may restart meanwhile,
  // and an answer costs one round trip.
  std::optional<bool> restarted_per_replay(Pub& p) {
    if (!p.has_replay || p.cursor.is_initial()) return std::nullopt;
    const std::uint64_t last = *p.cursor.last_applied_id();
    if (p.verified && p.verified_seq == last && p.verified_hash == p.last_hash) return std::nullopt;
    bool lost = false;
    std::optional<std::uint64_t> newest;
    const ReplayEnd end = replay_or_reopen(p, lost, newest);
    KvPublisherCounters& c = p.counters;
    // Batches after L the reply brings were not lost (the live stream has
    // them on the way): only a buffer that no longer reaches L + 1 is a gap.
    if (lost) {
      ++c.gaps;
      ++c.gaps_unrecoverable;
      if (end != ReplayEnd::timed_out) p.want_dump = true;
    }
    if (end == ReplayEnd::restarted) return true;
    if (end == ReplayEnd::done && (!newest || *newest < last)) return true;
    if (end != ReplayEnd::timed_out) return false;
    ++c.replay_timeouts;
    if (!p.cursor.is_initial()) {
      p.verified = true;
      p.verified_seq = *p.cursor.last_applied_id();
      p.verified_hash = p.last_hash;
    }
    return std::nullopt;
  }

  // Asks the replay socket for the publisher's state dump and, when one comes
  // whole (every reply tagged with one seq S, each a batch that decodes, then
  // the end marker), replaces the worker's view with its events and moves the
  // cursor to S. Anything else (the end marker alone, silence, a bad reply, a
  // dump the index refuses) leaves the view as it was. Returns whether applied.
  bool resync_from_dump(Pub& p) {
    if (!options_.state_dumps || !p.has_replay) return false;
    KvPublisherCounters& c = p.counters;
    unsigned char start[8];
    for (std::size_t i = 0; i < 8; ++i)
      start[i] = static_cast<unsigned char>(dump_request >> (56U - 8U * i));
    std::array<zmq::const_buffer, 2> request = {zmq::const_buffer(nullptr, 0),
                                                zmq::const_buffer(start, sizeof start)};
    if (!zmq::send_multipart(p.replay, request, zmq::send_flags::dontwait)) {
      ++c.dumps_unavailable;
      return false;
    }
    std::vector<KvEvent> events;
    KvWireStreamState groups = p.wire;
    std::optional<std::uint64_t> seq;
    bool bad = false;
    auto deadline = now() + options_.replay_timeout;
    std::vector<zmq::message_t> reply;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now());
      if (left.count() < 0) {
        // Silent: its late answer must not be read as the next request's.
        reopen_replay(p);
        ++c.replay_timeouts;
        ++c.dumps_unavailable;
        return false;
      }
      zmq::pollitem_t item{p.replay.handle(), 0, ZMQ_POLLIN, 0};
      int ready = 0;
      {
        const Unlocked unlocked(held_);
        ready = zmq::poll(&item, 1, left);
      }
      if (ready == 0) continue;
      reply.clear();
      if (!zmq::recv_multipart(p.replay, std::back_inserter(reply), zmq::recv_flags::dontwait))
        continue;
      deadline = now() + options_.replay_timeout;
      const std::optional<std::uint64_t> r =
          (reply.size() == 3 || reply.size() == 4) && reply[0].size() == 0
              ? read_seq(reply[reply.size() - 2])
              : std::nullopt;
      if (!r) {
        ++c.bad_frames;
        bad = true;
        continue;
      }
      if (*r == end_marker) break;
      if (bad || (seq && *seq != *r)) {
        bad = true;  // read on to the end marker, apply nothing
        continue;
      }
      seq = *r;
      const zmq::message_t& payload = reply.back();
      const KvWireStatus st = decoder_.decode(payload.data(), payload.size(), batch_, groups);
      if (!st.ok()) {
        ++c.malformed;
        c.last_error = st.code;
        bad = true;
        continue;
      }
      for (KvEventData& e : batch_.events)
        events.push_back(KvEvent{events.size(), std::move(e)});
    }
    if (bad || !seq) {
      ++c.dumps_unavailable;
      return false;
    }
    const std::uint64_t last_id = events.empty() ? 0 : events.size() - 1U;
    if (!index_.replace_worker(p.cfg.worker, events, last_id).ok) {
      ++c.dumps_unavailable;
      return false;
    }
    ++c.dumps;
    p.next_event_id = last_id + 1U;
    p.cursor = CursorState<>::live(*seq);
    p.last_unverified = true;
    p.wire = groups;
    p.verified = false;
    p.replayed_lo = 1;
    p.replayed_hi = 0;
    std::fill(p.recent.begin(), p.recent.end(), Pub::Applied{});
    return true;
  }

  void reopen_replay(Pub& p) {
    p.replay.close();
    open_replay(p);
  }

  // replay(), then a new DEALER unless it read its answer to the end marker
  // (it timed out, found a restart at L, or ZeroMQ or the clock threw): the
  // rest of the answer to the request sent must not be read as the next one's.
  ReplayEnd replay_or_reopen(Pub& p, bool& lost, std::optional<std::uint64_t>& newest) {
    ReplayEnd end = ReplayEnd::done;
    try {
      end = replay(p, lost, newest);
    } catch (...) {
      reopen_replay(p);
      throw;
    }
    if (end != ReplayEnd::done) reopen_replay(p);
    return end;
  }

  // Requests every buffered batch from the last applied seq L on (from 0
  // before the first batch) and applies the ones after L in order. The reply
  // for L is compared with the bytes applied as L: other bytes end the replay
  // as `restarted`. Sets `lost` (and resets the view) when a needed batch was
  // no longer buffered, `newest` to the highest seq returned, and the
  // replayed range to the seqs it applied.
  ReplayEnd replay(Pub& p, bool& lost, std::optional<std::uint64_t>& newest) {
    p.replayed_lo = 1;
    p.replayed_hi = 0;
    const bool verify = !p.cursor.is_initial();
    const std::uint64_t from = verify ? *p.cursor.last_applied_id() : 0;
    unsigned char start[8];
    for (std::size_t i = 0; i < 8; ++i)
      start[i] = static_cast<unsigned char>(from >> (56U - 8U * i));
    std::array<zmq::const_buffer, 2> request = {zmq::const_buffer(nullptr, 0),
                                                zmq::const_buffer(start, sizeof start)};
    if (!zmq::send_multipart(p.replay, request, zmq::send_flags::dontwait))
      return ReplayEnd::timed_out;
    // replay_timeout bounds silence, not the whole replay: a large buffer
    // that keeps streaming is read to its end.
    auto deadline = now() + options_.replay_timeout;
    std::vector<zmq::message_t> reply;
    bool first = true;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now());
      if (left.count() < 0) return ReplayEnd::timed_out;
      zmq::pollitem_t item{p.replay.handle(), 0, ZMQ_POLLIN, 0};
      int ready = 0;
      {
        // Readers are not kept waiting on the network.
        const Unlocked unlocked(held_);
        ready = zmq::poll(&item, 1, left);
      }
      if (ready == 0) continue;  // re-check the deadline
      reply.clear();
      if (!zmq::recv_multipart(p.replay, std::back_inserter(reply), zmq::recv_flags::dontwait))
        continue;
      deadline = now() + options_.replay_timeout;
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
      if (*seq == end_marker) return ReplayEnd::done;
      const std::uint64_t r = *seq;
      newest = r;
      const zmq::message_t& payload = reply[at + 1U];
      if (first && verify && r == from) {
        // A restarted publisher numbers new batches from 0 again: the same
        // seq with other bytes is a different batch. After a dump the bytes of
        // its seq are learned here.
        if (p.last_unverified) {
          p.last_hash = payload_hash(payload);
          p.last_unverified = false;
        }
        if (payload_hash(payload) != p.last_hash) return ReplayEnd::restarted;
        first = false;
        continue;
      }
      first = false;
      const CursorObservation<> obs = p.cursor.observe(r);
      if (std::holds_alternative<cursor::Stale<std::uint64_t>>(obs)) continue;  // overlap
      // Without L in the buffer, L + 1 still continues the view: nothing was
      // lost, though L could not be checked.
      const bool in_order =
          std::holds_alternative<cursor::Contiguous<std::uint64_t>>(obs) ||
          (std::holds_alternative<cursor::Initial<std::uint64_t>>(obs) && r == from);
      if (!in_order) {
        // The buffer no longer holds what was lost: start over from here.
        if (!p.cursor.is_initial()) reset(p);
        lost = true;
      }
      apply(p, r, payload, true);
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
  KvWireStreamState decoded_wire_;  // the publisher's state after decoding batch_
  std::vector<zmq::message_t> frames_;
  mutable std::mutex mutex_;
  mutable std::atomic<std::uint32_t> readers_waiting_{0};
  std::unique_lock<std::mutex>* held_ = nullptr;  // the polling thread's, while it holds it
  std::size_t held_blocks_ = 0;                   // blocks applied under the current hold
  std::exception_ptr thread_error_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> alive_{false};
  std::thread thread_;
};

}  // namespace promptcache

#endif  // PROMPTCACHE_ZMQ_KV_SUBSCRIBER_HPP
