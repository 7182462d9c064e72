// block_hash.hpp *before* a plain <xxhash.h>: the later include must still
// declare libxxhash's functions and types under their own names.
#include "promptcache/block_hash.hpp"

#include <xxhash.h>

#include <string_view>
#include <vector>

#include "catch.hpp"
#include "interop.hpp"

#if defined(XXH_INLINE_ALL) || defined(XXH3_64bits) || defined(XXH3_state_t)
#error "block_hash.hpp changed what <xxhash.h> means in this translation unit"
#endif

TEST_CASE("block_hash.hpp first, then plain <xxhash.h>", "[block_hash][libxxhash]") {
  CHECK(&XXH3_64bits_withSeed == interop::library_with_seed());

  const std::string_view data = "test data";
  XXH3_state_t* state = XXH3_createState();
  REQUIRE(state != nullptr);
  REQUIRE(XXH3_64bits_reset_withSeed(state, 1337) == XXH_OK);
  REQUIRE(XXH3_64bits_update(state, data.data(), data.size()) == XXH_OK);
  CHECK(interop::digest_via_library(state) == 13226331709069118873ULL);
  XXH3_freeState(state);

  const std::vector<std::uint32_t> tokens{1, 2, 3, 4, 5, 6, 7, 8};
  const auto locals = promptcache::local_block_hashes(tokens, 4);
  REQUIRE(locals.size() == 2);
  CHECK(locals[1] == 16777012769546811212ULL);
  CHECK(XXH3_64bits_withSeed(data.data(), data.size(), 1337) ==
        promptcache::detail::xxh3_64(data.data(), data.size(), 1337));
}
