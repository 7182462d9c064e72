// A naive reference model of PagedPrefixCache, written from the rules alone: a
// map from each cached page-aligned prefix (per namespace) to that page's id,
// lock counts and policy metadata; match walks prefixes page by page; evict
// frees, one page at a time, the unlocked page that no cached page extends
// with the smallest policy key. O(pages) or worse per call: obviously correct,
// not fast. The randomized differential test and the fuzz harness drive the
// cache and this model with the same operations and compare every answer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <set>
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
};

using Key = std::tuple<std::int64_t, std::int64_t>;  // compared lexicographically

enum class Pol { lru, lfu, fifo, priority, slru, mru, filo };

Key model_key(Pol p, const PageMeta& m) {
  const auto t = static_cast<std::int64_t>(m.last_access);
  const auto c = static_cast<std::int64_t>(m.created);
  const auto h = static_cast<std::int64_t>(m.hits);
  switch (p) {
    case Pol::lru:
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

class Model {
 public:
  Model(std::size_t page_size, Pol pol) : ps_(page_size), pol_(pol) {}

  struct Match {
    std::size_t matched = 0;
    std::vector<PageId> pages;
    ModelHandle handle;
  };

  Match match(const Tokens& t, std::uint64_t ns) {
    ++tick_;
    Match r = walk(t, ns);
    for (std::size_t k = 1; k * ps_ <= r.matched; ++k)
      at(ns, t, k).last_access = tick_;
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
    return pages_.at(std::make_pair(h.ns, h.prefix)).own;
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
  std::map<PageKey, PageMeta> pages_;
  std::uint64_t tick_ = 0;
  std::uint64_t births_ = 0;
  std::size_t ties_ = 0;
};

}  // namespace paged_model
