// Shared declarations for test_block_hash_libxxhash. Every translation unit
// that includes this has <xxhash.h> in its plain (linked libxxhash) meaning, so
// the XXH3_state_t parameter below must name (and mangle as) the same type in
// all of them; if block_hash.hpp leaked xxHash's inline renaming into a
// translation unit, this executable would not link.
#pragma once

#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace interop {

using SeededHash = XXH64_hash_t (*)(const void*, std::size_t, XXH64_hash_t);

/// &XXH3_64bits_withSeed as seen by a translation unit that only uses libxxhash.
SeededHash library_with_seed();

/// XXH3_64bits_digest(state), called in the libxxhash-only translation unit.
XXH64_hash_t digest_via_library(const XXH3_state_t* state);

}  // namespace interop
