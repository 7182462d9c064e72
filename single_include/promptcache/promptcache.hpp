// promptcache single-include header generated from include/promptcache/promptcache.hpp
// by scripts/amalgamate.py. Do not edit: edit the sources and regenerate.
#pragma once
// ---- begin promptcache/promptcache.hpp ----
#ifndef PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_PROMPTCACHE_HPP
#define PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_PROMPTCACHE_HPP
// promptcache: promptcache.hpp
// SPDX-License-Identifier: Apache-2.0
//
// Umbrella header: includes every public promptcache header.

// ---- begin promptcache/block_hash.hpp ----
#ifndef PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_BLOCK_HASH_HPP
#define PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_BLOCK_HASH_HPP
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

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

// ---- begin promptcache/detail/block_hash_bytes.hpp ----
#ifndef PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_DETAIL_BLOCK_HASH_BYTES_HPP
#define PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_DETAIL_BLOCK_HASH_BYTES_HPP
// promptcache: detail/block_hash_bytes.hpp
// SPDX-License-Identifier: Apache-2.0
//
// Little-endian byte encoding for block hashing. Dynamo hashes the
// little-endian bytes of u32 tokens and u64 hashes; these helpers produce them
// with shifts, so the result is the same on any host byte order.

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
#endif  // PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_DETAIL_BLOCK_HASH_BYTES_HPP
// ---- end promptcache/detail/block_hash_bytes.hpp ----
// ---- begin promptcache/detail/block_hash_xxhash.hpp ----
#ifndef PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_DETAIL_BLOCK_HASH_XXHASH_HPP
#define PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_DETAIL_BLOCK_HASH_XXHASH_HPP
// promptcache: detail/block_hash_xxhash.hpp
// SPDX-License-Identifier: Apache-2.0
//
// Compiles xxHash into this translation unit (XXH_INLINE_ALL: every XXH
// function becomes a `static inline` copy named XXH_INLINE_*), so the library
// stays header-only and never needs libxxhash at link time, and exposes the few
// XXH3 entry points block_hash.hpp uses as functions in promptcache::detail.
//
// The inline copies have internal linkage, so they cannot clash with a
// libxxhash the program also links. What could leak is the preprocessor state:
// XXH_INLINE_ALL maps the public names (XXH3_64bits, XXH3_state_t, ...) to the
// XXH_INLINE_* copies and defines xxhash.h's include guards. Left alone, a
// translation unit that includes <xxhash.h> itself before or after this header
// would silently call (and name types of) the inline copies instead of the
// library it links, e.g. `void f(XXH3_state_t*)` would mangle differently in
// two translation units. So every macro xxhash.h touches is saved with
// push_macro before the include and restored with pop_macro after the wrappers
// below are defined: afterwards <xxhash.h> means exactly what it meant before.
//
// If the translation unit already asked for the inline build itself
// (XXH_INLINE_ALL or XXH_PRIVATE_API defined, or xxhash.h already included with
// it), this header reuses those copies and leaves the state as it found it.
// Known limit: including <xxhash.h> *with* XXH_INLINE_ALL *after* this header
// in the same translation unit is not supported (include it first instead).

#include <cstddef>
#include <cstdint>

#if defined(XXH_INLINE_ALL) || defined(XXH_PRIVATE_API) || defined(XXH_INLINE_ALL_31684351384)
#define PROMPTCACHE_XXH_SCOPED 0
#else
#define PROMPTCACHE_XXH_SCOPED 1
#endif

#if PROMPTCACHE_XXH_SCOPED
// Every name xxhash.h 0.8.x (re)defines in XXH_INLINE_ALL mode, plus its
// include guards and configuration macros.
#pragma push_macro("XXH_versionNumber")
#pragma push_macro("XXH32")
#pragma push_macro("XXH32_createState")
#pragma push_macro("XXH32_freeState")
#pragma push_macro("XXH32_reset")
#pragma push_macro("XXH32_update")
#pragma push_macro("XXH32_digest")
#pragma push_macro("XXH32_copyState")
#pragma push_macro("XXH32_canonicalFromHash")
#pragma push_macro("XXH32_hashFromCanonical")
#pragma push_macro("XXH64")
#pragma push_macro("XXH64_createState")
#pragma push_macro("XXH64_freeState")
#pragma push_macro("XXH64_reset")
#pragma push_macro("XXH64_update")
#pragma push_macro("XXH64_digest")
#pragma push_macro("XXH64_copyState")
#pragma push_macro("XXH64_canonicalFromHash")
#pragma push_macro("XXH64_hashFromCanonical")
#pragma push_macro("XXH3_64bits")
#pragma push_macro("XXH3_64bits_withSecret")
#pragma push_macro("XXH3_64bits_withSeed")
#pragma push_macro("XXH3_64bits_withSecretandSeed")
#pragma push_macro("XXH3_createState")
#pragma push_macro("XXH3_freeState")
#pragma push_macro("XXH3_copyState")
#pragma push_macro("XXH3_64bits_reset")
#pragma push_macro("XXH3_64bits_reset_withSeed")
#pragma push_macro("XXH3_64bits_reset_withSecret")
#pragma push_macro("XXH3_64bits_reset_withSecretandSeed")
#pragma push_macro("XXH3_64bits_update")
#pragma push_macro("XXH3_64bits_digest")
#pragma push_macro("XXH3_generateSecret")
#pragma push_macro("XXH3_generateSecret_fromSeed")
#pragma push_macro("XXH128")
#pragma push_macro("XXH3_128bits")
#pragma push_macro("XXH3_128bits_withSeed")
#pragma push_macro("XXH3_128bits_withSecret")
#pragma push_macro("XXH3_128bits_withSecretandSeed")
#pragma push_macro("XXH3_128bits_reset")
#pragma push_macro("XXH3_128bits_reset_withSeed")
#pragma push_macro("XXH3_128bits_reset_withSecret")
#pragma push_macro("XXH3_128bits_reset_withSecretandSeed")
#pragma push_macro("XXH3_128bits_update")
#pragma push_macro("XXH3_128bits_digest")
#pragma push_macro("XXH128_isEqual")
#pragma push_macro("XXH128_cmp")
#pragma push_macro("XXH128_canonicalFromHash")
#pragma push_macro("XXH128_hashFromCanonical")
#pragma push_macro("XXH_OK")
#pragma push_macro("XXH_ERROR")
#pragma push_macro("XXH_errorcode")
#pragma push_macro("XXH32_canonical_t")
#pragma push_macro("XXH64_canonical_t")
#pragma push_macro("XXH128_canonical_t")
#pragma push_macro("XXH32_state_s")
#pragma push_macro("XXH32_state_t")
#pragma push_macro("XXH64_state_s")
#pragma push_macro("XXH64_state_t")
#pragma push_macro("XXH3_state_s")
#pragma push_macro("XXH3_state_t")
#pragma push_macro("XXH128_hash_t")
#pragma push_macro("XXH_NAMESPACE")
#pragma push_macro("XXH_PUBLIC_API")
#pragma push_macro("XXH_STATIC_LINKING_ONLY")
#pragma push_macro("XXH_INLINE_ALL")
#pragma push_macro("XXHASH_H_5627135585666179")
#pragma push_macro("XXHASH_H_STATIC_13879238742")
#define XXH_INLINE_ALL
#endif

#include <xxhash.h>

#if !defined(XXH_VERSION_NUMBER) || XXH_VERSION_NUMBER < 801
#error "promptcache/block_hash.hpp needs xxHash 0.8.1 or newer"
#endif

namespace promptcache::detail {

/// Size of an XXH3 secret derived from a seed (XXH3_SECRET_DEFAULT_SIZE).
inline constexpr std::size_t xxh3_secret_size = 192;
/// Inputs up to this many bytes are hashed with the seed alone; longer ones
/// use the secret (XXH3_MIDSIZE_MAX).
inline constexpr std::size_t xxh3_midsize_max = 240;
static_assert(xxh3_secret_size == XXH3_SECRET_DEFAULT_SIZE);
static_assert(xxh3_midsize_max == XXH3_MIDSIZE_MAX);

/// XXH3_64bits: unseeded 64-bit XXH3 of `len` bytes. O(len).
inline std::uint64_t xxh3_64(const void* data, std::size_t len) noexcept {
  return XXH3_64bits(data, len);
}

/// XXH3_64bits_withSeed. O(len).
inline std::uint64_t xxh3_64(const void* data, std::size_t len, std::uint64_t seed) noexcept {
  return XXH3_64bits_withSeed(data, len, seed);
}

/// Fills `secret` (xxh3_secret_size bytes) with the secret XXH3 derives from
/// `seed`, so long inputs need not re-derive it on every call. O(1).
inline void xxh3_secret_from_seed(unsigned char* secret, std::uint64_t seed) noexcept {
  XXH3_generateSecret_fromSeed(secret, seed);
}

/// XXH3_64bits_withSecretandSeed with a secret from xxh3_secret_from_seed(seed):
/// equal to xxh3_64(data, len, seed), minus the per-call secret derivation. O(len).
inline std::uint64_t xxh3_64(const void* data, std::size_t len, const unsigned char* secret,
                             std::uint64_t seed) noexcept {
  return XXH3_64bits_withSecretandSeed(data, len, secret, xxh3_secret_size, seed);
}

/// Streaming XXH3-64 with a seed and its derived secret: the digest equals
/// xxh3_64(all bytes, seed). Holds ~600 bytes of state, never allocates.
class Xxh3Stream {
 public:
  /// Starts an empty stream; `secret` must outlive the stream. O(1).
  Xxh3Stream(const unsigned char* secret, std::uint64_t seed) noexcept {
    XXH3_64bits_reset_withSecretandSeed(&state_, secret, xxh3_secret_size, seed);
  }
  /// Appends `len` bytes. O(len).
  void update(const void* data, std::size_t len) noexcept {
    XXH3_64bits_update(&state_, data, len);
  }
  /// The hash of everything appended so far; the stream stays usable. O(1).
  [[nodiscard]] std::uint64_t digest() const noexcept { return XXH3_64bits_digest(&state_); }

 private:
  XXH3_state_t state_;
};

}  // namespace promptcache::detail

#if PROMPTCACHE_XXH_SCOPED
#pragma pop_macro("XXH_versionNumber")
#pragma pop_macro("XXH32")
#pragma pop_macro("XXH32_createState")
#pragma pop_macro("XXH32_freeState")
#pragma pop_macro("XXH32_reset")
#pragma pop_macro("XXH32_update")
#pragma pop_macro("XXH32_digest")
#pragma pop_macro("XXH32_copyState")
#pragma pop_macro("XXH32_canonicalFromHash")
#pragma pop_macro("XXH32_hashFromCanonical")
#pragma pop_macro("XXH64")
#pragma pop_macro("XXH64_createState")
#pragma pop_macro("XXH64_freeState")
#pragma pop_macro("XXH64_reset")
#pragma pop_macro("XXH64_update")
#pragma pop_macro("XXH64_digest")
#pragma pop_macro("XXH64_copyState")
#pragma pop_macro("XXH64_canonicalFromHash")
#pragma pop_macro("XXH64_hashFromCanonical")
#pragma pop_macro("XXH3_64bits")
#pragma pop_macro("XXH3_64bits_withSecret")
#pragma pop_macro("XXH3_64bits_withSeed")
#pragma pop_macro("XXH3_64bits_withSecretandSeed")
#pragma pop_macro("XXH3_createState")
#pragma pop_macro("XXH3_freeState")
#pragma pop_macro("XXH3_copyState")
#pragma pop_macro("XXH3_64bits_reset")
#pragma pop_macro("XXH3_64bits_reset_withSeed")
#pragma pop_macro("XXH3_64bits_reset_withSecret")
#pragma pop_macro("XXH3_64bits_reset_withSecretandSeed")
#pragma pop_macro("XXH3_64bits_update")
#pragma pop_macro("XXH3_64bits_digest")
#pragma pop_macro("XXH3_generateSecret")
#pragma pop_macro("XXH3_generateSecret_fromSeed")
#pragma pop_macro("XXH128")
#pragma pop_macro("XXH3_128bits")
#pragma pop_macro("XXH3_128bits_withSeed")
#pragma pop_macro("XXH3_128bits_withSecret")
#pragma pop_macro("XXH3_128bits_withSecretandSeed")
#pragma pop_macro("XXH3_128bits_reset")
#pragma pop_macro("XXH3_128bits_reset_withSeed")
#pragma pop_macro("XXH3_128bits_reset_withSecret")
#pragma pop_macro("XXH3_128bits_reset_withSecretandSeed")
#pragma pop_macro("XXH3_128bits_update")
#pragma pop_macro("XXH3_128bits_digest")
#pragma pop_macro("XXH128_isEqual")
#pragma pop_macro("XXH128_cmp")
#pragma pop_macro("XXH128_canonicalFromHash")
#pragma pop_macro("XXH128_hashFromCanonical")
#pragma pop_macro("XXH_OK")
#pragma pop_macro("XXH_ERROR")
#pragma pop_macro("XXH_errorcode")
#pragma pop_macro("XXH32_canonical_t")
#pragma pop_macro("XXH64_canonical_t")
#pragma pop_macro("XXH128_canonical_t")
#pragma pop_macro("XXH32_state_s")
#pragma pop_macro("XXH32_state_t")
#pragma pop_macro("XXH64_state_s")
#pragma pop_macro("XXH64_state_t")
#pragma pop_macro("XXH3_state_s")
#pragma pop_macro("XXH3_state_t")
#pragma pop_macro("XXH128_hash_t")
#pragma pop_macro("XXH_NAMESPACE")
#pragma pop_macro("XXH_PUBLIC_API")
#pragma pop_macro("XXH_STATIC_LINKING_ONLY")
#pragma pop_macro("XXH_INLINE_ALL")
#pragma pop_macro("XXHASH_H_5627135585666179")
#pragma pop_macro("XXHASH_H_STATIC_13879238742")
#endif

#undef PROMPTCACHE_XXH_SCOPED
#endif  // PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_DETAIL_BLOCK_HASH_XXHASH_HPP
// ---- end promptcache/detail/block_hash_xxhash.hpp ----

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
#endif  // PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_BLOCK_HASH_HPP
// ---- end promptcache/block_hash.hpp ----
// ---- begin promptcache/cursor.hpp ----
#ifndef PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_CURSOR_HPP
#define PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_CURSOR_HPP
// promptcache: cursor.hpp
// SPDX-License-Identifier: Apache-2.0
//
// Gap, stale and contiguity detection for one monotonically increasing event
// stream (one per KV-event publisher). A router keeps one CursorState per
// publisher and asks it, for every incoming event id, whether the event can be
// applied, must be dropped, or reveals that events were lost.

#include <concepts>
#include <cstdint>
#include <limits>
#include <optional>
#include <variant>

namespace promptcache {

/// The kinds of observation a CursorState can make about an incoming id.
namespace cursor {

/// The cursor had seen nothing yet: any first id is accepted as the start.
template <std::unsigned_integral Id>
struct Initial {
  Id got;  ///< The id that was observed.
  /// Memberwise equality. O(1).
  friend constexpr bool operator==(const Initial&, const Initial&) = default;
};

/// `got` is exactly one past the last applied id: apply it.
template <std::unsigned_integral Id>
struct Contiguous {
  Id got;  ///< The id that was observed.
  /// Memberwise equality. O(1).
  friend constexpr bool operator==(const Contiguous&, const Contiguous&) = default;
};

/// `got` skips ahead: ids in [expected, got) were lost, resync before applying.
template <std::unsigned_integral Id>
struct Gap {
  Id expected;  ///< The id that should have come next (last applied + 1).
  Id got;       ///< The id that was observed instead.
  /// Memberwise equality. O(1).
  friend constexpr bool operator==(const Gap&, const Gap&) = default;
};

/// `got` is not newer than the last applied id (a duplicate or a replay): drop it.
template <std::unsigned_integral Id>
struct Stale {
  Id got;                          ///< The id that was observed.
  std::optional<Id> last_applied;  ///< The cursor's last applied id.
  /// Memberwise equality. O(1).
  friend constexpr bool operator==(const Stale&, const Stale&) = default;
};

}  // namespace cursor

/// What CursorState::observe concluded about one id; exactly one alternative holds.
template <std::unsigned_integral Id = std::uint64_t>
using CursorObservation =
    std::variant<cursor::Initial<Id>, cursor::Contiguous<Id>, cursor::Gap<Id>, cursor::Stale<Id>>;

/// Position of a consumer in one publisher's event stream: either nothing
/// applied yet, or the last applied id. A value type: observe and advance_to
/// return results instead of mutating, so a caller can decide per event.
/// Every operation is O(1), constexpr and noexcept, and no id (including
/// `std::numeric_limits<Id>::max()`) makes any computation wrap.
template <std::unsigned_integral Id = std::uint64_t>
class CursorState {
 public:
  /// The state before any event: same as initial(). O(1).
  constexpr CursorState() noexcept = default;

  /// A cursor that has applied nothing; the next observe() yields Initial. O(1).
  [[nodiscard]] static constexpr CursorState initial() noexcept { return CursorState{}; }

  /// A cursor whose last applied event is `last_applied`. O(1).
  [[nodiscard]] static constexpr CursorState live(Id last_applied) noexcept {
    CursorState s;
    s.last_ = last_applied;
    return s;
  }

  /// True until the first advance_to. O(1).
  [[nodiscard]] constexpr bool is_initial() const noexcept { return !last_.has_value(); }

  /// The last applied id, or nullopt for an initial cursor. O(1).
  [[nodiscard]] constexpr std::optional<Id> last_applied_id() const noexcept { return last_; }

  /// Classifies `got` against this cursor without changing it. O(1).
  /// After `max()` nothing can be contiguous, so every later id is Stale
  /// (ids never wrap back to 0 in a live stream; a restart is a new cursor).
  [[nodiscard]] constexpr CursorObservation<Id> observe(Id got) const noexcept {
    if (!last_) return cursor::Initial<Id>{got};
    const Id last = *last_;
    if (got <= last) return cursor::Stale<Id>{got, last_};
    // Here got > last, so last < max() and last + 1 cannot wrap.
    const Id expected = static_cast<Id>(last + 1U);
    if (got == expected) return cursor::Contiguous<Id>{got};
    return cursor::Gap<Id>{expected, got};
  }

  /// The cursor after applying event `id` (whatever this cursor was). O(1).
  [[nodiscard]] constexpr CursorState advance_to(Id id) const noexcept { return live(id); }

  /// Two cursors are equal when both are initial or both hold the same id. O(1).
  friend constexpr bool operator==(const CursorState&, const CursorState&) = default;

 private:
  std::optional<Id> last_;
};

}  // namespace promptcache
#endif  // PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_CURSOR_HPP
// ---- end promptcache/cursor.hpp ----
// ---- begin promptcache/kv_index.hpp ----
#ifndef PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_KV_INDEX_HPP
#define PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_KV_INDEX_HPP
// promptcache: kv_index.hpp
// SPDX-License-Identifier: Apache-2.0
//
// A radix-tree index of which worker holds which KV-cache blocks, fed by the
// KV event stream of every worker (blocks stored, blocks removed, cache
// cleared), for cache-aware routing: for a request's block hashes it answers,
// per worker, how many leading blocks that worker already holds.
//
// The tree is keyed by the blocks' tokens hashes (the local block hashes of
// block_hash.hpp; any well-mixed 64-bit hashes work) along the path from the
// root, so equal prefixes from different workers share nodes. Each worker names
// its blocks with its own 64-bit block hashes, used by its later events.
// Every event passes through a CursorState per (worker, dp rank): stale events
// are dropped and lost events are reported instead of silently diverging.
//
// Not thread-safe for writers; const member functions may run concurrently
// with each other (find_matches keeps its scratch space on the stack).

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

// ---- begin promptcache/detail/kv_index_store.hpp ----
#ifndef PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_DETAIL_KV_INDEX_STORE_HPP
#define PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_DETAIL_KV_INDEX_STORE_HPP
// promptcache: detail/kv_index_store.hpp
// SPDX-License-Identifier: Apache-2.0
//
// Node and hold pools of kv_index.hpp. Both hand out 32-bit indices from a
// vector with a free list instead of pointers: freed slots are reused without
// calling the allocator, the structures are half the size of pointer-based
// ones, and nothing dangles when a vector grows.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

// ---- begin promptcache/detail/kv_index_table.hpp ----
#ifndef PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_DETAIL_KV_INDEX_TABLE_HPP
#define PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_DETAIL_KV_INDEX_TABLE_HPP
// promptcache: detail/kv_index_table.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The flat hash table behind kv_index.hpp. The index does two lookups per
// block operation (tree edge, worker's block name), so both live in one
// open-addressing table type with 16-byte entries: no allocation per insert,
// one cache line per probe in the common case, and prefetchable slots.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

namespace promptcache::detail {

/// "No index" marker for the 32-bit slot / node / hold indices of the index.
inline constexpr std::uint32_t kv_npos = std::numeric_limits<std::uint32_t>::max();

/// Murmur3's 64-bit finalizer: a bijection on 64-bit values, so distinct
/// inputs never collide (the index relies on this for its path hashes).
[[nodiscard]] constexpr std::uint64_t kv_mix64(std::uint64_t k) noexcept {
  k ^= k >> 33U;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33U;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33U;
  return k;
}

/// Open-addressing hash table (linear probing, backward-shift deletion, no
/// tombstones) mapping a (64-bit key, 32-bit tag) pair to a 32-bit value.
/// `Hash::hash(key, tag)` gives the 64-bit hash; the table stores no hash, so it
/// must be cheap. Values must not be kv_npos (it marks empty slots). Capacity is
/// a power of two, grown at load 1/2 and shrunk below load 1/8, so memory follows
/// the live entries.
template <class Hash>
class KvPackedTable {
 public:
  /// One slot: 16 bytes.
  struct Entry {
    std::uint64_t key;    ///< First half of the lookup key.
    std::uint32_t tag;    ///< Second half of the lookup key.
    std::uint32_t value;  ///< The mapped value; kv_npos marks an empty slot.
  };

  /// The value stored for (key, tag), or kv_npos. O(1) expected.
  [[nodiscard]] std::uint32_t find(std::uint64_t key, std::uint32_t tag) const noexcept {
    if (slots_.empty()) return kv_npos;
    std::size_t i = static_cast<std::size_t>(Hash::hash(key, tag)) & mask_;
    for (;;) {
      const Entry& e = slots_[i];
      if (e.value == kv_npos) return kv_npos;
      if (e.key == key && e.tag == tag) return e.value;
      i = (i + 1U) & mask_;
    }
  }

  /// Hints the CPU to load the first slot that find(key, tag) will read. O(1).
  void prefetch(std::uint64_t key, std::uint32_t tag) const noexcept {
    if (slots_.empty()) return;
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(&slots_[static_cast<std::size_t>(Hash::hash(key, tag)) & mask_]);
#endif
  }

  /// Inserts (key, tag) -> value; the pair must not be present. Amortized O(1);
  /// may rehash (invalidates nothing outside the table).
  void insert(std::uint64_t key, std::uint32_t tag, std::uint32_t value) {
    if ((size_ + 1U) * 2U > slots_.size()) rehash(slots_.empty() ? 16U : slots_.size() * 2U);
    place(Entry{key, tag, value});
    ++size_;
  }

  /// Replaces the value of a present (key, tag); false when absent. O(1) expected.
  bool update(std::uint64_t key, std::uint32_t tag, std::uint32_t value) noexcept {
    if (slots_.empty()) return false;
    std::size_t i = static_cast<std::size_t>(Hash::hash(key, tag)) & mask_;
    for (;;) {
      Entry& e = slots_[i];
      if (e.value == kv_npos) return false;
      if (e.key == key && e.tag == tag) {
        e.value = value;
        return true;
      }
      i = (i + 1U) & mask_;
    }
  }

  /// Makes the next `extra` inserts rehash-free. Strong guarantee.
  void reserve_extra(std::size_t extra) {
    const std::size_t need = (size_ + extra) * 2U;
    if (need <= slots_.size()) return;
    std::size_t cap = slots_.empty() ? 16U : slots_.size();
    while (cap < need)
      cap *= 2U;
    rehash(cap);
  }

  /// Removes (key, tag); returns false when it was absent. Amortized O(1).
  /// Below load 1/8 the array shrinks, unless `shrink` is false (then earlier
  /// reserve_extra guarantees still hold).
  bool erase(std::uint64_t key, std::uint32_t tag, bool shrink = true) noexcept {
    if (slots_.empty()) return false;
    std::size_t i = static_cast<std::size_t>(Hash::hash(key, tag)) & mask_;
    for (;;) {
      const Entry& e = slots_[i];
      if (e.value == kv_npos) return false;
      if (e.key == key && e.tag == tag) break;
      i = (i + 1U) & mask_;
    }
    // Backward shift: pull later entries of the probe run into the hole when
    // the hole lies between their home slot and their current slot.
    std::size_t j = i;
    for (;;) {
      j = (j + 1U) & mask_;
      const Entry& e = slots_[j];
      if (e.value == kv_npos) break;
      const std::size_t home = static_cast<std::size_t>(Hash::hash(e.key, e.tag)) & mask_;
      if (((j - home) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = e;
        i = j;
      }
    }
    slots_[i].value = kv_npos;
    --size_;
    if (shrink && slots_.size() > 16U && size_ * 8U < slots_.size()) shrink_noexcept();
    return true;
  }

  /// Shrinks the slot array as erase would have (halving while the load is
  /// below 1/8; released when empty). Keeps the current array when a smaller
  /// one cannot be allocated. O(capacity).
  void shrink_to_load() noexcept {
    if (size_ == 0U) {
      clear();
      return;
    }
    while (slots_.size() > 16U && size_ * 8U < slots_.size()) {
      const std::size_t before = slots_.size();
      shrink_noexcept();
      if (slots_.size() == before) return;
    }
  }

  /// Number of entries. O(1).
  [[nodiscard]] std::size_t size() const noexcept {
    return size_;
  }
  /// Bytes held by the slot array. O(1).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return slots_.capacity() * sizeof(Entry);
  }
  /// Drops every entry and releases the slot array. O(capacity).
  void clear() noexcept {
    std::vector<Entry>().swap(slots_);
    size_ = 0;
    mask_ = 0;
  }

 private:
  void place(const Entry& entry) noexcept {
    std::size_t i = static_cast<std::size_t>(Hash::hash(entry.key, entry.tag)) & mask_;
    while (slots_[i].value != kv_npos)
      i = (i + 1U) & mask_;
    slots_[i] = entry;
  }

  void rehash(std::size_t new_capacity) {
    if (new_capacity > (std::size_t{1} << 40U)) throw std::length_error("kv index table too large");
    std::vector<Entry> old(new_capacity, Entry{0, 0, kv_npos});
    old.swap(slots_);
    mask_ = new_capacity - 1U;
    for (const Entry& e : old)
      if (e.value != kv_npos) place(e);
  }

  // Shrinking is an optimisation: when the smaller array cannot be allocated
  // the table keeps its current one, so erase stays noexcept.
  void shrink_noexcept() noexcept {
    try {
      rehash(slots_.size() / 2U);
    } catch (...) {
    }
  }

  std::vector<Entry> slots_;
  std::size_t size_ = 0;
  std::size_t mask_ = 0;
};

}  // namespace promptcache::detail
#endif  // PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_DETAIL_KV_INDEX_TABLE_HPP
// ---- end promptcache/detail/kv_index_table.hpp ----

namespace promptcache::detail {

/// Tree nodes, stored as fixed-stride rows of 64-bit words so that one node's
/// hashes, count and holder bitset share a cache line (4 words = 32 bytes with
/// up to 64 worker slots):
///   [0] path hash (identifies the root-to-node path, keys the edge table)
///   [1] tokens hash of the node's block
///   [2] parent index (low 32 bits) | holder count (high 32 bits)
///   [3..] bitset over worker slots: which slots hold this node
/// Node 0 is the root; it is never freed and its holder fields are unused.
/// While no other node exists there are no rows at all (the root's only field
/// in use, its path hash, is a constant), so an empty store owns no memory and
/// constructing or emptying one cannot throw.
/// A freed node has count 0 and keeps the next free index in its parent field.
class KvNodeStore {
 public:
  /// Path hash of the root (any constant; the paths below it derive from it).
  static constexpr std::uint64_t root_path_hash = 0x6a09e667f3bcc908ULL;

  /// Just the root, with bitsets for 64 slots. O(1), no allocation.
  KvNodeStore() noexcept = default;

  /// Path hash of `child_tokens` below a node with path hash `parent_path`.
  /// For a fixed parent this is a bijection of the tokens hash, so two children
  /// of one node never share a path hash.
  [[nodiscard]] static constexpr std::uint64_t child_path(std::uint64_t parent_path,
                                                          std::uint64_t child_tokens) noexcept {
    return kv_mix64(parent_path ^ child_tokens);
  }

  /// Path hash of node `n` (its key in the edge table). O(1).
  [[nodiscard]] std::uint64_t path_hash(std::uint32_t n) const noexcept {
    return n == 0U ? root_path_hash : row(n)[0];
  }
  /// Tokens hash of node `n`'s block. O(1).
  [[nodiscard]] std::uint64_t tokens_hash(std::uint32_t n) const noexcept { return row(n)[1]; }
  /// Parent of node `n` (next free node for a freed one). O(1).
  [[nodiscard]] std::uint32_t parent(std::uint32_t n) const noexcept {
    return static_cast<std::uint32_t>(row(n)[2] & 0xffffffffULL);
  }
  /// Number of slots holding node `n`; 0 for a free node. O(1).
  [[nodiscard]] std::uint32_t count(std::uint32_t n) const noexcept {
    return static_cast<std::uint32_t>(row(n)[2] >> 32U);
  }
  /// Holder bitset of node `n`: mask_words() words. Invalidated by fit_slots. O(1).
  [[nodiscard]] const std::uint64_t* mask(std::uint32_t n) const noexcept { return row(n) + 3; }
  /// Words per holder bitset. O(1).
  [[nodiscard]] std::size_t mask_words() const noexcept { return mask_words_; }

  /// True when `slot` holds node `n`. O(1).
  [[nodiscard]] bool test(std::uint32_t n, std::uint32_t slot) const noexcept {
    return ((row(n)[3U + slot / 64U] >> (slot % 64U)) & 1U) != 0U;
  }
  /// Marks `slot` as a holder of `n`; the bit must be clear.
  void set(std::uint32_t n, std::uint32_t slot) noexcept {
    std::uint64_t* r = row(n);
    r[3U + slot / 64U] |= std::uint64_t{1} << (slot % 64U);
    r[2] += std::uint64_t{1} << 32U;
  }
  /// Clears holder `slot` of `n` (the bit must be set); returns the new count.
  std::uint32_t reset_bit(std::uint32_t n, std::uint32_t slot) noexcept {
    std::uint64_t* r = row(n);
    r[3U + slot / 64U] &= ~(std::uint64_t{1} << (slot % 64U));
    r[2] -= std::uint64_t{1} << 32U;
    return static_cast<std::uint32_t>(r[2] >> 32U);
  }

  /// Hints the CPU to load node `n`'s row. O(1).
  void prefetch(std::uint32_t n) const noexcept {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(row(n));
#else
    (void)n;
#endif
  }

  /// Makes room for `extra` more nodes without reallocating during the next
  /// `extra` allocate() calls. Strong guarantee.
  void reserve_extra(std::size_t extra) {
    if (extra <= free_count_) return;
    // The first node also brings the root's row.
    const std::size_t need = (std::max<std::size_t>(rows(), 1U) + extra - free_count_) * stride_;
    if (need > words_.capacity()) words_.reserve(std::max(need, words_.capacity() * 2U));
  }

  /// A new node (holder count 0, no holders). Call reserve_extra first to make
  /// it noexcept.
  std::uint32_t allocate(std::uint64_t path, std::uint64_t tokens, std::uint32_t parent_node) {
    std::uint32_t n;
    if (free_head_ != kv_npos) {
      n = free_head_;
      free_head_ = parent(n);
      --free_count_;
    } else {
      if (rows() >= kv_npos - 1U) throw std::length_error("kv index: too many nodes");
      if (words_.empty()) {  // the root's row first; its parent is "none"
        words_.assign(stride_, 0U);
        words_[0] = root_path_hash;
        words_[2] = kv_npos;
      }
      n = static_cast<std::uint32_t>(rows());
      words_.resize(words_.size() + stride_, 0U);
    }
    std::uint64_t* r = row(n);
    r[0] = path;
    r[1] = tokens;
    r[2] = parent_node;
    std::fill(r + 3, r + stride_, std::uint64_t{0});
    ++live_;
    return n;
  }

  /// Returns node `n` (holder count 0) to the free list. When no node is left
  /// the storage itself is released, so an emptied index gives memory back,
  /// unless `shrink` is false (then earlier reserve_extra guarantees hold).
  void release(std::uint32_t n, bool shrink = true) noexcept {
    row(n)[2] = free_head_;
    free_head_ = n;
    ++free_count_;
    --live_;
    if (shrink) shrink_if_empty();
  }

  /// Releases the storage when no node but the root is live. O(1).
  void shrink_if_empty() noexcept {
    if (live_ != 0U) return;
    std::vector<std::uint64_t>().swap(words_);
    free_head_ = kv_npos;
    free_count_ = 0;
  }

  /// Widens the holder bitsets so that slot indices below `slots` fit.
  /// O(nodes) when it grows (every 64 slots); strong guarantee.
  void ensure_slots(std::size_t slots) {
    if (words_for(slots) > mask_words_) fit_slots(slots);
  }

  /// Sets the bitset width to exactly what slot indices below `slots` need,
  /// growing or shrinking; no node may hold a bit beyond the new width.
  /// O(nodes) when the width changes; strong guarantee.
  void fit_slots(std::size_t slots) {
    const std::size_t want = words_for(slots);
    if (want == mask_words_) return;
    const std::size_t new_stride = 3U + want;
    const std::size_t keep = std::min(stride_, new_stride);
    std::vector<std::uint64_t> next(rows() * new_stride, 0U);
    for (std::size_t n = 0; n < rows(); ++n)
      std::copy_n(words_.data() + n * stride_, keep, next.data() + n * new_stride);
    words_.swap(next);
    mask_words_ = want;
    stride_ = new_stride;
  }

  /// Moves holder bit `from` of `n` to `to` (which must be clear); the count
  /// is unchanged.
  void move_bit(std::uint32_t n, std::uint32_t from, std::uint32_t to) noexcept {
    std::uint64_t* r = row(n);
    r[3U + from / 64U] &= ~(std::uint64_t{1} << (from % 64U));
    r[3U + to / 64U] |= std::uint64_t{1} << (to % 64U);
  }

  /// Live nodes, the root excluded. O(1).
  [[nodiscard]] std::size_t live() const noexcept {
    return live_;
  }
  /// Rows allocated (live + free + root). O(1).
  [[nodiscard]] std::size_t rows() const noexcept {
    return words_.size() / stride_;
  }
  /// Bytes held. O(1).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return words_.capacity() * 8U;
  }
  /// True when `n` is a live non-root node (for invariant checks). O(1).
  [[nodiscard]] bool is_live(std::uint32_t n) const noexcept {
    return n != 0U && n < rows() && count(n) != 0U;
  }

 private:
  [[nodiscard]] static std::size_t words_for(std::size_t slots) noexcept {
    return std::max<std::size_t>(1U, (slots + 63U) / 64U);
  }

  [[nodiscard]] const std::uint64_t* row(std::uint32_t n) const noexcept {
    return words_.data() + static_cast<std::size_t>(n) * stride_;
  }
  [[nodiscard]] std::uint64_t* row(std::uint32_t n) noexcept {
    return words_.data() + static_cast<std::size_t>(n) * stride_;
  }

  std::vector<std::uint64_t> words_;
  std::size_t mask_words_ = 1;
  std::size_t stride_ = 4;
  std::uint32_t free_head_ = kv_npos;
  std::size_t free_count_ = 0;
  std::size_t live_ = 0;
};

/// One worker slot's hold on one node, named by the worker's block hash. The
/// holds of a slot form a tree mirroring the part of the node tree it holds
/// (rooted at a per-slot sentinel hold on node 0), so removing a block visits
/// only that worker's descendants, not every child of a shared node.
struct KvHold {
  std::uint64_t block_hash = 0;         ///< the worker's name for the block
  std::uint32_t node = 0;               ///< the tree node held
  std::uint32_t slot = 0;               ///< the worker slot holding it
  std::uint32_t parent = kv_npos;       ///< the slot's hold on the parent node
  std::uint32_t first_child = kv_npos;  ///< first hold of the slot on a child node
  std::uint32_t next = kv_npos;         ///< next sibling; next free hold when freed
  std::uint32_t prev = kv_npos;         ///< previous sibling
};

/// Pool of holds with a free list and intrusive sibling lists.
class KvHoldStore {
 public:
  /// Hold `h`; the reference is invalidated by allocate() and release(). O(1).
  [[nodiscard]] KvHold& operator[](std::uint32_t h) noexcept { return holds_[h]; }
  /// Hold `h`. O(1).
  [[nodiscard]] const KvHold& operator[](std::uint32_t h) const noexcept { return holds_[h]; }

  /// Hints the CPU to load hold `h`. O(1).
  void prefetch(std::uint32_t h) const noexcept {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(&holds_[h]);
#else
    (void)h;
#endif
  }

  /// Makes the next `extra` allocate() calls non-allocating. Strong guarantee.
  void reserve_extra(std::size_t extra) {
    if (extra <= free_count_) return;
    const std::size_t need = holds_.size() + extra - free_count_;
    if (need > holds_.capacity()) holds_.reserve(std::max(need, holds_.capacity() * 2U));
  }

  /// A new hold linked as the first child of `parent` (kv_npos: a sentinel).
  std::uint32_t allocate(std::uint64_t block_hash, std::uint32_t node, std::uint32_t slot,
                         std::uint32_t parent) {
    std::uint32_t h;
    if (free_head_ != kv_npos) {
      h = free_head_;
      free_head_ = holds_[h].next;
      --free_count_;
    } else {
      if (holds_.size() >= kv_npos - 1U) throw std::length_error("kv index: too many blocks");
      h = static_cast<std::uint32_t>(holds_.size());
      holds_.emplace_back();
    }
    KvHold& x = holds_[h];
    x = KvHold{block_hash, node, slot, parent, kv_npos, kv_npos, kv_npos};
    if (parent != kv_npos) {
      KvHold& p = holds_[parent];
      x.next = p.first_child;
      if (x.next != kv_npos) holds_[x.next].prev = h;
      p.first_child = h;
    }
    ++live_;
    return h;
  }

  /// Unlinks hold `h` (which must have no children) and frees it.
  void release(std::uint32_t h) noexcept {
    KvHold& x = holds_[h];
    if (x.parent != kv_npos) {
      if (x.prev == kv_npos)
        holds_[x.parent].first_child = x.next;
      else
        holds_[x.prev].next = x.next;
      if (x.next != kv_npos) holds_[x.next].prev = x.prev;
    }
    x.next = free_head_;
    x.parent = kv_npos;
    x.first_child = kv_npos;
    free_head_ = h;
    ++free_count_;
    --live_;
    if (live_ == 0U) {
      std::vector<KvHold>().swap(holds_);
      free_head_ = kv_npos;
      free_count_ = 0;
    }
  }

  /// Holds in use (sentinels included). O(1).
  [[nodiscard]] std::size_t live() const noexcept {
    return live_;
  }
  /// Bytes held. O(1).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return holds_.capacity() * sizeof(KvHold);
  }

 private:
  std::vector<KvHold> holds_;
  std::uint32_t free_head_ = kv_npos;
  std::size_t free_count_ = 0;
  std::size_t live_ = 0;
};

}  // namespace promptcache::detail
#endif  // PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_DETAIL_KV_INDEX_STORE_HPP
// ---- end promptcache/detail/kv_index_store.hpp ----

namespace promptcache {

/// One KV event publisher: a worker process and one of its data-parallel ranks.
/// Ranks of one worker are independent streams with independent caches.
struct KvWorker {
  std::uint64_t worker_id = 0;  ///< The worker (engine instance) id.
  std::uint32_t dp_rank = 0;    ///< Data-parallel rank within the worker.
  /// Memberwise comparison. O(1).
  friend constexpr auto operator<=>(const KvWorker&, const KvWorker&) = default;
};

/// One block of a Stored event.
struct KvBlock {
  std::uint64_t block_hash = 0;   ///< The engine's own name for the block (used by later events).
  std::uint64_t tokens_hash = 0;  ///< Hash of the block's tokens (block_hash.hpp local hash).
  /// Memberwise equality. O(1).
  friend constexpr bool operator==(const KvBlock&, const KvBlock&) = default;
};

/// Payloads of KV events.
namespace kv_event {

/// Blocks were stored as a chain: blocks[0] is a child of `parent_hash` (or of
/// the root when absent), each next block a child of the previous one.
struct Stored {
  std::optional<std::uint64_t> parent_hash;  ///< Block hash of the parent, by the same worker.
  std::vector<KvBlock> blocks;               ///< The chain, root side first.
  /// Memberwise equality. O(blocks).
  friend bool operator==(const Stored&, const Stored&) = default;
};

/// Blocks were evicted (named by the worker's block hashes).
struct Removed {
  std::vector<std::uint64_t> block_hashes;  ///< Evicted blocks.
  /// Memberwise equality. O(blocks).
  friend bool operator==(const Removed&, const Removed&) = default;
};

/// The worker dropped its whole cache.
struct Cleared {
  /// Always equal. O(1).
  friend constexpr bool operator==(const Cleared&, const Cleared&) = default;
};

}  // namespace kv_event

/// The payload of one KV event: exactly one of Stored, Removed, Cleared.
using KvEventData = std::variant<kv_event::Stored, kv_event::Removed, kv_event::Cleared>;

/// One KV event of one publisher; ids run 0, 1, 2, ... per (worker, dp rank).
struct KvEvent {
  std::uint64_t event_id = 0;  ///< Position in the publisher's stream.
  KvEventData data;            ///< What happened.
  /// Memberwise equality. O(size of the payload).
  friend bool operator==(const KvEvent&, const KvEvent&) = default;
};

/// What happened to one event.
enum class KvEventStatus : std::uint8_t {
  applied,           ///< Applied; the worker's cursor advanced to the event id.
  stale,             ///< Id not newer than the last applied one: dropped, nothing changed.
  gap,               ///< Events were lost: not applied, nothing changed (cursor too); resync
                     ///< with replace_worker (only under KvGapPolicy::report).
  parent_not_found,  ///< Stored under a parent the worker does not hold: the tree is unchanged,
                     ///< the id is consumed (the cursor advances); the view may have diverged.
  block_conflict,    ///< Stored would give one of the worker's block hashes a second tree position,
                     ///< or one position a second name: tree unchanged, id consumed.
};

/// What an event that reveals a gap does.
enum class KvGapPolicy : std::uint8_t {
  report,           ///< Reject the event and report the gap; the caller resyncs from a dump.
  reset_and_apply,  ///< Degraded mode for publishers without replay: drop the worker's view,
                    ///< then apply the event and continue from its id.
};

/// Construction options of KvIndex.
struct KvIndexOptions {
  KvGapPolicy on_gap = KvGapPolicy::report;  ///< See KvGapPolicy.
};

/// The outcome of applying one event: its status, what the cursor saw, and
/// block counts.
struct KvEventResult {
  KvEventStatus status = KvEventStatus::applied;  ///< What happened.
  CursorObservation<> observation{};              ///< The cursor's view of the event id.
  bool view_reset = false;              ///< reset_and_apply: a gap dropped the worker's view first.
  std::size_t blocks_stored = 0;        ///< Stored: blocks newly held by the worker.
  std::size_t blocks_already_held = 0;  ///< Stored: blocks it already held (idempotent).
  std::size_t blocks_removed = 0;       ///< Removed: named blocks that were dropped.
  std::size_t blocks_cascaded = 0;      ///< Removed / Cleared / reset: descendants and other blocks
                                        ///< dropped along with them.
  std::size_t blocks_not_held = 0;      ///< Removed: named blocks the worker did not hold (no-op),
                                        ///< including ones an earlier name of this event cascaded.

  /// True when the event was applied. O(1).
  [[nodiscard]] bool ok() const noexcept { return status == KvEventStatus::applied; }
  /// The gap the cursor saw (also set when reset_and_apply applied past it). O(1).
  [[nodiscard]] std::optional<cursor::Gap<std::uint64_t>> gap() const noexcept {
    if (const auto* g = std::get_if<cursor::Gap<std::uint64_t>>(&observation)) return *g;
    return std::nullopt;
  }
};

/// The outcome of replace_worker.
struct KvReplaceResult {
  bool ok = false;               ///< True when the worker's view was replaced.
  std::size_t failed_event = 0;  ///< !ok: index in the dump of the event that could not apply.
  KvEventStatus failure = KvEventStatus::applied;  ///< !ok: why (parent_not_found/block_conflict).
  std::size_t blocks = 0;                          ///< ok: blocks the worker holds now.
};

/// How many leading blocks of a query one worker holds.
struct KvWorkerMatch {
  KvWorker worker;         ///< The worker rank.
  std::size_t blocks = 0;  ///< Leading blocks held (>= 1).
  /// Memberwise comparison. O(1).
  friend constexpr auto operator<=>(const KvWorkerMatch&, const KvWorkerMatch&) = default;
};

/// Event counters since construction.
struct KvIndexCounters {
  std::uint64_t events_applied = 0;    ///< Events with status applied.
  std::uint64_t events_stale = 0;      ///< Stale events dropped.
  std::uint64_t gaps = 0;              ///< Events that revealed a gap (reported or reset).
  std::uint64_t parent_not_found = 0;  ///< Stored events whose parent was not held.
  std::uint64_t block_conflicts = 0;   ///< Stored events rejected as block conflicts.
  std::uint64_t views_reset = 0;       ///< Worker views dropped by reset_and_apply.
  std::uint64_t workers_replaced = 0;  ///< Successful replace_worker calls.
  /// Memberwise equality. O(1).
  friend constexpr bool operator==(const KvIndexCounters&, const KvIndexCounters&) = default;
};

/// The KV-event-fed radix index. Costs below: B = blocks in the call, W =
/// worker slots / 64 rounded up (1 up to 64 worker ranks), D = descendants a
/// removal drops. Memory: a tree node takes 8 * (3 + W) bytes plus its slot in
/// the edge table (16 bytes at load 1/4..1/2); a (worker, block) pair takes a
/// 32-byte hold plus its slot in the worker's name table. Everything is held in
/// index-addressed pools, so an index is an ordinary copyable value. Freed
/// nodes and holds go to free lists that the next stores reuse; the pools
/// themselves shrink only when they empty, so memory is bounded by the peak
/// number of live blocks (tables shrink as their load drops).
///
/// Exception safety: apply / store / remove / clear, replace_worker and copy
/// assignment give the strong guarantee (on std::bad_alloc the index is
/// unchanged); remove_worker(KvWorker), moves and swap never throw; the
/// const queries allocate only their results.
class KvIndex {
 public:
  /// An empty index (just the root). O(1), allocates nothing.
  KvIndex() noexcept : KvIndex(KvIndexOptions{}) {}
  /// An empty index with `options`. O(1), allocates nothing.
  explicit KvIndex(KvIndexOptions options) noexcept : options_(options) {}

  /// A deep copy. O(size of `other`).
  KvIndex(const KvIndex& other) = default;
  /// Takes over `other`'s contents; `other` is left empty (with its options),
  /// ready for reuse. O(1).
  KvIndex(KvIndex&& other) noexcept : options_(other.options_) { swap(other); }
  /// Replaces the contents with a copy of `other`. Strong guarantee: on
  /// std::bad_alloc this index is unchanged. O(size of both).
  KvIndex& operator=(const KvIndex& other) {
    if (this != &other) {
      KvIndex copy(other);
      swap(copy);
    }
    return *this;
  }
  /// Takes over `other`'s contents; `other` is left empty (with its options).
  /// O(size of this index, which is released).
  KvIndex& operator=(KvIndex&& other) noexcept {
    if (this != &other) {
      KvIndex taken(std::move(other));
      swap(taken);
    }
    return *this;
  }

  /// Exchanges the contents (options included) with `other`. O(1), noexcept.
  void swap(KvIndex& other) noexcept {
    using std::swap;
    swap(options_, other.options_);
    swap(nodes_, other.nodes_);
    swap(holds_, other.holds_);
    swap(edges_, other.edges_);
    swap(slot_table_, other.slot_table_);
    swap(slots_, other.slots_);
    swap(counters_, other.counters_);
  }
  /// Exchanges the contents of `a` and `b`. O(1), noexcept.
  friend void swap(KvIndex& a, KvIndex& b) noexcept { a.swap(b); }

  /// Applies one event of `worker` (creating the worker on its first event).
  /// O(B) expected for Stored, O(B + D) for Removed, O(blocks held) for Cleared.
  /// Never throws on bad input. Strong guarantee: on std::bad_alloc (or
  /// std::length_error past 2^32 - 2 nodes, blocks or workers) nothing changed,
  /// not even under reset_and_apply; only a Stored event or a new worker's
  /// first event can throw.
  KvEventResult apply(const KvWorker& worker, const KvEvent& event) {
    return std::visit(
        [&](const auto& data) -> KvEventResult {
          using T = std::decay_t<decltype(data)>;
          if constexpr (std::is_same_v<T, kv_event::Stored>)
            return store(worker, event.event_id, data.parent_hash, data.blocks);
          else if constexpr (std::is_same_v<T, kv_event::Removed>)
            return remove(worker, event.event_id, data.block_hashes);
          else
            return clear(worker, event.event_id);
        },
        event.data);
  }

  /// Applies a Stored event without building a KvEvent. Same rules as apply().
  KvEventResult store(const KvWorker& worker, std::uint64_t event_id,
                      std::optional<std::uint64_t> parent_hash, std::span<const KvBlock> blocks) {
    bool created = false;
    const std::uint32_t slot = slot_for(worker, created);
    KvEventResult r;
    if (!admit(slot, event_id, r)) return r;
    try {
      // A reset frees the worker's holds and names before the store, so they
      // need room only beyond what it frees.
      reserve_for_store(slot, blocks.size(), r.view_reset ? slots_[slot].blocks : 0U);
    } catch (...) {
      if (created) remove_worker(worker);  // a new worker's first event did not apply
      throw;
    }
    // Only now, with room reserved, may a gap drop the view; dropping it
    // keeps capacity, so the reservation holds.
    if (r.view_reset) r.blocks_cascaded += clear_slot(slot, false);
    r.status = store_blocks(slot, parent_hash, blocks, r);
    if (r.view_reset) {  // give back what the reset freed but kept for the store
      nodes_.shrink_if_empty();
      edges_.shrink_to_load();
      slots_[slot].names.shrink_to_load();
    }
    finish(slot, event_id, r);
    return r;
  }

  /// Applies a Removed event without building a KvEvent. Same rules as apply().
  KvEventResult remove(const KvWorker& worker, std::uint64_t event_id,
                       std::span<const std::uint64_t> block_hashes) {
    bool created = false;
    const std::uint32_t slot = slot_for(worker, created);
    KvEventResult r;
    if (!admit(slot, event_id, r)) return r;
    if (r.view_reset) r.blocks_cascaded += clear_slot(slot);
    remove_blocks(slot, block_hashes, r);
    finish(slot, event_id, r);
    return r;
  }

  /// Applies a Cleared event without building a KvEvent. Same rules as apply().
  KvEventResult clear(const KvWorker& worker, std::uint64_t event_id) {
    bool created = false;
    const std::uint32_t slot = slot_for(worker, created);
    KvEventResult r;
    if (!admit(slot, event_id, r)) return r;
    r.blocks_cascaded += clear_slot(slot);  // also what a gap's reset would drop
    finish(slot, event_id, r);
    return r;
  }

  /// Replaces everything known about `worker` in one step with the view that
  /// `dump` rebuilds (its events apply in order, ids ignored) and sets its
  /// cursor to live(last_event_id). If an event of the dump cannot apply, the
  /// old view (and cursor) stays untouched and the result says which event
  /// failed. O(blocks of the old view + blocks of the dump).
  KvReplaceResult replace_worker(const KvWorker& worker, std::span<const KvEvent> dump,
                                 std::uint64_t last_event_id) {
    KvReplaceResult res;
    const std::uint32_t tmp = new_slot(worker);  // built aside, swapped in at the end
    for (std::size_t i = 0; i < dump.size(); ++i) {
      KvEventResult r;
      KvEventStatus st = KvEventStatus::applied;
      try {
        if (const auto* s = std::get_if<kv_event::Stored>(&dump[i].data)) {
          reserve_for_store(tmp, s->blocks.size());
          st = store_blocks(tmp, s->parent_hash, s->blocks, r);
        } else if (const auto* rm = std::get_if<kv_event::Removed>(&dump[i].data)) {
          remove_blocks(tmp, rm->block_hashes, r);
        } else {
          clear_slot(tmp);
        }
      } catch (...) {
        drop_slot(tmp);
        trim_masks();
        throw;
      }
      if (st != KvEventStatus::applied) {
        drop_slot(tmp);
        trim_masks();
        res.failed_event = i;
        res.failure = st;
        return res;
      }
    }
    std::uint32_t slot = slot_table_.find(worker.worker_id, worker.dp_rank);
    if (slot != detail::kv_npos) {
      clear_slot(slot);
      adopt(slot, tmp);
    } else {
      slot = tmp;
      slot_table_.insert(worker.worker_id, worker.dp_rank, tmp);  // capacity reserved by new_slot
    }
    slots_[slot].cursor = CursorState<>::live(last_event_id);
    ++counters_.workers_replaced;
    trim_masks();
    res.ok = true;
    res.blocks = slots_[slot].blocks;
    return res;
  }

  /// Drops every dp rank of `worker_id` with all its blocks and cursors;
  /// returns how many ranks were dropped. O(ranks known + blocks dropped).
  std::size_t remove_worker(std::uint64_t worker_id) {
    std::vector<KvWorker> ranks;
    for (const Slot& s : slots_)
      if (s.live && s.worker.worker_id == worker_id) ranks.push_back(s.worker);
    for (const KvWorker& w : ranks)
      remove_worker(w);
    return ranks.size();
  }

  /// Drops one dp rank with its blocks and cursor; false if unknown.
  /// O(blocks dropped).
  bool remove_worker(const KvWorker& worker) noexcept {
    const std::uint32_t slot = slot_table_.find(worker.worker_id, worker.dp_rank);
    if (slot == detail::kv_npos) return false;
    slot_table_.erase(worker.worker_id, worker.dp_rank);
    drop_slot(slot);
    trim_masks();
    return true;
  }

  /// Events (Stored only, ids 0, 1, ...) that rebuild `worker`'s view when given
  /// to replace_worker or applied to an empty index; empty for an unknown
  /// worker. O(blocks held).
  [[nodiscard]] std::vector<KvEvent> dump(const KvWorker& worker) const {
    std::vector<KvEvent> out;
    const std::uint32_t slot = slot_table_.find(worker.worker_id, worker.dp_rank);
    if (slot == detail::kv_npos) return out;
    const std::uint32_t sentinel = slots_[slot].sentinel;
    std::vector<std::uint32_t> starts;  // holds that begin a Stored event
    for (std::uint32_t c = holds_[sentinel].first_child; c != detail::kv_npos; c = holds_[c].next)
      starts.push_back(c);
    while (!starts.empty()) {
      std::uint32_t h = starts.back();
      starts.pop_back();
      kv_event::Stored ev;
      const std::uint32_t p = holds_[h].parent;
      if (p != sentinel) ev.parent_hash = holds_[p].block_hash;
      // Follow first children as one chain; siblings start later events.
      while (h != detail::kv_npos) {
        ev.blocks.push_back(KvBlock{holds_[h].block_hash, nodes_.tokens_hash(holds_[h].node)});
        const std::uint32_t first = holds_[h].first_child;
        if (first != detail::kv_npos)
          for (std::uint32_t c = holds_[first].next; c != detail::kv_npos; c = holds_[c].next)
            starts.push_back(c);
        h = first;
      }
      out.push_back(KvEvent{out.size(), std::move(ev)});
    }
    return out;
  }

  /// Per worker rank holding at least the first block, the number of leading
  /// blocks of `tokens_hashes` it holds, in unspecified order. With
  /// `early_exit`, the walk stops once a single worker remains and that worker
  /// gets the depth reached so far. O(matched blocks * W + result size).
  [[nodiscard]] std::vector<KvWorkerMatch> find_matches(
      std::span<const std::uint64_t> tokens_hashes, bool early_exit = false) const {
    std::vector<KvWorkerMatch> out;
    find_matches(tokens_hashes, early_exit, out);
    return out;
  }

  /// As find_matches above, writing into `out` (cleared first) so a caller can
  /// reuse its capacity.
  void find_matches(std::span<const std::uint64_t> tokens_hashes, bool early_exit,
                    std::vector<KvWorkerMatch>& out) const {
    out.clear();
    constexpr std::size_t chunk = 32;
    std::uint64_t paths[chunk];
    std::uint32_t found[chunk];
    std::uint64_t path = detail::KvNodeStore::root_path_hash;
    std::uint32_t cur = 0;                 // last node reached (root at first)
    std::uint32_t prev = detail::kv_npos;  // last node accounted for
    std::size_t depth = 0;
    const std::size_t words = nodes_.mask_words();
    for (std::size_t base = 0; base < tokens_hashes.size(); base += chunk) {
      const std::size_t m = std::min(chunk, tokens_hashes.size() - base);
      // The path hashes depend on the query only, so every edge probe of the
      // chunk can be issued before the walk needs it.
      for (std::size_t j = 0; j < m; ++j) {
        path = detail::KvNodeStore::child_path(path, tokens_hashes[base + j]);
        paths[j] = path;
        edges_.prefetch(path, 0);
      }
      std::size_t got = 0;
      for (; got < m; ++got) {
        const std::uint32_t child = edges_.find(paths[got], cur);
        if (child == detail::kv_npos) break;
        nodes_.prefetch(child);
        found[got] = child;
        cur = child;
      }
      bool stop = got < m;
      for (std::size_t j = 0; j < got; ++j) {
        const std::uint32_t child = found[j];
        const std::uint32_t c = nodes_.count(child);
        // A child's holders are a subset of its parent's, so equal counts mean
        // equal sets and only a drop in count needs the bitsets.
        if (prev != detail::kv_npos && c < nodes_.count(prev)) {
          const std::uint64_t* a = nodes_.mask(prev);
          const std::uint64_t* b = nodes_.mask(child);
          for (std::size_t w = 0; w < words; ++w)
            emit(a[w] & ~b[w], w, depth, out);
        }
        prev = child;
        ++depth;
        if (early_exit && c == 1U) {
          stop = true;
          break;
        }
      }
      if (stop) break;
    }
    if (prev != detail::kv_npos) {
      const std::uint64_t* a = nodes_.mask(prev);
      for (std::size_t w = 0; w < words; ++w)
        emit(a[w], w, depth, out);
    }
  }

  /// The cursor of `worker`, or nullopt for an unknown worker. O(1).
  [[nodiscard]] std::optional<CursorState<>> cursor(const KvWorker& worker) const noexcept {
    const std::uint32_t slot = slot_table_.find(worker.worker_id, worker.dp_rank);
    if (slot == detail::kv_npos) return std::nullopt;
    return slots_[slot].cursor;
  }

  /// Blocks `worker` holds (0 for an unknown worker). O(1).
  [[nodiscard]] std::size_t block_count(const KvWorker& worker) const noexcept {
    const std::uint32_t slot = slot_table_.find(worker.worker_id, worker.dp_rank);
    return slot == detail::kv_npos ? 0U : slots_[slot].blocks;
  }

  /// True when `worker` is known (has sent an event or been replaced). O(1).
  [[nodiscard]] bool contains(const KvWorker& worker) const noexcept {
    return slot_table_.find(worker.worker_id, worker.dp_rank) != detail::kv_npos;
  }

  /// Known worker ranks, in unspecified order. O(slots).
  [[nodiscard]] std::vector<KvWorker> workers() const {
    std::vector<KvWorker> out;
    for (const Slot& s : slots_)
      if (s.live) out.push_back(s.worker);
    return out;
  }

  /// Number of known worker ranks. O(1).
  [[nodiscard]] std::size_t worker_count() const noexcept { return slot_table_.size(); }
  /// Tree nodes other than the root; 0 means the tree is back to its root. O(1).
  [[nodiscard]] std::size_t node_count() const noexcept { return nodes_.live(); }
  /// (worker, block) pairs held over all workers. O(1).
  [[nodiscard]] std::size_t total_blocks() const noexcept {
    return holds_.live() - slot_table_.size();  // minus one sentinel per worker
  }
  /// Event counters since construction. O(1).
  [[nodiscard]] const KvIndexCounters& counters() const noexcept { return counters_; }
  /// The options given at construction. O(1).
  [[nodiscard]] const KvIndexOptions& options() const noexcept { return options_; }

  /// Approximate heap bytes held (container capacities). O(1).
  [[nodiscard]] std::size_t approximate_memory_bytes() const noexcept {
    return nodes_.memory_bytes() + holds_.memory_bytes() + edges_.memory_bytes() + names_memory() +
           slot_table_.memory_bytes() + slots_.capacity() * sizeof(Slot);
  }

  /// Checks every internal invariant (holder bits and counts, the subset rule
  /// parent/child, hold trees, hash tables). O(everything); for tests.
  [[nodiscard]] bool check_invariants() const {
    std::size_t holds_seen = 0;
    std::vector<std::uint32_t> seen_count(nodes_.rows(), 0U);
    for (std::uint32_t slot = 0; slot < slots_.size(); ++slot) {
      const Slot& s = slots_[slot];
      if (!s.live) continue;
      if (slot_table_.find(s.worker.worker_id, s.worker.dp_rank) != slot) return false;
      std::size_t blocks = 0;
      std::vector<std::uint32_t> stack{s.sentinel};
      while (!stack.empty()) {
        const std::uint32_t h = stack.back();
        stack.pop_back();
        ++holds_seen;
        const detail::KvHold& x = holds_[h];
        if (x.slot != slot) return false;
        if (h != s.sentinel) {
          ++blocks;
          if (!nodes_.is_live(x.node) || !nodes_.test(x.node, slot)) return false;
          if (nodes_.parent(x.node) != holds_[x.parent].node) return false;
          if (s.names.find(x.block_hash, 0) != h) return false;
          ++seen_count[x.node];
        }
        std::uint32_t prev_sib = detail::kv_npos;
        for (std::uint32_t c = x.first_child; c != detail::kv_npos; c = holds_[c].next) {
          if (holds_[c].parent != h || holds_[c].prev != prev_sib) return false;
          prev_sib = c;
          stack.push_back(c);
        }
      }
      if (blocks != s.blocks) return false;
    }
    if (holds_seen != holds_.live()) return false;
    std::size_t names = 0;
    for (const Slot& s : slots_)
      names += s.names.size();
    if (names + slot_table_.size() != holds_.live()) return false;
    std::size_t live_nodes = 0;
    for (std::uint32_t n = 1; n < nodes_.rows(); ++n) {
      if (nodes_.count(n) == 0U) continue;
      ++live_nodes;
      std::uint32_t bits = 0;
      for (std::size_t w = 0; w < nodes_.mask_words(); ++w) {
        bits += static_cast<std::uint32_t>(std::popcount(nodes_.mask(n)[w]));
        const std::uint32_t p = nodes_.parent(n);
        if (p != 0U && (nodes_.mask(n)[w] & ~nodes_.mask(p)[w]) != 0U) return false;
      }
      if (bits != nodes_.count(n) || bits != seen_count[n]) return false;
      if (edges_.find(nodes_.path_hash(n), nodes_.parent(n)) != n) return false;
      if (nodes_.path_hash(n) != detail::KvNodeStore::child_path(nodes_.path_hash(nodes_.parent(n)),
                                                                 nodes_.tokens_hash(n)))
        return false;
    }
    return live_nodes == nodes_.live() && edges_.size() == live_nodes;
  }

 private:
  struct NameHash {
    static constexpr std::uint64_t hash(std::uint64_t key, std::uint32_t) noexcept {
      return detail::kv_mix64(key);
    }
  };

  // One worker rank. Its block names get a table of their own: an event
  // touches one worker only, so its lookups stay in a small, warm table.
  struct Slot {
    detail::KvPackedTable<NameHash> names;  // block hash -> hold
    KvWorker worker;
    CursorState<> cursor;
    std::uint32_t sentinel = detail::kv_npos;
    std::size_t blocks = 0;
    bool live = false;
  };

  struct EdgeHash {
    static constexpr std::uint64_t hash(std::uint64_t path, std::uint32_t) noexcept { return path; }
  };
  struct PairHash {
    static constexpr std::uint64_t hash(std::uint64_t key, std::uint32_t tag) noexcept {
      return detail::kv_mix64(key ^ (std::uint64_t{tag} * 0x9e3779b97f4a7c15ULL));
    }
  };

  // Appends the workers of the set bits of mask word `word` with `depth`.
  void emit(std::uint64_t bits, std::size_t word, std::size_t depth,
            std::vector<KvWorkerMatch>& out) const {
    while (bits != 0U) {
      const std::size_t slot = word * 64U + static_cast<std::size_t>(std::countr_zero(bits));
      out.push_back(KvWorkerMatch{slots_[slot].worker, depth});
      bits &= bits - 1U;
    }
  }

  // Makes the mutation phase of a store of `blocks` blocks allocation-free, so
  // std::bad_alloc can only come before anything changed. `freed`: holds (and
  // names) of the slot that a no-shrink clear_slot frees before the store.
  void reserve_for_store(std::uint32_t slot, std::size_t blocks, std::size_t freed = 0) {
    nodes_.reserve_extra(blocks);
    edges_.reserve_extra(blocks);
    const std::size_t own = blocks > freed ? blocks - freed : 0U;
    holds_.reserve_extra(own);
    slots_[slot].names.reserve_extra(own);
  }

  // The slot of `worker`, created (with an initial cursor) on first sight;
  // `created` says which. Strong guarantee.
  std::uint32_t slot_for(const KvWorker& worker, bool& created) {
    const std::uint32_t slot = slot_table_.find(worker.worker_id, worker.dp_rank);
    if (slot != detail::kv_npos) return slot;
    const std::uint32_t fresh = new_slot(worker);
    slot_table_.insert(worker.worker_id, worker.dp_rank, fresh);
    created = true;
    return fresh;
  }

  // A live slot with a sentinel hold, not yet in the slot table (whose
  // capacity for one more entry is reserved). O(slots). Strong guarantee.
  std::uint32_t new_slot(const KvWorker& worker) {
    slot_table_.reserve_extra(1);
    holds_.reserve_extra(1);
    // The lowest free index keeps the holder bitsets as narrow as possible.
    std::uint32_t slot = 0;
    while (slot < slots_.size() && slots_[slot].live)
      ++slot;
    if (slot == slots_.size()) {
      if (slots_.size() >= detail::kv_npos - 1U)
        throw std::length_error("kv index: too many workers");
      nodes_.ensure_slots(slots_.size() + 1U);
      slots_.emplace_back();
    } else {
      nodes_.ensure_slots(std::size_t{slot} + 1U);
    }
    Slot& s = slots_[slot];
    s = Slot{};
    s.worker = worker;
    s.live = true;
    s.sentinel = holds_.allocate(0, 0, slot, detail::kv_npos);
    return slot;
  }

  [[nodiscard]] std::size_t names_memory() const noexcept {
    std::size_t n = 0;
    for (const Slot& s : slots_)
      n += s.names.memory_bytes();
    return n;
  }

  // Drops every block of `slot`, its sentinel, and frees the slot.
  void drop_slot(std::uint32_t slot) noexcept {
    clear_slot(slot);
    holds_.release(slots_[slot].sentinel);
    slots_[slot].names.clear();
    slots_[slot].worker = KvWorker{};
    slots_[slot].cursor = CursorState<>{};
    slots_[slot].sentinel = detail::kv_npos;
    slots_[slot].blocks = 0;
    slots_[slot].live = false;
  }

  // Moves the view built in slot `tmp` into the (cleared) slot `into`, so a
  // replaced worker keeps its slot index and the bitsets need not grow for
  // good. O(blocks of the view).
  void adopt(std::uint32_t into, std::uint32_t tmp) noexcept {
    Slot& dst = slots_[into];
    Slot& src = slots_[tmp];
    holds_.release(dst.sentinel);  // childless after clear_slot
    const std::uint32_t sentinel = src.sentinel;
    holds_[sentinel].slot = into;
    // Pre-order walk of the hold tree without a stack (parent links).
    std::uint32_t h = holds_[sentinel].first_child;
    while (h != detail::kv_npos) {
      nodes_.move_bit(holds_[h].node, tmp, into);
      holds_[h].slot = into;
      if (holds_[h].first_child != detail::kv_npos) {
        h = holds_[h].first_child;
        continue;
      }
      while (h != sentinel && holds_[h].next == detail::kv_npos)
        h = holds_[h].parent;
      h = h == sentinel ? detail::kv_npos : holds_[h].next;
    }
    dst.names = std::move(src.names);
    dst.sentinel = sentinel;
    dst.blocks = src.blocks;
    src.names.clear();
    src.worker = KvWorker{};
    src.cursor = CursorState<>{};
    src.sentinel = detail::kv_npos;
    src.blocks = 0;
    src.live = false;
  }

  // Narrows the holder bitsets to the highest live slot. Optional, so a failed
  // allocation just keeps the current width.
  void trim_masks() noexcept {
    std::size_t top = 0;
    for (std::size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].live) top = i + 1U;
    if ((top + 63U) / 64U >= nodes_.mask_words()) return;
    try {
      nodes_.fit_slots(top);
    } catch (...) {
    }
  }

  // Classifies the event id; false when the event must not be applied. A gap
  // under reset_and_apply sets r.view_reset: the caller drops the view once
  // nothing can fail any more. Changes nothing but the counters of rejected
  // events.
  bool admit(std::uint32_t slot, std::uint64_t event_id, KvEventResult& r) noexcept {
    Slot& s = slots_[slot];
    r.observation = s.cursor.observe(event_id);
    if (std::holds_alternative<cursor::Stale<std::uint64_t>>(r.observation)) {
      ++counters_.events_stale;
      r.status = KvEventStatus::stale;
      return false;
    }
    if (std::holds_alternative<cursor::Gap<std::uint64_t>>(r.observation)) {
      if (options_.on_gap == KvGapPolicy::report) {
        ++counters_.gaps;
        r.status = KvEventStatus::gap;
        return false;
      }
      r.view_reset = true;
    }
    return true;
  }

  void finish(std::uint32_t slot, std::uint64_t event_id, const KvEventResult& r) noexcept {
    slots_[slot].cursor = slots_[slot].cursor.advance_to(event_id);
    if (r.view_reset) {
      ++counters_.gaps;
      ++counters_.views_reset;
    }
    switch (r.status) {
      case KvEventStatus::applied:
        ++counters_.events_applied;
        break;
      case KvEventStatus::parent_not_found:
        ++counters_.parent_not_found;
        break;
      case KvEventStatus::block_conflict:
        ++counters_.block_conflicts;
        break;
      case KvEventStatus::stale:
      case KvEventStatus::gap:
        break;
    }
  }

  // Stores the chain (capacity reserved by reserve_for_store). On a conflict
  // every hold it added is undone, so the tree is unchanged.
  KvEventStatus store_blocks(std::uint32_t slot, std::optional<std::uint64_t> parent_hash,
                             std::span<const KvBlock> blocks, KvEventResult& r) noexcept {
    auto& names = slots_[slot].names;
    std::uint32_t cur_hold = slots_[slot].sentinel;
    if (parent_hash) {
      cur_hold = names.find(*parent_hash, 0);
      if (cur_hold == detail::kv_npos) return KvEventStatus::parent_not_found;
    }
    std::uint32_t cur_node = holds_[cur_hold].node;
    std::size_t added = 0;
    // Path hashes follow from the tokens hashes alone, so the probes of a whole
    // chunk are issued up front and their cache misses overlap.
    constexpr std::size_t chunk = 64;
    std::uint64_t paths[chunk];
    std::uint32_t found[chunk];
    std::uint64_t path = nodes_.path_hash(cur_node);
    for (std::size_t base = 0; base < blocks.size(); base += chunk) {
      const std::size_t m = std::min(chunk, blocks.size() - base);
      for (std::size_t j = 0; j < m; ++j) {
        path = detail::KvNodeStore::child_path(path, blocks[base + j].tokens_hash);
        paths[j] = path;
        edges_.prefetch(path, 0);
        names.prefetch(blocks[base + j].block_hash, 0);
      }
      // Nodes that already exist (a prefix other workers hold) are found in a
      // first pass so that their rows are on the way before they are written.
      std::size_t walked = 0;
      for (std::uint32_t at = cur_node; walked < m; ++walked) {
        at = edges_.find(paths[walked], at);
        if (at == detail::kv_npos) break;
        found[walked] = at;
        nodes_.prefetch(at);
      }
      for (std::size_t j = 0; j < m; ++j) {
        const KvBlock& b = blocks[base + j];
        // Past the walk the parent is new (or the walk's first miss), so the
        // node cannot exist yet.
        std::uint32_t child = j < walked ? found[j] : detail::kv_npos;
        bool fresh_node = false;
        if (child == detail::kv_npos) {
          child = nodes_.allocate(paths[j], b.tokens_hash, cur_node);
          edges_.insert(paths[j], cur_node, child);
          fresh_node = true;
        }
        const std::uint32_t existing = names.find(b.block_hash, 0);
        if (existing != detail::kv_npos) {
          if (holds_[existing].node == child) {  // re-store of a held block
            ++r.blocks_already_held;
            cur_hold = existing;
            cur_node = child;
            continue;
          }
        } else if (!nodes_.test(child, slot)) {
          const std::uint32_t h = holds_.allocate(b.block_hash, child, slot, cur_hold);
          names.insert(b.block_hash, 0, h);
          nodes_.set(child, slot);
          ++slots_[slot].blocks;
          ++added;
          cur_hold = h;
          cur_node = child;
          continue;
        }
        // Conflict: the name is held elsewhere, or the position under another name.
        if (fresh_node) free_node(child);
        undo_chain(cur_hold, added);
        r.blocks_already_held = 0;
        return KvEventStatus::block_conflict;
      }
    }
    r.blocks_stored = added;
    return KvEventStatus::applied;
  }

  // Undoes the `added` holds of a store. After the first new hold every later
  // one is new too (a worker holding a node holds its parent), so they form a
  // chain ending at `h`.
  void undo_chain(std::uint32_t h, std::size_t added) noexcept {
    for (std::size_t i = 0; i < added; ++i) {
      const std::uint32_t parent = holds_[h].parent;
      release_hold(h);
      h = parent;
    }
  }

  void remove_blocks(std::uint32_t slot, std::span<const std::uint64_t> block_hashes,
                     KvEventResult& r) noexcept {
    // A software pipeline over chunks: each stage prefetches what the next
    // one reads (name slot, hold, node row, edge slot), so the misses overlap.
    auto& names = slots_[slot].names;
    constexpr std::size_t chunk = 32;
    std::uint32_t hs[chunk];
    for (std::size_t base = 0; base < block_hashes.size(); base += chunk) {
      const std::size_t m = std::min(chunk, block_hashes.size() - base);
      for (std::size_t j = 0; j < m; ++j)
        names.prefetch(block_hashes[base + j], 0);
      for (std::size_t j = 0; j < m; ++j) {
        hs[j] = names.find(block_hashes[base + j], 0);
        if (hs[j] != detail::kv_npos) holds_.prefetch(hs[j]);
      }
      for (std::size_t j = 0; j < m; ++j)
        if (hs[j] != detail::kv_npos) nodes_.prefetch(holds_[hs[j]].node);
      for (std::size_t j = 0; j < m; ++j)
        if (hs[j] != detail::kv_npos) edges_.prefetch(nodes_.path_hash(holds_[hs[j]].node), 0);
      for (std::size_t j = 0; j < m; ++j) {
        // Found again: an earlier name of this event may have cascaded it away.
        const std::uint32_t h =
            hs[j] == detail::kv_npos ? hs[j] : names.find(block_hashes[base + j], 0);
        if (h == detail::kv_npos) {
          ++r.blocks_not_held;
          continue;
        }
        ++r.blocks_removed;
        r.blocks_cascaded += remove_subtree(h) - 1U;
      }
    }
  }

  // Drops every block of `slot`; returns how many. With shrink false the
  // tables and pools keep their capacity (reservations stay valid).
  std::size_t clear_slot(std::uint32_t slot, bool shrink = true) noexcept {
    const std::uint32_t sentinel = slots_[slot].sentinel;
    std::size_t n = 0;
    while (holds_[sentinel].first_child != detail::kv_npos)
      n += remove_subtree(holds_[sentinel].first_child, shrink);
    return n;
  }

  // Releases hold `top` and all its descendants, leaves first, without
  // recursion (chains can be thousands of blocks long). Returns how many.
  std::size_t remove_subtree(std::uint32_t top, bool shrink = true) noexcept {
    std::size_t n = 0;
    std::uint32_t h = top;
    for (;;) {
      while (holds_[h].first_child != detail::kv_npos)
        h = holds_[h].first_child;
      const std::uint32_t up = holds_[h].parent;
      const bool last = h == top;
      release_hold(h, shrink);
      ++n;
      if (last) return n;
      h = up;
    }
  }

  // Releases a childless hold: its name, its holder bit, and the node when no
  // worker holds it any more.
  void release_hold(std::uint32_t h, bool shrink = true) noexcept {
    const detail::KvHold x = holds_[h];
    slots_[x.slot].names.erase(x.block_hash, 0, shrink);
    --slots_[x.slot].blocks;
    if (nodes_.reset_bit(x.node, x.slot) == 0U) free_node(x.node, shrink);
    holds_.release(h);
  }

  void free_node(std::uint32_t n, bool shrink = true) noexcept {
    edges_.erase(nodes_.path_hash(n), nodes_.parent(n), shrink);
    nodes_.release(n, shrink);
  }

  KvIndexOptions options_;
  detail::KvNodeStore nodes_;
  detail::KvHoldStore holds_;
  detail::KvPackedTable<EdgeHash> edges_;       // (path hash, parent node) -> child node
  detail::KvPackedTable<PairHash> slot_table_;  // (worker id, dp rank) -> slot
  std::vector<Slot> slots_;                     // indexed by slot; free ones are not live
  KvIndexCounters counters_;
};

}  // namespace promptcache
#endif  // PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_KV_INDEX_HPP
// ---- end promptcache/kv_index.hpp ----
// ---- begin promptcache/manual_clock.hpp ----
#ifndef PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_MANUAL_CLOCK_HPP
#define PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_MANUAL_CLOCK_HPP
// promptcache: manual_clock.hpp
// SPDX-License-Identifier: Apache-2.0
//
// A clock that only moves when told to, for driving PromptCachePool's TTLs in
// tests and simulations without sleeping. Copies are handles to one shared
// time, so a test can hand a copy to the pool and keep advancing its own.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <ratio>

namespace promptcache {

/// A steady clock whose time is set by hand. Copies share the same time (a
/// shared_ptr to an atomic counter), so advancing any copy advances all of
/// them; reading and advancing are thread-safe.
class ManualClock {
 public:
  using rep = std::int64_t;                                 ///< Nanosecond count.
  using period = std::nano;                                 ///< Resolution: 1 ns.
  using duration = std::chrono::nanoseconds;                ///< Clock duration.
  using time_point = std::chrono::time_point<ManualClock>;  ///< Clock time point.
  static constexpr bool is_steady = true;                   ///< Time never goes back unless set().

  /// A new, independent time starting at the epoch (0 ns). Allocates once.
  ManualClock() : now_(std::make_shared<std::atomic<rep>>(0)) {}

  /// The current time of this handle's shared timeline. O(1), noexcept.
  [[nodiscard]] time_point now() const noexcept {
    return time_point(duration(now_->load(std::memory_order_acquire)));
  }

  /// Moves the shared time forward by `d` (a negative `d` moves it back). O(1).
  template <class Rep, class Period>
  void advance(std::chrono::duration<Rep, Period> d) const noexcept {
    now_->fetch_add(std::chrono::duration_cast<duration>(d).count(), std::memory_order_acq_rel);
  }

  /// Sets the shared time to `t`. O(1).
  void set(time_point t) const noexcept {
    now_->store(t.time_since_epoch().count(), std::memory_order_release);
  }

 private:
  std::shared_ptr<std::atomic<rep>> now_;
};

}  // namespace promptcache
#endif  // PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_MANUAL_CLOCK_HPP
// ---- end promptcache/manual_clock.hpp ----
// ---- begin promptcache/prompt_cache_pool.hpp ----
#ifndef PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_PROMPT_CACHE_POOL_HPP
#define PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_PROMPT_CACHE_POOL_HPP
// promptcache: prompt_cache_pool.hpp
// SPDX-License-Identifier: Apache-2.0
//
// A process-local pool of recently used prompt prefixes and the per-layer KV
// state an engine computed for them. A stateless server sends the full token
// list on every call; the pool answers "which stored prefix of this request can
// I resume from" and keeps the state after each call.
//
// Layout: one compressed trie (radix tree) per namespace over token ids; an
// entry lives on the node where its ids end. Edge labels are not copies: they
// point into the ids of some entry stored below the edge, so the index costs a
// few dozen bytes per node on top of the ids the entries own anyway. Unpinned
// entries also sit on an intrusive recency list (one per distinct TTL), which
// gives the LRU victim in O(1) and lets TTL expiry stop at the first live
// entry. Lookup and insert cost O(query length), whatever the pool size.

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

// ---- begin promptcache/detail/pool_child_map.hpp ----
#ifndef PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_DETAIL_POOL_CHILD_MAP_HPP
#define PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_DETAIL_POOL_CHILD_MAP_HPP
// promptcache: detail/pool_child_map.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The children of one radix-tree node of PromptCachePool, keyed by the first
// token of each child's edge. An open-addressing table (linear probing,
// backward-shift deletion, load factor <= 1/2) so that a node with 65536
// children costs the same per lookup as a node with two. Growth is split in
// two steps, reserve() (may throw) and insert_reserved() (never throws),
// so the pool can do every allocation of an insert before it changes anything.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace promptcache::detail {

template <std::integral Token, class Node>
class PoolChildMap {
 public:
  struct Slot {
    Token key{};
    Node* node = nullptr;  // nullptr marks an empty slot
  };

  PoolChildMap() noexcept = default;
  PoolChildMap(const PoolChildMap&) = delete;
  PoolChildMap& operator=(const PoolChildMap&) = delete;
  PoolChildMap(PoolChildMap&& other) noexcept { swap(other); }
  PoolChildMap& operator=(PoolChildMap&& other) noexcept {
    PoolChildMap tmp(std::move(other));
    swap(tmp);
    return *this;
  }
  ~PoolChildMap() = default;

  void swap(PoolChildMap& other) noexcept {
    std::swap(slots_, other.slots_);
    std::swap(size_, other.size_);
    std::swap(shift_, other.shift_);
    std::swap(capacity_, other.capacity_);
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  /// Bytes of the slot table (for the index-memory report).
  [[nodiscard]] std::size_t table_bytes() const noexcept { return capacity_ * sizeof(Slot); }

  [[nodiscard]] Node* find(Token key) const noexcept {
    if (capacity_ == 0) return nullptr;
    const std::size_t mask = capacity_ - 1;
    for (std::size_t i = index_of(key);; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.node == nullptr) return nullptr;
      if (s.key == key) return s.node;
    }
  }

  /// Makes room for `extra` more children so that insert_reserved cannot fail. May throw
  /// bad_alloc; the map is unchanged if it does.
  void reserve(std::size_t extra) {
    if (2 * (size_ + extra) <= capacity_) return;
    std::size_t new_capacity = capacity_ == 0 ? 2 : capacity_ * 2;
    while (2 * (size_ + extra) > new_capacity)
      new_capacity *= 2;
    std::unique_ptr<Slot[]> table(new Slot[new_capacity]);
    PoolChildMap grown;
    grown.slots_ = std::move(table);
    grown.capacity_ = new_capacity;
    grown.shift_ = shift_for(new_capacity);
    for (std::size_t i = 0; i < capacity_; ++i) {
      if (slots_[i].node != nullptr) grown.place(slots_[i].key, slots_[i].node);
    }
    grown.size_ = size_;
    swap(grown);
  }

  /// Adds a child whose key is not present; requires a preceding reserve().
  void insert_reserved(Token key, Node* node) noexcept {
    place(key, node);
    ++size_;
  }

  /// Replaces the node stored under an existing key.
  void replace(Token key, Node* node) noexcept {
    const std::size_t mask = capacity_ - 1;
    for (std::size_t i = index_of(key);; i = (i + 1) & mask) {
      if (slots_[i].key == key && slots_[i].node != nullptr) {
        slots_[i].node = node;
        return;
      }
    }
  }

  /// Removes an existing key (backward-shift deletion keeps probe chains intact).
  void erase(Token key) noexcept {
    const std::size_t mask = capacity_ - 1;
    std::size_t i = index_of(key);
    while (!(slots_[i].key == key && slots_[i].node != nullptr))
      i = (i + 1) & mask;
    std::size_t hole = i;
    for (std::size_t j = (hole + 1) & mask; slots_[j].node != nullptr; j = (j + 1) & mask) {
      const std::size_t home = index_of(slots_[j].key);
      // Move j into the hole unless its home lies cyclically in (hole, j].
      const bool home_after_hole =
          hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
      if (!home_after_hole) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = Slot{};
    --size_;
    // A table left mostly empty by mass evictions would make any()/for_each scan it; shrink
    // when a table is 1/8 full. Best effort: if the allocation fails, keep the big table.
    if (capacity_ > 16 && size_ * 8 <= capacity_) {
      std::size_t smaller = 2;
      while (smaller < 4 * size_)
        smaller *= 2;
      rebuild(smaller);
    }
  }

  /// Calls f(node) for every child, in table order.
  template <class F>
  void for_each(F&& f) const {
    for (std::size_t i = 0; i < capacity_; ++i) {
      if (slots_[i].node != nullptr) f(slots_[i].node);
    }
  }

  /// Any child (the first in table order), or nullptr.
  [[nodiscard]] Node* any() const noexcept {
    for (std::size_t i = 0; i < capacity_; ++i) {
      if (slots_[i].node != nullptr) return slots_[i].node;
    }
    return nullptr;
  }

 private:
  static unsigned shift_for(std::size_t capacity) noexcept {
    unsigned bits = 0;
    while ((std::size_t{1} << bits) < capacity)
      ++bits;
    return 64U - bits;
  }

  [[nodiscard]] std::size_t index_of(Token key) const noexcept {
    using U = std::make_unsigned_t<Token>;
    const auto x = static_cast<std::uint64_t>(static_cast<U>(key));
    // Fibonacci hashing: the high bits of the product are well mixed.
    return static_cast<std::size_t>((x * 0x9E3779B97F4A7C15ULL) >> shift_);
  }

  void rebuild(std::size_t new_capacity) noexcept {
    std::unique_ptr<Slot[]> table(new (std::nothrow) Slot[new_capacity]);
    if (!table) return;
    PoolChildMap other;
    other.slots_ = std::move(table);
    other.capacity_ = new_capacity;
    other.shift_ = shift_for(new_capacity);
    for (std::size_t i = 0; i < capacity_; ++i) {
      if (slots_[i].node != nullptr) other.place(slots_[i].key, slots_[i].node);
    }
    other.size_ = size_;
    swap(other);
  }

  void place(Token key, Node* node) noexcept {
    const std::size_t mask = capacity_ - 1;
    std::size_t i = index_of(key);
    while (slots_[i].node != nullptr)
      i = (i + 1) & mask;
    slots_[i] = Slot{key, node};
  }

  std::unique_ptr<Slot[]> slots_;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
  unsigned shift_ = 64;
};

}  // namespace promptcache::detail
#endif  // PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_DETAIL_POOL_CHILD_MAP_HPP
// ---- end promptcache/detail/pool_child_map.hpp ----

namespace promptcache {

/// How find_longest_prefix matches stored entries against a query.
enum class MatchMode {
  /// An entry must be a prefix of the query (an append-only KV cache). The seed behaviour.
  exact_prefix,
  /// The entry sharing the longest common prefix wins; the caller trims the
  /// entry's state to Hit::matched tokens (truncatable attention caches only).
  common_prefix,
};

/// Default size customization point: entries weigh 0 bytes, so Options::max_bytes must stay 0.
struct unsized_caches {
  /// Always 0.
  template <class LayerCache>
  constexpr std::size_t operator()(const LayerCache&) const noexcept {
    return 0;
  }
};

/// Counters (since construction or reset_stats()) and gauges (current) of one pool.
struct PoolStats {
  std::uint64_t lookups = 0;             ///< find_longest_prefix calls.
  std::uint64_t hits = 0;                ///< Lookups that returned an entry.
  std::uint64_t query_tokens = 0;        ///< Sum of query lengths over all lookups.
  std::uint64_t matched_tokens = 0;      ///< Sum of Hit::matched over all hits.
  std::uint64_t inserted = 0;            ///< Inserts that added a new entry.
  std::uint64_t extended = 0;            ///< Inserts that replaced a shorter lineage entry.
  std::uint64_t updated = 0;             ///< Inserts that replaced an entry with equal ids.
  std::uint64_t rejected_empty = 0;      ///< Inserts rejected: empty ids.
  std::uint64_t rejected_too_short = 0;  ///< Inserts rejected: below min_cacheable_tokens.
  std::uint64_t rejected_too_large = 0;  ///< Inserts rejected: entry alone exceeds max_bytes.
  std::uint64_t evicted_lru = 0;         ///< Evictions to stay within max_entries.
  std::uint64_t evicted_ttl = 0;         ///< Evictions of idle-expired entries.
  std::uint64_t evicted_bytes = 0;       ///< Evictions to stay within max_bytes.
  std::uint64_t evicted_explicit = 0;    ///< erase / erase_namespace / clear removals.
  std::uint64_t superseded = 0;    ///< Common-prefix mode: shorter prefixes retired by an insert.
  std::size_t entries = 0;         ///< Gauge: stored entries.
  std::size_t pinned_entries = 0;  ///< Gauge: stored pinned entries.
  std::size_t bytes = 0;           ///< Gauge: sum of entry sizes (size customization point).
};

/// Memory of a pool, split into the index and the token ids it indexes.
struct PoolMemory {
  std::size_t index_bytes = 0;  ///< Tree nodes, child tables, per-entry records, namespaces, lists.
  std::size_t id_bytes = 0;     ///< Bytes of token ids owned by the stored entries.
};

template <class LayerCache, std::integral Token, class Clock, class CacheBytes>
class SynchronizedPromptCachePool;

/// A pool of prompt prefixes and their per-layer state (see the file comment).
///
/// - `LayerCache`: the engine's per-layer state; copied never, moved only inside std::vector.
/// - `Token`: token id type (any integral type but bool).
/// - `Clock`: has `now()` and the std clock typedefs; used through an instance, so a
///   ManualClock handle shared with a test drives TTLs. Must not go backwards.
/// - `CacheBytes`: size customization point for the byte budget: a default-constructible
///   functor `std::size_t(const LayerCache&)`; an entry weighs the sum over its caches.
///   It must be callable concurrently (SynchronizedPromptCachePool calls it unlocked).
///
/// Not thread-safe; see SynchronizedPromptCachePool. Not copyable or movable (hold it
/// by unique_ptr if it has to move).
template <class LayerCache, std::integral Token = std::uint32_t,
          class Clock = std::chrono::steady_clock, class CacheBytes = unsized_caches>
class PromptCachePool {
  static_assert(!std::is_same_v<std::remove_cv_t<Token>, bool>, "Token must not be bool");

 public:
  using token_type = Token;                       ///< Token id type.
  using clock_type = Clock;                       ///< Clock type.
  using duration = typename Clock::duration;      ///< Clock duration (TTLs).
  using time_point = typename Clock::time_point;  ///< Clock time point.
  using namespace_id = std::uint64_t;             ///< Tenant / model / adapter key.

  /// Pool configuration; fixed at construction.
  struct Options {
    std::size_t max_entries = 16;  ///< LRU-evict unpinned entries beyond this count.
    /// Idle TTL of unpinned entries (<= 0: they expire at the next check).
    duration ttl = std::chrono::minutes(5);
    std::size_t min_cacheable_tokens = 8;  ///< Shorter ids are stored only to extend a lineage.
    MatchMode match = MatchMode::exact_prefix;  ///< Exact-prefix (seed) or common-prefix lookups.
    bool keep_one_token = false;       ///< Cap a hit at query length - 1 (engine needs one token).
    std::size_t min_match_tokens = 0;  ///< A hit matching fewer tokens is reported as a miss.
    std::size_t max_bytes = 0;         ///< Byte budget over CacheBytes sizes; 0 = unlimited.
  };

  /// One stored prefix. Immutable once stored; shared with every hit that returned it.
  struct Entry {
    std::vector<Token> ids{};          ///< The prefix's token ids (never empty).
    std::vector<LayerCache> caches{};  ///< Per-layer state after processing `ids`.
    std::size_t fed_images = 0;        ///< Images already spliced into `caches`.
    std::size_t fed_audios = 0;        ///< Audio clips already spliced into `caches`.
    /// Pinned when this snapshot was stored (pin()/unpin() don't rewrite snapshots).
    bool pinned = false;
  };

  /// A lookup result: a snapshot of the entry and how many query tokens it covers.
  struct Hit {
    std::shared_ptr<const Entry> entry{};  ///< Snapshot; stays valid after eviction.
    std::size_t matched = 0;               ///< Leading query tokens the entry's state covers.
    /// Tokens to cut from the entry's state before resuming (0 in exact-prefix mode).
    [[nodiscard]] std::size_t trim() const noexcept { return entry->ids.size() - matched; }
  };

  /// What an insert did.
  enum class InsertResult {
    inserted,            ///< Stored as a new entry.
    extended,            ///< Replaced a stored entry whose ids are a proper prefix (same lineage).
    updated,             ///< Replaced the stored entry with identical ids.
    rejected_empty,      ///< Empty ids; nothing changed.
    rejected_too_short,  ///< Below min_cacheable_tokens, extends nothing; nothing changed.
    rejected_too_large,  ///< Alone larger than max_bytes; nothing changed.
  };

  /// Per-insert options for insert().
  struct InsertOptions {
    bool pinned = false;            ///< Exempt from LRU, byte and TTL eviction.
    std::optional<duration> ttl{};  ///< Idle TTL of this entry (default: Options::ttl).
    namespace_id ns = 0;            ///< Namespace; entries of other namespaces never interact.
    std::size_t fed_images = 0;     ///< Stored as Entry::fed_images.
    std::size_t fed_audios = 0;     ///< Stored as Entry::fed_audios.
  };

  /// Seed-style constructor (exact-prefix mode, no byte budget).
  PromptCachePool(std::size_t max_entries, duration ttl, std::size_t min_cacheable_tokens,
                  Clock clock = Clock{})
      : PromptCachePool(Options{max_entries, ttl, min_cacheable_tokens}, std::move(clock)) {}

  /// Pool with the given options. Throws std::invalid_argument if max_bytes != 0 while
  /// CacheBytes is unsized_caches (every entry would weigh 0, silently ignoring the budget).
  explicit PromptCachePool(Options options, Clock clock = Clock{}, CacheBytes cache_bytes = {})
      : options_(options), clock_(std::move(clock)), cache_bytes_(std::move(cache_bytes)) {
    if (std::is_same_v<CacheBytes, unsized_caches> && options_.max_bytes != 0) {
      throw std::invalid_argument("PromptCachePool: max_bytes needs a CacheBytes functor");
    }
    classes_.push_back(TtlClass{options_.ttl, nullptr, nullptr});
  }

  /// 16 entries, 5 minute idle TTL, 8-token minimum (the seed defaults).
  static PromptCachePool with_defaults() { return PromptCachePool(Options{}); }

  PromptCachePool(const PromptCachePool&) = delete;
  PromptCachePool& operator=(const PromptCachePool&) = delete;
  PromptCachePool(PromptCachePool&&) = delete;
  PromptCachePool& operator=(PromptCachePool&&) = delete;

  /// Releases every entry (snapshots held by callers stay valid). O(entries + nodes).
  ~PromptCachePool() {
    for (auto& [ns, root] : roots_)
      drop_tree(root.get());
    free_retired(std::exchange(retired_, nullptr));
  }

  /// The options the pool was built with.
  [[nodiscard]] const Options& options() const noexcept { return options_; }

  /// Evicts expired entries, then returns the best stored entry for `ids` in namespace `ns`
  /// (exact-prefix: the longest stored prefix; common-prefix: the longest common prefix,
  /// preferring no trim, then the shortest entry, then the most recent) and refreshes its
  /// recency. Empty query, no match or a match below min_match_tokens: nullopt.
  /// O(|ids| + expired) (common-prefix mode: + O(depth x log fan-out) to re-sort the hit's
  /// recency); invalidates nothing a caller holds.
  std::optional<Hit> find_longest_prefix(std::span<const Token> ids, namespace_id ns = 0) {
    const time_point now = clock_.now();
    expire(now);
    ++stats_.lookups;
    stats_.query_tokens += ids.size();
    std::optional<Hit> result;
    if (!ids.empty()) {
      const std::size_t limit = options_.keep_one_token ? ids.size() - 1 : ids.size();
      Match m = options_.match == MatchMode::exact_prefix ? match_exact(ids, limit, ns)
                                                          : match_common(ids, limit, ns);
      if (m.slot != nullptr && m.matched > 0 && m.matched >= options_.min_match_tokens) {
        touch(m.slot, now);
        ++stats_.hits;
        stats_.matched_tokens += m.matched;
        result.emplace(Hit{m.slot->entry, m.matched});
      }
    }
    release_retired();
    return result;
  }

  /// Seed-style insert: insert(ids, caches, {pinned, default ttl, namespace 0, media counts}).
  InsertResult insert_or_update(std::vector<Token> ids, std::vector<LayerCache> caches,
                                std::size_t fed_images, std::size_t fed_audios, bool pinned) {
    InsertOptions o;
    o.pinned = pinned;
    o.fed_images = fed_images;
    o.fed_audios = fed_audios;
    return insert(std::move(ids), std::move(caches), o);
  }

  /// Stores the state for `ids`: updates an entry with equal ids (pinned if either is),
  /// else replaces the deepest unpinned entry whose ids are a proper prefix (extended),
  /// else adds an entry (inserted); then LRU-evicts unpinned entries beyond max_entries
  /// and max_bytes (the new entry too, if nothing else is evictable). Expired entries are
  /// not collected here (lookups and evict_expired do that), as in the seed. In
  /// common-prefix mode an extension also retires every other unpinned strict prefix of the
  /// new ids (counted as `superseded`): the new entry serves them all by trimming, so they
  /// would only hold budget. Strong exception guarantee: if anything throws, the pool is
  /// unchanged. O(|ids| + |caches| + evicted).
  InsertResult insert(std::vector<Token> ids, std::vector<LayerCache> caches,
                      const InsertOptions& options = {}) {
    const std::size_t bytes = entry_bytes(caches);
    auto entry = std::make_shared<Entry>(
        Entry{std::move(ids), std::move(caches), options.fed_images, options.fed_audios, false});
    const InsertResult r = insert_prepared(entry, bytes, options);
    release_retired();
    return r;
  }

  /// Removes every unpinned entry idle for at least its TTL; returns how many. O(expired).
  std::size_t evict_expired() {
    const std::size_t n = expire(clock_.now());
    release_retired();
    return n;
  }

  /// Removes the entry with exactly `ids` in `ns` (pinned or not). O(|ids|).
  bool erase(std::span<const Token> ids, namespace_id ns = 0) {
    Slot* s = find_slot(ids, ns);
    if (s == nullptr) return false;
    remove_slot(s, Reason::explicit_removal);
    release_retired();
    return true;
  }

  /// Removes every entry of namespace `ns`; returns how many. O(entries + nodes of `ns`).
  std::size_t erase_namespace(namespace_id ns) {
    auto it = roots_.find(ns);
    if (it == roots_.end()) return 0;
    const std::size_t n = drop_tree(it->second.get());
    roots_.erase(it);
    if (ns == 0) root0_ = nullptr;
    release_retired();
    return n;
  }

  /// Removes every entry of every namespace. O(entries + nodes).
  void clear() {
    for (auto& [ns, root] : roots_)
      drop_tree(root.get());
    roots_.clear();
    root0_ = nullptr;
    release_retired();
  }

  /// Pins the entry with exactly `ids`: exempt from LRU, byte and TTL eviction. O(|ids|).
  /// Returns false if there is no such entry. Snapshots are not rewritten (Entry::pinned).
  bool pin(std::span<const Token> ids, namespace_id ns = 0) {
    Slot* s = find_slot(ids, ns);
    if (s == nullptr) return false;
    if (!s->pinned) {
      list_unlink(s);
      s->pinned = true;
      ++stats_.pinned_entries;
    }
    return true;
  }

  /// Unpins the entry with exactly `ids`; it counts as used now (most recent, fresh TTL),
  /// then budgets are enforced. Returns false if there is no such entry. O(|ids| + evicted).
  bool unpin(std::span<const Token> ids, namespace_id ns = 0) {
    Slot* s = find_slot(ids, ns);
    if (s == nullptr) return false;
    if (s->pinned) {
      s->pinned = false;
      --stats_.pinned_entries;
      s->last_used = clock_.now();
      s->seq = ++seq_;
      list_push_back(s);
      if (options_.match == MatchMode::common_prefix) propagate(s->node);
      enforce_budgets();
      release_retired();
    }
    return true;
  }

  /// Whether an entry with exactly `ids` exists and is pinned. O(|ids|).
  [[nodiscard]] bool is_pinned(std::span<const Token> ids, namespace_id ns = 0) const {
    const Slot* s = find_slot(ids, ns);
    return s != nullptr && s->pinned;
  }

  /// The entry with exactly `ids`, without evicting or refreshing anything (it may be
  /// past its TTL but not yet collected); nullptr if absent. O(|ids|).
  [[nodiscard]] std::shared_ptr<const Entry> find_exact(std::span<const Token> ids,
                                                        namespace_id ns = 0) const {
    const Slot* s = find_slot(ids, ns);
    return s == nullptr ? nullptr : s->entry;
  }

  /// Number of stored entries (all namespaces). O(1).
  [[nodiscard]] std::size_t size() const noexcept { return stats_.entries; }
  /// Whether no entry is stored. O(1).
  [[nodiscard]] bool empty() const noexcept { return stats_.entries == 0; }
  /// Sum of stored entry sizes per CacheBytes. O(1).
  [[nodiscard]] std::size_t bytes() const noexcept { return stats_.bytes; }

  /// Counters and gauges. O(1).
  [[nodiscard]] PoolStats stats() const noexcept { return stats_; }
  /// Zeroes the counters (gauges keep their values). O(1).
  void reset_stats() noexcept {
    PoolStats fresh;
    fresh.entries = stats_.entries;
    fresh.pinned_entries = stats_.pinned_entries;
    fresh.bytes = stats_.bytes;
    stats_ = fresh;
  }

  /// The size of an entry holding `caches` (sum of CacheBytes over them). O(|caches|).
  [[nodiscard]] std::size_t entry_bytes(const std::vector<LayerCache>& caches) const {
    std::size_t total = 0;
    for (const LayerCache& c : caches)
      total += static_cast<std::size_t>(cache_bytes_(c));
    return total;
  }

  /// Memory of the index vs the ids it indexes (LayerCache payloads excluded). O(nodes).
  [[nodiscard]] PoolMemory memory_usage() const {
    PoolMemory m;
    m.index_bytes = sizeof(*this) + classes_.capacity() * sizeof(TtlClass) +
                    roots_.bucket_count() * sizeof(void*) +
                    roots_.size() * (sizeof(std::pair<namespace_id, std::unique_ptr<Node>>) +
                                     2 * sizeof(void*));
    for (const auto& [ns, root] : roots_) {
      visit(root.get(), [&](const Node* n) {
        m.index_bytes += sizeof(Node) + n->children.table_bytes();
        if (n->slot) {
          // The record, plus the Entry object and its shared_ptr control block (not its ids).
          m.index_bytes += sizeof(Slot) + sizeof(Entry) + 2 * sizeof(void*) + sizeof(long) * 2;
          m.id_bytes += n->slot->entry->ids.size() * sizeof(Token);
        }
      });
    }
    return m;
  }

  /// Verifies every structural invariant (tree shape, labels, lists, gauges); throws
  /// std::logic_error describing the first violation. O(entries + nodes). For tests.
  void check_invariants() const {
    std::size_t entries = 0, pinned = 0, bytes = 0;
    for (const auto& kv : roots_) {
      const namespace_id nsv = kv.first;
      const Node* root = kv.second.get();
      require(root->parent == nullptr && !root->slot && root->depth == 0, "root shape");
      require(nsv != 0 || root == root0_, "root0 cache");
      visit(root, [&](const Node* n) {
        n->children.for_each([&](const Node* c) {
          require(c->parent == n, "parent link");
          require(c->label_len > 0 && c->depth == n->depth + c->label_len, "depth");
          require(c->label[0] == c->first && n->children.find(c->first) == c, "first token");
        });
        if (options_.match == MatchMode::common_prefix) {
          require(n->heap.size() == n->children.size(), "heap size");
          for (std::size_t i = 0; i < n->heap.size(); ++i) {
            const HeapItem& it = n->heap[i];
            require(it.node->parent == n && it.node->heap_pos == i, "heap links");
            require(it.len == it.node->best->len && it.seq == it.node->best->seq, "heap keys");
            require(i == 0 || !item_better(it, n->heap[(i - 1) / kArity]), "heap order");
          }
        } else {
          require(n->heap.empty(), "heap outside common-prefix mode");
        }
        if (n == root) return;
        require(n->slot || n->children.size() >= 2, "unmerged or empty node");
        const Entry* o = n->owner;
        require(o != nullptr && o->ids.size() >= n->depth, "owner too short");
        require(n->label == o->ids.data() + (n->depth - n->label_len), "label not in owner");
        // The owner must live in this node's subtree.
        bool owned = false;
        visit(n, [&](const Node* d) { owned = owned || (d->slot && d->slot->entry.get() == o); });
        require(owned, "owner outside subtree");
        if (n->slot) {
          const Slot* s = n->slot.get();
          ++entries;
          bytes += s->bytes;
          require(s->node == n && s->ns == nsv, "slot back link");
          require(s->entry->ids.size() == n->depth, "entry length");
          const Node* p = n;
          std::size_t end = n->depth;
          while (p->parent != nullptr) {
            require(
                std::equal(p->label, p->label + p->label_len,
                           s->entry->ids.begin() + static_cast<std::ptrdiff_t>(end - p->label_len)),
                "path differs from ids");
            end -= p->label_len;
            p = p->parent;
          }
          if (s->pinned) ++pinned;
        }
        if (options_.match == MatchMode::common_prefix) {
          const Slot* b = n->slot.get();
          n->children.for_each([&](const Node* c) {
            if (b == nullptr || better(c->best, b)) b = c->best;
          });
          require(n->best == b, "common-prefix aggregate");
        }
      });
    }
    std::size_t listed = 0;
    for (const TtlClass& cls : classes_) {
      const Slot* prev = nullptr;
      for (const Slot* s = cls.head; s != nullptr; s = s->next) {
        require(!s->pinned && s->prev == prev, "list links");
        require(prev == nullptr || prev->seq < s->seq, "list order");
        require(&classes_[s->ttl_class] == &cls, "list class");
        prev = s;
        ++listed;
      }
      require(cls.tail == prev, "list tail");
    }
    require(entries == stats_.entries && pinned == stats_.pinned_entries, "entry gauges");
    require(listed == entries - pinned, "listed entries");
    require(bytes == stats_.bytes, "byte gauge");
    require(retired_ == nullptr, "retired list");
  }

 private:
  friend class SynchronizedPromptCachePool<LayerCache, Token, Clock, CacheBytes>;

  struct Node;

  // The pool's record of one stored entry.
  struct Slot {
    std::shared_ptr<const Entry> entry;
    Node* node = nullptr;
    Slot* prev = nullptr;  // recency list of its TTL class (unpinned entries only)
    Slot* next = nullptr;  // ... and the retired chain once removed
    time_point last_used{};
    std::uint64_t seq = 0;  // global touch order: a larger seq is more recent
    std::size_t len = 0;    // entry->ids.size(), kept here to spare a dereference
    std::size_t ttl_class = 0;
    std::size_t bytes = 0;
    namespace_id ns = 0;
    bool pinned = false;
  };

  // A child in its parent's heap, with the key of its best slot copied in, so sifting reads
  // the (mostly cached) heap array instead of chasing two pointers per comparison.
  struct HeapItem {
    std::size_t len;
    std::uint64_t seq;
    Node* node;
  };

  struct Node {
    Node* parent = nullptr;
    const Token* label = nullptr;  // points into owner->ids
    std::size_t label_len = 0;
    std::size_t depth = 0;         // tokens from the root through the end of the label
    const Entry* owner = nullptr;  // some entry in this subtree whose ids back the label
    Token first{};                 // label[0], kept here so teardown never reads freed ids
    std::unique_ptr<Slot> slot;    // the entry whose ids end exactly here
    Slot* best = nullptr;          // common-prefix mode: shortest, then most recent slot below
    std::vector<HeapItem> heap;    // common-prefix mode: children as a binary heap by best
    std::size_t heap_pos = 0;      // index in the parent's heap
    detail::PoolChildMap<Token, Node> children;
  };

  struct TtlClass {
    duration ttl;
    Slot* head;  // least recently used
    Slot* tail;  // most recently used
  };

  enum class Reason { lru, ttl, bytes, explicit_removal, superseded, replaced };

  struct Match {
    Slot* slot = nullptr;
    std::size_t matched = 0;
  };

  static void require(bool ok, const char* what) {
    if (!ok) throw std::logic_error(std::string("PromptCachePool invariant: ") + what);
  }

  template <class F>
  static void visit(const Node* root, F&& f) {
    // Iterative: a lineage of single-token turns can make the tree as deep as the ids are long.
    std::vector<const Node*> stack{root};
    while (!stack.empty()) {
      const Node* n = stack.back();
      stack.pop_back();
      f(n);
      n->children.for_each([&](const Node* c) { stack.push_back(c); });
    }
  }

  static bool equal_tokens(const Token* a, const Token* b, std::size_t n) noexcept {
    return std::memcmp(a, b, n * sizeof(Token)) == 0;
  }

  // Length of the common prefix of a[0, n) and b[0, n). memcmp only says "differs", so the
  // mismatch is narrowed down through shrinking blocks: every token is read about once, in
  // memcmp-sized strides, whether the edge matches fully or diverges deep inside.
  static std::size_t common_length(const Token* a, const Token* b, std::size_t n) noexcept {
    std::size_t i = 0;
    for (const std::size_t block : {std::size_t{1024}, std::size_t{128}}) {
      while (n - i >= block && equal_tokens(a + i, b + i, block))
        i += block;
    }
    // Within the last 128 tokens: 8 at a time without a call (the loop vectorizes).
    using U = std::make_unsigned_t<Token>;
    while (n - i >= 8) {
      U diff = 0;
      for (std::size_t j = 0; j < 8; ++j) {
        diff = static_cast<U>(diff | (static_cast<U>(a[i + j]) ^ static_cast<U>(b[i + j])));
      }
      if (diff != 0) break;
      i += 8;
    }
    while (i < n && a[i] == b[i])
      ++i;
    return i;
  }

  static bool better(const Slot* a, const Slot* b) noexcept {
    return a->len < b->len || (a->len == b->len && a->seq > b->seq);
  }

  Node* root_of(namespace_id ns) const noexcept {
    if (ns == 0) return root0_;
    auto it = roots_.find(ns);
    return it == roots_.end() ? nullptr : it->second.get();
  }

  Slot* find_slot(std::span<const Token> ids, namespace_id ns) const noexcept {
    const Node* node = root_of(ns);
    if (node == nullptr || ids.empty()) return nullptr;
    std::size_t pos = 0;
    while (pos < ids.size()) {
      const Node* c = node->children.find(ids[pos]);
      if (c == nullptr || c->depth > ids.size() ||
          !equal_tokens(c->label, ids.data() + pos, c->label_len)) {
        return nullptr;
      }
      node = c;
      pos = c->depth;
    }
    return node->slot.get();
  }

  Match match_exact(std::span<const Token> q, std::size_t limit, namespace_id ns) const noexcept {
    Match m;
    const Node* node = root_of(ns);
    if (node == nullptr) return m;
    std::size_t pos = 0;
    while (pos < limit) {
      const Node* c = node->children.find(q[pos]);
      if (c == nullptr || c->depth > limit ||
          !equal_tokens(c->label, q.data() + pos, c->label_len)) {
        break;
      }
      node = c;
      pos = c->depth;
      if (c->slot) m.slot = c->slot.get();
    }
    if (m.slot != nullptr) m.matched = m.slot->len;
    return m;
  }

  Match match_common(std::span<const Token> q, std::size_t limit, namespace_id ns) const noexcept {
    Match m;
    const Node* node = root_of(ns);
    if (node == nullptr) return m;
    std::size_t pos = 0;
    while (pos < limit) {
      const Node* c = node->children.find(q[pos]);
      if (c == nullptr) break;
      const std::size_t k =
          common_length(c->label, q.data() + pos, std::min(c->label_len, limit - pos));
      if (k < c->label_len) {  // the query leaves the tree (or hits the cap) inside this edge
        m.slot = c->best;
        m.matched = pos + k;
        return m;
      }
      node = c;
      pos = c->depth;
    }
    if (node->parent != nullptr) {
      m.slot = node->best;
      m.matched = pos;
    }
    return m;
  }

  // ---- recency lists ------------------------------------------------------------------

  void list_unlink(Slot* s) noexcept {
    TtlClass& cls = classes_[s->ttl_class];
    (s->prev ? s->prev->next : cls.head) = s->next;
    (s->next ? s->next->prev : cls.tail) = s->prev;
    s->prev = s->next = nullptr;
  }

  void list_push_back(Slot* s) noexcept {
    TtlClass& cls = classes_[s->ttl_class];
    s->prev = cls.tail;
    s->next = nullptr;
    (cls.tail ? cls.tail->next : cls.head) = s;
    cls.tail = s;
  }

  void touch(Slot* s, time_point now) noexcept {
    s->last_used = now;
    s->seq = ++seq_;
    if (!s->pinned) {
      list_unlink(s);
      list_push_back(s);
    }
    if (options_.match == MatchMode::common_prefix) propagate(s->node);
  }

  // ---- common-prefix aggregates ---------------------------------------------------------
  // Every node knows the best slot of its subtree (shortest, then most recent) and keeps its
  // children in a binary heap ordered by their best, so any change costs O(log fan-out) per
  // level up to the root, removals included.

  static bool item_better(const HeapItem& a, const HeapItem& b) noexcept {
    return a.len < b.len || (a.len == b.len && a.seq > b.seq);
  }

  static HeapItem item_of(Node* c) noexcept { return HeapItem{c->best->len, c->best->seq, c}; }

  // Restores the heap order around position i (the item there changed its key). A 4-ary
  // heap: a touch only sifts up, and half as many levels as a binary heap.
  static constexpr std::size_t kArity = 4;
  static void heap_fix(Node* p, std::size_t i) noexcept {
    std::vector<HeapItem>& h = p->heap;
    const HeapItem c = h[i];
    while (i > 0) {
      const std::size_t up = (i - 1) / kArity;
      if (!item_better(c, h[up])) break;
      h[i] = h[up];
      h[i].node->heap_pos = i;
      i = up;
    }
    const std::size_t n = h.size();
    while (true) {
      const std::size_t first = kArity * i + 1;
      if (first >= n) break;
      std::size_t b = first;
      const std::size_t last = std::min(first + kArity, n);
      for (std::size_t k = first + 1; k < last; ++k) {
        if (item_better(h[k], h[b])) b = k;
      }
      if (!item_better(h[b], c)) break;
      h[i] = h[b];
      h[i].node->heap_pos = i;
      i = b;
    }
    h[i] = c;
    c.node->heap_pos = i;
  }

  // Child c's best (or its key) changed: refresh its item and reposition it.
  static void heap_update(Node* p, Node* c) noexcept {
    p->heap[c->heap_pos] = item_of(c);
    heap_fix(p, c->heap_pos);
  }

  // `now` takes the heap position of `before` (a split or merge swapping one child for another).
  static void heap_substitute(Node* p, Node* before, Node* now) noexcept {
    now->heap_pos = before->heap_pos;
    p->heap[now->heap_pos] = item_of(now);
  }

  // Adds child c; requires reserved capacity (phase 1 of insert).
  static void heap_push(Node* p, Node* c) noexcept {
    p->heap.push_back(item_of(c));
    c->heap_pos = p->heap.size() - 1;
    heap_fix(p, c->heap_pos);
  }

  static void heap_erase(Node* p, Node* c) noexcept {
    std::vector<HeapItem>& h = p->heap;
    const std::size_t i = c->heap_pos;
    const HeapItem last = h.back();
    h.pop_back();
    if (last.node != c) {
      h[i] = last;
      last.node->heap_pos = i;
      heap_fix(p, i);
    }
  }

  static Slot* compute_best(const Node* y) noexcept {
    Slot* b = y->slot.get();
    if (!y->heap.empty() && (b == nullptr || better(y->heap[0].node->best, b))) {
      b = y->heap[0].node->best;
    }
    return b;
  }

  // The subtree of x changed: recompute best from x up, fixing each parent's heap.
  static void propagate(Node* x) noexcept {
    for (Node* y = x; y->parent != nullptr; y = y->parent) {
      y->best = compute_best(y);
      heap_update(y->parent, y);
    }
  }

  Slot* lru_victim() const noexcept {
    Slot* victim = nullptr;
    for (const TtlClass& cls : classes_) {
      if (cls.head != nullptr && (victim == nullptr || cls.head->seq < victim->seq))
        victim = cls.head;
    }
    return victim;
  }

  std::size_t expire(time_point now) noexcept {
    std::size_t n = 0;
    for (std::size_t i = 0; i < classes_.size(); ++i) {
      while (classes_[i].head != nullptr && now - classes_[i].head->last_used >= classes_[i].ttl) {
        remove_slot(classes_[i].head, Reason::ttl);
        ++n;
      }
    }
    return n;
  }

  void enforce_budgets() noexcept {
    while (stats_.entries > options_.max_entries) {
      Slot* v = lru_victim();
      if (v == nullptr) break;
      remove_slot(v, Reason::lru);
    }
    while (options_.max_bytes != 0 && stats_.bytes > options_.max_bytes) {
      Slot* v = lru_victim();
      if (v == nullptr) break;
      remove_slot(v, Reason::bytes);
    }
  }

  // ---- removal --------------------------------------------------------------------------

  void retire(std::unique_ptr<Slot> s) noexcept {
    Slot* raw = s.release();
    raw->prev = nullptr;
    raw->next = retired_;
    retired_ = raw;
  }

  // Frees removed records. Deferred so SynchronizedPromptCachePool can run the LayerCache
  // destructors of the last snapshot references after releasing its lock.
  void release_retired() noexcept {
    if (defer_release_) return;
    while (retired_ != nullptr) {
      Slot* s = retired_;
      retired_ = s->next;
      delete s;
    }
  }

  Slot* take_retired() noexcept { return std::exchange(retired_, nullptr); }

  static void free_retired(Slot* chain) noexcept {
    while (chain != nullptr) {
      Slot* s = chain;
      chain = s->next;
      delete s;
    }
  }

  void count_removal(Reason why) noexcept {
    switch (why) {
      case Reason::lru:
        ++stats_.evicted_lru;
        break;
      case Reason::ttl:
        ++stats_.evicted_ttl;
        break;
      case Reason::bytes:
        ++stats_.evicted_bytes;
        break;
      case Reason::explicit_removal:
        ++stats_.evicted_explicit;
        break;
      case Reason::superseded:
        ++stats_.superseded;
        break;
      case Reason::replaced:
        break;
    }
  }

  // Unlinks one entry and repairs the tree: prunes nodes left without entries, merges a
  // node left with one child into it, and re-points labels that lived in the entry's ids.
  void remove_slot(Slot* s, Reason why) noexcept {
    Node* n = s->node;
    const Entry* old = s->entry.get();
    if (s->pinned) {
      --stats_.pinned_entries;
    } else {
      list_unlink(s);
    }
    --stats_.entries;
    stats_.bytes -= s->bytes;
    count_removal(why);
    retire(std::move(n->slot));

    const bool common = options_.match == MatchMode::common_prefix;
    Node* x = n;
    while (x->parent != nullptr && !x->slot && x->children.empty()) {
      Node* p = x->parent;
      p->children.erase(x->first);
      if (common) heap_erase(p, x);
      delete x;
      x = p;
    }
    Node* lowest = x;  // the deepest node whose subtree lost the entry
    if (x->parent != nullptr && !x->slot && x->children.size() == 1) {
      Node* c = x->children.any();
      Node* p = x->parent;
      c->label_len += x->label_len;
      c->label = c->owner->ids.data() + (c->depth - c->label_len);
      c->first = x->first;
      c->parent = p;
      p->children.replace(x->first, c);
      if (common) heap_substitute(p, x, c);
      x->children = detail::PoolChildMap<Token, Node>{};
      delete x;
      x = p;
      lowest = c;
    }
    for (Node* y = x; y->parent != nullptr; y = y->parent) {
      if (y->owner == old) {
        const Entry* o = y->slot ? y->slot->entry.get() : y->children.any()->owner;
        y->owner = o;
        y->label = o->ids.data() + (y->depth - y->label_len);
      }
    }
    if (common) propagate(lowest);
    if (x->parent == nullptr && x->children.empty() && s->ns != 0) {
      roots_.erase(s->ns);  // an empty tenant costs nothing
    }
  }

  // Removes every entry below `root` (root stays, childless). Returns how many. The nodes
  // are threaded into a stack through their (no longer needed) parent links: no allocation,
  // no recursion, O(nodes + child tables).
  std::size_t drop_tree(Node* root) noexcept {
    std::size_t n = 0;
    Node* stack = nullptr;
    auto push = [&stack](Node* c) {
      c->parent = stack;
      stack = c;
    };
    root->children.for_each(push);
    root->children = detail::PoolChildMap<Token, Node>{};
    root->heap.clear();
    while (stack != nullptr) {
      Node* x = stack;
      stack = x->parent;
      x->children.for_each(push);
      if (x->slot) {
        Slot* s = x->slot.get();
        if (s->pinned) {
          --stats_.pinned_entries;
        } else {
          list_unlink(s);
        }
        --stats_.entries;
        stats_.bytes -= s->bytes;
        ++stats_.evicted_explicit;
        ++n;
        retire(std::move(x->slot));
      }
      delete x;
    }
    return n;
  }

  // ---- insert ---------------------------------------------------------------------------

  // The core of insert, after the entry is built and sized (callers may do that unlocked).
  // Takes ownership of `entry` only when it is stored.
  InsertResult insert_prepared(std::shared_ptr<Entry>& entry, std::size_t bytes,
                               const InsertOptions& o) {
    const time_point now = clock_.now();
    const std::vector<Token>& ids = entry->ids;
    const std::size_t n = ids.size();
    if (n == 0) {
      ++stats_.rejected_empty;
      return InsertResult::rejected_empty;
    }

    // Walk (read-only): where the ids end or leave the tree, and which entries are prefixes.
    enum class Where { at_node, new_leaf, split, new_root };
    Where where = Where::new_root;
    Node* node = root_of(o.ns);
    Node* child = nullptr;
    std::size_t pos = 0, common = 0;
    Slot* exact = nullptr;
    Slot* lineage = nullptr;  // deepest unpinned proper prefix
    bool any_prefix = false;
    if (node != nullptr) {
      while (true) {
        if (node->slot) {
          any_prefix = true;
          if (pos == n) {
            exact = node->slot.get();
          } else if (!node->slot->pinned) {
            lineage = node->slot.get();
          }
        }
        if (pos == n) {
          where = Where::at_node;
          break;
        }
        child = node->children.find(ids[pos]);
        if (child == nullptr) {
          where = Where::new_leaf;
          break;
        }
        common = common_length(child->label, ids.data() + pos, std::min(child->label_len, n - pos));
        if (common < child->label_len) {
          where = Where::split;
          break;
        }
        node = child;
        pos = child->depth;
      }
    }

    if (n < options_.min_cacheable_tokens && !any_prefix) {
      ++stats_.rejected_too_short;
      return InsertResult::rejected_too_short;
    }
    if (options_.max_bytes != 0 && bytes > options_.max_bytes) {
      ++stats_.rejected_too_large;
      return InsertResult::rejected_too_large;
    }

    // Phase 1: every allocation. Nothing observable changes until phase 2.
    const duration ttl = o.ttl.value_or(options_.ttl);
    std::size_t ttl_class = 0;
    while (ttl_class < classes_.size() && classes_[ttl_class].ttl != ttl)
      ++ttl_class;
    if (ttl_class == classes_.size()) {
      classes_.push_back(TtlClass{ttl, nullptr, nullptr});  // an unused class is harmless
    }
    const bool common_mode = options_.match == MatchMode::common_prefix;
    auto slot = std::make_unique<Slot>();
    std::unique_ptr<Node> leaf, mid;
    bool created_root = false;
    try {
      if (where == Where::new_root) {
        auto root = std::make_unique<Node>();
        root->children.reserve(1);
        if (common_mode) root->heap.reserve(1);
        node = root.get();
        roots_.emplace(o.ns, std::move(root));  // strong guarantee for a single element
        created_root = true;
        if (o.ns == 0) root0_ = node;
        where = Where::new_leaf;
      } else if (where == Where::new_leaf) {
        node->children.reserve(1);
        if (common_mode && node->heap.size() == node->heap.capacity()) {
          node->heap.reserve(std::max<std::size_t>(4, 2 * node->heap.capacity()));  // geometric
        }
      }
      if (where == Where::split) {
        mid = std::make_unique<Node>();
        mid->children.reserve(pos + common == n ? 1 : 2);
        if (common_mode) mid->heap.reserve(pos + common == n ? 1 : 2);
      }
      if (where == Where::new_leaf || (where == Where::split && pos + common < n)) {
        leaf = std::make_unique<Node>();
      }
    } catch (...) {
      if (created_root) {
        roots_.erase(o.ns);
        if (o.ns == 0) root0_ = nullptr;
      }
      throw;
    }

    // Phase 2: link; nothing below throws.
    const Entry* e = entry.get();
    Slot* s = slot.get();
    entry->pinned = o.pinned || (exact != nullptr && exact->pinned);  // not yet published
    s->entry = std::move(entry);
    s->ttl_class = ttl_class;
    s->len = n;
    s->bytes = bytes;
    s->ns = o.ns;
    s->last_used = now;
    s->seq = ++seq_;
    s->pinned = e->pinned;

    Node* target = node;
    if (where == Where::split) {
      Node* m = mid.release();
      m->parent = node;
      m->label = child->label;
      m->label_len = common;
      m->depth = pos + common;
      m->first = child->first;
      m->owner = child->owner;
      node->children.replace(child->first, m);
      child->label += common;
      child->label_len -= common;
      child->first = child->label[0];
      child->parent = m;
      m->children.insert_reserved(child->first, child);
      if (common_mode) {
        m->best = child->best;  // same key: m takes child's place in node's heap as is
        heap_substitute(node, child, m);
        m->heap.push_back(item_of(child));  // reserved
        child->heap_pos = 0;
      }
      node = m;
      pos = m->depth;
      target = m;
    }
    Node* new_leaf = nullptr;
    if (leaf) {
      Node* l = leaf.release();
      new_leaf = l;
      l->parent = node;
      l->label = e->ids.data() + pos;
      l->label_len = n - pos;
      l->depth = n;
      l->first = e->ids[pos];
      l->owner = e;
      node->children.insert_reserved(l->first, l);
      target = l;
    }
    std::unique_ptr<Slot> replaced;
    if (exact != nullptr) {
      replaced = std::move(target->slot);
      if (replaced->pinned) {
        --stats_.pinned_entries;
      } else {
        list_unlink(replaced.get());
      }
      --stats_.entries;
      stats_.bytes -= replaced->bytes;
    }
    target->slot = std::move(slot);
    s->node = target;
    if (s->pinned) {
      ++stats_.pinned_entries;
    } else {
      list_push_back(s);
    }
    ++stats_.entries;
    stats_.bytes += bytes;
    if (exact != nullptr) {
      // Labels that lived in the replaced entry's ids move to the new, equal ids.
      const Entry* old = replaced->entry.get();
      for (Node* y = target; y->parent != nullptr; y = y->parent) {
        if (y->owner == old) {
          y->owner = e;
          y->label = e->ids.data() + (y->depth - y->label_len);
        }
      }
      retire(std::move(replaced));
    }
    if (common_mode) {
      if (new_leaf != nullptr) {
        new_leaf->best = s;
        heap_push(new_leaf->parent, new_leaf);
      }
      propagate(target);
    }

    InsertResult result = InsertResult::inserted;
    if (exact != nullptr) {
      result = InsertResult::updated;
      ++stats_.updated;
    } else if (lineage != nullptr) {
      result = InsertResult::extended;
      ++stats_.extended;
      if (options_.match == MatchMode::common_prefix) {
        // Every unpinned strict prefix can be served by trimming the new entry.
        for (Node* y = target->parent; y->parent != nullptr;) {
          Node* up = y->parent;
          if (y->slot && !y->slot->pinned && y->slot.get() != lineage) {
            remove_slot(y->slot.get(), Reason::superseded);
          }
          y = up;
        }
      }
      remove_slot(lineage, Reason::replaced);
    } else {
      ++stats_.inserted;
    }
    enforce_budgets();
    return result;
  }

  Options options_;
  Clock clock_;
  CacheBytes cache_bytes_;
  std::unordered_map<namespace_id, std::unique_ptr<Node>> roots_;
  Node* root0_ = nullptr;  // roots_[0], cached: the default namespace skips the hash lookup
  std::vector<TtlClass> classes_;
  std::uint64_t seq_ = 0;
  Slot* retired_ = nullptr;
  bool defer_release_ = false;
  PoolStats stats_;
};

}  // namespace promptcache
#endif  // PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_PROMPT_CACHE_POOL_HPP
// ---- end promptcache/prompt_cache_pool.hpp ----
// ---- begin promptcache/synchronized_prompt_cache_pool.hpp ----
#ifndef PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_SYNCHRONIZED_PROMPT_CACHE_POOL_HPP
#define PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_SYNCHRONIZED_PROMPT_CACHE_POOL_HPP
// promptcache: synchronized_prompt_cache_pool.hpp
// SPDX-License-Identifier: Apache-2.0
//
// PromptCachePool behind one mutex, for servers that call it from several threads. The lock
// covers only the pool's own bookkeeping: sizing an entry (the CacheBytes functor), building
// its snapshot, and destroying the LayerCaches of evicted entries happen outside it.

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <utility>
#include <vector>


namespace promptcache {

/// A thread-safe PromptCachePool: the same operations, each one atomic with respect to the
/// others. Hits are immutable snapshots, so a thread can use its hit while others insert.
/// CacheBytes is called without the lock and must be safe to call concurrently.
template <class LayerCache, std::integral Token = std::uint32_t,
          class Clock = std::chrono::steady_clock, class CacheBytes = unsized_caches>
class SynchronizedPromptCachePool {
 public:
  using pool_type = PromptCachePool<LayerCache, Token, Clock, CacheBytes>;  ///< Wrapped pool.
  using duration = typename pool_type::duration;                            ///< TTL duration.
  using namespace_id = typename pool_type::namespace_id;                    ///< Namespace key.
  using Options = typename pool_type::Options;                              ///< Pool options.
  using Entry = typename pool_type::Entry;                                  ///< Stored entry.
  using Hit = typename pool_type::Hit;                                      ///< Lookup result.
  using InsertResult = typename pool_type::InsertResult;                    ///< Insert outcome.
  using InsertOptions = typename pool_type::InsertOptions;                  ///< Per-insert options.

  /// Seed-style constructor (see PromptCachePool).
  SynchronizedPromptCachePool(std::size_t max_entries, duration ttl,
                              std::size_t min_cacheable_tokens, Clock clock = Clock{})
      : pool_(max_entries, ttl, min_cacheable_tokens, std::move(clock)) {
    pool_.defer_release_ = true;
  }

  /// Pool with the given options (see PromptCachePool).
  explicit SynchronizedPromptCachePool(Options options, Clock clock = Clock{},
                                       CacheBytes cache_bytes = {})
      : pool_(options, std::move(clock), std::move(cache_bytes)) {
    pool_.defer_release_ = true;
  }

  SynchronizedPromptCachePool(const SynchronizedPromptCachePool&) = delete;
  SynchronizedPromptCachePool& operator=(const SynchronizedPromptCachePool&) = delete;

  /// See PromptCachePool::find_longest_prefix. Locks once; evicted entries are released
  /// after unlocking.
  std::optional<Hit> find_longest_prefix(std::span<const Token> ids, namespace_id ns = 0) {
    Retired retired;
    std::lock_guard<std::mutex> lock(mutex_);
    auto hit = pool_.find_longest_prefix(ids, ns);
    retired.chain = pool_.take_retired();
    return hit;
  }

  /// See PromptCachePool::insert. Sizes the caches and builds the snapshot unlocked, then
  /// locks once to link it. Strong exception guarantee.
  InsertResult insert(std::vector<Token> ids, std::vector<LayerCache> caches,
                      const InsertOptions& options = {}) {
    const std::size_t bytes = pool_.entry_bytes(caches);
    auto entry = std::make_shared<Entry>(
        Entry{std::move(ids), std::move(caches), options.fed_images, options.fed_audios, false});
    Retired retired;
    std::lock_guard<std::mutex> lock(mutex_);
    const InsertResult r = pool_.insert_prepared(entry, bytes, options);
    retired.chain = pool_.take_retired();
    return r;
    // A rejected `entry` is destroyed after the lock is released (declared before it).
  }

  /// Seed-style insert (see PromptCachePool::insert_or_update).
  InsertResult insert_or_update(std::vector<Token> ids, std::vector<LayerCache> caches,
                                std::size_t fed_images, std::size_t fed_audios, bool pinned) {
    InsertOptions o;
    o.pinned = pinned;
    o.fed_images = fed_images;
    o.fed_audios = fed_audios;
    return insert(std::move(ids), std::move(caches), o);
  }

  /// See PromptCachePool::evict_expired.
  std::size_t evict_expired() {
    return locked([&] { return pool_.evict_expired(); });
  }
  /// See PromptCachePool::erase.
  bool erase(std::span<const Token> ids, namespace_id ns = 0) {
    return locked([&] { return pool_.erase(ids, ns); });
  }
  /// See PromptCachePool::erase_namespace.
  std::size_t erase_namespace(namespace_id ns) {
    return locked([&] { return pool_.erase_namespace(ns); });
  }
  /// See PromptCachePool::clear.
  void clear() {
    locked([&] {
      pool_.clear();
      return 0;
    });
  }
  /// See PromptCachePool::pin.
  bool pin(std::span<const Token> ids, namespace_id ns = 0) {
    return locked([&] { return pool_.pin(ids, ns); });
  }
  /// See PromptCachePool::unpin.
  bool unpin(std::span<const Token> ids, namespace_id ns = 0) {
    return locked([&] { return pool_.unpin(ids, ns); });
  }
  /// See PromptCachePool::is_pinned.
  [[nodiscard]] bool is_pinned(std::span<const Token> ids, namespace_id ns = 0) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pool_.is_pinned(ids, ns);
  }
  /// See PromptCachePool::find_exact.
  [[nodiscard]] std::shared_ptr<const Entry> find_exact(std::span<const Token> ids,
                                                        namespace_id ns = 0) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pool_.find_exact(ids, ns);
  }
  /// See PromptCachePool::size.
  [[nodiscard]] std::size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pool_.size();
  }
  /// See PromptCachePool::empty.
  [[nodiscard]] bool empty() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pool_.empty();
  }
  /// See PromptCachePool::bytes.
  [[nodiscard]] std::size_t bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pool_.bytes();
  }
  /// See PromptCachePool::stats (one consistent snapshot).
  [[nodiscard]] PoolStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pool_.stats();
  }
  /// See PromptCachePool::reset_stats.
  void reset_stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    pool_.reset_stats();
  }
  /// See PromptCachePool::memory_usage.
  [[nodiscard]] PoolMemory memory_usage() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pool_.memory_usage();
  }
  /// See PromptCachePool::check_invariants (runs under the lock).
  void check_invariants() const {
    std::lock_guard<std::mutex> lock(mutex_);
    pool_.check_invariants();
  }
  /// The options the pool was built with (immutable: no lock needed).
  [[nodiscard]] const Options& options() const noexcept { return pool_.options(); }

 private:
  // Records removed under the lock; freed (with the last references to their LayerCaches)
  // when this object dies, which the declaration order puts after the lock's release.
  struct Retired {
    typename pool_type::Slot* chain = nullptr;
    Retired() = default;
    Retired(const Retired&) = delete;
    Retired& operator=(const Retired&) = delete;
    ~Retired() { pool_type::free_retired(chain); }
  };

  template <class F>
  auto locked(F&& f) {
    Retired retired;
    std::lock_guard<std::mutex> lock(mutex_);
    auto r = f();
    retired.chain = pool_.take_retired();
    return r;
  }

  mutable std::mutex mutex_;
  pool_type pool_;
};

}  // namespace promptcache
#endif  // PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_SYNCHRONIZED_PROMPT_CACHE_POOL_HPP
// ---- end promptcache/synchronized_prompt_cache_pool.hpp ----
// ---- begin promptcache/version.hpp ----
#ifndef PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_VERSION_HPP
#define PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_VERSION_HPP
// promptcache: version.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The single source of the library's version: CMakeLists.txt, the Conan recipe
// and the tests read it from here.

#define PROMPTCACHE_VERSION_MAJOR 0
#define PROMPTCACHE_VERSION_MINOR 1
#define PROMPTCACHE_VERSION_PATCH 0

/// The version as one comparable integer: major * 10000 + minor * 100 + patch.
#define PROMPTCACHE_VERSION \
  (PROMPTCACHE_VERSION_MAJOR * 10000 + PROMPTCACHE_VERSION_MINOR * 100 + PROMPTCACHE_VERSION_PATCH)
#endif  // PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_VERSION_HPP
// ---- end promptcache/version.hpp ----
#endif  // PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_PROMPTCACHE_HPP
// ---- end promptcache/promptcache.hpp ----
