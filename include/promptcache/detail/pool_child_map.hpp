// promptcache: detail/pool_child_map.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The children of one radix-tree node of PromptCachePool, keyed by the first
// token of each child's edge. Each entry also keeps a copy of the child's label
// (pointer and length), so a lookup can compare the label while the child node
// itself is still on its way from memory (the pool keeps the copy in sync). An open-addressing
// table (linear probing, backward-shift deletion, load factor <= 1/2) so that a node with 65536
// children costs the same per lookup as a node with two. Growth is split in
// two steps, reserve() (may throw) and insert_reserved() (never throws),
// so the pool can do every allocation of an insert before it changes anything.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace promptcache::detail {

template <std::integral Token, class Node>
class PoolChildMap {
 public:
  /// label_len in a slot when the label is too long for 32 bits: read the node's instead.
  static constexpr std::uint32_t kLongLabel = 0xFFFFFFFFU;

  struct Slot {
    Token key{};
    std::uint32_t label_len = 0;   // the child's label length, or kLongLabel; fills padding
    const Token* label = nullptr;  // the child's label (its edge's tokens)
    Node* node = nullptr;          // nullptr marks an empty slot
  };

  PoolChildMap() noexcept = default;
  PoolChildMap(const PoolChildMap&) = delete;
  PoolChildMap& operator=(const PoolChildMap&) = delete;
  PoolChildMap(PoolChildMap&& other) noexcept { swap(other); }
  PoolChildMap& operator=(PoolChildMap&& other) noexcept {
    PoolChildMap tmp(std::move(other));
    swap(tmp);
    return *this;
  }
  ~PoolChildMap() = default;

  void swap(PoolChildMap& other) noexcept {
    std::swap(slots_, other.slots_);
    std::swap(size_, other.size_);
    std::swap(shift_, other.shift_);
    std::swap(capacity_, other.capacity_);
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  /// Bytes of the slot table (for the index-memory report).
  [[nodiscard]] std::size_t table_bytes() const noexcept { return capacity_ * sizeof(Slot); }

  [[nodiscard]] Node* find(Token key) const noexcept {
    const Slot* s = find_slot(key);
    return s == nullptr ? nullptr : s->node;
  }

  /// The entry (node and label) of the child under `key`, or nullptr.
  [[nodiscard]] const Slot* find_slot(Token key) const noexcept {
    if (!slots_) return nullptr;
    // The mask from shift_ (capacity is 2^(64 - shift_)), so a lookup reads only the first
    // 12 bytes of the map, which the pool keeps on its node's first cache line.
    // A 64-bit shift: shift_ may exceed the width of a 32-bit size_t.
    const auto mask = static_cast<std::size_t>(~std::uint64_t{0} >> shift_);
    const Slot* const table = slots_.get();
    for (std::size_t i = index_of(key);; i = (i + 1) & mask) {
      const Slot& s = table[i];
      if (s.node == nullptr) return nullptr;
      if (s.key == key) return &s;
    }
  }

  /// Makes room for `extra` more children so that insert_reserved cannot fail. May throw
  /// bad_alloc; the map is unchanged if it does.
  void reserve(std::size_t extra) {
    if (2 * (size_ + extra) <= capacity_) return;
    std::size_t new_capacity = capacity_ == 0 ? 2 : capacity_ * 2;
    while (2 * (size_ + extra) > new_capacity)
      new_capacity *= 2;
    move_to(std::unique_ptr<Slot[]>(new Slot[new_capacity]), new_capacity);
  }

  /// Adds a child whose key is not present; requires a preceding reserve().
  void insert_reserved(Token key, Node* node, const Token* label, std::size_t label_len) noexcept {
    place(Slot{key, short_len(label_len), label, node});
    ++size_;
  }

  /// Replaces the node (and its label) stored under an existing key.
  void replace(Token key, Node* node, const Token* label, std::size_t label_len) noexcept {
    existing(key) = Slot{key, short_len(label_len), label, node};
  }

  /// Updates the label stored under an existing key (the child's label moved, same length).
  void set_label(Token key, const Token* label) noexcept { existing(key).label = label; }

  /// Removes an existing key (backward-shift deletion keeps probe chains intact).
  void erase(Token key) noexcept {
    const std::size_t mask = capacity_ - 1;
    Slot* const table = slots_.get();
    std::size_t hole = static_cast<std::size_t>(&existing(key) - table);
    for (std::size_t j = (hole + 1) & mask; table[j].node != nullptr; j = (j + 1) & mask) {
      const std::size_t home = index_of(table[j].key);
      // Move j into the hole unless its home lies cyclically in (hole, j].
      const bool home_after_hole =
          hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
      if (!home_after_hole) {
        table[hole] = table[j];
        hole = j;
      }
    }
    table[hole] = Slot{};
    --size_;
    // A table left mostly empty by mass evictions would make any()/for_each scan it; shrink
    // when a table is 1/8 full. Best effort: if the allocation fails, keep the big table.
    if (capacity_ > 16 && size_ * 8 <= capacity_) {
      std::size_t smaller = 2;
      while (smaller < 4 * size_)
        smaller *= 2;
      rebuild(smaller);
    }
  }

  /// Calls f(node) for every child, in table order.
  template <class F>
  void for_each(F&& f) const {
    for (std::size_t i = 0; i < capacity_; ++i) {
      if (slots_[i].node != nullptr) f(slots_[i].node);
    }
  }

  /// Any child (the first in table order), or nullptr.
  [[nodiscard]] Node* any() const noexcept {
    const Slot* const table = slots_.get();
    for (std::size_t i = 0; i < capacity_; ++i) {
      if (table[i].node != nullptr) return table[i].node;
    }
    return nullptr;
  }

 private:
  static std::uint32_t short_len(std::size_t n) noexcept {
    return n < kLongLabel ? static_cast<std::uint32_t>(n) : kLongLabel;
  }

  static unsigned shift_for(std::size_t capacity) noexcept {
    unsigned bits = 0;
    while ((std::size_t{1} << bits) < capacity)
      ++bits;
    return 64U - bits;
  }

  [[nodiscard]] std::size_t index_of(Token key) const noexcept {
    using U = std::make_unsigned_t<Token>;
    const auto x = static_cast<std::uint64_t>(static_cast<U>(key));
    // Fibonacci hashing: the high bits of the product are well mixed.
    return static_cast<std::size_t>((x * 0x9E3779B97F4A7C15ULL) >> shift_);
  }

  void rebuild(std::size_t new_capacity) noexcept {
    std::unique_ptr<Slot[]> table(new (std::nothrow) Slot[new_capacity]);
    if (table) move_to(std::move(table), new_capacity);
  }

  // Re-places every child into `table` (new_capacity empty slots) and makes it the map's.
  void move_to(std::unique_ptr<Slot[]> table, std::size_t new_capacity) noexcept {
    PoolChildMap other;
    other.slots_ = std::move(table);
    other.capacity_ = new_capacity;
    other.shift_ = shift_for(new_capacity);
    const Slot* const old = slots_.get();
    for (std::size_t i = 0; i < capacity_; ++i) {
      if (old[i].node != nullptr) other.place(old[i]);
    }
    other.size_ = size_;
    swap(other);
  }

  void place(const Slot& slot) noexcept {
    const std::size_t mask = capacity_ - 1;
    Slot* const table = slots_.get();
    std::size_t i = index_of(slot.key);
    while (table[i].node != nullptr)
      i = (i + 1) & mask;
    table[i] = slot;
  }

  Slot& existing(Token key) noexcept {
    const std::size_t mask = capacity_ - 1;
    Slot* const table = slots_.get();
    std::size_t i = index_of(key);
    while (!(table[i].key == key && table[i].node != nullptr))
      i = (i + 1) & mask;
    return table[i];
  }

  // find() reads slots_ and shift_ only: keep them first. The loops index a raw pointer taken
  // once: in an unoptimized build, unique_ptr's operator[] is a chain of calls per probe.
  std::unique_ptr<Slot[]> slots_;
  unsigned shift_ = 64;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

}  // namespace promptcache::detail
