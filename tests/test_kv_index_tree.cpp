// detail::KvTree::walk, the descent KvIndex's queries and Stored events use:
// it tries row n + 1 as the child of row n before probing the edge table, so
// these tests lay out rows so that guess hits, misses on a row owned by
// another parent, misses on a free row whose stale path hash matches, and
// misses past the last row, follow chains across a row page boundary, and
// compare every walk with a descent by find_child on a randomly churned tree.
#include <promptcache/detail/kv_index_tree.hpp>

#include <cstddef>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "catch.hpp"

namespace {

using promptcache::detail::kv_npos;
using promptcache::detail::kv_path_mix;
using promptcache::detail::kv_path_unmix;
using promptcache::detail::KvTree;

// A tree whose nodes get holder slot 0 as they are added (a live node has a
// holder; a node without one is only seen between an add and its first set).
struct Tree {
  KvTree t;

  Tree() { t.nodes().ensure_slots(2); }

  // A new node held by slots 0 .. holders - 1.
  std::uint32_t add(std::uint64_t path, std::uint32_t parent, std::uint32_t holders = 1) {
    t.reserve(holders);
    const std::uint32_t n = t.add_child(path, parent);
    for (std::uint32_t s = 0; s < holders; ++s)
      t.nodes().set(n, s);
    return n;
  }
  void remove(std::uint32_t n) {
    while (t.nodes().count(n) != 0U)
      t.nodes().reset_bit(n, t.nodes().count(n) - 1U);
    t.remove_node(n);
  }
  std::uint64_t path(std::uint32_t n) const { return t.nodes().path_hash(n); }

  // The walk's answer: the nodes found, in order.
  std::vector<std::uint32_t> walk(const std::vector<std::uint64_t>& paths,
                                  std::uint32_t from = 0) const {
    std::vector<std::uint32_t> found(paths.size());
    std::vector<std::uint32_t> counts(paths.size());
    const std::size_t got = t.walk(paths.data(), paths.size(), from, found.data(), counts.data());
    found.resize(got);
    for (std::size_t j = 0; j < got; ++j)
      CHECK(counts[j] == t.nodes().count(found[j]));
    // Without counts the walk finds the same nodes.
    std::vector<std::uint32_t> again(paths.size());
    CHECK(t.walk(paths.data(), paths.size(), from, again.data()) == got);
    again.resize(got);
    CHECK(again == found);
    return found;
  }

  // The same descent by one edge-table lookup per level.
  std::vector<std::uint32_t> descend(const std::vector<std::uint64_t>& paths,
                                     std::uint32_t from = 0) const {
    std::vector<std::uint32_t> out;
    std::uint32_t at = from;
    for (const std::uint64_t p : paths) {
      at = t.find_child(p, at);
      if (at == kv_npos) break;
      out.push_back(at);
    }
    return out;
  }
};

std::uint64_t key(std::uint64_t parent_path, std::uint64_t tokens) {
  return KvTree::child_path(parent_path, tokens);
}

}  // namespace

TEST_CASE("kv tree walk: a chain stored in row order", "[kv_index]") {
  Tree t;
  std::vector<std::uint64_t> paths;
  std::uint32_t at = 0;
  std::uint64_t p = KvTree::root_path_hash;
  for (std::uint64_t i = 1; i <= 70; ++i) {  // longer than one probe batch and one query chunk
    p = key(p, i);
    paths.push_back(p);
    at = t.add(p, at);
    REQUIRE(at == i);  // fresh rows come out in order
  }
  const auto found = t.walk(paths);
  REQUIRE(found.size() == 70U);
  for (std::size_t j = 0; j < found.size(); ++j)
    CHECK(found[j] == j + 1U);
  // A walk may start below the root; one that runs past the last row stops.
  const std::vector<std::uint64_t> tail(paths.begin() + 60, paths.end());
  CHECK(t.walk(tail, 60).size() == 10U);
  std::vector<std::uint64_t> longer = paths;
  longer.push_back(key(p, 71));
  CHECK(t.walk(longer).size() == 70U);
  CHECK(t.walk({}).empty());
  CHECK(t.t.check());
}

TEST_CASE("kv tree walk: chains across a row page boundary", "[kv_index]") {
  // Rows live in pages of 4,096; the walk follows consecutive rows through
  // one pointer per page, so a chain must continue across the boundary, and a
  // guess that fails on the first row of a page must fall back to the table.
  constexpr std::uint32_t page = 4096;
  Tree t;
  std::vector<std::uint64_t> paths;
  std::uint32_t at = 0;
  std::uint64_t p = KvTree::root_path_hash;
  for (std::uint64_t i = 1; i < page + 40; ++i) {
    p = key(p, i);
    paths.push_back(p);
    at = t.add(p, at);
    REQUIRE(at == i);
  }
  auto found = t.walk(paths);
  REQUIRE(found.size() == paths.size());
  for (std::size_t j = 0; j < found.size(); ++j)
    CHECK(found[j] == j + 1U);
  const std::vector<std::uint64_t> tail(paths.begin() + page - 10, paths.end());
  CHECK(t.walk(tail, page - 10).size() == tail.size());

  // Second tree: rows 1 .. 4,095 a chain, row 4,096 (first of the next page)
  // a child of the root, rows 4,097 on the chain again.
  Tree u;
  paths.clear();
  at = 0;
  p = KvTree::root_path_hash;
  std::vector<std::uint32_t> want;
  for (std::uint64_t i = 1; i < page; ++i) {
    p = key(p, i);
    paths.push_back(p);
    want.push_back(at = u.add(p, at));
  }
  REQUIRE(u.add(key(KvTree::root_path_hash, 99999), 0) == page);
  for (std::uint64_t i = page; i < page + 20; ++i) {
    p = key(p, i);
    paths.push_back(p);
    want.push_back(at = u.add(p, at));
  }
  REQUIRE(want[page - 1U] == page + 1U);
  CHECK(u.walk(paths) == want);
  CHECK(u.walk(paths) == u.descend(paths));
  CHECK(u.t.check());
}

TEST_CASE("kv tree walk: the next row belongs to another parent", "[kv_index]") {
  Tree t;
  const std::uint64_t pa = key(KvTree::root_path_hash, 1);
  const std::uint32_t a = t.add(pa, 0);  // row 1
  // Row 2 has b's path hash but hangs below the root, not below a (only the
  // parent tells them apart; a real index reaches this by a hash collision).
  const std::uint64_t pb = key(pa, 2);
  const std::uint32_t impostor = t.add(pb, 0);  // row 2
  const std::uint32_t b = t.add(pb, a);         // row 3
  REQUIRE(a == 1U);
  REQUIRE(impostor == 2U);
  REQUIRE(b == 3U);
  const std::vector<std::uint64_t> q{pa, pb};
  CHECK(t.walk(q) == std::vector<std::uint32_t>{a, b});
  CHECK(t.walk(q) == t.descend(q));
  // The impostor itself is found as the root's child.
  CHECK(t.walk({pb}) == std::vector<std::uint32_t>{impostor});
  CHECK(t.t.check());
}

TEST_CASE("kv tree walk: a free row with a matching stale path hash", "[kv_index]") {
  Tree t;
  const std::uint64_t pa = key(KvTree::root_path_hash, 1);
  const std::uint64_t pb = key(pa, 2);
  const std::uint32_t a = t.add(pa, 0);
  const std::uint32_t b = t.add(pb, a);
  REQUIRE(b == a + 1U);
  t.remove(b);  // row 2 is free but still holds b's path hash
  CHECK(t.walk({pa, pb}) == std::vector<std::uint32_t>{a});
  CHECK(t.walk({pb}, a).empty());
  // b again, now in a row out of order: the walk still finds it.
  const std::uint64_t pc = key(KvTree::root_path_hash, 3);
  const std::uint32_t c = t.add(pc, 0);  // takes the free row
  const std::uint32_t b2 = t.add(pb, a);
  REQUIRE(c == b);
  REQUIRE(b2 == 3U);
  CHECK(t.walk({pa, pb}) == std::vector<std::uint32_t>{a, b2});
  CHECK(t.walk({pc}) == std::vector<std::uint32_t>{c});
  CHECK(t.t.check());
}

TEST_CASE("kv tree walk: rows reused out of order", "[kv_index]") {
  // A chain removed root side first pushes its rows onto the free list so that
  // a chain stored next gets them in reverse order: every guess misses.
  Tree t;
  t.add(key(KvTree::root_path_hash, 5000), 0);  // keeps the store from being released
  std::vector<std::uint32_t> rows;
  std::uint32_t at = 0;
  std::uint64_t p = KvTree::root_path_hash;
  for (std::uint64_t i = 1; i <= 12; ++i) {
    p = key(p, i);
    rows.push_back(at = t.add(p, at));
  }
  for (const std::uint32_t n : rows)
    t.remove(n);
  std::vector<std::uint64_t> paths;
  at = 0;
  p = KvTree::root_path_hash;
  std::vector<std::uint32_t> want;
  for (std::uint64_t i = 100; i < 112; ++i) {
    p = key(p, i);
    paths.push_back(p);
    want.push_back(at = t.add(p, at));
  }
  REQUIRE(want.front() == rows.back());
  REQUIRE(want.back() == rows.front());
  CHECK(t.walk(paths) == want);
  // A query that leaves the chain halfway.
  std::vector<std::uint64_t> off(paths.begin(), paths.begin() + 7);
  off.push_back(key(paths[6], 999));
  off.push_back(key(off.back(), 1000));
  CHECK(t.walk(off) == std::vector<std::uint32_t>(want.begin(), want.begin() + 7));
  CHECK(t.t.check());
}

TEST_CASE("kv tree walk: agrees with edge lookups on a churned tree", "[kv_index]") {
  std::mt19937_64 rng(7);
  Tree t;
  // Each live node with its path (as a list of path hashes from the root).
  struct Live {
    std::uint32_t node;
    std::vector<std::uint64_t> paths;
    std::size_t children = 0;
    std::size_t parent_index;  // into `live`, or npos for a root child
  };
  std::vector<Live> live;
  const auto pick = [&](std::size_t n) {
    return static_cast<std::size_t>(std::uniform_int_distribution<std::size_t>(0, n - 1)(rng));
  };
  const auto coin = [&](unsigned percent) { return pick(100) < percent; };
  std::uint64_t tokens = 1;
  for (int round = 0; round < 400; ++round) {
    if (live.empty() || coin(60)) {
      // Store a chain below the root or below a random live node.
      std::size_t parent = live.empty() || coin(20) ? SIZE_MAX : pick(live.size());
      std::vector<std::uint64_t> paths =
          parent == SIZE_MAX ? std::vector<std::uint64_t>{} : live[parent].paths;
      std::uint32_t at = parent == SIZE_MAX ? 0U : live[parent].node;
      const std::size_t k = 1 + pick(12);
      for (std::size_t i = 0; i < k; ++i) {
        const std::uint64_t prev = paths.empty() ? KvTree::root_path_hash : paths.back();
        paths.push_back(key(prev, tokens++));
        at = t.add(paths.back(), at, coin(30) ? 2U : 1U);
        if (parent != SIZE_MAX) ++live[parent].children;
        live.push_back(Live{at, paths, 0, parent});
        parent = live.size() - 1U;
      }
    } else {
      // Remove a random leaf (leaves only, as KvIndex does).
      const std::size_t i = pick(live.size());
      if (live[i].children != 0U) continue;
      t.remove(live[i].node);
      if (live[i].parent_index != SIZE_MAX) --live[live[i].parent_index].children;
      // Swap-remove, fixing the parent indices that pointed at the moved entry.
      const std::size_t last = live.size() - 1U;
      if (i != last) {
        live[i] = live[last];
        for (auto& l : live)
          if (l.parent_index == last) l.parent_index = i;
      }
      live.pop_back();
    }
    if (live.empty()) continue;
    // Queries: a live node's path, and the same path running off the tree.
    const Live& q = live[pick(live.size())];
    REQUIRE(t.walk(q.paths) == t.descend(q.paths));
    REQUIRE(t.walk(q.paths).back() == q.node);
    std::vector<std::uint64_t> off = q.paths;
    off.push_back(key(off.back(), ~tokens));
    REQUIRE(t.walk(off) == t.descend(off));
  }
  CHECK(t.t.check());
}

TEST_CASE("kv path mix: inverted exactly, spreads small inputs over the fingerprint",
          "[kv_index]") {
  std::mt19937_64 rng(3);
  for (int i = 0; i < 100000; ++i) {
    const std::uint64_t x = rng();
    REQUIRE(kv_path_unmix(kv_path_mix(x)) == x);
    REQUIRE(kv_path_mix(kv_path_unmix(x)) == x);
  }
  for (const std::uint64_t x : {std::uint64_t{0}, std::uint64_t{1}, ~std::uint64_t{0}})
    CHECK(kv_path_unmix(kv_path_mix(x)) == x);
  // Tokens hashes 1, 2, 3, ... below one parent (as in tests and weak
  // hashes): their fingerprints (high halves) land in distinct home slots of a
  // 2^16-slot table nearly as often as random keys would (about 39.3% of
  // 65,536 keys collide with an earlier one there; allow a little more).
  const std::uint64_t parent = KvTree::root_path_hash;
  std::set<std::uint64_t> homes;
  for (std::uint64_t t = 1; t <= 65536; ++t)
    homes.insert((KvTree::child_path(parent, t) >> 32U) >> 16U);
  CHECK(homes.size() > 65536U * 58U / 100U);
  // A chain of one repeated tokens hash (a prompt of identical blocks) adds
  // no entropy per level: the path hashes must still spread like random keys
  // and never repeat.
  for (const std::uint64_t t : {std::uint64_t{0}, std::uint64_t{1}, ~std::uint64_t{0}}) {
    std::set<std::uint64_t> chain_homes;
    std::set<std::uint64_t> paths;
    std::uint64_t path = parent;
    for (int level = 0; level < 65536; ++level) {
      path = KvTree::child_path(path, t);
      chain_homes.insert((path >> 32U) >> 16U);
      paths.insert(path);
    }
    CHECK(chain_homes.size() > 65536U * 58U / 100U);
    CHECK(paths.size() == 65536U);
  }
  // The tokens hash comes back from the two path hashes.
  Tree tree;
  const std::uint32_t a = tree.add(KvTree::child_path(parent, 77), 0);
  const std::uint32_t b = tree.add(KvTree::child_path(tree.path(a), 1234567), a);
  CHECK(tree.t.nodes().tokens_hash(a) == 77U);
  CHECK(tree.t.nodes().tokens_hash(b) == 1234567U);
}

TEST_CASE("kv node store: a node added with its holder, a holder added once", "[kv_index]") {
  // Word form (slots below 64), then the sparse forms past it.
  for (const std::uint32_t width : {2U, 100U}) {
    KvTree t;
    t.nodes().ensure_slots(width);
    const std::uint32_t a_slot = 0;
    const std::uint32_t b_slot = width - 1U;
    t.reserve(3);
    const std::uint64_t pa = key(KvTree::root_path_hash, 1);
    const std::uint64_t pb = key(pa, 2);
    const std::uint32_t a = t.add_held_child(pa, 0, a_slot);
    const std::uint32_t b = t.add_held_child(pb, a, b_slot);
    CHECK(t.nodes().count(a) == 1U);
    CHECK(t.nodes().test(a, a_slot));
    CHECK_FALSE(t.nodes().test(a, b_slot));
    CHECK(t.nodes().parent(b) == a);
    CHECK(t.nodes().path_hash(b) == pb);
    CHECK(t.find_child(pb, a) == b);
    CHECK(t.nodes().test(b, b_slot));
    CHECK(t.check());

    // A holder already there is not added again; a new one is, once.
    CHECK_FALSE(t.nodes().add_holder(a, a_slot));
    CHECK(t.nodes().count(a) == 1U);
    CHECK(t.nodes().add_holder(a, b_slot));
    CHECK(t.nodes().count(a) == 2U);
    CHECK(t.nodes().test(a, b_slot));
    CHECK_FALSE(t.nodes().add_holder(a, b_slot));
    CHECK(t.nodes().count(a) == 2U);

    // Released like any node: holders first, then the row.
    CHECK(t.nodes().reset_bit(b, b_slot) == 0U);
    t.remove_node(b);
    CHECK(t.nodes().reset_bit(a, b_slot) == 1U);
    CHECK(t.nodes().reset_bit(a, a_slot) == 0U);
    t.remove_node(a);
    CHECK(t.nodes().live() == 0U);
    CHECK(t.check());
  }
}
