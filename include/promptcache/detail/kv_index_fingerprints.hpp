// promptcache: detail/kv_index_fingerprints.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The compact hash table behind the edge and block-name lookups of
// kv_index.hpp. Both map a 64-bit key to a 32-bit pool index whose element
// already stores the full key (a node row its path hash, a hold its block
// hash), so a slot need not repeat the key: it keeps a 32-bit fingerprint of
// the key's hash and the index (8 bytes), and a match is confirmed against
// the element. The slot of an entry follows from its fingerprint alone, so
// growing, shrinking and deleting never read the elements; the capacity is
// not a power of two (home = fingerprint * capacity / 2^32), so the load of a
// large table stays between 0.53 and 0.8 as it grows, instead of the 0.25 to
// 0.5 of power-of-two sizes.
// At such loads plain linear probing scans long runs for absent keys, so each
// run is kept sorted by home slot (then fingerprint), as in Robin Hood
// hashing: a lookup stops at the first entry that sorts after its key, and a
// deletion shifts back only the displaced entries that follow it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <utility>

#include "promptcache/detail/kv_index_table.hpp"

namespace promptcache::detail {

/// How full a KvFingerprintTable runs. The cost of an insert or a deletion
/// grows with the length of the runs it shifts (about 1 / (1 - load)^2 slots
/// for a linear-probing insert), so a table that can afford the bytes runs
/// at a lower load.
enum class KvTableLoad : std::uint8_t {
  compact,  ///< Load 2/5 to 4/5: grows by half above 4/5 (doubles below 4,096
            ///< slots), shrinks to 3/5 below 2/5.
  roomy,    ///< Load 1/16 to 1/4: doubles above 1/4 (quadruples below 4,096
            ///< slots), shrinks to 1/6 below 1/16.
};

/// Open-addressing table (ordered linear probing, backward-shift deletion, no
/// tombstones) of (32-bit fingerprint, 32-bit value) entries, 8 bytes each.
/// Several entries may share a fingerprint: lookups take a predicate that
/// confirms a candidate value. Values must not be kv_npos (it marks empty
/// slots). Its load bounds follow its KvTableLoad (compact unless set).
class KvFingerprintTable {
 public:
  /// One slot.
  struct Entry {
    std::uint32_t fp;     ///< Fingerprint of the key.
    std::uint32_t value;  ///< The mapped value; kv_npos marks an empty slot.
  };

  /// Where a probe ended: the confirmed value and its slot, or kv_npos and
  /// the slot where the key would be inserted.
  struct Probe {
    std::size_t pos;      ///< Slot index (valid until the table next changes).
    std::uint32_t value;  ///< The confirmed value, or kv_npos.
  };

  /// An empty table (compact load); owns no memory. O(1).
  KvFingerprintTable() noexcept = default;
  /// A deep copy (same capacity and load policy). O(capacity).
  KvFingerprintTable(const KvFingerprintTable& other)
      : slots_(other.cap_ == 0U ? nullptr : std::make_unique_for_overwrite<Entry[]>(other.cap_)),
        size_(other.size_),
        cap_(other.cap_),
        grow_above_(other.grow_above_),
        shrink_below_(other.shrink_below_),
        load_(other.load_) {
    if (cap_ != 0U) std::memcpy(slots_.get(), other.slots_.get(), cap_ * sizeof(Entry));
  }
  /// Takes over `other`'s slots; `other` is left empty. O(1).
  KvFingerprintTable(KvFingerprintTable&& other) noexcept
      : slots_(std::move(other.slots_)),
        size_(std::exchange(other.size_, 0U)),
        cap_(std::exchange(other.cap_, 0U)),
        grow_above_(std::exchange(other.grow_above_, 0U)),
        shrink_below_(std::exchange(other.shrink_below_, 0U)),
        load_(other.load_) {}
  /// Copy-and-swap assignment (strong guarantee). O(capacity of both).
  KvFingerprintTable& operator=(const KvFingerprintTable& other) {
    if (this != &other) {
      KvFingerprintTable copy(other);
      swap(copy);
    }
    return *this;
  }
  /// Takes over `other`'s slots; `other` is left empty. O(1).
  KvFingerprintTable& operator=(KvFingerprintTable&& other) noexcept {
    if (this != &other) {
      KvFingerprintTable taken(std::move(other));
      swap(taken);
    }
    return *this;
  }
  ~KvFingerprintTable() = default;

  /// Exchanges the contents (load policy included) with `other`. O(1).
  void swap(KvFingerprintTable& other) noexcept {
    using std::swap;
    swap(slots_, other.slots_);
    swap(size_, other.size_);
    swap(cap_, other.cap_);
    swap(grow_above_, other.grow_above_);
    swap(shrink_below_, other.shrink_below_);
    swap(load_, other.load_);
  }

  /// Sets the load bounds that later growth and shrinking follow; the slots
  /// are not touched (the next resize brings the load within them). O(1).
  void set_load(KvTableLoad load) noexcept {
    load_ = load;
    set_limits();
  }
  /// The load policy in force. O(1).
  [[nodiscard]] KvTableLoad load() const noexcept { return load_; }

  /// The fingerprint of a well-mixed 64-bit hash: its high half. O(1).
  [[nodiscard]] static constexpr std::uint32_t fingerprint(std::uint64_t hash) noexcept {
    return static_cast<std::uint32_t>(hash >> 32U);
  }

  /// Hints the CPU to load the first slot a lookup of `fp` reads. O(1).
  void prefetch(std::uint32_t fp) const noexcept { prefetcher()(fp); }

  /// prefetch() for many fingerprints in one loop: holds the slot array's
  /// address and size, so the loop need not re-read them from the table for
  /// each slot. Invalidated by any change to the table.
  class Prefetcher {
   public:
    /// Hints the CPU to load the home slot of `fp`. O(1).
    void operator()(std::uint32_t fp) const noexcept {
#if defined(__GNUC__) || defined(__clang__)
      // Integer arithmetic: an empty table (no array, size 0) prefetches
      // address 0, which is harmless, instead of branching.
      __builtin_prefetch(reinterpret_cast<const void*>(base_ + ((std::uint64_t{fp} * cap_) >> 32U) *
                                                                   sizeof(Entry)));
#else
      (void)fp;
#endif
    }

   private:
    friend class KvFingerprintTable;
    Prefetcher(std::uintptr_t base, std::uint64_t cap) noexcept : base_(base), cap_(cap) {}
    std::uintptr_t base_;
    std::uint64_t cap_;
  };
  /// A Prefetcher for the current slots. O(1).
  [[nodiscard]] Prefetcher prefetcher() const noexcept {
    return Prefetcher(reinterpret_cast<std::uintptr_t>(slots_.get()), cap_);
  }

  /// The first value stored under `fp`, unconfirmed, or kv_npos when no
  /// entry has that fingerprint (then no key with it is present). Lets a
  /// caller prefetch the element before confirming. O(1) expected.
  [[nodiscard]] std::uint32_t first(std::uint32_t fp) const noexcept {
    return first_slot(fp).value;
  }

  /// first(), with the slot where its value is (meaningless for kv_npos),
  /// for erase_hint. O(1) expected.
  [[nodiscard]] Probe first_slot(std::uint32_t fp) const noexcept {
    if (cap_ == 0U) return Probe{0, kv_npos};
    // Up to the end of the array (the query path's common case) the probe
    // needs no wrap-around state.
    const Entry* s = slots_.get();
    for (std::size_t i = home(fp); i < cap_; ++i) {
      const Entry e = s[i];
      if (e.value == kv_npos || e.fp == fp) return Probe{i, e.value};
      if (e.fp > fp && home(e.fp) <= i) return Probe{i, kv_npos};  // after(e, i, fp, false)
    }
    for (std::size_t i = 0;; ++i) {  // a run that wraps: the entries before home(fp)
      const Entry e = s[i];
      if (e.value == kv_npos || e.fp == fp) return Probe{i, e.value};
      if (after(e, i, fp, true)) return Probe{i, kv_npos};
    }
  }

  /// The value under `fp` for which is_key(value) holds, or kv_npos. O(1)
  /// expected (is_key runs on fingerprint matches only).
  template <class IsKey>
  [[nodiscard]] std::uint32_t find(std::uint32_t fp, IsKey&& is_key) const {
    return cap_ == 0U ? kv_npos : probe(fp, is_key).value;
  }

  /// Like find, also returning the slot; the table must have slots (any
  /// reserve_extra or insert made them). O(1) expected. Always inlined: a
  /// store runs it once per block (other compilers ignore the gnu:: attribute).
  template <class IsKey>
  [[nodiscard]] [[gnu::always_inline]] Probe probe(std::uint32_t fp, IsKey&& is_key) const {
    // As in first(): no wrap-around state until the probe passes the end.
    const Entry* s = slots_.get();
    for (std::size_t i = home(fp); i < cap_; ++i) {
      const Entry e = s[i];
      if (e.value == kv_npos) return Probe{i, kv_npos};
      if (e.fp == fp) {
        if (is_key(e.value)) return Probe{i, e.value};
      } else if (e.fp > fp && home(e.fp) <= i) {  // after(e, i, fp, false)
        return Probe{i, kv_npos};
      }
    }
    for (std::size_t i = 0;; ++i) {
      const Entry e = s[i];
      if (e.value == kv_npos) return Probe{i, kv_npos};
      if (e.fp == fp) {
        if (is_key(e.value)) return Probe{i, e.value};
      } else if (after(e, i, fp, true)) {
        return Probe{i, kv_npos};
      }
    }
  }

  /// Inserts (fp, value) at the empty slot of a probe that ended there,
  /// saving insert()'s second probe. The table must be unchanged since the
  /// probe and have room reserved (reserve_extra), so this cannot rehash.
  /// O(rest of the run): later entries of the run shift up by one slot.
  void insert_at(const Probe& p, std::uint32_t fp, std::uint32_t value) noexcept {
    put(p.pos, Entry{fp, value});
    ++size_;
  }

  /// Inserts (fp, value); the caller knows the key is absent. Amortized
  /// O(1); may rehash (invalidates probes only).
  void insert(std::uint32_t fp, std::uint32_t value) {
    reserve_extra(1);
    insert_reserved(fp, value);
  }

  /// Inserts (fp, value) into room made by reserve_extra (the key is
  /// absent), without insert()'s room check. O(1) expected.
  void insert_reserved(std::uint32_t fp, std::uint32_t value) noexcept {
    place(Entry{fp, value});
    ++size_;
  }

  /// Makes the next `extra` inserts rehash-free (so they cannot throw).
  /// Strong guarantee; std::length_error beyond 2^31 entries.
  void reserve_extra(std::size_t extra) {
    // The check is inline (it runs once per new node); growing is not.
    if (extra <= max_entries - size_ && !over_load(size_ + extra)) return;
    grow(extra);
  }

  /// True when reserve_extra(extra) would allocate nothing (and not throw).
  /// O(1).
  [[nodiscard]] bool fits_extra(std::size_t extra) const noexcept {
    return extra <= max_entries - size_ && !over_load(size_ + extra);
  }

  /// Removes the entry (fp, value) (value identifies it; fp finds its probe
  /// run); false when absent. Shifts back the displaced entries that follow
  /// it. Below the policy's lowest load the array shrinks (it is released
  /// when empty), unless `shrink` is false (then earlier reserve_extra
  /// guarantees still hold). Amortized O(1). Always inlined: a removal runs
  /// it once or twice per block.
  [[gnu::always_inline]] bool erase(std::uint32_t fp, std::uint32_t value,
                                    bool shrink = true) noexcept {
    if (cap_ == 0U) return false;
    const Entry* const s = slots_.get();
    std::size_t i = home(fp);
    for (bool wrapped = false;;) {
      const Entry& e = s[i];
      if (e.value == kv_npos) return false;
      if (e.value == value && e.fp == fp) break;
      if ((e.fp > fp || wrapped) && after(e, i, fp, wrapped)) return false;
      if (++i == cap_) {
        i = 0;
        wrapped = true;
      }
    }
    erase_slot(i, shrink);
    return true;
  }

  /// Removes the entry (fp, value), which must be present (and its value
  /// unique in the table): the probe only looks for the value, without
  /// erase()'s checks for the end of the run. Same shrinking as erase().
  /// Amortized O(1).
  [[gnu::always_inline]] void erase_present(std::uint32_t fp, std::uint32_t value,
                                            bool shrink = true) noexcept {
    // The entry sits in the run that holds its home slot, at or after home.
    const Entry* const s = slots_.get();
    std::size_t i = home(fp);
    while (s[i].value != value)
      i = next(i);
    erase_slot(i, shrink);
  }

  /// As erase(), but first tries slot `pos` (from an earlier first_slot()
  /// whose result may be outdated since: any slot index is accepted), which
  /// saves the probe when the entry is still there. Amortized O(1).
  [[gnu::always_inline]] bool erase_hint(std::size_t pos, std::uint32_t fp, std::uint32_t value,
                                         bool shrink = true) noexcept {
    if (pos < cap_ && slots_[pos].value == value && slots_[pos].fp == fp) {
      erase_slot(pos, shrink);
      return true;
    }
    return erase(fp, value, shrink);
  }

 private:
  // Empties slot `i` (in use), then shrinks as erase() does.
  [[gnu::always_inline]] void erase_slot(std::size_t i, bool shrink) noexcept {
    // Backward shift: the run is sorted, so the entries that may move into
    // the hole are exactly those up to the first one at its home slot.
    Entry* const s = slots_.get();
    for (std::size_t j = next(i);; j = next(j)) {
      const Entry& e = s[j];
      if (e.value == kv_npos || home(e.fp) == j) break;
      s[i] = e;
      i = j;
    }
    s[i].value = kv_npos;
    --size_;
    if (shrink && below_load()) shrink_to_load();
  }

  // True when `need` entries exceed the policy's highest load.
  [[nodiscard]] bool over_load(std::size_t need) const noexcept {
    return need > grow_above_;
  }

  // reserve_extra's slow path: checks the limit, then resizes.
  void grow(std::size_t extra) {
    if (extra > max_entries - size_) throw std::length_error("kv index table too large");
    const std::size_t need = size_ + extra;
    if (load_ == KvTableLoad::roomy) {
      // Below 32 KiB the bytes hardly matter but each rehash costs a pass,
      // so small arrays grow fourfold.
      const std::size_t grown = (cap_ < small_capacity ? 4U : 2U) * cap_;
      rehash(std::max({need * 4U + 1U, grown, min_capacity}));
      return;
    }
    // Small arrays double (rehashing is what costs there, not the bytes).
    const std::size_t grown = cap_ < small_capacity ? 2U * cap_ : cap_ + cap_ / 2U;
    rehash(std::max({need + need / 4U + 1U, grown, min_capacity}));
  }

 public:
  /// Shrinks the array if the load is below the policy's lowest (2/5, or
  /// 1/16 when roomy), to load 3/5 (1/6 when roomy); releases it when empty.
  /// Keeps the current array when a smaller one cannot be allocated.
  /// O(capacity).
  void shrink_to_load() noexcept {
    if (size_ == 0U) {
      clear();
      return;
    }
    if (cap_ <= min_capacity || !below_load()) return;
    const std::size_t target = load_ == KvTableLoad::roomy ? size_ * 6U : size_ * 5U / 3U;
    try {
      rehash(std::max(target + 1U, min_capacity));
    } catch (...) {  // shrinking is an optimisation
    }
  }

  /// Number of entries. O(1).
  [[nodiscard]] std::size_t size() const noexcept {
    return size_;
  }
  /// Number of slots. O(1).
  [[nodiscard]] std::size_t capacity() const noexcept {
    return cap_;
  }
  /// Bytes held by the slot array. O(1).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return cap_ * sizeof(Entry);
  }
  /// Drops every entry and releases the slot array. O(1).
  void clear() noexcept {
    slots_.reset();
    size_ = 0;
    cap_ = 0;
    set_limits();
  }

  /// Checks that every run is sorted by home slot, then fingerprint, that
  /// every entry is found by a lookup of its fingerprint, and that the count
  /// matches. O(capacity * run length); for tests.
  [[nodiscard]] bool check() const {
    const Entry* const s = slots_.get();
    std::size_t n = 0;
    for (std::size_t i = 0; i < cap_; ++i) {
      if (s[i].value == kv_npos) continue;
      ++n;
      const std::size_t j = next(i);
      if (s[j].value != kv_npos) {  // the next entry of the run sorts after this one
        // Home slots counted from slot i: the entry at i sits distance(home, i)
        // after its home, the one at j distance(home, j) after its own.
        const std::size_t back_i = distance(home(s[i].fp), i);
        const std::size_t back_j = distance(home(s[j].fp), j);
        if (back_j > back_i + 1U) return false;  // j's home lies before i's
        if (back_j == back_i + 1U && s[j].fp < s[i].fp) return false;
      }
      const std::uint32_t v = s[i].value;
      if (probe(s[i].fp, [&](std::uint32_t x) { return x == v; }).pos != i) return false;
    }
    return n == size_;
  }

 private:
  static constexpr std::size_t min_capacity = 16;
  static constexpr std::size_t small_capacity = 4096;  // 32 KiB
  static constexpr std::size_t max_entries = std::size_t{1} << 31U;

  // True when the load is under the policy's lower bound.
  [[nodiscard]] bool below_load() const noexcept {
    return size_ < shrink_below_;
  }

  // Turns the load bounds of the policy into entry counts for this capacity,
  // so that the checks of every insert and deletion are one comparison.
  void set_limits() noexcept {
    if (load_ == KvTableLoad::roomy) {  // size * 4 > cap grows, size * 16 < cap shrinks
      grow_above_ = cap_ / 4U;
      shrink_below_ = (cap_ + 15U) / 16U;
    } else {  // size * 5 > cap * 4 grows, size * 5 < cap * 2 shrinks
      grow_above_ = cap_ * 4U / 5U;
      shrink_below_ = (cap_ * 2U + 4U) / 5U;
    }
  }

  // Fixed-point scaling of the fingerprint onto [0, capacity): keeps entries
  // ordered by fingerprint and needs no power-of-two capacity.
  [[nodiscard]] std::size_t home(std::uint32_t fp) const noexcept {
    return static_cast<std::size_t>((std::uint64_t{fp} * cap_) >> 32U);
  }
  [[nodiscard]] std::size_t next(std::size_t i) const noexcept {
    return i + 1U == cap_ ? 0U : i + 1U;
  }
  [[nodiscard]] std::size_t distance(std::size_t from, std::size_t to) const noexcept {
    return to >= from ? to - from : to + cap_ - from;
  }

  // True when entry `e` at slot `i` sorts after a key with fingerprint `fp`
  // (e.fp != fp) whose probe reached `i`; `wrapped`: the probe passed the end
  // of the array. Runs are sorted by home slot counted from the run's start,
  // so an entry whose home lies past `i` came around the end and sorts first.
  [[nodiscard]] bool after(const Entry& e, std::size_t i, std::uint32_t fp,
                           bool wrapped) const noexcept {
    if (!wrapped) return e.fp > fp && home(e.fp) <= i;
    return e.fp > fp || home(e.fp) <= i;
  }

  // Writes `entry` at `i`, shifting the rest of the run up by one slot.
  void put(std::size_t i, Entry entry) noexcept {
    Entry* const s = slots_.get();
    while (s[i].value != kv_npos) {
      std::swap(entry, s[i]);
      i = next(i);
    }
    s[i] = entry;
  }

  void place(const Entry& entry) noexcept {
    put(probe(entry.fp, [](std::uint32_t) { return false; }).pos, entry);
  }

  // Homes are monotonic in the fingerprint and runs are sorted, so the table
  // read from the first entry at or after its home (skipping entries that
  // wrapped around the end) lists the entries in fingerprint order. Placed
  // in that order each entry goes to its new home or right after the
  // previous one: one pass, no probing. Entries that would run past the end
  // of the new array (only the last run) are placed by probing.
  void rehash(std::size_t new_capacity) {
    // Every byte 0xff: both fields kv_npos, so every slot is empty (memset is
    // far cheaper than filling entry by entry).
    std::unique_ptr<Entry[]> old = std::make_unique_for_overwrite<Entry[]>(new_capacity);
    std::memset(old.get(), 0xff, new_capacity * sizeof(Entry));
    old.swap(slots_);
    const std::size_t old_cap = cap_;
    cap_ = new_capacity;
    set_limits();
    std::size_t start = 0;  // entries before it came around the end
    while (start < old_cap && old[start].value != kv_npos &&
           old_home(old[start].fp, old_cap) > start)
      ++start;
    Entry* s = slots_.get();
    std::size_t at = 0;  // first slot the next entry may take
    const auto emit = [&](const Entry& e) {
      const std::size_t h = std::max(home(e.fp), at);
      if (h < cap_) {
        s[h] = e;
        at = h + 1U;
      } else {
        place(e);
      }
    };
    for (std::size_t i = start; i < old_cap; ++i)
      if (old[i].value != kv_npos) emit(old[i]);
    for (std::size_t i = 0; i < start; ++i)
      emit(old[i]);
  }

  [[nodiscard]] static std::size_t old_home(std::uint32_t fp, std::size_t cap) noexcept {
    return static_cast<std::size_t>((std::uint64_t{fp} * cap) >> 32U);
  }

  // The loops index a raw pointer taken once: in an unoptimized build, unique_ptr's
  // operator[] is a chain of calls per probe.
  std::unique_ptr<Entry[]> slots_;
  std::size_t size_ = 0;
  std::size_t cap_ = 0;
  std::size_t grow_above_ = 0;    // more entries than this exceed the highest load
  std::size_t shrink_below_ = 0;  // fewer entries than this are below the lowest load
  KvTableLoad load_ = KvTableLoad::compact;
};

}  // namespace promptcache::detail
