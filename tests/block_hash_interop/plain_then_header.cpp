// <xxhash.h> included plainly *before* block_hash.hpp: afterwards the XXH
// names must still mean libxxhash's functions and types.
#include <xxhash.h>

#include "promptcache/block_hash.hpp"

#include <string_view>
#include <vector>

#include "catch.hpp"
#include "interop.hpp"

#if defined(XXH_INLINE_ALL) || defined(XXH3_64bits) || defined(XXH3_state_t)
#error "block_hash.hpp changed what <xxhash.h> means in this translation unit"
#endif

TEST_CASE("plain <xxhash.h> first, then block_hash.hpp", "[block_hash][libxxhash]") {
  // The same function as in the libxxhash-only translation unit, not an inline copy.
  CHECK(&XXH3_64bits_withSeed == interop::library_with_seed());

  const std::string_view data = "test data";
  XXH3_state_t* state = XXH3_createState();
  REQUIRE(state != nullptr);
  REQUIRE(XXH3_64bits_reset_withSeed(state, 1337) == XXH_OK);
  REQUIRE(XXH3_64bits_update(state, data.data(), data.size()) == XXH_OK);
  CHECK(interop::digest_via_library(state) == 13226331709069118873ULL);
  XXH3_freeState(state);

  const std::vector<std::uint32_t> tokens{1, 2, 3, 4, 5, 6, 7, 8};
  const auto seq = promptcache::sequence_hashes(promptcache::local_block_hashes(tokens, 4));
  REQUIRE(seq.size() == 2);
  CHECK(seq[0] == 14643705804678351452ULL);
  CHECK(seq[1] == 4945711292740353085ULL);
  CHECK(XXH3_64bits_withSeed(data.data(), data.size(), 1337) ==
        promptcache::detail::xxh3_64(data.data(), data.size(), 1337));
}
