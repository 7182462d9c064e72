// Tests of kv_index_snapshot.hpp: restore(snapshot(index)) is the index, with
// its cursors and the stream sequence; malformed snapshots change nothing.
#include <promptcache/kv_index_snapshot.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "catch.hpp"

namespace {

using promptcache::KvBlock;
using promptcache::KvEvent;
using promptcache::KvIndex;
using promptcache::KvIndexOptions;
using promptcache::KvSnapshotErrc;
using promptcache::KvSnapshotInfo;
using promptcache::KvUnknownParent;
using promptcache::KvWorker;
using promptcache::KvWorkerMatch;
namespace kv_event = promptcache::kv_event;
using Bytes = std::vector<std::byte>;

// A random event stream over `workers` ranks: stores under the root or under
// a block the rank holds (or once held), with tokens hashes from a small
// alphabet so that ranks share prefixes; removals; rare clears.
struct Workload {
  std::mt19937_64 rng;
  std::vector<KvWorker> workers;
  std::map<KvWorker, std::uint64_t> next_id;
  std::map<KvWorker, std::vector<std::uint64_t>> names;  // every name a rank stored
  std::uint64_t fresh = 1;

  Workload(std::uint64_t seed, std::size_t n) : rng(seed) {
    for (std::size_t i = 0; i < n; ++i)
      workers.push_back(KvWorker{1000U + i / 2U, static_cast<std::uint32_t>(i % 2U)});
  }

  std::pair<KvWorker, KvEvent> next() {
    const KvWorker w = workers[rng() % workers.size()];
    KvEvent ev;
    ev.event_id = next_id[w]++;
    auto& held = names[w];
    const auto r = rng() % 100U;
    if (r < 70U || held.empty()) {
      kv_event::Stored st;
      if (!held.empty() && rng() % 3U != 0U) st.parent_hash = held[rng() % held.size()];
      const auto n = 1U + rng() % 8U;
      for (std::uint64_t i = 0; i < n; ++i) {
        st.blocks.push_back(KvBlock{(fresh++ * 0x9E3779B97F4A7C15ULL) | 1U, 1U + rng() % 4U});
        held.push_back(st.blocks.back().block_hash);
      }
      ev.data = st;
    } else if (r < 97U) {
      kv_event::Removed rm;
      const auto n = 1U + rng() % 4U;
      for (std::uint64_t i = 0; i < n; ++i)
        rm.block_hashes.push_back(held[rng() % held.size()]);
      ev.data = rm;
    } else {
      ev.data = kv_event::Cleared{};
    }
    return {w, ev};
  }
};

// A worker's view as a set of (parent, block_hash, tokens_hash) links, which
// does not depend on the order a dump lists its chains in.
std::set<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, bool>> links(const KvIndex& idx,
                                                                              const KvWorker& w) {
  std::set<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, bool>> out;
  for (const KvEvent& ev : idx.dump(w)) {
    const auto& st = std::get<kv_event::Stored>(ev.data);
    std::optional<std::uint64_t> parent = st.parent_hash;
    for (const KvBlock& b : st.blocks) {
      out.emplace(parent.value_or(0), b.block_hash, b.tokens_hash, parent.has_value());
      parent = b.block_hash;
    }
  }
  return out;
}

std::vector<KvWorkerMatch> sorted(std::vector<KvWorkerMatch> m) {
  std::sort(m.begin(), m.end());
  return m;
}

void require_same(const KvIndex& a, const KvIndex& b, std::mt19937_64& rng) {
  std::vector<KvWorker> wa = a.workers(), wb = b.workers();
  std::sort(wa.begin(), wa.end());
  std::sort(wb.begin(), wb.end());
  // A rank that never applied an event and holds nothing is not restored.
  wa.erase(std::remove_if(wa.begin(), wa.end(),
                          [&](const KvWorker& w) {
                            return !a.cursor(w)->last_applied_id() && a.block_count(w) == 0U;
                          }),
           wa.end());
  REQUIRE(wa == wb);
  CHECK(a.total_blocks() == b.total_blocks());
  CHECK(a.node_count() == b.node_count());
  CHECK(a.total_orphans() == b.total_orphans());
  for (const KvWorker& w : wa) {
    CHECK(a.cursor(w) == b.cursor(w));
    CHECK(a.block_count(w) == b.block_count(w));
    CHECK(links(a, w) == links(b, w));
  }
  // Queries: the tokens paths of stored chains, their prefixes, and noise.
  std::vector<std::vector<std::uint64_t>> queries;
  for (const KvWorker& w : wa) {
    for (const KvEvent& ev : a.dump(w)) {
      const auto& st = std::get<kv_event::Stored>(ev.data);
      std::vector<std::uint64_t> q;
      for (const KvBlock& blk : st.blocks)
        q.push_back(blk.tokens_hash);
      queries.push_back(q);
    }
  }
  for (int i = 0; i < 200; ++i) {
    std::vector<std::uint64_t> q(1U + rng() % 12U);
    for (auto& t : q)
      t = 1U + rng() % 4U;
    queries.push_back(q);
  }
  for (const auto& q : queries) {
    CHECK(sorted(a.find_matches(q)) == sorted(b.find_matches(q)));
    CHECK(sorted(a.find_matches(q, true)) == sorted(b.find_matches(q, true)));
  }
  CHECK(b.check_invariants());
}

KvIndex random_index(std::uint64_t seed, std::size_t workers, std::size_t events,
                     KvIndexOptions options = {}) {
  KvIndex idx(options);
  Workload wl(seed, workers);
  for (std::size_t i = 0; i < events; ++i) {
    const auto [w, ev] = wl.next();
    (void)idx.apply(w, ev);
  }
  return idx;
}

Bytes reseal(Bytes b) {  // recomputes the checksum after an edit
  const std::size_t n = b.size() - 9U;
  const std::uint64_t sum = promptcache::detail::xxh3_64(b.data(), n);
  for (int i = 0; i < 8; ++i)
    b[n + 1U + static_cast<std::size_t>(i)] =
        static_cast<std::byte>((sum >> (8 * (7 - i))) & 0xFFU);
  return b;
}

}  // namespace

TEST_CASE("restore(snapshot(index)) is the index, its cursors and the sequence") {
  std::mt19937_64 rng(11);
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    INFO(seed);
    const KvIndex idx = random_index(seed, 1U + seed % 9U, 60U * seed);
    const std::uint64_t seq = seed == 12 ? std::numeric_limits<std::uint64_t>::max() : seed * 1000U;
    const Bytes snap = promptcache::kv_index_snapshot(idx, seq);
    KvIndex back;
    KvSnapshotInfo info;
    const auto st = promptcache::restore_kv_index(snap, back, info);
    REQUIRE(st.ok());
    CHECK(info.stream_sequence == seq);
    for (const auto& c : info.cursors)
      CHECK(idx.cursor(c.worker)->last_applied_id() == c.last_event_id);
    CHECK(info.cursors.size() == idx.worker_count());
    CHECK(std::is_sorted(info.cursors.begin(), info.cursors.end(),
                         [](const auto& x, const auto& y) { return x.worker < y.worker; }));
    require_same(idx, back, rng);
    // A snapshot of the restored index is as large and restores the same
    // views (its chains may be listed in another order).
    const Bytes again = promptcache::kv_index_snapshot(back, seq);
    CHECK(again.size() == snap.size());
    KvIndex third;
    KvSnapshotInfo info3;
    REQUIRE(promptcache::restore_kv_index(again, third, info3).ok());
    CHECK(info3 == info);
    require_same(idx, third, rng);
    // The restored index continues the streams where they were.
    for (const auto& c : info.cursors) {
      if (!c.last_event_id) continue;
      const auto r = back.apply(c.worker, KvEvent{*c.last_event_id, kv_event::Cleared{}});
      CHECK(r.status == promptcache::KvEventStatus::stale);
    }
  }
}

TEST_CASE("snapshots keep orphan chains when the index keeps them") {
  std::mt19937_64 rng(5);
  KvIndexOptions opt;
  opt.on_unknown_parent = KvUnknownParent::keep_orphan;
  KvIndex idx(opt);
  // Chains under parents nobody placed, and a chain of another rank.
  REQUIRE(idx.apply(KvWorker{1, 0}, KvEvent{0, kv_event::Stored{77, {{10, 1}, {11, 2}}}}).ok());
  REQUIRE(idx.apply(KvWorker{2, 0}, KvEvent{0, kv_event::Stored{std::nullopt, {{20, 1}}}}).ok());
  REQUIRE(idx.apply(KvWorker{1, 0}, KvEvent{1, kv_event::Stored{11, {{12, 3}}}}).ok());
  REQUIRE(idx.total_orphans() > 0U);
  const Bytes snap = promptcache::kv_index_snapshot(idx, 9);
  KvIndex back(opt);
  KvSnapshotInfo info;
  REQUIRE(promptcache::restore_kv_index(snap, back, info).ok());
  require_same(idx, back, rng);
  // An index that refuses orphans refuses the snapshot whole.
  KvIndex refusing;
  KvSnapshotInfo untouched;
  untouched.stream_sequence = 42;
  const auto st = promptcache::restore_kv_index(snap, refusing, untouched);
  CHECK(st.code == KvSnapshotErrc::refused);
  CHECK(refusing.worker_count() == 0U);
  CHECK(refusing.node_count() == 0U);
  CHECK(untouched.stream_sequence == 42U);
  CHECK(untouched.cursors.empty());
  // Random workloads with orphans.
  for (std::uint64_t seed = 20; seed < 24; ++seed) {
    const KvIndex r = random_index(seed, 5, 400, opt);
    KvIndex b(opt);
    REQUIRE(promptcache::restore_kv_index(promptcache::kv_index_snapshot(r, 1), b, info).ok());
    require_same(r, b, rng);
  }
}

TEST_CASE("an empty index snapshots and restores") {
  const KvIndex idx;
  const Bytes snap = promptcache::kv_index_snapshot(idx, 3);
  KvIndex back;
  KvSnapshotInfo info;
  REQUIRE(promptcache::restore_kv_index(snap, back, info).ok());
  CHECK(info.stream_sequence == 3U);
  CHECK(info.cursors.empty());
  CHECK(back.worker_count() == 0U);
}

TEST_CASE("malformed snapshots are rejected whole and change nothing") {
  const KvIndex idx = random_index(3, 4, 300);
  const Bytes snap = promptcache::kv_index_snapshot(idx, 77);
  const auto rejects = [&](const Bytes& b) {
    KvIndex target;
    KvSnapshotInfo info;
    info.stream_sequence = 5;
    const auto st = promptcache::restore_kv_index(b, target, info);
    CHECK(!st.ok());
    CHECK(!st.detail.empty());
    CHECK(target.worker_count() == 0U);
    CHECK(target.node_count() == 0U);
    CHECK(target.counters() == promptcache::KvIndexCounters{});
    CHECK(info.stream_sequence == 5U);
    CHECK(info.cursors.empty());
    return st.code;
  };
  CHECK(rejects({}) == KvSnapshotErrc::empty);
  // Every prefix (sampled) is truncated.
  for (std::size_t n = 1; n < snap.size(); n += 1U + n / 7U) {
    INFO(n);
    CHECK(rejects(Bytes(snap.begin(), snap.begin() + static_cast<std::ptrdiff_t>(n))) ==
          KvSnapshotErrc::truncated);
  }
  Bytes more = snap;
  more.push_back(std::byte{0});
  CHECK(rejects(more) == KvSnapshotErrc::trailing_bytes);
  // Any single changed byte is caught (by the checksum, or earlier).
  std::mt19937_64 rng(9);
  for (int i = 0; i < 300; ++i) {
    Bytes g = snap;
    const std::size_t at = rng() % g.size();
    g[at] ^= static_cast<std::byte>(1U + rng() % 255U);
    rejects(g);
  }
  // Field by field, with a valid checksum.
  Bytes v2 = snap;
  const std::size_t ver = 1U + 1U + promptcache::kv_index_snapshot_magic.size();
  REQUIRE(v2[ver] == std::byte{0x01});
  v2[ver] = std::byte{0x02};
  CHECK(rejects(reseal(v2)) == KvSnapshotErrc::unsupported_version);
  Bytes magic = snap;
  magic[3] = std::byte{'X'};
  CHECK(rejects(reseal(magic)) == KvSnapshotErrc::bad_magic);
  Bytes sum = snap;
  sum.back() ^= std::byte{1};
  CHECK(rejects(sum) == KvSnapshotErrc::bad_checksum);
  CHECK(rejects(Bytes{std::byte{0xc1}}) == KvSnapshotErrc::invalid_msgpack);
  CHECK(rejects(Bytes{std::byte{0x93}, std::byte{0x01}, std::byte{0x02}, std::byte{0x03}}) ==
        KvSnapshotErrc::bad_magic);
}

TEST_CASE("hand-built snapshots: structure errors and order rules") {
  // [magic, 1, seq, workers, checksum] with `workers` written by `body`.
  const auto doc = [](auto body) {
    Bytes out;
    promptcache::detail::DynByteBuffer buf(out);
    msgpack::packer<promptcache::detail::DynByteBuffer> pk(buf);
    pk.pack_array(5);
    const auto m = promptcache::kv_index_snapshot_magic;
    pk.pack_str(static_cast<std::uint32_t>(m.size()));
    pk.pack_str_body(m.data(), static_cast<std::uint32_t>(m.size()));
    pk.pack_uint64(1);
    pk.pack_uint64(8);
    body(pk);
    out.push_back(std::byte{0xcf});
    out.resize(out.size() + 8U);
    return reseal(out);
  };
  const auto block = [](auto& pk, std::size_t bytes) {
    std::vector<char> b(bytes, '\x01');
    pk.pack_bin(static_cast<std::uint32_t>(bytes));
    pk.pack_bin_body(b.data(), static_cast<std::uint32_t>(bytes));
  };
  const auto status = [](const Bytes& b) {
    KvIndex target;
    KvSnapshotInfo info;
    return promptcache::restore_kv_index(b, target, info).code;
  };
  // One worker, one chain of one block: restores.
  CHECK(status(doc([&](auto& pk) {
          pk.pack_array(1);
          pk.pack_array(4);
          pk.pack_uint64(1);
          pk.pack_uint64(0);
          pk.pack_uint64(5);
          pk.pack_array(1);
          pk.pack_array(2);
          pk.pack_nil();
          block(pk, 16);
        })) == KvSnapshotErrc::ok);
  // A block record of 15 bytes; an empty chain.
  for (const std::size_t bytes : {std::size_t{15}, std::size_t{0}}) {
    CHECK(status(doc([&](auto& pk) {
            pk.pack_array(1);
            pk.pack_array(4);
            pk.pack_uint64(1);
            pk.pack_uint64(0);
            pk.pack_uint64(5);
            pk.pack_array(1);
            pk.pack_array(2);
            pk.pack_nil();
            block(pk, bytes);
          })) == KvSnapshotErrc::bad_format);
  }
  // The same rank twice; ranks out of order; a dp rank above 2^32 - 1;
  // blocks without a cursor; a negative id.
  const auto rank = [&](auto& pk, std::uint64_t id, std::uint64_t dp, bool cursor) {
    pk.pack_array(4);
    pk.pack_uint64(id);
    pk.pack_uint64(dp);
    if (cursor)
      pk.pack_uint64(0);
    else
      pk.pack_nil();
    pk.pack_array(1);
    pk.pack_array(2);
    pk.pack_nil();
    block(pk, 16);
  };
  CHECK(status(doc([&](auto& pk) {
          pk.pack_array(2);
          rank(pk, 1, 0, true);
          rank(pk, 1, 0, true);
        })) == KvSnapshotErrc::bad_format);
  CHECK(status(doc([&](auto& pk) {
          pk.pack_array(2);
          rank(pk, 2, 0, true);
          rank(pk, 1, 0, true);
        })) == KvSnapshotErrc::bad_format);
  CHECK(status(doc([&](auto& pk) {
          pk.pack_array(1);
          rank(pk, 1, std::uint64_t{1} << 32, true);
        })) == KvSnapshotErrc::bad_format);
  CHECK(status(doc([&](auto& pk) {
          pk.pack_array(1);
          rank(pk, 1, 0, false);
        })) == KvSnapshotErrc::bad_format);
  CHECK(status(doc([&](auto& pk) {
          pk.pack_array(1);
          pk.pack_array(4);
          pk.pack_int64(-1);
          pk.pack_uint64(0);
          pk.pack_nil();
          pk.pack_array(0);
        })) == KvSnapshotErrc::bad_format);
  // Two ranks claiming one name twice in a chain: the index refuses it.
  CHECK(status(doc([&](auto& pk) {
          pk.pack_array(1);
          pk.pack_array(4);
          pk.pack_uint64(1);
          pk.pack_uint64(0);
          pk.pack_uint64(0);
          pk.pack_array(1);
          pk.pack_array(2);
          pk.pack_nil();
          block(pk, 32);  // two blocks named 0x0101... : a block conflict
        })) == KvSnapshotErrc::refused);
  // Into an index that knows workers already.
  KvIndex busy;
  REQUIRE(busy.apply(KvWorker{1, 0}, KvEvent{0, kv_event::Cleared{}}).ok());
  KvSnapshotInfo info;
  CHECK(promptcache::restore_kv_index(promptcache::kv_index_snapshot(KvIndex{}, 1), busy, info)
            .code == KvSnapshotErrc::index_not_empty);
  CHECK(busy.worker_count() == 1U);
  CHECK(promptcache::to_string(KvSnapshotErrc::bad_checksum) == "bad_checksum");
}
