// block_hash.hpp's promise that the span overloads never allocate (local block
// hashes of a token span into a caller's buffer), checked by counting every
// call of the replaced global operator new.
#include <promptcache/block_hash.hpp>

#include <cstdint>
#include <cstdlib>
#include <new>
#include <span>
#include <vector>

#include "catch.hpp"
#include "support/counting_new.hpp"

namespace {
using u32 = std::uint32_t;
using u64 = std::uint64_t;
}  // namespace

TEST_CASE("operator new replacement is active", "[block_hash]") {
  CHECK(test_alloc::replacement_active());
}

TEST_CASE("the span overloads do not allocate", "[block_hash]") {
  std::vector<u32> tokens(4096);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<u32>(i * 2654435761U);
  std::vector<u64> out(4096);
  std::vector<u64> media(32);  // the most a block may carry without a scratch vector
  for (std::size_t i = 0; i < media.size(); ++i)
    media[i] = 1000 - i;
  const std::vector<std::span<const u64>> per_block{{}, media, {}, media};
  const u64 seed = promptcache::block_hash_seed("lora", "salt");

  // Block sizes on both sides of xxh3's seed-only limit (60 tokens) and of
  // the 2 KiB encoding buffer (512 tokens), with and without media / Eagle.
  for (const std::size_t block_size : {std::size_t{1}, std::size_t{16}, std::size_t{60},
                                       std::size_t{64}, std::size_t{512}, std::size_t{1000}}) {
    for (const bool eagle : {false, true}) {
      for (const bool with_media : {false, true}) {
        CAPTURE(block_size, eagle, with_media);
        promptcache::BlockHashOptions options{.seed = seed, .eagle = eagle};
        if (with_media) options.media = per_block;
        const long before = test_alloc::count;
        const std::size_t n = promptcache::local_block_hashes(tokens, block_size, out, options);
        promptcache::detail::local_block_hashes<false>(tokens, block_size, out, options);
        promptcache::sequence_hashes(std::span<const u64>(out).first(n), out, u64{42});
        CHECK(test_alloc::count == before);
        CHECK(n > 0);
      }
    }
  }
}
