// promptcache: detail/paged_state.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The state of one PagedPrefixCache, which every part of it (the tree, the locks,
// the eviction order, the match walk, the removal paths) works on: the nodes and
// their free list, the blocks holding their pages, the edge table, the heaps of
// evictable leaves, the namespaces, the event publisher and the counters. The parts
// are stateless: they take the state by reference, so a call through a part costs
// what a member function of the cache did.
//
// Invariants (checked by PagedPrefixCache::check_invariants): a node's lock count is
// its children's plus the locks taken at it; a node is in the heap of its key class
// exactly when it is an unlocked leaf; siblings never share their first page; each
// (parent, first token) edge names the head of a chain of the siblings starting with
// that token; with a sink, a node's last hash is its last page's sequence hash.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "promptcache/detail/paged_blocks.hpp"
#include "promptcache/detail/paged_edge_table.hpp"
#include "promptcache/detail/paged_events.hpp"
#include "promptcache/detail/paged_namespaces.hpp"
#include "promptcache/paged_eviction_policy.hpp"

namespace promptcache::detail {

/// No node.
inline constexpr std::uint32_t paged_npos = 0xFFFFFFFFU;

/// What a node slot holds: nothing (on the free list), a namespace root, or pages.
enum class PagedKind : std::uint8_t { free, root, node };

/// One tree node. Pages [off, off + n) of its block are live (detail/paged_blocks.hpp).
/// `tok` and `ids` point at the first live page's tokens and id, so a match reads them
/// without the block's layout arithmetic.
/// Layout: what match() reads and writes on every node of its path (tok, ids, n,
/// first_child and, for the common policies, meta) comes first and fills at most 32
/// bytes; with the node aligned to 32 bytes those fields never straddle a cache line,
/// so a walk misses at most once per node. The rest serves insert, evict and locks.
template <class PageId, class Meta>
struct alignas(32) PagedNode {
  std::uint32_t* tok = nullptr;  ///< tokens of the first live page
  PageId* ids = nullptr;         ///< id of the first live page
  std::uint32_t n = 0;           ///< live pages
  std::uint32_t first_child = paged_npos;
  Meta meta{};  ///< the policy's metadata
  std::unique_ptr<unsigned char[]> block{};
  std::uint32_t cap = 0;                 ///< pages the block holds
  std::uint32_t next_same = paged_npos;  ///< next sibling with the same first token
  std::uint32_t gen = 0;                 ///< bumped when the node is freed or trimmed
  std::uint32_t depth = 0;               ///< pages before this node on its path
  std::uint32_t parent = paged_npos;
  std::uint32_t next = paged_npos;      ///< next sibling (free list link for free nodes)
  std::uint32_t prev = paged_npos;      ///< previous sibling
  std::uint32_t lock = 0;               ///< locks whose path runs through this node
  std::uint32_t own = 0;                ///< locks taken with a handle ending at this node
  std::uint32_t heap_pos = paged_npos;  ///< position in the heap of evictable leaves
  std::uint32_t ns = 0;                 ///< namespace slot
  PagedKind kind = PagedKind::free;
  std::uint64_t last_hash = 0;  ///< with a sink: sequence hash of the last page
};

/// An evictable leaf in a heap, with its policy key when it was last keyed.
template <class Key>
struct PagedHeapEntry {
  Key key;             ///< the key (at most the leaf's current key)
  std::uint32_t node;  ///< the leaf
};

/// The types the parts of a PagedPrefixCache use: its page id type, its policy, its
/// event sinks, its counters (PagedCacheStats) and its handles (PagedPrefixHandle).
template <class PageIdT, class PolicyT, class SinkT, class TokenSinkT, class StatsT, class HandleT>
struct PagedTypes {
  using PageId = PageIdT;        ///< The engine's page id type.
  using Policy = PolicyT;        ///< The eviction policy.
  using Sink = SinkT;            ///< The event sink.
  using TokenSink = TokenSinkT;  ///< The token sink (events and the stored pages' tokens).
  using Stats = StatsT;          ///< Counters and gauges.
  using Handle = HandleT;        ///< A handle to the end of a prefix.
};

/// The shared state of a PagedPrefixCache. `Types` is its PagedTypes.
template <class Types>
struct PagedCacheState {
  /// The engine's page id type.
  using PageId = typename Types::PageId;
  /// The eviction policy.
  using Policy = typename Types::Policy;
  /// Token ids.
  using Token = std::uint32_t;
  /// A tree node.
  using Node = PagedNode<PageId, typename Policy::meta_type>;
  /// A heap entry.
  using HeapEntry = PagedHeapEntry<typename Policy::key_type>;
  /// Key classes of the policy: one heap each.
  static constexpr std::size_t classes = paged_key_classes<Policy>;
  /// Whether take() can throw (only the sink's and the maps' move assignments can; the
  /// vectors and the edge table never do).
  static constexpr bool nothrow_take =
      PagedEventPublisher<typename Types::Sink, typename Types::TokenSink>::nothrow_take &&
      PagedNamespaces::nothrow_take;

  PagedBlocks<Token, PageId> blocks;  ///< page size, block layout, block pages
  Policy policy;                      ///< the eviction policy
  PagedEventPublisher<typename Types::Sink, typename Types::TokenSink>
      events;                                         ///< the sinks, event ids
  std::vector<Node> nodes;                            ///< every node, free ones included
  std::uint32_t free_head = paged_npos;               ///< the free list of nodes
  std::size_t free_count = 0;                         ///< nodes on the free list
  std::size_t evictable_pages = 0;                    ///< cached pages of unlocked nodes
  PagedEdgeTable edges;                               ///< (parent, first token) -> child
  std::array<std::vector<HeapEntry>, classes> heaps;  ///< evictable leaves per key class
  std::array<std::size_t, classes> class_pages{};     ///< cached pages per key class
  PagedNamespaces namespaces;                         ///< namespace slots and seeds
  std::vector<std::uint32_t> path;  ///< insert's scratch: fully matched nodes of the path
  std::uint64_t tick = 0;           ///< the policy's clock: one tick per match or insert
  typename Types::Stats stats;      ///< counters and gauges

  /// An empty cache's state, its publisher built from `sink` (none: no sink, as the
  /// moves want it before they take the contents).
  template <class... Sink>
  PagedCacheState(std::size_t page_size, Policy&& p, Sink&&... sink)
      : blocks(page_size), policy(std::move(p)), events(std::forward<Sink>(sink)...) {}

  /// The moves' common part: takes everything but the policy from `other` and leaves
  /// `other` empty (a moved-from standard container is only "valid but unspecified", and
  /// the counters and free-list links describe the containers, so each is exchanged with
  /// its empty value); `other` keeps its page size. The sink goes with the contents.
  void take(PagedCacheState& other) noexcept(nothrow_take) {
    events.take(other.events);
    nodes = std::exchange(other.nodes, {});
    free_head = std::exchange(other.free_head, paged_npos);
    free_count = std::exchange(other.free_count, 0);
    blocks.take(other.blocks);
    evictable_pages = std::exchange(other.evictable_pages, 0);
    edges = std::exchange(other.edges, {});
    heaps = std::exchange(other.heaps, {});
    class_pages = std::exchange(other.class_pages, {});
    namespaces.take(other.namespaces);
    path = std::exchange(other.path, {});
    tick = std::exchange(other.tick, 0);
    stats = std::exchange(other.stats, {});
  }
};

}  // namespace promptcache::detail
