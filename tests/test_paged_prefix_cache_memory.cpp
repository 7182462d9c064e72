// PagedPrefixCache memory: the token ids and page ids it holds stay within twice
// what is cached, after every operation, on workloads that split nodes at many
// points of long contexts (agent forks, tree search, retries that diverge late).
#include <promptcache/paged_prefix_cache.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "catch.hpp"

using promptcache::PagedPrefixCache;
using promptcache::PagedPrefixHandle;
namespace eviction = promptcache::eviction;

namespace {

using Tokens = std::vector<std::uint32_t>;

// The bound documented for memory(): token bytes (and with them the page ids, which
// share their blocks page for page) at most twice the cached pages' tokens.
template <class Cache>
bool within_bound(const Cache& c) {
  const std::size_t live = c.cached_pages() * c.page_size() * sizeof(std::uint32_t);
  return c.memory().token_bytes <= 2 * live;
}

Tokens iota_tokens(std::uint32_t from, std::size_t n) {
  Tokens t(n);
  for (std::size_t i = 0; i < n; ++i)
    t[i] = from + static_cast<std::uint32_t>(i);
  return t;
}

// Contexts of `context_pages` pages; a branch is a context's first `cut` pages followed by
// up to 8 pages of its own (variant 0..3). Tokens and page ids are functions of the
// position, so every answer can be checked: page i of context x is id x * 100000 + i, and
// page j of a branch's own part an id above 50,000,000 naming (x, cut, variant, j).
struct Branches {
  std::size_t ps;
  std::size_t context_pages;

  [[nodiscard]] Tokens tokens(std::uint32_t x, std::size_t cut, std::uint32_t variant,
                              std::size_t own) const {
    Tokens t = iota_tokens(x * 100000, cut * ps);
    for (std::size_t j = 0; j < own * ps; ++j)
      t.push_back(1000000 +
                  static_cast<std::uint32_t>(((x * 256 + cut) * 4 + variant) * 8 * ps + j));
    return t;
  }
  [[nodiscard]] std::vector<std::uint32_t> ids(std::uint32_t x, std::size_t cut,
                                               std::uint32_t variant, std::size_t own) const {
    std::vector<std::uint32_t> p;
    for (std::size_t i = 0; i < cut; ++i)
      p.push_back(x * 100000 + static_cast<std::uint32_t>(i));
    for (std::size_t j = 0; j < own; ++j)
      p.push_back(50000000 + static_cast<std::uint32_t>(((x * 256 + cut) * 4 + variant) * 8 + j));
    return p;
  }
};

struct Held {
  PagedPrefixHandle handle;
  std::uint64_t ns = 0;
};

// A random workload that splits often: matches and inserts of branches cut at random
// points of a few long contexts, evictions, namespace erasures, clears, locks and unlocks.
// After every operation: the memory bound, the invariants, and that every match answers
// the ids stored for its tokens.
template <class Policy>
void run_branching(std::size_t ps, std::uint32_t seed, int steps, Policy policy = Policy{}) {
  using Cache = PagedPrefixCache<std::uint32_t, Policy>;
  Cache c(ps, std::move(policy));
  const Branches b{ps, 200};
  std::mt19937 rng(seed);
  const auto pick = [&](std::size_t n) {
    return static_cast<std::size_t>(std::uniform_int_distribution<std::size_t>(0, n - 1)(rng));
  };
  std::vector<Held> held;
  for (int step = 0; step < steps; ++step) {
    const auto x = static_cast<std::uint32_t>(pick(3));
    const std::uint64_t ns = pick(4) == 0 ? 1 : 0;
    const std::size_t cut = 1 + pick(b.context_pages - 1);
    const auto variant = static_cast<std::uint32_t>(pick(4));
    const std::size_t own = pick(9);
    const std::size_t op = pick(100);
    INFO("step " << step << " op " << op << " context " << x << " cut " << cut << " own " << own);
    if (op < 40) {
      // A query cut inside the context (and maybe past it, into a branch): splits wherever
      // the cache holds more than the match.
      const Tokens q = b.tokens(x, cut, variant, own);
      const auto want = b.ids(x, cut, variant, own);
      const auto m = c.match(q, ns);
      REQUIRE(m.matched % ps == 0);
      REQUIRE(m.pages.size() == m.matched / ps);
      for (std::size_t i = 0; i < m.pages.size(); ++i)
        REQUIRE(m.pages[i] == want[i]);
      if (pick(4) == 0 && c.lock(m.handle)) held.push_back({m.handle, ns});
    } else if (op < 65) {
      const std::size_t len = pick(5) == 0 ? b.context_pages : cut;
      const Tokens t = b.tokens(x, len, variant, len == b.context_pages ? 0 : own);
      const auto r = c.insert(t, b.ids(x, len, variant, len == b.context_pages ? 0 : own), ns);
      REQUIRE(r.duplicates.empty());
      if (pick(4) == 0 && c.lock(r.handle)) held.push_back({r.handle, ns});
    } else if (op < 80) {
      c.evict(1 + pick(pick(3) == 0 ? 400 : 40));
    } else if (op < 92) {
      if (!held.empty()) {
        const std::size_t i = pick(held.size());
        REQUIRE(c.unlock(held[i].handle));
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
      }
    } else if (op < 97) {
      if (c.erase_namespace(ns)) {
        std::erase_if(held, [&](const Held& h) { return h.ns == ns; });
      }
    } else {
      if (c.clear()) held.clear();
    }
    REQUIRE(within_bound(c));
    REQUIRE(c.check_invariants());
  }
  CHECK(c.stats().splits >= static_cast<std::uint64_t>(steps / 4));
}

}  // namespace

TEST_CASE("paged cache memory: a split leaves no block more than half dead (page size 1)") {
  PagedPrefixCache<> c(1);
  c.insert(iota_tokens(0, 4), iota_tokens(100, 4));
  const Tokens t = iota_tokens(0, 4);
  CHECK(c.match(std::span(t).first(3)).matched == 3);
  CHECK(within_bound(c));
  CHECK(c.match(std::span(t).first(2)).matched == 2);
  CHECK(c.cached_pages() == 4);
  CHECK(c.memory().token_bytes <= 2 * 4 * sizeof(std::uint32_t));
  CHECK(c.match(t).pages == iota_tokens(100, 4));
  CHECK(c.check_invariants());
}

TEST_CASE("paged cache memory: branching off one long context at every page stays bounded") {
  constexpr std::size_t ps = 16;
  constexpr std::size_t pages = 1000;
  PagedPrefixCache<> c(ps);
  const Tokens t = iota_tokens(0, pages * ps);
  c.insert(t, iota_tokens(100000, pages));
  const std::size_t live = pages * ps * sizeof(std::uint32_t);
  std::size_t worst = 0;
  for (std::size_t k = pages - 1; k >= 1; --k) {
    const auto m = c.match(std::span(t).first(k * ps));
    REQUIRE(m.matched == k * ps);
    worst = std::max(worst, c.memory().token_bytes);
  }
  CHECK(c.node_count() == pages);
  CHECK(c.stats().splits == pages - 1);
  CHECK(worst <= 2 * live);
  CHECK(c.memory().token_bytes == live);  // every node holds one page, in a block of one
  CHECK(c.match(t).pages == iota_tokens(100000, pages));
  CHECK(c.check_invariants());
}

TEST_CASE("paged cache memory: a split at either end of a half-live block compacts it") {
  constexpr std::size_t ps = 2;
  for (const bool head_side : {true, false}) {
    INFO("splitting toward the " << (head_side ? "head" : "tail"));
    PagedPrefixCache<> c(ps);
    const Tokens t = iota_tokens(0, 16 * ps);
    c.insert(t, iota_tokens(500, 16));
    // 10 of the block's 16 pages stay in one node; splitting that node near one end
    // leaves at most 8 live in the block, which is then compacted.
    const Tokens other = iota_tokens(9000, 16 * ps);
    (void)c.match(std::span(t).first((head_side ? 10 : 6) * ps));
    REQUIRE(within_bound(c));
    const std::size_t at = head_side ? 8 : 9;
    (void)c.match(std::span(t).first(at * ps));
    CHECK(within_bound(c));
    CHECK(c.match(t).pages == iota_tokens(500, 16));
    CHECK(c.peek(other) == 0);
    CHECK(c.check_invariants());
  }
}

TEST_CASE("paged cache memory: bound after every operation of a branching workload") {
  for (const std::size_t ps : {std::size_t{1}, std::size_t{3}, std::size_t{16}}) {
    for (std::uint32_t seed = 1; seed <= 3; ++seed) {
      INFO("page size " << ps << " seed " << seed);
      run_branching<eviction::Lru>(ps, seed, 600);
    }
  }
}

TEST_CASE("paged cache memory: bound after every operation, adaptive policy (key classes)") {
  for (std::uint32_t seed = 1; seed <= 2; ++seed) {
    INFO("seed " << seed);
    run_branching<eviction::Adaptive>(2, seed, 600, eviction::Adaptive(64, 2.0));
  }
}
