// detail::KvFingerprintTable, the edge and block-name table of KvIndex, against
// a model (std::map from value to key): random inserts and erases with many
// shared fingerprints and runs that wrap around the end of the array, checked
// by lookups, by the table's own run invariant, and by its load bounds (both
// load policies, and a switch between them).
#include <promptcache/detail/kv_index_fingerprints.hpp>

#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <stdexcept>
#include <vector>

#include "catch.hpp"

namespace {

using promptcache::detail::kv_npos;
using promptcache::detail::KvFingerprintTable;
using promptcache::detail::KvTableLoad;

// Keys are 64-bit; the table sees only fingerprint(key) and confirms a
// candidate value by looking its key up here, as KvIndex does in its pools.
struct Model {
  std::map<std::uint32_t, std::uint64_t> key_of;  // value -> key
  std::map<std::uint64_t, std::uint32_t> value_of;

  [[nodiscard]] std::uint32_t find(const KvFingerprintTable& t, std::uint64_t key) const {
    return t.find(KvFingerprintTable::fingerprint(key),
                  [&](std::uint32_t v) { return key_of.at(v) == key; });
  }
};

// A key whose fingerprint is one of 2 * `fps` values taken from both ends of
// the range: home slots at the end of the array (runs wrap around) and at its
// start (where the wrapped runs meet them).
std::uint64_t key_with_shared_fp(std::mt19937_64& rng, std::uint32_t fps) {
  const auto k = static_cast<std::uint32_t>(rng() % fps);
  const std::uint32_t fp = rng() % 2U == 0U ? k : std::numeric_limits<std::uint32_t>::max() - k;
  return (std::uint64_t{fp} << 32U) | (rng() & 0xffffffffULL);
}

// `switched`: the load policy changed since the last resize, so only the
// looser (compact) bound holds.
void check_all(const KvFingerprintTable& t, const Model& m, bool switched = false) {
  REQUIRE(t.check());
  REQUIRE(t.size() == m.key_of.size());
  for (const auto& [key, value] : m.value_of) {
    REQUIRE(m.find(t, key) == value);
    // The first candidate shares the fingerprint (it may be another key's).
    const std::uint32_t first = t.first(KvFingerprintTable::fingerprint(key));
    REQUIRE(first != kv_npos);
    REQUIRE(KvFingerprintTable::fingerprint(m.key_of.at(first)) ==
            KvFingerprintTable::fingerprint(key));
  }
  if (t.size() != 0U) {
    REQUIRE(t.size() * 5U <= t.capacity() * 4U);  // load at most 4/5
    if (t.load() == KvTableLoad::roomy && t.capacity() > 16U && !switched)
      REQUIRE(t.size() * 4U <= t.capacity());  // at most 1/4
    REQUIRE(t.memory_bytes() == t.capacity() * sizeof(KvFingerprintTable::Entry));
  }
}

// `load`: the policy at the start; `flip`: alternate the policy every 700 steps.
void run(std::mt19937_64& rng, std::uint32_t fps, bool wide_keys,
         KvTableLoad load = KvTableLoad::compact, bool flip = false) {
  KvFingerprintTable t;
  t.set_load(load);
  Model m;
  std::uint32_t next_value = 0;
  for (int step = 0; step < 6000; ++step) {
    if (flip && step % 700 == 699)
      t.set_load(t.load() == KvTableLoad::roomy ? KvTableLoad::compact : KvTableLoad::roomy);
    const bool grow = step < 3000 ? rng() % 4U != 0U : rng() % 4U == 0U;
    if (grow || m.key_of.empty()) {
      const std::uint64_t key = wide_keys ? rng() : key_with_shared_fp(rng, fps);
      if (m.value_of.count(key) != 0U) continue;
      const std::uint32_t v = next_value++;
      const auto how = rng() % 3U;
      if (how == 0U) {
        t.insert(KvFingerprintTable::fingerprint(key), v);
      } else if (how == 1U) {
        t.reserve_extra(1);
        t.insert_reserved(KvFingerprintTable::fingerprint(key), v);
      } else {  // probe, then insert where the probe ended
        t.reserve_extra(1);
        const auto p = t.probe(KvFingerprintTable::fingerprint(key),
                               [&](std::uint32_t x) { return m.key_of.at(x) == key; });
        REQUIRE(p.value == kv_npos);
        t.insert_at(p, KvFingerprintTable::fingerprint(key), v);
      }
      m.key_of[v] = key;
      m.value_of[key] = v;
    } else {
      auto it = m.key_of.begin();
      std::advance(it, static_cast<long>(rng() % m.key_of.size()));
      const auto [v, key] = *it;
      const std::uint32_t fp = KvFingerprintTable::fingerprint(key);
      switch (rng() % 5U) {
        case 0:
          REQUIRE(t.erase(fp, v));
          break;
        case 4:  // the caller knows the entry is there
          t.erase_present(fp, v);
          break;
        case 1: {  // the hint of a lookup: right when v is the first under fp
          const auto first = t.first_slot(fp);
          REQUIRE(first.value != kv_npos);
          REQUIRE(t.erase_hint(first.pos, fp, v));
          break;
        }
        case 2:  // any slot, mostly another entry's or an empty one
          REQUIRE(t.erase_hint(static_cast<std::size_t>(rng() % (t.capacity() + 4U)), fp, v));
          break;
        default:  // out of range
          REQUIRE(t.erase_hint(~std::size_t{0}, fp, v));
          break;
      }
      REQUIRE_FALSE(t.erase(KvFingerprintTable::fingerprint(key), v));  // gone now
      m.value_of.erase(key);
      m.key_of.erase(it);
    }
    // Absent keys, including ones sharing a fingerprint with present keys.
    const std::uint64_t absent = wide_keys ? rng() : key_with_shared_fp(rng, fps);
    if (m.value_of.count(absent) == 0U) REQUIRE(m.find(t, absent) == kv_npos);
    if (step % 500 == 0) check_all(t, m, flip);
  }
  check_all(t, m, flip);
  // A copy is independent of the original, a move empties its source.
  {
    KvFingerprintTable copy(t);
    check_all(copy, m, flip);
    CHECK(copy.load() == t.load());
    KvFingerprintTable other;
    other.insert(1, 1);
    other = copy;
    check_all(other, m, flip);
    if (!m.key_of.empty()) {
      const auto [v, key] = *m.key_of.begin();
      REQUIRE(copy.erase(KvFingerprintTable::fingerprint(key), v));
      REQUIRE(m.find(t, key) == v);  // the original still has it
    }
    KvFingerprintTable moved(std::move(other));
    check_all(moved, m, flip);
    CHECK(other.size() == 0U);  // a moved-from table is empty
    CHECK(other.memory_bytes() == 0U);
  }
  // Erasing everything gives the memory back.
  while (!m.key_of.empty()) {
    const auto [v, key] = *m.key_of.begin();
    REQUIRE(t.erase(KvFingerprintTable::fingerprint(key), v));
    m.value_of.erase(key);
    m.key_of.erase(m.key_of.begin());
  }
  CHECK(t.size() == 0U);
  CHECK(t.memory_bytes() == 0U);
}

}  // namespace

TEST_CASE("fingerprint table against a model", "[kv_index]") {
  std::mt19937_64 rng(12345);
  SECTION("distinct fingerprints") {
    run(rng, 0, true);
  }
  SECTION("few shared fingerprints at both ends of the range (wrapping runs)") {
    run(rng, 3, false);
  }
  SECTION("many shared fingerprints at both ends of the range") {
    run(rng, 300, false);
  }
  SECTION("roomy load") {
    run(rng, 0, true, KvTableLoad::roomy);
    run(rng, 3, false, KvTableLoad::roomy);
    run(rng, 300, false, KvTableLoad::roomy);
  }
  SECTION("load policy switched back and forth") {
    run(rng, 0, true, KvTableLoad::roomy, true);
    run(rng, 300, false, KvTableLoad::compact, true);
  }
}

TEST_CASE("fingerprint table: roomy load stays between 1/16 and 1/4", "[kv_index]") {
  std::mt19937_64 rng(11);
  KvFingerprintTable t;
  t.set_load(KvTableLoad::roomy);
  std::vector<std::uint32_t> fps;
  for (std::uint32_t v = 0; v < 20000; ++v) {
    fps.push_back(static_cast<std::uint32_t>(rng()));
    t.insert(fps.back(), v);
    REQUIRE(t.size() * 4U <= t.capacity());
    // Grown to about 1/8 (about 1/16 while the array is under 4,096 slots).
    if (t.capacity() > 4096U) REQUIRE(t.size() * 8U >= t.capacity() - 8U);
    if (t.capacity() > 16U) REQUIRE(t.size() * 16U >= t.capacity() - 16U);
  }
  for (std::uint32_t v = 0; v < 19900; ++v) {
    REQUIRE(t.erase(fps[v], v));
    if (t.capacity() > 16U) REQUIRE(t.size() * 16U >= t.capacity());
  }
  CHECK(t.check());
  // Switching to compact: the next resize brings the load within 2/5..4/5.
  t.set_load(KvTableLoad::compact);
  REQUIRE(t.erase(fps[19900], 19900));
  CHECK(t.size() * 5U >= t.capacity() * 2U);
  CHECK(t.size() * 5U <= t.capacity() * 4U);
  CHECK(t.check());
  for (std::uint32_t v = 19901; v < 20000; ++v)
    CHECK(t.find(fps[v], [&](std::uint32_t x) { return x == v; }) == v);
}

TEST_CASE("fingerprint table: load stays between 2/5 and 4/5", "[kv_index]") {
  std::mt19937_64 rng(7);
  KvFingerprintTable t;
  std::vector<std::uint32_t> fps;
  for (std::uint32_t v = 0; v < 20000; ++v) {
    fps.push_back(static_cast<std::uint32_t>(rng()));
    t.insert(fps.back(), v);
    REQUIRE(t.size() * 5U <= t.capacity() * 4U);
  }
  CHECK(t.size() * 5U >= t.capacity() * 2U);
  for (std::uint32_t v = 0; v < 19000; ++v) {
    REQUIRE(t.erase(fps[v], v));
    if (t.capacity() > 16U) REQUIRE(t.size() * 5U >= t.capacity() * 2U);
  }
  CHECK(t.check());
  // Without shrinking the capacity stays, so reservations made before hold.
  const std::size_t cap = t.capacity();
  for (std::uint32_t v = 19000; v < 19900; ++v)
    REQUIRE(t.erase(fps[v], v, false));
  CHECK(t.capacity() == cap);
  t.shrink_to_load();
  CHECK(t.capacity() < cap);
  CHECK(t.size() * 5U >= t.capacity() * 2U);
  CHECK(t.check());
}

TEST_CASE("fingerprint table: bad input", "[kv_index]") {
  KvFingerprintTable t;
  // Lookups and erases on an empty table, and of absent entries.
  CHECK(t.first(5) == kv_npos);
  CHECK(t.find(5, [](std::uint32_t) { return true; }) == kv_npos);
  CHECK_FALSE(t.erase(5, 1));
  CHECK(t.memory_bytes() == 0U);
  t.insert(5, 1);
  CHECK_FALSE(t.erase(5, 2));          // same fingerprint, other value
  CHECK_FALSE(t.erase(6, 1));          // other fingerprint
  CHECK_FALSE(t.erase_hint(0, 5, 2));  // a hint for an absent entry
  CHECK_FALSE(t.erase_hint(~std::size_t{0}, 6, 1));
  CHECK(t.first_slot(6).value == kv_npos);
  CHECK(t.first_slot(5).value == 1U);
  CHECK(t.find(5, [](std::uint32_t) { return false; }) == kv_npos);  // not confirmed
  CHECK(t.find(5, [](std::uint32_t v) { return v == 1U; }) == 1U);
  // Fingerprints at both ends of the range, and a value just below kv_npos.
  t.insert(0, kv_npos - 1U);
  t.insert(std::numeric_limits<std::uint32_t>::max(), 7);
  CHECK(t.first(0) == kv_npos - 1U);
  CHECK(t.first(std::numeric_limits<std::uint32_t>::max()) == 7U);
  // Too many entries: refused before anything changes.
  REQUIRE_THROWS_AS(t.reserve_extra(std::numeric_limits<std::size_t>::max()), std::length_error);
  REQUIRE_THROWS_AS(t.reserve_extra(std::size_t{1} << 31U), std::length_error);
  CHECK(t.size() == 3U);
  CHECK(t.check());
  t.clear();
  CHECK(t.size() == 0U);
  CHECK(t.memory_bytes() == 0U);
  CHECK(t.first(5) == kv_npos);
}

TEST_CASE("fingerprint table: resizing with a crowded run ahead of the first", "[kv_index]") {
  // Ten entries share the lowest home slot, two sit 35% of the way in, and
  // forty fill the upper half. Erasing the forty shrinks the array until the
  // crowded run reaches past the home of the two, and the runs that wrap
  // around the end meet it; then the array grows again.
  KvFingerprintTable t;
  std::vector<std::uint32_t> fp_of;
  const auto add = [&](std::uint32_t fp) {
    fp_of.push_back(fp);
    t.insert(fp, static_cast<std::uint32_t>(fp_of.size() - 1U));
  };
  for (int i = 0; i < 10; ++i)
    add(0);
  add(0x5999999a);
  add(0x5999999b);
  for (std::uint32_t i = 0; i < 40; ++i)
    add(0x80000000U + i * 0x01000000U);
  REQUIRE(t.check());
  for (std::uint32_t v = 12; v < 52; ++v) {
    REQUIRE(t.erase(fp_of[v], v));
    REQUIRE(t.check());
  }
  CHECK(t.size() == 12U);
  for (std::uint32_t v = 0; v < 12; ++v)
    CHECK(t.find(fp_of[v], [&](std::uint32_t x) { return x == v; }) == v);
  // And growing again from there.
  for (std::uint32_t i = 0; i < 40; ++i) {
    add(0xf0000000U + i);
    REQUIRE(t.check());
  }
  for (std::uint32_t v = 0; v < fp_of.size(); ++v)
    if (v < 12U || v >= 52U) CHECK(t.find(fp_of[v], [&](std::uint32_t x) { return x == v; }) == v);
}
