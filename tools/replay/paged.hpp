// The paged prefix cache in the replay: a single-engine runner for the sweep
// and a worker cache for the cluster, for any of its eviction policies.
//
// The engine around the cache is modelled minimally: a pool of
// capacity / page_size page ids; a request matches its tokens, locks the match,
// asks the cache to evict what the new pages need when the free pool is short,
// stores its whole pages (the final partial page is never stored, as the
// cache's contract says) and keeps its lock while it runs.
#pragma once

#include "cluster.hpp"
#include "trace.hpp"

#include <promptcache/kv_index.hpp>
#include <promptcache/paged_eviction_policy.hpp>
#include <promptcache/paged_prefix_cache.hpp>

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace promptcache::replay {

/// The largest page pool: page ids are std::uint32_t, so a larger pool would
/// give two pages one id.
inline constexpr std::size_t max_pages = std::size_t{1} << 32;

/// A paged prefix cache with the engine's page pool around it.
template <PagedEvictionPolicy Policy>
class PagedEngine {
 public:
  using Cache = PagedPrefixCache<std::uint32_t, Policy>;

  /// `capacity_pages` pages of `page_size` tokens; events go to `sink` when
  /// given. Throws std::invalid_argument when capacity_pages > max_pages.
  PagedEngine(std::size_t page_size, std::size_t capacity_pages, Policy policy = {},
              typename Cache::event_sink sink = {})
      : cache_(page_size, std::move(policy), std::move(sink)), free_(checked(capacity_pages)) {
    std::iota(free_.begin(), free_.end(), 0U);
  }

  /// Serves a request: matches, stores its whole pages (as many as the pool
  /// allows after evicting) and returns (matched tokens, handle locking the
  /// stored prefix). The caller unlocks the handle when the request ends.
  std::pair<std::size_t, PagedPrefixHandle> serve(std::span<const std::uint32_t> tokens) {
    const std::size_t ps = cache_.page_size();
    const auto m = cache_.match(tokens, 0, pages_);
    (void)cache_.lock(m.handle);
    const std::size_t have = m.matched / ps;
    const std::size_t want = tokens.size() / ps;
    const std::size_t need = want - have;
    if (free_.size() < need)
      cache_.evict(need - free_.size(), [this](std::uint32_t p) noexcept { free_.push_back(p); });
    const std::size_t add = std::min(need, free_.size());
    for (std::size_t i = 0; i < add; ++i) {
      pages_.push_back(free_.back());
      free_.pop_back();
    }
    PagedPrefixHandle h = m.handle;
    if (add > 0) {
      const auto r = cache_.insert(tokens.first((have + add) * ps), pages_);
      h = r.handle;
      (void)cache_.lock(h);
      (void)cache_.unlock(m.handle);
    }
    return {m.matched, h};
  }
  /// Releases a request's lock.
  void release(const PagedPrefixHandle& h) { (void)cache_.unlock(h); }
  /// The cache.
  [[nodiscard]] const Cache& cache() const { return cache_; }

 private:
  static std::size_t checked(std::size_t pages) {
    if (pages > max_pages)
      throw std::invalid_argument("a page pool of " + std::to_string(pages) + " pages: at most " +
                                  std::to_string(max_pages) + " pages have distinct 32-bit ids");
    return pages;
  }

  Cache cache_;
  std::vector<std::uint32_t> free_;
  std::vector<std::uint32_t> pages_;
};

/// Replays `t` through a paged prefix cache of `capacity_tokens` (whole pages
/// of the trace's block size) under `policy`; each request is unlocked before
/// the next one arrives (one request at a time).
template <PagedEvictionPolicy Policy>
[[nodiscard]] CacheRun run_paged(const Trace& t, std::size_t capacity_tokens, Policy policy = {}) {
  CacheRun run;
  PagedEngine<Policy> engine(t.block_size, capacity_tokens / t.block_size, std::move(policy));
  std::vector<std::uint32_t> tokens;
  for (const Request& r : t.requests) {
    ++run.requests;
    run.prompt_tokens += r.input_length;
    tokens.clear();
    expand_tokens(r, t.block_size, tokens);
    const auto [hit, handle] = engine.serve(tokens);
    run.hit_tokens += hit;
    engine.release(handle);
  }
  return run;
}

/// A cluster worker whose cache is a PagedPrefixCache publishing KV events.
template <PagedEvictionPolicy Policy>
class PagedWorkerCache {
 public:
  /// A worker of `capacity_pages` pages of the trace's block size.
  PagedWorkerCache(const Trace& t, std::size_t capacity_pages, Policy policy = {})
      : engine_(t.block_size, capacity_pages, std::move(policy),
                [this](const KvEvent& e) { out_->push_back(e); }) {}
  PagedWorkerCache(const PagedWorkerCache&) = delete;
  PagedWorkerCache& operator=(const PagedWorkerCache&) = delete;

  /// Serves the request (see PagedEngine::serve), appending the cache's KV
  /// events to `events`; returns the prompt tokens served from cache.
  std::size_t admit(const WorkerRequest& q, const TraceHashes& /*h*/,
                    std::vector<KvEvent>& events) {
    out_ = &events;
    const auto [hit, handle] = engine_.serve(q.tokens);
    out_ = &scratch_;
    held_.emplace(q.index, handle);
    return hit;
  }
  /// Unlocks request `index`.
  void release(std::size_t index) {
    const auto it = held_.find(index);
    if (it == held_.end()) return;
    engine_.release(it->second);
    held_.erase(it);
  }
  /// Pages cached now.
  [[nodiscard]] std::size_t cached_blocks() const { return engine_.cache().cached_pages(); }

 private:
  std::vector<KvEvent> scratch_;
  std::vector<KvEvent>* out_ = &scratch_;
  PagedEngine<Policy> engine_;
  std::unordered_map<std::size_t, PagedPrefixHandle> held_;
};

/// Calls `f(name, make)` for each eviction policy of the paged prefix cache,
/// where make(capacity_pages) builds the policy for a cache of that many pages
/// (only the adaptive policy uses it: its target and ghost history scale with it).
template <class F>
void for_each_paged_policy(F&& f) {
  f("lru", [](std::size_t) { return eviction::Lru{}; });
  f("lfu", [](std::size_t) { return eviction::Lfu{}; });
  f("fifo", [](std::size_t) { return eviction::Fifo{}; });
  f("priority", [](std::size_t) { return eviction::Priority{}; });
  f("slru", [](std::size_t) { return eviction::Slru{}; });
  f("mru", [](std::size_t) { return eviction::Mru{}; });
  f("filo", [](std::size_t) { return eviction::Filo{}; });
  f("adaptive", [](std::size_t pages) { return eviction::Adaptive(pages); });
}

/// Names accepted by --worker-cache: "paged:<policy>" or "block:lru".
[[nodiscard]] inline std::vector<std::string> worker_cache_names() {
  std::vector<std::string> names;
  for_each_paged_policy(
      [&](const char* name, auto) { names.push_back(std::string("paged:") + name); });
  names.push_back("block:lru");
  return names;
}

}  // namespace promptcache::replay
