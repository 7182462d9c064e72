// promptcache: detail/paged_ghost_history.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The ghost history of eviction::Adaptive: fingerprints of up to G evicted
// pages, the most recently evicted ones, each tagged with the list its page was
// evicted from (used once, or used again), so that a page stored again can be
// recognized as one the cache let go too early.
//
// Storage is fixed at construction (2G slots in a ring, in eviction order, plus
// an open-addressing index of at least 2G cells), so recording and looking up
// never allocate and never throw: they run inside the cache's eviction and
// insert paths, where a policy hook must not fail. A ghost is never refreshed
// (ARC only adds a ghost when its page is evicted and drops it when the page
// comes back), so eviction order is also ARC's LRU order of the ghost lists:
// recording a ghost beyond G forgets the oldest one. A ghost that comes back
// leaves a hole in the ring; when holes fill the ring (more than G ghosts came
// back among the last 2G evictions) the oldest slot is reused even if its ghost
// is live, so the history then holds fewer than G ghosts.
#pragma once

#ifndef PROMPTCACHE_DETAIL_PAGED_GHOST_HISTORY_HPP
#define PROMPTCACHE_DETAIL_PAGED_GHOST_HISTORY_HPP

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <utility>

namespace promptcache::detail {

// Fingerprint of one page for the ghost history: its namespace, its position on
// the path and up to 16 of its tokens, evenly spaced (first and last included),
// so that it costs O(1) per page whatever the page size. Two pages that differ
// only between the sampled tokens share a fingerprint; the history then mistakes
// one for the other, which costs one misdirected adaptation step, never a wrong
// hit.
template <class Token>
[[nodiscard]] inline std::uint64_t ghost_fingerprint(std::uint64_t ns, std::size_t depth_pages,
                                                     std::span<const Token> page) noexcept {
  auto mix = [](std::uint64_t h, std::uint64_t v) noexcept {
    // splitmix64's finalizer over the running state: every input bit reaches every output bit.
    std::uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  std::uint64_t h = mix(mix(0x5ca1ab1eULL, ns), static_cast<std::uint64_t>(depth_pages));
  const std::size_t n = page.size();
  constexpr std::size_t samples = 16;
  if (n <= samples) {
    for (const Token& t : page)
      h = mix(h, static_cast<std::uint64_t>(t));
  } else {
    for (std::size_t j = 0; j < samples; ++j)
      h = mix(h, static_cast<std::uint64_t>(page[j * (n - 1) / (samples - 1)]));
  }
  return h;
}

// Fixed-capacity ghost lists B1 (tag 1) and B2 (tag 2) over page fingerprints.
class PagedGhostHistory {
 public:
  static constexpr std::uint32_t empty = std::numeric_limits<std::uint32_t>::max();

  PagedGhostHistory() = default;
  // Room for `capacity` ghosts (0: no history). Throws std::bad_alloc,
  // std::length_error beyond 2^30 ghosts.
  explicit PagedGhostHistory(std::size_t capacity) {
    if (capacity == 0) return;
    if (capacity > (std::size_t{1} << 30))
      throw std::length_error("PagedGhostHistory: more than 2^30 ghosts");
    std::size_t cells = 1;
    while (cells < 2 * capacity)
      cells *= 2;
    cap_ = capacity;
    slots_ = 2 * capacity;
    mask_ = cells - 1;
    fp_ = std::make_unique<std::uint64_t[]>(slots_);
    tag_ = std::make_unique<std::uint8_t[]>(slots_);  // zero: free slot or hole
    index_ = std::make_unique<std::uint32_t[]>(cells);
    for (std::size_t i = 0; i < cells; ++i)
      index_[i] = empty;
  }
  // A moved-from history is empty (no capacity), not half of one.
  PagedGhostHistory(PagedGhostHistory&& o) noexcept { swap(o); }
  PagedGhostHistory& operator=(PagedGhostHistory&& o) noexcept {
    PagedGhostHistory t(std::move(o));
    swap(t);
    return *this;
  }
  PagedGhostHistory(const PagedGhostHistory&) = delete;
  PagedGhostHistory& operator=(const PagedGhostHistory&) = delete;
  ~PagedGhostHistory() = default;

  void swap(PagedGhostHistory& o) noexcept {
    std::swap(cap_, o.cap_);
    std::swap(slots_, o.slots_);
    std::swap(tail_, o.tail_);
    std::swap(used_, o.used_);
    std::swap(mask_, o.mask_);
    std::swap(head_, o.head_);
    std::swap(count_, o.count_);
    fp_.swap(o.fp_);
    tag_.swap(o.tag_);
    index_.swap(o.index_);
  }

  // Ghosts remembered at most.
  [[nodiscard]] std::size_t capacity() const noexcept { return cap_; }
  // Ghosts on list 1 (B1) or 2 (B2): tags whose low two bits are that list.
  [[nodiscard]] std::size_t size(std::uint8_t list) const noexcept { return count_[list & 3]; }

  // Records an evicted page under `tag` (low two bits: the list, 1 or 2; the
  // other bits are the caller's and come back from take()), forgetting the oldest ghost
  // when G are held; an older ghost with the same fingerprint is dropped.
  // O(1) amortized (each slot is dropped once per write).
  void push(std::uint64_t fp, std::uint8_t tag) noexcept {
    if (cap_ == 0) return;
    (void)take(fp);
    while (count_[1] + count_[2] >= cap_ || used_ == slots_) {
      if (tag_[tail_] != 0) {
        erase_cell(find(fp_[tail_]));
        --count_[tag_[tail_] & 3];
        tag_[tail_] = 0;
      }
      tail_ = tail_ + 1 == slots_ ? 0 : tail_ + 1;
      --used_;
    }
    fp_[head_] = fp;
    tag_[head_] = tag;
    ++count_[tag & 3];
    std::size_t c = static_cast<std::size_t>(fp) & mask_;
    while (index_[c] != empty)
      c = (c + 1) & mask_;
    index_[c] = static_cast<std::uint32_t>(head_);
    head_ = head_ + 1 == slots_ ? 0 : head_ + 1;
    ++used_;
  }

  // Forgets the ghost with fingerprint `fp` and returns its tag (0: none). O(1) expected.
  std::uint8_t take(std::uint64_t fp) noexcept {
    std::size_t age = 0;
    return take(fp, age);
  }
  // As take(fp); `age` is set to the pages recorded after this ghost (0: the
  // latest one), left as is when there is no such ghost. O(1) expected.
  std::uint8_t take(std::uint64_t fp, std::size_t& age) noexcept {
    if (cap_ == 0) return 0;
    const std::size_t cell = find(fp);
    if (cell == npos) return 0;
    const std::uint32_t slot = index_[cell];
    const std::uint8_t tag = tag_[slot];
    tag_[slot] = 0;
    --count_[tag & 3];
    erase_cell(cell);
    // Every push takes the next ring slot, so the ring distance counts pushes.
    age = (head_ + slots_ - 1 - slot) % slots_;
    return tag;
  }

 private:
  static constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();

  [[nodiscard]] std::size_t find(std::uint64_t fp) const noexcept {
    for (std::size_t c = static_cast<std::size_t>(fp) & mask_; index_[c] != empty;
         c = (c + 1) & mask_)
      if (fp_[index_[c]] == fp && tag_[index_[c]] != 0) return c;
    return npos;
  }

  // Backward-shift deletion: linear probing without tombstones, so lookups
  // stay short however many ghosts came and went.
  void erase_cell(std::size_t hole) noexcept {
    std::size_t c = hole;
    for (;;) {
      c = (c + 1) & mask_;
      if (index_[c] == empty) break;
      const std::size_t home = static_cast<std::size_t>(fp_[index_[c]]) & mask_;
      // Move the entry into the hole unless its home lies cyclically in (hole, c].
      const bool stays = hole <= c ? (hole < home && home <= c) : (hole < home || home <= c);
      if (!stays) {
        index_[hole] = index_[c];
        hole = c;
      }
    }
    index_[hole] = empty;
  }

  std::size_t cap_ = 0;    // live ghosts at most (G)
  std::size_t slots_ = 0;  // ring slots (2G)
  std::size_t mask_ = 0;
  std::size_t head_ = 0;  // next ring slot to write
  std::size_t tail_ = 0;  // oldest ring slot in use (a ghost or a hole)
  std::size_t used_ = 0;  // ring slots from tail_ to head_
  std::size_t count_[4] = {0, 0, 0, 0};
  std::unique_ptr<std::uint64_t[]> fp_;
  std::unique_ptr<std::uint8_t[]> tag_;
  std::unique_ptr<std::uint32_t[]> index_;
};

}  // namespace promptcache::detail

#endif  // PROMPTCACHE_DETAIL_PAGED_GHOST_HISTORY_HPP
