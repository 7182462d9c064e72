// A KV-event consumer for one publisher: apply contiguous events, drop stale
// (replayed) ones, and resynchronise from a snapshot when events were lost.
#include <promptcache/cursor.hpp>

#include <cstdint>
#include <cstdio>
#include <variant>

int main() {
  using promptcache::CursorState;
  namespace cursor = promptcache::cursor;

  // What arrives from the publisher: a duplicate of 2, then 5..6 are lost.
  const std::uint64_t arrivals[] = {0, 1, 2, 2, 3, 4, 7, 8, 8, 9};
  CursorState<> state;
  for (const std::uint64_t id : arrivals) {
    const auto obs = state.observe(id);
    if (const auto* stale = std::get_if<cursor::Stale<std::uint64_t>>(&obs)) {
      std::printf("event %2llu: stale (last applied %llu), dropped\n",
                  static_cast<unsigned long long>(id),
                  static_cast<unsigned long long>(stale->last_applied.value_or(0)));
      continue;
    }
    if (const auto* gap = std::get_if<cursor::Gap<std::uint64_t>>(&obs)) {
      std::printf("event %2llu: gap, events %llu..%llu lost: rebuild from a dump, then apply\n",
                  static_cast<unsigned long long>(id),
                  static_cast<unsigned long long>(gap->expected),
                  static_cast<unsigned long long>(gap->got - 1));
    } else {
      std::printf(
          "event %2llu: %s, applied\n", static_cast<unsigned long long>(id),
          std::holds_alternative<cursor::Initial<std::uint64_t>>(obs) ? "first" : "contiguous");
    }
    state = state.advance_to(id);
  }
  std::printf("last applied: %llu\n",
              static_cast<unsigned long long>(state.last_applied_id().value_or(0)));
  return 0;
}
