// A naive reference model of PagedPrefixCache, written from the rules alone: a
// map from each cached page-aligned prefix (per namespace) to that page's id,
// lock counts and policy metadata; match walks prefixes page by page; evict
// frees, one page at a time, the unlocked page that no cached page extends
// with the smallest policy key. For eviction::Adaptive it also keeps ARC's
// state page by page: which pages were used again, the target p, and the ghost
// history as a plain list in eviction order; each page evicted comes from the
// class ARC picks (used once while more than p pages are, else used again),
// falling back to the other class when the picked one has no evictable page.
// O(pages) or worse per call: obviously correct, not fast. The randomized
// differential test and the fuzz harness drive the cache and this model with
// the same operations and compare every answer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

namespace paged_model {

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
  // Live ghosts evicted while used once (tag 1) or after reuse (tag 2).
  [[nodiscard]] std::size_t ghosts(int tag) const { return ghosts_tagged(tag); }

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
      auto it = pages_.find(prefix_of(ns, t, k));
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
        pages_[std::make_pair(ns, Tokens(t.begin(), t.begin() + long(k * ps_)))] = m;
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
    const auto it = pages_.find(KeyView{h.ns, h.prefix});
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
      // The rules make leaf keys unique; a tie would leave the order open.
      ties_ += tie ? 1U : 0U;
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

  // Locks taken with handles ending where `h` ends (0 for the empty or a stale handle).
  [[nodiscard]] std::uint64_t own(const ModelHandle& h) const {
    if (h.prefix.empty() || !valid(h)) return 0;
    return page(KeyView{h.ns, h.prefix}).own;
  }

  // evict() steps that found two evictable leaves with the same key (the rules exclude it).
  [[nodiscard]] std::size_t ties() const { return ties_; }

  // Pages cached in namespace `ns`.
  [[nodiscard]] std::size_t cached_in(std::uint64_t ns) const {
    std::size_t k = 0;
    for (const auto& [key, m] : pages_)
      k += key.first == ns ? 1U : 0U;
    return k;
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
  // A key seen without copying its tokens, for lookups.
  struct KeyView {
    std::uint64_t ns;
    std::span<const std::uint32_t> prefix;
  };
  // std::pair's order (namespace, then tokens lexicographically), also between a
  // PageKey and a KeyView.
  struct KeyLess {
    using is_transparent = void;
    static KeyView view(const PageKey& k) { return {k.first, k.second}; }
    static KeyView view(const KeyView& k) { return k; }
    template <class A, class B>
    bool operator()(const A& a, const B& b) const {
      const KeyView x = view(a);
      const KeyView y = view(b);
      if (x.ns != y.ns) return x.ns < y.ns;
      return std::lexicographical_compare(x.prefix.begin(), x.prefix.end(), y.prefix.begin(),
                                          y.prefix.end());
    }
  };
  using PageMap = std::map<PageKey, PageMeta, KeyLess>;
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
  PageMap::iterator best_page(int cls) {
    auto best = pages_.end();
    for (auto it = pages_.begin(); it != pages_.end(); ++it) {
      if (it->second.lock > 0 || (it->second.reused ? 1 : 0) != cls || extended(it->first))
        continue;
      if (best == pages_.end() || it->second.last_access < best->second.last_access) best = it;
    }
    return best;
  }

  // The first k pages of t in namespace ns.
  [[nodiscard]] KeyView prefix_of(std::uint64_t ns, const Tokens& t, std::size_t k) const {
    return {ns, std::span<const std::uint32_t>(t.data(), k * ps_)};
  }

  // The page under `key` in `pages` (const or not), which must be cached (as std::map::at).
  template <class Pages>
  static auto& page_in(Pages& pages, const KeyView& key) {
    const auto it = pages.find(key);
    if (it == pages.end()) throw std::out_of_range("paged_model: no such page");
    return it->second;
  }
  const PageMeta& page(const KeyView& key) const { return page_in(pages_, key); }
  // The k-th page of t in namespace ns, which must be cached.
  PageMeta& at(std::uint64_t ns, const Tokens& t, std::size_t k) {
    return page_in(pages_, prefix_of(ns, t, k));
  }

  [[nodiscard]] Match walk(const Tokens& t, std::uint64_t ns) const {
    Match r;
    std::size_t k = 0;
    while ((k + 1) * ps_ <= t.size()) {
      const auto it = pages_.find(prefix_of(ns, t, k + 1));
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
    h.birth = page(KeyView{ns, h.prefix}).birth;
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
  PageMap pages_;
  std::uint64_t tick_ = 0;
  std::uint64_t births_ = 0;
  std::size_t ties_ = 0;
};

}  // namespace paged_model
