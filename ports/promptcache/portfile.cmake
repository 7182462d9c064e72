# Overlay port that builds promptcache from the checkout it sits in:
#   vcpkg install promptcache --overlay-ports=<checkout>/ports
# vcpkg hashes only the files of a port's directory, not the checkout, so this
# port carries source.sha512, the digest of the files it installs (kept current
# by scripts/amalgamate.py and checked by the test suite). Any change to the
# headers changes that file and so the port's ABI hash, and a checkout whose
# files do not match the recorded digest stops the build here instead of being
# served from a binary cache built from other headers.
set(VCPKG_BUILD_TYPE release)  # header-only: one configuration is enough

get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
include("${CMAKE_CURRENT_LIST_DIR}/source_hash.cmake")
promptcache_source_hash(_actual "${SOURCE_PATH}")
file(STRINGS "${CMAKE_CURRENT_LIST_DIR}/source.sha512" _recorded LIMIT_COUNT 1)
if(NOT _actual STREQUAL _recorded)
  message(FATAL_ERROR "${SOURCE_PATH} does not match ports/promptcache/source.sha512: "
                      "run scripts/amalgamate.py in that checkout, then install again")
endif()

# Every developer part off: the library alone is installed, whatever the machine has.
vcpkg_cmake_configure(
  SOURCE_PATH "${SOURCE_PATH}"
  OPTIONS
    -DPROMPTCACHE_BUILD_TESTS=OFF
    -DPROMPTCACHE_BUILD_BENCHMARKS=OFF
    -DPROMPTCACHE_BUILD_EXAMPLES=OFF
    -DPROMPTCACHE_BUILD_TOOLS=OFF
    -DPROMPTCACHE_BUILD_FUZZERS=OFF
    -DPROMPTCACHE_INSTALL=ON)
vcpkg_cmake_install()
vcpkg_cmake_config_fixup(PACKAGE_NAME promptcache CONFIG_PATH share/cmake/promptcache)
vcpkg_fixup_pkgconfig()

vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
