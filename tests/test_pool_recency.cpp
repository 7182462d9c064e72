// Unit test of detail::PoolRecency, PromptCachePool's recency lists by TTL class with the two
// heaps over their heads (LRU victim, TTL expiry): a randomized model test against a plain
// scan of every record, the reuse of vacant classes, the clamped deadline arithmetic and the
// allocation contract of prepare() (it may throw, and then nothing changed).
#include <promptcache/detail/pool_recency.hpp>
#include <promptcache/manual_clock.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "catch.hpp"
#include "support/counting_new.hpp"

namespace {

using Dur = std::chrono::nanoseconds;
using TimePoint = promptcache::ManualClock::time_point;

struct FakeSlot {
  using time_point = TimePoint;
  FakeSlot* prev = nullptr;
  FakeSlot* next = nullptr;
  std::uint64_t seq = 0;
  TimePoint last_used{};
  std::uint32_t ttl_class = 0;
  bool pinned = false;
  // Model state, not read by PoolRecency.
  bool stored = false;
  Dur ttl{};
};

using Recency = promptcache::detail::PoolRecency<FakeSlot, Dur>;

void require(bool ok, const char* what) {
  if (!ok) throw std::logic_error(what);
}

void check(const Recency& r, const std::vector<FakeSlot>& slots, Dur default_ttl) {
  std::vector<std::size_t> members(r.class_count(), 0);
  std::size_t listed = 0;
  for (const FakeSlot& s : slots) {
    if (!s.stored) continue;
    REQUIRE(s.ttl_class < members.size());
    ++members[s.ttl_class];
    if (!s.pinned) ++listed;
  }
  std::size_t got = 0;
  REQUIRE_NOTHROW(got = r.check(default_ttl, members, require));
  REQUIRE(got == listed);
}

}  // namespace

TEST_CASE("pool recency: random operations against a scan of every record") {
  const Dur default_ttl(100);
  const std::vector<Dur> ttls{default_ttl, Dur(0),  Dur(-3),  Dur(1),     Dur(7),
                              Dur(40),     Dur(41), Dur(250), Dur::max(), Dur::min(),
                              Dur(1000),   Dur(99), Dur(101), Dur(5000),  Dur(60),
                              Dur(61),     Dur(62), Dur(63),  Dur(64),    Dur(65)};
  for (std::uint32_t seed = 1; seed <= 6; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    auto rnd = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
    Recency r(default_ttl);
    std::vector<FakeSlot> slots(seed % 2 == 0 ? 40 : 400);
    std::uint64_t seq = 0;
    TimePoint now{};
    std::size_t max_classes = 1;
    // How many distinct TTLs a run may use at once: few (classes are reused a lot) or all.
    const std::size_t ttl_choices = seed % 3 == 0 ? 4 : ttls.size();
    for (int step = 0; step < 20000; ++step) {
      CAPTURE(step);
      const std::size_t op = rnd(100);
      FakeSlot& s = slots[rnd(slots.size())];
      if (op < 30) {  // store
        if (s.stored) continue;
        const Dur ttl = ttls[rnd(ttl_choices)];
        const std::uint32_t c = r.prepare(ttl);
        r.join(&s, c);
        REQUIRE(r.ttl_of(&s) == ttl);
        s.stored = true;
        s.ttl = ttl;
        s.seq = ++seq;
        s.last_used = now;
        s.pinned = rnd(8) == 0;
        if (!s.pinned) r.push_back(&s);
      } else if (op < 40) {  // remove
        if (!s.stored) continue;
        if (!s.pinned) r.unlink(&s);
        r.leave(&s);
        s.stored = false;
      } else if (op < 65) {  // touch
        if (!s.stored || s.pinned) continue;
        s.seq = ++seq;
        s.last_used = now;
        r.touch(&s);
      } else if (op < 70) {  // pin / unpin
        if (!s.stored) continue;
        if (s.pinned) {
          s.pinned = false;
          s.seq = ++seq;
          s.last_used = now;
          r.push_back(&s);
        } else {
          r.unlink(&s);
          s.pinned = true;
        }
      } else if (op < 80) {
        now += Dur(static_cast<std::int64_t>(rnd(30)));
      } else if (op < 90) {  // LRU victim, evicted
        const FakeSlot* want = nullptr;
        for (const FakeSlot& x : slots)
          if (x.stored && !x.pinned && (want == nullptr || x.seq < want->seq)) want = &x;
        FakeSlot* got = r.lru_victim();
        REQUIRE(got == want);
        if (got != nullptr && rnd(2) == 0) {
          r.unlink(got);
          r.leave(got);
          got->stored = false;
        }
      } else {  // expire
        std::vector<const FakeSlot*> want;
        for (const FakeSlot& x : slots)
          if (x.stored && !x.pinned && now - x.last_used >= x.ttl) want.push_back(&x);
        std::vector<const FakeSlot*> got;
        const std::size_t n = r.expire(now, [&](FakeSlot* x) {
          got.push_back(x);
          r.unlink(x);
          r.leave(x);
          x->stored = false;
        });
        REQUIRE(n == got.size());
        std::sort(want.begin(), want.end());
        std::sort(got.begin(), got.end());
        REQUIRE(got == want);
      }
      max_classes = std::max(max_classes, r.class_count());
      if (step % 7 == 0) check(r, slots, default_ttl);
    }
    check(r, slots, default_ttl);
    // Classes are reused: never more than the distinct TTLs on offer (the default's included).
    CHECK(max_classes <= ttl_choices);
  }
}

TEST_CASE("pool recency: a vacant class takes the next new TTL") {
  Recency r(Dur(100));
  FakeSlot a, b, c;
  const std::uint32_t ca = r.prepare(Dur(5));
  r.join(&a, ca);
  r.push_back(&a);
  const std::uint32_t cb = r.prepare(Dur(6));
  r.join(&b, cb);
  r.push_back(&b);
  CHECK(ca != 0);
  CHECK(cb != ca);
  CHECK(r.prepare(Dur(5)) == ca);    // the class that has the TTL
  CHECK(r.prepare(Dur(100)) == 0U);  // the default's class
  r.unlink(&a);
  r.leave(&a);  // class ca is vacant now
  const std::uint32_t cc = r.prepare(Dur(7));
  CHECK(cc == ca);
  r.join(&c, cc);
  CHECK(r.ttl_of(&c) == Dur(7));
  CHECK(r.class_count() == 3);
  // TTL 5 lost its class: asking again needs a new one.
  CHECK(r.prepare(Dur(5)) == 3U);
}

TEST_CASE("pool recency: deadlines at the time_point's limits") {
  using promptcache::detail::pool_deadline;
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  auto at = [](TimePoint t, Dur ttl) { return pool_deadline(t, ttl).at; };
  auto never = [](TimePoint t, Dur ttl) { return pool_deadline(t, ttl).never; };
  const TimePoint zero{};
  CHECK(at(zero, Dur(5)) == TimePoint(Dur(5)));
  CHECK(at(zero, Dur(-5)) == zero);  // a negative TTL is 0: never before the last use
  CHECK(at(TimePoint(Dur(-10)), Dur::min()) == TimePoint(Dur(-10)));
  CHECK_FALSE(never(zero, Dur(-5)));
  // The duration's maximum is "never", wherever the entry was used.
  CHECK(never(TimePoint(Dur(-10)), Dur::max()));
  CHECK(never(TimePoint::min(), Dur::max()));
  // Past the time_point's range: "never"; exactly at its end: a real deadline.
  CHECK(never(TimePoint(Dur(10)), Dur(kMax - 9)));
  CHECK_FALSE(never(TimePoint(Dur(10)), Dur(kMax - 10)));
  CHECK(at(TimePoint(Dur(10)), Dur(kMax - 10)) == TimePoint::max());
  CHECK_FALSE(never(TimePoint(Dur(-10)), Dur(kMax - 1)));
  CHECK(at(TimePoint(Dur(-10)), Dur(kMax - 1)) == TimePoint(Dur(kMax - 11)));
}

TEST_CASE("pool recency: an entry with the largest TTL never expires, even at the clock's end") {
  Recency r(Dur(100));
  FakeSlot s, t;
  r.join(&s, r.prepare(Dur::max()));
  s.last_used = TimePoint(Dur(0));
  s.seq = 1;
  r.push_back(&s);
  auto none = [](FakeSlot*) { FAIL("nothing may expire"); };
  CHECK(r.expire(TimePoint::max() - Dur(1), none) == 0);
  // Idle for exactly the TTL at time_point::max(): still "never".
  CHECK(r.expire(TimePoint::max(), none) == 0);
  // A due entry whose key ties with the "never" one at time_point::max() is still found.
  r.join(&t, r.prepare(Dur(10)));
  t.last_used = TimePoint::max() - Dur(10);
  t.seq = 2;
  r.push_back(&t);
  std::vector<FakeSlot*> got;
  CHECK(r.expire(TimePoint::max(), [&](FakeSlot* x) {
    got.push_back(x);
    r.unlink(x);
    r.leave(x);
  }) == 1);
  CHECK(got == std::vector<FakeSlot*>{&t});
  std::vector<std::size_t> members{0, 1, 0};
  CHECK(r.check(Dur(100), members, require) == 1);
}

TEST_CASE("pool recency: prepare() either succeeds or changes nothing") {
  REQUIRE(test_alloc::replacement_active());
  Recency r(Dur(100));
  std::vector<FakeSlot> slots(64);
  // Fill some classes, vacate a few, so prepare() meets both the vacant and the new path.
  for (std::size_t i = 0; i < slots.size(); ++i) {
    FakeSlot& s = slots[i];
    s.ttl = Dur(static_cast<std::int64_t>(1 + i % 16));
    r.join(&s, r.prepare(s.ttl));
    s.stored = true;
    s.seq = i + 1;
    r.push_back(&s);
  }
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (i % 16 < 3) {
      r.unlink(&slots[i]);
      r.leave(&slots[i]);
      slots[i].stored = false;
    }
  }
  check(r, slots, Dur(100));
  for (std::int64_t ttl = 1000; ttl < 1010; ++ttl) {
    bool done = false;
    for (long k = 0; !done; ++k) {
      const std::size_t classes = r.class_count();
      test_alloc::countdown = k;
      try {
        const std::uint32_t c = r.prepare(Dur(ttl));
        test_alloc::countdown = -1;
        done = true;
        FakeSlot& s = slots[static_cast<std::size_t>(ttl - 1000)];
        if (s.stored) {
          r.unlink(&s);
          r.leave(&s);
        }
        r.join(&s, c);
        s.stored = true;
        s.ttl = Dur(ttl);
        s.seq = 1000 + static_cast<std::uint64_t>(ttl);
        r.push_back(&s);
        CHECK(r.ttl_of(&s) == Dur(ttl));
      } catch (const std::bad_alloc&) {
        test_alloc::countdown = -1;
        CHECK(r.class_count() == classes);
      }
      check(r, slots, Dur(100));
    }
  }
}

TEST_CASE("pool recency: check() reports a list whose times go back") {
  Recency r(Dur(100));
  FakeSlot a, b;
  std::vector<std::size_t> members{2};
  for (FakeSlot* s : {&a, &b})
    r.join(s, r.prepare(Dur(100)));
  a.seq = 1;
  a.last_used = TimePoint(Dur(50));
  r.push_back(&a);
  b.seq = 2;
  b.last_used = TimePoint(Dur(40));  // used after a, at an earlier time
  r.push_back(&b);
  CHECK_THROWS_WITH(r.check(Dur(100), members, require), "list times");
  b.last_used = TimePoint(Dur(50));
  CHECK(r.check(Dur(100), members, require) == 2);
}
