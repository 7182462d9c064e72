// promptcache: detail/kv_index_holders.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The holder sets of kv_index.hpp: which worker slots hold a tree node. While
// every slot is below 64, a node's 64-bit holder word is simply the bitset of
// its holders (the word form): adding or dropping a holder is one bit, a set
// difference one and-not. With more slots most blocks are still held by one
// or two of them, so a set costs what it holds, not one bit per rank (the
// sparse form): up to two holders live in the holder word; larger sets move to
// an arena, as a sorted array of slot indices while that is smaller than a
// bitset over every slot, else as that bitset (the sets of widely shared
// prefixes, such as system prompts).
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "promptcache/detail/kv_index_table.hpp"

namespace promptcache::detail {

/// Arena of spilled holder sets, and the operations on a node's holder word.
/// In the word form (every slot below 64; how a set starts) the word is the
/// bitset of the holders and there is no arena. In the sparse form the caller
/// keeps each set's size (the node's holder count): it selects the encoding
/// of the word.
///   count <= 2: the word holds the slots, smaller one in the low 32 bits
///               (kv_npos for an absent one);
///   count >= 3: the word is bits 0..39 offset of a block in the arena (in
///               32-bit units), bits 40..47 its size class k (4 << k units),
///               bit 48 set for a bitset (else a sorted array of `count` slots).
/// Every bitset has the same width, a multiple of 128 slots covering every slot
/// in use (set_width), so any slot can join a bitset without reallocating it.
/// Freed blocks go to one free list per size class; the arena is released when
/// no set is spilled (unless a caller asks to keep capacity).
/// The form belongs to all sets at once: the owner of the words switches every
/// one of them (begin_sparse + to_sparse, or to_word + end_word_form) when a
/// slot of 64 or more appears or the last one goes.
class KvHolderSets {
 public:
  /// The holder word of a set with no holder (in either form).
  static constexpr std::uint64_t empty_word = 0;
  /// Largest set kept in the holder word itself in the sparse form.
  static constexpr std::uint32_t inline_max = 2;
  /// Slots the word form covers.
  static constexpr std::uint32_t word_slots = 64;

  /// A read-only view of one set, for iteration in ascending slot order.
  /// Points into the arena: invalidated by any change to the sets.
  class View {
   public:
    /// Calls f(slot) for every holder, ascending. O(size + bitset words).
    template <class F>
    void for_each(F&& f) const {
      if (bits_ == nullptr) {
        for (std::uint32_t i = 0; i < n_; ++i)
          f(list_[i]);
        return;
      }
      for (std::uint32_t w = 0; w < n_; ++w)
        for (std::uint32_t b = bits_[w]; b != 0U; b &= b - 1U)
          f(w * 32U + static_cast<std::uint32_t>(std::countr_zero(b)));
    }

    /// True when `slot` is in the set. O(log size) or O(1) for a bitset.
    [[nodiscard]] bool contains(std::uint32_t slot) const noexcept {
      if (bits_ != nullptr)
        return slot / 32U < n_ && ((bits_[slot / 32U] >> (slot % 32U)) & 1U) != 0U;
      return std::binary_search(list_, list_ + n_, slot);
    }

    /// Calls f(slot) for every holder of this set that `sub` lacks, ascending.
    /// O(size of both + bitset words).
    template <class F>
    void for_each_missing(const View& sub, F&& f) const {
      if (bits_ != nullptr && sub.bits_ != nullptr) {
        for (std::uint32_t w = 0; w < n_; ++w) {
          const std::uint32_t other = w < sub.n_ ? sub.bits_[w] : 0U;
          for (std::uint32_t b = bits_[w] & ~other; b != 0U; b &= b - 1U)
            f(w * 32U + static_cast<std::uint32_t>(std::countr_zero(b)));
        }
        return;
      }
      if (sub.bits_ != nullptr) {
        for_each([&](std::uint32_t s) {
          if (!sub.contains(s)) f(s);
        });
        return;
      }
      if (bits_ != nullptr) {  // a bitset less a sorted list: mask word by word
        std::uint32_t j = 0;
        for (std::uint32_t w = 0; w < n_; ++w) {
          std::uint32_t b = bits_[w];
          for (; j < sub.n_ && sub.list_[j] / 32U == w; ++j)
            b &= ~(std::uint32_t{1} << (sub.list_[j] % 32U));
          for (; b != 0U; b &= b - 1U)
            f(w * 32U + static_cast<std::uint32_t>(std::countr_zero(b)));
        }
        return;
      }
      // `sub` is a sorted list: merge against it.
      std::uint32_t j = 0;
      for_each([&](std::uint32_t s) {
        while (j < sub.n_ && sub.list_[j] < s)
          ++j;
        if (j == sub.n_ || sub.list_[j] != s) f(s);
      });
    }

   private:
    friend class KvHolderSets;
    const std::uint32_t* list_ = nullptr;  // sorted slots (inline_ or an arena array)
    const std::uint32_t* bits_ = nullptr;  // or the bitset words
    std::uint32_t n_ = 0;                  // slots in list_, or words in bits_
    std::uint32_t inline_[inline_max] = {};
  };

  /// Fills `v` with a view of the set (word, count). `v` must not be copied
  /// while in use (it may point into itself). O(1).
  void view(std::uint64_t word, std::uint32_t count, View& v) const noexcept {
    if (word_form_) {  // the word as two 32-bit bitset words
      v.inline_[0] = lo(word);
      v.inline_[1] = hi(word);
      v.list_ = nullptr;
      v.bits_ = v.inline_;
      v.n_ = 2;
      return;
    }
    if (count <= inline_max) {
      v.inline_[0] = lo(word);
      v.inline_[1] = hi(word);
      v.list_ = v.inline_;
      v.bits_ = nullptr;
      v.n_ = count;
      return;
    }
    const std::uint32_t* p = block(word);
    if (is_bitset(word)) {
      v.list_ = nullptr;
      v.bits_ = p;
      v.n_ = bitset_units_;
    } else {
      v.list_ = p;
      v.bits_ = nullptr;
      v.n_ = count;
    }
  }

  /// True when `slot` is in the set (word, count). O(log count).
  [[nodiscard]] bool contains(std::uint64_t word, std::uint32_t count,
                              std::uint32_t slot) const noexcept {
    if (word_form_) return slot < word_slots && ((word >> slot) & 1U) != 0U;
    if (count <= inline_max)
      return (count > 0U && lo(word) == slot) || (count > 1U && hi(word) == slot);
    const std::uint32_t* p = block(word);
    if (is_bitset(word))
      return slot / 32U < bitset_units_ && ((p[slot / 32U] >> (slot % 32U)) & 1U) != 0U;
    return std::binary_search(p, p + count, slot);
  }

  /// Adds `slot` (absent, below the width) to the set (word, count). Cannot
  /// throw after reserve(n) for n such calls. O(count) for an array, else O(1).
  void insert(std::uint64_t& word, std::uint32_t count, std::uint32_t slot) {
    if (word_form_) {
      word |= std::uint64_t{1} << slot;
      return;
    }
    if (count < inline_max) {
      if (count == 0U)
        word = pack(slot, kv_npos);
      else
        word = lo(word) < slot ? pack(lo(word), slot) : pack(slot, lo(word));
      return;
    }
    if (count > inline_max && is_bitset(word)) {
      block(word)[slot / 32U] |= std::uint32_t{1} << (slot % 32U);
      return;
    }
    insert_spilled(word, count, slot);
  }

 private:
  // insert() into a sorted array, or the spill of a full holder word.
  void insert_spilled(std::uint64_t& word, std::uint32_t count, std::uint32_t slot) {
    if (count == inline_max) {
      std::uint32_t three[3] = {lo(word), hi(word), slot};
      std::sort(three, three + 3);
      word = make_block(three, 3);
      return;
    }
    std::uint32_t* p = block(word);
    const std::uint32_t cap = units_of(word);
    if (count < cap && !prefer_bitset(count + 1U)) {
      std::uint32_t* at = std::upper_bound(p, p + count, slot);
      std::copy_backward(at, p + count, p + count + 1);
      *at = slot;
      return;
    }
    // Full (or now denser than a bitset): move to the right block for count + 1.
    const std::uint64_t old = word;
    word = alloc_for(count + 1U);
    std::uint32_t* q = block(word);
    const std::uint32_t* src = block(old);  // the arena did not move (reserved)
    if (is_bitset(word)) {
      std::fill_n(q, bitset_units_, 0U);
      for (std::uint32_t i = 0; i < count; ++i)
        q[src[i] / 32U] |= std::uint32_t{1} << (src[i] % 32U);
      q[slot / 32U] |= std::uint32_t{1} << (slot % 32U);
    } else {
      const std::uint32_t* at = std::upper_bound(src, src + count, slot);
      const auto before = static_cast<std::size_t>(at - src);
      std::copy_n(src, before, q);
      q[before] = slot;
      std::copy(at, src + count, q + before + 1);
    }
    free_block(old);
  }

 public:
  /// Removes `slot` (present) from the set (word, count). Never allocates;
  /// with `shrink` a set much smaller than its block moves to a smaller free
  /// block when one is at hand, and an arena left without sets is released.
  /// O(count + bitset words).
  void erase(std::uint64_t& word, std::uint32_t count, std::uint32_t slot,
             bool shrink = true) noexcept {
    if (word_form_) {
      word &= ~(std::uint64_t{1} << slot);
      return;
    }
    if (count <= inline_max) {
      word = count == 1U ? empty_word : pack(lo(word) == slot ? hi(word) : lo(word), kv_npos);
      return;
    }
    // A bitset of the smallest class stays one whatever its size.
    if (count > inline_max + 1U && is_bitset(word) && class_of(word) == 0U) {
      block(word)[slot / 32U] &= ~(std::uint32_t{1} << (slot % 32U));
      return;
    }
    erase_spilled(word, count, slot, shrink);
  }

 private:
  // erase() from a sorted array or a wide bitset, or back into the word.
  void erase_spilled(std::uint64_t& word, std::uint32_t count, std::uint32_t slot,
                     bool shrink) noexcept {
    std::uint32_t* p = block(word);
    if (count == inline_max + 1U) {  // back into the word
      std::uint32_t keep[inline_max];
      std::uint32_t k = 0;
      View v;
      view(word, count, v);
      v.for_each([&](std::uint32_t s) {
        if (s != slot && k < inline_max) keep[k++] = s;
      });
      free_block(word);
      word = pack(keep[0], keep[1]);
      if (shrink) release_if_empty();
      return;
    }
    if (is_bitset(word)) {
      p[slot / 32U] &= ~(std::uint32_t{1} << (slot % 32U));
      // A bitset kept for a set that became sparse would cost per rank again.
      if (shrink && array_class(count - 1U) + 2U <= class_of(word)) to_array(word, count - 1U);
      return;
    }
    std::uint32_t* at = std::lower_bound(p, p + count, slot);
    std::copy(at + 1, p + count, at);
    if (shrink && array_class(count - 1U) + 2U <= class_of(word)) to_array(word, count - 1U);
  }

 public:
  /// Replaces holder `from` (present) with `to` (absent, below the width);
  /// the size is unchanged. Never allocates. O(count + bitset words).
  void replace(std::uint64_t& word, std::uint32_t count, std::uint32_t from,
               std::uint32_t to) noexcept {
    if (word_form_) {
      word = (word & ~(std::uint64_t{1} << from)) | (std::uint64_t{1} << to);
      return;
    }
    if (count <= inline_max) {
      const std::uint32_t other = lo(word) == from ? hi(word) : lo(word);
      word = count == 1U ? pack(to, kv_npos) : (other < to ? pack(other, to) : pack(to, other));
      return;
    }
    std::uint32_t* p = block(word);
    if (is_bitset(word)) {
      p[from / 32U] &= ~(std::uint32_t{1} << (from % 32U));
      p[to / 32U] |= std::uint32_t{1} << (to % 32U);
      return;
    }
    std::uint32_t* at = std::lower_bound(p, p + count, from);
    *at = to;
    std::sort(p, p + count);
  }

  /// Makes the next `inserts` insert() calls allocation-free (so they cannot
  /// throw). Strong guarantee; std::length_error past 2^40 arena units.
  void reserve(std::size_t inserts) {
    if (word_form_) return;  // inserts only set bits
    // No block is larger than a bitset: an array is used only when smaller.
    const std::size_t most = std::size_t{4} << bitset_class_;
    if (inserts > (max_units - units_.size()) / most)
      throw std::length_error("kv index: holder sets too large");
    reserve_room(inserts * most);
  }

  /// Arena units an insert() into a set of `count` holders may take from the
  /// arena's end: the block a set of count + 1 gets (0 while it stays in the
  /// holder word). O(log count).
  [[nodiscard]] std::size_t insert_units(std::uint32_t count) const noexcept {
    if (word_form_ || count < inline_max) return 0;
    return std::size_t{4} << (prefer_bitset(count + 1U) ? bitset_class_ : array_class(count + 1U));
  }

  /// Makes inserts whose insert_units() add up to `units` allocation-free.
  /// Grows the arena at least twofold when it must grow, so stores that each
  /// reserve a little do not copy it each time. Strong guarantee;
  /// std::length_error past 2^40 units.
  void reserve_room(std::size_t units) {
    if (word_form_) return;
    if (units > max_units - units_.size())
      throw std::length_error("kv index: holder sets too large");
    const std::size_t need = units_.size() + units;
    if (need > units_.capacity()) units_.reserve(std::max(need, units_.capacity() * 2U));
  }

  /// True when reserve(inserts) would allocate nothing (and not throw). O(1).
  [[nodiscard]] bool fits(std::size_t inserts) const noexcept {
    if (word_form_) return true;
    const std::size_t most = std::size_t{4} << bitset_class_;
    return inserts <= (units_.capacity() - units_.size()) / most;
  }

  /// Bitset width (in 32-bit words) that covers slots below `slots`. O(1).
  [[nodiscard]] static std::size_t bitset_class_for(std::size_t slots) noexcept {
    std::size_t k = 0;
    while ((std::size_t{128} << k) < slots)
      ++k;
    return k;
  }
  /// Size class of every bitset. O(1).
  [[nodiscard]] std::size_t bitset_class() const noexcept { return bitset_class_; }

  /// Changing the bitset width to class `k` takes reserve_rewidth(number of
  /// bitsets, k), then rewidth() on every holder word, then end_rewidth(k).
  /// This is the first step. Strong guarantee.
  void reserve_rewidth(std::size_t bitsets, std::size_t k) {
    const std::size_t each = std::size_t{4} << k;
    if (bitsets > (max_units - units_.size()) / each)
      throw std::length_error("kv index: holder sets too large");
    const std::size_t need = units_.size() + bitsets * each;
    if (need > units_.capacity()) units_.reserve(std::max(need, units_.capacity() * 2U));
  }
  /// Moves one bitset (word, count) to a block of class `k`, keeping its bits
  /// below the new width (the caller guarantees none is set above). Never
  /// allocates after reserve_rewidth.
  void rewidth(std::uint64_t& word, std::uint32_t count, std::size_t k) noexcept {
    if (count <= inline_max || !is_bitset(word)) return;
    const std::uint64_t old = word;
    word = alloc_class(static_cast<std::uint32_t>(k), true);
    const std::uint32_t units = std::uint32_t{4} << k;
    std::uint32_t* q = block(word);
    const std::uint32_t keep = std::min(units, units_of(old));
    std::copy_n(block(old), keep, q);
    std::fill(q + keep, q + units, 0U);
    free_block(old);
  }
  /// Ends a width change: bitsets made from now on have class `k`.
  void end_rewidth(std::size_t k) noexcept {
    bitset_class_ = static_cast<std::uint32_t>(k);
    bitset_units_ = std::uint32_t{4} << k;
  }

  /// True for a spilled bitset set of the sparse form. O(1).
  [[nodiscard]] static bool is_bitset_set(std::uint64_t word, std::uint32_t count) noexcept {
    return count > inline_max && is_bitset(word);
  }

  /// True in the word form (each set is the bitset of its holders, all below
  /// 64). O(1).
  [[nodiscard]] bool word_form() const noexcept { return word_form_; }

  /// Arena units a set of `count` holders takes in the sparse form with bitset
  /// class `k` (0 while it fits in the holder word). Switching to the sparse
  /// form reserves their sum over all sets first. O(log count).
  [[nodiscard]] static std::size_t sparse_units(std::uint32_t count, std::size_t k) noexcept {
    if (count <= inline_max) return 0;
    return std::size_t{4} << std::min<std::size_t>(k, array_class(count));
  }
  /// Switching to the sparse form takes reserve_units(sum of sparse_units),
  /// then begin_sparse(k), then to_sparse() on every holder word. This is the
  /// first step. Strong guarantee; std::length_error past 2^40 units.
  void reserve_units(std::size_t units) {
    if (units > max_units - units_.size())
      throw std::length_error("kv index: holder sets too large");
    if (units_.size() + units > units_.capacity()) units_.reserve(units_.size() + units);
  }
  /// Leaves the word form: sets made from now on are sparse, bitsets of class
  /// `k`. Every word must then go through to_sparse(). O(1).
  void begin_sparse(std::size_t k) noexcept {
    word_form_ = false;
    end_rewidth(k);
  }
  /// Re-encodes one word-form set (word, count) in the sparse form. Never
  /// allocates after reserve_units. O(count).
  void to_sparse(std::uint64_t& word, std::uint32_t count) noexcept {
    std::uint32_t slots[word_slots];
    std::uint32_t n = 0;
    for (std::uint64_t b = word; b != 0U; b &= b - 1U)
      slots[n++] = static_cast<std::uint32_t>(std::countr_zero(b));
    if (count <= inline_max)
      word = count == 0U ? empty_word : pack(slots[0], count == 2U ? slots[1] : kv_npos);
    else
      word = make_block(slots, count);  // within the reserved capacity
  }
  /// Switching to the word form takes to_word() on every holder word (no
  /// holder may be 64 or more), then end_word_form(). This is the first step:
  /// it re-encodes one sparse set (word, count) as its bitset and frees its
  /// block. Never allocates. O(count + bitset words).
  void to_word(std::uint64_t& word, std::uint32_t count) noexcept {
    if (count == 0U) {
      word = empty_word;
      return;
    }
    std::uint64_t bits = 0;
    View v;
    view(word, count, v);
    v.for_each([&](std::uint32_t s) { bits |= std::uint64_t{1} << s; });
    if (count > inline_max) free_block(word);
    word = bits;
  }
  /// Ends a switch to the word form; releases the arena (no set is spilled).
  /// O(1).
  void end_word_form() noexcept {
    word_form_ = true;
    end_rewidth(0);
    release_if_empty();
  }

  /// Releases the arena when no set is spilled. O(1).
  void release_if_empty() noexcept {
    // Called on every node release: with no arena (so no free blocks either)
    // there is nothing to reset.
    if (blocks_ != 0U || units_.capacity() == 0U) return;
    std::vector<std::uint32_t>().swap(units_);
    free_ = no_free_blocks();
  }

  /// Checks the arena against the sets: for_each_set(f) must call f(word,
  /// count) for every set. Each spilled set's block lies in the arena, has
  /// the bitset class (a bitset) or room for its holders (an array), and no
  /// two blocks, live or on a free list, share a unit; live and free blocks
  /// cover the arena exactly and blocks() counts the live ones. In the word
  /// form there is no arena. O(arena units + sets); for tests.
  template <class ForEachSet>
  [[nodiscard]] bool check(ForEachSet&& for_each_set) const {
    const bool no_free = free_ == no_free_blocks();
    if (word_form_) return blocks_ == 0U && units_.empty() && no_free;
    std::vector<bool> used(units_.size(), false);
    bool ok = true;
    const auto claim = [&](std::uint64_t off, std::uint32_t k) {
      const std::size_t units = std::size_t{4} << k;
      if (k >= free_.size() || off > units_.size() || units > units_.size() - off) {
        ok = false;
        return;
      }
      for (std::size_t i = 0; i < units; ++i) {
        if (used[off + i]) ok = false;
        used[off + i] = true;
      }
    };
    std::size_t live = 0;
    for_each_set([&](std::uint64_t word, std::uint32_t count) {
      if (count <= inline_max) return;
      ++live;
      if (is_bitset(word) ? class_of(word) != bitset_class_ : units_of(word) < count) ok = false;
      claim(offset_of(word), class_of(word));
    });
    if (live != blocks_) return false;
    for (std::uint32_t k = 0; k < free_.size() && ok; ++k) {
      std::size_t steps = 0;  // a cycle would claim some unit twice first
      for (std::uint64_t off = free_[k]; off != none && ok; off = load_link(off)) {
        claim(off, k);
        if (++steps > units_.size()) return false;
      }
    }
    return ok && std::find(used.begin(), used.end(), false) == used.end();
  }

  /// Bytes held. O(1).
  [[nodiscard]] std::size_t memory_bytes() const noexcept { return units_.capacity() * 4U; }
  /// Spilled sets. O(1).
  [[nodiscard]] std::size_t blocks() const noexcept { return blocks_; }

 private:
  static constexpr std::uint64_t none = ~std::uint64_t{0};
  static constexpr std::size_t max_units = std::size_t{1} << 40U;
  static constexpr std::uint64_t bitset_flag = std::uint64_t{1} << 48U;

  [[nodiscard]] static constexpr std::array<std::uint64_t, 48> no_free_blocks() noexcept {
    std::array<std::uint64_t, 48> a{};
    for (auto& x : a)
      x = none;
    return a;
  }

  [[nodiscard]] static constexpr std::uint32_t lo(std::uint64_t w) noexcept {
    return static_cast<std::uint32_t>(w & 0xffffffffULL);
  }
  [[nodiscard]] static constexpr std::uint32_t hi(std::uint64_t w) noexcept {
    return static_cast<std::uint32_t>(w >> 32U);
  }
  [[nodiscard]] static constexpr std::uint64_t pack(std::uint32_t a, std::uint32_t b) noexcept {
    return std::uint64_t{a} | (std::uint64_t{b} << 32U);
  }
  [[nodiscard]] static constexpr std::uint64_t offset_of(std::uint64_t w) noexcept {
    return w & ((std::uint64_t{1} << 40U) - 1U);
  }
  [[nodiscard]] static constexpr std::uint32_t class_of(std::uint64_t w) noexcept {
    return static_cast<std::uint32_t>((w >> 40U) & 0xffU);
  }
  [[nodiscard]] static constexpr std::uint32_t units_of(std::uint64_t w) noexcept {
    return std::uint32_t{4} << class_of(w);
  }
  [[nodiscard]] static constexpr bool is_bitset(std::uint64_t w) noexcept {
    return (w & bitset_flag) != 0U;
  }

  // Smallest class whose array holds n slots.
  [[nodiscard]] static std::uint32_t array_class(std::uint32_t n) noexcept {
    std::uint32_t k = 0;
    while ((std::uint32_t{4} << k) < n)
      ++k;
    return k;
  }
  // A bitset when it is no larger than the array n slots need.
  [[nodiscard]] bool prefer_bitset(std::uint32_t n) const noexcept {
    return bitset_class_ <= array_class(n);
  }

  [[nodiscard]] const std::uint32_t* block(std::uint64_t w) const noexcept {
    return units_.data() + offset_of(w);
  }
  [[nodiscard]] std::uint32_t* block(std::uint64_t w) noexcept {
    return units_.data() + offset_of(w);
  }

  // A block (uninitialised) of the kind and class a set of n slots gets.
  std::uint64_t alloc_for(std::uint32_t n) {
    return prefer_bitset(n) ? alloc_class(bitset_class_, true) : alloc_class(array_class(n), false);
  }

  // A block from the free list of class k, else from the arena's tail (within
  // the reserved capacity, so it does not throw after reserve()).
  std::uint64_t alloc_class(std::uint32_t k, bool bitset) {
    std::uint64_t off = free_[k];
    if (off != none) {
      free_[k] = load_link(off);
    } else {
      off = units_.size();
      units_.resize(units_.size() + (std::size_t{4} << k));
    }
    ++blocks_;
    return off | (std::uint64_t{k} << 40U) | (bitset ? bitset_flag : 0U);
  }

  // As alloc_class, but only without allocating; `none` when that is impossible.
  std::uint64_t try_alloc_class(std::uint32_t k, bool bitset) noexcept {
    if (free_[k] == none && units_.size() + (std::size_t{4} << k) > units_.capacity()) return none;
    return alloc_class(k, bitset);  // cannot throw: free block or room in capacity
  }

  // Moves a set of n slots to an array block of its own class (smaller), if
  // that needs no allocation.
  void to_array(std::uint64_t& word, std::uint32_t n) noexcept {
    const std::uint64_t fresh = try_alloc_class(array_class(n), false);
    if (fresh == none) return;
    std::uint32_t* q = block(fresh);
    std::uint32_t i = 0;
    View v;
    view(word, n, v);
    v.for_each([&](std::uint32_t s) { q[i++] = s; });
    free_block(word);
    word = fresh;
  }

  std::uint64_t make_block(const std::uint32_t* sorted, std::uint32_t n) {
    const std::uint64_t w = alloc_for(n);
    std::uint32_t* q = block(w);
    if (is_bitset(w)) {
      std::fill_n(q, bitset_units_, 0U);
      for (std::uint32_t i = 0; i < n; ++i)
        q[sorted[i] / 32U] |= std::uint32_t{1} << (sorted[i] % 32U);
    } else {
      std::copy_n(sorted, n, q);
    }
    return w;
  }

  [[nodiscard]] std::uint64_t load_link(std::uint64_t off) const noexcept {
    return std::uint64_t{units_[off]} | (std::uint64_t{units_[off + 1U]} << 32U);
  }

  void free_block(std::uint64_t w) noexcept {
    const std::uint64_t off = offset_of(w);
    const std::uint32_t k = class_of(w);
    units_[off] = lo(free_[k]);
    units_[off + 1U] = hi(free_[k]);
    free_[k] = off;
    --blocks_;
  }

  std::vector<std::uint32_t> units_;
  std::array<std::uint64_t, 48> free_ = no_free_blocks();  // head of each class's free list
  std::size_t blocks_ = 0;
  bool word_form_ = true;
  std::uint32_t bitset_class_ = 0;  // 128 slots
  std::uint32_t bitset_units_ = 4;
};

}  // namespace promptcache::detail
