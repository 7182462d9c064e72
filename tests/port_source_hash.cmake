# The vcpkg port's CMake digest of the checkout must equal the one recorded in
# ports/promptcache/source.sha512 (written by scripts/amalgamate.py), or the port
# would refuse this checkout. Usage: cmake -DSOURCE_DIR=<checkout> -P <this file>
include("${SOURCE_DIR}/ports/promptcache/source_hash.cmake")
promptcache_source_hash(actual "${SOURCE_DIR}")
file(STRINGS "${SOURCE_DIR}/ports/promptcache/source.sha512" recorded LIMIT_COUNT 1)
if(NOT actual STREQUAL recorded)
  message(FATAL_ERROR "the port's digest of ${SOURCE_DIR} is ${actual}, source.sha512 says "
                      "${recorded}: run scripts/amalgamate.py")
endif()
message(STATUS "port source digest matches: ${actual}")
