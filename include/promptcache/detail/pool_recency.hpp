// promptcache: detail/pool_recency.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The recency order of PromptCachePool's unpinned entries, split by idle TTL, and the two
// questions the pool asks of it: which entry is least recently used (LRU eviction) and which
// entries are past their TTL (expiry).
//
// Entries that share a TTL form a class with an intrusive list in touch order (least recent
// first): the head is the class's LRU entry and, the pool's times being monotonic (it never
// stamps a time earlier than one it used before), also the first of
// the class to expire. Across classes, two small heaps over the classes with a non-empty
// list answer the questions in O(1) when there is nothing to do, whatever the number of
// classes T: one ordered by the head's touch order, one by the head's expiry time.
//
// The heaps' keys are lower bounds, not exact values. A touch only moves an entry to the back
// of its list, and removing a head only exposes a later one, so a head's touch order and
// expiry time only grow; a heap key is re-read from the head only when it reaches the top of
// its heap and claims the class is due (lazy re-keying). A lookup therefore never touches the
// heaps: it moves its hit to the back of one list, O(1), and expiry that finds the earliest
// key in the future stops after one comparison. The re-keying work is at most one sift per
// touch or removal of a head, O(log T), paid by the expiry or eviction that finds it.
//
// A class left without members (pinned ones included: they rejoin the list when unpinned) is
// reused for the next new TTL value, so per-request TTLs cost only as many classes as
// distinct TTLs are stored at once; a hash map finds a TTL's class in O(1).
//
// Works on records with the fields of detail::PoolSlot (prev, next, seq, last_used,
// ttl_class, pinned).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace promptcache::detail {

/// When an entry used at `t` with idle TTL `ttl` expires: `at` = t + max(ttl, 0), computed
/// without overflow, or `never` when `ttl` is the duration's maximum or the sum is past the
/// time_point's range. A negative TTL is 0, so an entry is never expired before its last use
/// (with a clock that went back, `now - t` would be negative).
template <class TimePoint>
struct PoolDeadline {
  TimePoint at;
  bool never;
};

/// The deadline of an entry used at `t` with `ttl` (see PoolDeadline). O(1).
template <class TimePoint, class Duration>
PoolDeadline<TimePoint> pool_deadline(TimePoint t, Duration ttl) noexcept {
  if (ttl == Duration::max()) return {TimePoint::max(), true};
  if (!(Duration::zero() < ttl)) return {t, false};
  using rep = typename TimePoint::rep;
  using tp_duration = typename TimePoint::duration;
  if constexpr (std::is_integral_v<rep> && std::is_same_v<tp_duration, Duration>) {
    const rep a = t.time_since_epoch().count();
    const rep b = ttl.count();  // > 0
    if (a > std::numeric_limits<rep>::max() - b) return {TimePoint::max(), true};
    return {TimePoint(tp_duration(a + b)), false};
  } else {
    return {t + ttl, false};
  }
}

template <class Slot, class Duration>
class PoolRecency {
 public:
  using duration = Duration;
  using time_point = typename Slot::time_point;

  /// Class 0 keeps `default_ttl` for good: it is never vacated for reuse. May throw.
  explicit PoolRecency(duration default_ttl) {
    classes_.push_back(Class{default_ttl});
    due_.reserve(1);
    oldest_.reserve(1);
  }

  PoolRecency(const PoolRecency&) = delete;
  PoolRecency& operator=(const PoolRecency&) = delete;

  /// The class an entry with `ttl` will join: class 0 for the default TTL, else the class that
  /// has `ttl`, else a vacant class (retagged with `ttl` here), else a new class. The last step
  /// of an insert's phase 1: may allocate and throw, and then nothing changed; once it
  /// returned, the class has `ttl` and the caller must not fail before join(). O(1) expected.
  std::uint32_t prepare(duration ttl) {
    if (ttl == classes_[0].ttl) return 0;
    auto it = by_ttl_.find(ttl.count());
    if (it != by_ttl_.end()) return it->second;
    while (!vacant_.empty() && classes_[vacant_.back()].members != 0) {
      classes_[vacant_.back()].listed_vacant = false;  // it got members back: not vacant
      vacant_.pop_back();
    }
    if (!vacant_.empty()) {
      const std::uint32_t c = vacant_.back();
      by_ttl_.emplace(ttl.count(), c);  // may throw: nothing changed yet
      vacant_.pop_back();
      classes_[c].listed_vacant = false;
      by_ttl_.erase(classes_[c].ttl.count());
      classes_[c].ttl = ttl;
      return c;
    }
    // A new class. Every vector that must later grow without throwing (the heaps and the
    // vacant list hold each class at most once) gets its room before anything changes.
    // At most one class per stored entry (plus class 0): 2^32 classes would need 2^32 slots.
    const auto c = static_cast<std::uint32_t>(classes_.size());
    reserve_for(classes_.size() + 1);
    by_ttl_.emplace(ttl.count(), c);  // may throw: only capacities changed
    classes_.push_back(Class{ttl});   // reserved
    return c;
  }

  /// Phase 2: s becomes a member of class c (from prepare); not yet listed. O(1).
  void join(Slot* s, std::uint32_t c) noexcept {
    s->ttl_class = c;
    ++classes_[c].members;
  }

  /// s leaves its class (it must be unlisted, or pinned and never listed). O(1).
  void leave(const Slot* s) noexcept {
    const std::uint32_t c = s->ttl_class;
    Class& k = classes_[c];
    if (--k.members == 0 && c != 0 && !k.listed_vacant) {
      k.listed_vacant = true;
      vacant_.push_back(c);  // reserved: each class is listed at most once
    }
  }

  /// The idle TTL of s. O(1).
  [[nodiscard]] duration ttl_of(const Slot* s) const noexcept { return classes_[s->ttl_class].ttl; }

  /// Lists s as its class's most recent entry. O(1), or O(log T) when its list was empty.
  void push_back(Slot* s) noexcept {
    const std::uint32_t c = s->ttl_class;
    Class& k = classes_[c];
    const bool was_empty = k.head == nullptr;
    append(k, s);
    if (was_empty) {
      heap_push(due_, key_of(s, k.ttl, c));
      heap_push(oldest_, Oldest{s->seq, c});
    }
  }

  /// Takes s off its class's list. O(1), or O(log T) when the list becomes empty.
  void unlink(Slot* s) noexcept {
    const std::uint32_t c = s->ttl_class;
    Class& k = classes_[c];
    detach(k, s);
    if (k.head == nullptr) {
      heap_erase(due_, k.due_pos);
      heap_erase(oldest_, k.oldest_pos);
    }
  }

  /// s (listed) was just used (its seq and last_used are new): it becomes its class's most
  /// recent entry. O(1): the heaps' keys for its class only became lower bounds.
  void touch(Slot* s) noexcept {
    if (s->next == nullptr) return;  // already the most recent of its class
    Class& k = classes_[s->ttl_class];
    detach(k, s);  // the list keeps s->next: never empty here
    append(k, s);
  }

  /// The least recently used listed entry (smallest seq), or nullptr. O(1) when the top key is
  /// exact, plus O(log T) per class re-keyed (each re-key follows a touch or removal).
  [[nodiscard]] Slot* lru_victim() noexcept {
    while (!oldest_.empty()) {
      Oldest& top = oldest_[0];
      Slot* head = classes_[top.cls].head;
      if (top.seq == head->seq) return head;
      top.seq = head->seq;  // only grew
      sift_down(oldest_, 0);
    }
    return nullptr;
  }

  /// Whether expire(now) may have anything to do: the earliest (lower-bound) deadline has
  /// passed. O(1); a lookup calls expire only when this says so.
  [[nodiscard]] bool due(time_point now) const noexcept {
    return !due_.empty() && !(now < due_[0].due);
  }

  /// Calls remove(s) for every listed entry expired at `now` (its deadline, pool_deadline, is
  /// not "never" and not after `now`); remove must unlink s. Within one call the order is by class
  /// keys, which may lag (not by exact expiry time). Returns how many. O(1) when nothing is due,
  /// else O((expired + re-keyed) x log T).
  template <class Remove>
  std::size_t expire(time_point now, Remove&& remove) noexcept {
    std::size_t n = 0;
    while (!due_.empty() && !(now < due_[0].due)) {
      Due& top = due_[0];
      // "Never" sorts after every real deadline, so a "never" key on top means that every
      // class is "never" (at time_point::max(), the only time such a key is due).
      if (top.never) break;
      const Class& k = classes_[top.cls];
      Slot* head = k.head;
      const Due exact = key_of(head, k.ttl, top.cls);
      if (!exact.never && !(now < exact.due)) {
        remove(head);  // re-keys or drops the class through unlink
        ++n;
        continue;
      }
      // Not expired, so the key lagged behind the head (a key is exact once re-read): it only
      // grows, and the loop goes on with whichever class is due next.
      top = exact;
      sift_down(due_, 0);
    }
    return n;
  }

  /// Heap bytes of the class table, the heaps, the vacant list and the TTL map (estimated
  /// from bucket count and size).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return classes_.capacity() * sizeof(Class) + due_.capacity() * sizeof(Due) +
           oldest_.capacity() * sizeof(Oldest) + vacant_.capacity() * sizeof(std::uint32_t) +
           by_ttl_.bucket_count() * sizeof(void*) +
           by_ttl_.size() *
               (sizeof(std::pair<typename duration::rep, std::uint32_t>) + 2 * sizeof(void*));
  }

  /// Number of classes: the most distinct TTLs stored at once, plus the default's.
  [[nodiscard]] std::size_t class_count() const noexcept { return classes_.size(); }

  /// Checks the lists, the heaps (order, positions, keys no later than the heads' values,
  /// membership exactly the non-empty lists), the TTL map, the vacant list and the member
  /// counts against `members` (stored entries per class, counted in the tree). Returns how
  /// many entries are listed. `require(ok, what)` reports a violation.
  template <class Require>
  std::size_t check(duration default_ttl, const std::vector<std::size_t>& members,
                    Require&& require) const {
    require(!classes_.empty() && classes_[0].ttl == default_ttl, "default ttl class");
    require(by_ttl_.size() + 1 == classes_.size(), "ttl map size");
    std::size_t listed = 0, non_empty = 0, vacant = 0;
    for (std::size_t i = 0; i < classes_.size(); ++i) {
      const Class& k = classes_[i];
      require(k.members == members[i], "ttl class members");
      if (i != 0) {
        const auto it = by_ttl_.find(k.ttl.count());
        require(it != by_ttl_.end() && it->second == i && k.ttl != default_ttl, "ttl map");
      }
      require(i != 0 || !k.listed_vacant, "class 0 vacant");
      if (k.listed_vacant) ++vacant;
      require(k.members != 0 || i == 0 || k.listed_vacant, "vacant class not listed");
      const Slot* prev = nullptr;
      for (const Slot* s = k.head; s != nullptr; s = s->next) {
        require(!s->pinned && s->prev == prev, "list links");
        require(prev == nullptr || prev->seq < s->seq, "list order");
        // The pool never stamps a time earlier than one it has already used, so a list in
        // use order is also in time order: its head is the first of its class to expire.
        require(prev == nullptr || !(s->last_used < prev->last_used), "list times");
        require(s->ttl_class == i, "list class");
        prev = s;
        ++listed;
      }
      require(k.tail == prev, "list tail");
      if (k.head == nullptr) continue;
      ++non_empty;
      require(k.due_pos < due_.size() && due_[k.due_pos].cls == i, "expiry heap position");
      require(!key_of(k.head, k.ttl, static_cast<std::uint32_t>(i)).before(due_[k.due_pos]),
              "expiry key later than the head's");
      require(k.oldest_pos < oldest_.size() && oldest_[k.oldest_pos].cls == i,
              "recency heap position");
      require(oldest_[k.oldest_pos].seq <= k.head->seq, "recency key later than the head's");
    }
    require(due_.size() == non_empty && oldest_.size() == non_empty, "heap membership");
    for (std::size_t i = 1; i < due_.size(); ++i)
      require(!(due_[i].due < due_[(i - 1) / 2].due), "expiry heap order");
    for (std::size_t i = 1; i < oldest_.size(); ++i)
      require(oldest_[(i - 1) / 2].seq <= oldest_[i].seq, "recency heap order");
    require(vacant_.size() == vacant, "vacant list");
    for (std::uint32_t c : vacant_)
      require(c < classes_.size() && classes_[c].listed_vacant, "vacant list members");
    require(due_.capacity() >= classes_.size() && oldest_.capacity() >= classes_.size() &&
                vacant_.capacity() + 1 >= classes_.size(),
            "reserved room");
    return listed;
  }

 private:
  struct Class {
    explicit Class(duration t) noexcept : ttl(t) {}
    duration ttl;
    Slot* head = nullptr;          // least recently used
    Slot* tail = nullptr;          // most recently used
    std::size_t members = 0;       // stored entries of this class, pinned or not
    std::uint32_t due_pos = 0;     // position in due_ while the list is not empty
    std::uint32_t oldest_pos = 0;  // position in oldest_ while the list is not empty
    bool listed_vacant = false;    // in vacant_ (checked for members when taken)
  };

  // Heap items carry their key, so that the check on every lookup reads one cache line.
  struct Due {
    time_point due;  // no later than the head's expiry time
    std::uint32_t cls;
    bool never;  // the head never expires (then `due` is time_point::max())
    // By time, and "never" after a real deadline at time_point::max().
    bool before(const Due& o) const noexcept {
      return due < o.due || (due == o.due && !never && o.never);
    }
    static std::uint32_t& pos(Class& k) noexcept { return k.due_pos; }
  };
  struct Oldest {
    std::uint64_t seq;  // no larger than the head's seq
    std::uint32_t cls;
    bool before(const Oldest& o) const noexcept { return seq < o.seq; }
    static std::uint32_t& pos(Class& k) noexcept { return k.oldest_pos; }
  };

  static Due key_of(const Slot* head, duration ttl, std::uint32_t c) noexcept {
    const PoolDeadline<time_point> d = pool_deadline(head->last_used, ttl);
    return Due{d.at, c, d.never};
  }

  static void append(Class& k, Slot* s) noexcept {
    s->prev = k.tail;
    s->next = nullptr;
    (k.tail ? k.tail->next : k.head) = s;
    k.tail = s;
  }

  static void detach(Class& k, Slot* s) noexcept {
    (s->prev ? s->prev->next : k.head) = s->next;
    (s->next ? s->next->prev : k.tail) = s->prev;
    s->prev = s->next = nullptr;
  }

  // May throw; changes capacities only.
  void reserve_for(std::size_t classes) {
    if (classes_.capacity() < classes) classes_.reserve(std::max(classes, 2 * classes_.size()));
    if (due_.capacity() < classes) due_.reserve(classes_.capacity());
    if (oldest_.capacity() < classes) oldest_.reserve(classes_.capacity());
    if (vacant_.capacity() < classes) vacant_.reserve(classes_.capacity());
  }

  template <class Item>
  void place(std::vector<Item>& h, std::size_t i, const Item& it) noexcept {
    h[i] = it;
    Item::pos(classes_[it.cls]) = static_cast<std::uint32_t>(i);
  }

  template <class Item>
  void sift_up(std::vector<Item>& h, std::size_t i) noexcept {
    const Item it = h[i];
    while (i > 0) {
      const std::size_t up = (i - 1) / 2;
      if (!it.before(h[up])) break;
      place(h, i, h[up]);
      i = up;
    }
    place(h, i, it);
  }

  template <class Item>
  void sift_down(std::vector<Item>& h, std::size_t i) noexcept {
    const Item it = h[i];
    const std::size_t n = h.size();
    while (true) {
      std::size_t c = 2 * i + 1;
      if (c >= n) break;
      if (c + 1 < n && h[c + 1].before(h[c])) ++c;
      if (!h[c].before(it)) break;
      place(h, i, h[c]);
      i = c;
    }
    place(h, i, it);
  }

  // Requires room (reserved for every class by prepare and the constructor).
  template <class Item>
  void heap_push(std::vector<Item>& h, const Item& it) noexcept {
    h.push_back(it);
    sift_up(h, h.size() - 1);
  }

  template <class Item>
  void heap_erase(std::vector<Item>& h, std::size_t i) noexcept {
    const Item last = h.back();
    h.pop_back();
    if (i == h.size()) return;
    place(h, i, last);
    sift_up(h, i);
    sift_down(h, Item::pos(classes_[last.cls]));
  }

  std::vector<Class> classes_;
  std::vector<Due> due_;        // classes with a non-empty list, by (a lower bound of) expiry
  std::vector<Oldest> oldest_;  // the same classes, by (a lower bound of) the head's seq
  std::vector<std::uint32_t> vacant_;  // classes that were left without members (lazily)
  std::unordered_map<typename duration::rep, std::uint32_t> by_ttl_;  // ttl -> class, not 0
};

}  // namespace promptcache::detail
