// promptcache: detail/kv_index_pages.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The paged arrays behind the node and hold pools of kv_index.hpp. A vector
// that doubles its capacity leaves up to half of its bytes unused (and needs
// old + new during each reallocation); with millions of rows that headroom
// was a large part of the index's memory. Pages of a fixed number of elements
// bound the unused part to one page, never move elements (so growing copies
// nothing), and cost one extra load from a small, cache-resident page table
// per access.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

namespace promptcache::detail {

/// An append-only array of trivially copyable `T` in pages of 2^PageBits
/// elements. Elements never move; capacity grows one page at a time.
template <class T, unsigned PageBits = 12>
class KvPagedArray {
 public:
  /// Elements per page.
  static constexpr std::size_t page_size = std::size_t{1} << PageBits;

  /// An empty array; owns no memory. O(1).
  KvPagedArray() noexcept = default;
  /// A deep copy (same capacity). O(size).
  KvPagedArray(const KvPagedArray& other) : size_(0) {
    pages_.reserve(other.pages_.size());
    // Only the elements appended are copied: the rest of a page was never
    // written (reading it would copy indeterminate values).
    std::size_t left = other.size_;
    for (const auto& p : other.pages_) {
      pages_.push_back(std::make_unique_for_overwrite<T[]>(page_size));
      const std::size_t n = std::min(left, page_size);
      std::copy_n(p.get(), n, pages_.back().get());
      left -= n;
    }
    size_ = other.size_;
  }
  /// Takes over `other`'s pages; `other` is left empty. O(1).
  KvPagedArray(KvPagedArray&& other) noexcept
      : pages_(std::move(other.pages_)), size_(std::exchange(other.size_, 0U)) {}
  /// Copy-and-swap assignment (strong guarantee). O(size of both).
  KvPagedArray& operator=(const KvPagedArray& other) {
    if (this != &other) {
      KvPagedArray copy(other);
      swap(copy);
    }
    return *this;
  }
  /// Takes over `other`'s pages; `other` is left empty. O(pages of this).
  KvPagedArray& operator=(KvPagedArray&& other) noexcept {
    if (this != &other) {
      KvPagedArray taken(std::move(other));
      swap(taken);
    }
    return *this;
  }
  ~KvPagedArray() = default;

  /// Element `i` (below size()). O(1).
  [[nodiscard]] T& operator[](std::size_t i) noexcept {
    return pages_[i >> PageBits][i & (page_size - 1U)];
  }
  /// Element `i` (below size()). O(1).
  [[nodiscard]] const T& operator[](std::size_t i) const noexcept {
    return pages_[i >> PageBits][i & (page_size - 1U)];
  }

  /// Elements appended. O(1).
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// True when nothing was appended. O(1).
  [[nodiscard]] bool empty() const noexcept { return size_ == 0U; }
  /// Elements that fit without allocating (whole pages). O(1).
  [[nodiscard]] std::size_t capacity() const noexcept { return pages_.size() * page_size; }

  /// Allocates pages until `n` elements fit, so the next push_back calls up
  /// to that size cannot throw. On std::bad_alloc the contents are unchanged
  /// (pages already added stay as capacity). O(new pages).
  void reserve(std::size_t n) {
    if (n <= capacity()) return;
    const std::size_t pages = (n + page_size - 1U) >> PageBits;
    pages_.reserve(pages);
    while (pages_.size() < pages)
      pages_.push_back(std::make_unique_for_overwrite<T[]>(page_size));
  }

  /// Appends `v`; allocates a page when the last one is full. Amortized O(1).
  void push_back(const T& v) {
    if (size_ == capacity()) reserve(size_ + 1U);
    (*this)[size_] = v;
    ++size_;
  }

  /// Drops every element and releases every page. O(pages).
  void clear() noexcept {
    std::vector<std::unique_ptr<T[]>>().swap(pages_);
    size_ = 0;
  }

  /// Bytes held: the pages and the page table. O(1).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return pages_.size() * page_size * sizeof(T) + pages_.capacity() * sizeof(std::unique_ptr<T[]>);
  }

  /// Exchanges the contents with `other`. O(1).
  void swap(KvPagedArray& other) noexcept {
    pages_.swap(other.pages_);
    std::swap(size_, other.size_);
  }

 private:
  std::vector<std::unique_ptr<T[]>> pages_;
  std::size_t size_ = 0;
};

}  // namespace promptcache::detail
