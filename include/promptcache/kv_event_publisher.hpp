// promptcache: kv_event_publisher.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The engine side of the KV event stream: publishes a PagedPrefixCache's
// events in vLLM's wire format, so any router that follows vLLM engines
// (Dynamo's, ZmqKvSubscriber) follows a C++ engine built on promptcache too.
//
// KvEventPublisher (no transport) collects the cache's events during an engine
// step and encodes them, when the step ends, as one msgspec KVEventBatch with
// the next seq (0, 1, 2, ...), keeping the last buffer_batches batches for
// replay. ZmqKvEventPublisher sends each batch on a PUB socket as
// [topic, seq (8 bytes big-endian), payload] and answers a ROUTER replay
// socket as vLLM does: a request [empty, start seq] gets [empty, seq, payload]
// for every buffered batch with seq >= start, then [empty, -1, empty].
//
// State dump (not in vLLM): a replay request whose start seq is 2^64 - 2 asks
// for the blocks the engine holds as of its last published seq S. The answer
// is one or more ordinary KVEventBatch payloads of BlockStored events (parents
// before children), each sent as [empty, S, payload], then the end marker. A
// router joining late (or after an unrecoverable gap) replaces its view with
// them and continues from S + 1. vLLM answers the same request with the end
// marker alone (it buffers no such seq), which is how a router tells that a
// publisher has no dump. docs/kv_event_publisher.md specifies the exchange.
//
// Threading: the engine's scheduler thread drives everything (no thread of its
// own): the cache calls the sink, the engine calls end_step() after each step
// and poll_replay() between steps (or while idle). Needs msgpack-cxx, cppzmq
// and libzmq.
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
#endif
#if !defined(PROMPTCACHE_KV_EVENT_PUBLISHER_HPP) && \
    (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) >= 202002L
#define PROMPTCACHE_KV_EVENT_PUBLISHER_HPP

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "promptcache/detail/kv_publisher_encoder.hpp"
#include "promptcache/detail/kv_publisher_state.hpp"
#include "promptcache/kv_index.hpp"
#include "promptcache/paged_prefix_cache.hpp"

namespace promptcache {

/// How a KVEventBatch is laid out on the wire (msgspec's array_like choices).
enum class KvWireLayout : std::uint8_t {
  map,        ///< {"ts", "events", "data_parallel_rank"}, events {"type": ...}: vLLM's default.
  array_map,  ///< [ts, [events], data_parallel_rank], events {"type": ...}.
  array,      ///< [ts, [events], data_parallel_rank], events ["BlockStored", ...] (SGLang's form).
};

/// Publisher settings.
struct KvEventPublisherOptions {
  KvWireLayout layout = KvWireLayout::map;  ///< The wire layout of every batch.
  /// data_parallel_rank written in each batch; nullopt writes None (omitted in a map batch).
  std::optional<std::uint32_t> dp_rank = 0;
  /// Batches kept for replay (vLLM's buffer_steps). 0: replays return nothing.
  std::size_t buffer_batches = 10000;
  /// Keep the cached blocks' tokens (a copy: 4 bytes per token plus about 80 bytes
  /// per block) to answer state dumps. false: dump requests get the end marker alone.
  bool state_dump = true;
  /// At most this many blocks per dump payload (at least 1 is used).
  std::size_t dump_blocks_per_batch = 4096;
  /// The batches' ts (seconds since the epoch); empty: std::chrono::system_clock.
  std::function<double()> clock;
};

/// What a publisher did, since construction.
struct KvPublisherStats {
  std::uint64_t batches = 0;           ///< Batches encoded (seqs assigned).
  std::uint64_t events = 0;            ///< Events in them.
  std::uint64_t replay_requests = 0;   ///< Well-formed replay requests answered.
  std::uint64_t batches_replayed = 0;  ///< Buffered batches sent in answers.
  std::uint64_t dumps = 0;             ///< State dumps sent.
  std::uint64_t dump_batches = 0;      ///< Payloads in them.
  std::uint64_t bad_requests = 0;      ///< Malformed requests (answered with the end marker).
};

/// One encoded batch: its seq and payload (valid until the publisher changes).
struct KvEncodedBatch {
  std::uint64_t seq = 0;               ///< Its sequence number.
  std::span<const char> payload = {};  ///< The msgpack KVEventBatch.
};

/// Collects a PagedPrefixCache's events per engine step and encodes them as vLLM
/// KVEventBatch payloads with consecutive seqs, keeping a replay buffer and (with
/// state_dump) the blocks held for dumps. No transport: ZmqKvEventPublisher sends.
/// Not thread-safe: one engine thread drives it. Not copyable or movable: the cache's
/// sink refers to it, so it must outlive the cache (or the cache's last event).
class KvEventPublisher {
 public:
  /// The seq of the end-of-replay marker (-1 as 8 signed bytes).
  static constexpr std::uint64_t end_marker = ~std::uint64_t{0};
  /// The start seq of a state dump request (2^64 - 2: no batch ever has it).
  static constexpr std::uint64_t dump_request = ~std::uint64_t{0} - 1U;

  /// A publisher with `options`. O(1).
  explicit KvEventPublisher(KvEventPublisherOptions options = {})
      : options_(std::move(options)),
        encoder_(detail::KvPubLayout{options_.layout == KvWireLayout::map,
                                     options_.layout != KvWireLayout::array}),
        ring_(options_.buffer_batches) {}

  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  /// The token sink to construct the PagedPrefixCache with; it refers to this
  /// publisher. O(1).
  [[nodiscard]] auto sink() noexcept {
    return [this](const KvEvent& e, const PagedStoredPages& pages) { on_event(e, pages); };
  }

  /// Records one event for the current step (what sink() calls). A Stored event needs
  /// its pages' tokens, a whole number of blocks of at least one token each: otherwise
  /// throws std::invalid_argument, recording nothing. O(tokens + blocks). Strong guarantee.
  void on_event(const KvEvent& e, const PagedStoredPages& pages) {
    detail::KvPubEvent ev;
    if (const auto* s = std::get_if<kv_event::Stored>(&e.data)) {
      const std::size_t n = s->blocks.size();
      if (n == 0 || pages.tokens.empty() || pages.tokens.size() % n != 0)
        throw std::invalid_argument("KvEventPublisher: a Stored event needs its blocks' tokens");
      const std::size_t bs = pages.tokens.size() / n;
      if (bs > std::numeric_limits<std::uint32_t>::max())
        throw std::invalid_argument("KvEventPublisher: block size above 2^32 - 1");
      ev.kind = detail::KvPubEvent::Kind::stored;
      ev.parent = s->parent_hash;
      ev.hashes.reserve(n);
      for (const KvBlock& b : s->blocks)
        ev.hashes.push_back(b.block_hash);
      ev.tokens.assign(pages.tokens.begin(), pages.tokens.end());
      ev.block_size = static_cast<std::uint32_t>(bs);
      ev.ns = pages.ns;
    } else if (const auto* r = std::get_if<kv_event::Removed>(&e.data)) {
      if (r->block_hashes.empty()) return;  // nothing for a router to do
      ev.kind = detail::KvPubEvent::Kind::removed;
      ev.hashes = r->block_hashes;
    } else {
      ev.kind = detail::KvPubEvent::Kind::cleared;
    }
    pending_.push_back(std::move(ev));
  }

  /// Describes namespace `ns`'s block-hash seed in its BlockStored events as
  /// configure_namespace(ns, lora_name, cache_salt) sets it: the adapter as lora_name
  /// (lora_id when given) and in every block's extra_keys, the salt as the key
  /// cache_salt_key_prefix + salt in each event's first block (where Dynamo's router
  /// and kv_event_wire.hpp read it). A namespace never described is published as the
  /// cache hashes an unconfigured one: 0 with neither, any other with its id in
  /// decimal as the salt. lora_id is written with a LoRA name only. Applies to the
  /// batches flushed from then on and to state dumps (which describe every block held).
  /// Throws std::invalid_argument, nothing changed, for a description that
  /// configure_namespace refuses (no LoRA name, and a salt that is another id's default:
  /// empty for `ns` != 0, or another id in decimal). O(1) expected.
  void set_namespace(std::uint64_t ns, std::string lora_name, std::string cache_salt,
                     std::optional<std::int64_t> lora_id = {}) {
    if (lora_name.empty() && detail::PagedNamespaces::names_other_namespace(cache_salt, ns))
      throw std::invalid_argument(
          "KvEventPublisher: the description is another namespace's default seed");
    seeds_.insert_or_assign(ns, Seed{std::move(lora_name), lora_id, std::move(cache_salt)});
  }

  /// set_namespace(ns, name, "", id): the namespace as configure_namespace(ns, name)
  /// hashes it. An empty name returns `ns` to its default description. O(1) expected.
  void set_lora(std::uint64_t ns, std::string name, std::optional<std::int64_t> id = {}) {
    if (name.empty()) {
      seeds_.erase(ns);
      return;
    }
    set_namespace(ns, std::move(name), std::string(), id);
  }

  /// Ends the step: encodes the recorded events as one batch with the next seq, buffers
  /// it for replay and applies it to the dump state. Nothing recorded: no batch (as vLLM,
  /// which publishes only steps with events), nullopt. O(events + tokens). Strong guarantee
  /// (std::bad_alloc), except that a dump state that cannot be updated is dropped (dumps
  /// are then refused) rather than left wrong. Invalidates the previous batch's span.
  std::optional<KvEncodedBatch> flush() {
    if (pending_.empty()) return std::nullopt;
    encode(scratch_, pending_);
    const std::uint64_t seq = next_seq_;
    ring_.push(seq, scratch_);
    // From here on nothing throws but the mirror's allocations; a mirror that
    // failed is dropped rather than left half-applied (dumps then say "none").
    if (options_.state_dump && mirror_ok_) {
      try {
        for (const detail::KvPubEvent& e : pending_)
          mirror_.apply(e);
      } catch (...) {
        mirror_.clear();
        mirror_ok_ = false;
      }
    }
    ++stats_.batches;
    stats_.events += pending_.size();
    pending_.clear();
    ++next_seq_;
    return KvEncodedBatch{seq, std::span<const char>(scratch_.data(), scratch_.size())};
  }

  /// Events recorded since the last flush(). O(1).
  [[nodiscard]] std::size_t pending_events() const noexcept { return pending_.size(); }
  /// The seq the next batch gets (0 before the first). O(1).
  [[nodiscard]] std::uint64_t next_seq() const noexcept { return next_seq_; }
  /// Blocks the dump state holds (0 without state_dump). O(1).
  [[nodiscard]] std::size_t state_blocks() const noexcept { return mirror_.size(); }
  /// Batches in the replay buffer. O(1).
  [[nodiscard]] std::size_t buffered_batches() const noexcept { return ring_.size(); }
  /// Counters. O(1).
  [[nodiscard]] const KvPublisherStats& stats() const noexcept { return stats_; }
  /// The options. O(1).
  [[nodiscard]] const KvEventPublisherOptions& options() const noexcept { return options_; }

  /// Answers one replay request, `start` being its seq frame: calls send(seq,
  /// std::span<const char> payload) for each reply and last send(end_marker, {}).
  /// 8 bytes big-endian = start seq: every buffered batch with seq >= start (vLLM's
  /// answer); dump_request: the state dump (nothing when state_dump is off or before
  /// the first batch); any other size is a bad request: the end marker alone.
  /// O(replies + bytes sent); a dump O(blocks log blocks). Recorded events are not
  /// affected. Strong guarantee for the publisher (send may have run).
  template <class Send>
  void answer_replay(std::span<const std::byte> start, Send&& send) {
    if (start.size() != 8) {
      ++stats_.bad_requests;
      send(end_marker, std::span<const char>());
      return;
    }
    std::uint64_t from = 0;
    for (const std::byte b : start)
      from = (from << 8) | static_cast<std::uint64_t>(b);
    ++stats_.replay_requests;
    if (from == dump_request) {
      dump(send);
    } else {
      ring_.for_each_from(from, [&](std::uint64_t seq, const std::vector<char>& bytes) {
        ++stats_.batches_replayed;
        send(seq, std::span<const char>(bytes.data(), bytes.size()));
      });
    }
    send(end_marker, std::span<const char>());
  }

 private:
  double now() const {
    if (options_.clock) return options_.clock();
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  void encode(std::vector<char>& out, std::span<const detail::KvPubEvent> events) const {
    // A default salt lives in `salt` until the next call.
    std::string salt;
    encoder_.batch(out, now(), events, options_.dp_rank,
                   [this, &salt](std::uint64_t ns) -> detail::KvPubSeed {
                     const auto it = seeds_.find(ns);
                     if (it != seeds_.end())
                       return {it->second.lora_name, it->second.lora_id, it->second.cache_salt};
                     salt = detail::PagedNamespaces::default_salt(ns);
                     return {{}, {}, salt};
                   });
  }

  // Sends the dump: payloads of at most dump_blocks_per_batch blocks, each tagged with
  // the last published seq; at least one (an empty cache gives a batch without
  // events), so that a router tells an empty cache from a publisher without dumps.
  template <class Send>
  void dump(Send& send) {
    if (!options_.state_dump || !mirror_ok_ || next_seq_ == 0) return;
    const std::uint64_t seq = next_seq_ - 1U;
    const std::size_t limit = std::max<std::size_t>(options_.dump_blocks_per_batch, 1);
    std::vector<detail::KvPubEvent> events;
    std::size_t blocks = 0;
    std::vector<char> bytes;
    std::uint64_t sent = 0;
    const auto send_batch = [&] {
      encode(bytes, events);
      send(seq, std::span<const char>(bytes.data(), bytes.size()));
      ++sent;
      events.clear();
      blocks = 0;
    };
    mirror_.dump(limit, [&](detail::KvPubEvent&& e) {
      if (blocks + e.hashes.size() > limit && !events.empty()) send_batch();
      blocks += e.hashes.size();
      events.push_back(std::move(e));
    });
    if (!events.empty() || sent == 0) send_batch();
    ++stats_.dumps;
    stats_.dump_batches += sent;
  }

  KvEventPublisherOptions options_;
  detail::KvPubEncoder encoder_;
  detail::KvPubRing ring_;
  detail::KvPubMirror mirror_;
  bool mirror_ok_ = true;
  std::vector<detail::KvPubEvent> pending_;
  std::vector<char> scratch_;
  struct Seed {
    std::string lora_name;
    std::optional<std::int64_t> lora_id;
    std::string cache_salt;
  };
  std::unordered_map<std::uint64_t, Seed> seeds_;
  std::uint64_t next_seq_ = 0;
  KvPublisherStats stats_;
};

/// ZeroMQ endpoints and settings of a ZmqKvEventPublisher.
struct ZmqKvEventPublisherOptions {
  /// PUB address. Bound when it holds "*", "::" or is ipc:// or inproc:// (as vLLM
  /// decides), connected otherwise. "tcp://127.0.0.1:*" binds an ephemeral port.
  std::string endpoint = "tcp://*:5557";
  std::string replay_endpoint;  ///< ROUTER replay address (always bound); empty: none.
  std::string topic;            ///< First frame of every live message.
  int send_hwm = 100000;        ///< ZMQ_SNDHWM of the PUB socket (vLLM's hwm).
  /// ZMQ_SNDHWM of the ROUTER: a ROUTER drops replies beyond it, so the default (0: no
  /// limit) keeps a whole buffer or dump replay intact for a slow router.
  int replay_send_hwm = 0;
  /// At most this many replay requests per poll_replay() call (at least 1 is used).
  std::size_t max_requests_per_poll = 16;
  KvEventPublisherOptions events;  ///< Encoding, buffer and dump settings.
};

/// KvEventPublisher over ZeroMQ, wire-compatible with vLLM's ZmqEventPublisher. Driven
/// by the engine's thread: end_step() after each step, poll_replay() between steps and
/// while idle (a router waits replay_timeout, 2 s by default, for an answer). Construction
/// binds / connects; a bad endpoint throws zmq::error_t.
class ZmqKvEventPublisher {
 public:
  /// Opens the sockets. O(1).
  explicit ZmqKvEventPublisher(ZmqKvEventPublisherOptions options)
      : options_(std::move(options)), events_(options_.events) {
    pub_ = zmq::socket_t(ctx_, zmq::socket_type::pub);
    pub_.set(zmq::sockopt::linger, 0);
    pub_.set(zmq::sockopt::sndhwm, options_.send_hwm);
    if (binds(options_.endpoint))
      pub_.bind(options_.endpoint);
    else
      pub_.connect(options_.endpoint);
    if (!options_.replay_endpoint.empty()) {
      replay_ = zmq::socket_t(ctx_, zmq::socket_type::router);
      replay_.set(zmq::sockopt::linger, 0);
      replay_.set(zmq::sockopt::sndhwm, options_.replay_send_hwm);
      replay_.bind(options_.replay_endpoint);
    }
  }

  ZmqKvEventPublisher(const ZmqKvEventPublisher&) = delete;
  ZmqKvEventPublisher& operator=(const ZmqKvEventPublisher&) = delete;

  /// The token sink to construct the PagedPrefixCache with (see KvEventPublisher). O(1).
  [[nodiscard]] auto sink() noexcept { return events_.sink(); }
  /// The transport-independent publisher (LoRA names, counters, state). O(1).
  [[nodiscard]] KvEventPublisher& events() noexcept { return events_; }
  /// Read-only access to the same. O(1).
  [[nodiscard]] const KvEventPublisher& events() const noexcept { return events_; }

  /// Ends the step: flush() and, if a batch was made, sends [topic, seq, payload] on the
  /// PUB socket (never blocks: ZeroMQ drops at the high-water mark, and the batch stays
  /// buffered for replay). Returns its seq. O(events + bytes).
  std::optional<std::uint64_t> end_step() {
    const std::optional<KvEncodedBatch> b = events_.flush();
    if (!b) return std::nullopt;
    const std::array<unsigned char, 8> seq = seq_bytes(b->seq);
    std::array<zmq::const_buffer, 3> msg = {
        zmq::const_buffer(options_.topic.data(), options_.topic.size()),
        zmq::const_buffer(seq.data(), seq.size()),
        zmq::const_buffer(b->payload.data(), b->payload.size())};
    (void)zmq::send_multipart(pub_, msg, zmq::send_flags::dontwait);
    return b->seq;
  }

  /// Waits up to `timeout` for a replay request, then answers the ones queued (at most
  /// max_requests_per_poll); returns how many. A request [empty, 8-byte seq] is answered
  /// as KvEventPublisher::answer_replay says; any other shape is a bad request, answered
  /// with the end marker alone. 0 without a replay socket. O(replies + bytes).
  std::size_t poll_replay(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    if (!replay_) return 0;
    zmq::pollitem_t item{replay_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) <= 0) return 0;
    std::size_t handled = 0;
    const std::size_t limit = std::max<std::size_t>(options_.max_requests_per_poll, 1);
    while (handled < limit) {
      frames_.clear();
      if (!zmq::recv_multipart(replay_, std::back_inserter(frames_), zmq::recv_flags::dontwait))
        break;
      ++handled;
      const zmq::message_t& id = frames_.front();  // a ROUTER always prepends it
      std::span<const std::byte> start;
      const bool shaped = frames_.size() == 3 && frames_[1].size() == 0;
      if (shaped) start = {static_cast<const std::byte*>(frames_[2].data()), frames_[2].size()};
      events_.answer_replay(start, [&](std::uint64_t seq, std::span<const char> payload) {
        const std::array<unsigned char, 8> s = seq_bytes(seq);
        std::array<zmq::const_buffer, 4> msg = {zmq::const_buffer(id.data(), id.size()),
                                                zmq::const_buffer(nullptr, 0),
                                                zmq::const_buffer(s.data(), s.size()),
                                                zmq::const_buffer(payload.data(), payload.size())};
        // A ROUTER never blocks: it drops replies to a peer that left.
        (void)zmq::send_multipart(replay_, msg, zmq::send_flags::dontwait);
      });
    }
    return handled;
  }

  /// The PUB socket's address (the port chosen for a "*" port). O(1).
  [[nodiscard]] std::string endpoint() const { return pub_.get(zmq::sockopt::last_endpoint); }
  /// The replay socket's bound address; empty without one. O(1).
  [[nodiscard]] std::string replay_endpoint() const {
    return replay_ ? replay_.get(zmq::sockopt::last_endpoint) : std::string();
  }

 private:
  static bool binds(const std::string& e) {
    return e.find('*') != std::string::npos || e.find("::") != std::string::npos ||
           e.rfind("ipc://", 0) == 0 || e.rfind("inproc://", 0) == 0;
  }

  static std::array<unsigned char, 8> seq_bytes(std::uint64_t v) noexcept {
    std::array<unsigned char, 8> b{};
    for (std::size_t i = 0; i < 8; ++i)
      b[i] = static_cast<unsigned char>(v >> (56U - 8U * i));
    return b;
  }

  ZmqKvEventPublisherOptions options_;
  KvEventPublisher events_;
  zmq::context_t ctx_;
  zmq::socket_t pub_;
  zmq::socket_t replay_;
  std::vector<zmq::message_t> frames_;
};

}  // namespace promptcache

#endif  // PROMPTCACHE_KV_EVENT_PUBLISHER_HPP
