// promptcache: synchronized_prompt_cache_pool.hpp
// SPDX-License-Identifier: Apache-2.0
//
// PromptCachePool behind one mutex, for servers that call it from several threads. The lock
// covers only the pool's own bookkeeping: sizing an entry (the CacheBytes functor), building
// its snapshot, and destroying the LayerCaches of evicted entries happen outside it.
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
#endif
#if !defined(PROMPTCACHE_SYNCHRONIZED_PROMPT_CACHE_POOL_HPP) && \
    (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) >= 202002L
#define PROMPTCACHE_SYNCHRONIZED_PROMPT_CACHE_POOL_HPP

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "prompt_cache_pool.hpp"

namespace promptcache {

/// A thread-safe PromptCachePool: the same operations, each one atomic with respect to the
/// others. Hits are immutable snapshots, so a thread can use its hit while others insert.
/// CacheBytes is called without the lock and must be safe to call concurrently.
template <class LayerCache, std::integral Token = std::uint32_t,
          class Clock = std::chrono::steady_clock, class CacheBytes = unsized_caches>
class SynchronizedPromptCachePool {
 public:
  using pool_type = PromptCachePool<LayerCache, Token, Clock, CacheBytes>;  ///< Wrapped pool.
  using duration = typename pool_type::duration;                            ///< TTL duration.
  using namespace_id = typename pool_type::namespace_id;                    ///< Namespace key.
  using Options = typename pool_type::Options;                              ///< Pool options.
  using Entry = typename pool_type::Entry;                                  ///< Stored entry.
  using Hit = typename pool_type::Hit;                                      ///< Lookup result.
  using InsertResult = typename pool_type::InsertResult;                    ///< Insert outcome.
  using InsertOptions = typename pool_type::InsertOptions;                  ///< Per-insert options.

  /// Positional constructor: max entries, idle TTL, minimum tokens (see PromptCachePool).
  SynchronizedPromptCachePool(std::size_t max_entries, duration ttl,
                              std::size_t min_cacheable_tokens, Clock clock = Clock{})
      : pool_(max_entries, ttl, min_cacheable_tokens, std::move(clock)) {
    pool_.defer_release_ = true;
  }

  /// Pool with the given options (see PromptCachePool).
  explicit SynchronizedPromptCachePool(Options options, Clock clock = Clock{},
                                       CacheBytes cache_bytes = {})
      : pool_(options, std::move(clock), std::move(cache_bytes)) {
    pool_.defer_release_ = true;
  }

  /// 16 entries, 5 minute idle TTL, 8-token minimum (see PromptCachePool::with_defaults).
  static SynchronizedPromptCachePool with_defaults() {
    return SynchronizedPromptCachePool(Options{});
  }

  /// Not copyable or movable (it owns a mutex and a pool that cannot move).
  SynchronizedPromptCachePool(const SynchronizedPromptCachePool&) = delete;
  /// Not assignable (see the copy constructor).
  SynchronizedPromptCachePool& operator=(const SynchronizedPromptCachePool&) = delete;

  /// See PromptCachePool::find_longest_prefix. Locks once; evicted entries are released
  /// after unlocking.
  std::optional<Hit> find_longest_prefix(std::span<const Token> ids, namespace_id ns = 0) {
    Retired retired;
    std::lock_guard<std::mutex> lock(mutex_);
    auto hit = pool_.find_longest_prefix(ids, ns);
    retired.chain = pool_.take_retired();
    return hit;
  }

  /// See PromptCachePool::insert. Sizes the caches and builds the snapshot unlocked, then
  /// locks once to link it. Strong exception guarantee.
  InsertResult insert(std::vector<Token> ids, std::vector<LayerCache> caches,
                      const InsertOptions& options = {}) {
    const std::size_t bytes = pool_.entry_bytes(caches);
    auto slot = pool_type::make_record(std::move(ids), std::move(caches), options);
    Retired retired;
    std::lock_guard<std::mutex> lock(mutex_);
    const InsertResult r = pool_.insert_prepared(slot, bytes, options);
    retired.chain = pool_.take_retired();
    return r;
    // A rejected entry (`slot`) is released after the lock is (declared before it).
  }

  /// Positional insert (see PromptCachePool::insert_or_update).
  InsertResult insert_or_update(std::vector<Token> ids, std::vector<LayerCache> caches,
                                std::size_t fed_images, std::size_t fed_audios, bool pinned) {
    InsertOptions o;
    o.pinned = pinned;
    o.fed_images = fed_images;
    o.fed_audios = fed_audios;
    return insert(std::move(ids), std::move(caches), o);
  }

  /// See PromptCachePool::evict_expired.
  std::size_t evict_expired() {
    return locked([&] { return pool_.evict_expired(); });
  }
  /// See PromptCachePool::erase.
  bool erase(std::span<const Token> ids, namespace_id ns = 0) {
    return locked([&] { return pool_.erase(ids, ns); });
  }
  /// See PromptCachePool::erase_namespace.
  std::size_t erase_namespace(namespace_id ns) {
    return locked([&] { return pool_.erase_namespace(ns); });
  }
  /// See PromptCachePool::clear.
  void clear() {
    locked([&] {
      pool_.clear();
      return 0;
    });
  }
  /// See PromptCachePool::pin.
  bool pin(std::span<const Token> ids, namespace_id ns = 0) {
    return locked([&] { return pool_.pin(ids, ns); });
  }
  /// See PromptCachePool::unpin.
  bool unpin(std::span<const Token> ids, namespace_id ns = 0) {
    return locked([&] { return pool_.unpin(ids, ns); });
  }
  /// See PromptCachePool::is_pinned.
  [[nodiscard]] bool is_pinned(std::span<const Token> ids, namespace_id ns = 0) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pool_.is_pinned(ids, ns);
  }
  /// See PromptCachePool::find_exact.
  [[nodiscard]] std::shared_ptr<const Entry> find_exact(std::span<const Token> ids,
                                                        namespace_id ns = 0) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pool_.find_exact(ids, ns);
  }
  /// See PromptCachePool::size.
  [[nodiscard]] std::size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pool_.size();
  }
  /// See PromptCachePool::empty.
  [[nodiscard]] bool empty() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pool_.empty();
  }
  /// See PromptCachePool::bytes.
  [[nodiscard]] std::size_t bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pool_.bytes();
  }
  /// See PromptCachePool::stats (one consistent snapshot).
  [[nodiscard]] PoolStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pool_.stats();
  }
  /// See PromptCachePool::reset_stats.
  void reset_stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    pool_.reset_stats();
  }
  /// See PromptCachePool::entry_bytes (no lock: CacheBytes must be safe to call concurrently).
  [[nodiscard]] std::size_t entry_bytes(const std::vector<LayerCache>& caches) const {
    return pool_.entry_bytes(caches);
  }
  /// See PromptCachePool::memory_usage.
  [[nodiscard]] PoolMemory memory_usage() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pool_.memory_usage();
  }
  /// See PromptCachePool::check_invariants (runs under the lock).
  void check_invariants() const {
    std::lock_guard<std::mutex> lock(mutex_);
    pool_.check_invariants();
  }
  /// The options the pool was built with (immutable: no lock needed).
  [[nodiscard]] const Options& options() const noexcept { return pool_.options(); }

 private:
  // Records removed under the lock; freed (with the last references to their LayerCaches)
  // when this object dies, which the declaration order puts after the lock's release.
  struct Retired {
    typename pool_type::Slot* chain = nullptr;
    Retired() = default;
    Retired(const Retired&) = delete;
    Retired& operator=(const Retired&) = delete;
    ~Retired() { pool_type::free_retired(chain); }
  };

  template <class F>
  auto locked(F&& f) {
    Retired retired;
    std::lock_guard<std::mutex> lock(mutex_);
    auto r = f();
    retired.chain = pool_.take_retired();
    return r;
  }

  mutable std::mutex mutex_;
  pool_type pool_;
};

}  // namespace promptcache

#endif  // PROMPTCACHE_SYNCHRONIZED_PROMPT_CACHE_POOL_HPP
