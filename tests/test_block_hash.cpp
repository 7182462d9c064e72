// Tests for block_hash.hpp: Dynamo's published values, the properties a router
// relies on, the byte-order-independent path, and bad input.
#include "promptcache/block_hash.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "catch.hpp"

// The header must not leave xxHash's inline mode switched on or remap names.
#if defined(XXH_INLINE_ALL) || defined(XXH3_64bits) || defined(XXH3_state_t) || \
    defined(XXH_NAMESPACE)
#error "block_hash.hpp leaked xxHash macros"
#endif

namespace {

using promptcache::BlockHashOptions;
using u32 = std::uint32_t;
using u64 = std::uint64_t;

std::vector<u32> random_tokens(std::size_t n, u32 seed) {
  std::mt19937 gen(seed);
  std::vector<u32> tokens(n);
  for (auto& t : tokens)
    t = static_cast<u32>(gen());
  return tokens;
}

// The definition, spelled out: xxh3 of the LE token bytes then the sorted LE
// media bytes, through the plain one-shot XXH3_64bits_withSeed.
u64 reference_hash(std::span<const u32> window, std::vector<u64> media, u64 seed) {
  std::sort(media.begin(), media.end());
  std::vector<unsigned char> bytes(window.size() * 4 + media.size() * 8);
  promptcache::detail::encode_le32(window, bytes.data());
  promptcache::detail::encode_le64(media, bytes.data() + window.size() * 4);
  return promptcache::detail::xxh3_64(bytes.data(), bytes.size(), seed);
}

}  // namespace

TEST_CASE("Dynamo's known values", "[block_hash]") {
  const std::string_view data = "test data";
  CHECK(promptcache::detail::xxh3_64(data.data(), data.size(), 1337) == 13226331709069118873ULL);

  const std::vector<u32> tokens{1, 2, 3, 4, 5, 6, 7, 8};
  const auto locals = promptcache::local_block_hashes(tokens, 4);
  REQUIRE(locals.size() == 2);
  CHECK(locals[0] == 14643705804678351452ULL);
  CHECK(locals[1] == 16777012769546811212ULL);

  const auto seq = promptcache::sequence_hashes(locals);
  REQUIRE(seq.size() == 2);
  CHECK(seq[0] == 14643705804678351452ULL);
  CHECK(seq[1] == 4945711292740353085ULL);
  CHECK(promptcache::sequence_hash(locals[0], locals[1]) == 4945711292740353085ULL);

  // The same through the byte-order-independent path.
  std::vector<u64> portable(2);
  CHECK(promptcache::detail::local_block_hashes<false>(tokens, 4, portable, {}) == 2);
  CHECK(portable == locals);
}

TEST_CASE("block_hash_seed: LoRA name and cache salt", "[block_hash]") {
  using promptcache::block_hash_seed;
  using promptcache::detail::xxh3_64;
  CHECK(block_hash_seed() == 1337);
  CHECK(block_hash_seed("", "") == 1337);
  CHECK(promptcache::block_hash_default_seed == 1337);

  const std::string_view lora = "my-adapter";
  const std::string_view salt = "tenant-42";
  const u64 lora_part = xxh3_64(lora.data(), lora.size());
  const u64 salt_part = xxh3_64(salt.data(), salt.size(), 1);
  CHECK(block_hash_seed(lora) == u64{1337} + lora_part);
  CHECK(block_hash_seed("", salt) == u64{1337} + salt_part);
  CHECK(block_hash_seed(lora, salt) == u64{1337} + lora_part + salt_part);
  CHECK(block_hash_seed(lora, "") == block_hash_seed(lora));
  // The salt is hashed with seed 1, not like a LoRA name.
  CHECK(block_hash_seed("", salt) != block_hash_seed(salt, ""));
}

TEST_CASE("a LoRA name or a cache salt changes every block hash", "[block_hash]") {
  const auto tokens = random_tokens(16 * 20 + 5, 7);
  const auto plain = promptcache::local_block_hashes(tokens, 16);
  REQUIRE(plain.size() == 20);
  for (const auto& seed :
       {promptcache::block_hash_seed("lora-a"), promptcache::block_hash_seed("", "salt"),
        promptcache::block_hash_seed("lora-a", "salt")}) {
    const auto seeded = promptcache::local_block_hashes(tokens, 16, {.seed = seed});
    REQUIRE(seeded.size() == plain.size());
    for (std::size_t i = 0; i < plain.size(); ++i) {
      CAPTURE(seed, i);
      CHECK(seeded[i] != plain[i]);
      CHECK(seeded[i] == reference_hash(std::span(tokens).subspan(i * 16, 16), {}, seed));
    }
  }
}

TEST_CASE("media hashes: appended sorted, in any order", "[block_hash]") {
  const auto tokens = random_tokens(3 * 8, 11);
  std::vector<u64> media{0xffffffffffffffffULL, 3, 0x8000000000000000ULL, 3, 42};
  std::vector<u64> shuffled = media;
  std::vector<std::span<const u64>> per_block{{}, media};

  const auto with_media = promptcache::local_block_hashes(tokens, 8, {.media = per_block});
  const auto without = promptcache::local_block_hashes(tokens, 8);
  REQUIRE(with_media.size() == 3);
  CHECK(with_media[0] == without[0]);  // an empty entry is no media
  CHECK(with_media[1] != without[1]);
  CHECK(with_media[2] == without[2]);  // past media.size(): no media
  CHECK(with_media[1] == reference_hash(std::span(tokens).subspan(8, 8), media, 1337));

  std::mt19937 gen(3);
  for (int round = 0; round < 20; ++round) {
    std::shuffle(shuffled.begin(), shuffled.end(), gen);
    per_block[1] = shuffled;
    CHECK(promptcache::local_block_hashes(tokens, 8, {.media = per_block}) == with_media);
  }

  SECTION("more media than the inline scratch holds") {
    std::vector<u64> many(100);
    for (auto& m : many)
      m = gen();
    const std::vector<std::span<const u64>> one{many};
    const auto first = promptcache::local_block_hashes(tokens, 8, {.media = one});
    CHECK(first[0] == reference_hash(std::span(tokens).subspan(0, 8), many, 1337));
    std::shuffle(many.begin(), many.end(), gen);
    CHECK(promptcache::local_block_hashes(tokens, 8, {.media = one}) == first);
  }

  SECTION("blocks too large for the inline buffer are streamed") {
    // 500 tokens = 2000 bytes: with 10 media the input (2080 bytes) is streamed;
    // 600 tokens with 700 media streams both the tokens and the media in chunks.
    const auto big = random_tokens(1200, 23);
    for (const std::size_t n_media :
         {std::size_t{0}, std::size_t{10}, std::size_t{100}, std::size_t{700}}) {
      for (const std::size_t block_size : {std::size_t{500}, std::size_t{600}}) {
        CAPTURE(n_media, block_size);
        std::vector<u64> many(n_media);
        for (auto& m : many)
          m = gen();
        const std::vector<std::span<const u64>> second{{}, many};
        const auto h = promptcache::local_block_hashes(big, block_size, {.media = second});
        REQUIRE(h.size() == 2);
        CHECK(h[1] == reference_hash(std::span(big).subspan(block_size, block_size), many, 1337));
        std::vector<u64> portable(2);
        promptcache::detail::local_block_hashes<false>(big, block_size, portable,
                                                       {.media = second});
        CHECK(portable == h);
      }
    }
  }

  SECTION("entries past the last block are ignored") {
    const std::vector<u64> image{5};
    const std::vector<std::span<const u64>> four{{}, {}, {}, image};
    CHECK(promptcache::local_block_hashes(tokens, 8, {.media = four}) == without);
  }

  SECTION("media with a seed and in Eagle mode") {
    const u64 seed = promptcache::block_hash_seed("lora");
    const auto eagle = promptcache::local_block_hashes(
        tokens, 8, {.seed = seed, .media = per_block, .eagle = true});
    REQUIRE(eagle.size() == 2);
    CHECK(eagle[1] == reference_hash(std::span(tokens).subspan(8, 9), media, seed));
  }
}

TEST_CASE("a trailing partial block never changes the result", "[block_hash]") {
  const auto tokens = random_tokens(64 * 5, 5);
  for (const bool eagle : {false, true}) {
    const std::size_t full = eagle ? 64 * 4 + 1 : 64 * 4;
    const auto base =
        promptcache::local_block_hashes(std::span(tokens).first(full), 64, {.eagle = eagle});
    REQUIRE(base.size() == 4);
    for (std::size_t extra = 0; extra < 64; ++extra) {
      CAPTURE(eagle, extra);
      CHECK(promptcache::local_block_hashes(std::span(tokens).first(full + extra), 64,
                                            {.eagle = eagle}) == base);
    }
  }
}

TEST_CASE("Eagle windows overlap by one token", "[block_hash]") {
  using promptcache::block_count;
  CHECK(block_count(0, 4, true) == 0);
  CHECK(block_count(4, 4, true) == 0);
  CHECK(block_count(5, 4, true) == 1);
  CHECK(block_count(8, 4, true) == 1);
  CHECK(block_count(9, 4, true) == 2);
  CHECK(block_count(8, 4) == 2);
  CHECK(block_count(7, 4) == 1);

  const auto tokens = random_tokens(4 * 10 + 1, 9);
  const auto eagle = promptcache::local_block_hashes(tokens, 4, {.eagle = true});
  const auto plain = promptcache::local_block_hashes(tokens, 4);
  REQUIRE(eagle.size() == 10);
  REQUIRE(plain.size() == 10);
  for (std::size_t i = 0; i < eagle.size(); ++i) {
    CAPTURE(i);
    CHECK(eagle[i] == reference_hash(std::span(tokens).subspan(i * 4, 5), {}, 1337));
    CHECK(eagle[i] != plain[i]);
  }
}

TEST_CASE("the byte-order-independent path equals the in-place path", "[block_hash]") {
  const auto tokens = random_tokens(2000, 13);
  const u64 seeds[] = {1337, 0, promptcache::block_hash_seed("x", "y")};
  // 60 tokens = 240 bytes is the largest seed-only input; 61+ use the secret;
  // 100+ span several 256-byte encoding chunks.
  const std::size_t block_sizes[] = {1, 2, 3, 16, 59, 60, 61, 64, 65, 100, 512, 1999, 2000};
  for (const std::size_t block_size : block_sizes) {
    for (const u64 seed : seeds) {
      for (const bool eagle : {false, true}) {
        CAPTURE(block_size, seed, eagle);
        const BlockHashOptions options{.seed = seed, .eagle = eagle};
        const auto native = promptcache::local_block_hashes(tokens, block_size, options);
        std::vector<u64> portable(native.size());
        CHECK(promptcache::detail::local_block_hashes<false>(tokens, block_size, portable,
                                                             options) == native.size());
        CHECK(portable == native);
        const std::size_t window = eagle ? block_size + 1 : block_size;
        for (std::size_t i = 0; i < native.size(); i += 7) {
          CHECK(native[i] ==
                reference_hash(std::span(tokens).subspan(i * block_size, window), {}, seed));
        }
      }
    }
  }
}

TEST_CASE("little-endian encoding is explicit", "[block_hash]") {
  std::array<unsigned char, 8> b{};
  promptcache::detail::store_le32(0x01020304u, b.data());
  CHECK(b[0] == 0x04);
  CHECK(b[1] == 0x03);
  CHECK(b[2] == 0x02);
  CHECK(b[3] == 0x01);
  promptcache::detail::store_le64(0x1122334455667788ULL, b.data());
  const std::array<unsigned char, 8> le64{0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11};
  CHECK(b == le64);

  const std::vector<u32> words{0xAABBCCDDu, 0x00000001u};
  std::array<unsigned char, 8> enc{};
  promptcache::detail::encode_le32(words, enc.data());
  const std::array<unsigned char, 8> expected{0xDD, 0xCC, 0xBB, 0xAA, 0x01, 0x00, 0x00, 0x00};
  CHECK(enc == expected);

  STATIC_REQUIRE([] {
    std::array<unsigned char, 4> c{};
    promptcache::detail::store_le32(0xA0B0C0D0u, c.data());
    return c[0] == 0xD0 && c[3] == 0xA0;
  }());
}

TEST_CASE("sequence hashes chain and continue from a parent", "[block_hash]") {
  const auto tokens = random_tokens(16 * 12, 17);
  const auto locals = promptcache::local_block_hashes(tokens, 16);
  const auto seq = promptcache::sequence_hashes(locals);
  REQUIRE(seq.size() == 12);
  CHECK(seq[0] == locals[0]);
  for (std::size_t i = 1; i < seq.size(); ++i) {
    std::array<unsigned char, 16> bytes{};
    promptcache::detail::store_le64(seq[i - 1], bytes.data());
    promptcache::detail::store_le64(locals[i], bytes.data() + 8);
    CHECK(seq[i] == promptcache::detail::xxh3_64(bytes.data(), bytes.size(), 1337));
  }

  SECTION("hashes of a prefix are a prefix of the hashes") {
    for (std::size_t k = 0; k <= locals.size(); ++k) {
      CAPTURE(k);
      const auto prefix = promptcache::sequence_hashes(std::span(locals).first(k));
      CHECK(std::equal(prefix.begin(), prefix.end(), seq.begin()));
      // Same for the block hashes of a token prefix.
      const auto token_prefix = promptcache::sequence_hashes(
          promptcache::local_block_hashes(std::span(tokens).first(k * 16 + k % 16), 16));
      CHECK(token_prefix == prefix);
    }
  }

  SECTION("a run continued from its parent equals the whole sequence") {
    for (std::size_t k = 1; k < locals.size(); ++k) {
      CAPTURE(k);
      const auto rest = promptcache::sequence_hashes(std::span(locals).subspan(k), seq[k - 1]);
      CHECK(std::equal(rest.begin(), rest.end(), seq.begin() + static_cast<std::ptrdiff_t>(k)));
    }
  }

  SECTION("in place, and into a short buffer") {
    std::vector<u64> buffer = locals;
    CHECK(promptcache::sequence_hashes(buffer, buffer) == 12);
    CHECK(buffer == seq);

    std::vector<u64> out(12, 0);
    CHECK(promptcache::sequence_hashes(locals, std::span(out).first(5)) == 12);
    CHECK(std::equal(out.begin(), out.begin() + 5, seq.begin()));
    CHECK(std::all_of(out.begin() + 5, out.end(), [](u64 v) { return v == 0; }));

    CHECK(promptcache::sequence_hashes({}, out) == 0);
    CHECK(promptcache::sequence_hashes(std::span<const u64>{}, out, u64{5}) == 0);
  }
}

TEST_CASE("bad input: zero block size, short or empty buffers, huge block sizes", "[block_hash]") {
  const auto tokens = random_tokens(100, 19);
  constexpr u64 untouched = 0xDEADBEEFDEADBEEFULL;
  std::vector<u64> out(20, untouched);
  const auto all_untouched = [&] {
    return std::all_of(out.begin(), out.end(), [](u64 v) { return v == untouched; });
  };

  CHECK(promptcache::local_block_hashes(tokens, 0, out) == 0);
  CHECK(promptcache::local_block_hashes(tokens, 0, out, {.eagle = true}) == 0);
  CHECK(all_untouched());
  CHECK(promptcache::local_block_hashes(tokens, 0).empty());
  CHECK(promptcache::local_block_hashes(std::span<const u32>{}, 4, out) == 0);
  CHECK(promptcache::local_block_hashes(std::span<const u32>{}, 4, out, {.eagle = true}) == 0);
  CHECK(promptcache::local_block_hashes(std::span(tokens).first(3), 4, out) == 0);
  CHECK(all_untouched());

  constexpr auto huge = std::numeric_limits<std::size_t>::max();
  CHECK(promptcache::local_block_hashes(tokens, huge, out) == 0);
  CHECK(promptcache::local_block_hashes(tokens, huge, out, {.eagle = true}) == 0);
  CHECK(promptcache::block_count(huge, huge) == 1);
  CHECK(promptcache::block_count(huge, huge, true) == 0);
  CHECK(all_untouched());

  // 100 tokens of size 10: 10 blocks; a 4-entry buffer gets the first 4.
  const auto all = promptcache::local_block_hashes(tokens, 10);
  REQUIRE(all.size() == 10);
  CHECK(promptcache::local_block_hashes(tokens, 10, std::span(out).first(4)) == 10);
  CHECK(std::equal(all.begin(), all.begin() + 4, out.begin()));
  CHECK(std::all_of(out.begin() + 4, out.end(), [](u64 v) { return v == untouched; }));
  CHECK(promptcache::local_block_hashes(tokens, 10, std::span<u64>{}) == 10);

  // A buffer larger than needed: the tail is left alone.
  std::fill(out.begin(), out.end(), untouched);
  CHECK(promptcache::local_block_hashes(tokens, 10, out) == 10);
  CHECK(std::equal(all.begin(), all.end(), out.begin()));
  CHECK(out[10] == untouched);
}

TEST_CASE("token values at the type's extremes", "[block_hash]") {
  const std::vector<u32> tokens{0, 0xFFFFFFFFu, 0x80000000u, 0x7FFFFFFFu};
  const auto h = promptcache::local_block_hashes(tokens, 4);
  REQUIRE(h.size() == 1);
  CHECK(h[0] == reference_hash(tokens, {}, 1337));
  std::vector<u64> portable(1);
  promptcache::detail::local_block_hashes<false>(tokens, 4, portable, {});
  CHECK(portable == h);
  // Sequence hashes of max-valued locals.
  constexpr u64 max = std::numeric_limits<u64>::max();
  const std::vector<u64> locals{max, max};
  const auto seq = promptcache::sequence_hashes(locals, max);
  CHECK(seq[0] == promptcache::sequence_hash(max, max));
  CHECK(seq[1] == promptcache::sequence_hash(seq[0], max));
}
