// Snapshot and restore of a KvIndex (kv_index_snapshot.hpp): time and bytes
// for an index of N (worker, block) pairs over R worker ranks, against the
// same run's baselines: dumping every rank (KvIndex::dump, which the snapshot
// calls), rebuilding an index from those dumps in memory (replace_worker,
// which the restore calls) and building the index from its events (apply).
//
// Workload: every rank holds 8 shared system prompts of 32 blocks (the same
// tokens hashes on every rank, each rank naming its blocks itself) and
// conversations of 4 to 64 blocks, half of them under a system prompt, until
// it holds N / R pairs. Tokens hashes of conversation blocks are random, so
// conversations share nothing.
//
// Usage: kv_index_snapshot_restore [pairs [ranks [rounds]]]  (defaults
//   1000000 8 3). Prints the best round of each phase.
#include <promptcache/kv_index_snapshot.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using promptcache::KvBlock;
using promptcache::KvEvent;
using promptcache::KvIndex;
using promptcache::KvWorker;
namespace kv_event = promptcache::kv_event;

std::uint64_t mix(std::uint64_t k) {
  k ^= k >> 33U;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33U;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33U;
  return k;
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Stream {
  KvWorker worker;
  std::vector<KvEvent> events;
};

std::vector<Stream> workload(std::size_t pairs, std::size_t ranks) {
  std::mt19937_64 rng(1);
  std::vector<Stream> out;
  const std::size_t per_rank = pairs / ranks;
  for (std::size_t r = 0; r < ranks; ++r) {
    Stream s;
    s.worker = KvWorker{0x1000U + r / 2U, static_cast<std::uint32_t>(r % 2U)};
    std::uint64_t names = (r + 1U) << 40U;
    std::size_t held = 0;
    std::vector<std::uint64_t> prompt_tails;
    for (std::uint64_t p = 0; p < 8U; ++p) {
      kv_event::Stored st;
      for (std::uint64_t b = 0; b < 32U; ++b)
        st.blocks.push_back(KvBlock{mix(++names), mix((p << 8U) | b)});
      prompt_tails.push_back(st.blocks.back().block_hash);
      held += st.blocks.size();
      s.events.push_back(KvEvent{s.events.size(), std::move(st)});
    }
    while (held < per_rank) {
      kv_event::Stored st;
      if (rng() % 2U != 0U) st.parent_hash = prompt_tails[rng() % prompt_tails.size()];
      const std::size_t n = std::min<std::size_t>(4U + rng() % 61U, per_rank - held);
      for (std::size_t b = 0; b < n; ++b)
        st.blocks.push_back(KvBlock{mix(++names), rng()});
      held += n;
      s.events.push_back(KvEvent{s.events.size(), std::move(st)});
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t pairs = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1000000U;
  const std::size_t ranks = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 8U;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 3;
  const std::vector<Stream> streams = workload(pairs, ranks);

  double build = 1e300, dump = 1e300, rebuild = 1e300, snap = 1e300, restore = 1e300;
  std::size_t bytes = 0, chains = 0;
  for (int round = 0; round < rounds; ++round) {
    auto t0 = Clock::now();
    KvIndex idx;
    for (const Stream& s : streams)
      for (const KvEvent& ev : s.events)
        if (!idx.apply(s.worker, ev).ok()) return 1;
    build = std::min(build, ms_since(t0));

    t0 = Clock::now();
    std::vector<std::vector<KvEvent>> dumps;
    for (const Stream& s : streams)
      dumps.push_back(idx.dump(s.worker));
    dump = std::min(dump, ms_since(t0));
    chains = 0;
    for (const auto& d : dumps)
      chains += d.size();

    t0 = Clock::now();
    KvIndex rebuilt;
    for (std::size_t i = 0; i < streams.size(); ++i)
      if (!rebuilt.replace_worker(streams[i].worker, dumps[i], streams[i].events.size() - 1U).ok)
        return 1;
    rebuild = std::min(rebuild, ms_since(t0));

    t0 = Clock::now();
    const std::vector<std::byte> bytes_out = promptcache::kv_index_snapshot(idx, 12345);
    snap = std::min(snap, ms_since(t0));
    bytes = bytes_out.size();

    t0 = Clock::now();
    KvIndex back;
    promptcache::KvSnapshotInfo info;
    if (!promptcache::restore_kv_index(bytes_out, back, info).ok()) return 1;
    restore = std::min(restore, ms_since(t0));
    if (back.total_blocks() != idx.total_blocks() || back.node_count() != idx.node_count() ||
        info.stream_sequence != 12345U || info.cursors.size() != streams.size())
      return 1;
  }
  std::printf("pairs %zu ranks %zu chains %zu, best of %d rounds\n", pairs, ranks, chains, rounds);
  std::printf("build by apply          %9.1f ms\n", build);
  std::printf("dump every rank         %9.1f ms\n", dump);
  std::printf("rebuild (replace_worker)%9.1f ms\n", rebuild);
  std::printf("snapshot                %9.1f ms  (%.2f x dump)\n", snap, snap / dump);
  std::printf("restore                 %9.1f ms  (%.2f x rebuild, %.2f x build)\n", restore,
              restore / rebuild, restore / build);
  std::printf("bytes                   %9zu (%.2f per pair)\n", bytes,
              static_cast<double>(bytes) / static_cast<double>(pairs));
  return 0;
}
