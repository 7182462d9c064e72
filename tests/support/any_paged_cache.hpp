// A PagedPrefixCache of any eviction policy behind a virtual interface, for the
// randomized checks that run every policy against the model (the differential
// test, the fuzz harness): their steps then compile once, not once per policy,
// which made up most of their build time. CacheOf<Policy> forwards each call to
// the cache's member of the same name, with the same arguments.
#pragma once

#include <promptcache/paged_prefix_cache.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "paged_model.hpp"

namespace paged_model {

class AnyPagedCache {
 public:
  using Sink = std::function<void(const promptcache::KvEvent&)>;
  using Handle = promptcache::PagedPrefixHandle;
  /// What a match returned (pages: only from the overload returning them).
  struct Match {
    std::size_t matched = 0;
    std::vector<PageId> pages;
    Handle handle;
  };
  /// What insert returned.
  struct Insert {
    std::size_t cached_pages = 0;
    std::size_t inserted_pages = 0;
    std::vector<PageId> duplicates;
    Handle handle;
  };
  /// The adaptive policy's state.
  struct Adaptive {
    double target = 0;
    std::size_t ghosts_once = 0;
    std::size_t ghosts_reused = 0;
  };
  /// What a move away and back left: the invariants and emptiness of each side.
  struct Moves {
    bool moved_to_valid = false;    ///< the cache moved into: invariants hold
    bool moved_from_valid = false;  ///< this cache, moved from: invariants hold
    bool moved_from_empty = false;  ///< ... and it holds no page and no namespace
    bool back_from_valid = false;   ///< the other cache, moved back from: invariants hold
    bool back_from_empty = false;   ///< ... no page, and this cache's page size
  };

  AnyPagedCache() = default;
  AnyPagedCache(const AnyPagedCache&) = delete;
  AnyPagedCache& operator=(const AnyPagedCache&) = delete;
  virtual ~AnyPagedCache() = default;

  virtual Match match(const Tokens& t, std::uint64_t ns) = 0;
  virtual Match match(const Tokens& t, std::uint64_t ns, std::vector<PageId>& pages) = 0;
  virtual Match match(const Tokens& t, std::uint64_t ns, std::span<PageId> out) = 0;
  virtual std::size_t peek(const Tokens& t, std::uint64_t ns) const = 0;
  virtual Insert insert(const Tokens& t, const std::vector<PageId>& ids, std::uint64_t ns,
                        std::int64_t priority = 0) = 0;
  virtual bool lock(const Handle& h) = 0;
  virtual bool unlock(const Handle& h) = 0;
  virtual bool valid(const Handle& h) const = 0;
  virtual std::size_t lock_count(const Handle& h) const = 0;
  virtual std::size_t evict(std::size_t n, std::vector<PageId>& got) = 0;
  virtual std::size_t evict(std::size_t n) = 0;
  virtual bool erase_namespace(std::uint64_t ns, std::multiset<PageId>& got) = 0;
  virtual bool erase_namespace(std::uint64_t ns) = 0;
  virtual bool clear(std::multiset<PageId>& got) = 0;
  virtual bool clear() = 0;
  virtual void configure_namespace(std::uint64_t ns, std::string_view lora,
                                   std::string_view salt = {}) = 0;
  virtual std::uint64_t namespace_seed(std::uint64_t ns) const = 0;
  virtual std::size_t namespace_count() const = 0;
  /// Move-constructs a cache from this one and move-assigns it back.
  virtual Moves move_round_trip() = 0;
  /// Move-assigns this cache over a new one (a default policy) holding `doc` under fresh
  /// ids, which it drops, and back; whether that cache's invariants held. False where
  /// the policy has no default.
  virtual bool move_over(const Tokens& doc, PageId& next_id) = 0;
  virtual std::size_t page_size() const = 0;
  virtual std::size_t cached_pages() const = 0;
  virtual std::size_t locked_pages() const = 0;
  virtual std::size_t evictable_pages() const = 0;
  virtual std::size_t node_count() const = 0;
  virtual bool check_invariants() const = 0;
  virtual promptcache::PagedCacheMemory memory() const = 0;
  virtual const promptcache::PagedCacheStats& stats() const = 0;
  virtual bool publishes_events() const = 0;
  virtual std::uint64_t next_event_id() const = 0;
  virtual std::vector<std::uint64_t> block_hashes() const = 0;
  /// The adaptive policy's state; nullopt under the other policies.
  virtual std::optional<Adaptive> adaptive() const = 0;
};

template <class Policy>
class CacheOf final : public AnyPagedCache {
 public:
  using Cache = promptcache::PagedPrefixCache<PageId, Policy>;

  CacheOf(std::size_t page_size, Policy policy, Sink sink)
      : cache_(page_size, std::move(policy), std::move(sink)) {}

  Match match(const Tokens& t, std::uint64_t ns) override {
    auto r = cache_.match(t, ns);
    return {r.matched, std::move(r.pages), r.handle};
  }
  Match match(const Tokens& t, std::uint64_t ns, std::vector<PageId>& pages) override {
    const auto e = cache_.match(t, ns, pages);
    return {e.matched, {}, e.handle};
  }
  Match match(const Tokens& t, std::uint64_t ns, std::span<PageId> out) override {
    const auto e = cache_.match(t, ns, out);
    return {e.matched, {}, e.handle};
  }
  std::size_t peek(const Tokens& t, std::uint64_t ns) const override { return cache_.peek(t, ns); }
  Insert insert(const Tokens& t, const std::vector<PageId>& ids, std::uint64_t ns,
                std::int64_t priority) override {
    auto r = cache_.insert(t, ids, ns, priority);
    return {r.cached_pages, r.inserted_pages, std::move(r.duplicates), r.handle};
  }
  bool lock(const Handle& h) override { return cache_.lock(h); }
  bool unlock(const Handle& h) override { return cache_.unlock(h); }
  bool valid(const Handle& h) const override { return cache_.valid(h); }
  std::size_t lock_count(const Handle& h) const override { return cache_.lock_count(h); }
  std::size_t evict(std::size_t n, std::vector<PageId>& got) override {
    return cache_.evict(n, [&](PageId p) { got.push_back(p); });
  }
  std::size_t evict(std::size_t n) override { return cache_.evict(n); }
  bool erase_namespace(std::uint64_t ns, std::multiset<PageId>& got) override {
    return cache_.erase_namespace(ns, [&](PageId p) { got.insert(p); });
  }
  bool erase_namespace(std::uint64_t ns) override { return cache_.erase_namespace(ns); }
  bool clear(std::multiset<PageId>& got) override {
    return cache_.clear([&](PageId p) { got.insert(p); });
  }
  bool clear() override { return cache_.clear(); }
  void configure_namespace(std::uint64_t ns, std::string_view lora,
                           std::string_view salt) override {
    cache_.configure_namespace(ns, lora, salt);
  }
  std::uint64_t namespace_seed(std::uint64_t ns) const override {
    return cache_.namespace_seed(ns);
  }
  std::size_t namespace_count() const override { return cache_.namespace_count(); }
  Moves move_round_trip() override {
    Moves m;
    Cache tmp(std::move(cache_));
    m.moved_to_valid = tmp.check_invariants();
    m.moved_from_valid = cache_.check_invariants();  // NOLINT(bugprone-use-after-move)
    m.moved_from_empty = cache_.cached_pages() == 0 && cache_.namespace_count() == 0;
    cache_ = std::move(tmp);
    m.back_from_valid = tmp.check_invariants();  // NOLINT(bugprone-use-after-move)
    m.back_from_empty = tmp.cached_pages() == 0 && tmp.page_size() == cache_.page_size();
    return m;
  }
  bool move_over(const Tokens& doc, PageId& next_id) override {
    if constexpr (std::is_default_constructible_v<Policy>) {
      Cache other(cache_.page_size());
      std::vector<PageId> ids(doc.size() / cache_.page_size());
      for (PageId& id : ids)
        id = next_id++;
      other.insert(doc, ids, 0, 0);
      other = std::move(cache_);
      const bool ok = other.check_invariants();
      cache_ = std::move(other);
      return ok;
    } else {
      (void)doc;
      (void)next_id;
      return false;
    }
  }
  std::size_t page_size() const override { return cache_.page_size(); }
  std::size_t cached_pages() const override { return cache_.cached_pages(); }
  std::size_t locked_pages() const override { return cache_.locked_pages(); }
  std::size_t evictable_pages() const override { return cache_.evictable_pages(); }
  std::size_t node_count() const override { return cache_.node_count(); }
  bool check_invariants() const override { return cache_.check_invariants(); }
  promptcache::PagedCacheMemory memory() const override { return cache_.memory(); }
  const promptcache::PagedCacheStats& stats() const override { return cache_.stats(); }
  bool publishes_events() const override { return cache_.publishes_events(); }
  std::uint64_t next_event_id() const override { return cache_.next_event_id(); }
  std::vector<std::uint64_t> block_hashes() const override { return cache_.block_hashes(); }
  std::optional<Adaptive> adaptive() const override {
    if constexpr (std::is_same_v<Policy, promptcache::eviction::Adaptive>)
      return Adaptive{cache_.policy().target(), cache_.policy().ghosts_once(),
                      cache_.policy().ghosts_reused()};
    else
      return std::nullopt;
  }

 private:
  Cache cache_;
};

}  // namespace paged_model
