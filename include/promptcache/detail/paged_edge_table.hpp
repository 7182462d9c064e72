// promptcache: detail/paged_edge_table.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The child edges of every node of a PagedPrefixCache in one hash table, keyed
// by (parent node, first token of the child's first page). One shared table
// instead of a table per node: a leaf (most nodes) then costs no table at all,
// and a node with 50k children costs the same per lookup as one with two.
// Open addressing with linear probing and backward-shift deletion; load kept
// between 1/8 and 1/2. Growth is split into reserve() (may throw) and
// insert_reserved() (never throws), so an insert can allocate before it changes
// anything; erase() never throws (shrinking is best effort).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <utility>

namespace promptcache::detail {

class PagedEdgeTable {
 public:
  static constexpr std::uint32_t npos = 0xFFFFFFFFU;

 private:
  struct Slot {
    std::uint32_t parent = 0;
    std::uint32_t token = 0;
    std::uint32_t child = npos;  // npos marks an empty slot
    const void* hint = nullptr;  // the owner's prefetch address for the child (see find)
  };

 public:
  PagedEdgeTable() noexcept = default;
  PagedEdgeTable(const PagedEdgeTable&) = delete;
  PagedEdgeTable& operator=(const PagedEdgeTable&) = delete;
  PagedEdgeTable(PagedEdgeTable&& o) noexcept { swap(o); }
  PagedEdgeTable& operator=(PagedEdgeTable&& o) noexcept {
    PagedEdgeTable tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  ~PagedEdgeTable() = default;

  void swap(PagedEdgeTable& o) noexcept {
    std::swap(slots_, o.slots_);
    std::swap(mask_, o.mask_);
    std::swap(shift_, o.shift_);
    std::swap(size_, o.size_);
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return slots_ ? mask_ + 1 : 0; }
  [[nodiscard]] std::size_t memory_bytes() const noexcept { return capacity() * sizeof(Slot); }

  /// The table's lookups, on a copy of its fields. A caller making many lookups between
  /// calls that may write memory keeps the copy in registers instead of reloading the
  /// table's fields after each call. Invalidated by any change to the table.
  class View {
   public:
    /// The child under (parent, token), or npos.
    [[nodiscard]] std::uint32_t find(std::uint32_t parent, std::uint32_t token) const noexcept {
      if (slots_ == nullptr) return npos;
      for (std::size_t i = home(parent, token, shift_);; i = (i + 1) & mask_) {
        const Slot& s = slots_[i];
        if (s.child == npos) return npos;
        if (s.parent == parent && s.token == token) return s.child;
      }
    }

    /// find(), also setting `hint` to the address stored with the edge (nullptr if none).
    /// The table never reads through a hint; a stale one only makes a useless prefetch.
    [[nodiscard]] std::uint32_t find(std::uint32_t parent, std::uint32_t token,
                                     const void*& hint) const noexcept {
      if (slots_ == nullptr) return npos;
      for (std::size_t i = home(parent, token, shift_);; i = (i + 1) & mask_) {
        const Slot& s = slots_[i];
        if (s.child == npos) return npos;
        if (s.parent == parent && s.token == token) {
          hint = s.hint;
          return s.child;
        }
      }
    }

    /// Asks for the cache line where find(parent, token) starts probing, so that a lookup
    /// known in advance overlaps other work instead of waiting for the line. Forced inline:
    /// GCC deems a function that only prefetches free of effects and deletes calls to it.
    [[gnu::always_inline]] void prefetch(std::uint32_t parent, std::uint32_t token) const noexcept {
#if defined(__GNUC__) || defined(__clang__)
      if (slots_ != nullptr) __builtin_prefetch(&slots_[home(parent, token, shift_)]);
#else
      (void)parent;
      (void)token;
#endif
    }

   private:
    friend class PagedEdgeTable;
    const Slot* slots_ = nullptr;
    std::size_t mask_ = 0;
    unsigned shift_ = 63;
  };

  /// The lookups on the table as it is now (see View).
  [[nodiscard]] View view() const noexcept {
    View v;
    v.slots_ = slots_.get();
    v.mask_ = mask_;
    v.shift_ = shift_;
    return v;
  }

  /// The child under (parent, token), or npos.
  [[nodiscard]] std::uint32_t find(std::uint32_t parent, std::uint32_t token) const noexcept {
    return view().find(parent, token);
  }

  /// Asks for the cache line where find(parent, token) starts probing (see View::prefetch).
  [[gnu::always_inline]] void prefetch(std::uint32_t parent, std::uint32_t token) const noexcept {
    view().prefetch(parent, token);
  }

  /// Room for `extra` more edges, so that insert_reserved cannot fail. Strong guarantee.
  void reserve(std::size_t extra) {
    const std::size_t need = 2 * (size_ + extra);
    if (need <= capacity()) return;
    std::size_t cap = 16;
    while (cap < need)
      cap *= 2;
    rehash(std::unique_ptr<Slot[]>(new Slot[cap]), cap);
  }

  /// Adds an edge whose key is absent, with a prefetch hint for its child (an address the
  /// owner wants fetched when it looks the edge up ahead of use); requires a preceding
  /// reserve().
  void insert_reserved(std::uint32_t parent, std::uint32_t token, std::uint32_t child,
                       const void* hint) noexcept {
    place(Slot{parent, token, child, hint});
    ++size_;
  }

  /// Points an existing key at another child, with that child's hint.
  void replace(std::uint32_t parent, std::uint32_t token, std::uint32_t child,
               const void* hint) noexcept {
    Slot& s = slots_[existing(parent, token)];
    s.child = child;
    s.hint = hint;
  }

  /// Changes the hint of an existing key.
  void set_hint(std::uint32_t parent, std::uint32_t token, const void* hint) noexcept {
    slots_[existing(parent, token)].hint = hint;
  }

  /// Removes an existing key; shrinks (best effort) when the table is 1/8 full.
  void erase(std::uint32_t parent, std::uint32_t token) noexcept {
    std::size_t hole = existing(parent, token);
    for (std::size_t j = (hole + 1) & mask_; slots_[j].child != npos; j = (j + 1) & mask_) {
      const std::size_t h = home(slots_[j].parent, slots_[j].token);
      // j may fill the hole unless its home lies cyclically in (hole, j].
      const bool stays = hole <= j ? (h > hole && h <= j) : (h > hole || h <= j);
      if (!stays) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = Slot{};
    --size_;
    if (capacity() > 16 && size_ * 8 <= capacity()) {
      std::size_t cap = 16;
      while (cap < 4 * size_)
        cap *= 2;
      std::unique_ptr<Slot[]> table(new (std::nothrow) Slot[cap]);
      if (table) rehash(std::move(table), cap);
    }
  }

  /// Drops every edge and the table. Never throws.
  void clear() noexcept {
    slots_.reset();
    mask_ = 0;
    shift_ = 63;
    size_ = 0;
  }

 private:
  // Fibonacci hashing: the high bits of the product mix every bit of the key.
  [[nodiscard]] static std::size_t home(std::uint32_t parent, std::uint32_t token,
                                        unsigned shift) noexcept {
    const std::uint64_t x = (std::uint64_t{parent} << 32 | token) * 0x9E3779B97F4A7C15ULL;
    return static_cast<std::size_t>(x >> shift);
  }
  [[nodiscard]] std::size_t home(std::uint32_t parent, std::uint32_t token) const noexcept {
    return home(parent, token, shift_);
  }

  [[nodiscard]] std::size_t existing(std::uint32_t parent, std::uint32_t token) const noexcept {
    std::size_t i = home(parent, token);
    while (!(slots_[i].child != npos && slots_[i].parent == parent && slots_[i].token == token))
      i = (i + 1) & mask_;
    return i;
  }

  void place(const Slot& s) noexcept {
    std::size_t i = home(s.parent, s.token);
    while (slots_[i].child != npos)
      i = (i + 1) & mask_;
    slots_[i] = s;
  }

  void rehash(std::unique_ptr<Slot[]> table, std::size_t cap) noexcept {
    std::unique_ptr<Slot[]> old = std::exchange(slots_, std::move(table));
    const std::size_t old_cap = old ? mask_ + 1 : 0;
    mask_ = cap - 1;
    unsigned bits = 0;
    while ((std::size_t{1} << bits) < cap)
      ++bits;
    shift_ = 64U - bits;
    for (std::size_t i = 0; i < old_cap; ++i)
      if (old[i].child != npos) place(old[i]);
  }

  std::unique_ptr<Slot[]> slots_;
  std::size_t mask_ = 0;
  unsigned shift_ = 63;
  std::size_t size_ = 0;
};

}  // namespace promptcache::detail
