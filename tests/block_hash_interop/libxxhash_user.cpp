// A translation unit that uses libxxhash the ordinary way: plain <xxhash.h>,
// no promptcache header, linked with -lxxhash.
#include <xxhash.h>

#include "interop.hpp"

#if defined(XXH_INLINE_ALL) || defined(XXH3_64bits)
#error "this translation unit must see the plain libxxhash declarations"
#endif

namespace interop {

SeededHash library_with_seed() {
  return &XXH3_64bits_withSeed;
}

XXH64_hash_t digest_via_library(const XXH3_state_t* state) {
  return XXH3_64bits_digest(state);
}

}  // namespace interop
