// A KV-event consumer for one publisher: apply contiguous events, drop stale
// (replayed) ones, and resynchronise from a snapshot when events were lost.
//
// The publisher's state is a small table: event `id` writes `id` into slot
// id % 4. The consumer keeps its own copy (its view), which must end equal to
// the publisher's even though events were duplicated and lost on the way.
#include <promptcache/cursor.hpp>

#include <array>
#include <cstdint>
#include <cstdio>
#include <variant>

namespace {

using promptcache::CursorState;
namespace cursor = promptcache::cursor;

using Table = std::array<std::uint64_t, 4>;

void apply(Table& table, std::uint64_t id) {
  table[id % table.size()] = id;
}

// The publishing side: its table, and a dump of it on request.
class Publisher {
 public:
  // Publishes every event up to `id` (the stream then delivers them, or not).
  void publish_through(std::uint64_t id) {
    for (; next_ <= id; ++next_)
      apply(table_, next_);
  }
  [[nodiscard]] const Table& table() const { return table_; }
  // Its table and the id of the last event the table includes.
  [[nodiscard]] std::uint64_t dump(Table& out) const {
    out = table_;
    return next_ - 1;
  }

 private:
  Table table_{};
  std::uint64_t next_ = 0;
};

// Rebuilds the view from a dump; the cursor continues after the dump's last
// event, so events the dump already holds come back as Stale.
CursorState<> resync(const Publisher& publisher, Table& view) {
  const std::uint64_t last = publisher.dump(view);
  std::printf("          resynced from a dump through event %llu\n",
              static_cast<unsigned long long>(last));
  return CursorState<>::live(last);
}

}  // namespace

int main() {
  // What arrives from the publisher: a duplicate of 2, then 5..6 are lost.
  const std::uint64_t arrivals[] = {0, 1, 2, 2, 3, 4, 7, 8, 8, 9};
  Publisher publisher;
  Table view{};
  CursorState<> state;
  for (const std::uint64_t id : arrivals) {
    publisher.publish_through(id);
    auto obs = state.observe(id);
    if (const auto* gap = std::get_if<cursor::Gap<std::uint64_t>>(&obs)) {
      std::printf("event %2llu: gap, events %llu..%llu lost\n", static_cast<unsigned long long>(id),
                  static_cast<unsigned long long>(gap->expected),
                  static_cast<unsigned long long>(gap->got - 1));
      state = resync(publisher, view);
      obs = state.observe(id);
    }
    if (const auto* stale = std::get_if<cursor::Stale<std::uint64_t>>(&obs)) {
      std::printf("event %2llu: stale (last applied %llu), dropped\n",
                  static_cast<unsigned long long>(id),
                  static_cast<unsigned long long>(stale->last_applied.value_or(0)));
      continue;
    }
    std::printf(
        "event %2llu: %s, applied\n", static_cast<unsigned long long>(id),
        std::holds_alternative<cursor::Initial<std::uint64_t>>(obs) ? "first" : "contiguous");
    apply(view, id);
    state = state.advance_to(id);
  }
  const bool same = view == publisher.table();
  std::printf("last applied: %llu; view %s the publisher's table\n",
              static_cast<unsigned long long>(state.last_applied_id().value_or(0)),
              same ? "matches" : "DIFFERS FROM");
  return same ? 0 : 1;
}
