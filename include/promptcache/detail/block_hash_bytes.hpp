// promptcache: detail/block_hash_bytes.hpp
// SPDX-License-Identifier: Apache-2.0
//
// Little-endian byte encoding for block hashing. Dynamo hashes the
// little-endian bytes of u32 tokens and u64 hashes; these helpers produce them
// with shifts, so the result is the same on any host byte order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace promptcache::detail {

/// Writes `v` as 4 little-endian bytes at `p`. O(1).
constexpr void store_le32(std::uint32_t v, unsigned char* p) noexcept {
  p[0] = static_cast<unsigned char>(v);
  p[1] = static_cast<unsigned char>(v >> 8);
  p[2] = static_cast<unsigned char>(v >> 16);
  p[3] = static_cast<unsigned char>(v >> 24);
}

/// Writes `v` as 8 little-endian bytes at `p`. O(1).
constexpr void store_le64(std::uint64_t v, unsigned char* p) noexcept {
  store_le32(static_cast<std::uint32_t>(v), p);
  store_le32(static_cast<std::uint32_t>(v >> 32), p + 4);
}

/// Writes `words` as consecutive little-endian u32 at `out`, which must hold
/// 4 * words.size() bytes. O(words.size()).
constexpr void encode_le32(std::span<const std::uint32_t> words, unsigned char* out) noexcept {
  for (const std::uint32_t w : words) {
    store_le32(w, out);
    out += 4;
  }
}

/// Writes `words` as consecutive little-endian u64 at `out`, which must hold
/// 8 * words.size() bytes. O(words.size()).
constexpr void encode_le64(std::span<const std::uint64_t> words, unsigned char* out) noexcept {
  for (const std::uint64_t w : words) {
    store_le64(w, out);
    out += 8;
  }
}

}  // namespace promptcache::detail
