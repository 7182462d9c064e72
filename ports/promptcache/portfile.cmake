# Overlay port: build from this checkout (vcpkg install --overlay-ports=ports promptcache).
# A registry port would use vcpkg_from_github with a release tag instead.
get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)

vcpkg_cmake_configure(
  SOURCE_PATH "${SOURCE_PATH}"
  OPTIONS
    -DPROMPTCACHE_BUILD_TESTS=OFF
    -DPROMPTCACHE_BUILD_BENCHMARKS=OFF
    -DPROMPTCACHE_BUILD_EXAMPLES=OFF
    -DPROMPTCACHE_INSTALL=ON)
vcpkg_cmake_install()
vcpkg_cmake_config_fixup(PACKAGE_NAME promptcache CONFIG_PATH share/cmake/promptcache)
vcpkg_fixup_pkgconfig()

# Header-only: nothing goes into debug/.
file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/debug")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
