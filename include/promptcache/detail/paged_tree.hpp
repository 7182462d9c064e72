// promptcache: detail/paged_tree.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The radix tree of PagedPrefixCache, at page granularity: nodes in one
// index-addressed vector with a free list, one root per namespace, the children of
// a node found through the shared edge table (paged_edge_table.hpp) keyed by
// (parent, first token), siblings with the same first token chained behind the
// edge's head. This file knows the shape of the tree: node slots, finding the child
// a query continues in, splitting a node where a match ends inside it, linking and
// unlinking leaves. It keeps the node counts and the heaps (paged_eviction_order.hpp)
// in step with the shape; what is inserted, evicted or locked when is the cache's
// policy.
//
// A split keeps the node's index for its tail, so handles to the node still name the
// same end; every allocation a change needs is made before it (reserve_nodes,
// prepare_split, the blocks), so the changes themselves never throw.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <utility>

#include "promptcache/detail/mismatch.hpp"
#include "promptcache/detail/paged_eviction_order.hpp"
#include "promptcache/detail/paged_state.hpp"

namespace promptcache::detail {

/// The tree's shape over a PagedCacheState<Types>. Stateless.
template <class Types>
struct PagedTree {
  /// The state it works on.
  using State = PagedCacheState<Types>;
  /// A tree node.
  using Node = typename State::Node;
  /// The engine's page id type.
  using PageId = typename State::PageId;
  /// Token ids.
  using Token = std::uint32_t;
  /// The heaps.
  using Order = PagedEvictionOrder<Types>;
  /// The blocks a split needs.
  using SplitBlocks = typename PagedBlocks<Token, PageId>::SplitBlocks;
  /// A handle to the end of a prefix.
  using Handle = typename Types::Handle;
  /// Key classes of the policy.
  static constexpr std::size_t classes = State::classes;

  /// What find_child found. 16 bytes, so that it travels in two registers.
  struct Found {
    std::uint32_t node = paged_npos;
    std::uint32_t pages = 0;  ///< leading pages of the node that match (at most its n)
    /// When `ahead`: the edge-chain head under `node` for the query's next token (npos:
    /// none), looked up while the node was compared.
    std::uint32_t next = paged_npos;
    bool ahead = false;
  };

  /// Compares at least this long look the next level up while they run (see find_child).
  static constexpr std::size_t look_ahead_bytes = 256;

  // ---- node slots --------------------------------------------------------------------------

  /// Room for k more nodes without reallocating. Throws std::length_error past 2^32 - 1
  /// nodes, std::bad_alloc.
  static void reserve_nodes(State& st, std::size_t k) {
    if (st.free_count >= k) return;
    const std::size_t need = st.nodes.size() + (k - st.free_count);
    if (need > paged_npos) throw std::length_error("PagedPrefixCache: more than 2^32 - 1 nodes");
    if (need > st.nodes.capacity())
      st.nodes.reserve(std::max(need, st.nodes.capacity() + st.nodes.capacity() / 2));
  }

  /// A node slot. Requires reserve_nodes(): never throws.
  static std::uint32_t alloc_node(State& st) noexcept {
    if (st.free_head != paged_npos) {
      const std::uint32_t x = st.free_head;
      st.free_head = st.nodes[x].next;
      --st.free_count;
      st.nodes[x].next = paged_npos;
      return x;
    }
    st.nodes.emplace_back();
    return static_cast<std::uint32_t>(st.nodes.size() - 1);
  }

  /// Frees node x's block and puts it on the free list; handles to it go stale.
  static void free_node(State& st, std::uint32_t x) noexcept {
    Node& nd = st.nodes[x];
    st.blocks.release(nd);
    nd.cap = nd.n = nd.depth = 0;
    nd.parent = nd.first_child = nd.prev = nd.next_same = paged_npos;
    nd.lock = nd.own = 0;
    nd.heap_pos = paged_npos;
    ++nd.gen;
    nd.kind = PagedKind::free;
    nd.next = st.free_head;
    st.free_head = x;
    ++st.free_count;
  }

  /// Room for one split: a node, an edge and a heap entry. Throws std::bad_alloc.
  static void prepare_split(State& st) {
    reserve_nodes(st, 1);
    st.edges.reserve(1);
    Order::reserve(st, st.stats.nodes + 1);
  }

  // ---- namespaces' roots -------------------------------------------------------------------

  /// Creates namespace `ns` with `seed` and its root; returns its slot. Strong guarantee.
  static std::uint32_t open_namespace(State& st, std::uint64_t ns, std::uint64_t seed) {
    reserve_nodes(st, 1);
    const std::uint32_t slot = st.namespaces.open(ns, seed);
    const std::uint32_t root = alloc_node(st);
    Node& r = st.nodes[root];
    r.kind = PagedKind::root;
    r.ns = slot;
    st.namespaces.activate(slot, ns, seed, root);
    return slot;
  }

  /// Frees the root, the id and the seed of the namespace in `slot`, whose other nodes
  /// are gone, and marks the slot free for reuse. Never throws.
  static void close_namespace(State& st, std::uint32_t slot) noexcept {
    free_node(st, st.namespaces[slot].root);
    st.namespaces.close(slot);
  }

  /// Undoes open_namespace() for a namespace `slot` that holds nothing yet. Never throws.
  static void drop_empty_namespace(State& st, std::uint32_t slot) noexcept {
    close_namespace(st, slot);
    st.namespaces.pop_if_last(slot);
  }

  // ---- lookups -----------------------------------------------------------------------------

  /// The child of `parent` sharing the most leading pages with q (at least one), or npos,
  /// read through `nodes` (st.nodes.data()) and `edges` (st.edges.view()): a caller that
  /// makes calls between lookups keeps them in registers instead of reloading the state.
  /// `head`, when `known`, is the edge-chain head of (parent, q[0]) from the previous
  /// level's Found. With Copy (page size 1 only), the ids of the matched pages are written
  /// to out[0, pages). A leaf is answered from its node, without probing the edge table (a
  /// likely cache miss): every query that matches a whole cached sequence ends at one.
  /// Only a partial match pays for the division by the page size.
  /// The next level is looked up before the node is compared, and the first lines of the
  /// next node's tokens and ids are prefetched: a node, its block and the next edge slot
  /// are a chain of dependent loads, each a likely cache miss, which then overlaps the
  /// compare instead of following it. The speculation is wasted only on a partial match
  /// (the last node of a walk), and a leaf has nothing to look ahead to. Below
  /// look_ahead_bytes the compare is too short to hide those misses and the look-ahead's
  /// instructions would cost more than they save: only the next edge slot is prefetched.
  /// Forced inline: out of line, saving and restoring its registers cost as much as the
  /// edge probe on short pages.
  template <bool Copy>
  [[nodiscard]] [[gnu::always_inline]] static Found find_child(
      const State& st, const Node* nodes, PagedEdgeTable::View edges, std::uint32_t parent,
      const Token* q, std::size_t q_pages, std::uint32_t head, bool known, PageId* out) noexcept {
    if (nodes[parent].first_child == paged_npos) return {};
    const std::size_t ps = st.blocks.page_size();
    const std::size_t pb = ps * sizeof(Token);
    for (std::uint32_t c = known ? head : edges.find(parent, q[0]); c != paged_npos;
         c = nodes[c].next_same) {
      const Node& x = nodes[c];
      const std::size_t pages = std::min<std::size_t>(x.n, q_pages);
      const std::size_t cmp = pages * pb;
      std::uint32_t next = paged_npos;
      bool ahead = false;
      if (x.first_child != paged_npos && q_pages > pages) {
        if (cmp >= look_ahead_bytes) {
          ahead = true;
          const void* tokens = nullptr;
          next = edges.find(c, q[pages * ps], tokens);
          if (next != paged_npos) prefetch_head(&nodes[next], tokens);
        } else {
          edges.prefetch(c, q[pages * ps]);
        }
      }
      // Copy (page size 1, into a caller's table): one pass compares the tokens and copies
      // the ids of the matching ones to out, instead of a compare and then a second pass
      // over as many id bytes.
      // Otherwise every node of a path but the last matches whole, so "all equal" is asked
      // first, of memcmp: the C library picks the CPU's widest compare when the program
      // loads, and answers in fewer instructions than mismatch, which only a partial match
      // then pays.
      if constexpr (Copy) {
        const std::size_t same = mismatch_copy(x.tok, q, x.ids, out, pages);
        if (same == pages) return {c, static_cast<std::uint32_t>(pages), next, ahead};
        if (same > 0) return {c, static_cast<std::uint32_t>(same)};
        continue;
      }
      if (std::memcmp(x.tok, q, cmp) == 0)
        return {c, static_cast<std::uint32_t>(pages), next, ahead};
      const std::size_t same = mismatch(x.tok, q, cmp);
      const auto k = static_cast<std::uint32_t>(same / pb);
      if (k > 0) return {c, k};
    }
    return {};
  }

  /// Asks for node x's line and the first lines of its tokens (up to 256 bytes: past
  /// them the hardware prefetcher is following the compare), whose address the edge slot
  /// keeps so that the two misses overlap instead of the node's preceding the block's.
  /// Prefetches never fault: a stale or short hint costs only bandwidth. Forced inline:
  /// GCC deems a function that only prefetches free of effects and deletes the calls to it.
  [[gnu::always_inline]] static void prefetch_head(const Node* x, const void* tokens) noexcept {
#if defined(__GNUC__) || defined(__clang__)
    const char* t = static_cast<const char*>(tokens);
    __builtin_prefetch(x);
    __builtin_prefetch(t);
    __builtin_prefetch(t + 64);
    __builtin_prefetch(t + 128);
    __builtin_prefetch(t + 192);
#else
    (void)x;
    (void)tokens;
#endif
  }

  /// The sequence hash before node x's first page (none at the root).
  [[nodiscard]] static std::optional<std::uint64_t> parent_hash(const State& st,
                                                                const Node& x) noexcept {
    const Node& p = st.nodes[x.parent];
    if (p.kind != PagedKind::node) return std::nullopt;
    return p.last_hash;
  }

  /// The sequence hash of node x's first k pages. Forced inline (see paged_chain_hashes).
  [[nodiscard]] [[gnu::always_inline]] static std::uint64_t head_hash(const State& st,
                                                                      const Node& x,
                                                                      std::size_t k) noexcept {
    return paged_last_hash(parent_hash(st, x), x.tok, k, st.blocks.page_size(),
                           st.namespaces[x.ns].seed);
  }

  /// A handle to node x (empty for a root).
  [[nodiscard]] static Handle handle_of(const State& st, std::uint32_t x) noexcept {
    if (st.nodes[x].kind != PagedKind::node) return {};
    return {x, st.nodes[x].gen};
  }

  /// True when `h` is empty or still names a cached prefix.
  [[nodiscard]] static bool valid(const State& st, const Handle& h) noexcept {
    if (h.empty()) return true;
    return h.node < st.nodes.size() && st.nodes[h.node].kind == PagedKind::node &&
           st.nodes[h.node].gen == h.generation;
  }

  /// Nodes that are not the head of their (parent, first token) chain.
  [[nodiscard]] static std::size_t chained_siblings(const State& st) noexcept {
    std::size_t k = 0;
    for (const Node& nd : st.nodes)
      if (nd.kind == PagedKind::node && nd.next_same != paged_npos) ++k;
    return k;
  }

  // ---- changes -----------------------------------------------------------------------------

  /// A new unlinked node holding a copy of n pages (their tokens and ids) in `block`, with
  /// its parent, depth and namespace slot set; its links, locks, metadata and hash are the
  /// caller's. Requires reserve_nodes() (it may reallocate the nodes). Never throws.
  static std::uint32_t new_node(State& st, std::unique_ptr<unsigned char[]> block, std::uint32_t n,
                                const Token* tokens, const PageId* ids, std::uint32_t parent,
                                std::uint32_t depth, std::uint32_t ns) noexcept {
    const std::uint32_t x = alloc_node(st);
    Node& nd = st.nodes[x];
    st.blocks.fill(nd, std::move(block), n, tokens, ids);
    nd.depth = depth;
    nd.parent = parent;
    nd.ns = ns;
    nd.kind = PagedKind::node;
    return x;
  }

  /// Splits node c after its first k pages: a new node takes them (and c's place under
  /// its parent); c keeps the rest, and its index, so handles to c still name the same
  /// end. `blocks` comes from st.blocks.split_blocks(c, k). Requires prepare_split() or
  /// equivalent. Never throws.
  static std::uint32_t split(State& st, std::uint32_t c, std::size_t k_pages,
                             SplitBlocks blocks) noexcept {
    const auto k = static_cast<std::uint32_t>(k_pages);
    const std::uint32_t h = alloc_node(st);
    Node& H = st.nodes[h];
    Node& C = st.nodes[c];
    const Token first = C.tok[0];
    if (st.events.on()) H.last_hash = head_hash(st, C, k);
    H.depth = C.depth;
    H.parent = C.parent;
    H.ns = C.ns;
    H.kind = PagedKind::node;
    const std::uint32_t tail = C.n - k;
    if (k >= tail) {
      // The head keeps the block (it starts at C's first live page); the tail is copied.
      st.blocks.move_block(H, C);
      H.n = k;
      st.blocks.rehome(C, std::move(blocks.small), tail,
                       C.tok + std::size_t{k} * st.blocks.page_size(), C.ids + k);
      if (blocks.keep) st.blocks.rehome(H, std::move(blocks.keep), k, H.tok, H.ids);
    } else {
      st.blocks.rehome(H, std::move(blocks.small), k, C.tok, C.ids);
      st.blocks.advance(C, k);
      if (blocks.keep) st.blocks.rehome(C, std::move(blocks.keep), tail, C.tok, C.ids);
    }
    H.lock = C.lock;
    H.meta = C.meta;
    // H takes C's place among the siblings and in the edge chain.
    H.prev = C.prev;
    H.next = C.next;
    if (C.prev != paged_npos) st.nodes[C.prev].next = h;
    if (C.next != paged_npos) st.nodes[C.next].prev = h;
    Node& P = st.nodes[C.parent];
    if (P.first_child == c) P.first_child = h;
    H.next_same = C.next_same;
    const std::uint32_t head = st.edges.find(C.parent, first);
    if (head == c) {
      st.edges.replace(C.parent, first, h, H.tok);
    } else {
      std::uint32_t e = head;
      while (st.nodes[e].next_same != c)
        e = st.nodes[e].next_same;
      st.nodes[e].next_same = h;
    }
    // C becomes H's only child.
    C.depth += k;
    C.parent = h;
    C.prev = C.next = C.next_same = paged_npos;
    H.first_child = c;
    st.edges.insert_reserved(h, C.tok[0], c, C.tok);
    ++st.stats.nodes;
    ++st.stats.splits;
    return h;
  }

  /// Adds a new unlocked leaf under `parent` holding n pages, its metadata from the
  /// policy's on_create and its last page's hash `last_hash`. Requires room for a node,
  /// an edge and a heap entry. Never throws.
  static std::uint32_t add_leaf(State& st, std::uint32_t parent, const Token* tokens,
                                const PageId* ids, std::uint32_t n,
                                std::unique_ptr<unsigned char[]> block, std::uint64_t ns,
                                std::int64_t priority, std::uint64_t last_hash) noexcept {
    const Node& p = st.nodes[parent];
    const std::uint32_t x = new_node(st, std::move(block), n, tokens, ids, parent,
                                     p.kind == PagedKind::root ? 0U : p.depth + p.n, p.ns);
    Node& L = st.nodes[x];
    Node& P = st.nodes[parent];
    L.last_hash = last_hash;
    L.meta = st.policy.on_create(Order::context(st, L, ns, priority));
    // Link as the first child; chain behind any sibling with the same first token.
    L.prev = paged_npos;
    L.next = P.first_child;
    if (P.first_child != paged_npos) st.nodes[P.first_child].prev = x;
    if (P.kind == PagedKind::node && P.first_child == paged_npos && P.heap_pos != paged_npos)
      Order::erase(st, parent);
    P.first_child = x;
    const std::uint32_t head = st.edges.find(parent, tokens[0]);
    if (head == paged_npos) {
      st.edges.insert_reserved(parent, tokens[0], x, L.tok);
    } else {
      L.next_same = head;
      st.edges.replace(parent, tokens[0], x, L.tok);
    }
    ++st.stats.nodes;
    st.stats.cached_pages += n;
    if constexpr (classes > 1) st.class_pages[Order::class_of(st, L)] += n;
    st.evictable_pages += n;
    Order::push(st, x);
    return x;
  }

  /// Unlinks leaf x from its parent and the edge table, and frees it.
  static void remove_leaf(State& st, std::uint32_t x) noexcept {
    Node& L = st.nodes[x];
    Node& P = st.nodes[L.parent];
    if (L.prev != paged_npos) st.nodes[L.prev].next = L.next;
    if (L.next != paged_npos) st.nodes[L.next].prev = L.prev;
    if (P.first_child == x) P.first_child = L.next;
    const Token first = L.tok[0];
    const std::uint32_t head = st.edges.find(L.parent, first);
    if (head == x) {
      if (L.next_same != paged_npos)
        st.edges.replace(L.parent, first, L.next_same, st.nodes[L.next_same].tok);
      else
        st.edges.erase(L.parent, first);
    } else {
      std::uint32_t e = head;
      while (st.nodes[e].next_same != x)
        e = st.nodes[e].next_same;
      st.nodes[e].next_same = L.next_same;
    }
    --st.stats.nodes;
    free_node(st, x);
  }

  /// Keeps a trimmed node's block at most twice its live pages (best effort).
  static void compact(State& st, Node& x) noexcept {
    if (!st.blocks.compact(x)) return;
    // The edge naming x as its chain head carries x's tokens as its prefetch hint.
    const auto self = static_cast<std::uint32_t>(&x - st.nodes.data());
    if (st.edges.find(x.parent, x.tok[0]) == self) st.edges.set_hint(x.parent, x.tok[0], x.tok);
  }
};

}  // namespace promptcache::detail
