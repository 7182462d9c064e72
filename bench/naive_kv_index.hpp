// The baseline of bench/kv_index_vs_naive.cpp: the obvious KV router index.
// Per worker, a hash set of the sequence hashes of the blocks it holds (and a
// map from the worker's block names to them); a lookup probes every worker
// block by block. No cursor, no cascade on removal (the benchmark's workload
// evicts leaves first, so it never needs one), and the caller hands it the
// query's sequence hashes precomputed: the cheapest version of the baseline.
#pragma once

#include <promptcache/block_hash.hpp>
#include <promptcache/kv_index.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace bench {

class NaiveKvIndex {
 public:
  explicit NaiveKvIndex(std::size_t workers) : workers_(workers) {}

  // Returns the number of blocks stored.
  std::size_t store(std::uint32_t worker, std::optional<std::uint64_t> parent,
                    std::span<const promptcache::KvBlock> blocks) {
    Worker& w = workers_[worker];
    std::optional<std::uint64_t> seq;
    if (parent) {
      const auto it = w.names.find(*parent);
      if (it == w.names.end()) return 0;
      seq = it->second;
    }
    for (const promptcache::KvBlock& b : blocks) {
      const std::uint64_t s = seq ? promptcache::sequence_hash(*seq, b.tokens_hash) : b.tokens_hash;
      w.names.emplace(b.block_hash, s);
      w.held.insert(s);
      seq = s;
    }
    return blocks.size();
  }

  void remove(std::uint32_t worker, std::span<const std::uint64_t> names) {
    Worker& w = workers_[worker];
    for (const std::uint64_t n : names) {
      const auto it = w.names.find(n);
      if (it == w.names.end()) continue;
      w.held.erase(it->second);
      w.names.erase(it);
    }
  }

  // (worker, leading blocks held) for every worker holding the first block.
  void find_matches(std::span<const std::uint64_t> sequence_hashes,
                    std::vector<std::pair<std::uint32_t, std::size_t>>& out) const {
    out.clear();
    for (std::uint32_t w = 0; w < workers_.size(); ++w) {
      const auto& held = workers_[w].held;
      std::size_t k = 0;
      while (k < sequence_hashes.size() && held.count(sequence_hashes[k]) != 0U)
        ++k;
      if (k > 0) out.emplace_back(w, k);
    }
  }

  [[nodiscard]] std::size_t blocks() const {
    std::size_t n = 0;
    for (const Worker& w : workers_)
      n += w.held.size();
    return n;
  }

 private:
  struct Worker {
    std::unordered_map<std::uint64_t, std::uint64_t> names;  // block hash -> sequence hash
    std::unordered_set<std::uint64_t> held;                  // sequence hashes
  };
  std::vector<Worker> workers_;
};

}  // namespace bench
