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

// The blocks a stream of published events leaves the engine holding, as a
// forest: nodes in one slot-addressed vector, each linked to its parent's
// child list (or to the roots), so a dump walks it without a lookup or a sort.
// A block stored under a parent that is not held is a root until that parent
// is stored (the waiting list, empty for a PagedPrefixCache, which stores only
// under held prefixes and evicts only leaves).
class KvPubMirror {
 public:
  // Applies one published event. Basic guarantee: std::bad_alloc may leave a
  // stored chain partly applied (the publisher then drops the whole mirror).
  void apply(const KvPubEvent& e) {
    switch (e.kind) {
      case KvPubEvent::Kind::stored: {
        const std::size_t bs = e.block_size;
        std::optional<std::uint64_t> parent = e.parent;
        std::uint32_t slot = npos;  // the previous block's: a chain needs no parent lookup
        for (std::size_t i = 0; i < e.hashes.size(); ++i) {
          const auto first = e.tokens.begin() + static_cast<std::ptrdiff_t>(i * bs);
          slot = store(e.hashes[i], parent, slot, e.ns, first,
                       first + static_cast<std::ptrdiff_t>(bs));
          parent = e.hashes[i];
        }
        return;
      }
      case KvPubEvent::Kind::removed:
        for (const std::uint64_t h : e.hashes)
          remove(h);
        return;
      case KvPubEvent::Kind::cleared:
        clear();
        return;
    }
  }

  std::size_t size() const noexcept { return index_.size(); }

  void clear() noexcept {
    nodes_.clear();
    free_.clear();
    index_.clear();
    waiting_.clear();
    roots_ = npos;
  }

  // The held blocks as stored events, parents before children: one event per
  // chain (a path that follows first children), cut after `max_blocks` blocks
  // and where the namespace or block size changes. A block whose parent is not
  // held starts a chain under that parent's name (the router keeps it as its
  // rules for unknown parents say). O(blocks + tokens).
  template <class Emit>
  void dump(std::size_t max_blocks, Emit&& emit) const {
    max_blocks = std::max<std::size_t>(max_blocks, 1);
    std::vector<std::uint32_t> starts;
    for (std::uint32_t r = roots_; r != npos; r = nodes_[r].next)
      starts.push_back(r);
    std::reverse(starts.begin(), starts.end());  // a stack: the first root on top
    KvPubEvent ev;
    const auto flush = [&] {
      if (!ev.hashes.empty()) emit(std::move(ev));
      ev = KvPubEvent{};
    };
    while (!starts.empty()) {
      std::uint32_t x = starts.back();
      starts.pop_back();
      flush();
      for (;;) {
        const Node& n = nodes_[x];
        const auto bs = static_cast<std::uint32_t>(n.tokens.size());
        if (!ev.hashes.empty() &&
            (ev.hashes.size() >= max_blocks || ev.ns != n.ns || ev.block_size != bs))
          flush();
        if (ev.hashes.empty()) {
          ev.parent = n.parent_hash;
          ev.ns = n.ns;
          ev.block_size = bs;
        }
        ev.hashes.push_back(n.hash);
        ev.tokens.insert(ev.tokens.end(), n.tokens.begin(), n.tokens.end());
        if (n.first_child == npos) break;
        x = n.first_child;
        // The first child continues the chain; its siblings start their own.
        const std::size_t mark = starts.size();
        for (std::uint32_t c = nodes_[x].next; c != npos; c = nodes_[c].next)
          starts.push_back(c);
        std::reverse(starts.begin() + static_cast<std::ptrdiff_t>(mark), starts.end());
      }
    }
    flush();
  }

 private:
  static constexpr std::uint32_t npos = 0xFFFFFFFFU;

  struct Node {
    std::uint64_t hash = 0;
    std::optional<std::uint64_t> parent_hash;  // as published
    std::uint32_t parent = npos;               // the held parent's slot; npos: a root
    std::uint32_t first_child = npos;
    std::uint32_t next = npos;  // siblings (roots among the roots)
    std::uint32_t prev = npos;
    std::uint64_t ns = 0;
    std::vector<std::uint32_t> tokens;
  };

  // Stores block h (parent_slot: its parent's slot if known, else npos) and
  // returns its slot.
  template <class It>
  std::uint32_t store(std::uint64_t h, const std::optional<std::uint64_t>& parent_hash,
                      std::uint32_t parent_slot, std::uint64_t ns, It first, It last) {
    if (index_.count(h) != 0) {
      remove(h);           // stored again: its new place counts
      parent_slot = npos;  // the removal may have moved the parent
    }
    std::uint32_t x = npos;
    if (!free_.empty()) {
      x = free_.back();
      nodes_[x].tokens.assign(first, last);
      free_.pop_back();
    } else {
      Node n;
      n.tokens.assign(first, last);
      nodes_.push_back(std::move(n));
      x = static_cast<std::uint32_t>(nodes_.size() - 1U);
    }
    Node& n = nodes_[x];
    n.hash = h;
    n.parent_hash = parent_hash;
    n.ns = ns;
    n.first_child = npos;
    index_.emplace(h, x);
    // A block named as its own parent is garbage: a root, never waiting.
    const bool has_parent = parent_hash && *parent_hash != h;
    std::uint32_t p = has_parent ? parent_slot : npos;
    if (has_parent && p == npos) {
      const auto it = index_.find(*parent_hash);
      if (it != index_.end()) p = it->second;
    }
    link(x, p);
    if (p == npos && has_parent) waiting_.emplace(*parent_hash, x);
    // Blocks that were waiting for this one move under it.
    if (!waiting_.empty()) {
      const auto [b, e] = waiting_.equal_range(h);
      for (auto it = b; it != e; ++it) {
        unlink(it->second);
        link(it->second, x);
      }
      waiting_.erase(b, e);
    }
    return x;
  }

  void remove(std::uint64_t h) {
    const auto it = index_.find(h);
    if (it == index_.end()) return;
    const std::uint32_t x = it->second;
    index_.erase(it);
    Node& n = nodes_[x];
    if (n.parent == npos && n.parent_hash && *n.parent_hash != h) drop_waiting(*n.parent_hash, x);
    unlink(x);
    // Its children, if any, wait for it as roots.
    while (nodes_[x].first_child != npos) {
      const std::uint32_t c = nodes_[x].first_child;
      unlink(c);
      link(c, npos);
      waiting_.emplace(h, c);
    }
    nodes_[x].tokens = {};
    free_.push_back(x);
  }

  void drop_waiting(std::uint64_t parent, std::uint32_t x) {
    const auto [b, e] = waiting_.equal_range(parent);
    for (auto it = b; it != e; ++it) {
      if (it->second == x) {
        waiting_.erase(it);
        return;
      }
    }
  }

  // Makes x the first of p's children (p = npos: of the roots).
  void link(std::uint32_t x, std::uint32_t p) noexcept {
    std::uint32_t& head = p == npos ? roots_ : nodes_[p].first_child;
    Node& n = nodes_[x];
    n.parent = p;
    n.prev = npos;
    n.next = head;
    if (head != npos) nodes_[head].prev = x;
    head = x;
  }

  void unlink(std::uint32_t x) noexcept {
    Node& n = nodes_[x];
    if (n.prev != npos)
      nodes_[n.prev].next = n.next;
    else
      (n.parent == npos ? roots_ : nodes_[n.parent].first_child) = n.next;
    if (n.next != npos) nodes_[n.next].prev = n.prev;
    n.prev = n.next = npos;
    n.parent = npos;
  }

  std::vector<Node> nodes_;
  std::vector<std::uint32_t> free_;
  std::unordered_map<std::uint64_t, std::uint32_t> index_;
  std::unordered_multimap<std::uint64_t, std::uint32_t> waiting_;  // parent hash -> root slot
  std::uint32_t roots_ = npos;
};

}  // namespace promptcache::detail

#endif  // PROMPTCACHE_DETAIL_KV_PUBLISHER_STATE_HPP
