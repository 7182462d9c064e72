// Fuzz harness for CursorState: the input picks an id type (8 to 64 bits) and a
// sequence of observe / advance / reset / compare operations with ids near the
// cursor, at 0 and at the type's maximum. Every observation is checked against
// the rule computed in 128-bit arithmetic (no wrap possible), and a consumer
// loop advances only on Initial / Contiguous as a real subscriber does.
#include <fuzzer/FuzzedDataProvider.h>
#include <promptcache/cursor.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <variant>

#include "fuzz_support.hpp"

namespace {

namespace cursor = promptcache::cursor;
using promptcache::CursorObservation;
using promptcache::CursorState;
using Wide = unsigned __int128;

fuzz::OperationReport report{"fuzz_cursor"};

template <class Id>
Id pick_id(FuzzedDataProvider& in, const std::optional<Id>& last) {
  constexpr Id max = std::numeric_limits<Id>::max();
  const Id base = last.value_or(Id{0});
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
      return Id{0};
    case 1:
      return max;
    case 2:
      return static_cast<Id>(max - in.ConsumeIntegralInRange<Id>(0, 3));
    case 3:  // just after the cursor (contiguous or a small gap), saturating
    {
      const Id k = in.ConsumeIntegralInRange<Id>(1, 3);
      return base > max - k ? max : static_cast<Id>(base + k);
    }
    case 4:  // at or just before the cursor (stale), saturating at 0
    {
      const Id k = in.ConsumeIntegralInRange<Id>(0, 3);
      return base < k ? Id{0} : static_cast<Id>(base - k);
    }
    default:
      return in.ConsumeIntegral<Id>();
  }
}

// The rule, computed without any arithmetic that could wrap.
template <class Id>
CursorObservation<Id> expected(const std::optional<Id>& last, Id got) {
  if (!last) return cursor::Initial<Id>{got};
  if (Wide{got} <= Wide{*last}) return cursor::Stale<Id>{got, last};
  if (Wide{got} == Wide{*last} + 1) return cursor::Contiguous<Id>{got};
  return cursor::Gap<Id>{static_cast<Id>(Wide{*last} + 1), got};
}

template <class Id>
void run(FuzzedDataProvider& in) {
  std::optional<Id> last;  // the model: nothing applied, or the last applied id
  CursorState<Id> c;
  if (in.ConsumeBool()) {
    last = in.ConsumeIntegral<Id>();
    c = CursorState<Id>::live(*last);
  }
  while (in.remaining_bytes() > 0) {
    ++fuzz::operations();
    switch (in.ConsumeIntegralInRange<int>(0, 5)) {
      case 0:
      case 1: {  // observe, then apply as a consumer would
        const Id got = pick_id(in, last);
        const CursorState<Id> before = c;
        const CursorObservation<Id> obs = c.observe(got);
        FUZZ_CHECK(obs == expected(last, got));
        FUZZ_CHECK(c == before);  // observe never changes the cursor
        if (std::holds_alternative<cursor::Initial<Id>>(obs) ||
            std::holds_alternative<cursor::Contiguous<Id>>(obs)) {
          c = c.advance_to(got);
          last = got;
        }
        break;
      }
      case 2: {  // advance unconditionally (a resync after a gap)
        const Id id = pick_id(in, last);
        const CursorState<Id> next = c.advance_to(id);
        FUZZ_CHECK(next == CursorState<Id>::live(id));
        c = next;
        last = id;
        break;
      }
      case 3:  // a publisher restart: a new cursor
        c = in.ConsumeBool() ? CursorState<Id>::initial() : CursorState<Id>{};
        last.reset();
        break;
      case 4: {  // equality with a live cursor
        const Id id = pick_id(in, last);
        FUZZ_CHECK((c == CursorState<Id>::live(id)) == (last == id));
        FUZZ_CHECK((c == CursorState<Id>::initial()) == !last.has_value());
        break;
      }
      default:  // every later id after max() is stale
        if (last == std::numeric_limits<Id>::max()) {
          const Id got = in.ConsumeIntegral<Id>();
          FUZZ_CHECK(std::holds_alternative<cursor::Stale<Id>>(c.observe(got)));
        }
        break;
    }
    FUZZ_CHECK(c.is_initial() == !last.has_value());
    FUZZ_CHECK(c.last_applied_id() == last);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      run<std::uint8_t>(in);
      break;
    case 1:
      run<std::uint16_t>(in);
      break;
    case 2:
      run<std::uint32_t>(in);
      break;
    default:
      run<std::uint64_t>(in);
      break;
  }
  return 0;
}
