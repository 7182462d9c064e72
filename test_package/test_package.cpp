#include <promptcache/promptcache.hpp>
#ifdef TEST_PACKAGE_BLOCK_HASH
#include <promptcache/block_hash.hpp>
#endif

#include <cstdint>
#include <cstdio>
#include <vector>

int main() {
  const auto state = promptcache::CursorState<>::live(0);
  bool ok =
      std::holds_alternative<promptcache::cursor::Contiguous<std::uint64_t>>(state.observe(1));
#ifdef TEST_PACKAGE_BLOCK_HASH
  const std::vector<std::uint32_t> tokens = {1, 2, 3, 4};
  ok = ok && promptcache::local_block_hashes(tokens, 4).at(0) == 14643705804678351452ULL;
#endif
  std::printf("promptcache %d.%d.%d %s\n", PROMPTCACHE_VERSION_MAJOR, PROMPTCACHE_VERSION_MINOR,
              PROMPTCACHE_VERSION_PATCH, ok ? "works" : "is broken");
  return ok ? 0 : 1;
}
