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
#pragma once

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
