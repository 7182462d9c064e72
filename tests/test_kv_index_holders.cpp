// detail::KvHolderSets, the holder sets of KvIndex's tree nodes, against a
// model (std::set per node): every insert / erase / replace and width change
// through the inline, sorted-array and bitset forms, checked by contents,
// membership and set difference.
#include <promptcache/detail/kv_index_holders.hpp>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <random>
#include <set>
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

void check(const KvHolderSets& sets, const std::vector<Set>& all, std::uint32_t width) {
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
  for (Set& s : all)
    while (!s.model.empty()) {
      sets.erase(s.word, static_cast<std::uint32_t>(s.model.size()), *s.model.begin());
      s.model.erase(s.model.begin());
    }
  CHECK(sets.blocks() == 0U);
  CHECK(sets.memory_bytes() == 0U);
}
