// promptcache: detail/kv_stream_follower.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The transport-independent half of a KV event subscriber: the rules that
// follow one publisher's batch sequence numbers (in order, gap, late
// duplicate, restart told by the payload bytes, replay from the last applied
// seq, reset when the replay cannot help), the KvIndex those batches are
// applied to, the lock that lets routing queries in between slices of a long
// catch-up, and the optional polling thread. ZmqKvSubscriber and
// NatsKvSubscriber are this plus their transport: how a message arrives, how
// a replay is asked for and read, how a payload decodes. docs/kv_event_wire.md
// states the rules.
#pragma once
#ifndef PROMPTCACHE_DETAIL_KV_STREAM_FOLLOWER_HPP
#define PROMPTCACHE_DETAIL_KV_STREAM_FOLLOWER_HPP

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "promptcache/block_hash.hpp"  // detail::xxh3_64
#include "promptcache/cursor.hpp"
#include "promptcache/kv_event_wire.hpp"
#include "promptcache/kv_index.hpp"

namespace promptcache {

/// What happened to one publisher's stream, since construction (or since the
/// stream was first seen).
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

namespace detail {

// The payload bytes of one batch, as the transport holds them.
using KvPayload = std::span<const std::byte>;

// What one publisher's stream has applied: the follower's whole per-stream
// state. A transport's stream type derives from it.
struct KvStream {
  KvWorker worker;       // the index worker the stream feeds
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

// The rules' settings.
struct KvFollowerRules {
  std::uint64_t restart_max_seq = 1024;
  std::size_t remembered_batches = 1024;
  std::size_t max_blocks_per_lock = 4096;
};

// One step of reading a replay answer.
enum class KvReplayStep : std::uint8_t {
  batch,   // seq and payload hold one buffered batch
  end,     // the end marker: the answer is complete
  silent,  // nothing within the transport's timeout, or the request could not be sent
};

// The follower. `Derived` (CRTP) is the transport; `Stream` derives from
// KvStream. Derived provides:
//   bool has_replay(Stream&)
//   bool replay_send(Stream&, std::uint64_t from)       false: could not be sent
//   KvReplayStep replay_next(Stream&, std::uint64_t& seq, KvPayload& payload)
//       waits (with unlocked_wait() around the wait) for the next reply; the
//       payload stays valid until the next call
//   void replay_abandon(Stream&)                        drops a partly read answer
//   KvWireStatus decode_payload(Stream&, KvPayload, KvWireBatch&, KvWireStreamState&)
//   std::size_t poll_once(std::chrono::milliseconds)    the start() thread's loop body
template <class Derived, class Stream>
class KvStreamFollower {
 protected:
  KvStreamFollower(KvFollowerRules rules, KvIndexOptions index_options)
      : rules_(rules), index_(index_options) {}
  ~KvStreamFollower() = default;
  KvStreamFollower(const KvStreamFollower&) = delete;
  KvStreamFollower& operator=(const KvStreamFollower&) = delete;

  static constexpr std::uint64_t end_marker = ~std::uint64_t{0};
  // The start seq that asks a publisher for its state dump (no batch has it).
  static constexpr std::uint64_t dump_request = ~std::uint64_t{0} - 1U;

  // How a replay ended.
  enum class ReplayEnd : std::uint8_t { done, timed_out, restarted };

  Derived& derived() noexcept { return static_cast<Derived&>(*this); }

  // ---- the thread ----

  void start_thread() {
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
            derived().poll_once(std::chrono::milliseconds(50));
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

  void stop_thread() {
    if (!thread_.joinable()) return;
    stop_.store(true);
    thread_.join();
  }

  // Joins a thread that ended on an exception; throws logic_error (with
  // `what`) while it runs.
  void before_poll(const char* what) {
    if (running()) throw std::logic_error(what);
    if (thread_.joinable()) thread_.join();
  }

  [[nodiscard]] bool running() const noexcept { return alive_.load(); }

  [[nodiscard]] std::exception_ptr thread_error_locked() const {
    const auto lock = reader_lock();
    return thread_error_;
  }

  // ---- the lock ----

  // The lock the polling thread holds while it handles a message, so that
  // applying and replay waits can let readers in.
  struct Holding {
    Holding(KvStreamFollower& s, std::unique_lock<std::mutex>& lock) noexcept : sub(s) {
      sub.held_ = &lock;
      sub.held_blocks_ = 0;
    }
    ~Holding() { sub.held_ = nullptr; }
    Holding(const Holding&) = delete;
    Holding& operator=(const Holding&) = delete;
    KvStreamFollower& sub;
  };

  // A reader's lock. std::mutex is not fair, in both directions: the count
  // tells the polling thread that someone waits, so that it steps aside
  // between slices; and a reader first lets a waiting polling thread in, or a
  // reader calling in a loop would take the lock back each time before the
  // polling thread woke, and the stream would stall (bounded both ways).
  std::unique_lock<std::mutex> reader_lock() const {
    for (int i = 0; i < 256 && applier_waiting_.load(std::memory_order_relaxed); ++i)
      std::this_thread::yield();
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
    relock(*held_);
  }

  // The polling thread's lock for one message: the readers already waiting go
  // first, then it is taken with applier_waiting_ raised, so that readers let
  // it in.
  std::unique_lock<std::mutex> applier_lock() {
    wait_for_readers();
    std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
    relock(lock);
    return lock;
  }

  void relock(std::unique_lock<std::mutex>& lock) {
    applier_waiting_.store(true, std::memory_order_relaxed);
    lock.lock();
    applier_waiting_.store(false, std::memory_order_relaxed);
  }

  // Unlocked for the scope of a transport wait.
  struct Unlocked {
    explicit Unlocked(KvStreamFollower& s) : sub(s), lock(s.held_) {
      if (lock != nullptr) lock->unlock();
    }
    ~Unlocked() {
      if (lock != nullptr) sub.relock(*lock);
    }
    Unlocked(const Unlocked&) = delete;
    Unlocked& operator=(const Unlocked&) = delete;
    KvStreamFollower& sub;
    std::unique_lock<std::mutex>* lock;
  };

  // Readers are not kept waiting on the network.
  Unlocked unlocked_wait() noexcept { return Unlocked(*this); }

  // ---- the rules ----

  static std::uint64_t payload_hash(KvPayload m) noexcept {
    return detail::xxh3_64(m.data(), m.size());
  }

  void init_stream(Stream& p) const { p.recent.resize(rules_.remembered_batches); }

  // Decodes a payload into batch_; false (counted) when it does not decode.
  // Duplicates are never decoded: their bytes were counted when first applied.
  bool decode(Stream& p, KvPayload payload) {
    // Decoded against a copy: only an applied batch teaches the publisher's state.
    decoded_wire_ = p.wire;
    const KvWireStatus st = derived().decode_payload(p, payload, batch_, decoded_wire_);
    if (st.ok()) return true;
    ++p.counters.malformed;
    p.counters.last_error = st.code;
    return false;
  }

  // Advances the cursor to `seq`, remembering the bytes applied there.
  static void consume(Stream& p, std::uint64_t seq, KvPayload payload) noexcept {
    p.cursor = p.cursor.advance_to(seq);
    p.last_hash = payload_hash(payload);
    p.last_unverified = false;
    if (!p.recent.empty())
      p.recent[static_cast<std::size_t>(seq % p.recent.size())] = {seq, p.last_hash, true};
  }

  // Whether `hash` is what was applied as `seq`; nullopt when not remembered.
  static std::optional<bool> same_as_applied(const Stream& p, std::uint64_t seq,
                                             std::uint64_t hash) noexcept {
    if (p.recent.empty()) return std::nullopt;
    const KvStream::Applied& a = p.recent[static_cast<std::size_t>(seq % p.recent.size())];
    if (!a.valid || a.seq != seq) return std::nullopt;
    return a.hash == hash;
  }

  static std::size_t blocks_of(const KvEventData& e) noexcept {
    if (const auto* s = std::get_if<kv_event::Stored>(&e)) return s->blocks.size();
    if (const auto* r = std::get_if<kv_event::Removed>(&e)) return r->block_hashes.size();
    return 0;
  }

  // Applies the batch at `seq` (decoding it) and advances the cursor.
  void apply(Stream& p, std::uint64_t seq, KvPayload payload, bool replayed) {
    consume(p, seq, payload);
    if (!decode(p, payload)) return;
    apply_decoded(p, replayed);
  }

  void apply_decoded(Stream& p, bool replayed) {
    KvPublisherCounters& c = p.counters;
    p.wire = decoded_wire_;
    ++c.batches_applied;
    if (replayed) ++c.batches_replayed;
    if (batch_.dp_rank && *batch_.dp_rank != p.worker.dp_rank) ++c.dp_rank_mismatches;
    c.unknown_events += batch_.unknown_events;
    c.ignored_events += batch_.ignored_events;
    c.dropped_blocks += batch_.dropped_blocks;
    const std::size_t slice = rules_.max_blocks_per_lock;
    for (const KvEventData& e : batch_.events) {
      // Each event applies whole; the lock may be released between two.
      const std::size_t n = std::max<std::size_t>(blocks_of(e), 1);
      if (slice != 0 && held_blocks_ != 0 && held_blocks_ + n > slice) let_readers_in();
      held_blocks_ += n;
      const KvEventResult r = index_.apply(p.worker, KvEvent{p.next_event_id++, e});
      ++c.events_applied;
      if (!r.ok()) ++c.index_rejected;
    }
  }

  // Drops the worker's view: the stream starts over. The attention groups
  // stay: the same process still numbers them the same way after a gap.
  void reset(Stream& p) {
    index_.remove_worker(p.worker);
    p.next_event_id = 0;
    p.cursor = CursorState<>::initial();
    p.replayed_lo = 1;
    p.replayed_hi = 0;
    p.verified = false;
    ++p.counters.resets;
  }

  // A new process behind the publisher: its view, its groups and the bytes
  // remembered start over.
  void restart(Stream& p) {
    ++p.counters.restarts;
    reset(p);
    p.wire.reset();
    std::fill(p.recent.begin(), p.recent.end(), KvStream::Applied{});
  }

  // One live batch of stream `p`: applied, recovered, or dropped; then, if
  // the batch revealed a gap no replay could fill, the state dump.
  void live(Stream& p, std::uint64_t seq, KvPayload payload) {
    follow(p, seq, payload);
    if (p.want_dump) {
      p.want_dump = false;
      resync_from_dump(p);
    }
  }

  void follow(Stream& p, std::uint64_t seq, KvPayload payload) {
    const CursorObservation<> obs = p.cursor.observe(seq);
    if (std::holds_alternative<cursor::Gap<std::uint64_t>>(obs)) {
      recover(p, seq, payload);
    } else if (std::holds_alternative<cursor::Contiguous<std::uint64_t>>(obs)) {
      apply(p, seq, payload, false);
    } else if (std::holds_alternative<cursor::Initial<std::uint64_t>>(obs)) {
      if (seq == 0)
        apply(p, seq, payload, false);
      else
        recover(p, seq, payload);
    } else {
      stale(p, seq, payload);
    }
  }

  void stale(Stream& p, std::uint64_t seq, KvPayload payload) {
    // A duplicate (or a batch a replay already applied) carries the bytes of
    // the batch it repeats. Timestamps are not evidence: the engine's wall
    // clock may step back across its restart.
    bool restarted = false;
    if (const std::optional<bool> same = same_as_applied(p, seq, payload_hash(payload))) {
      restarted = !*same;
    } else {
      const std::optional<bool> answer = restarted_per_replay(p);
      restarted = answer ? *answer : seq <= rules_.restart_max_seq;
    }
    if (restarted) {
      restart(p);
      if (seq == 0) {
        // Decoded again: the new process's groups are learned from nothing.
        apply(p, 0, payload, false);
      } else {
        recover(p, seq, payload);
      }
      return;
    }
    if (seq >= p.replayed_lo && seq <= p.replayed_hi)
      ++p.counters.already_replayed;
    else
      ++p.counters.duplicates;
  }

  // Fills the gap before (seq, payload) from the replay buffer, then applies it.
  void recover(Stream& p, std::uint64_t seq, KvPayload payload) {
    KvPublisherCounters& c = p.counters;
    const std::uint64_t replayed_before = c.batches_replayed;
    bool lost = false;
    bool timed_out = false;
    std::optional<std::uint64_t> newest;  // the highest seq the replay returned
    if (derived().has_replay(p)) {
      ReplayEnd end = replay_or_abandon(p, lost, newest);
      if (end == ReplayEnd::restarted) {
        // The new process's stream is asked for from its start.
        restart(p);
        lost = false;
        newest.reset();
        end = replay_or_abandon(p, lost, newest);
      }
      if (end != ReplayEnd::done) {
        timed_out = true;
        ++c.replay_timeouts;
      }
    }
    // The publisher buffers every batch it sends, so a complete replay that
    // ends below seq means seq was never sent (a stray or corrupt frame):
    // moving the cursor there would make every real batch after it stale.
    // An empty replay says nothing: the publisher may buffer nothing.
    if (!timed_out && newest && *newest < seq) {
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
    const CursorObservation<> obs = p.cursor.observe(seq);
    if (std::holds_alternative<cursor::Contiguous<std::uint64_t>>(obs)) {
      apply(p, seq, payload, false);
    } else if (!std::holds_alternative<cursor::Stale<std::uint64_t>>(obs)) {
      lost = true;
      if (!p.cursor.is_initial()) reset(p);
      apply(p, seq, payload, false);
    }
    // A replay that fell silent after filling the gap kept the view: it
    // counts in replay_timeouts only.
    if (lost)
      ++c.gaps_unrecoverable;
    else if (!timed_out)
      ++c.gaps_recovered;
    // A replay that answered but no longer reaches back: the dump, if
    // offered, restores what was lost. A silent one would leave it silent too.
    if (lost && !timed_out) p.want_dump = true;
  }

  // Whether the publisher restarted, asked of its replay buffer when an old
  // seq's bytes are not remembered: a publisher keeps its newest batches, so
  // the same process returns the bytes applied as the last seq L, and a new
  // one returns other bytes, or nothing from L on when it has not yet reached
  // L. Batches after L that the reply brings are applied as in a gap (but
  // were not lost: no gap is counted unless the buffer no longer reaches
  // L + 1). nullopt: no answer (no replay, or it fell silent).
  // A question that fell silent is not asked again until the cursor moves (a
  // silent replay would otherwise cost its timeout per frame). One that was
  // answered is asked again: the publisher may restart meanwhile, and an
  // answer costs one round trip.
  std::optional<bool> restarted_per_replay(Stream& p) {
    if (!derived().has_replay(p) || p.cursor.is_initial()) return std::nullopt;
    const std::uint64_t last = *p.cursor.last_applied_id();
    if (p.verified && p.verified_seq == last && p.verified_hash == p.last_hash) return std::nullopt;
    bool lost = false;
    std::optional<std::uint64_t> newest;
    const ReplayEnd end = replay_or_abandon(p, lost, newest);
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

  // replay(), then the transport drops the rest of the answer unless it was
  // read to the end marker (it timed out, found a restart at L, or the
  // transport or the clock threw): the rest of the answer to the request sent
  // must not be read as the next one's.
  ReplayEnd replay_or_abandon(Stream& p, bool& lost, std::optional<std::uint64_t>& newest) {
    ReplayEnd end = ReplayEnd::done;
    try {
      end = replay(p, lost, newest);
    } catch (...) {
      derived().replay_abandon(p);
      throw;
    }
    if (end != ReplayEnd::done) derived().replay_abandon(p);
    return end;
  }

  // Requests every buffered batch from the last applied seq L on (from 0
  // before the first batch) and applies the ones after L in order. The reply
  // for L is compared with the bytes applied as L: other bytes end the replay
  // as `restarted`. Sets `lost` (and resets the view) when a needed batch was
  // no longer buffered, `newest` to the highest seq returned, and the
  // replayed range to the seqs it applied.
  ReplayEnd replay(Stream& p, bool& lost, std::optional<std::uint64_t>& newest) {
    p.replayed_lo = 1;
    p.replayed_hi = 0;
    const bool verify = !p.cursor.is_initial();
    const std::uint64_t from = verify ? *p.cursor.last_applied_id() : 0;
    if (!derived().replay_send(p, from)) return ReplayEnd::timed_out;
    bool first = true;
    for (;;) {
      std::uint64_t r = 0;
      KvPayload payload;
      const KvReplayStep step = derived().replay_next(p, r, payload);
      if (step == KvReplayStep::silent) return ReplayEnd::timed_out;
      if (step == KvReplayStep::end) return ReplayEnd::done;
      newest = r;
      if (first && verify && r == from) {
        // A restarted publisher numbers new batches from 0 again: the same
        // seq with other bytes is a different batch. After a dump the bytes
        // of its seq are learned here.
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

  // Asks the replay socket for the publisher's state dump (start seq
  // dump_request) and, when one comes whole (every reply tagged with one seq
  // S, each a batch that decodes, then the end marker), replaces the
  // worker's view with its events and moves the cursor to S. Anything else
  // (the end marker alone, as vLLM answers, silence, a bad reply, a dump the
  // index refuses) leaves the view as the gap left it. Returns whether applied.
  bool resync_from_dump(Stream& p) {
    if (!state_dumps_ || !derived().has_replay(p)) return false;
    KvPublisherCounters& c = p.counters;
    std::vector<KvEvent> events;
    KvWireStreamState groups = p.wire;
    std::optional<std::uint64_t> seq;
    bool bad = false;
    bool complete = false;
    try {
      if (derived().replay_send(p, dump_request)) {
        for (;;) {
          std::uint64_t r = 0;
          KvPayload payload;
          const KvReplayStep step = derived().replay_next(p, r, payload);
          if (step == KvReplayStep::silent) {
            ++c.replay_timeouts;
            break;
          }
          if (step == KvReplayStep::end) {
            complete = true;
            break;
          }
          if (bad || (seq && *seq != r)) {
            bad = true;  // read on to the end marker, apply nothing
            continue;
          }
          seq = r;
          const KvWireStatus st = derived().decode_payload(p, payload, batch_, groups);
          if (!st.ok()) {
            ++c.malformed;
            c.last_error = st.code;
            bad = true;
            continue;
          }
          for (KvEventData& e : batch_.events)
            events.push_back(KvEvent{events.size(), std::move(e)});
        }
      }
    } catch (...) {
      derived().replay_abandon(p);
      throw;
    }
    // Its late answer must not be read as the next request's.
    if (!complete) derived().replay_abandon(p);
    if (!complete || bad || !seq) {
      ++c.dumps_unavailable;
      return false;
    }
    const std::uint64_t last_id = events.empty() ? 0 : events.size() - 1U;
    if (!index_.replace_worker(p.worker, events, last_id).ok) {
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
    std::fill(p.recent.begin(), p.recent.end(), KvStream::Applied{});
    return true;
  }

  KvFollowerRules rules_;
  bool state_dumps_ = false;  // ask for a publisher's state dump after an unrecoverable gap
  KvIndex index_;
  KvWireBatch batch_;
  KvWireStreamState decoded_wire_;  // the publisher's state after decoding batch_
  mutable std::mutex mutex_;
  mutable std::atomic<std::uint32_t> readers_waiting_{0};
  std::atomic<bool> applier_waiting_{false};      // the polling thread waits for mutex_
  std::unique_lock<std::mutex>* held_ = nullptr;  // the polling thread's, while it holds it
  std::size_t held_blocks_ = 0;                   // blocks applied under the current hold
  std::exception_ptr thread_error_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> alive_{false};
  std::thread thread_;
};

}  // namespace detail
}  // namespace promptcache

#endif  // PROMPTCACHE_DETAIL_KV_STREAM_FOLLOWER_HPP
