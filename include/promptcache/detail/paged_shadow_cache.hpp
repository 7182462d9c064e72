// promptcache: detail/paged_shadow_cache.hpp
// SPDX-License-Identifier: Apache-2.0
//
// A miniature cache of eviction::Adaptive: page fingerprints in two recency
// lists (used once, used again), evicted by one of the policy's rules. The
// policy feeds it a hash-sampled subset of the pages it sees, with a capacity
// scaled by the same rate, and counts its hits, so that it can compare what
// each rule would serve on the traffic it actually gets (miniature simulation,
// as in Waldspurger et al., "Cache Modeling and Optimization using Miniature
// Simulations", USENIX ATC'17).
//
// Storage is fixed at construction (one slot per entry, plus an open-addressing
// index of at least twice as many cells), so an access never allocates and
// never throws: it runs inside the cache's match and insert paths.
//
// Order within a list: the pages one operation touches arrive root first; a
// prefix cache evicts the deepest of them first, so a page touched at the same
// tick as the previous one goes right behind it (towards the evicted end), and
// a page touched at a later tick goes to the front. A match thus leaves its
// path in the order the cache would evict it.
#pragma once

#ifndef PROMPTCACHE_DETAIL_PAGED_SHADOW_CACHE_HPP
#define PROMPTCACHE_DETAIL_PAGED_SHADOW_CACHE_HPP

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <utility>

namespace promptcache::detail {

class PagedShadowCache {
 public:
  // Which list the shadow evicts from.
  enum class Rule : std::uint8_t {
    lru,        // one recency order over both lists (list 0 only)
    arc,        // list 0 while it holds more than the target, else list 1
    used_once,  // list 0 whenever it has entries
  };
  static constexpr std::uint32_t none = std::numeric_limits<std::uint32_t>::max();

  PagedShadowCache() = default;
  // Room for `capacity` entries (0: none; every access then misses). Throws
  // std::bad_alloc, std::length_error beyond 2^30 entries.
  PagedShadowCache(std::size_t capacity, Rule rule) : rule_(rule) {
    if (capacity == 0) return;
    if (capacity > (std::size_t{1} << 30))
      throw std::length_error("PagedShadowCache: more than 2^30 entries");
    std::size_t cells = 1;
    while (cells < 2 * capacity)
      cells *= 2;
    cap_ = capacity;
    mask_ = cells - 1;
    fp_ = std::make_unique<std::uint64_t[]>(cap_);
    prev_ = std::make_unique<std::uint32_t[]>(cap_);
    next_ = std::make_unique<std::uint32_t[]>(cap_);
    list_ = std::make_unique<std::uint8_t[]>(cap_);
    index_ = std::make_unique<std::uint32_t[]>(cells);
    for (std::size_t i = 0; i < cells; ++i)
      index_[i] = none;
  }
  // A moved-from shadow is empty (no capacity).
  PagedShadowCache(PagedShadowCache&& o) noexcept { swap(o); }
  PagedShadowCache& operator=(PagedShadowCache&& o) noexcept {
    PagedShadowCache t(std::move(o));
    swap(t);
    return *this;
  }
  PagedShadowCache(const PagedShadowCache&) = delete;
  PagedShadowCache& operator=(const PagedShadowCache&) = delete;
  ~PagedShadowCache() = default;

  void swap(PagedShadowCache& o) noexcept {
    std::swap(rule_, o.rule_);
    std::swap(cap_, o.cap_);
    std::swap(mask_, o.mask_);
    std::swap(used_, o.used_);
    for (std::size_t l = 0; l < 2; ++l) {
      std::swap(head_[l], o.head_[l]);
      std::swap(tail_[l], o.tail_[l]);
      std::swap(size_[l], o.size_[l]);
      std::swap(cursor_[l], o.cursor_[l]);
      std::swap(cursor_tick_[l], o.cursor_tick_[l]);
    }
    fp_.swap(o.fp_);
    prev_.swap(o.prev_);
    next_.swap(o.next_);
    list_.swap(o.list_);
    index_.swap(o.index_);
  }

  [[nodiscard]] std::size_t capacity() const noexcept { return cap_; }
  [[nodiscard]] std::size_t size(std::size_t list) const noexcept { return size_[list & 1]; }

  // Touches the page `fp` at `tick`, filed under `list` (0: used once, 1: used
  // again; Rule::lru keeps one list); a page not held is stored, evicting by
  // the rule (`target`: list 0's target size for Rule::arc) when full. Returns
  // whether the page was held. O(1) expected.
  bool access(std::uint64_t fp, std::size_t list, std::uint64_t tick, double target) noexcept {
    if (cap_ == 0) return false;
    const std::size_t cell = find(fp);
    const std::size_t l = rule_ == Rule::lru ? 0 : (list & 1);
    std::uint32_t e = none;
    if (cell != none) {
      e = index_[cell];
      unlink(e);
    } else {
      if (used_ == cap_) evict(target);
      e = static_cast<std::uint32_t>(used_++);
      fp_[e] = fp;
      std::size_t c = static_cast<std::size_t>(fp) & mask_;
      while (index_[c] != none)
        c = (c + 1) & mask_;
      index_[c] = e;
    }
    link(e, l, tick);
    return cell != none;
  }

 private:
  [[nodiscard]] std::size_t find(std::uint64_t fp) const noexcept {
    for (std::size_t c = static_cast<std::size_t>(fp) & mask_; index_[c] != none;
         c = (c + 1) & mask_)
      if (fp_[index_[c]] == fp) return c;
    return none;
  }

  void evict(double target) noexcept {
    std::size_t l = 0;
    if (rule_ == Rule::used_once)
      l = size_[0] > 0 ? 0 : 1;
    else if (rule_ == Rule::arc)
      l = size_[0] > 0 && (static_cast<double>(size_[0]) > target || size_[1] == 0) ? 0 : 1;
    const std::uint32_t e = tail_[l];
    unlink(e);
    erase_cell(find(fp_[e]));
    // Keep slots dense: the last slot moves into the freed one.
    const auto last = static_cast<std::uint32_t>(--used_);
    if (e != last) {
      const std::size_t c = find(fp_[last]);
      const std::size_t ll = list_[last];
      const std::uint32_t p = prev_[last], n = next_[last];
      fp_[e] = fp_[last];
      list_[e] = list_[last];
      prev_[e] = p;
      next_[e] = n;
      if (p != none)
        next_[p] = e;
      else
        head_[ll] = e;
      if (n != none)
        prev_[n] = e;
      else
        tail_[ll] = e;
      if (cursor_[ll] == last) cursor_[ll] = e;
      index_[c] = e;
    }
  }

  void unlink(std::uint32_t e) noexcept {
    const std::size_t l = list_[e];
    const std::uint32_t p = prev_[e], n = next_[e];
    if (p != none)
      next_[p] = n;
    else
      head_[l] = n;
    if (n != none)
      prev_[n] = p;
    else
      tail_[l] = p;
    if (cursor_[l] == e) cursor_[l] = none;
    --size_[l];
  }

  void link(std::uint32_t e, std::size_t l, std::uint64_t tick) noexcept {
    list_[e] = static_cast<std::uint8_t>(l);
    const std::uint32_t c = cursor_[l];
    if (c != none && cursor_tick_[l] == tick) {
      // Behind the page touched before it at this tick.
      const std::uint32_t n = next_[c];
      prev_[e] = c;
      next_[e] = n;
      next_[c] = e;
      if (n != none)
        prev_[n] = e;
      else
        tail_[l] = e;
    } else {
      prev_[e] = none;
      next_[e] = head_[l];
      if (head_[l] != none)
        prev_[head_[l]] = e;
      else
        tail_[l] = e;
      head_[l] = e;
    }
    cursor_[l] = e;
    cursor_tick_[l] = tick;
    ++size_[l];
  }

  // Backward-shift deletion (as in the ghost history's index).
  void erase_cell(std::size_t hole) noexcept {
    std::size_t c = hole;
    for (;;) {
      c = (c + 1) & mask_;
      if (index_[c] == none) break;
      const std::size_t home = static_cast<std::size_t>(fp_[index_[c]]) & mask_;
      const bool stays = hole <= c ? (hole < home && home <= c) : (hole < home || home <= c);
      if (!stays) {
        index_[hole] = index_[c];
        hole = c;
      }
    }
    index_[hole] = none;
  }

  Rule rule_ = Rule::lru;
  std::size_t cap_ = 0;
  std::size_t mask_ = 0;
  std::size_t used_ = 0;
  std::uint32_t head_[2] = {none, none};
  std::uint32_t tail_[2] = {none, none};
  std::size_t size_[2] = {0, 0};
  std::uint32_t cursor_[2] = {none, none};
  std::uint64_t cursor_tick_[2] = {0, 0};
  std::unique_ptr<std::uint64_t[]> fp_;
  std::unique_ptr<std::uint32_t[]> prev_;
  std::unique_ptr<std::uint32_t[]> next_;
  std::unique_ptr<std::uint8_t[]> list_;
  std::unique_ptr<std::uint32_t[]> index_;
};

}  // namespace promptcache::detail

#endif  // PROMPTCACHE_DETAIL_PAGED_SHADOW_CACHE_HPP
