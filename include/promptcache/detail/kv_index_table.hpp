// promptcache: detail/kv_index_table.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The flat hash table behind kv_index.hpp. The index does two lookups per
// block operation (tree edge, worker's block name), so both live in one
// open-addressing table type with 16-byte entries: no allocation per insert,
// one cache line per probe in the common case, and prefetchable slots.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

namespace promptcache::detail {

/// "No index" marker for the 32-bit slot / node / hold indices of the index.
inline constexpr std::uint32_t kv_npos = std::numeric_limits<std::uint32_t>::max();

/// Murmur3's 64-bit finalizer: a bijection on 64-bit values, so distinct
/// inputs never collide (the index relies on this for its path hashes).
[[nodiscard]] constexpr std::uint64_t kv_mix64(std::uint64_t k) noexcept {
  k ^= k >> 33U;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33U;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33U;
  return k;
}

/// A cheap, well-mixed hash of a 64-bit key (folded multiply: the high and low
/// halves of the 128-bit product, xored), for hash-table slots. Unlike
/// kv_mix64 it is not a bijection, so it must not be used for path hashes.
[[nodiscard]] constexpr std::uint64_t kv_fold_hash(std::uint64_t k) noexcept {
  constexpr std::uint64_t c = 0x9e3779b97f4a7c15ULL;
#if defined(__SIZEOF_INT128__)
  __extension__ using u128 = unsigned __int128;
  const u128 p = static_cast<u128>(k) * c;
  return static_cast<std::uint64_t>(p) ^ static_cast<std::uint64_t>(p >> 64U);
#else
  return kv_mix64(k ^ c);
#endif
}

/// Open-addressing hash table (linear probing, backward-shift deletion, no
/// tombstones) mapping a (64-bit key, 32-bit tag) pair to a 32-bit value.
/// `Hash::hash(key, tag)` gives the 64-bit hash; the table stores no hash, so it
/// must be cheap. Values must not be kv_npos (it marks empty slots). Capacity is
/// a power of two, grown at load 1/2 and shrunk below load 1/8, so memory follows
/// the live entries.
template <class Hash>
class KvPackedTable {
 public:
  /// One slot: 16 bytes.
  struct Entry {
    std::uint64_t key;    ///< First half of the lookup key.
    std::uint32_t tag;    ///< Second half of the lookup key.
    std::uint32_t value;  ///< The mapped value; kv_npos marks an empty slot.
  };

  /// Where a probe for a key ended: its slot and value when present, else
  /// kv_npos and the empty slot an insert would fill.
  struct Probe {
    std::size_t pos;      ///< Slot index (valid until the table next changes).
    std::uint32_t value;  ///< The mapped value, or kv_npos when absent.
  };

  /// Hash::hash(key, tag), for the *_hashed calls (a caller that prefetches
  /// and then probes computes the hash once). O(1).
  [[nodiscard]] static constexpr std::uint64_t hash_of(std::uint64_t key,
                                                       std::uint32_t tag) noexcept {
    return Hash::hash(key, tag);
  }

  /// Like prefetch(key, tag) with `hash` = hash_of(key, tag). O(1).
  void prefetch_hashed(std::uint64_t hash) const noexcept {
    if (slots_.empty()) return;
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(&slots_[static_cast<std::size_t>(hash) & mask_]);
#else
    (void)hash;
#endif
  }

  /// Probes for (key, tag) with `hash` = hash_of(key, tag); the table must
  /// have slots (any reserve_extra or insert made them). O(1) expected.
  [[nodiscard]] Probe probe_hashed(std::uint64_t hash, std::uint64_t key,
                                   std::uint32_t tag) const noexcept {
    std::size_t i = static_cast<std::size_t>(hash) & mask_;
    for (;;) {
      const Entry& e = slots_[i];
      if (e.value == kv_npos || (e.key == key && e.tag == tag)) return Probe{i, e.value};
      i = (i + 1U) & mask_;
    }
  }

  /// Like find(key, tag) with `hash` = hash_of(key, tag). O(1) expected.
  [[nodiscard]] std::uint32_t find_hashed(std::uint64_t hash, std::uint64_t key,
                                          std::uint32_t tag) const noexcept {
    return slots_.empty() ? kv_npos : probe_hashed(hash, key, tag).value;
  }

  /// Inserts (key, tag) -> value at the empty slot of a probe that found it
  /// absent, saving insert()'s second probe. The table must be unchanged since
  /// the probe and have room reserved (reserve_extra), so this cannot rehash.
  void insert_at(const Probe& p, std::uint64_t key, std::uint32_t tag,
                 std::uint32_t value) noexcept {
    slots_[p.pos] = Entry{key, tag, value};
    ++size_;
  }

  /// The value stored for (key, tag), or kv_npos. O(1) expected.
  [[nodiscard]] std::uint32_t find(std::uint64_t key, std::uint32_t tag) const noexcept {
    if (slots_.empty()) return kv_npos;
    std::size_t i = static_cast<std::size_t>(Hash::hash(key, tag)) & mask_;
    for (;;) {
      const Entry& e = slots_[i];
      if (e.value == kv_npos) return kv_npos;
      if (e.key == key && e.tag == tag) return e.value;
      i = (i + 1U) & mask_;
    }
  }

  /// Hints the CPU to load the first slot that find(key, tag) will read. O(1).
  void prefetch(std::uint64_t key, std::uint32_t tag) const noexcept {
    if (slots_.empty()) return;
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(&slots_[static_cast<std::size_t>(Hash::hash(key, tag)) & mask_]);
#endif
  }

  /// Inserts (key, tag) -> value; the pair must not be present. Amortized O(1);
  /// may rehash (invalidates nothing outside the table).
  void insert(std::uint64_t key, std::uint32_t tag, std::uint32_t value) {
    if ((size_ + 1U) * 2U > slots_.size()) rehash(slots_.empty() ? 16U : slots_.size() * 2U);
    place(Entry{key, tag, value});
    ++size_;
  }

  /// Replaces the value of a present (key, tag); false when absent. O(1) expected.
  bool update(std::uint64_t key, std::uint32_t tag, std::uint32_t value) noexcept {
    if (slots_.empty()) return false;
    std::size_t i = static_cast<std::size_t>(Hash::hash(key, tag)) & mask_;
    for (;;) {
      Entry& e = slots_[i];
      if (e.value == kv_npos) return false;
      if (e.key == key && e.tag == tag) {
        e.value = value;
        return true;
      }
      i = (i + 1U) & mask_;
    }
  }

  /// Makes the next `extra` inserts rehash-free (so they cannot throw).
  /// Strong guarantee; std::length_error beyond 2^39 entries.
  void reserve_extra(std::size_t extra) {
    if (extra > max_entries - size_) throw std::length_error("kv index table too large");
    const std::size_t need = (size_ + extra) * 2U;
    if (need <= slots_.size()) return;
    std::size_t cap = slots_.empty() ? 16U : slots_.size();
    while (cap < need)
      cap *= 2U;
    rehash(cap);
  }

  /// Removes (key, tag); returns false when it was absent. Amortized O(1).
  /// Below load 1/8 the array shrinks, unless `shrink` is false (then earlier
  /// reserve_extra guarantees still hold).
  bool erase(std::uint64_t key, std::uint32_t tag, bool shrink = true) noexcept {
    return erase_hashed(Hash::hash(key, tag), key, tag, shrink);
  }

  /// Like erase(key, tag, shrink) with `hash` = hash_of(key, tag).
  bool erase_hashed(std::uint64_t hash, std::uint64_t key, std::uint32_t tag,
                    bool shrink = true) noexcept {
    if (slots_.empty()) return false;
    std::size_t i = static_cast<std::size_t>(hash) & mask_;
    for (;;) {
      const Entry& e = slots_[i];
      if (e.value == kv_npos) return false;
      if (e.key == key && e.tag == tag) break;
      i = (i + 1U) & mask_;
    }
    // Backward shift: pull later entries of the probe run into the hole when
    // the hole lies between their home slot and their current slot.
    std::size_t j = i;
    for (;;) {
      j = (j + 1U) & mask_;
      const Entry& e = slots_[j];
      if (e.value == kv_npos) break;
      const std::size_t home = static_cast<std::size_t>(Hash::hash(e.key, e.tag)) & mask_;
      if (((j - home) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = e;
        i = j;
      }
    }
    slots_[i].value = kv_npos;
    --size_;
    // Load below 1/8 of a capacity above 16 (mask_ is the capacity - 1).
    if (shrink && mask_ >= 16U && size_ * 8U <= mask_) shrink_noexcept();
    return true;
  }

  /// Shrinks the slot array as erase would have (halving while the load is
  /// below 1/8; released when empty). Keeps the current array when a smaller
  /// one cannot be allocated. O(capacity).
  void shrink_to_load() noexcept {
    if (size_ == 0U) {
      clear();
      return;
    }
    while (slots_.size() > 16U && size_ * 8U < slots_.size()) {
      const std::size_t before = slots_.size();
      shrink_noexcept();
      if (slots_.size() == before) return;
    }
  }

  /// Number of entries. O(1).
  [[nodiscard]] std::size_t size() const noexcept {
    return size_;
  }
  /// Bytes held by the slot array. O(1).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return slots_.capacity() * sizeof(Entry);
  }
  /// Drops every entry and releases the slot array. O(capacity).
  void clear() noexcept {
    std::vector<Entry>().swap(slots_);
    size_ = 0;
    mask_ = 0;
  }

 private:
  void place(const Entry& entry) noexcept {
    std::size_t i = static_cast<std::size_t>(Hash::hash(entry.key, entry.tag)) & mask_;
    while (slots_[i].value != kv_npos)
      i = (i + 1U) & mask_;
    slots_[i] = entry;
  }

  static constexpr std::size_t max_entries = std::size_t{1} << 39U;  // at load 1/2

  void rehash(std::size_t new_capacity) {
    if (new_capacity > 2U * max_entries) throw std::length_error("kv index table too large");
    std::vector<Entry> old(new_capacity, Entry{0, 0, kv_npos});
    old.swap(slots_);
    mask_ = new_capacity - 1U;
    for (const Entry& e : old)
      if (e.value != kv_npos) place(e);
  }

  // Shrinking is an optimisation: when the smaller array cannot be allocated
  // the table keeps its current one, so erase stays noexcept.
  void shrink_noexcept() noexcept {
    try {
      rehash(slots_.size() / 2U);
    } catch (...) {
    }
  }

  std::vector<Entry> slots_;
  std::size_t size_ = 0;
  std::size_t mask_ = 0;
};

}  // namespace promptcache::detail
