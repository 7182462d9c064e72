// promptcache: detail/kv_publisher_state.hpp
// SPDX-License-Identifier: Apache-2.0
//
// What a KV event publisher remembers between steps: the last encoded batches
// (a replay buffer of bounded length, oldest dropped first) and, for state
// dumps, the blocks the engine holds as of the last published batch, each with
// its parent and tokens. The mirror is fed the published events themselves, so
// a dump is exactly the view a router that applied every batch up to that seq
// holds, whatever the engine did since (its next step's events are not in it).
#pragma once
#ifndef PROMPTCACHE_DETAIL_KV_PUBLISHER_STATE_HPP
#define PROMPTCACHE_DETAIL_KV_PUBLISHER_STATE_HPP

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "promptcache/detail/kv_publisher_encoder.hpp"

namespace promptcache::detail {

// The last `capacity` encoded batches, by seq (consecutive, oldest first).
class KvPubRing {
 public:
  struct Entry {
    std::uint64_t seq = 0;
    std::vector<char> bytes;
  };

  explicit KvPubRing(std::size_t capacity) noexcept : capacity_(capacity) {}

  // Keeps `bytes` as `seq`, dropping the oldest entry when full (nothing is
  // kept with capacity 0). Strong guarantee: the copy and the append come
  // before the drop, which cannot throw.
  void push(std::uint64_t seq, const std::vector<char>& bytes) {
    if (capacity_ == 0) return;
    entries_.push_back(Entry{seq, bytes});
    if (entries_.size() > capacity_) entries_.pop_front();
  }

  // f(seq, bytes) for every entry with seq >= start, oldest first.
  template <class F>
  void for_each_from(std::uint64_t start, F&& f) const {
    for (const Entry& e : entries_)
      if (e.seq >= start) f(e.seq, e.bytes);
  }

  std::size_t size() const noexcept { return entries_.size(); }
  std::size_t capacity() const noexcept { return capacity_; }
  void clear() noexcept { entries_.clear(); }

 private:
  std::size_t capacity_;
  std::deque<Entry> entries_;
};

// The blocks a stream of published events leaves the engine holding.
class KvPubMirror {
 public:
  // Applies one published event. Basic guarantee: std::bad_alloc may leave a
  // stored chain partly applied (the publisher then drops the whole mirror).
  void apply(const KvPubEvent& e) {
    switch (e.kind) {
      case KvPubEvent::Kind::stored: {
        const std::size_t bs = e.block_size;
        std::optional<std::uint64_t> parent = e.parent;
        for (std::size_t i = 0; i < e.hashes.size(); ++i) {
          const auto first = e.tokens.begin() + static_cast<std::ptrdiff_t>(i * bs);
          Block b{parent, e.ns,
                  std::vector<std::uint32_t>(first, first + static_cast<std::ptrdiff_t>(bs))};
          blocks_.insert_or_assign(e.hashes[i], std::move(b));
          parent = e.hashes[i];
        }
        return;
      }
      case KvPubEvent::Kind::removed:
        for (const std::uint64_t h : e.hashes)
          blocks_.erase(h);
        return;
      case KvPubEvent::Kind::cleared:
        blocks_.clear();
        return;
    }
  }

  std::size_t size() const noexcept { return blocks_.size(); }
  void clear() noexcept { blocks_.clear(); }

  // The held blocks as stored events, parents before children: one event per
  // chain (a path that follows first children), cut after `max_blocks` blocks
  // and where the namespace or block size changes. A block whose parent is not
  // held starts a chain under that parent's name (the router keeps it as its
  // rules for unknown parents say). Deterministic: roots and children in hash
  // order. O(blocks log blocks).
  template <class Emit>
  void dump(std::size_t max_blocks, Emit&& emit) const {
    max_blocks = std::max<std::size_t>(max_blocks, 1);
    std::unordered_map<std::uint64_t, std::vector<std::uint64_t>> kids;
    std::vector<std::uint64_t> starts;
    for (const auto& [h, b] : blocks_) {
      if (b.parent && blocks_.count(*b.parent) != 0)
        kids[*b.parent].push_back(h);
      else
        starts.push_back(h);
    }
    for (auto& [h, k] : kids)
      std::sort(k.begin(), k.end(), std::greater<>());
    // A stack: the smallest hash on top, so chains come out in hash order.
    std::sort(starts.begin(), starts.end(), std::greater<>());
    KvPubEvent ev;
    const auto flush = [&] {
      if (!ev.hashes.empty()) emit(std::move(ev));
      ev = KvPubEvent{};
    };
    while (!starts.empty()) {
      std::uint64_t h = starts.back();
      starts.pop_back();
      flush();
      for (;;) {
        const Block& b = blocks_.at(h);
        const auto bs = static_cast<std::uint32_t>(b.tokens.size());
        if (!ev.hashes.empty() &&
            (ev.hashes.size() >= max_blocks || ev.ns != b.ns || ev.block_size != bs))
          flush();
        if (ev.hashes.empty()) {
          ev.parent = b.parent;
          ev.ns = b.ns;
          ev.block_size = bs;
        }
        ev.hashes.push_back(h);
        ev.tokens.insert(ev.tokens.end(), b.tokens.begin(), b.tokens.end());
        const auto it = kids.find(h);
        if (it == kids.end() || it->second.empty()) break;
        h = it->second.back();
        it->second.pop_back();
        starts.insert(starts.end(), it->second.begin(), it->second.end());
        it->second.clear();
      }
    }
    flush();
  }

 private:
  struct Block {
    std::optional<std::uint64_t> parent;
    std::uint64_t ns = 0;
    std::vector<std::uint32_t> tokens;
  };
  std::unordered_map<std::uint64_t, Block> blocks_;
};

}  // namespace promptcache::detail

#endif  // PROMPTCACHE_DETAIL_KV_PUBLISHER_STATE_HPP
