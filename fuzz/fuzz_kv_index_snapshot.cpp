// Fuzz harness for KvIndex snapshots (kv_index_snapshot.hpp). The first byte
// picks one of two modes.
//
// Raw bytes: the rest of the input is restored into an empty index as it is,
// or (one input in two) after its checksum is recomputed, so that mutations
// reach the structure checks behind it. A restore must never crash, leak or
// throw; a rejected one must leave the index and the info untouched; an
// accepted one must give an index that passes check_invariants, whose cursors
// are the info's, and whose own snapshot restores to the same views.
//
// Structured: the input drives an event stream over up to 6 worker ranks
// (stores under the root, under held and under unknown parents, removals,
// clears, with either unknown-parent policy) into an index; its snapshot must
// restore to the same ranks, cursors, views and find_matches answers, every
// sampled prefix must be rejected as truncated, and a changed byte must be
// rejected, each leaving the target untouched.
//
// One operation is one restore.
#include <fuzzer/FuzzedDataProvider.h>
#include <promptcache/kv_index_snapshot.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <tuple>
#include <vector>

#include "fuzz_support.hpp"

namespace {

using promptcache::KvBlock;
using promptcache::KvEvent;
using promptcache::KvIndex;
using promptcache::KvIndexOptions;
using promptcache::KvSnapshotInfo;
using promptcache::KvWorker;
using promptcache::KvWorkerMatch;
namespace kv_event = promptcache::kv_event;
using Bytes = std::vector<std::byte>;

fuzz::OperationReport report{"fuzz_kv_index_snapshot"};

promptcache::KvSnapshotStatus restore(const Bytes& b, KvIndex& idx, KvSnapshotInfo& info) {
  ++fuzz::operations();
  std::unique_ptr<std::byte[]> copy(new std::byte[b.empty() ? 1 : b.size()]);
  if (!b.empty()) std::memcpy(copy.get(), b.data(), b.size());
  return promptcache::restore_kv_index(std::span<const std::byte>(copy.get(), b.size()), idx, info);
}

KvSnapshotInfo sentinel_info() {
  KvSnapshotInfo s;
  s.stream_sequence = 0xABCDU;
  return s;
}

void check_untouched(const KvIndex& idx, const KvSnapshotInfo& info) {
  FUZZ_CHECK(idx.worker_count() == 0U && idx.node_count() == 0U);
  FUZZ_CHECK(idx.counters() == promptcache::KvIndexCounters{});
  FUZZ_CHECK(info == sentinel_info());
}

std::set<std::tuple<bool, std::uint64_t, std::uint64_t, std::uint64_t>> links(const KvIndex& idx,
                                                                              const KvWorker& w) {
  std::set<std::tuple<bool, std::uint64_t, std::uint64_t, std::uint64_t>> out;
  for (const KvEvent& ev : idx.dump(w)) {
    const auto& st = std::get<kv_event::Stored>(ev.data);
    std::optional<std::uint64_t> parent = st.parent_hash;
    for (const KvBlock& b : st.blocks) {
      out.emplace(parent.has_value(), parent.value_or(0), b.block_hash, b.tokens_hash);
      parent = b.block_hash;
    }
  }
  return out;
}

std::vector<KvWorker> restored_ranks(const KvIndex& idx) {
  std::vector<KvWorker> w = idx.workers();
  w.erase(std::remove_if(w.begin(), w.end(),
                         [&](const KvWorker& k) {
                           return !idx.cursor(k)->last_applied_id() && idx.block_count(k) == 0U;
                         }),
          w.end());
  std::sort(w.begin(), w.end());
  return w;
}

void check_same(const KvIndex& a, const KvIndex& b) {
  const std::vector<KvWorker> wa = restored_ranks(a);
  FUZZ_CHECK(wa == restored_ranks(b));
  FUZZ_CHECK(a.total_blocks() == b.total_blocks());
  FUZZ_CHECK(a.node_count() == b.node_count());
  FUZZ_CHECK(a.total_orphans() == b.total_orphans());
  for (const KvWorker& w : wa) {
    FUZZ_CHECK(a.cursor(w) == b.cursor(w));
    FUZZ_CHECK(links(a, w) == links(b, w));
    for (const KvEvent& ev : a.dump(w)) {
      std::vector<std::uint64_t> q;
      for (const KvBlock& blk : std::get<kv_event::Stored>(ev.data).blocks)
        q.push_back(blk.tokens_hash);
      std::vector<KvWorkerMatch> ma = a.find_matches(q), mb = b.find_matches(q);
      std::sort(ma.begin(), ma.end());
      std::sort(mb.begin(), mb.end());
      FUZZ_CHECK(ma == mb);
    }
  }
  FUZZ_CHECK(b.check_invariants());
}

void raw_mode(FuzzedDataProvider& in) {
  const bool reseal = in.ConsumeBool();
  const bool orphans = in.ConsumeBool();
  const std::vector<std::uint8_t> rest = in.ConsumeRemainingBytes<std::uint8_t>();
  Bytes b(rest.size());
  if (!rest.empty()) std::memcpy(b.data(), rest.data(), rest.size());
  if (reseal && b.size() >= 9U) {
    const std::size_t n = b.size() - 9U;
    const std::uint64_t sum = promptcache::detail::xxh3_64(b.data(), n);
    b[n] = std::byte{0xcf};
    for (int i = 0; i < 8; ++i)
      b[n + 1U + static_cast<std::size_t>(i)] =
          static_cast<std::byte>((sum >> (8 * (7 - i))) & 0xFFU);
  }
  KvIndexOptions opt;
  if (orphans) opt.on_unknown_parent = promptcache::KvUnknownParent::keep_orphan;
  KvIndex idx(opt);
  KvSnapshotInfo info = sentinel_info();
  const auto st = restore(b, idx, info);
  if (!st.ok()) {
    FUZZ_CHECK(!st.detail.empty());
    FUZZ_CHECK(st.code != promptcache::KvSnapshotErrc::out_of_memory);
    check_untouched(idx, info);
    return;
  }
  FUZZ_CHECK(idx.check_invariants());
  for (const auto& c : info.cursors) {
    if (!c.last_event_id) continue;
    FUZZ_CHECK(idx.cursor(c.worker) && idx.cursor(c.worker)->last_applied_id() == c.last_event_id);
  }
  KvIndex again(opt);
  KvSnapshotInfo info2;
  FUZZ_CHECK(restore(promptcache::kv_index_snapshot(idx, info.stream_sequence), again, info2).ok());
  check_same(idx, again);
}

void structured_mode(FuzzedDataProvider& in) {
  KvIndexOptions opt;
  if (in.ConsumeBool()) opt.on_unknown_parent = promptcache::KvUnknownParent::keep_orphan;
  if (in.ConsumeBool()) opt.on_gap = promptcache::KvGapPolicy::reset_and_apply;
  KvIndex idx(opt);
  const std::size_t ranks = in.ConsumeIntegralInRange<std::size_t>(1, 6);
  std::vector<std::uint64_t> next_id(ranks, 0);
  std::vector<std::vector<std::uint64_t>> names(ranks);
  std::uint64_t fresh = 1;
  const int events = in.ConsumeIntegralInRange<int>(0, 120);
  for (int e = 0; e < events && in.remaining_bytes() > 0; ++e) {
    const std::size_t r = in.ConsumeIntegralInRange<std::size_t>(0, ranks - 1U);
    const KvWorker w{r / 2U, static_cast<std::uint32_t>(r % 2U)};
    KvEvent ev;
    ev.event_id = next_id[r];
    next_id[r] += in.ConsumeIntegralInRange<std::uint64_t>(0, 20) == 0 ? 2U : 1U;  // some gaps
    const int kind = in.ConsumeIntegralInRange<int>(0, 9);
    if (kind < 7 || names[r].empty()) {
      kv_event::Stored st;
      const int p = in.ConsumeIntegralInRange<int>(0, 3);
      if (p == 1 && !names[r].empty())
        st.parent_hash = names[r][in.ConsumeIntegralInRange<std::size_t>(0, names[r].size() - 1U)];
      else if (p == 2)
        st.parent_hash = 0xF000000000000000ULL + in.ConsumeIntegralInRange<std::uint64_t>(0, 5);
      const int n = in.ConsumeIntegralInRange<int>(1, 10);
      for (int i = 0; i < n; ++i) {
        st.blocks.push_back(KvBlock{fresh++ * 0x9E3779B97F4A7C15ULL,
                                    in.ConsumeIntegralInRange<std::uint64_t>(1, 4)});
        names[r].push_back(st.blocks.back().block_hash);
      }
      ev.data = std::move(st);
    } else if (kind < 9) {
      kv_event::Removed rm;
      rm.block_hashes.push_back(
          names[r][in.ConsumeIntegralInRange<std::size_t>(0, names[r].size() - 1U)]);
      ev.data = std::move(rm);
    } else {
      ev.data = kv_event::Cleared{};
    }
    (void)idx.apply(w, ev);
  }
  const std::uint64_t seq = in.ConsumeIntegral<std::uint64_t>();
  const Bytes snap = promptcache::kv_index_snapshot(idx, seq);
  {
    KvIndex back(opt);
    KvSnapshotInfo info;
    FUZZ_CHECK(restore(snap, back, info).ok());
    FUZZ_CHECK(info.stream_sequence == seq);
    check_same(idx, back);
  }
  const std::size_t step = snap.size() > 256U ? snap.size() / 32U : 1U;
  for (std::size_t n = 0; n < snap.size(); n += step) {
    KvIndex back(opt);
    KvSnapshotInfo info = sentinel_info();
    const auto st =
        restore(Bytes(snap.begin(), snap.begin() + static_cast<std::ptrdiff_t>(n)), back, info);
    FUZZ_CHECK(st.code == (n == 0 ? promptcache::KvSnapshotErrc::empty
                                  : promptcache::KvSnapshotErrc::truncated));
    check_untouched(back, info);
  }
  Bytes g = snap;
  g[in.ConsumeIntegralInRange<std::size_t>(0, g.size() - 1U)] ^=
      static_cast<std::byte>(in.ConsumeIntegralInRange<std::uint8_t>(1, 255));
  KvIndex back(opt);
  KvSnapshotInfo info = sentinel_info();
  FUZZ_CHECK(!restore(g, back, info).ok());
  check_untouched(back, info);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  FuzzedDataProvider in(data + 1, size - 1);
  if (data[0] < 0x80)
    raw_mode(in);
  else
    structured_mode(in);
  return 0;
}
