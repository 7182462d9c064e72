// The straightforward prompt-cache pool: a vector of entries scanned linearly, as simple
// pool implementations in inference engines are written; the baseline of bench/pool_vs_scan.
// Benchmark code only: never part of the library. Lookup is O(entries x prefix length) and
// copies the hit (ids and caches); insert is O(entries x length).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace bench {

template <class LayerCache, class Token = std::uint32_t>
class LinearScanPool {
 public:
  using Clock = std::chrono::steady_clock;

  struct CacheEntry {
    std::vector<Token> ids;
    std::vector<LayerCache> caches;
    std::size_t fed_images = 0;
    std::size_t fed_audios = 0;
    Clock::time_point last_used;
    bool pinned = false;
  };

  LinearScanPool(std::size_t max_entries, Clock::duration ttl, std::size_t min_cacheable_tokens)
      : max_entries_(max_entries), ttl_(ttl), min_cacheable_tokens_(min_cacheable_tokens) {}

  // Returns a copy of the longest stored prefix of `ids` and its length.
  std::optional<std::pair<CacheEntry, std::size_t>> find_longest_prefix(
      std::span<const Token> ids) {
    evict_expired();
    std::optional<std::size_t> best;
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const CacheEntry& e = entries_[i];
      if (!e.ids.empty() && is_prefix(e.ids, ids) &&
          (!best || e.ids.size() > entries_[*best].ids.size())) {
        best = i;
      }
    }
    if (!best) return std::nullopt;
    entries_[*best].last_used = Clock::now();
    const std::size_t shared = entries_[*best].ids.size();
    return std::make_pair(entries_[*best], shared);
  }

  // Longest-common-prefix variant (the straightforward scan): the entry
  // sharing the most leading tokens with `ids`, and how many.
  std::optional<std::pair<CacheEntry, std::size_t>> find_longest_common_prefix(
      std::span<const Token> ids) {
    evict_expired();
    std::optional<std::size_t> best;
    std::size_t best_len = 0;
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const CacheEntry& e = entries_[i];
      const std::size_t n = std::min(e.ids.size(), ids.size());
      const auto mm =
          std::mismatch(e.ids.begin(), e.ids.begin() + static_cast<std::ptrdiff_t>(n), ids.begin());
      const auto len = static_cast<std::size_t>(mm.first - e.ids.begin());
      if (len > best_len) {
        best = i;
        best_len = len;
      }
    }
    if (!best) return std::nullopt;
    entries_[*best].last_used = Clock::now();
    return std::make_pair(entries_[*best], best_len);
  }

  void insert_or_update(std::vector<Token> ids, std::vector<LayerCache> caches,
                        std::size_t fed_images, std::size_t fed_audios, bool pinned) {
    const auto now = Clock::now();
    if (ids.size() < min_cacheable_tokens_ &&
        std::none_of(entries_.begin(), entries_.end(),
                     [&](const CacheEntry& e) { return is_prefix(e.ids, ids); })) {
      return;
    }
    auto existing = std::find_if(entries_.begin(), entries_.end(),
                                 [&](const CacheEntry& e) { return is_prefix(e.ids, ids); });
    if (existing != entries_.end()) {
      existing->ids = std::move(ids);
      existing->caches = std::move(caches);
      existing->fed_images = fed_images;
      existing->fed_audios = fed_audios;
      existing->last_used = now;
      existing->pinned = existing->pinned || pinned;
      return;
    }
    entries_.push_back(
        CacheEntry{std::move(ids), std::move(caches), fed_images, fed_audios, now, pinned});
    evict_lru_if_over_capacity();
  }

  // Bench-only bulk load: appends without the O(entries) lineage check of insert_or_update
  // (the caller guarantees no stored entry is a prefix of `ids`), so big pools build fast.
  void push_unchecked(std::vector<Token> ids, std::vector<LayerCache> caches) {
    entries_.push_back(CacheEntry{std::move(ids), std::move(caches), 0, 0, Clock::now(), false});
  }

  std::size_t size() const { return entries_.size(); }

 private:
  static bool is_prefix(std::span<const Token> shorter, std::span<const Token> longer) {
    return shorter.size() <= longer.size() &&
           std::equal(shorter.begin(), shorter.end(), longer.begin());
  }

  void evict_expired() {
    const auto now = Clock::now();
    std::erase_if(entries_,
                  [&](const CacheEntry& e) { return !e.pinned && now - e.last_used >= ttl_; });
  }

  void evict_lru_if_over_capacity() {
    while (entries_.size() > max_entries_) {
      auto victim = entries_.end();
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (!it->pinned && (victim == entries_.end() || it->last_used < victim->last_used))
          victim = it;
      }
      if (victim == entries_.end()) break;
      entries_.erase(victim);
    }
  }

  std::vector<CacheEntry> entries_;
  std::size_t max_entries_;
  Clock::duration ttl_;
  std::size_t min_cacheable_tokens_;
};

}  // namespace bench
