#include <promptcache/promptcache.hpp>

#include <cstdio>

int main() {
  const auto state = promptcache::CursorState<>::live(0);
  const bool ok =
      std::holds_alternative<promptcache::cursor::Contiguous<std::uint64_t>>(state.observe(1));
  std::printf("promptcache %d.%d.%d %s\n", PROMPTCACHE_VERSION_MAJOR, PROMPTCACHE_VERSION_MINOR,
              PROMPTCACHE_VERSION_PATCH, ok ? "works" : "is broken");
  return ok ? 0 : 1;
}
