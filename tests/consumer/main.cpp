// Uses every public header through the umbrella header, the way a downstream
// project would after installing or vendoring promptcache.
#include <promptcache/promptcache.hpp>

#include <cstdio>

int main() {
  auto state = promptcache::CursorState<>::initial();
  state = state.advance_to(0);
  const bool contiguous =
      std::holds_alternative<promptcache::cursor::Contiguous<std::uint64_t>>(state.observe(1));

  std::printf("promptcache %d.%d.%d: cursor %s\n", PROMPTCACHE_VERSION_MAJOR,
              PROMPTCACHE_VERSION_MINOR, PROMPTCACHE_VERSION_PATCH, contiguous ? "ok" : "broken");
  return contiguous ? 0 : 1;
}
