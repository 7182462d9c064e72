// Randomized differential test of PagedPrefixCache against a naive model, in
// every shipped eviction policy. The model is written from the rules alone: a
// map from each cached page-aligned prefix to that page's id, lock count and
// policy metadata; match walks prefixes page by page; evict frees, one page at
// a time, the unlocked page that no cached page extends with the smallest
// policy key. For eviction::Adaptive the model also keeps ARC's state page by
// page: which pages were used again, the target p, and the ghost history as a
// plain list in eviction order; each page evicted comes from the class ARC
// picks (used once while more than p pages are, else used again), falling back
// to the other class when the picked one has no evictable page. After every step the test compares
// every answer, the counters, check_invariants(), and a KvIndex fed only by the cache's events
// against the cache (the mirror property).
#include <promptcache/paged_prefix_cache.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "catch.hpp"

using promptcache::KvEvent;
using promptcache::KvIndex;
using promptcache::KvWorker;
using promptcache::PagedPrefixCache;
using promptcache::PagedPrefixHandle;
namespace eviction = promptcache::eviction;

namespace {

using Tokens = std::vector<std::uint32_t>;
using PageId = std::uint32_t;

// Per-page metadata, as the rules define it.
struct PageMeta {
  PageId id = 0;
  std::uint64_t lock = 0;   // locks of prefixes through this page
  std::uint64_t own = 0;    // locks of the prefix ending at this page
  std::uint64_t birth = 0;  // unique per stored page: tells a re-inserted page from the old one
  std::uint64_t last_access = 0;
  std::uint64_t created = 0;
  std::uint64_t hits = 0;
  std::int64_t priority = 0;
  bool reused = false;  // adaptive: matched or inserted again, or stored back from a ghost
};

using Key = std::tuple<std::int64_t, std::int64_t>;  // compared lexicographically

enum class Pol { lru, lfu, fifo, priority, slru, mru, filo, adaptive };

Key model_key(Pol p, const PageMeta& m) {
  const auto t = static_cast<std::int64_t>(m.last_access);
  const auto c = static_cast<std::int64_t>(m.created);
  const auto h = static_cast<std::int64_t>(m.hits);
  switch (p) {
    case Pol::lru:
    case Pol::adaptive:  // within a class
      return {0, t};
    case Pol::lfu:
      return {h, t};
    case Pol::fifo:
      return {0, c};
    case Pol::priority:
      return {m.priority, t};
    case Pol::slru:
      return {h >= 2 ? 1 : 0, t};
    case Pol::mru:
      return {0, -t};
    case Pol::filo:
      return {0, -c};
  }
  return {};
}

struct ModelHandle {
  std::uint64_t ns = 0;
  Tokens prefix;  // empty: the empty prefix
  std::uint64_t birth = 0;
};

// Adaptive: eviction::Adaptive(capacity, ghost_factor, step).
struct Arc {
  std::size_t capacity = 0;
  double ghost_factor = 0.0;
  double step = 0.0;
};

class Model {
 public:
  Model(std::size_t page_size, Pol pol, Arc arc = {})
      : ps_(page_size),
        pol_(pol),
        arc_(arc),
        ghost_limit_(static_cast<std::size_t>(arc.ghost_factor * double(arc.capacity))) {}

  [[nodiscard]] double target() const { return p_; }

  struct Match {
    std::size_t matched = 0;
    std::vector<PageId> pages;
    ModelHandle handle;
  };

  Match match(const Tokens& t, std::uint64_t ns) {
    ++tick_;
    Match r = walk(t, ns);
    for (std::size_t k = 1; k * ps_ <= r.matched; ++k) {
      at(ns, t, k).last_access = tick_;
      at(ns, t, k).reused = true;
    }
    return r;
  }

  [[nodiscard]] std::size_t peek(const Tokens& t, std::uint64_t ns) const {
    return walk(t, ns).matched;
  }

  struct Insert {
    std::size_t cached = 0, inserted = 0;
    std::vector<PageId> duplicates;
    ModelHandle handle;
  };

  Insert insert(const Tokens& t, const std::vector<PageId>& ids, std::uint64_t ns,
                std::int64_t prio) {
    Insert r;
    const std::size_t q = t.size() / ps_;
    if (q == 0) return r;
    ++tick_;
    for (std::size_t k = 1; k <= q; ++k) {
      const auto key = std::make_pair(ns, Tokens(t.begin(), t.begin() + long(k * ps_)));
      auto it = pages_.find(key);
      if (it != pages_.end() && r.inserted == 0) {
        ++r.cached;
        PageMeta& m = it->second;
        if (m.id != ids[k - 1]) r.duplicates.push_back(ids[k - 1]);
        m.last_access = tick_;
        ++m.hits;
        m.priority = std::max(m.priority, prio);
        m.reused = true;
      } else {
        PageMeta m;
        m.id = ids[k - 1];
        m.birth = ++births_;
        m.last_access = m.created = tick_;
        m.hits = 1;
        m.priority = prio;
        pages_[key] = m;
        ++r.inserted;
      }
    }
    if (pol_ == Pol::adaptive && r.inserted > 0) {
      // The new pages are stored as one run: used again if all of them are
      // ghosts, each ghost found (shallowest first) moving the target.
      bool all = true;
      for (std::size_t k = r.cached + 1; k <= q; ++k) {
        const int tag = take_ghost(ghost_key(ns, t, k));
        all = all && tag != 0;
        if (tag != 0) adapt(tag);
      }
      for (std::size_t k = r.cached + 1; k <= q; ++k)
        at(ns, t, k).reused = all;
    }
    r.handle = handle_for(ns, t, q);
    return r;
  }

  bool lock(const ModelHandle& h) {
    if (h.prefix.empty()) return true;
    if (!valid(h)) return false;
    for (std::size_t k = 1; k * ps_ <= h.prefix.size(); ++k)
      ++at(h.ns, h.prefix, k).lock;
    ++at(h.ns, h.prefix, h.prefix.size() / ps_).own;
    return true;
  }

  bool unlock(const ModelHandle& h) {
    if (h.prefix.empty()) return true;
    if (!valid(h) || at(h.ns, h.prefix, h.prefix.size() / ps_).own == 0) return false;
    --at(h.ns, h.prefix, h.prefix.size() / ps_).own;
    for (std::size_t k = 1; k * ps_ <= h.prefix.size(); ++k)
      --at(h.ns, h.prefix, k).lock;
    return true;
  }

  [[nodiscard]] bool valid(const ModelHandle& h) const {
    if (h.prefix.empty()) return true;
    const auto it = pages_.find(std::make_pair(h.ns, h.prefix));
    return it != pages_.end() && it->second.birth == h.birth;
  }

  // Frees min(n, evictable) pages one at a time; returns their ids in order.
  std::vector<PageId> evict(std::size_t n) {
    std::vector<PageId> out;
    while (out.size() < n) {
      if (pol_ == Pol::adaptive) {
        // ARC's pick, then the least recent evictable page of that class, else
        // of the other one.
        std::size_t once = 0;
        for (const auto& [k, m] : pages_)
          once += m.reused ? 0U : 1U;
        const bool from_once = once > 0 && static_cast<double>(once) > p_;
        auto it = best_page(from_once ? 0 : 1);
        if (it == pages_.end()) it = best_page(from_once ? 1 : 0);
        if (it == pages_.end()) break;
        out.push_back(it->second.id);
        push_ghost(ghost_key(it->first.first, it->first.second, it->first.second.size() / ps_),
                   it->second.reused ? 2 : 1);
        pages_.erase(it);
        continue;
      }
      auto best = pages_.end();
      bool tie = false;
      for (auto it = pages_.begin(); it != pages_.end(); ++it) {
        if (it->second.lock > 0 || extended(it->first)) continue;
        if (best == pages_.end() || model_key(pol_, it->second) < model_key(pol_, best->second)) {
          best = it;
          tie = false;
        } else if (!(model_key(pol_, best->second) < model_key(pol_, it->second))) {
          tie = true;
        }
      }
      if (best == pages_.end()) break;
      REQUIRE_FALSE(tie);  // the rules make leaf keys unique; a tie would leave order open
      out.push_back(best->second.id);
      pages_.erase(best);
    }
    return out;
  }

  // Pages of `ns` (all namespaces when nullopt) or nullopt if one is locked.
  std::optional<std::multiset<PageId>> drop(std::optional<std::uint64_t> ns) {
    std::multiset<PageId> out;
    for (const auto& [k, m] : pages_)
      if (!ns || k.first == *ns) {
        if (m.lock > 0) return std::nullopt;
        out.insert(m.id);
      }
    for (auto it = pages_.begin(); it != pages_.end();)
      it = (!ns || it->first.first == *ns) ? pages_.erase(it) : std::next(it);
    return out;
  }

  [[nodiscard]] std::size_t cached() const { return pages_.size(); }
  [[nodiscard]] std::size_t locked() const {
    std::size_t k = 0;
    for (const auto& [key, m] : pages_)
      k += m.lock > 0 ? 1U : 0U;
    return k;
  }

 private:
  using PageKey = std::pair<std::uint64_t, Tokens>;
  // A ghost is known by namespace, page position and the page's tokens (all of
  // them: the pages here are shorter than the policy's token sample).
  using GhostKey = std::tuple<std::uint64_t, std::size_t, Tokens>;
  struct Ghost {
    GhostKey key;
    int tag = 0;  // 1: evicted while used once, 2: after reuse, 0: came back
  };

  [[nodiscard]] GhostKey ghost_key(std::uint64_t ns, const Tokens& t, std::size_t k) const {
    return {ns, k - 1, Tokens(t.begin() + long((k - 1) * ps_), t.begin() + long(k * ps_))};
  }

  [[nodiscard]] std::size_t live_ghosts() const {
    std::size_t n = 0;
    for (std::size_t i = ghost_tail_; i < ghosts_.size(); ++i)
      n += ghosts_[i].tag != 0 ? 1U : 0U;
    return n;
  }

  [[nodiscard]] std::size_t ghosts_tagged(int tag) const {
    std::size_t n = 0;
    for (std::size_t i = ghost_tail_; i < ghosts_.size(); ++i)
      n += ghosts_[i].tag == tag ? 1U : 0U;
    return n;
  }

  int take_ghost(const GhostKey& key) {
    for (std::size_t i = ghost_tail_; i < ghosts_.size(); ++i)
      if (ghosts_[i].tag != 0 && ghosts_[i].key == key) {
        const int tag = ghosts_[i].tag;
        ghosts_[i].tag = 0;
        return tag;
      }
    return 0;
  }

  // At most ghost_limit_ live ghosts, and at most twice that many entries from
  // the oldest kept one on (ghosts that came back included): the oldest go first.
  void push_ghost(const GhostKey& key, int tag) {
    if (ghost_limit_ == 0) return;
    (void)take_ghost(key);
    while (live_ghosts() >= ghost_limit_ || ghosts_.size() - ghost_tail_ == 2 * ghost_limit_)
      ++ghost_tail_;
    ghosts_.push_back({key, tag});
  }

  // ARC's adaptation, scaled by the step (the ghost that hit still counted).
  void adapt(int tag) {
    const double b1 = double(ghosts_tagged(1)) + (tag == 1 ? 1.0 : 0.0);
    const double b2 = double(ghosts_tagged(2)) + (tag == 2 ? 1.0 : 0.0);
    if (tag == 1)
      p_ = std::min(double(arc_.capacity), p_ + arc_.step * std::max(b2 / b1, 1.0));
    else
      p_ = std::max(0.0, p_ - arc_.step * std::max(b1 / b2, 1.0));
  }

  // The least recently used evictable page of class `cls` (0: used once).
  std::map<PageKey, PageMeta>::iterator best_page(int cls) {
    auto best = pages_.end();
    for (auto it = pages_.begin(); it != pages_.end(); ++it) {
      if (it->second.lock > 0 || (it->second.reused ? 1 : 0) != cls || extended(it->first))
        continue;
      if (best == pages_.end() || it->second.last_access < best->second.last_access) best = it;
    }
    return best;
  }

  PageMeta& at(std::uint64_t ns, const Tokens& t, std::size_t k) {
    return pages_.at(std::make_pair(ns, Tokens(t.begin(), t.begin() + long(k * ps_))));
  }

  [[nodiscard]] Match walk(const Tokens& t, std::uint64_t ns) const {
    Match r;
    std::size_t k = 0;
    while ((k + 1) * ps_ <= t.size()) {
      const auto it =
          pages_.find(std::make_pair(ns, Tokens(t.begin(), t.begin() + long((k + 1) * ps_))));
      if (it == pages_.end()) break;
      r.pages.push_back(it->second.id);
      ++k;
    }
    r.matched = k * ps_;
    r.handle = handle_for(ns, t, k);
    return r;
  }

  [[nodiscard]] ModelHandle handle_for(std::uint64_t ns, const Tokens& t, std::size_t k) const {
    ModelHandle h;
    h.ns = ns;
    if (k == 0) return h;
    h.prefix.assign(t.begin(), t.begin() + long(k * ps_));
    h.birth = pages_.at(std::make_pair(ns, h.prefix)).birth;
    return h;
  }

  [[nodiscard]] bool extended(const PageKey& key) const {
    // The next key in order with the same namespace starting with this prefix
    // and one page longer, if any, sorts right after every key it extends.
    for (auto it = pages_.upper_bound(key); it != pages_.end(); ++it) {
      if (it->first.first != key.first) return false;
      const Tokens& o = it->first.second;
      if (o.size() < key.second.size() ||
          !std::equal(key.second.begin(), key.second.end(), o.begin()))
        return false;
      if (o.size() == key.second.size() + ps_) return true;
    }
    return false;
  }

  std::size_t ps_;
  Pol pol_;
  Arc arc_;
  std::size_t ghost_limit_;
  std::vector<Ghost> ghosts_;
  std::size_t ghost_tail_ = 0;
  double p_ = 0.0;
  std::map<PageKey, PageMeta> pages_;
  std::uint64_t tick_ = 0;
  std::uint64_t births_ = 0;
};

template <class Policy>
void run(Pol pol, std::size_t page_size, std::uint32_t seed, int steps, Policy policy = Policy{},
         Arc arc = {}) {
  std::mt19937 rng(seed);
  std::vector<KvEvent> events;
  PagedPrefixCache<PageId, Policy> cache(page_size, std::move(policy),
                                         [&](const KvEvent& e) { events.push_back(e); });
  Model model(page_size, pol, arc);
  KvIndex index;
  const KvWorker worker{7, 0};
  std::vector<std::uint64_t> namespaces{0, 1, 2};
  cache.configure_namespace(2, "adapter", "");

  // Documents that queries and inserts are drawn from: shared prefixes, pages
  // that differ only after their first token, small alphabets.
  std::vector<Tokens> docs;
  const auto rnd = [&](std::size_t n) {
    return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
  };
  for (int d = 0; d < 12; ++d) {
    Tokens t;
    if (d > 0 && rnd(2) == 0) {
      const Tokens& base = docs[rnd(docs.size())];
      t.assign(base.begin(), base.begin() + long(rnd(base.size() + 1)));
    }
    const std::size_t extra = 1 + rnd(8 * page_size);
    for (std::size_t i = 0; i < extra; ++i)
      t.push_back(static_cast<std::uint32_t>(rnd(3)));
    docs.push_back(t);
  }
  const auto query = [&] {
    Tokens t = docs[rnd(docs.size())];
    t.resize(rnd(t.size() + 1));
    if (!t.empty() && rnd(4) == 0) t[rnd(t.size())] ^= 1U;
    if (rnd(3) == 0)
      for (std::size_t i = rnd(3 * page_size); i > 0; --i)
        t.push_back(static_cast<std::uint32_t>(rnd(3)));
    return t;
  };

  struct Held {
    PagedPrefixHandle real;
    ModelHandle model;
  };
  std::vector<Held> held;
  PageId next_id = 1;

  const auto mirror_ok = [&](const Tokens& t, std::uint64_t ns) {
    promptcache::BlockHashOptions o;
    o.seed = cache.namespace_seed(ns);
    const auto hashes = promptcache::local_block_hashes(t, page_size, o);
    const auto m = index.find_matches(hashes);
    const std::size_t routed = m.empty() ? 0 : m.at(0).blocks;
    return routed * page_size == cache.peek(t, ns);
  };

  for (int step = 0; step < steps; ++step) {
    const std::size_t op = rnd(100);
    const std::uint64_t ns = namespaces[rnd(namespaces.size())];
    INFO("step " << step << " op " << op);
    if (op < 30) {  // match through one of its overloads, sometimes keep the handle
      const Tokens t = query();
      const std::size_t form = rnd(3);
      if (form < 2) {
        auto r = cache.match(t, ns);
        if (form == 1) {  // into a reused vector holding stale ids
          std::vector<PageId> pages(3, 7);
          const auto e = cache.match(t, ns, pages);
          r = {e.matched, pages, e.handle};
        }
        const auto m = model.match(t, ns);
        REQUIRE(r.matched == m.matched);
        REQUIRE(r.pages == m.pages);
        REQUIRE(cache.valid(r.handle));
        if (rnd(2) == 0) held.push_back({r.handle, m.handle});
      } else {  // into a caller's table, sometimes shorter than the query: a shorter query
        const std::size_t q_pages = t.size() / page_size;
        const std::size_t room = rnd(2) == 0 ? q_pages + rnd(2) : rnd(q_pages + 1);
        constexpr PageId unset = std::numeric_limits<PageId>::max();
        std::vector<PageId> table(room + 1, unset);
        const auto r = cache.match(t, ns, std::span<PageId>(table.data(), room));
        const std::size_t used = std::min(room, q_pages) * page_size;
        const auto m = model.match(Tokens(t.begin(), t.begin() + long(used)), ns);
        REQUIRE(r.matched == m.matched);
        REQUIRE(std::equal(m.pages.begin(), m.pages.end(), table.begin()));
        REQUIRE(std::all_of(table.begin() + long(m.pages.size()), table.end(),
                            [](PageId p) { return p == unset; }));
        REQUIRE(cache.valid(r.handle));
        if (rnd(2) == 0) held.push_back({r.handle, m.handle});
      }
    } else if (op < 55) {  // insert: cached ids for what matches, fresh ids after
      const Tokens t = query();
      const auto m = model.peek(t, ns) / page_size;
      std::vector<PageId> ids;
      const auto known = cache.match(t, ns).pages;  // (a lookup first, as an engine does)
      model.match(t, ns);
      REQUIRE(known.size() == m);
      for (std::size_t i = 0; i < t.size() / page_size + rnd(2); ++i)
        ids.push_back(i < known.size() && rnd(4) != 0 ? known[i] : next_id++);
      const std::int64_t prio = static_cast<std::int64_t>(rnd(3));
      const auto r = cache.insert(t, ids, ns, prio);
      const auto e = model.insert(t, ids, ns, prio);
      REQUIRE(r.cached_pages == e.cached);
      REQUIRE(r.inserted_pages == e.inserted);
      REQUIRE(r.duplicates == e.duplicates);
      if (rnd(2) == 0 && !r.handle.empty()) held.push_back({r.handle, e.handle});
    } else if (op < 67 && !held.empty()) {  // lock
      const Held& h = held[rnd(held.size())];
      REQUIRE(cache.lock(h.real) == model.lock(h.model));
    } else if (op < 80 && !held.empty()) {  // unlock (below zero included)
      const std::size_t i = rnd(held.size());
      REQUIRE(cache.unlock(held[i].real) == model.unlock(held[i].model));
      if (rnd(3) == 0) held.erase(held.begin() + long(i));
    } else if (op < 95) {  // evict
      const std::size_t n = rnd(6 + 4 * page_size);
      std::vector<PageId> got;
      const std::size_t k = cache.evict(n, [&](PageId p) { got.push_back(p); });
      const auto want = model.evict(n);
      REQUIRE(got == want);
      REQUIRE(k == got.size());
    } else if (op < 98) {  // erase a namespace
      std::multiset<PageId> got;
      const bool ok = cache.erase_namespace(ns, [&](PageId p) { got.insert(p); });
      const auto want = model.drop(ns);
      REQUIRE(ok == want.has_value());
      if (ok) REQUIRE(got == *want);
      if (ok && ns == 2) cache.configure_namespace(2, "adapter", "");
    } else {  // clear
      std::multiset<PageId> got;
      const bool ok = cache.clear([&](PageId p) { got.insert(p); });
      const auto want = model.drop(std::nullopt);
      REQUIRE(ok == want.has_value());
      if (ok) REQUIRE(got == *want);
    }
    // Counters and invariants after every step.
    REQUIRE(cache.cached_pages() == model.cached());
    REQUIRE(cache.locked_pages() == model.locked());
    REQUIRE(cache.evictable_pages() == model.cached() - model.locked());
    for (const Held& h : held)
      REQUIRE(cache.valid(h.real) == model.valid(h.model));
    REQUIRE(cache.check_invariants());
    if constexpr (std::is_same_v<Policy, eviction::Adaptive>)
      REQUIRE(cache.policy().target() == model.target());
    // The mirror: a KvIndex fed only by the events answers what the cache matches.
    for (const KvEvent& e : events)
      REQUIRE(index.apply(worker, e).ok());
    events.clear();
    REQUIRE(index.block_count(worker) == cache.cached_pages());
    for (const Tokens& d : docs)
      for (const std::uint64_t n : namespaces)
        REQUIRE(mirror_ok(d, n));
    for (int i = 0; i < 3; ++i)
      REQUIRE(mirror_ok(query(), namespaces[rnd(namespaces.size())]));
  }
}

}  // namespace

TEST_CASE("paged cache differential: every policy and page size agrees with the model") {
  const int steps = 1500;
  for (const std::size_t ps : {1U, 2U, 4U}) {
    for (std::uint32_t seed = 1; seed <= 3; ++seed) {
      INFO("page size " << ps << " seed " << seed);
      SECTION("lru " + std::to_string(ps) + "/" + std::to_string(seed)) {
        run<eviction::Lru>(Pol::lru, ps, seed, steps);
      }
      SECTION("lfu " + std::to_string(ps) + "/" + std::to_string(seed)) {
        run<eviction::Lfu>(Pol::lfu, ps, seed, steps);
      }
      SECTION("fifo " + std::to_string(ps) + "/" + std::to_string(seed)) {
        run<eviction::Fifo>(Pol::fifo, ps, seed, steps);
      }
      SECTION("priority " + std::to_string(ps) + "/" + std::to_string(seed)) {
        run<eviction::Priority>(Pol::priority, ps, seed, steps);
      }
      SECTION("slru " + std::to_string(ps) + "/" + std::to_string(seed)) {
        run<eviction::Slru>(Pol::slru, ps, seed, steps);
      }
      SECTION("mru " + std::to_string(ps) + "/" + std::to_string(seed)) {
        run<eviction::Mru>(Pol::mru, ps, seed, steps);
      }
      SECTION("filo " + std::to_string(ps) + "/" + std::to_string(seed)) {
        run<eviction::Filo>(Pol::filo, ps, seed, steps);
      }
      // A small capacity and full ARC steps, so that the target moves both
      // ways and the ghost history wraps; then the default factor and step.
      SECTION("adaptive " + std::to_string(ps) + "/" + std::to_string(seed)) {
        run<eviction::Adaptive>(Pol::adaptive, ps, seed, steps, eviction::Adaptive(6, 1.0, 1.0),
                                {6, 1.0, 1.0});
      }
      SECTION("adaptive defaults " + std::to_string(ps) + "/" + std::to_string(seed)) {
        run<eviction::Adaptive>(Pol::adaptive, ps, seed, steps, eviction::Adaptive(12),
                                {12, 8.0, 1.0});
      }
    }
  }
}
