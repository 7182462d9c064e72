// detail::KvHolderSets, the holder sets of KvIndex's tree nodes, against a
// model (std::set per node): every insert / erase / replace and width change
// through the word form and the sparse form's inline, sorted-array and bitset
// encodings, and the switches between the two forms, checked by contents,
// membership and set difference.
#include <promptcache/detail/kv_index_holders.hpp>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include "catch.hpp"

namespace {

using promptcache::detail::KvHolderSets;

struct Set {
  std::uint64_t word = KvHolderSets::empty_word;
  std::set<std::uint32_t> model;
};

std::vector<std::uint32_t> contents(const KvHolderSets& sets, const Set& s) {
  KvHolderSets::View v;
  sets.view(s.word, static_cast<std::uint32_t>(s.model.size()), v);
  std::vector<std::uint32_t> out;
  v.for_each([&](std::uint32_t slot) { out.push_back(slot); });
  return out;
}

// KvHolderSets::check over the sets of `all`, optionally with the set at
// `twice` passed twice and the one at `skip` left out.
bool arena_ok(const KvHolderSets& sets, const std::vector<Set>& all, std::size_t twice = ~0U,
              std::size_t skip = ~0U) {
  return sets.check([&](const auto& f) {
    for (std::size_t i = 0; i < all.size(); ++i) {
      const auto n = static_cast<std::uint32_t>(all[i].model.size());
      if (i != skip) f(all[i].word, n);
      if (i == twice) f(all[i].word, n);
    }
  });
}

void check(const KvHolderSets& sets, const std::vector<Set>& all, std::uint32_t width) {
  REQUIRE(arena_ok(sets, all));
  for (const Set& s : all) {
    const auto n = static_cast<std::uint32_t>(s.model.size());
    REQUIRE(contents(sets, s) == std::vector<std::uint32_t>(s.model.begin(), s.model.end()));
    for (std::uint32_t slot = 0; slot < width; slot += 7)
      REQUIRE(sets.contains(s.word, n, slot) == (s.model.count(slot) != 0U));
  }
  // Differences between every pair, as find_matches takes them.
  for (const Set& a : all)
    for (const Set& b : all) {
      KvHolderSets::View va;
      KvHolderSets::View vb;
      sets.view(a.word, static_cast<std::uint32_t>(a.model.size()), va);
      sets.view(b.word, static_cast<std::uint32_t>(b.model.size()), vb);
      std::vector<std::uint32_t> got;
      va.for_each_missing(vb, [&](std::uint32_t slot) { got.push_back(slot); });
      std::vector<std::uint32_t> want;
      std::set_difference(a.model.begin(), a.model.end(), b.model.begin(), b.model.end(),
                          std::back_inserter(want));
      REQUIRE(got == want);
    }
}

// Switches every set to the sparse form with the width for `slots`, as
// KvNodeStore does when a slot of 64 or more appears.
void to_sparse(KvHolderSets& sets, std::vector<Set>& all, std::size_t slots) {
  const std::size_t k = KvHolderSets::bitset_class_for(slots);
  std::size_t units = 0;
  for (const Set& s : all)
    units += KvHolderSets::sparse_units(static_cast<std::uint32_t>(s.model.size()), k);
  sets.reserve_units(units);
  sets.begin_sparse(k);
  for (Set& s : all)
    sets.to_sparse(s.word, static_cast<std::uint32_t>(s.model.size()));
}

// Switches every set back to the word form (all holders below 64).
void to_word(KvHolderSets& sets, std::vector<Set>& all) {
  for (Set& s : all)
    sets.to_word(s.word, static_cast<std::uint32_t>(s.model.size()));
  sets.end_word_form();
}

// Moves every bitset to the width for `slots`, as KvNodeStore::fit_slots does.
void set_width(KvHolderSets& sets, std::vector<Set>& all, std::size_t slots) {
  const std::size_t k = KvHolderSets::bitset_class_for(slots);
  std::size_t bitsets = 0;
  for (const Set& s : all)
    bitsets +=
        KvHolderSets::is_bitset_set(s.word, static_cast<std::uint32_t>(s.model.size())) ? 1U : 0U;
  sets.reserve_rewidth(bitsets, k);
  for (Set& s : all)
    sets.rewidth(s.word, static_cast<std::uint32_t>(s.model.size()), k);
  sets.end_rewidth(k);
}

}  // namespace

TEST_CASE("holder sets: the form follows the size and the width", "[kv_index]") {
  KvHolderSets sets;
  std::vector<Set> all(1);
  to_sparse(sets, all, 128);
  REQUIRE_FALSE(sets.word_form());
  Set& s = all[0];
  auto add = [&](std::uint32_t slot) {
    sets.reserve(1);
    sets.insert(s.word, static_cast<std::uint32_t>(s.model.size()), slot);
    s.model.insert(slot);
  };
  auto drop = [&](std::uint32_t slot) {
    sets.erase(s.word, static_cast<std::uint32_t>(s.model.size()), slot);
    s.model.erase(slot);
  };
  // Up to two holders live in the word: no arena at all.
  add(9);
  add(3);
  CHECK(sets.blocks() == 0U);
  check(sets, all, 200);
  // Up to 128 slots a bitset (16 bytes) is never larger than an array.
  add(100);
  CHECK(sets.blocks() == 1U);
  CHECK(KvHolderSets::is_bitset_set(s.word, 3));
  check(sets, all, 200);
  drop(100);
  CHECK(sets.blocks() == 0U);
  CHECK(sets.memory_bytes() == 0U);  // released with the last spilled set
  // With 4096 slots a bitset takes 512 bytes: a few holders get a sorted array.
  set_width(sets, all, 4096);
  for (std::uint32_t slot : {4000U, 17U, 2500U, 600U})
    add(slot);
  CHECK_FALSE(KvHolderSets::is_bitset_set(s.word, 6));
  check(sets, all, 4096);
  // It becomes a bitset once the array would be as large (128 holders).
  for (std::uint32_t slot = 1000; s.model.size() < 128; slot += 13)
    add(slot);
  CHECK(KvHolderSets::is_bitset_set(s.word, 128));
  check(sets, all, 4096);
  // ... and an array again when it has shrunk to a quarter of that.
  while (s.model.size() > 32)
    drop(*s.model.rbegin());
  CHECK_FALSE(KvHolderSets::is_bitset_set(s.word, 32));
  check(sets, all, 4096);
  while (s.model.size() > 2)
    drop(*s.model.begin());
  CHECK(sets.blocks() == 0U);
  check(sets, all, 4096);
}

TEST_CASE("holder sets match a model under random changes", "[kv_index]") {
  std::mt19937_64 rng(5);
  auto pick = [&](std::uint64_t n) {
    return static_cast<std::uint32_t>(std::uniform_int_distribution<std::uint64_t>(0, n - 1)(rng));
  };
  KvHolderSets sets;
  std::vector<Set> all(12);
  to_sparse(sets, all, 65);
  std::uint32_t width = 64;
  for (int step = 0; step < 20000; ++step) {
    Set& s = all[pick(all.size())];
    const auto n = static_cast<std::uint32_t>(s.model.size());
    const std::uint32_t roll = pick(100);
    // Some sets stay sparse, some grow dense (a system prompt's blocks).
    const std::uint32_t range = &s - all.data() < 4 ? width : std::min<std::uint32_t>(width, 40);
    if (roll < 55) {
      const std::uint32_t slot = pick(range);
      if (s.model.count(slot) == 0U) {
        sets.reserve(1);
        sets.insert(s.word, n, slot);
        s.model.insert(slot);
      }
    } else if (roll < 95) {
      if (n > 0) {
        auto it = s.model.begin();
        std::advance(it, pick(n));
        const std::uint32_t slot = *it;
        sets.erase(s.word, n, slot, pick(4) != 0);
        s.model.erase(slot);
      }
    } else if (roll < 99) {
      if (n > 0) {
        const std::uint32_t to = pick(range);
        if (s.model.count(to) == 0U) {
          const std::uint32_t from = *s.model.begin();
          sets.replace(s.word, n, from, to);
          s.model.erase(from);
          s.model.insert(to);
        }
      }
    } else {
      // Widen, or narrow to the highest slot in use.
      std::uint32_t top = 0;
      for (const Set& x : all)
        if (!x.model.empty()) top = std::max(top, *x.model.rbegin() + 1U);
      width = pick(2) == 0 ? std::min<std::uint32_t>(width * 2U, 2048) : std::max(top, 1U);
      set_width(sets, all, width);
      width = std::uint32_t{128} << KvHolderSets::bitset_class_for(width);
    }
    if (step % 97 == 0) check(sets, all, width);
  }
  check(sets, all, width);
  // The arena check sees a block claimed twice, or a live one left out.
  std::size_t spilled = all.size();
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i].model.size() > KvHolderSets::inline_max) spilled = i;
  REQUIRE(spilled < all.size());
  CHECK_FALSE(arena_ok(sets, all, spilled));
  CHECK_FALSE(arena_ok(sets, all, ~std::size_t{0}, spilled));
  for (Set& s : all)
    while (!s.model.empty()) {
      sets.erase(s.word, static_cast<std::uint32_t>(s.model.size()), *s.model.begin());
      s.model.erase(s.model.begin());
    }
  CHECK(sets.blocks() == 0U);
  CHECK(sets.memory_bytes() == 0U);
}

TEST_CASE("holder sets: the word form is the bitset of the holders", "[kv_index]") {
  KvHolderSets sets;
  REQUIRE(sets.word_form());
  std::vector<Set> all(3);
  auto add = [&](Set& s, std::uint32_t slot) {
    sets.reserve(1);
    sets.insert(s.word, static_cast<std::uint32_t>(s.model.size()), slot);
    s.model.insert(slot);
  };
  for (std::uint32_t slot : {0U, 63U, 5U, 31U, 32U})
    add(all[0], slot);
  add(all[1], 63);
  CHECK(all[0].word ==
        ((std::uint64_t{1} << 0U) | (std::uint64_t{1} << 63U) | (std::uint64_t{1} << 5U) |
         (std::uint64_t{1} << 31U) | (std::uint64_t{1} << 32U)));
  CHECK(all[2].word == KvHolderSets::empty_word);
  CHECK(sets.blocks() == 0U);
  CHECK(sets.memory_bytes() == 0U);  // no arena, whatever the sizes
  check(sets, all, 64);
  sets.replace(all[0].word, 5, 31, 40);
  all[0].model.erase(31);
  all[0].model.insert(40);
  sets.erase(all[0].word, 5, 0);
  all[0].model.erase(0);
  check(sets, all, 64);
  CHECK(sets.memory_bytes() == 0U);
}

TEST_CASE("holder sets switch between the word and the sparse form", "[kv_index]") {
  std::mt19937_64 rng(11);
  KvHolderSets sets;
  // Sets of every size: empty, in the holder word (1, 2), arrays and bitsets.
  std::vector<Set> all(9);
  const std::size_t sizes[] = {0, 1, 2, 3, 4, 9, 30, 63, 64};
  for (std::size_t i = 0; i < all.size(); ++i) {
    std::vector<std::uint32_t> slots(64);
    for (std::uint32_t s = 0; s < 64; ++s)
      slots[s] = s;
    std::shuffle(slots.begin(), slots.end(), rng);
    for (std::size_t j = 0; j < sizes[i]; ++j) {
      sets.insert(all[i].word, static_cast<std::uint32_t>(all[i].model.size()), slots[j]);
      all[i].model.insert(slots[j]);
    }
  }
  check(sets, all, 64);
  for (const std::size_t width : {65U, 4096U}) {
    to_sparse(sets, all, width);
    CHECK_FALSE(sets.word_form());
    check(sets, all, 64);
    // Sets of three or more holders are spilled (bitsets up to 128 slots,
    // arrays of up to 64 holders at 4,096 slots).
    CHECK(sets.blocks() == 6U);
    CHECK(KvHolderSets::is_bitset_set(all[3].word, 3) == (width == 65U));
    CHECK(KvHolderSets::is_bitset_set(all[8].word, 64) == (width == 65U));
    // A holder of 64 or more can join now.
    sets.reserve(1);
    sets.insert(all[4].word, 4, 100);
    all[4].model.insert(100);
    check(sets, all, 128);
    sets.erase(all[4].word, 5, 100);
    all[4].model.erase(100);
    to_word(sets, all);
    CHECK(sets.word_form());
    CHECK(sets.blocks() == 0U);
    CHECK(sets.memory_bytes() == 0U);  // the arena went with the last spilled set
    check(sets, all, 64);
  }
}

TEST_CASE("holder sets: a failed switch to the sparse form changes nothing", "[kv_index]") {
  KvHolderSets sets;
  std::vector<Set> all(1);
  for (std::uint32_t s = 0; s < 10; ++s) {
    sets.insert(all[0].word, s, s * 6U);
    all[0].model.insert(s * 6U);
  }
  const std::uint64_t before = all[0].word;
  // More arena units than 40-bit offsets address: refused before any change.
  CHECK_THROWS_AS(sets.reserve_units(std::size_t{1} << 41U), std::length_error);
  CHECK(sets.word_form());
  CHECK(all[0].word == before);
  CHECK(sets.memory_bytes() == 0U);
  check(sets, all, 64);
}
