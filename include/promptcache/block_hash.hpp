// promptcache: block_hash.hpp
// SPDX-License-Identifier: Apache-2.0
//
// xxh3 block hashes of token sequences, byte-identical to NVIDIA Dynamo's KV
// router, so a C++ engine or router can publish and match the same hashes.
//
// A sequence of u32 tokens is cut into full blocks of `block_size` tokens (the
// trailing partial block is not hashed: its KV is not cached yet). Each block
// gets a *local* hash of its tokens' little-endian bytes, seeded by 1337 plus
// the LoRA / cache-salt contributions; a block carrying images or other media
// appends those media's u64 hashes, sorted, after its tokens. The *sequence*
// hash chains the local hashes, so it identifies the whole prefix ending at a
// block: seq[0] = local[0], seq[i] = xxh3(LE64(seq[i-1]) || LE64(local[i]), 1337).
//
// Everything is header-only (xxHash compiled inline, see
// detail/block_hash_xxhash.hpp) and hashes the same values on big- and
// little-endian hosts. No function allocates except the vector-returning
// overloads (and, for a block with more than 32 media hashes, a scratch vector).
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
#endif
#if !defined(PROMPTCACHE_BLOCK_HASH_HPP) && \
    (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) >= 202002L
#define PROMPTCACHE_BLOCK_HASH_HPP

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "promptcache/detail/block_hash_bytes.hpp"
#include "promptcache/detail/block_hash_xxhash.hpp"

namespace promptcache {

/// Dynamo's base seed: local hashes start from it, sequence hashes always use it.
inline constexpr std::uint64_t block_hash_default_seed = 1337;

/// The local-hash seed for a LoRA adapter and a cache salt: 1337, plus (wrapping)
/// xxh3(lora_name) if non-empty, plus xxh3(cache_salt, seed 1) if non-empty. An
/// empty name counts as absent. O(size of the names).
[[nodiscard]] inline std::uint64_t block_hash_seed(std::string_view lora_name = {},
                                                   std::string_view cache_salt = {}) noexcept {
  std::uint64_t seed = block_hash_default_seed;
  if (!lora_name.empty()) seed += detail::xxh3_64(lora_name.data(), lora_name.size());
  if (!cache_salt.empty()) seed += detail::xxh3_64(cache_salt.data(), cache_salt.size(), 1);
  return seed;
}

/// The prefix that names a cache salt among a block's extra keys in vLLM-format KV
/// events ("dynamo-cache-salt:<salt>" in an event's first block: the convention of
/// Dynamo's vLLM integration, which its router reads, and kv_event_wire.hpp too).
inline constexpr std::string_view cache_salt_key_prefix = "dynamo-cache-salt:";

/// How local block hashes are computed; the default is Dynamo's plain text model.
struct BlockHashOptions {
  /// The seed from block_hash_seed() (LoRA name and cache salt).
  std::uint64_t seed = block_hash_default_seed;
  /// media[i] holds the media hashes carried by block i, in any order (they are
  /// hashed sorted). Blocks past media.size() and empty entries carry no media.
  /// Entries past the number of blocks are ignored.
  std::span<const std::span<const std::uint64_t>> media = {};
  /// Eagle (speculative decoding): block i hashes the block_size + 1 tokens
  /// starting at i * block_size, so n tokens give (n - 1) / block_size blocks.
  bool eagle = false;
};

/// Number of hashable blocks in `num_tokens` tokens: num_tokens / block_size, or
/// (num_tokens - 1) / block_size in Eagle mode; 0 when block_size is 0. O(1).
[[nodiscard]] constexpr std::size_t block_count(std::size_t num_tokens, std::size_t block_size,
                                                bool eagle = false) noexcept {
  if (block_size == 0 || num_tokens == 0) return 0;
  return (eagle ? num_tokens - 1 : num_tokens) / block_size;
}

namespace detail {

/// Hashes block windows with one seed. Derives the seed's XXH3 secret once,
/// and only if some input is longer than xxh3_midsize_max bytes (XXH3's own
/// seeded entry point would re-derive it on every call).
class BlockHasher {
 public:
  /// Inputs up to this many bytes are encoded into an inline buffer and hashed
  /// in one call; longer ones are streamed through it.
  static constexpr std::size_t buffer_bytes = 2048;
  /// Blocks with up to this many media hashes sort them without allocating.
  static constexpr std::size_t inline_media = 32;

  /// A hasher for `seed`; the secret is derived lazily. O(1).
  explicit BlockHasher(std::uint64_t seed) noexcept : seed_(seed) {}

  /// xxh3 of `len` bytes at `data` with the seed. O(len).
  std::uint64_t hash_bytes(const void* data, std::size_t len) noexcept {
    if (len <= xxh3_midsize_max) return xxh3_64(data, len, seed_);
    return xxh3_64(data, len, secret(), seed_);
  }

  /// Local hash of one window of tokens and its (unsorted) media hashes, from
  /// explicitly encoded little-endian bytes: correct on any host byte order.
  /// O(window + media log media); allocates only for more than inline_media media.
  std::uint64_t hash_encoded(std::span<const std::uint32_t> window,
                             std::span<const std::uint64_t> media) {
    std::array<std::uint64_t, inline_media> small;
    std::vector<std::uint64_t> large;
    std::span<std::uint64_t> sorted;
    if (media.size() <= inline_media) {
      sorted = std::span<std::uint64_t>(small.data(), media.size());
    } else {
      large.resize(media.size());
      sorted = large;
    }
    std::copy(media.begin(), media.end(), sorted.begin());
    std::sort(sorted.begin(), sorted.end());

    const std::size_t token_bytes = window.size() * sizeof(std::uint32_t);
    const std::size_t media_bytes = sorted.size() * sizeof(std::uint64_t);
    if (token_bytes + media_bytes <= buffer_.size()) {
      encode_le32(window, buffer_.data());
      encode_le64(sorted, buffer_.data() + token_bytes);
      return hash_bytes(buffer_.data(), token_bytes + media_bytes);
    }
    Xxh3Stream stream(secret(), seed_);
    constexpr std::size_t tokens_per_chunk = buffer_bytes / sizeof(std::uint32_t);
    for (std::size_t i = 0; i < window.size(); i += tokens_per_chunk) {
      const auto part = window.subspan(i, std::min(tokens_per_chunk, window.size() - i));
      encode_le32(part, buffer_.data());
      stream.update(buffer_.data(), part.size() * sizeof(std::uint32_t));
    }
    constexpr std::size_t media_per_chunk = buffer_bytes / sizeof(std::uint64_t);
    for (std::size_t i = 0; i < sorted.size(); i += media_per_chunk) {
      const auto part = sorted.subspan(i, std::min(media_per_chunk, sorted.size() - i));
      encode_le64(part, buffer_.data());
      stream.update(buffer_.data(), part.size() * sizeof(std::uint64_t));
    }
    return stream.digest();
  }

  /// The XXH3 secret derived from the seed, computed on first use. O(1).
  const unsigned char* secret() noexcept {
    if (!has_secret_) {
      xxh3_secret_from_seed(secret_.data(), seed_);
      has_secret_ = true;
    }
    return secret_.data();
  }

 private:
  std::uint64_t seed_;
  bool has_secret_ = false;
  alignas(64) std::array<unsigned char, xxh3_secret_size> secret_;
  std::array<unsigned char, buffer_bytes> buffer_;
};

/// local_block_hashes() with the byte path chosen by the caller. Native = true
/// hashes token memory in place for blocks without media, which is only
/// correct on little-endian hosts; Native = false encodes every block
/// explicitly (the tests run it on little-endian hosts to cover the
/// big-endian path).
template <bool Native>
std::size_t local_block_hashes(std::span<const std::uint32_t> tokens, std::size_t block_size,
                               std::span<std::uint64_t> out, const BlockHashOptions& options) {
  const std::size_t count = block_count(tokens.size(), block_size, options.eagle);
  const std::size_t window = options.eagle ? block_size + 1 : block_size;
  const std::size_t written = std::min(count, out.size());
  BlockHasher hasher(options.seed);
  if constexpr (Native) {
    // The hot path: no media anywhere, one xxh3 call per block straight from
    // the token memory.
    if (options.media.empty()) {
      // Locals, so the stores to out[] cannot force reloads of the seed.
      const std::size_t bytes = window * sizeof(std::uint32_t);
      const std::uint64_t seed = options.seed;
      const std::uint32_t* data = tokens.data();
      if (bytes <= xxh3_midsize_max) {
        for (std::size_t i = 0; i < written; ++i) {
          out[i] = xxh3_64(data + i * block_size, bytes, seed);
        }
      } else {
        const unsigned char* secret = hasher.secret();
        for (std::size_t i = 0; i < written; ++i) {
          out[i] = xxh3_64(data + i * block_size, bytes, secret, seed);
        }
      }
      return count;
    }
  }
  for (std::size_t i = 0; i < written; ++i) {
    const auto block = tokens.subspan(i * block_size, window);
    const std::span<const std::uint64_t> media =
        i < options.media.size() ? options.media[i] : std::span<const std::uint64_t>{};
    if (Native && media.empty()) {
      out[i] = hasher.hash_bytes(block.data(), block.size_bytes());
    } else {
      out[i] = hasher.hash_encoded(block, media);
    }
  }
  return count;
}

}  // namespace detail

/// Writes the local hash of each hashable block of `tokens` to `out` and returns
/// the number of blocks, block_count(tokens.size(), block_size, options.eagle).
/// If that exceeds out.size(), only the first out.size() hashes are computed and
/// written (compare the result with out.size()). block_size 0 gives 0. Does not
/// allocate (unless a block has more than 32 media hashes). O(tokens + media).
inline std::size_t local_block_hashes(std::span<const std::uint32_t> tokens, std::size_t block_size,
                                      std::span<std::uint64_t> out,
                                      const BlockHashOptions& options = {}) {
  return detail::local_block_hashes<std::endian::native == std::endian::little>(tokens, block_size,
                                                                                out, options);
}

/// The local hash of each hashable block of `tokens`, as a new vector of
/// block_count(tokens.size(), block_size, options.eagle) hashes. O(tokens + media).
[[nodiscard]] inline std::vector<std::uint64_t> local_block_hashes(
    std::span<const std::uint32_t> tokens, std::size_t block_size,
    const BlockHashOptions& options = {}) {
  std::vector<std::uint64_t> out(block_count(tokens.size(), block_size, options.eagle));
  local_block_hashes(tokens, block_size, out, options);
  return out;
}

/// The sequence hash of a block whose local hash is `local` and whose previous
/// block has sequence hash `parent`: xxh3(LE64(parent) || LE64(local), 1337). O(1).
[[nodiscard]] inline std::uint64_t sequence_hash(std::uint64_t parent,
                                                 std::uint64_t local) noexcept {
  std::array<unsigned char, 16> bytes;
  detail::store_le64(parent, bytes.data());
  detail::store_le64(local, bytes.data() + 8);
  return detail::xxh3_64(bytes.data(), bytes.size(), block_hash_default_seed);
}

/// Writes the sequence hashes of a run of local hashes to `out` and returns
/// locals.size(). Without `parent` the run starts the sequence (out[0] =
/// locals[0]); with it, the run continues after the block whose sequence hash is
/// *parent. If out is smaller, only its first out.size() hashes are written.
/// `out` may be the same span as `locals` (in-place). O(locals.size()).
inline std::size_t sequence_hashes(std::span<const std::uint64_t> locals,
                                   std::span<std::uint64_t> out,
                                   std::optional<std::uint64_t> parent = std::nullopt) noexcept {
  const std::size_t written = std::min(locals.size(), out.size());
  for (std::size_t i = 0; i < written; ++i) {
    const std::uint64_t local = locals[i];
    out[i] = parent ? sequence_hash(*parent, local) : local;
    parent = out[i];
  }
  return locals.size();
}

/// The sequence hashes of a run of local hashes, as a new vector (see the
/// span overload for `parent`). O(locals.size()).
[[nodiscard]] inline std::vector<std::uint64_t> sequence_hashes(
    std::span<const std::uint64_t> locals, std::optional<std::uint64_t> parent = std::nullopt) {
  std::vector<std::uint64_t> out(locals.size());
  sequence_hashes(locals, out, parent);
  return out;
}

}  // namespace promptcache

#endif  // PROMPTCACHE_BLOCK_HASH_HPP
