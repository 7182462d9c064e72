#include <promptcache/version.hpp>

#include <string>

#include "catch.hpp"

#define PROMPTCACHE_STRINGIFY_IMPL(x) #x
#define PROMPTCACHE_STRINGIFY(x) PROMPTCACHE_STRINGIFY_IMPL(x)

TEST_CASE("version macros match the version CMake configured", "[version]") {
  const std::string from_header =
      PROMPTCACHE_STRINGIFY(PROMPTCACHE_VERSION_MAJOR) "." PROMPTCACHE_STRINGIFY(
          PROMPTCACHE_VERSION_MINOR) "." PROMPTCACHE_STRINGIFY(PROMPTCACHE_VERSION_PATCH);
  CHECK(from_header == PROMPTCACHE_CMAKE_VERSION);
  CHECK(PROMPTCACHE_VERSION == PROMPTCACHE_VERSION_MAJOR * 10000 + PROMPTCACHE_VERSION_MINOR * 100 +
                                   PROMPTCACHE_VERSION_PATCH);
}
