// detail::KvHoldStore, the per-worker hold trees of KvIndex: sibling lists in
// which only the first child stores its parent, checked against a model
// (parent per hold) through random allocations and releases, and the tree
// walks (subtree drop, pre-order visit, chains) built on them.
#include <promptcache/detail/kv_index_holds.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include "catch.hpp"

namespace {

using promptcache::detail::kv_hold_parent_bit;
using promptcache::detail::kv_npos;
using promptcache::detail::KvHoldStore;

// Children of `h` in list order.
std::vector<std::uint32_t> children(const KvHoldStore& s, std::uint32_t h) {
  std::vector<std::uint32_t> out;
  for (std::uint32_t c = s[h].first_child; c != kv_npos; c = s[c].next)
    out.push_back(c);
  return out;
}

// Every live hold's parent and sibling links against the model.
void check_tree(const KvHoldStore& s, const std::map<std::uint32_t, std::uint32_t>& parent_of) {
  std::map<std::uint32_t, std::set<std::uint32_t>> kids;
  for (const auto& [h, p] : parent_of) {
    REQUIRE_FALSE(s.is_free(h));
    REQUIRE(s.parent(h) == p);
    REQUIRE(s[h].block_hash == h * 10U);
    if (p != kv_npos) kids[p].insert(h);
  }
  for (const auto& [h, p] : parent_of) {
    const auto list = children(s, h);
    REQUIRE(std::set<std::uint32_t>(list.begin(), list.end()) == kids[h]);
    std::uint32_t expect = h | kv_hold_parent_bit;  // first child: the parent
    for (const std::uint32_t c : list) {
      REQUIRE(s[c].link == expect);
      expect = c;  // later ones: the previous sibling
    }
  }
  REQUIRE(s.live() == parent_of.size());
}

}  // namespace

TEST_CASE("hold store: parents and sibling links through random changes", "[kv_index]") {
  std::mt19937_64 rng(99);
  KvHoldStore s;
  s.reserve_extra(1);
  const std::uint32_t root = s.allocate(0, 0, kv_npos);  // a sentinel
  CHECK(s.parent(root) == kv_npos);
  CHECK(s[root].link == kv_npos);
  std::map<std::uint32_t, std::uint32_t> parent_of{{root, kv_npos}};
  for (int step = 0; step < 4000; ++step) {
    std::vector<std::uint32_t> live;
    for (const auto& kv : parent_of)
      live.push_back(kv.first);
    if (rng() % 3U != 0U || live.size() == 1U) {
      // Mostly shallow, wide trees: many siblings per parent.
      const std::uint32_t p = live[rng() % std::min<std::size_t>(live.size(), 8U)];
      s.reserve_extra(1);
      std::uint32_t h;
      if (step % 2 == 0) {
        h = s.allocate(0, 1, p);
      } else {  // the same through the parent's element, as a chain's store does
        const KvHoldStore::Placed x = s.allocate_child(0, 1, p, s[p]);
        REQUIRE(x.hold == &s[x.index]);
        h = x.index;
      }
      s[h].block_hash = h * 10U;
      parent_of[h] = p;
    } else {  // release a childless hold (first, middle or last sibling)
      std::vector<std::uint32_t> leaves;
      for (const std::uint32_t h : live)
        if (h != root && s[h].first_child == kv_npos) leaves.push_back(h);
      const std::uint32_t h = leaves[rng() % leaves.size()];
      if (step % 2 == 0)
        s.release(h);
      else
        s.release(h, s[h]);
      REQUIRE(s.is_free(h));
      REQUIRE(KvHoldStore::is_free(s[h]));
      parent_of.erase(h);
    }
    if (step % 200 == 0) {
      check_tree(s, parent_of);
      REQUIRE(s.check_pool());
    }
  }
  check_tree(s, parent_of);
  s[root].block_hash = 0;

  // Pre-order visit: parents before children, every hold below the root once.
  std::vector<std::uint32_t> seen;
  promptcache::detail::kv_for_each_hold_below(s, root, [&](std::uint32_t h) {
    if (parent_of[h] != root)
      REQUIRE(std::find(seen.begin(), seen.end(), parent_of[h]) != seen.end());
    seen.push_back(h);
  });
  CHECK(seen.size() == parent_of.size() - 1U);

  // Chains: each starts below the parent it is given and follows first children.
  std::size_t stepped = 0;
  std::uint32_t prev = kv_npos;
  promptcache::detail::kv_for_each_hold_chain(
      s, root,
      [&](std::uint32_t h, std::uint32_t p) {
        REQUIRE(parent_of[h] == p);
        prev = p;
      },
      [&](std::uint32_t h) {
        REQUIRE(parent_of[h] == prev);
        prev = h;
        ++stepped;
      });
  CHECK(stepped == parent_of.size() - 1U);

  // Dropping the root's subtree releases every hold, leaves first.
  const std::size_t n =
      promptcache::detail::kv_drop_hold_subtree(s, root, [&](std::uint32_t h, bool last) {
        REQUIRE(s[h].first_child == kv_npos);
        REQUIRE(last == (h == root));
        s.release(h);
      });
  CHECK(n == parent_of.size());
  CHECK(s.live() == 0U);
  CHECK(s.memory_bytes() == 0U);  // released with the last hold
}

TEST_CASE("hold store: limits", "[kv_index]") {
  KvHoldStore s;
  // Indices must leave the link's flag bit free: 2^31 - 2 holds at most.
  REQUIRE_THROWS_AS(s.reserve_extra(std::size_t{kv_hold_parent_bit}), std::length_error);
  REQUIRE_THROWS_AS(s.reserve_extra(std::numeric_limits<std::size_t>::max()), std::length_error);
  CHECK(s.memory_bytes() == 0U);
  s.reserve_extra(2);
  const std::uint32_t a = s.allocate(1, 0, kv_npos);
  const std::uint32_t b = s.allocate(2, 5, a);
  CHECK(s.parent(b) == a);
  CHECK(s[a].first_child == b);
  s.release(b);
  CHECK(s[a].first_child == kv_npos);
  CHECK(s.live() == 1U);
}
