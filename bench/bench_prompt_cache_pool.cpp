// Catch2 micro-benchmarks of PromptCachePool: lookup (hit, miss, common-prefix), insert of a
// new lineage (with the LRU eviction it causes), extension of a lineage by one turn, and
// update of equal ids. Pool of 4096 entries sharing a 256-token system prefix, 1024-token
// entries. The scan comparison lives in bench/pool_vs_scan.cpp.
//
// Every insert benchmark first runs kWarmup operations of its own kind outside the
// measurement, so that it measures the steady state: the first insert beyond a full pool
// grows the child table of the node where the 4096 lineages branch, a one-time allocation
// of about 400 KB that glibc serves with fresh pages from mmap (about 100 page faults, 2 to
// 18 ms on a VM for that one insert).
#include <promptcache/prompt_cache_pool.hpp>

#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include "catch.hpp"

namespace {

using Token = std::uint32_t;
struct Layer {
  std::uint64_t handle = 0;
};
using Pool = promptcache::PromptCachePool<Layer, Token>;
using Ids = std::vector<Token>;

constexpr std::size_t kEntries = 4096;
constexpr std::size_t kLen = 1024;
constexpr std::size_t kWarmup = 256;  // operations run before measuring (see the file comment)

struct Fixture {
  std::mt19937 rng{7};
  Ids prefix;
  std::vector<Ids> entries;

  Fixture() {
    for (std::size_t i = 0; i < kLen / 4; ++i)
      prefix.push_back(static_cast<Token>(rng() % 50000));
    for (std::size_t i = 0; i < kEntries; ++i)
      entries.push_back(make_entry(i));
  }
  Ids make_entry(std::size_t i) {
    Ids ids = prefix;
    ids.push_back(static_cast<Token>(1000000 + i));
    while (ids.size() < kLen)
      ids.push_back(static_cast<Token>(rng() % 50000));
    return ids;
  }
  Pool::Options options(promptcache::MatchMode mode) const {
    Pool::Options o;
    o.max_entries = kEntries;
    o.ttl = std::chrono::hours(1);
    o.min_cacheable_tokens = 0;
    o.match = mode;
    return o;
  }
  void fill(Pool& pool) const {
    for (std::size_t i = 0; i < kEntries; ++i)
      pool.insert(entries[i], {Layer{i}});
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

}  // namespace

TEST_CASE("PromptCachePool lookups", "[pool][benchmark]") {
  Fixture& f = fixture();
  Pool pool(f.options(promptcache::MatchMode::exact_prefix));
  f.fill(pool);
  std::vector<Ids> hits, misses;
  for (std::size_t i = 0; i < 256; ++i) {
    Ids q = f.entries[(i * 2654435761U) % kEntries];
    q.push_back(1);
    hits.push_back(q);
    q[kLen / 2] ^= 1;  // diverges inside the tail: exact mode misses
    misses.push_back(q);
  }
  std::size_t k = 0;
  BENCHMARK("exact lookup hit, N=4096 L=1024") {
    const auto hit = pool.find_longest_prefix(hits[k++ % hits.size()]);
    return hit ? hit->matched : 0;
  };
  BENCHMARK("exact lookup miss (diverges at L/2), N=4096 L=1024") {
    return pool.find_longest_prefix(misses[k++ % misses.size()]).has_value();
  };

  Pool common(f.options(promptcache::MatchMode::common_prefix));
  f.fill(common);
  BENCHMARK("common-prefix lookup (diverges at L/2), N=4096 L=1024") {
    const auto hit = common.find_longest_prefix(misses[k++ % misses.size()]);
    return hit ? hit->matched : 0;
  };
}

TEST_CASE("PromptCachePool inserts", "[pool][benchmark]") {
  Fixture& f = fixture();
  Pool pool(f.options(promptcache::MatchMode::exact_prefix));
  f.fill(pool);
  std::size_t next = kEntries;
  for (std::size_t i = 0; i < kWarmup; ++i)
    pool.insert(f.make_entry(next++), {Layer{0}});
  BENCHMARK_ADVANCED("insert a new lineage (evicts the LRU entry), N=4096 L=1024")
  (Catch::Benchmark::Chronometer meter) {
    std::vector<Ids> fresh;
    for (int i = 0; i < meter.runs(); ++i)
      fresh.push_back(f.make_entry(next++));
    meter.measure([&](int i) {
      return pool.insert(std::move(fresh[static_cast<std::size_t>(i)]), {Layer{0}});
    });
  };

  Pool chat(f.options(promptcache::MatchMode::exact_prefix));
  f.fill(chat);
  std::vector<Ids> current = f.entries;
  std::size_t turn = 0;
  for (std::size_t i = 0; i < kWarmup; ++i) {
    Ids& ids = current[turn++ % kEntries];
    for (Token t = 0; t < 16; ++t)
      ids.push_back(t + 7);
    chat.insert(ids, {Layer{1}});
  }
  BENCHMARK_ADVANCED("extend a lineage by a 16-token turn, N=4096 L=1024+")
  (Catch::Benchmark::Chronometer meter) {
    // Each run extends a different stored conversation by one turn (the chat-server pattern).
    std::vector<Ids> next_turn;
    for (int i = 0; i < meter.runs(); ++i) {
      Ids& ids = current[turn++ % kEntries];
      for (Token t = 0; t < 16; ++t)
        ids.push_back(t + 7);
      next_turn.push_back(ids);
    }
    meter.measure([&](int i) {
      return chat.insert(std::move(next_turn[static_cast<std::size_t>(i)]), {Layer{1}});
    });
  };

  Pool common_chat(f.options(promptcache::MatchMode::common_prefix));
  f.fill(common_chat);
  std::vector<Ids> common_current = f.entries;
  std::size_t common_turn = 0;
  for (std::size_t i = 0; i < kWarmup; ++i) {
    Ids& ids = common_current[common_turn++ % kEntries];
    for (Token t = 0; t < 16; ++t)
      ids.push_back(t + 7);
    common_chat.insert(ids, {Layer{1}});
  }
  BENCHMARK_ADVANCED("extend a lineage by a 16-token turn, common-prefix mode, N=4096 L=1024+")
  (Catch::Benchmark::Chronometer meter) {
    std::vector<Ids> next_turn;
    for (int i = 0; i < meter.runs(); ++i) {
      Ids& ids = common_current[common_turn++ % kEntries];
      for (Token t = 0; t < 16; ++t)
        ids.push_back(t + 7);
      next_turn.push_back(ids);
    }
    meter.measure([&](int i) {
      return common_chat.insert(std::move(next_turn[static_cast<std::size_t>(i)]), {Layer{1}});
    });
  };

  for (std::size_t i = 0; i < kWarmup; ++i)
    pool.insert(pool.find_exact(f.entries[0]) ? f.entries[0] : f.make_entry(0), {Layer{2}});
  BENCHMARK_ADVANCED("update equal ids, N=4096 L=1024")
  (Catch::Benchmark::Chronometer meter) {
    std::vector<Ids> same;
    for (int i = 0; i < meter.runs(); ++i) {
      same.push_back(pool.find_exact(f.entries[0]) ? f.entries[0] : f.make_entry(0));
    }
    pool.insert(same.back(), {Layer{2}});
    meter.measure([&](int i) {
      return pool.insert(std::move(same[static_cast<std::size_t>(i)]), {Layer{2}});
    });
  };
}
