// Unit test of detail::PoolBestHeap, the common-prefix aggregates of PromptCachePool's tree:
// a node with many children keeps them in a heap by their best entry (shortest, then most
// recent), and touches only list a child as stale instead of sifting. A randomized model test
// (add, remove, touch, re-key children) compares the parent's best with a scan of its children
// and checks the heap and stale-list invariants after every step.
#include <promptcache/detail/pool_best_heap.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include "catch.hpp"

namespace {

struct FakeNode;

struct FakeSlot {
  std::size_t len = 0;
  std::uint64_t seq = 0;
  FakeNode* node = nullptr;
};

struct FakeChildren {
  std::vector<FakeNode*> nodes;
  [[nodiscard]] std::size_t size() const noexcept { return nodes.size(); }
  template <class F>
  void for_each(F&& f) const {
    for (FakeNode* n : nodes)
      f(n);
  }
};

struct FakeNode {
  using slot_type = FakeSlot;
  FakeSlot* best = nullptr;
  FakeNode* parent = nullptr;
  bool is_stale = false;
  FakeChildren children;
  FakeNode* stale = nullptr;
  FakeNode* stale_next = nullptr;
  std::unique_ptr<FakeSlot> slot;
  std::vector<promptcache::detail::PoolHeapItem<FakeNode>> heap;
  std::size_t heap_pos = 0;
};

using Best = promptcache::detail::PoolBestHeap<FakeNode>;

void require(bool ok, const char* what) {
  if (!ok) throw std::logic_error(what);
}

}  // namespace

TEST_CASE("pool best heap: random changes below one node against a scan of its children") {
  for (std::uint32_t seed = 1; seed <= 4; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    auto rnd = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
    // root -> p -> leaves; p may hold an entry of its own.
    FakeNode root, p;
    p.parent = &root;
    root.children.nodes.push_back(&p);
    root.heap.reserve(1);
    if (seed % 2 == 0) {
      p.slot = std::make_unique<FakeSlot>(FakeSlot{5, 0, &p});
    }
    std::vector<std::unique_ptr<FakeNode>> leaves;
    std::uint64_t seq = 1;
    bool p_listed = false;
    auto add_leaf = [&] {
      auto leaf = std::make_unique<FakeNode>();
      leaf->parent = &p;
      leaf->slot = std::make_unique<FakeSlot>(FakeSlot{1 + rnd(8), ++seq, leaf.get()});
      leaf->best = leaf->slot.get();
      p.children.nodes.push_back(leaf.get());
      p.heap.reserve(p.heap.size() + 1);
      Best::heap_push(&p, leaf.get());
      leaves.push_back(std::move(leaf));
      if (!p_listed) {  // p joins root's heap once it has a best
        p.best = Best::compute_best(&p);
        Best::heap_push(&root, &p);
        p_listed = true;
      }
      Best::propagate(&p);
    };
    add_leaf();
    for (int step = 0; step < 4000; ++step) {
      CAPTURE(step);
      const std::size_t op = rnd(10);
      if (op < 3 || leaves.size() < 2) {
        add_leaf();
      } else if (op < 4) {  // remove a leaf
        const std::size_t i = rnd(leaves.size());
        FakeNode* c = leaves[i].get();
        Best::heap_erase(&p, c);
        auto& v = p.children.nodes;
        for (std::size_t k = 0; k < v.size(); ++k) {
          if (v[k] == c) {
            v[k] = v.back();
            v.pop_back();
            break;
          }
        }
        // The removed entry stays allocated until the aggregates are repaired, as the pool's
        // retired records do: bests above it may still name it until propagate() runs.
        std::unique_ptr<FakeNode> removed = std::move(leaves[i]);
        leaves[i] = std::move(leaves.back());
        leaves.pop_back();
        Best::propagate(&p);
      } else if (op < 8) {  // a hit: the leaf's entry becomes the most recent
        FakeSlot* s = leaves[rnd(leaves.size())]->slot.get();
        s->seq = ++seq;
        Best::propagate_touch(s);
      } else {  // the leaf's key changes either way (an insert or removal below it)
        FakeNode* c = leaves[rnd(leaves.size())].get();
        c->slot->len = 1 + rnd(8);
        c->slot->seq = ++seq;
        Best::propagate(c);
      }
      // The best of p: its own entry or the best leaf, by a plain scan.
      const FakeSlot* want = p.slot.get();
      for (const auto& l : leaves) {
        if (want == nullptr || Best::better(l->slot.get(), want)) want = l->slot.get();
      }
      REQUIRE(p.best == want);
      REQUIRE(root.heap.size() == 1);
      REQUIRE(root.heap[0].node == &p);
      REQUIRE_NOTHROW(Best::check_heap(&p, require));
      REQUIRE_NOTHROW(Best::check_best(&p, require));
      REQUIRE_NOTHROW(Best::check_heap(&root, require));
      if (rnd(50) == 0) {  // settling the stale items leaves an exact heap
        Best::flush_stale(&p);
        REQUIRE(p.stale == nullptr);
        const FakeSlot* best_leaf = nullptr;
        for (const auto& l : leaves) {
          REQUIRE_FALSE(l->is_stale);
          if (best_leaf == nullptr || Best::better(l->slot.get(), best_leaf))
            best_leaf = l->slot.get();
        }
        REQUIRE(p.heap[0].node->best == best_leaf);
        REQUIRE_NOTHROW(Best::check_heap(&p, require));
      }
    }
  }
}
