// promptcache: detail/pool_recency.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The recency order of PromptCachePool's unpinned entries, split by idle TTL. Entries that
// share a TTL form a class with an intrusive list in touch order (least recent first): the
// head is the class's LRU entry and, the clock being monotonic, also the first of the class
// to expire. A class left without members (pinned ones included: they rejoin the list when
// unpinned) is reused for the next new TTL value, so per-request TTLs cost only as many
// classes as distinct TTLs are stored at once.
//
// Works on records with the fields of detail::PoolSlot (prev, next, seq, last_used,
// ttl_class, pinned).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace promptcache::detail {

template <class Slot, class Duration>
class PoolRecency {
 public:
  using duration = Duration;
  using time_point = typename Slot::time_point;

  /// Class 0 keeps `default_ttl` for good: it is never vacated for reuse. May throw.
  explicit PoolRecency(duration default_ttl) {
    classes_.push_back(Class{default_ttl, nullptr, nullptr, 0});
  }

  /// Phase 1 of an insert: the class an entry with `ttl` will join (an existing one with that
  /// TTL, a vacant one, or a new one). May allocate and throw; then nothing changed. An
  /// unused new class is harmless. O(T), T = classes.
  std::uint32_t prepare(duration ttl) {
    std::size_t c = 0, vacant = 0;  // class 0 keeps the default ttl: never vacant
    while (c < classes_.size() && classes_[c].ttl != ttl) {
      if (vacant == 0 && c != 0 && classes_[c].members == 0) vacant = c;
      ++c;
    }
    if (c == classes_.size()) {
      if (vacant != 0) {
        c = vacant;  // takes `ttl` in join()
      } else {
        classes_.push_back(Class{ttl, nullptr, nullptr, 0});
      }
    }
    // At most one class per stored entry (plus class 0): 2^32 classes would need 2^32 slots.
    return static_cast<std::uint32_t>(c);
  }

  /// Phase 2: s becomes a member of class c (from prepare) with `ttl`; not yet listed.
  void join(Slot* s, std::uint32_t c, duration ttl) noexcept {
    s->ttl_class = c;
    classes_[c].ttl = ttl;
    ++classes_[c].members;
  }

  /// s leaves its class (it must be unlisted, or pinned and never listed).
  void leave(const Slot* s) noexcept { --classes_[s->ttl_class].members; }

  /// The idle TTL of s. O(1).
  [[nodiscard]] duration ttl_of(const Slot* s) const noexcept { return classes_[s->ttl_class].ttl; }

  /// Lists s as its class's most recent entry. O(1).
  void push_back(Slot* s) noexcept {
    Class& cls = classes_[s->ttl_class];
    s->prev = cls.tail;
    s->next = nullptr;
    (cls.tail ? cls.tail->next : cls.head) = s;
    cls.tail = s;
  }

  /// Takes s off its class's list. O(1).
  void unlink(Slot* s) noexcept {
    Class& cls = classes_[s->ttl_class];
    (s->prev ? s->prev->next : cls.head) = s->next;
    (s->next ? s->next->prev : cls.tail) = s->prev;
    s->prev = s->next = nullptr;
  }

  /// s (listed) was just used: it becomes its class's most recent entry. O(1).
  void touch(Slot* s) noexcept {
    unlink(s);
    push_back(s);
  }

  /// The least recently used listed entry (smallest seq), or nullptr. O(T).
  [[nodiscard]] Slot* lru_victim() const noexcept {
    Slot* victim = nullptr;
    for (const Class& cls : classes_) {
      if (cls.head != nullptr && (victim == nullptr || cls.head->seq < victim->seq))
        victim = cls.head;
    }
    return victim;
  }

  /// Calls remove(s) for every listed entry idle for at least its TTL at `now`; remove must
  /// unlink s. Returns how many. O(expired + T).
  template <class Remove>
  std::size_t expire(time_point now, Remove&& remove) noexcept {
    std::size_t n = 0;
    for (std::size_t i = 0; i < classes_.size(); ++i) {
      while (classes_[i].head != nullptr && now - classes_[i].head->last_used >= classes_[i].ttl) {
        remove(classes_[i].head);
        ++n;
      }
    }
    return n;
  }

  /// Heap bytes of the class table.
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return classes_.capacity() * sizeof(Class);
  }

  /// Number of classes (for checks).
  [[nodiscard]] std::size_t class_count() const noexcept { return classes_.size(); }

  /// Checks the lists and the member counts against `members` (stored entries per class, as
  /// counted in the tree) and returns how many entries are listed. `require(ok, what)`
  /// reports a violation.
  template <class Require>
  std::size_t check(duration default_ttl, const std::vector<std::size_t>& members,
                    Require&& require) const {
    require(!classes_.empty() && classes_[0].ttl == default_ttl, "default ttl class");
    for (std::size_t i = 0; i < classes_.size(); ++i)
      require(classes_[i].members == members[i], "ttl class members");
    std::size_t listed = 0;
    for (const Class& cls : classes_) {
      const Slot* prev = nullptr;
      for (const Slot* s = cls.head; s != nullptr; s = s->next) {
        require(!s->pinned && s->prev == prev, "list links");
        require(prev == nullptr || prev->seq < s->seq, "list order");
        require(&classes_[s->ttl_class] == &cls, "list class");
        prev = s;
        ++listed;
      }
      require(cls.tail == prev, "list tail");
    }
    return listed;
  }

 private:
  struct Class {
    duration ttl;
    Slot* head;           // least recently used
    Slot* tail;           // most recently used
    std::size_t members;  // stored entries of this class, pinned or not
  };

  std::vector<Class> classes_;
};

}  // namespace promptcache::detail
