// Fuzz harness for PagedPrefixCache. The input chooses the page size (1 included),
// one of the shipped eviction policies (eviction::Adaptive with a capacity, ghost
// factor and step from the input, zeros included), whether an event sink is attached, a few
// documents (shared prefixes, a three-token alphabet, the largest token id) and
// then a sequence of operations on four namespaces (the largest id included):
// match (all three overloads) and peek of truncated, mutated and extended documents;
// insert with cached, fresh, foreign and too few page ids and extreme priorities, its
// sink sometimes throwing (nothing may change) or calling back into the cache (refused);
// lock and unlock (below zero included) of kept handles; evict (with and without a
// callback, up to SIZE_MAX pages); erase_namespace; clear; configure_namespace
// with seeds equal to other namespaces' defaults (refused); a move round trip (each
// moved-from side must be an empty, valid cache).
// Every answer is compared with the naive model of tests/support/paged_model.hpp,
// so are the counters, handle states and (Adaptive) the target and ghost list
// sizes; check_invariants() and the memory bound (token bytes at most twice the
// cached tokens) are checked after every operation, and with a sink a KvIndex fed only by the
// published events must answer what the cache matches (find_matches == match().matched /
// page_size).
#include <fuzzer/FuzzedDataProvider.h>
#include <promptcache/paged_prefix_cache.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fuzz_support.hpp"
#include "support/any_paged_cache.hpp"
#include "support/paged_model.hpp"

namespace {

using paged_model::AnyPagedCache;
using paged_model::Arc;
using paged_model::CacheOf;
using paged_model::Model;
using paged_model::ModelHandle;
using paged_model::PageId;
using paged_model::Pol;
using paged_model::Tokens;
using promptcache::KvEvent;
using promptcache::KvIndex;
using promptcache::KvWorker;
using promptcache::PagedPrefixHandle;
namespace eviction = promptcache::eviction;

constexpr std::uint64_t u64max = std::numeric_limits<std::uint64_t>::max();
constexpr std::uint32_t tokmax = std::numeric_limits<std::uint32_t>::max();
// Namespace 2 starts configured with a LoRA name; the largest id has a default seed.
constexpr std::uint64_t namespaces[] = {0, 1, 2, u64max};
// Above this many cached pages the harness evicts: keeps the model's scans cheap.
constexpr std::size_t max_pages = 256;

fuzz::OperationReport report{"fuzz_paged_prefix_cache"};

// Builds the cache under test, of the policy being fuzzed, with the given sink.
using MakeCache = std::function<std::unique_ptr<AnyPagedCache>(AnyPagedCache::Sink)>;

// The operations and checks reach the cache through AnyPagedCache
// (tests/support/any_paged_cache.hpp), so that they compile once for every policy.
class Harness {
 public:
  Harness(FuzzedDataProvider& in, std::size_t page_size, Pol pol, bool sink, const MakeCache& make,
          Arc arc)
      : in_(in),
        ps_(page_size),
        sink_(sink),
        owned_(make(sink ? AnyPagedCache::Sink([this](const KvEvent& e) { on_event(e); })
                         : AnyPagedCache::Sink{})),
        cache_(*owned_),
        model_(page_size, pol, arc) {
    cache_.configure_namespace(2, "adapter", "");
    const std::size_t n_docs = in_.ConsumeIntegralInRange<std::size_t>(1, 8);
    for (std::size_t d = 0; d < n_docs; ++d) {
      Tokens t;
      if (d > 0 && in_.ConsumeBool()) {
        const Tokens& base = docs_[pick(docs_.size())];
        t.assign(base.begin(), base.begin() + static_cast<long>(pick(base.size() + 1)));
      }
      for (std::size_t i = 1 + pick(8 * ps_); i > 0; --i)
        t.push_back(token());
      docs_.push_back(std::move(t));
    }
  }

  void step() {
    const std::uint64_t ns = namespaces[pick(4)];
    Tokens probe;
    if (model_.cached() > max_pages) {
      evict(model_.cached() / 2);
    } else {
      const int action = in_.ConsumeIntegralInRange<int>(0, 31);
      if (action < 8) {
        probe = query();
        match(probe, ns);
      } else if (action < 10) {
        probe = query();
        FUZZ_CHECK(cache_.peek(probe, ns) == model_.peek(probe, ns));
      } else if (action < 16) {
        probe = query();
        insert(probe, ns);
      } else if (action < 19) {
        lock();
      } else if (action < 22) {
        unlock();
      } else if (action < 26) {
        const std::size_t n =
            in_.ConsumeIntegralInRange<int>(0, 15) == 0 ? SIZE_MAX : pick(6 + 4 * ps_);
        evict(n);
      } else if (action == 26) {
        erase_namespace(ns);
      } else if (action == 27) {
        clear();
      } else if (action == 28) {
        configure(ns);
      } else if (action == 29) {
        move_round_trip();
      } else {
        probe = query();
        const auto m = cache_.memory();
        FUZZ_CHECK(m.token_bytes >= cache_.cached_pages() * ps_ * sizeof(std::uint32_t));
        FUZZ_CHECK(cache_.namespace_count() <= 4);
      }
    }
    check(probe, ns);
  }

  void finish() {
    // Release every lock still held through a kept handle (locks taken through handles
    // dropped since stay), then clear: everything goes unless a lock is left.
    for (const Held& h : held_)
      while (!h.model.prefix.empty() && model_.unlock(h.model))
        FUZZ_CHECK(cache_.unlock(h.real));
    FUZZ_CHECK(cache_.locked_pages() == model_.locked());
    clear();
    if (model_.locked() == 0) {
      FUZZ_CHECK(cache_.cached_pages() == 0);
      FUZZ_CHECK(cache_.node_count() == 0);
    }
    check({}, 0);
  }

 private:
  struct Held {
    PagedPrefixHandle real;
    ModelHandle model;
  };

  std::size_t pick(std::size_t n) { return in_.ConsumeIntegralInRange<std::size_t>(0, n - 1); }

  std::uint32_t token() {
    const auto b = in_.ConsumeIntegral<std::uint8_t>();
    return b == 0xFF ? tokmax : static_cast<std::uint32_t>(b % 3U);
  }

  // A document, truncated, maybe with one token changed, maybe extended.
  Tokens query() {
    Tokens t = docs_[pick(docs_.size())];
    t.resize(pick(t.size() + 1));
    const int how = in_.ConsumeIntegralInRange<int>(0, 7);
    if (!t.empty() && (how & 1) != 0) t[pick(t.size())] ^= 1U;
    if ((how & 2) != 0)
      for (std::size_t i = pick(3 * ps_); i > 0; --i)
        t.push_back(token());
    return t;
  }

  void keep(const PagedPrefixHandle& real, const ModelHandle& model) {
    if (held_.size() < 16 && in_.ConsumeBool()) held_.push_back({real, model});
  }

  void match(const Tokens& t, std::uint64_t ns) {
    ++lookups_;
    const int form = in_.ConsumeIntegralInRange<int>(0, 2);
    if (form == 2) {
      // Into a caller's table, sometimes shorter than the query (which caps the match like a
      // shorter query would): only out[0, matched pages) may be written.
      constexpr PageId unset = 0xA5A5A5A5U;
      const std::size_t q = t.size() / ps_;
      const std::size_t room = in_.ConsumeBool() ? q : pick(q + 2);
      pages_.assign(room + 1, unset);
      const auto r = cache_.match(t, ns, std::span<PageId>(pages_.data(), room));
      const std::size_t used = std::min(room, q) * ps_;
      const auto m =
          model_.match(Tokens(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(used)), ns);
      FUZZ_CHECK(r.matched == m.matched);
      FUZZ_CHECK(std::equal(m.pages.begin(), m.pages.end(), pages_.begin()));
      for (std::size_t i = m.pages.size(); i < pages_.size(); ++i)
        FUZZ_CHECK(pages_[i] == unset);
      FUZZ_CHECK(cache_.valid(r.handle));
      FUZZ_CHECK(r.handle.empty() == (m.matched == 0));
      keep(r.handle, m.handle);
      return;
    }
    const auto m = model_.match(t, ns);
    if (form == 0) {
      const auto r = cache_.match(t, ns);
      FUZZ_CHECK(r.matched == m.matched);
      FUZZ_CHECK(r.pages == m.pages);
      FUZZ_CHECK(cache_.valid(r.handle));
      FUZZ_CHECK(r.handle.empty() == (m.matched == 0));
      keep(r.handle, m.handle);
    } else {
      pages_.assign(pick(4), 7U);  // stale contents the call must clear
      const auto r = cache_.match(t, ns, pages_);
      FUZZ_CHECK(r.matched == m.matched);
      FUZZ_CHECK(pages_ == m.pages);
      FUZZ_CHECK(cache_.valid(r.handle));
      keep(r.handle, m.handle);
    }
  }

  // The sink: records the event, unless told to throw (the event is then not published,
  // its id consumed) or to call back into the cache first (refused, nothing changed).
  void on_event(const KvEvent& e) {
    const SinkMode mode = std::exchange(sink_mode_, SinkMode::record);
    if (mode == SinkMode::fail) throw std::runtime_error("sink down");
    if (mode == SinkMode::reenter) {
      const auto before = cache_.stats();
      const Tokens& d = docs_[0];
      std::size_t refused = 0;
      const auto refuse = [&](auto&& call) {
        try {
          call();
        } catch (const std::logic_error&) {
          ++refused;
        }
      };
      refuse([&] { (void)cache_.match(d, 0); });
      refuse([&] { (void)cache_.insert(d, std::vector<PageId>(d.size() / ps_, PageId{1}), 0); });
      refuse([&] { (void)cache_.evict(1); });
      refuse([&] { (void)cache_.erase_namespace(1); });
      refuse([&] { (void)cache_.clear(); });
      refuse([&] { cache_.configure_namespace(5, "other"); });
      FUZZ_CHECK(refused == 6);
      if (!held_.empty()) {
        FUZZ_CHECK(!cache_.lock(held_[0].real));
        FUZZ_CHECK(!cache_.unlock(held_[0].real));
      }
      const auto after = cache_.stats();
      FUZZ_CHECK(after.lookups == before.lookups && after.inserts == before.inserts &&
                 after.events == before.events && after.cached_pages == before.cached_pages &&
                 after.locked_pages == before.locked_pages);
    }
    events_.push_back(e);
  }

  void insert(const Tokens& t, std::uint64_t ns) {
    // Cached ids for what matches (mostly), fresh ids after; sometimes an id the engine
    // used before, or too few ids.
    const std::vector<PageId> known = model_.match(t, ns).pages;
    FUZZ_CHECK(cache_.match(t, ns).pages == known);
    ++lookups_;
    const std::size_t q = t.size() / ps_;
    std::vector<PageId> ids;
    const int shape = in_.ConsumeIntegralInRange<int>(0, 15);
    std::size_t n = q + (shape == 1 ? 1U + pick(2) : 0U);
    if (shape == 0 && q > 0) n = pick(q);  // too few
    for (std::size_t i = 0; i < n; ++i) {
      if (i < known.size() && in_.ConsumeIntegralInRange<int>(0, 3) != 0)
        ids.push_back(known[i]);
      else if (next_id_ > 1 && in_.ConsumeIntegralInRange<int>(0, 7) == 0)
        ids.push_back(static_cast<PageId>(1U + pick(next_id_ - 1U)));
      else
        ids.push_back(next_id_++);
    }
    std::int64_t prio = static_cast<std::int64_t>(pick(3));
    if (in_.ConsumeIntegralInRange<int>(0, 15) == 0)
      prio = in_.ConsumeBool() ? std::numeric_limits<std::int64_t>::min()
                               : std::numeric_limits<std::int64_t>::max();
    const std::size_t before = events_.size();
    const std::size_t namespaces_before = cache_.namespace_count();
    // Two of the shapes with the usual ids also make the sink throw or call back in.
    if (sink_ && shape >= 14) sink_mode_ = shape == 14 ? SinkMode::fail : SinkMode::reenter;
    std::optional<AnyPagedCache::Insert> r;
    try {
      r = cache_.insert(t, ids, ns, prio);
    } catch (const std::invalid_argument&) {
      // Too few ids: no namespace can hold another's default seed.
      sink_mode_ = SinkMode::record;
      FUZZ_CHECK(ids.size() < q);
      FUZZ_CHECK(events_.size() == before);
      return;
    } catch (const std::runtime_error&) {
      // The sink threw: nothing stored, no namespace created, the event id consumed.
      FUZZ_CHECK(sink_mode_ == SinkMode::record);
      FUZZ_CHECK(events_.size() == before);
      FUZZ_CHECK(cache_.namespace_count() == namespaces_before);
      apply_events();
      // The router sees a gap at the consumed id. The lost event stored nothing the cache
      // kept, so telling it "nothing changed" at that id is an exact resync.
      KvEvent nothing;
      nothing.event_id = applied_++;
      nothing.data = promptcache::kv_event::Removed{};
      FUZZ_CHECK(index_.apply(worker_, nothing).ok());
      return;
    }
    sink_mode_ = SinkMode::record;
    FUZZ_CHECK(ids.size() >= q);
    ++inserts_;
    const auto e = model_.insert(t, ids, ns, prio);
    FUZZ_CHECK(r->cached_pages == e.cached);
    FUZZ_CHECK(r->inserted_pages == e.inserted);
    FUZZ_CHECK(r->duplicates == e.duplicates);
    FUZZ_CHECK(r->handle.empty() == (q == 0));
    FUZZ_CHECK(events_.size() == before + (sink_ && e.inserted > 0 ? 1U : 0U));
    inserted_ += e.inserted;
    duplicates_ += e.duplicates.size();
    if (!r->handle.empty()) keep(r->handle, e.handle);
  }

  void lock() {
    if (held_.empty()) return;
    const Held& h = held_[pick(held_.size())];
    FUZZ_CHECK(cache_.lock(h.real) == model_.lock(h.model));
  }

  void unlock() {
    if (held_.empty()) return;
    const std::size_t i = pick(held_.size());
    FUZZ_CHECK(cache_.unlock(held_[i].real) == model_.unlock(held_[i].model));
    if (in_.ConsumeIntegralInRange<int>(0, 2) == 0)
      held_.erase(held_.begin() + static_cast<long>(i));
  }

  void evict(std::size_t n) {
    const std::size_t before = events_.size();
    const std::vector<PageId> want = model_.evict(n);
    FUZZ_CHECK(model_.ties() == 0);
    if (in_.ConsumeBool()) {
      got_.clear();
      const std::size_t k = cache_.evict(n, got_);
      FUZZ_CHECK(got_ == want);
      FUZZ_CHECK(k == want.size());
    } else {
      FUZZ_CHECK(cache_.evict(n) == want.size());
    }
    FUZZ_CHECK(events_.size() == before + (sink_ && !want.empty() ? 1U : 0U));
    evicted_ += want.size();
  }

  void erase_namespace(std::uint64_t ns) {
    std::multiset<PageId> got;
    const bool ok = cache_.erase_namespace(ns, got);
    const auto want = model_.drop(ns);
    FUZZ_CHECK(ok == want.has_value());
    if (ok) {
      FUZZ_CHECK(got == *want);
      erased_ += want->size();
      // The configuration went with the namespace: its default seed is back.
      FUZZ_CHECK(cache_.namespace_seed(ns) == default_seed(ns));
    } else {
      FUZZ_CHECK(got.empty());
    }
  }

  void clear() {
    std::multiset<PageId> got;
    const bool ok = cache_.clear(got);
    const auto want = model_.drop(std::nullopt);
    FUZZ_CHECK(ok == want.has_value());
    if (ok) {
      FUZZ_CHECK(got == *want);
      cleared_ += want->size();
    } else {
      FUZZ_CHECK(got.empty());
    }
  }

  static std::uint64_t default_seed(std::uint64_t ns) {
    return ns == 0 ? promptcache::block_hash_seed()
                   : promptcache::block_hash_seed({}, std::to_string(ns));
  }

  // Seeds equal to other namespaces' defaults ("", "1", "2" as salts) included: refused.
  void configure(std::uint64_t ns) {
    static constexpr std::string_view loras[] = {"", "adapter", "x"};
    static constexpr std::string_view salts[] = {"", "1", "2", "18446744073709551615", "s"};
    const std::string_view lora = loras[pick(3)];
    const std::string_view salt = salts[pick(5)];
    const std::uint64_t seed = promptcache::block_hash_seed(lora, salt);
    const std::uint64_t old = cache_.namespace_seed(ns);
    try {
      cache_.configure_namespace(ns, lora, salt);
    } catch (const std::invalid_argument&) {
      // Pages pin the seed; or another namespace has it, or would by default.
      FUZZ_CHECK((seed != old && model_.cached_in(ns) > 0) || seed_of_other(ns, seed) ||
                 default_of_other(lora, salt, ns));
      FUZZ_CHECK(cache_.namespace_seed(ns) == old);
      return;
    }
    FUZZ_CHECK(!default_of_other(lora, salt, ns));
    FUZZ_CHECK(seed == old || model_.cached_in(ns) == 0);
    FUZZ_CHECK(cache_.namespace_seed(ns) == seed);
  }

  // True when (lora, salt) is the default seed of an id other than ns: none for namespace 0,
  // the id in decimal for the others.
  static bool default_of_other(std::string_view lora, std::string_view salt, std::uint64_t ns) {
    if (!lora.empty()) return false;
    if (salt.empty()) return ns != 0;
    if (!std::all_of(salt.begin(), salt.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      return false;
    try {
      const std::uint64_t m = std::stoull(std::string(salt));
      return std::to_string(m) == salt && m != 0 && m != ns;
    } catch (const std::out_of_range&) {
      return false;
    }
  }

  bool seed_of_other(std::uint64_t ns, std::uint64_t seed) const {
    for (const std::uint64_t o : namespaces)
      if (o != ns && cache_.namespace_seed(o) == seed) return true;
    return false;
  }

  // Moving the cache keeps every handle valid; each moved-from side is an empty cache.
  void move_round_trip() {
    const AnyPagedCache::Moves m = cache_.move_round_trip();
    FUZZ_CHECK(m.moved_from_valid);
    FUZZ_CHECK(m.moved_from_empty);
    FUZZ_CHECK(m.back_from_valid);
    FUZZ_CHECK(m.back_from_empty);
  }

  bool mirror_ok(const Tokens& t, std::uint64_t ns) {
    promptcache::BlockHashOptions o;
    o.seed = cache_.namespace_seed(ns);
    const auto hashes = promptcache::local_block_hashes(t, ps_, o);
    const auto m = index_.find_matches(hashes);
    const std::size_t routed = m.empty() ? 0 : m.at(0).blocks;
    return routed * ps_ == cache_.peek(t, ns);
  }

  void check(const Tokens& probe, std::uint64_t ns) {
    FUZZ_CHECK(cache_.cached_pages() == model_.cached());
    FUZZ_CHECK(cache_.locked_pages() == model_.locked());
    FUZZ_CHECK(cache_.evictable_pages() == model_.cached() - model_.locked());
    for (const Held& h : held_) {
      FUZZ_CHECK(cache_.valid(h.real) == model_.valid(h.model));
      FUZZ_CHECK(cache_.lock_count(h.real) == model_.own(h.model));
    }
    const auto& s = cache_.stats();
    FUZZ_CHECK(s.lookups == lookups_);
    FUZZ_CHECK(s.inserts == inserts_);
    FUZZ_CHECK(s.inserted_pages == inserted_);
    FUZZ_CHECK(s.duplicate_pages == duplicates_);
    FUZZ_CHECK(s.evicted_pages == evicted_);
    FUZZ_CHECK(s.erased_pages == erased_);
    FUZZ_CHECK(s.cleared_pages == cleared_);
    FUZZ_CHECK(s.cached_pages == model_.cached());
    FUZZ_CHECK(cache_.check_invariants());
    // The memory bound: token ids (and the page ids beside them) at most twice the cached.
    FUZZ_CHECK(cache_.memory().token_bytes <=
               2 * cache_.cached_pages() * ps_ * sizeof(std::uint32_t));
    if (const auto a = cache_.adaptive()) {
      // Both sides run the same arithmetic in the same order: the targets are equal.
      FUZZ_CHECK(a->target == model_.target());
      FUZZ_CHECK(a->ghosts_once == model_.ghosts(1));
      FUZZ_CHECK(a->ghosts_reused == model_.ghosts(2));
    }
    FUZZ_CHECK(cache_.publishes_events() == sink_);
    if (!sink_) {
      FUZZ_CHECK(events_.empty());
      return;
    }
    // The mirror: a KvIndex fed only by the events answers what the cache matches.
    apply_events();
    FUZZ_CHECK(cache_.next_event_id() == applied_);
    FUZZ_CHECK(s.events == applied_);
    FUZZ_CHECK(index_.block_count(worker_) == cache_.cached_pages());
    FUZZ_CHECK(mirror_ok(probe, ns));
    const Tokens& d = docs_[pick(docs_.size())];
    FUZZ_CHECK(mirror_ok(d, namespaces[pick(4)]));
  }

  void apply_events() {
    for (const KvEvent& e : events_) {
      FUZZ_CHECK(e.event_id == applied_);
      ++applied_;
      FUZZ_CHECK(index_.apply(worker_, e).ok());
    }
    events_.clear();
  }

  enum class SinkMode { record, fail, reenter };

  FuzzedDataProvider& in_;
  std::size_t ps_;
  bool sink_;
  SinkMode sink_mode_ = SinkMode::record;
  std::vector<KvEvent> events_;
  std::unique_ptr<AnyPagedCache> owned_;
  AnyPagedCache& cache_;
  Model model_;
  KvIndex index_;
  const KvWorker worker_{7, 0};
  std::vector<Tokens> docs_;
  std::vector<Held> held_;
  std::vector<PageId> pages_, got_;
  PageId next_id_ = 1;
  std::uint64_t applied_ = 0;
  std::uint64_t lookups_ = 0, inserts_ = 0, inserted_ = 0, duplicates_ = 0;
  std::uint64_t evicted_ = 0, erased_ = 0, cleared_ = 0;
};

template <class Policy>
void run(FuzzedDataProvider& in, std::size_t page_size, Pol pol, bool sink,
         Policy policy = Policy{}, Arc arc = {}) {
  Harness h(
      in, page_size, pol, sink,
      [&](AnyPagedCache::Sink s) {
        return std::make_unique<CacheOf<Policy>>(page_size, std::move(policy), std::move(s));
      },
      arc);
  while (in.remaining_bytes() > 0) {
    ++fuzz::operations();
    h.step();
  }
  h.finish();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  static constexpr std::size_t page_sizes[] = {1, 1, 2, 3, 4, 8, 16, 1};
  const std::size_t ps = page_sizes[in.ConsumeIntegralInRange<std::size_t>(0, 7)];
  const bool sink = in.ConsumeIntegralInRange<int>(0, 7) != 0;
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
      run<eviction::Lru>(in, ps, Pol::lru, sink);
      break;
    case 1:
      run<eviction::Lfu>(in, ps, Pol::lfu, sink);
      break;
    case 2:
      run<eviction::Fifo>(in, ps, Pol::fifo, sink);
      break;
    case 3:
      run<eviction::Priority>(in, ps, Pol::priority, sink);
      break;
    case 4:
      run<eviction::Slru>(in, ps, Pol::slru, sink);
      break;
    case 5:
      run<eviction::Mru>(in, ps, Pol::mru, sink);
      break;
    case 6:
      run<eviction::Filo>(in, ps, Pol::filo, sink);
      break;
    default: {
      // Capacities from 0 (no history) to a few times what the harness caches, so the
      // target reaches both bounds; factors and steps from 0 to the largest step allowed.
      static constexpr double factors[] = {0.0, 0.25, 0.5, 1.0, 1.0, 2.0, 8.0, 8.0};
      static constexpr double steps[] = {0.0, 0.125, 0.5, 1.0, 1.0, 3.0, 1000.0, 1e9};
      const std::size_t cap = in.ConsumeIntegralInRange<std::size_t>(0, 7) == 0
                                  ? in.ConsumeIntegralInRange<std::size_t>(0, 1024)
                                  : in.ConsumeIntegralInRange<std::size_t>(0, 24);
      const double factor = factors[in.ConsumeIntegralInRange<std::size_t>(0, 7)];
      const double step = steps[in.ConsumeIntegralInRange<std::size_t>(0, 7)];
      run<eviction::Adaptive>(in, ps, Pol::adaptive, sink,
                              eviction::Adaptive(cap, factor, step, eviction::Adaptive::Mode::arc),
                              Arc{cap, factor, step});
      break;
    }
  }
  return 0;
}
