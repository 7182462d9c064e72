// A linear-scan reference model of PromptCachePool, written from the documented rules
// (obviously correct, O(entries x length)). The randomized differential test and the
// fuzz harness drive the pool and this model with the same operations and compare
// every observable result with compare_state() and compare_lookup() below, which
// report each comparison to a callback (Catch2's REQUIRE in the test, an abort in
// the harness), from the same token values (palette()).
#pragma once

#include <promptcache/manual_clock.hpp>
#include <promptcache/prompt_cache_pool.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace pool_model {

using promptcache::ManualClock;
using promptcache::MatchMode;

struct Layer {
  int tag = 0;
  std::size_t bytes = 0;
};

struct LayerBytes {
  std::size_t operator()(const Layer& l) const noexcept { return l.bytes; }
};

template <class Tok>
using PoolT = promptcache::PromptCachePool<Layer, Tok, ManualClock, LayerBytes>;
using Pool = PoolT<std::uint16_t>;  // Options and InsertResult do not depend on the token type
using R = Pool::InsertResult;
using ns_t = std::uint64_t;

template <class Tok>
struct ModelHit {
  using Ids = std::vector<Tok>;
  int tag;
  std::size_t matched;
  Ids ids;
};

// 128-bit integers (a GCC and Clang extension) for the model's time and byte arithmetic, so
// that it needs no overflow guards of its own.
__extension__ typedef __int128 wide;
__extension__ typedef unsigned __int128 uwide;

// The reference: a vector scanned linearly, following the documented rules literally.
template <class Tok>
class Model {
 public:
  using Ids = std::vector<Tok>;
  struct E {
    Ids ids;
    ns_t ns;
    bool pinned;
    std::int64_t last_used;
    std::uint64_t seq;
    std::int64_t ttl;
    std::size_t bytes;
    int tag;
  };

  explicit Model(const Pool::Options& o) : opt_(o) {}

  std::int64_t now = 0;
  promptcache::PoolStats stats;

  static bool is_prefix(const Ids& a, const Ids& b) {
    return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
  }
  static std::size_t lcp(const Ids& a, const Ids& b) {
    std::size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i])
      ++i;
    return i;
  }

  // The time the pool works with: the clock reading, but never earlier than one it already
  // used (a clock that goes back makes entries look younger, never older).
  std::int64_t read_clock() {
    latest_ = std::max(now, latest_);
    return latest_;
  }

  // Expired at `t`: unpinned and idle for at least its TTL (a negative TTL counts as 0),
  // unless the TTL is the maximum or its deadline is past the clock's range ("never"). The
  // deadline is computed exactly, in 128 bits, rather than by guarding a 64-bit sum.
  static bool expired(const E& e, std::int64_t t) {
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    if (e.pinned || e.ttl == kMax) return false;
    const wide deadline = static_cast<wide>(e.last_used) + (e.ttl < 0 ? 0 : e.ttl);
    if (deadline > static_cast<wide>(kMax)) return false;
    return deadline <= static_cast<wide>(t);
  }

  std::size_t expire() {
    const std::int64_t t = read_clock();
    std::size_t n = 0;
    for (std::size_t i = 0; i < es_.size();) {
      if (expired(es_[i], t)) {
        remove(i);
        ++stats.evicted_ttl;
        ++n;
      } else {
        ++i;
      }
    }
    return n;
  }

  std::optional<ModelHit<Tok>> lookup(const Ids& q, ns_t ns) {
    expire();
    ++stats.lookups;
    stats.query_tokens += q.size();
    if (q.empty()) return std::nullopt;
    const std::size_t limit = opt_.keep_one_token ? q.size() - 1 : q.size();
    E* best = nullptr;
    std::size_t best_m = 0;
    for (E& e : es_) {
      if (e.ns != ns) continue;
      if (opt_.match == MatchMode::exact_prefix) {
        if (e.ids.size() <= limit && is_prefix(e.ids, q) && (!best || e.ids.size() > best_m)) {
          best = &e;
          best_m = e.ids.size();
        }
      } else {
        const std::size_t m = std::min(lcp(e.ids, q), limit);
        if (m == 0) continue;
        auto key_better = [&](const E& a, std::size_t ma, const E& b, std::size_t mb) {
          if (ma != mb) return ma > mb;
          const bool a0 = a.ids.size() == ma, b0 = b.ids.size() == mb;
          if (a0 != b0) return a0;
          if (a.ids.size() != b.ids.size()) return a.ids.size() < b.ids.size();
          return a.seq > b.seq;
        };
        if (!best || key_better(e, m, *best, best_m)) {
          best = &e;
          best_m = m;
        }
      }
    }
    if (!best || best_m < opt_.min_match_tokens) return std::nullopt;
    best->seq = ++seq_;
    best->last_used = latest_;
    ++stats.hits;
    stats.matched_tokens += best_m;
    return ModelHit<Tok>{best->tag, best_m, best->ids};
  }

  R insert(const Ids& ids, int tag, bool pinned, std::optional<std::int64_t> ttl, ns_t ns,
           std::size_t bytes) {
    if (ids.empty()) {
      ++stats.rejected_empty;
      return R::rejected_empty;
    }
    bool any_prefix = false;
    for (const E& e : es_)
      any_prefix = any_prefix || (e.ns == ns && is_prefix(e.ids, ids));
    if (ids.size() < opt_.min_cacheable_tokens && !any_prefix) {
      ++stats.rejected_too_short;
      return R::rejected_too_short;
    }
    if (opt_.max_bytes != 0 && bytes > opt_.max_bytes) {
      ++stats.rejected_too_large;
      return R::rejected_too_large;
    }
    const std::int64_t t = read_clock();  // rejections above leave the pool's time alone
    // An explicit TTL wins; without one, the replaced entry's TTL carries over.
    R result = R::inserted;
    auto exact = std::find_if(es_.begin(), es_.end(),
                              [&](const E& e) { return e.ns == ns && e.ids == ids; });
    if (exact != es_.end()) {
      exact->pinned = exact->pinned || pinned;
      exact->seq = ++seq_;
      exact->last_used = t;
      if (ttl) exact->ttl = *ttl;
      exact->bytes = bytes;
      exact->tag = tag;
      result = R::updated;
      ++stats.updated;
    } else {
      std::optional<std::size_t> lineage;
      for (std::size_t i = 0; i < es_.size(); ++i) {
        const E& e = es_[i];
        if (e.ns == ns && !e.pinned && e.ids.size() < ids.size() && is_prefix(e.ids, ids) &&
            (!lineage || e.ids.size() > es_[*lineage].ids.size())) {
          lineage = i;
        }
      }
      const std::int64_t e_ttl = ttl ? *ttl : lineage ? es_[*lineage].ttl : opt_.ttl.count();
      es_.push_back(E{ids, ns, pinned, t, ++seq_, e_ttl, bytes, tag});
      if (lineage) {
        const Ids lineage_ids = es_[*lineage].ids;
        result = R::extended;
        ++stats.extended;
        for (std::size_t i = 0; i < es_.size();) {
          const E& e = es_[i];
          const bool is_lineage = e.ns == ns && e.ids == lineage_ids;
          const bool superseded = opt_.match == MatchMode::common_prefix && e.ns == ns &&
                                  !e.pinned && e.ids.size() < ids.size() && is_prefix(e.ids, ids);
          if (is_lineage) {
            remove(i);
          } else if (superseded) {
            remove(i);
            ++stats.superseded;
          } else {
            ++i;
          }
        }
      } else {
        ++stats.inserted;
      }
    }
    enforce();
    return result;
  }

  // Over a budget, expired entries go first, then the least recently used.
  void enforce() {
    if (es_.size() <= opt_.max_entries && !over_bytes()) return;
    expire();
    while (es_.size() > opt_.max_entries && evict_lru())
      ++stats.evicted_lru;
    while (over_bytes() && evict_lru()) {
      ++stats.evicted_bytes;
    }
  }

  bool erase(const Ids& ids, ns_t ns) {
    for (std::size_t i = 0; i < es_.size(); ++i) {
      if (es_[i].ns == ns && es_[i].ids == ids) {
        remove(i);
        ++stats.evicted_explicit;
        return true;
      }
    }
    return false;
  }

  std::size_t erase_namespace(ns_t ns) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < es_.size();) {
      if (es_[i].ns == ns) {
        remove(i);
        ++n;
      } else {
        ++i;
      }
    }
    stats.evicted_explicit += n;
    return n;
  }

  // Expires first (an expired entry is collected, not pinned), then pins or unpins.
  bool pin(const Ids& ids, ns_t ns, bool on) {
    expire();
    for (E& e : es_) {
      if (e.ns == ns && e.ids == ids) {
        if (on) {
          e.pinned = true;
        } else if (e.pinned) {
          e.pinned = false;
          e.seq = ++seq_;
          e.last_used = latest_;
          enforce();
        }
        return true;
      }
    }
    return false;
  }

  const std::vector<E>& entries() const { return es_; }
  // The exact sum of the entries' sizes, in 128 bits (far more entries than a run stores
  // could not overflow it).
  uwide exact_bytes() const {
    uwide sum = 0;
    for (const E& e : es_)
      sum += e.bytes;
    return sum;
  }
  // The byte gauge: the sum, saturating at SIZE_MAX.
  std::size_t total_bytes() const {
    const uwide sum = exact_bytes();
    constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
    return sum > kMax ? kMax : static_cast<std::size_t>(sum);
  }
  bool over_bytes() const { return opt_.max_bytes != 0 && exact_bytes() > opt_.max_bytes; }
  std::size_t pinned_count() const {
    return static_cast<std::size_t>(
        std::count_if(es_.begin(), es_.end(), [](const E& e) { return e.pinned; }));
  }

 private:
  bool evict_lru() {
    std::optional<std::size_t> v;
    for (std::size_t i = 0; i < es_.size(); ++i) {
      if (!es_[i].pinned && (!v || es_[i].seq < es_[*v].seq)) v = i;
    }
    if (!v) return false;
    remove(*v);
    return true;
  }
  void remove(std::size_t i) { es_.erase(es_.begin() + static_cast<std::ptrdiff_t>(i)); }

  Pool::Options opt_;
  std::vector<E> es_;
  std::uint64_t seq_ = 0;
  std::int64_t latest_ = std::numeric_limits<std::int64_t>::min();
};

// The model's options as those of pool type `P` (each pool and token type has its own
// nested Options type), field by field.
template <class P>
typename P::Options pool_options(const Pool::Options& o) {
  typename P::Options r;
  r.max_entries = o.max_entries;
  r.ttl = o.ttl;
  r.min_cacheable_tokens = o.min_cacheable_tokens;
  r.match = o.match;
  r.keep_one_token = o.keep_one_token;
  r.min_match_tokens = o.min_match_tokens;
  r.max_bytes = o.max_bytes;
  return r;
}

// The id of a run's namespace `i`: spread out, so that ids are not just 0, 1, 2.
constexpr ns_t namespace_id(std::uint32_t i) {
  return static_cast<ns_t>(i) * ns_t{0x9E37};
}

// Per-entry TTLs at the edges, by index: zero, negative and "never" (the duration's
// maximum); nullopt from index 3 on, where a run picks an ordinary TTL.
constexpr std::optional<std::int64_t> edge_ttl(std::uint32_t i) {
  switch (i) {
    case 0:
      return 0;
    case 1:
      return -5;
    case 2:
      return std::numeric_limits<std::int64_t>::max();
    default:
      return std::nullopt;
  }
}

// The token values runs draw from, by index: small values first, then (for signed
// types) both extremes, -1 and values counting up from the minimum, so ids at the type's
// limits meet in shared prefixes; for unsigned types index 3 is the maximum.
template <class Tok>
Tok palette(std::uint32_t i) {
  using L = std::numeric_limits<Tok>;
  if constexpr (std::is_signed_v<Tok>) {
    switch (i) {
      case 0:
        return Tok{0};
      case 1:
        return L::min();
      case 2:
        return Tok{-1};
      case 3:
        return L::max();
      default:
        return static_cast<Tok>(i % 2 == 0 ? L::min() + static_cast<Tok>(i / 2)
                                           : static_cast<Tok>(i / 2));
    }
  } else {
    return i == 3 ? L::max() : static_cast<Tok>(i);
  }
}

// Calls check(ok, text, file, line) with each comparison and where it stands. A failed
// check must not return (REQUIRE throws, the harness aborts): later checks rely on
// earlier ones.
#define POOL_MODEL_CHECK(cond) check(static_cast<bool>(cond), #cond, __FILE__, __LINE__)

// Compares everything observable of `pool` (a PromptCachePool or a
// SynchronizedPromptCachePool) with `model`: sizes, bytes, every counter, and each
// stored entry's ids, tag and pin.
template <class P, class Tok, class Check>
void compare_state(const P& pool, const Model<Tok>& model, Check&& check) {
  POOL_MODEL_CHECK(pool.size() == model.entries().size());
  POOL_MODEL_CHECK(pool.empty() == model.entries().empty());
  POOL_MODEL_CHECK(pool.bytes() == model.total_bytes());
  const auto ps = pool.stats();
  const auto& ms = model.stats;
  POOL_MODEL_CHECK(ps.lookups == ms.lookups);
  POOL_MODEL_CHECK(ps.hits == ms.hits);
  POOL_MODEL_CHECK(ps.query_tokens == ms.query_tokens);
  POOL_MODEL_CHECK(ps.matched_tokens == ms.matched_tokens);
  POOL_MODEL_CHECK(ps.inserted == ms.inserted);
  POOL_MODEL_CHECK(ps.extended == ms.extended);
  POOL_MODEL_CHECK(ps.updated == ms.updated);
  POOL_MODEL_CHECK(ps.rejected_empty == ms.rejected_empty);
  POOL_MODEL_CHECK(ps.rejected_too_short == ms.rejected_too_short);
  POOL_MODEL_CHECK(ps.rejected_too_large == ms.rejected_too_large);
  POOL_MODEL_CHECK(ps.evicted_lru == ms.evicted_lru);
  POOL_MODEL_CHECK(ps.evicted_ttl == ms.evicted_ttl);
  POOL_MODEL_CHECK(ps.evicted_bytes == ms.evicted_bytes);
  POOL_MODEL_CHECK(ps.evicted_explicit == ms.evicted_explicit);
  POOL_MODEL_CHECK(ps.superseded == ms.superseded);
  POOL_MODEL_CHECK(ps.entries == model.entries().size());
  POOL_MODEL_CHECK(ps.pinned_entries == model.pinned_count());
  POOL_MODEL_CHECK(ps.bytes == model.total_bytes());
  for (const auto& e : model.entries()) {
    const auto got = pool.find_exact(e.ids, e.ns);
    POOL_MODEL_CHECK(got != nullptr);
    POOL_MODEL_CHECK(got->ids == e.ids);
    POOL_MODEL_CHECK(got->caches.size() == 1);
    POOL_MODEL_CHECK(got->caches[0].tag == e.tag);
    POOL_MODEL_CHECK(pool.is_pinned(e.ids, e.ns) == e.pinned);
  }
}

// Compares the pool's answer `got` to find_longest_prefix(q) with the model's `want`,
// and checks independently of the model that the entry really shares `matched`
// tokens with the query.
template <class Hit, class Tok, class Check>
void compare_lookup(const std::optional<Hit>& got, const std::optional<ModelHit<Tok>>& want,
                    const std::vector<Tok>& q, Check&& check) {
  POOL_MODEL_CHECK(got.has_value() == want.has_value());
  if (!got) return;
  POOL_MODEL_CHECK(got->entry->caches[0].tag == want->tag);
  POOL_MODEL_CHECK(got->matched == want->matched);
  POOL_MODEL_CHECK(got->entry->ids == want->ids);
  POOL_MODEL_CHECK(got->trim() == want->ids.size() - want->matched);
  POOL_MODEL_CHECK(got->matched <= q.size());
  POOL_MODEL_CHECK(got->matched <= got->entry->ids.size());
  POOL_MODEL_CHECK(std::equal(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(got->matched),
                              got->entry->ids.begin()));
}

#undef POOL_MODEL_CHECK

}  // namespace pool_model
