// promptcache: nats_kv_snapshot_store.hpp
// SPDX-License-Identifier: Apache-2.0
//
// A fleet of router replicas over one JetStream stream of KV events
// (NatsKvSubscriber's durable mode): replicas save their state (the replica
// document of NatsKvSubscriber::snapshot, current at a stream sequence S) in
// a NATS key-value bucket; a new replica restores the latest one and reads
// the stream from S + 1 on, so that every message is applied exactly once
// across the boundary; and the stream is purged up to what no live replica
// and no joiner can still need.
//
// The bucket (one per stream, history 1):
//   latest              the manifest: which snapshot is the latest (its S,
//                       its chunk count, size and XXH3-64); replaced only by
//                       a snapshot with a higher S (compare-and-set)
//   snap.<S>.<nonce>.<i>  chunk i of that snapshot (values stay under the
//                       server's max_payload); the previous snapshot's chunks
//                       are purged once the manifest moved on
//   replica.<name>      a replica's registration: "<applied> <heartbeat>",
//                       the stream sequence it has applied and the time of its
//                       last heartbeat (milliseconds since the clock's epoch)
//
// The purge floor: the latest snapshot's S, lowered to the applied sequence
// of every live replica (a heartbeat within stale_after of now); messages at
// or below it are purged. Without a snapshot nothing is purged.
//
// docs/nats_kv_subscriber.md#durable-replicas states the rules and
// fallbacks; docs/nats_kv_snapshot_store.md the API.
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
#endif
#if !defined(PROMPTCACHE_NATS_KV_SNAPSHOT_STORE_HPP) && \
    (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) >= 202002L
#define PROMPTCACHE_NATS_KV_SNAPSHOT_STORE_HPP

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nats/nats.h>

#include "promptcache/kv_index_snapshot.hpp"
#include "promptcache/nats_kv_subscriber.hpp"

namespace promptcache {

/// Settings of a snapshot store.
struct NatsKvSnapshotStoreOptions {
  NatsKvConnectionOptions connection;  ///< Where and how to connect.
  /// The JetStream stream the replicas read (NatsKvJetStreamOptions::stream).
  std::string stream;
  /// The key-value bucket (letters, digits, '-', '_'); created when missing
  /// (file storage, history 1).
  std::string bucket = "promptcache_kv_snapshots";
  /// A snapshot is stored in values of at most this many bytes; keep it under
  /// the server's max_payload (1 MB by default). >= 1.
  std::size_t chunk_bytes = 512 * 1024;
  /// A replica whose last heartbeat is older than this does not hold the
  /// purge back. > 0.
  std::chrono::milliseconds stale_after{30000};
  /// The time of heartbeats and of the staleness test; empty:
  /// std::chrono::system_clock (replicas on several hosts compare times).
  std::function<std::chrono::system_clock::time_point()> clock;
};

/// What load_latest() found.
enum class NatsKvSnapshotFound : std::uint8_t {
  none = 0,  ///< No snapshot saved yet.
  ok,        ///< `document` holds the latest snapshot, checksum verified.
  corrupt,   ///< A manifest that does not parse, a chunk missing or of the wrong
             ///< size, or bytes whose checksum fails (after a few re-reads).
};

/// The latest snapshot, as load_latest() read it.
struct NatsKvSnapshotLoad {
  NatsKvSnapshotFound found = NatsKvSnapshotFound::none;  ///< Whether and how it was found.
  std::uint64_t stream_sequence = 0;  ///< The manifest's S (also when corrupt, if it parsed).
  std::vector<std::byte> document;    ///< The replica document when `ok`.
};

/// How join() started the replica.
enum class NatsKvJoinStart : std::uint8_t {
  snapshot = 0,          ///< Restored the latest snapshot; reads from its S + 1.
  no_snapshot,           ///< No snapshot: empty index, reads from the stream's first message.
  corrupt_snapshot,      ///< The snapshot did not load or restore: as no_snapshot.
  purged_past_snapshot,  ///< Restored, but the stream no longer holds S + 1: reads from its
                         ///< first message; each worker whose batches were purged shows a
                         ///< gap on its next batch (the publisher's replay, or a reset).
};

/// What join() did.
struct NatsKvJoinReport {
  NatsKvJoinStart start = NatsKvJoinStart::no_snapshot;  ///< Which start.
  std::uint64_t snapshot_sequence = 0;                   ///< The snapshot's S (0 without one).
  std::uint64_t start_sequence = 0;  ///< The consumer's first stream sequence (0: the first).
  KvSnapshotStatus restore;          ///< The restore's status (ok unless corrupt_snapshot).
  std::size_t snapshot_bytes = 0;    ///< The document's size.
};

/// One registered replica, as replicas() lists it.
struct NatsKvReplicaInfo {
  std::string name;                                 ///< Its name (the key after "replica.").
  std::uint64_t applied = 0;                        ///< The stream sequence it has applied.
  std::chrono::system_clock::time_point heartbeat;  ///< Its last heartbeat.
  bool live = false;  ///< Heartbeat within stale_after of now (or ahead of it).
};

/// The first and last sequence the stream holds.
struct NatsKvStreamBounds {
  std::uint64_t first = 0;     ///< The first message kept (last + 1 when empty).
  std::uint64_t last = 0;      ///< The last message stored (0: none ever).
  std::uint64_t messages = 0;  ///< Messages held.
};

namespace detail {

struct NatsKvStoreDeleter {
  void operator()(kvStore* kv) const noexcept { kvStore_Destroy(kv); }
};
struct NatsKvEntryDeleter {
  void operator()(kvEntry* e) const noexcept { kvEntry_Destroy(e); }
};
using NatsKvEntryPtr = std::unique_ptr<kvEntry, NatsKvEntryDeleter>;

// The manifest: "v1 <S> <nonce> <chunks> <bytes> <xxh3>", decimal.
struct NatsSnapshotManifest {
  std::uint64_t sequence = 0;
  std::uint64_t nonce = 0;
  std::uint64_t chunks = 0;
  std::uint64_t bytes = 0;
  std::uint64_t checksum = 0;
};

inline std::string nats_manifest_text(const NatsSnapshotManifest& m) {
  return "v1 " + std::to_string(m.sequence) + " " + std::to_string(m.nonce) + " " +
         std::to_string(m.chunks) + " " + std::to_string(m.bytes) + " " +
         std::to_string(m.checksum);
}

// Splits `s` at single spaces into exactly `n` decimal u64 fields.
inline bool nats_fields(std::string_view s, std::uint64_t* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t sp = s.find(' ');
    const std::string_view f = i + 1 == n ? s : s.substr(0, sp);
    if (i + 1 < n && sp == std::string_view::npos) return false;
    const std::optional<std::uint64_t> v = nats_parse_u64(f);
    if (!v) return false;
    out[i] = *v;
    if (i + 1 < n) s.remove_prefix(sp + 1);
  }
  return true;
}

inline std::optional<NatsSnapshotManifest> nats_parse_manifest(std::string_view s) noexcept {
  if (s.substr(0, 3) != "v1 ") return std::nullopt;
  std::uint64_t f[5] = {};
  if (!nats_fields(s.substr(3), f, 5)) return std::nullopt;
  return NatsSnapshotManifest{f[0], f[1], f[2], f[3], f[4]};
}

inline std::string_view nats_entry_text(kvEntry* e) noexcept {
  const void* v = kvEntry_Value(e);
  const int len = kvEntry_ValueLen(e);
  if (v == nullptr || len <= 0) return {};
  return {static_cast<const char*>(v), static_cast<std::size_t>(len)};
}

inline bool nats_key_name(std::string_view s) noexcept {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
  });
}

}  // namespace detail

/// Snapshots, registrations and the purge of a replica fleet, in one
/// key-value bucket beside the KV event stream. Calls are synchronous
/// requests to the server (bounded by connection.connect_timeout each); one
/// thread at a time per store object; any number of stores (processes) may
/// share a bucket.
class NatsKvSnapshotStore {
 public:
  /// Connects and creates (or binds) the bucket. Throws
  /// std::invalid_argument for an empty stream name, a bucket name with other
  /// characters than letters, digits, '-' and '_', chunk_bytes 0 or above
  /// 2^31 - 1, or stale_after <= 0; NatsKvError when the server cannot be
  /// reached or refuses the bucket (no JetStream).
  explicit NatsKvSnapshotStore(NatsKvSnapshotStoreOptions options) : options_(std::move(options)) {
    if (options_.stream.empty())
      throw std::invalid_argument("NatsKvSnapshotStore: stream must be named");
    if (!detail::nats_key_name(options_.bucket))
      throw std::invalid_argument("NatsKvSnapshotStore: bucket must be letters, digits, - or _");
    if (options_.chunk_bytes == 0 ||
        options_.chunk_bytes > static_cast<std::size_t>(std::numeric_limits<int>::max()))
      throw std::invalid_argument("NatsKvSnapshotStore: chunk_bytes out of range");
    if (options_.stale_after.count() <= 0)
      throw std::invalid_argument("NatsKvSnapshotStore: stale_after must be positive");
    conn_ = std::make_unique<detail::NatsConnection>(options_.connection, "NatsKvSnapshotStore");
    jsCtx* js = nullptr;
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = options_.connection.connect_timeout.count();
    detail::nats_check(natsConnection_JetStream(&js, conn_->get(), &jo),
                       "natsConnection_JetStream");
    js_.reset(js);
    kvConfig cfg;
    kvConfig_Init(&cfg);
    cfg.Bucket = options_.bucket.c_str();
    cfg.History = 1;
    cfg.StorageType = js_FileStorage;
    kvStore* kv = nullptr;
    natsStatus s = js_CreateKeyValue(&kv, js, &cfg);
    if (s != NATS_OK) s = js_KeyValue(&kv, js, options_.bucket.c_str());  // it exists
    detail::nats_check(s, "js_CreateKeyValue");
    kv_.reset(kv);
    std::random_device rd;
    rng_.seed((static_cast<std::uint64_t>(rd()) << 32) ^ rd());
  }
  NatsKvSnapshotStore(const NatsKvSnapshotStore&) = delete;
  NatsKvSnapshotStore& operator=(const NatsKvSnapshotStore&) = delete;
  /// Closes the connection (the bucket and its keys stay).
  ~NatsKvSnapshotStore() {
    kv_.reset();
    js_.reset();
    conn_.reset();
  }

  /// Stores `document` (NatsKvSubscriber::snapshot(), current at
  /// `stream_sequence`) as the latest snapshot unless the latest is current
  /// at the same or a later sequence; then purges the previous snapshot's
  /// chunks. True when it became the latest. Throws NatsKvError when the
  /// server refuses a write (nothing changes for readers: the manifest moves
  /// last), std::invalid_argument for an empty document. O(document).
  bool save(std::span<const std::byte> document, std::uint64_t stream_sequence) {
    if (document.empty()) throw std::invalid_argument("NatsKvSnapshotStore::save: no bytes");
    std::optional<detail::NatsSnapshotManifest> old;
    std::uint64_t rev = 0;
    if (!read_manifest(old, rev)) old.reset();  // a corrupt manifest is replaced
    if (old && old->sequence >= stream_sequence) return false;
    detail::NatsSnapshotManifest m;
    m.sequence = stream_sequence;
    m.nonce = rng_();
    m.bytes = document.size();
    m.chunks = (document.size() + options_.chunk_bytes - 1) / options_.chunk_bytes;
    m.checksum = detail::xxh3_64(document.data(), document.size());
    for (std::uint64_t i = 0; i < m.chunks; ++i) {
      const std::size_t at = static_cast<std::size_t>(i) * options_.chunk_bytes;
      const std::size_t len = std::min(options_.chunk_bytes, document.size() - at);
      detail::nats_check(kvStore_Put(nullptr, kv_.get(), chunk_key(m, i).c_str(),
                                     document.data() + at, static_cast<int>(len)),
                         "kvStore_Put");
    }
    for (;;) {
      const std::string text = detail::nats_manifest_text(m);
      const natsStatus s = rev == 0 ? kvStore_Create(nullptr, kv_.get(), "latest", text.data(),
                                                     static_cast<int>(text.size()))
                                    : kvStore_Update(nullptr, kv_.get(), "latest", text.data(),
                                                     static_cast<int>(text.size()), rev);
      if (s == NATS_OK) break;
      // Another replica moved the manifest meanwhile: ours goes in only if
      // still newer.
      std::optional<detail::NatsSnapshotManifest> now;
      std::uint64_t now_rev = 0;
      if (!read_manifest(now, now_rev)) now.reset();
      if (now_rev == rev) throw NatsKvError("kvStore_Update", s);  // not a race
      rev = now_rev;
      if (now && now->sequence >= stream_sequence) {
        purge_chunks(m);
        return false;
      }
      old = now;
    }
    if (old) purge_chunks(*old);
    return true;
  }

  /// subscriber.snapshot() stored by save(). O(blocks held).
  bool save(const NatsKvSubscriber& subscriber) {
    std::vector<std::byte> doc = subscriber.snapshot();
    // The sequence follows the magic and the version.
    detail::NatsReplicaReader r(
        std::span<const std::byte>(doc).subspan(detail::nats_replica_magic.size() + 8, 8));
    return save(doc, r.u(8));
  }

  /// Reads the latest snapshot and checks its checksum. A chunk replaced
  /// while it is read (a newer save purged it) makes it read the manifest
  /// again, up to three times; then `corrupt`. Throws NatsKvError only when
  /// the server cannot be asked. O(document).
  NatsKvSnapshotLoad load_latest() {
    NatsKvSnapshotLoad out;
    for (int attempt = 0; attempt < 3; ++attempt) {
      std::optional<detail::NatsSnapshotManifest> m;
      std::uint64_t rev = 0;
      const bool parsed = read_manifest(m, rev);
      if (rev == 0) return NatsKvSnapshotLoad{};  // none
      out = NatsKvSnapshotLoad{};
      out.found = NatsKvSnapshotFound::corrupt;
      if (!parsed) return out;
      out.stream_sequence = m->sequence;
      // Chunks of any size (a writer's chunk_bytes), at least one byte each.
      if (m->bytes == 0 || m->chunks == 0 || m->chunks > m->bytes ||
          m->bytes > std::numeric_limits<std::size_t>::max() / 2)
        return out;
      out.document.reserve(static_cast<std::size_t>(m->bytes));
      bool complete = true;
      for (std::uint64_t i = 0; i < m->chunks && complete; ++i) {
        kvEntry* e = nullptr;
        const natsStatus s = kvStore_Get(&e, kv_.get(), chunk_key(*m, i).c_str());
        if (s == NATS_NOT_FOUND) {
          complete = false;
          break;
        }
        detail::nats_check(s, "kvStore_Get");
        const detail::NatsKvEntryPtr entry(e);
        const auto* v = static_cast<const std::byte*>(kvEntry_Value(e));
        const int len = kvEntry_ValueLen(e);
        if (len <= 0 || out.document.size() + static_cast<std::size_t>(len) > m->bytes) {
          complete = false;
          break;
        }
        out.document.insert(out.document.end(), v, v + len);
      }
      if (complete && out.document.size() == m->bytes &&
          detail::xxh3_64(out.document.data(), out.document.size()) == m->checksum) {
        out.found = NatsKvSnapshotFound::ok;
        return out;
      }
      // Replaced meanwhile? Then the manifest moved: read it again.
      std::optional<detail::NatsSnapshotManifest> again;
      std::uint64_t again_rev = 0;
      (void)read_manifest(again, again_rev);
      if (again_rev == rev) break;
    }
    out.document.clear();
    return out;
  }

  /// Registers (or refreshes) replica `name` (letters, digits, '-', '_'):
  /// it has applied the stream up to `applied`, now (the clock). A live
  /// replica holds the purge at `applied`. Throws std::invalid_argument for a
  /// bad name, NatsKvError when the write fails. O(1).
  void heartbeat(std::string_view name, std::uint64_t applied) {
    const std::string key = replica_key(name);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(now().time_since_epoch()).count();
    const std::string v =
        std::to_string(applied) + " " + std::to_string(ms < 0 ? 0 : static_cast<std::uint64_t>(ms));
    detail::nats_check(
        kvStore_Put(nullptr, kv_.get(), key.c_str(), v.data(), static_cast<int>(v.size())),
        "kvStore_Put");
  }

  /// Removes replica `name`'s registration (it no longer holds the purge).
  /// Throws as heartbeat(). O(1).
  void deregister(std::string_view name) {
    const std::string key = replica_key(name);
    const natsStatus s = kvStore_Purge(kv_.get(), key.c_str(), nullptr);
    if (s != NATS_OK && s != NATS_NOT_FOUND) throw NatsKvError("kvStore_Purge", s);
  }

  /// Every registered replica, by name, with whether it is live. A
  /// registration whose value does not parse is left out (it holds nothing).
  /// O(keys in the bucket).
  std::vector<NatsKvReplicaInfo> replicas() {
    std::vector<NatsKvReplicaInfo> out;
    const auto t = now();
    for (const std::string& key : keys()) {
      if (key.rfind("replica.", 0) != 0) continue;
      kvEntry* e = nullptr;
      const natsStatus s = kvStore_Get(&e, kv_.get(), key.c_str());
      if (s == NATS_NOT_FOUND) continue;
      detail::nats_check(s, "kvStore_Get");
      const detail::NatsKvEntryPtr entry(e);
      std::uint64_t f[2] = {};
      if (!detail::nats_fields(detail::nats_entry_text(e), f, 2)) continue;
      NatsKvReplicaInfo r;
      r.name = key.substr(8);
      r.applied = f[0];
      r.heartbeat = std::chrono::system_clock::time_point(
          std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::milliseconds(
              static_cast<std::int64_t>(std::min<std::uint64_t>(f[1], std::uint64_t{1} << 53)))));
      r.live = t - r.heartbeat <= options_.stale_after;
      out.push_back(std::move(r));
    }
    std::sort(out.begin(), out.end(), [](const NatsKvReplicaInfo& a, const NatsKvReplicaInfo& b) {
      return a.name < b.name;
    });
    return out;
  }

  /// The highest stream sequence purge() may remove: the latest snapshot's
  /// S, lowered to every live replica's applied sequence; 0 (nothing) without
  /// a snapshot or with a corrupt manifest. O(keys in the bucket).
  std::uint64_t purge_floor() {
    std::optional<detail::NatsSnapshotManifest> m;
    std::uint64_t rev = 0;
    if (!read_manifest(m, rev) || !m) return 0;
    std::uint64_t floor = m->sequence;
    for (const NatsKvReplicaInfo& r : replicas())
      if (r.live) floor = std::min(floor, r.applied);
    return floor;
  }

  /// Purges the stream's messages at or below purge_floor(); returns that
  /// floor (0: nothing purged). Any replica may call it at any time: the
  /// floor never passes a live replica's applied sequence nor the latest
  /// snapshot. Throws NatsKvError when the server refuses. O(keys) + the
  /// server's purge.
  std::uint64_t purge() {
    const std::uint64_t floor = purge_floor();
    if (floor == 0) return 0;
    jsOptions o;
    jsOptions_Init(&o);
    o.Wait = options_.connection.connect_timeout.count();
    o.Stream.Purge.Sequence = floor + 1;  // up to, not including
    jsErrCode err = static_cast<jsErrCode>(0);
    detail::nats_check(js_PurgeStream(js_.get(), options_.stream.c_str(), &o, &err),
                       "js_PurgeStream");
    return floor;
  }

  /// The stream's first and last sequence. Throws NatsKvError when the
  /// stream does not exist. O(1).
  NatsKvStreamBounds stream_bounds() {
    jsStreamInfo* si = nullptr;
    jsErrCode err = static_cast<jsErrCode>(0);
    detail::nats_check(js_GetStreamInfo(&si, js_.get(), options_.stream.c_str(), nullptr, &err),
                       "js_GetStreamInfo");
    NatsKvStreamBounds b{si->State.FirstSeq, si->State.LastSeq, si->State.Msgs};
    jsStreamInfo_Destroy(si);
    return b;
  }

  /// A new replica, named options.jetstream.durable (its registration and
  /// consumer name): registers it (holding the purge), loads the latest
  /// snapshot, deletes any consumer of that name, and constructs the
  /// subscriber reading from S + 1 with the snapshot restored (or from the
  /// stream's first message: see NatsKvJoinStart); then registers it at
  /// the sequence it starts from. `report` says which. Throws as the
  /// subscriber's constructor, std::invalid_argument without
  /// jetstream.durable or with another stream than the store's.
  /// O(snapshot + blocks restored).
  std::unique_ptr<NatsKvSubscriber> join(NatsKvSubscriberOptions sub_options,
                                         NatsKvJoinReport& report,
                                         KvIndexOptions index_options = {}) {
    NatsKvJetStreamOptions& j = sub_options.jetstream;
    if (j.stream.empty()) j.stream = options_.stream;
    if (j.stream != options_.stream)
      throw std::invalid_argument("NatsKvSnapshotStore::join: another stream than the store's");
    const std::string name = j.durable;
    // Registered at 0 first: a purge that starts after this holds everything.
    heartbeat(name, 0);
    try {
      return join_registered(std::move(sub_options), name, report, index_options);
    } catch (...) {
      try {
        deregister(name);  // holds nothing once the join failed
      } catch (...) {
        // Unreachable server: the registration goes stale by itself.
      }
      throw;
    }
  }

  /// The store's settings. O(1).
  [[nodiscard]] const NatsKvSnapshotStoreOptions& options() const noexcept { return options_; }

 private:
  std::unique_ptr<NatsKvSubscriber> join_registered(NatsKvSubscriberOptions sub_options,
                                                    const std::string& name,
                                                    NatsKvJoinReport& report,
                                                    KvIndexOptions index_options) {
    NatsKvJetStreamOptions& j = sub_options.jetstream;
    report = NatsKvJoinReport{};
    NatsKvSnapshotLoad snap = load_latest();
    report.snapshot_sequence = snap.stream_sequence;
    report.snapshot_bytes = snap.document.size();
    report.start = snap.found == NatsKvSnapshotFound::ok     ? NatsKvJoinStart::snapshot
                   : snap.found == NatsKvSnapshotFound::none ? NatsKvJoinStart::no_snapshot
                                                             : NatsKvJoinStart::corrupt_snapshot;
    if (snap.found == NatsKvSnapshotFound::corrupt)
      report.restore = {KvSnapshotErrc::bad_checksum, "a chunk missing, or the bytes garbled"};
    std::uint64_t start = 0;
    if (report.start == NatsKvJoinStart::snapshot) {
      start = snap.stream_sequence + 1;
      if (const NatsKvStreamBounds b = stream_bounds(); b.first > start) {
        report.start = NatsKvJoinStart::purged_past_snapshot;
        start = 0;
      }
    }
    jsErrCode err = static_cast<jsErrCode>(0);
    // Gone or never made: either way the consumer is created anew below.
    (void)js_DeleteConsumer(js_.get(), j.stream.c_str(), name.c_str(), nullptr, &err);
    auto make = [&](std::uint64_t from) {
      j.start_sequence = from;
      return std::make_unique<NatsKvSubscriber>(sub_options, index_options);
    };
    std::unique_ptr<NatsKvSubscriber> sub = make(start);
    if (report.start == NatsKvJoinStart::snapshot ||
        report.start == NatsKvJoinStart::purged_past_snapshot) {
      report.restore = sub->restore(snap.document);
      if (!report.restore.ok()) {
        report.start = NatsKvJoinStart::corrupt_snapshot;
        sub.reset();
        (void)js_DeleteConsumer(js_.get(), j.stream.c_str(), name.c_str(), nullptr, &err);
        start = 0;
        sub = make(0);
      }
    }
    report.start_sequence = start;
    heartbeat(name, start == 0 ? 0 : start - 1);
    return sub;
  }

  std::chrono::system_clock::time_point now() const {
    return options_.clock ? options_.clock() : std::chrono::system_clock::now();
  }

  static std::string replica_key(std::string_view name) {
    if (!detail::nats_key_name(name))
      throw std::invalid_argument(
          "NatsKvSnapshotStore: a replica name must be letters, digits, - or _");
    return "replica." + std::string(name);
  }

  static std::string chunk_key(const detail::NatsSnapshotManifest& m, std::uint64_t i) {
    return "snap." + std::to_string(m.sequence) + "." + std::to_string(m.nonce) + "." +
           std::to_string(i);
  }

  // The manifest and its revision (0: none). False when it exists but does
  // not parse.
  bool read_manifest(std::optional<detail::NatsSnapshotManifest>& m, std::uint64_t& rev) {
    m.reset();
    rev = 0;
    kvEntry* e = nullptr;
    const natsStatus s = kvStore_Get(&e, kv_.get(), "latest");
    if (s == NATS_NOT_FOUND) return true;
    detail::nats_check(s, "kvStore_Get");
    const detail::NatsKvEntryPtr entry(e);
    rev = kvEntry_Revision(e);
    m = detail::nats_parse_manifest(detail::nats_entry_text(e));
    return m.has_value();
  }

  void purge_chunks(const detail::NatsSnapshotManifest& m) {
    for (std::uint64_t i = 0; i < m.chunks; ++i)
      // One left behind is harmless: no manifest names it.
      (void)kvStore_Purge(kv_.get(), chunk_key(m, i).c_str(), nullptr);
  }

  std::vector<std::string> keys() {
    kvKeysList list{nullptr, 0};
    const natsStatus s = kvStore_Keys(&list, kv_.get(), nullptr);
    if (s == NATS_NOT_FOUND) return {};
    detail::nats_check(s, "kvStore_Keys");
    std::vector<std::string> out;
    try {
      for (int i = 0; i < list.Count; ++i)
        out.emplace_back(list.Keys[i]);
    } catch (...) {
      kvKeysList_Destroy(&list);
      throw;
    }
    kvKeysList_Destroy(&list);
    return out;
  }

  NatsKvSnapshotStoreOptions options_;
  std::unique_ptr<detail::NatsConnection> conn_;
  detail::NatsJsPtr js_;
  std::unique_ptr<kvStore, detail::NatsKvStoreDeleter> kv_;
  std::mt19937_64 rng_;
};

}  // namespace promptcache

#endif  // PROMPTCACHE_NATS_KV_SNAPSHOT_STORE_HPP
