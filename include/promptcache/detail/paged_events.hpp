// promptcache: detail/paged_events.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The KV events a PagedPrefixCache publishes, so that a KvIndex fed by them answers
// exactly what the cache would match: the Dynamo block hashes of its pages (a chain
// of sequence hashes under the namespace's seed), event numbering, and the guard
// that keeps the cache unchanged while the sink runs.
//
// A node keeps only the sequence hash of its last page (what a child's Stored event
// names as its parent); the hashes of its other pages are recomputed from its tokens
// when they are evicted, which keeps the index at a few bytes per page.
//
// The publisher is the one place that calls the sink: a sink of another form needs
// only this class and the caller of publish() to know of it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "promptcache/block_hash.hpp"
#include "promptcache/kv_index.hpp"

namespace promptcache::detail {

/// A non-const member of the cache called from its own event sink: refused, nothing
/// changed.
[[noreturn]] inline void paged_throw_reentered() {
  throw std::logic_error("PagedPrefixCache: called from its own event sink");
}

/// Walks the sequence hashes of `n` pages of `page_size` tokens at `tokens` following
/// `parent` (none at the root), calling f(page index, hash) for each; returns the last
/// one. Allocates nothing.
/// These helpers are forced inline, as the loops were when each caller spelled them out:
/// GCC outlines a helper reached from several callers, and the call, the spilled
/// registers and an out-of-line vector resize then cost an insert or an evict 1-3%.
template <class F>
[[gnu::always_inline]] inline std::uint64_t paged_chain_hashes(std::optional<std::uint64_t> parent,
                                                               const std::uint32_t* tokens,
                                                               std::size_t n, std::size_t page_size,
                                                               std::uint64_t seed, F&& f) noexcept {
  constexpr std::size_t batch = 32;
  std::uint64_t locals[batch];
  BlockHashOptions opts;
  opts.seed = seed;
  std::uint64_t h = 0;
  for (std::size_t base = 0; base < n; base += batch) {
    const std::size_t m = std::min(batch, n - base);
    local_block_hashes(std::span<const std::uint32_t>(tokens + base * page_size, m * page_size),
                       page_size, std::span<std::uint64_t>(locals, m), opts);
    for (std::size_t i = 0; i < m; ++i) {
      h = parent ? sequence_hash(*parent, locals[i]) : locals[i];
      parent = h;
      f(static_cast<std::uint32_t>(base + i), h);
    }
  }
  return h;
}

/// The sequence hash of the last of `n` pages (see paged_chain_hashes).
[[gnu::always_inline]] inline std::uint64_t paged_last_hash(std::optional<std::uint64_t> parent,
                                                            const std::uint32_t* tokens,
                                                            std::size_t n, std::size_t page_size,
                                                            std::uint64_t seed) noexcept {
  return paged_chain_hashes(parent, tokens, n, page_size, seed,
                            [](std::uint32_t, std::uint64_t) {});
}

/// The Stored event of `new_pages` pages of `page_size` tokens at `tokens`, under the
/// page whose sequence hash is `parent` (none at the root). Throws std::bad_alloc.
[[gnu::always_inline]] inline kv_event::Stored paged_stored_event(
    std::span<const std::uint32_t> tokens, std::size_t page_size, std::size_t new_pages,
    std::uint64_t seed, std::optional<std::uint64_t> parent) {
  kv_event::Stored st;
  st.blocks.resize(new_pages);
  std::vector<std::uint64_t> locals(new_pages);
  BlockHashOptions opts;
  opts.seed = seed;
  local_block_hashes(tokens, page_size, locals, opts);
  st.parent_hash = parent;
  for (std::size_t i = 0; i < new_pages; ++i) {
    const std::uint64_t h = parent ? sequence_hash(*parent, locals[i]) : locals[i];
    st.blocks[i] = KvBlock{h, locals[i]};
    parent = h;
  }
  return st;
}

/// Appends to `removed` the sequence hashes of pages [keep, n) of the `n` pages at
/// `tokens` (deepest first), as a Removed event names them; returns the hash of page
/// keep - 1 (0 when keep is 0), the node's new last hash. One walk of the chain: only a
/// node's last hash is kept. Requires capacity in `removed`.
[[gnu::always_inline]] inline std::uint64_t paged_trimmed_hashes(
    std::optional<std::uint64_t> parent, const std::uint32_t* tokens, std::size_t n,
    std::uint32_t keep, std::size_t page_size, std::uint64_t seed,
    std::vector<std::uint64_t>& removed) noexcept {
  const std::size_t first = removed.size();
  std::uint64_t new_last = 0;
  paged_chain_hashes(parent, tokens, n, page_size, seed, [&](std::uint32_t i, std::uint64_t h) {
    if (i + 1 == keep) new_last = h;
    if (i >= keep) removed.push_back(h);
  });
  std::reverse(removed.begin() + static_cast<std::ptrdiff_t>(first), removed.end());
  return new_last;
}

/// Appends to `removed` the sequence hashes of all `n` pages at `tokens` (deepest
/// first). Requires capacity in `removed`.
[[gnu::always_inline]] inline void paged_removed_hashes(
    std::optional<std::uint64_t> parent, const std::uint32_t* tokens, std::size_t n,
    std::size_t page_size, std::uint64_t seed, std::vector<std::uint64_t>& removed) noexcept {
  const std::size_t first = removed.size();
  paged_chain_hashes(parent, tokens, n, page_size, seed,
                     [&](std::uint32_t, std::uint64_t h) { removed.push_back(h); });
  std::reverse(removed.begin() + static_cast<std::ptrdiff_t>(first), removed.end());
}

/// Selects PagedEventPublisher's token-sink constructor.
struct PagedTokenSinkTag {};

/// Numbers the events and hands them to the sink: `Sink` takes the event, `TokenSink`
/// the event and what a Stored event's pages hold (their namespace and tokens), which a
/// wire publisher sends on. At most one of the two is set. While the sink runs,
/// publishing() is true: the cache is mid-change, so its non-const members refuse.
template <class Sink, class TokenSink>
class PagedEventPublisher {
 public:
  /// Whether take() can throw (only a sink's move assignment can).
  static constexpr bool nothrow_take =
      std::is_nothrow_move_assignable_v<Sink> && std::is_nothrow_move_assignable_v<TokenSink>;

  /// No sink: nothing is published. O(1).
  PagedEventPublisher() = default;
  /// Publishes to `sink` when it is set. O(1).
  explicit PagedEventPublisher(Sink sink) : sink_(std::move(sink)), on_(static_cast<bool>(sink_)) {}
  /// Publishes to the token sink `sink` when it is set. O(1).
  PagedEventPublisher(PagedTokenSinkTag, TokenSink sink)
      : token_sink_(std::move(sink)), on_(static_cast<bool>(token_sink_)) {}

  /// True when a sink was given: pages carry block hashes and events are published.
  [[nodiscard]] bool on() const noexcept { return on_; }
  /// True while the sink runs.
  [[nodiscard]] bool publishing() const noexcept { return publishing_; }
  /// Id the next event will carry.
  [[nodiscard]] std::uint64_t next_id() const noexcept { return next_id_; }

  /// Publishes one event with `payload`, counting its id into `published` (also when the
  /// sink throws: the id stays consumed, so a router sees the gap and resyncs). `pages`
  /// (at most one: what a Stored event's pages hold) goes to a token sink; without it a
  /// token sink gets an empty one.
  /// The payload is emplaced into the event: building a variant first and moving it in
  /// trips GCC's maybe-uninitialized analysis at -O1 and above.
  template <class Payload, class... Pages>
  void publish(Payload&& payload, std::uint64_t& published, const Pages&... pages) {
    static_assert(sizeof...(Pages) <= 1, "at most one description of the stored pages");
    if (!on_) return;
    KvEvent ev;
    ev.event_id = next_id_++;
    ev.data.template emplace<std::decay_t<Payload>>(std::forward<Payload>(payload));
    ++published;
    // The caller's saved state (insert's path and reserved space, evict's heap) would go
    // stale if the sink changed the cache: every non-const member refuses while this runs.
    publishing_ = true;
    struct Reset {
      bool& flag;
      ~Reset() { flag = false; }
    } reset{publishing_};
    if (sink_)
      sink_(ev);
    else if constexpr (sizeof...(Pages) == 1)
      token_sink_(ev, pages...);
    else
      token_sink_(ev, {});
  }

  /// Takes `other`'s sink and event ids, leaving it none (it then publishes nothing).
  void take(PagedEventPublisher& other) noexcept(nothrow_take) {
    sink_ = std::exchange(other.sink_, nullptr);
    token_sink_ = std::exchange(other.token_sink_, nullptr);
    on_ = std::exchange(other.on_, false);
    next_id_ = std::exchange(other.next_id_, 0);
  }

 private:
  Sink sink_{};
  TokenSink token_sink_{};
  bool on_ = false;
  std::uint64_t next_id_ = 0;
  bool publishing_ = false;  // the sink is running: non-const members throw std::logic_error
};

}  // namespace promptcache::detail
