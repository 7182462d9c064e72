// Unit test of detail::PoolChildMap, the open-addressing child table of
// PromptCachePool's radix tree: a randomized model test against
// std::unordered_map for three key types (unsigned, signed with the extreme
// values, and 16-bit keys chosen to collide), the label-length saturation,
// exact growth/shrink of the table, the allocation contract (reserve() is the
// only call that may throw; erase()'s shrink is best effort) and moves.
#include <promptcache/detail/pool_child_map.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "support/counting_new.hpp"

namespace {

template <class Token>
struct TestNode {
  Token key{};
  std::size_t id = 0;
};

template <class Token>
using Map = promptcache::detail::PoolChildMap<Token, TestNode<Token>>;

constexpr std::uint32_t kLong = 0xFFFFFFFFU;

std::uint32_t stored_len(std::size_t n) {
  return n < kLong ? static_cast<std::uint32_t>(n) : kLong;
}

// The home slot of `key` in a table of 2^bits slots under the map's Fibonacci hash (a copy of
// its private index_of). Used only to pick keys that collide and wrap around the end of the
// table; nothing asserts on it, so a change of hash only makes the test less pointed.
template <class Token>
std::size_t home_of(Token key, unsigned bits) {
  using U = std::make_unsigned_t<Token>;
  const auto x = static_cast<std::uint64_t>(static_cast<U>(key));
  return static_cast<std::size_t>((x * 0x9E3779B97F4A7C15ULL) >> (64U - bits));
}

// True if the key's home is in the first or last 1/64 of any table: such keys pile up at the
// end of the table and at its start, so their probe chains wrap around.
template <class Token>
bool clustered(Token key) {
  const std::size_t h = home_of(key, 6);
  return h == 0 || h == 63;
}

template <class Token>
std::string show(Token key) {
  std::ostringstream os;
  os << static_cast<long long>(key);
  return os.str();
}

bool is_pow2_or_zero(std::size_t n) {
  return (n & (n - 1)) == 0;
}

// The capacity the map must have: reserve() doubles until the load is <= 1/2; erase() shrinks
// a table of more than 16 slots that is at most 1/8 full to the smallest power of two
// (at least 2) holding 4x the size.
struct CapacityModel {
  std::size_t cap = 0;

  void reserve(std::size_t size, std::size_t extra) {
    if (2 * (size + extra) <= cap) return;
    std::size_t c = cap == 0 ? 2 : cap * 2;
    while (2 * (size + extra) > c)
      c *= 2;
    cap = c;
  }
  void erased(std::size_t size_after) {
    if (cap > 16 && size_after * 8 <= cap) {
      std::size_t c = 2;
      while (c < 4 * size_after)
        c *= 2;
      cap = c;
    }
  }
};

template <class Token>
class Harness {
 public:
  using M = Map<Token>;
  using Node = TestNode<Token>;
  using Slot = typename M::Slot;

  struct Entry {
    Node* node;
    const Token* label;
    std::size_t label_len;
    std::size_t pos;  // index in keys_
  };

  Harness(std::vector<Token> universe, std::uint64_t seed, std::size_t max_target)
      : universe_(std::move(universe)),
        rng_(seed),
        max_target_(max_target),
        nodes_(universe_.size() + 2),
        labels_(997) {
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      nodes_[i].id = i;
      free_.push_back(&nodes_[i]);
    }
    for (std::size_t i = 0; i < labels_.size(); ++i)
      labels_[i] = static_cast<Token>(i);
  }

  // Runs `steps` random operations; returns the first discrepancy ("" if none).
  std::string run(std::size_t steps) {
    new_target();
    for (std::size_t step = 0; step < steps; ++step) {
      const Token touched = do_step();
      std::string p = check_key(touched);
      if (p.empty()) p = check_key(pick_universe());
      if (p.empty()) p = check_shape();
      const std::size_t every = std::max<std::size_t>(16, model_.size() / 2);
      if (p.empty() && (model_.size() <= 16 || step % every == 0)) p = check_full();
      if (!p.empty()) return "step " + std::to_string(step) + ": " + p;
    }
    // Drain to empty and check the empty map.
    while (!keys_.empty())
      erase_one();
    std::string p = check_full();
    if (!p.empty()) return "final drain: " + p;
    return {};
  }

  std::size_t grows = 0, shrinks = 0, drains_to_empty = 0, max_size = 0, long_labels = 0;

 private:
  enum class Phase { grow, shrink, drain };

  void new_target() {
    const auto r = rng_() % 100;
    if (phase_ != Phase::grow) {
      phase_ = Phase::grow;
      if (r < 70)
        target_ = 1 + rng_() % 64;
      else if (r < 95)
        target_ = 64 + rng_() % std::max<std::size_t>(1, std::min<std::size_t>(448, max_target_));
      else
        target_ = 1 + rng_() % max_target_;
      target_ = std::min(target_, max_target_);
    } else {
      // After growing: either drain everything (one erase after another) or shrink to a
      // random smaller size with inserts mixed in.
      if (r < 50) {
        phase_ = Phase::drain;
        target_ = 0;
      } else {
        phase_ = Phase::shrink;
        target_ = rng_() % (model_.size() + 1) / 2;
      }
    }
  }

  Token do_step() {
    switch (phase_) {
      case Phase::grow:
        if (model_.size() >= target_) new_target();
        break;
      case Phase::shrink:
      case Phase::drain:
        if (model_.size() <= target_) {
          if (model_.empty() && phase_ == Phase::drain) ++drains_to_empty;
          new_target();
        }
        break;
    }
    const auto r = rng_() % 100;
    unsigned insert_p = 0, erase_p = 0;
    switch (phase_) {
      case Phase::grow:
        insert_p = 60;
        erase_p = 15;
        break;
      case Phase::shrink:
        insert_p = 15;
        erase_p = 60;
        break;
      case Phase::drain:
        insert_p = 0;
        erase_p = 90;
        break;
    }
    if (r < insert_p) return insert_some();
    if (r < insert_p + erase_p) return erase_one();
    if (r < insert_p + erase_p + 4) return replace_one();
    if (r < insert_p + erase_p + 8) return set_label_one();
    return pick_universe();  // a plain lookup, checked by the caller
  }

  Token pick_universe() { return universe_[rng_() % universe_.size()]; }

  const Token* random_label() { return labels_.data() + rng_() % labels_.size(); }

  std::size_t random_len() {
    switch (rng_() % 10) {
      case 0:
        return 0;
      case 1:
        return 0xFFFFFFFEU;
      case 2:
        return 0xFFFFFFFFU;
      case 3:
        return static_cast<std::size_t>(0x100000000ULL + rng_() % 5);
      case 4:
        return std::numeric_limits<std::size_t>::max();
      default:
        return 1 + rng_() % 1000;
    }
  }

  Node* take_node(Token key) {
    Node* n = free_.back();
    free_.pop_back();
    n->key = key;
    return n;
  }

  Token insert_some() {
    // Mostly reserve exactly what is inserted, sometimes more (a sparse table the next erase
    // shrinks), sometimes nothing (only after a reserve that left room).
    std::size_t extra = 1 + rng_() % 4;
    if (rng_() % 50 == 0) extra = 1 + rng_() % 64;
    const std::size_t before = cap_.cap;
    cap_.reserve(model_.size(), extra);
    map_.reserve(extra);
    if (cap_.cap > before) ++grows;
    const std::size_t k = 1 + rng_() % std::min<std::size_t>(extra, 4);
    Token last = pick_universe();
    for (std::size_t i = 0; i < k; ++i) {
      Token key = pick_universe();
      for (int tries = 0; tries < 8 && model_.count(key) != 0; ++tries)
        key = pick_universe();
      if (model_.count(key) != 0) break;
      Node* n = take_node(key);
      const Token* label = random_label();
      const std::size_t len = random_len();
      if (stored_len(len) == kLong) ++long_labels;
      map_.insert_reserved(key, n, label, len);
      model_.emplace(key, Entry{n, label, len, keys_.size()});
      keys_.push_back(key);
      last = key;
    }
    max_size = std::max(max_size, model_.size());
    return last;
  }

  Token erase_one() {
    if (keys_.empty()) return pick_universe();
    const Token key = keys_[rng_() % keys_.size()];
    const std::size_t before = cap_.cap;
    map_.erase(key);
    auto it = model_.find(key);
    free_.push_back(it->second.node);
    const std::size_t pos = it->second.pos;
    keys_[pos] = keys_.back();
    model_.at(keys_[pos]).pos = pos;
    keys_.pop_back();
    model_.erase(it);
    cap_.erased(model_.size());
    if (cap_.cap < before) ++shrinks;
    return key;
  }

  Token replace_one() {
    if (keys_.empty()) return pick_universe();
    const Token key = keys_[rng_() % keys_.size()];
    Entry& e = model_.at(key);
    Node* n = take_node(key);
    free_.push_back(e.node);
    e.node = n;
    e.label = random_label();
    e.label_len = random_len();
    map_.replace(key, e.node, e.label, e.label_len);
    return key;
  }

  Token set_label_one() {
    if (keys_.empty()) return pick_universe();
    const Token key = keys_[rng_() % keys_.size()];
    Entry& e = model_.at(key);
    e.label = random_label();
    map_.set_label(key, e.label);
    return key;
  }

  std::string check_key(Token key) const {
    const Slot* s = map_.find_slot(key);
    Node* n = map_.find(key);
    const auto it = model_.find(key);
    if (it == model_.end()) {
      if (s != nullptr || n != nullptr) return "absent key " + show(key) + " found";
      return {};
    }
    const Entry& e = it->second;
    if (s == nullptr) return "present key " + show(key) + " not found by find_slot";
    if (n != e.node) return "find(" + show(key) + ") returned the wrong node";
    if (s->key != key) return "find_slot(" + show(key) + ") returned key " + show(s->key);
    if (s->node != e.node) return "find_slot(" + show(key) + ") returned the wrong node";
    if (s->label != e.label) return "find_slot(" + show(key) + ") returned the wrong label";
    if (s->label_len != stored_len(e.label_len))
      return "find_slot(" + show(key) + ") label_len " + std::to_string(s->label_len) +
             ", expected " + std::to_string(stored_len(e.label_len));
    return {};
  }

  std::string check_shape() const {
    if (map_.size() != model_.size())
      return "size " + std::to_string(map_.size()) + ", expected " + std::to_string(model_.size());
    if (map_.empty() != model_.empty()) return "empty() disagrees";
    const std::size_t bytes = map_.table_bytes();
    if (bytes % sizeof(Slot) != 0) return "table_bytes not a multiple of the slot size";
    const std::size_t cap = bytes / sizeof(Slot);
    if (!is_pow2_or_zero(cap)) return "capacity " + std::to_string(cap) + " not a power of two";
    if (2 * model_.size() > cap) return "load above 1/2";
    if (cap != cap_.cap)
      return "capacity " + std::to_string(cap) + ", expected " + std::to_string(cap_.cap);
    Node* a = map_.any();
    if (model_.empty()) {
      if (a != nullptr) return "any() of an empty map is not nullptr";
    } else {
      if (a == nullptr) return "any() of a non-empty map is nullptr";
      const auto it = model_.find(a->key);
      if (it == model_.end() || it->second.node != a) return "any() returned a stale node";
    }
    return {};
  }

  std::string check_full() const {
    std::string p = check_shape();
    if (!p.empty()) return p;
    for (const Token key : keys_) {
      p = check_key(key);
      if (!p.empty()) return p;
    }
    std::vector<char> seen(nodes_.size(), 0);
    std::size_t visits = 0;
    bool bad = false;
    map_.for_each([&](Node* n) {
      ++visits;
      const auto it = model_.find(n->key);
      if (it == model_.end() || it->second.node != n || seen[n->id] != 0) bad = true;
      if (!bad) seen[n->id] = 1;
    });
    if (bad) return "for_each visited a node not in the model, or twice";
    if (visits != model_.size())
      return "for_each visited " + std::to_string(visits) + " nodes, expected " +
             std::to_string(model_.size());
    // Some absent keys too.
    for (int i = 0; i < 16; ++i) {
      p = check_key(universe_[static_cast<std::size_t>(i) * 7919 % universe_.size()]);
      if (!p.empty()) return p;
    }
    return {};
  }

  std::vector<Token> universe_;
  std::mt19937_64 rng_;
  std::size_t max_target_;
  std::vector<Node> nodes_;
  std::vector<Node*> free_;
  std::vector<Token> labels_;
  M map_;
  CapacityModel cap_;
  std::unordered_map<Token, Entry> model_;
  std::vector<Token> keys_;
  Phase phase_ = Phase::drain;
  std::size_t target_ = 0;
};

// Keys: `specials`, then `n_clustered` keys whose homes collide at the ends of the table, then
// `n_random` keys, all distinct.
template <class Token>
std::vector<Token> make_universe(std::uint64_t seed, const std::vector<Token>& specials,
                                 std::size_t n_clustered, std::size_t n_random) {
  std::mt19937_64 rng(seed);
  std::unordered_set<Token> seen;
  std::vector<Token> out;
  auto add = [&](Token k) {
    if (seen.insert(k).second) out.push_back(k);
  };
  for (const Token k : specials)
    add(k);
  using U = std::make_unsigned_t<Token>;
  auto random_key = [&] { return static_cast<Token>(static_cast<U>(rng())); };
  const std::size_t want_clustered = out.size() + n_clustered;
  while (out.size() < want_clustered) {
    const Token k = random_key();
    if (clustered(k)) add(k);
  }
  const std::size_t want = out.size() + n_random;
  while (out.size() < want)
    add(random_key());
  return out;
}

template <class Token>
void run_model(const std::vector<Token>& universe, std::uint64_t seed, std::size_t steps,
               std::size_t max_target) {
  Harness<Token> h(universe, seed, max_target);
  const std::string problem = h.run(steps);
  CAPTURE(seed, h.grows, h.shrinks, h.drains_to_empty, h.max_size, h.long_labels);
  REQUIRE(problem == "");
  // The run did exercise what it is meant to.
  CHECK(h.grows > 100);
  CHECK(h.shrinks > 100);
  CHECK(h.drains_to_empty > 20);
  CHECK(h.max_size >= 256);
  CHECK(h.long_labels > 100);
}

}  // namespace

TEST_CASE("operator new replacement is active", "[pool_child_map]") {
  CHECK(test_alloc::replacement_active());
}

TEST_CASE("model test: uint32_t keys", "[pool_child_map]") {
  const std::vector<std::uint32_t> specials{0U,          1U,          2U,         0x7FFFFFFFU,
                                            0x80000000U, 0xFFFFFFFEU, 0xFFFFFFFFU};
  for (const std::uint64_t seed : {1ULL, 2ULL}) {
    const auto universe = make_universe<std::uint32_t>(seed, specials, 1200, 1200);
    run_model(universe, seed, 60000, 1500);
  }
}

TEST_CASE("model test: int32_t keys, negative and extreme", "[pool_child_map]") {
  constexpr std::int32_t lo = std::numeric_limits<std::int32_t>::min();
  constexpr std::int32_t hi = std::numeric_limits<std::int32_t>::max();
  std::vector<std::int32_t> specials{lo, lo + 1, lo + 2, hi, hi - 1, hi - 2, -1, 0, 1, -2};
  for (std::int32_t k = -64; k < 64; ++k)
    specials.push_back(k);
  for (const std::uint64_t seed : {3ULL, 4ULL}) {
    const auto universe = make_universe<std::int32_t>(seed, specials, 1200, 1200);
    run_model(universe, seed, 60000, 1500);
  }
}

TEST_CASE("model test: uint16_t keys colliding at both ends of the table", "[pool_child_map]") {
  // Every 16-bit key whose home is in the first or last 1/64 of the table (about 2048), and
  // a few others: tables of up to 64 slots put them all on two slots, bigger ones in long
  // chains that wrap around.
  std::vector<std::uint16_t> keys;
  for (std::uint32_t k = 0; k <= 0xFFFF; ++k) {
    if (clustered(static_cast<std::uint16_t>(k))) keys.push_back(static_cast<std::uint16_t>(k));
  }
  REQUIRE(keys.size() > 1000);
  const auto universe = make_universe<std::uint16_t>(5, keys, 0, 128);
  run_model(universe, 5, 120000, 600);
}

TEST_CASE("wrap-around chains: every erase order of colliding keys", "[pool_child_map]") {
  // A 16-slot table (no shrinking) holding keys whose homes are 14, 15, 0 and 1: the chains
  // cross the end of the table. Erase them in many orders, checking every key after each.
  using M = Map<std::uint32_t>;
  std::vector<std::uint32_t> by_home[16];
  for (std::uint32_t k = 1; by_home[14].size() < 2 || by_home[15].size() < 2 ||
                            by_home[0].size() < 2 || by_home[1].size() < 2;
       ++k) {
    by_home[home_of(k, 4)].push_back(k);
  }
  std::vector<std::uint32_t> keys;
  for (const std::size_t h : {14U, 15U, 0U, 1U}) {
    for (std::size_t i = 0; i < 2; ++i)
      keys.push_back(by_home[h][i]);
  }
  REQUIRE(keys.size() == 8);  // exactly the load limit of 16 slots
  std::vector<TestNode<std::uint32_t>> nodes(keys.size());
  std::mt19937_64 rng(6);
  for (int round = 0; round < 2000; ++round) {
    M m;
    m.reserve(keys.size());
    REQUIRE(m.table_bytes() == 16 * sizeof(M::Slot));
    std::vector<std::size_t> order(keys.size());
    for (std::size_t i = 0; i < order.size(); ++i)
      order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    for (const std::size_t i : order) {
      nodes[i].key = keys[i];
      m.insert_reserved(keys[i], &nodes[i], nullptr, i);
    }
    std::vector<bool> present(keys.size(), true);
    std::shuffle(order.begin(), order.end(), rng);
    for (const std::size_t i : order) {
      m.erase(keys[i]);
      present[i] = false;
      bool ok = m.table_bytes() == 16 * sizeof(M::Slot);
      for (std::size_t j = 0; j < keys.size(); ++j) {
        const auto* s = m.find_slot(keys[j]);
        if (present[j])
          ok = ok && s != nullptr && s->node == &nodes[j] && s->label_len == j;
        else
          ok = ok && s == nullptr;
      }
      if (!ok) {
        CAPTURE(round, i);
        REQUIRE(ok);
      }
    }
    REQUIRE(m.empty());
    REQUIRE(m.any() == nullptr);
  }
}

TEST_CASE("label_len saturates at kLongLabel", "[pool_child_map]") {
  using M = Map<std::uint32_t>;
  STATIC_REQUIRE(M::kLongLabel == 0xFFFFFFFFU);
  const std::size_t lens[] = {0,
                              1,
                              12345,
                              0xFFFFFFFDU,
                              0xFFFFFFFEU,
                              0xFFFFFFFFU,
                              static_cast<std::size_t>(0x100000000ULL),
                              static_cast<std::size_t>(0x1FFFFFFFFULL),
                              std::numeric_limits<std::size_t>::max()};
  const std::uint32_t expected[] = {0,
                                    1,
                                    12345,
                                    0xFFFFFFFDU,
                                    0xFFFFFFFEU,
                                    M::kLongLabel,
                                    M::kLongLabel,
                                    M::kLongLabel,
                                    M::kLongLabel};
  constexpr std::size_t n = sizeof(lens) / sizeof(lens[0]);
  std::vector<TestNode<std::uint32_t>> nodes(2 * n);
  const std::uint32_t label[4] = {7, 8, 9, 10};
  M m;
  m.reserve(n);
  for (std::size_t i = 0; i < n; ++i)
    m.insert_reserved(static_cast<std::uint32_t>(i), &nodes[i], label, lens[i]);
  for (std::size_t i = 0; i < n; ++i) {
    CAPTURE(i);
    const auto* s = m.find_slot(static_cast<std::uint32_t>(i));
    REQUIRE(s != nullptr);
    CHECK(s->label_len == expected[i]);
    CHECK(s->label == label);
  }
  // replace: key i gets the length of key n-1-i; set_label keeps the length.
  for (std::size_t i = 0; i < n; ++i)
    m.replace(static_cast<std::uint32_t>(i), &nodes[n + i], label + 1, lens[n - 1 - i]);
  for (std::size_t i = 0; i < n; ++i)
    m.set_label(static_cast<std::uint32_t>(i), label + 2);
  for (std::size_t i = 0; i < n; ++i) {
    CAPTURE(i);
    const auto* s = m.find_slot(static_cast<std::uint32_t>(i));
    REQUIRE(s != nullptr);
    CHECK(s->node == &nodes[n + i]);
    CHECK(s->label_len == expected[n - 1 - i]);
    CHECK(s->label == label + 2);
  }
}

namespace {

using AllocMap = Map<std::uint32_t>;
using AllocNode = TestNode<std::uint32_t>;

struct Content {
  std::uint32_t key;
  const AllocNode* node;
  const std::uint32_t* label;
  std::uint32_t label_len;
  bool operator==(const Content&) const = default;
};

// The map's contents in key order, from for_each and find_slot.
std::vector<Content> contents(const AllocMap& m) {
  std::vector<Content> out;
  m.for_each([&](AllocNode* n) {
    const auto* s = m.find_slot(n->key);
    if (s == nullptr)
      out.push_back(Content{n->key, nullptr, nullptr, 0});
    else
      out.push_back(Content{s->key, s->node, s->label, s->label_len});
  });
  std::sort(out.begin(), out.end(),
            [](const Content& a, const Content& b) { return a.key < b.key; });
  return out;
}

// Keys 0..n-1 (scattered by a multiplier), node i for key i.
void fill(AllocMap& m, std::vector<AllocNode>& nodes, std::size_t n, const std::uint32_t* label) {
  m.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    nodes[i].key = static_cast<std::uint32_t>(i * 2654435761U);
    m.insert_reserved(nodes[i].key, &nodes[i], label + i % 3, i);
  }
}

}  // namespace

TEST_CASE("a failing reserve throws bad_alloc and leaves the map unchanged", "[pool_child_map]") {
  std::vector<AllocNode> nodes(300);
  const std::uint32_t label[3] = {1, 2, 3};
  // Sizes at which reserve(1) must grow the table (0, 1, and full tables), and a few others.
  for (const std::size_t n : {0U, 1U, 2U, 4U, 7U, 8U, 16U, 31U, 32U, 64U, 100U, 128U, 256U}) {
    for (const std::size_t extra : {1U, 2U, 5U, 1000U}) {
      CAPTURE(n, extra);
      AllocMap m;
      fill(m, nodes, n, label);
      const auto before = contents(m);
      const std::size_t bytes = m.table_bytes();
      const bool must_grow = 2 * (n + extra) > bytes / sizeof(AllocMap::Slot);
      bool threw = false;
      const long count = test_alloc::count;
      test_alloc::countdown = 0;
      try {
        m.reserve(extra);
      } catch (const std::bad_alloc&) {
        threw = true;
      }
      const bool attempted = test_alloc::countdown == -1;
      test_alloc::countdown = -1;
      CHECK(threw == must_grow);
      CHECK(attempted == must_grow);
      CHECK(test_alloc::count == count);
      CHECK(m.size() == n);
      CHECK(m.table_bytes() == bytes);
      CHECK(contents(m) == before);
      CHECK(before.size() == n);
      // The map still works: the same reserve succeeds with one allocation, then inserts.
      const long count2 = test_alloc::count;
      m.reserve(extra);
      CHECK(test_alloc::count == count2 + (must_grow ? 1 : 0));
      CHECK(contents(m) == before);
      AllocNode extra_node{0xDEADBEEFU, 999};
      m.insert_reserved(extra_node.key, &extra_node, label, 5);
      CHECK(m.find(0xDEADBEEFU) == &extra_node);
      CHECK(m.size() == n + 1);
    }
  }
}

TEST_CASE("only reserve allocates; erase's shrink is best effort", "[pool_child_map]") {
  std::vector<AllocNode> nodes(200);
  const std::uint32_t label[3] = {1, 2, 3};
  AllocMap m;
  m.reserve(200);
  const std::size_t big = m.table_bytes();
  REQUIRE(big == 512 * sizeof(AllocMap::Slot));

  SECTION("insert_reserved, replace, set_label, find, find_slot, any, for_each, erase") {
    const long count = test_alloc::count;
    // Armed: any allocation would throw (inside a noexcept function: terminate).
    test_alloc::countdown = 0;
    for (std::size_t i = 0; i < 200; ++i) {
      nodes[i].key = static_cast<std::uint32_t>(i * 40503U);
      m.insert_reserved(nodes[i].key, &nodes[i], label, i);
    }
    std::size_t found = 0;
    for (std::size_t i = 0; i < 200; ++i) {
      m.set_label(nodes[i].key, label + 1);
      m.replace(nodes[i].key, &nodes[i], label + 2, i + 1);
      if (m.find(nodes[i].key) == &nodes[i] && m.find_slot(nodes[i].key) != nullptr) ++found;
    }
    std::size_t visited = 0;
    m.for_each([&](AllocNode*) { ++visited; });
    const bool any_ok = m.any() != nullptr;
    // Erasing down to 65 of 512 slots does not shrink (65 * 8 > 512).
    for (std::size_t i = 0; i < 135; ++i)
      m.erase(nodes[i].key);
    const bool armed = test_alloc::countdown == 0;
    test_alloc::countdown = -1;
    CHECK(armed);
    CHECK(test_alloc::count == count);
    CHECK(found == 200);
    CHECK(visited == 200);
    CHECK(any_ok);
    CHECK(m.size() == 65);
    CHECK(m.table_bytes() == big);
  }

  SECTION("with allocation failing, erase keeps the big table and its contents") {
    fill(m, nodes, 200, label);
    REQUIRE(m.table_bytes() == big);
    std::vector<Content> expected = contents(m);
    long allocations = 0;
    std::size_t attempts = 0;
    // Erase everything, each erase with the next allocation made to fail.
    for (std::size_t i = 0; i < 200; ++i) {
      const long count = test_alloc::count;
      test_alloc::countdown = 0;
      m.erase(nodes[i].key);
      if (test_alloc::countdown == -1) ++attempts;
      test_alloc::countdown = -1;
      allocations += test_alloc::count - count;
      expected.erase(std::find_if(expected.begin(), expected.end(),
                                  [&](const Content& c) { return c.key == nodes[i].key; }));
      if (i % 8 == 0 || m.size() < 80) {
        CAPTURE(i);
        REQUIRE(m.size() == 199 - i);
        REQUIRE(m.table_bytes() == big);
        REQUIRE(contents(m) == expected);
      }
    }
    CHECK(allocations == 0);
    // Every erase that left 64 children or fewer tried to shrink (64 * 8 <= 512) and failed.
    CHECK(attempts == 65);
    CHECK(m.empty());
    CHECK(m.any() == nullptr);
    CHECK(m.find(nodes[0].key) == nullptr);
    CHECK(m.table_bytes() == big);
    // Still usable.
    m.reserve(1);
    m.insert_reserved(7, &nodes[0], label, 3);
    CHECK(m.find(7) == &nodes[0]);
    CHECK(m.table_bytes() == big);
  }

  SECTION("with allocation working again, the next erase shrinks") {
    fill(m, nodes, 64, label);
    test_alloc::countdown = 0;
    m.erase(nodes[0].key);  // 63 * 8 <= 512: tries to shrink, fails
    test_alloc::countdown = -1;
    CHECK(m.table_bytes() == big);
    const long count = test_alloc::count;
    m.erase(nodes[1].key);  // 62 children: shrinks to 256 slots (>= 4 * 62)
    CHECK(test_alloc::count == count + 1);
    CHECK(m.table_bytes() == 256 * sizeof(AllocMap::Slot));
    CHECK(m.size() == 62);
    for (std::size_t i = 2; i < 64; ++i)
      CHECK(m.find(nodes[i].key) == &nodes[i]);
  }
}

TEST_CASE("moves and swap keep contents; a moved-from map is empty and usable",
          "[pool_child_map]") {
  std::vector<AllocNode> nodes(100);
  std::vector<AllocNode> other_nodes(100);
  const std::uint32_t label[3] = {1, 2, 3};
  AllocMap a;
  fill(a, nodes, 40, label);
  const auto a_contents = contents(a);
  const std::size_t a_bytes = a.table_bytes();
  REQUIRE(a_contents.size() == 40);

  const auto check_empty_usable = [&](AllocMap& m) {
    CHECK(m.size() == 0);
    CHECK(m.empty());
    CHECK(m.table_bytes() == 0);
    CHECK(m.any() == nullptr);
    CHECK(m.find(nodes[0].key) == nullptr);
    CHECK(m.find_slot(nodes[1].key) == nullptr);
    std::size_t visited = 0;
    m.for_each([&](AllocNode*) { ++visited; });
    CHECK(visited == 0);
    m.reserve(1);
    AllocNode n{42, 0};
    m.insert_reserved(42, &n, label, 1);
    CHECK(m.find(42) == &n);
    m.erase(42);
    CHECK(m.empty());
  };

  SECTION("move construction") {
    const long count = test_alloc::count;
    AllocMap b(std::move(a));
    CHECK(test_alloc::count == count);
    CHECK(contents(b) == a_contents);
    CHECK(b.table_bytes() == a_bytes);
    check_empty_usable(a);
  }
  SECTION("move assignment onto a non-empty map") {
    AllocMap b;
    fill(b, other_nodes, 70, label);
    const long count = test_alloc::count;
    b = std::move(a);
    CHECK(test_alloc::count == count);
    CHECK(contents(b) == a_contents);
    CHECK(b.size() == 40);
    CHECK(b.table_bytes() == a_bytes);
    check_empty_usable(a);
  }
  SECTION("move assignment from an empty map") {
    AllocMap empty;
    a = std::move(empty);
    check_empty_usable(a);
    check_empty_usable(empty);
  }
  SECTION("swap") {
    AllocMap b;
    fill(b, other_nodes, 70, label);
    const auto b_contents = contents(b);
    const std::size_t b_bytes = b.table_bytes();
    const long count = test_alloc::count;
    a.swap(b);
    CHECK(test_alloc::count == count);
    CHECK(contents(a) == b_contents);
    CHECK(contents(b) == a_contents);
    CHECK(a.table_bytes() == b_bytes);
    CHECK(b.table_bytes() == a_bytes);
    // Both keep working: erase and insert in each.
    a.erase(other_nodes[0].key);
    b.erase(nodes[0].key);
    CHECK(a.find(other_nodes[0].key) == nullptr);
    CHECK(b.find(nodes[0].key) == nullptr);
    CHECK(a.find(other_nodes[1].key) == &other_nodes[1]);
    CHECK(b.find(nodes[1].key) == &nodes[1]);
    AllocMap empty;
    a.swap(empty);
    check_empty_usable(a);
    CHECK(empty.size() == 69);
  }
}
