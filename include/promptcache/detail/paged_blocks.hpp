// promptcache: detail/paged_blocks.hpp
// SPDX-License-Identifier: Apache-2.0
//
// Block storage of PagedPrefixCache's nodes. A node's token ids and page ids share
// one allocation, its block: [tokens][page ids], the ids aligned. Ids follow the
// tokens so that a match streams through both in one direction. Pages [off, off + n)
// of a block are live: a split copies its smaller part to a new block (advancing
// the node's first live page when the tail stays), a trim lowers n.
//
// The memory bound lives here: a block is compacted once at most half of it would
// be live (split_blocks, compact), so the token ids and page ids held stay within
// twice what is cached (after a trim, as far as memory allows). The block pages
// counted here are what PagedPrefixCache::memory() reports.
//
// Works on any node type with the fields `tok`, `ids`, `n`, `cap` and `block`
// (detail/paged_state.hpp's PagedNode); it knows nothing of the tree.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <utility>

namespace promptcache::detail {

/// The block layout for one page size, and the block pages held over all nodes.
template <class Token, class PageId>
class PagedBlocks {
 public:
  /// One node's allocation.
  using Block = std::unique_ptr<unsigned char[]>;

  /// The blocks a split of a node after its first k pages needs: the larger part keeps
  /// the node's block (the head on a tie) and the smaller one is copied to `small`, so a
  /// split copies at most half the node; `keep`, when the larger part would fill at most
  /// half its block, receives it too. Every node's block thus stays under twice its live
  /// pages (after a trim, as far as memory allows), whatever the splits: a tail that kept
  /// its block forever (the head always copied out) would pin the whole block of a context
  /// that is branched off page by page.
  struct SplitBlocks {
    Block small;  ///< the smaller part's new block
    Block keep;   ///< the larger part's new block, when its old one would be at most half live
  };

  /// Blocks of `page_size` tokens per page. O(1).
  explicit PagedBlocks(std::size_t page_size) noexcept : page_size_(page_size) {}

  /// Tokens per page. O(1).
  [[nodiscard]] std::size_t page_size() const noexcept { return page_size_; }
  /// Bytes of one page's tokens. O(1).
  [[nodiscard]] std::size_t page_bytes() const noexcept { return page_size_ * sizeof(Token); }
  /// Pages of block capacity over all nodes. O(1).
  [[nodiscard]] std::size_t block_pages() const noexcept { return block_pages_; }
  /// Bytes of token ids held (capacities). O(1).
  [[nodiscard]] std::size_t token_bytes() const noexcept {
    return block_pages_ * page_size_ * sizeof(Token);
  }
  /// Bytes of page ids held (capacities). O(1).
  [[nodiscard]] std::size_t id_bytes() const noexcept { return block_pages_ * sizeof(PageId); }

  /// Where the page ids of a block of `cap` pages start.
  [[nodiscard]] std::size_t ids_offset(std::size_t cap) const noexcept {
    const std::size_t end = cap * page_bytes();
    return (end + alignof(PageId) - 1) / alignof(PageId) * alignof(PageId);
  }
  /// Bytes of a block of `cap` pages.
  [[nodiscard]] std::size_t block_bytes(std::size_t cap) const noexcept {
    return ids_offset(cap) + cap * sizeof(PageId);
  }
  /// A block of `cap` pages. Throws std::bad_alloc.
  [[nodiscard]] Block make_block(std::uint32_t cap) const {
    return Block(new unsigned char[block_bytes(cap)]);
  }

  /// The first live page's index in x's block.
  template <class Node>
  [[nodiscard]] std::size_t off_of(const Node& x) const noexcept {
    return static_cast<std::size_t>(x.ids -
                                    reinterpret_cast<PageId*>(x.block.get() + ids_offset(x.cap)));
  }

  /// Gives x a fresh block of `cap` pages, all live from its first; the old block is freed.
  /// Counts nothing (the callers do).
  template <class Node>
  void set_block(Node& x, Block block, std::uint32_t cap) noexcept {
    x.block = std::move(block);
    x.cap = cap;
    x.tok = reinterpret_cast<Token*>(x.block.get());
    x.ids = reinterpret_cast<PageId*>(x.block.get() + ids_offset(cap));
  }

  /// Gives a new node `block`, of exactly n pages, holding a copy of the n pages at
  /// `tokens` and `ids`. Never throws.
  template <class Node>
  void fill(Node& x, Block block, std::uint32_t n, const Token* tokens,
            const PageId* ids) noexcept {
    set_block(x, std::move(block), n);
    x.n = n;
    block_pages_ += n;
    std::memcpy(x.ids, ids, n * sizeof(PageId));
    std::memcpy(x.tok, tokens, std::size_t{n} * page_bytes());
  }

  /// Frees x's block (a node being freed). Never throws.
  template <class Node>
  void release(Node& x) noexcept {
    block_pages_ -= x.cap;
    x.block.reset();
    x.tok = nullptr;
    x.ids = nullptr;
  }

  /// Moves `from`'s block, with its live pages, to `to` (a split whose head keeps the
  /// block); `from` keeps its page pointers until it is rehomed. Never throws.
  template <class Node>
  static void move_block(Node& to, Node& from) noexcept {
    to.block = std::move(from.block);
    to.cap = std::exchange(from.cap, 0);
    to.tok = from.tok;
    to.ids = from.ids;
  }

  /// Drops x's first k live pages (a split gave them to a new node).
  template <class Node>
  void advance(Node& x, std::uint32_t k) noexcept {
    x.tok += std::size_t{k} * page_size_;
    x.ids += k;
    x.n -= k;
  }

  /// Gives x `block`, of exactly n pages, holding a copy of the n pages at tok and ids
  /// (which may lie in x's current block: that one is freed after the copy), all of them
  /// live. Never throws.
  template <class Node>
  void rehome(Node& x, Block block, std::uint32_t n, const Token* tok, const PageId* ids) noexcept {
    std::memcpy(block.get() + ids_offset(n), ids, n * sizeof(PageId));
    std::memcpy(block.get(), tok, std::size_t{n} * page_bytes());
    block_pages_ -= x.cap;
    block_pages_ += n;
    set_block(x, std::move(block), n);
    x.n = n;
  }

  /// The blocks a split of x after its first k pages needs (see SplitBlocks). Throws
  /// std::bad_alloc.
  template <class Node>
  [[nodiscard]] SplitBlocks split_blocks(const Node& x, std::size_t k) const {
    const std::size_t big = std::max<std::size_t>(k, x.n - k);
    SplitBlocks b;
    b.small = make_block(static_cast<std::uint32_t>(x.n - big));
    if (big * 2 <= x.cap) b.keep = make_block(static_cast<std::uint32_t>(big));
    return b;
  }

  /// Keeps a trimmed node's block at most twice its live pages (best effort: a failed
  /// allocation keeps the old block). True when x got a new block. Never throws.
  template <class Node>
  bool compact(Node& x) noexcept {
    if (std::size_t{x.n} * 2 > x.cap) return false;
    Block nb(new (std::nothrow) unsigned char[block_bytes(x.n)]);
    if (!nb) return false;
    rehome(x, std::move(nb), x.n, x.tok, x.ids);
    return true;
  }

  /// Takes `other`'s page size and block count, leaving it none. O(1).
  void take(PagedBlocks& other) noexcept {
    page_size_ = other.page_size_;
    block_pages_ = std::exchange(other.block_pages_, 0);
  }

 private:
  std::size_t page_size_;
  std::size_t block_pages_ = 0;  // pages of block capacity over all nodes
};

}  // namespace promptcache::detail
