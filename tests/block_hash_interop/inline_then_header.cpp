// A translation unit that inlines xxHash itself (XXH_INLINE_ALL) before
// including block_hash.hpp: the header reuses those copies and leaves the
// inline mode the translation unit asked for in place.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "promptcache/block_hash.hpp"

#include <string_view>
#include <vector>

#include "catch.hpp"

#if !defined(XXH_INLINE_ALL) || !defined(XXH3_64bits)
#error "block_hash.hpp undid this translation unit's own XXH_INLINE_ALL"
#endif

TEST_CASE("XXH_INLINE_ALL first, then block_hash.hpp", "[block_hash][libxxhash]") {
  const std::string_view data = "test data";
  CHECK(XXH3_64bits_withSeed(data.data(), data.size(), 1337) == 13226331709069118873ULL);
  XXH3_state_t state;  // the inline build exposes the state type
  REQUIRE(XXH3_64bits_reset_withSeed(&state, 1337) == XXH_OK);
  REQUIRE(XXH3_64bits_update(&state, data.data(), data.size()) == XXH_OK);
  CHECK(XXH3_64bits_digest(&state) == 13226331709069118873ULL);

  const std::vector<std::uint32_t> tokens{1, 2, 3, 4};
  CHECK(promptcache::local_block_hashes(tokens, 4) ==
        std::vector<std::uint64_t>{14643705804678351452ULL});
}
