// A straightforward C++ port of the design of SGLang's RadixCache
// (python/sglang/srt/mem_cache/radix_cache.py), the baseline of
// bench/paged_prefix_cache.cpp: children in a hash map keyed by the tokens of the
// child's first page, a token vector and a page vector per node, lock refs along
// the path, a set of evictable leaves, and an evict() that builds a heap of every
// evictable leaf on each call and frees whole leaves. Time is a logical counter
// (the original reads a monotonic clock). LRU only; no KV events.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace bench {

template <class PageId>
class SglangRadixPort {
 public:
  struct Node {
    std::unordered_map<std::u32string, Node*> children;
    Node* parent = nullptr;
    std::vector<std::uint32_t> key;  // tokens
    std::vector<PageId> value;       // one page id per page of `key`
    int lock_ref = 0;
    std::uint64_t last_access = 0;
  };

  explicit SglangRadixPort(std::size_t page_size) : page_size_(page_size) { root_.lock_ref = 1; }
  SglangRadixPort(const SglangRadixPort&) = delete;
  SglangRadixPort& operator=(const SglangRadixPort&) = delete;
  ~SglangRadixPort() { destroy(&root_); }

  // Longest cached page-aligned prefix; appends its pages to `out`; returns the last node.
  Node* match_prefix(std::span<const std::uint32_t> tokens, std::vector<PageId>& out) {
    out.clear();
    const std::size_t aligned = tokens.size() / page_size_ * page_size_;
    std::span<const std::uint32_t> key = tokens.first(aligned);
    const std::uint64_t now = ++clock_;
    Node* node = &root_;
    node->last_access = now;
    while (!key.empty()) {
      const auto it = node->children.find(child_key(key));
      if (it == node->children.end()) break;
      Node* child = it->second;
      child->last_access = now;
      const std::size_t len = key_match(child->key, key);
      if (len < child->key.size()) {
        Node* head = split(child, len);
        out.insert(out.end(), head->value.begin(), head->value.end());
        node = head;
        break;
      }
      out.insert(out.end(), child->value.begin(), child->value.end());
      node = child;
      key = key.subspan(len);
    }
    return node;
  }

  // Stores the page-aligned prefix; returns the number of tokens already cached.
  std::size_t insert(std::span<const std::uint32_t> tokens, std::span<const PageId> pages) {
    const std::size_t aligned = tokens.size() / page_size_ * page_size_;
    std::span<const std::uint32_t> key = tokens.first(aligned);
    std::span<const PageId> value = pages.first(aligned / page_size_);
    const std::uint64_t now = ++clock_;
    Node* node = &root_;
    node->last_access = now;
    std::size_t total = 0;
    while (!key.empty()) {
      const auto it = node->children.find(child_key(key));
      if (it == node->children.end()) break;
      node = it->second;
      node->last_access = now;
      const std::size_t len = key_match(node->key, key);
      total += len;
      key = key.subspan(len);
      value = value.subspan(len / page_size_);
      if (len < node->key.size()) node = split(node, len);
    }
    if (!key.empty()) {
      auto* leaf = new Node;
      leaf->parent = node;
      leaf->key.assign(key.begin(), key.end());
      leaf->value.assign(value.begin(), value.end());
      leaf->last_access = now;
      node->children.emplace(child_key(key), leaf);
      evictable_size_ += key.size();
      update_leaf_status(node);
      update_leaf_status(leaf);
    }
    return total;
  }

  // Frees whole leaves, least recently used first, until num_tokens are freed.
  template <class OnEvict>
  std::size_t evict(std::size_t num_tokens, OnEvict&& on_evict) {
    using Item = std::pair<std::uint64_t, Node*>;
    std::vector<Item> heap;
    heap.reserve(evictable_leaves_.size());
    for (Node* n : evictable_leaves_)
      heap.emplace_back(n->last_access, n);
    const auto later = [](const Item& a, const Item& b) { return a.first > b.first; };
    std::make_heap(heap.begin(), heap.end(), later);
    std::size_t evicted = 0;
    while (evicted < num_tokens && !heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), later);
      Node* x = heap.back().second;
      heap.pop_back();
      for (const PageId p : x->value)
        on_evict(p);
      evicted += x->key.size();
      Node* parent = x->parent;
      delete_leaf(x);
      delete x;
      if (parent->children.empty() && parent->lock_ref == 0) {
        heap.emplace_back(parent->last_access, parent);
        std::push_heap(heap.begin(), heap.end(), later);
      }
    }
    return evicted;
  }

  void inc_lock_ref(Node* node) {
    for (; node != &root_; node = node->parent) {
      if (node->lock_ref == 0) evictable_size_ -= node->key.size();
      ++node->lock_ref;
      update_leaf_status(node);
    }
  }

  void dec_lock_ref(Node* node) {
    for (; node != &root_; node = node->parent) {
      if (node->lock_ref == 1) evictable_size_ += node->key.size();
      --node->lock_ref;
      update_leaf_status(node);
    }
  }

  [[nodiscard]] std::size_t evictable_size() const { return evictable_size_; }

 private:
  [[nodiscard]] std::u32string child_key(std::span<const std::uint32_t> key) const {
    std::u32string k(page_size_, U'\0');
    for (std::size_t i = 0; i < page_size_; ++i)
      k[i] = static_cast<char32_t>(key[i]);
    return k;
  }

  // Tokens of a and b that match, in whole pages.
  [[nodiscard]] std::size_t key_match(std::span<const std::uint32_t> a,
                                      std::span<const std::uint32_t> b) const {
    const std::size_t n = std::min(a.size(), b.size());
    std::size_t i = 0;
    while (i < n && std::equal(a.begin() + static_cast<std::ptrdiff_t>(i),
                               a.begin() + static_cast<std::ptrdiff_t>(i + page_size_),
                               b.begin() + static_cast<std::ptrdiff_t>(i)))
      i += page_size_;
    return i;
  }

  Node* split(Node* child, std::size_t len) {
    auto* head = new Node;
    head->parent = child->parent;
    head->lock_ref = child->lock_ref;
    head->last_access = child->last_access;
    head->key.assign(child->key.begin(), child->key.begin() + static_cast<std::ptrdiff_t>(len));
    head->value.assign(child->value.begin(),
                       child->value.begin() + static_cast<std::ptrdiff_t>(len / page_size_));
    child->key.erase(child->key.begin(), child->key.begin() + static_cast<std::ptrdiff_t>(len));
    child->value.erase(child->value.begin(),
                       child->value.begin() + static_cast<std::ptrdiff_t>(len / page_size_));
    child->parent = head;
    head->children.emplace(child_key(child->key), child);
    head->parent->children[child_key(head->key)] = head;
    return head;
  }

  void delete_leaf(Node* node) {
    node->parent->children.erase(child_key(node->key));
    evictable_size_ -= node->key.size();
    evictable_leaves_.erase(node);
    update_leaf_status(node->parent);
  }

  void update_leaf_status(Node* node) {
    if (node == &root_ || node->lock_ref > 0 || !node->children.empty()) {
      evictable_leaves_.erase(node);
      return;
    }
    evictable_leaves_.insert(node);
  }

  void destroy(Node* node) {
    for (auto& [k, c] : node->children) {
      destroy(c);
      delete c;
    }
    node->children.clear();
  }

  std::size_t page_size_;
  Node root_;
  std::unordered_set<Node*> evictable_leaves_;
  std::size_t evictable_size_ = 0;
  std::uint64_t clock_ = 0;
};

}  // namespace bench
