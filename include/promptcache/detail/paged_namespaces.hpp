// promptcache: detail/paged_namespaces.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The namespaces of a PagedPrefixCache (tenants, models, adapters): each has a slot
// holding its id, its block-hash seed and the index of its root node. Slots are
// reused after an erase; an id maps to its slot and a seed to the id that owns it,
// so no two namespaces ever publish the same block hashes.
//
// Also the default seeds: a namespace never configured hashes with no LoRA name and,
// except namespace 0, its id in decimal as the cache salt.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "promptcache/block_hash.hpp"

namespace promptcache::detail {

/// One namespace's slot.
struct PagedNsSlot {
  std::uint64_t id = 0;              ///< the namespace id
  std::uint64_t seed = 0;            ///< its block-hash seed
  std::uint32_t root = 0xFFFFFFFFU;  ///< its root node
  bool live = false;                 ///< false for a slot free for reuse
};

/// The namespace slots and the maps from ids and seeds to them.
class PagedNamespaces {
 public:
  /// No slot.
  static constexpr std::uint32_t npos = 0xFFFFFFFFU;
  /// Id to slot.
  using ns_map = std::unordered_map<std::uint64_t, std::uint32_t>;
  /// Seed to the id that owns it.
  using seed_map = std::unordered_map<std::uint64_t, std::uint64_t>;
  /// Whether take() can throw (only the maps' move assignments can).
  static constexpr bool nothrow_take =
      std::is_nothrow_move_assignable_v<ns_map> && std::is_nothrow_move_assignable_v<seed_map>;

  /// The cache salt of a namespace never configured (no LoRA name): none for 0, the id in
  /// decimal for any other, so that distinct namespaces never share block hashes.
  static std::string default_salt(std::uint64_t ns) {
    return ns == 0 ? std::string() : std::to_string(ns);
  }

  /// The seed of a namespace never configured.
  static std::uint64_t default_seed(std::uint64_t ns) {
    return block_hash_seed({}, default_salt(ns));
  }

  /// True when a cache salt with no LoRA name gives namespace `ns` the default seed of
  /// another id m (default_seed(m)): the empty salt is namespace 0's, and the decimal form
  /// std::to_string(m) (no sign, no leading zero) is m's for m != 0.
  static bool names_other_namespace(std::string_view salt, std::uint64_t ns) noexcept {
    if (salt.empty()) return ns != 0;
    if (salt.size() > 20 || salt[0] == '0') return false;
    std::uint64_t m = 0;
    for (const char ch : salt) {
      if (ch < '0' || ch > '9') return false;
      const auto d = static_cast<std::uint64_t>(ch - '0');
      if (m > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return false;
      m = m * 10 + d;
    }
    return m != ns;
  }

  /// The slot of `ns`, or npos. O(1) expected.
  [[nodiscard]] std::uint32_t find(std::uint64_t ns) const noexcept {
    const auto it = index_.find(ns);
    return it != index_.end() ? it->second : npos;
  }

  /// The slot of `ns`, or npos, checking first the slot remember() was given: an engine
  /// serving one model asks for the same namespace every time, and checking that slot is
  /// a load where the map is a hash and a probe. Only one live slot holds a given id.
  [[nodiscard]] std::uint32_t find_hinted(std::uint64_t ns) const noexcept {
    if (hint_ < slots_.size() && slots_[hint_].live && slots_[hint_].id == ns) return hint_;
    return find(ns);
  }
  /// Makes `slot` the one find_hinted() checks first.
  void remember(std::uint32_t slot) noexcept { hint_ = slot; }

  /// Slot `slot`.
  [[nodiscard]] PagedNsSlot& operator[](std::uint32_t slot) noexcept { return slots_[slot]; }
  /// Slot `slot`.
  [[nodiscard]] const PagedNsSlot& operator[](std::uint32_t slot) const noexcept {
    return slots_[slot];
  }
  /// Slots, live or free.
  [[nodiscard]] std::size_t slot_count() const noexcept { return slots_.size(); }
  /// Live namespaces.
  [[nodiscard]] std::size_t size() const noexcept { return index_.size(); }

  /// Throws std::invalid_argument if a namespace other than `ns` uses `seed`.
  void check_seed_free(std::uint64_t seed, std::uint64_t ns) const {
    const auto so = seeds_.find(seed);
    if (so != seeds_.end() && so->second != ns)
      throw std::invalid_argument("PagedPrefixCache: another namespace uses this block-hash seed");
  }

  /// True when `seed` is owned by `ns` and `ns` maps to `slot` (for the invariants).
  [[nodiscard]] bool indexed(std::uint32_t slot) const noexcept {
    const PagedNsSlot& s = slots_[slot];
    const auto it = index_.find(s.id);
    if (it == index_.end() || it->second != slot) return false;
    const auto so = seeds_.find(s.seed);
    return so != seeds_.end() && so->second == s.id;
  }

  /// Gives the namespace in `slot` the seed `seed`. Strong guarantee.
  void reseed(std::uint32_t slot, std::uint64_t seed) {
    PagedNsSlot& s = slots_[slot];
    seeds_.emplace(seed, s.id);  // may throw: nothing changed yet
    seeds_.erase(s.seed);
    s.seed = seed;
  }

  /// Maps `ns` and `seed` to a free slot, returned; the slot stays free until activate().
  /// Strong guarantee.
  std::uint32_t open(std::uint64_t ns, std::uint64_t seed) {
    std::uint32_t slot = 0;
    while (slot < slots_.size() && slots_[slot].live)
      ++slot;
    if (slot == slots_.size()) slots_.emplace_back();
    try {
      index_.emplace(ns, slot);
      try {
        seeds_.emplace(seed, ns);
      } catch (...) {
        index_.erase(ns);
        throw;
      }
    } catch (...) {
      if (slot + 1 == slots_.size() && !slots_[slot].live) slots_.pop_back();
      throw;
    }
    return slot;
  }
  /// Makes the slot open() gave live, with its root node.
  void activate(std::uint32_t slot, std::uint64_t ns, std::uint64_t seed,
                std::uint32_t root) noexcept {
    slots_[slot] = PagedNsSlot{ns, seed, root, true};
  }

  /// Forgets the id and the seed of the namespace in `slot` and frees the slot for reuse.
  void close(std::uint32_t slot) noexcept {
    PagedNsSlot& s = slots_[slot];
    index_.erase(s.id);
    seeds_.erase(s.seed);
    s = PagedNsSlot{};
  }
  /// Gives back `slot` (closed) if it is the last one.
  void pop_if_last(std::uint32_t slot) noexcept {
    if (slot + 1 == slots_.size()) slots_.pop_back();
  }

  /// Heap bytes held (the maps estimated at four words per entry).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return slots_.capacity() * sizeof(PagedNsSlot) +
           (index_.size() + seeds_.size()) * 4 * sizeof(std::uint64_t);
  }

  /// Takes `other`'s namespaces, leaving it none.
  void take(PagedNamespaces& other) noexcept(nothrow_take) {
    slots_ = std::exchange(other.slots_, {});
    index_ = std::exchange(other.index_, {});
    seeds_ = std::exchange(other.seeds_, {});
    hint_ = std::exchange(other.hint_, npos);
  }

 private:
  std::vector<PagedNsSlot> slots_;
  ns_map index_;
  seed_map seeds_;
  std::uint32_t hint_ = npos;  // the slot match() used last (checked before use)
};

}  // namespace promptcache::detail
