# Install rules: headers, the exported target, the package config files, the
# xxHash Find module they rely on, and a pkg-config file.
include(CMakePackageConfigHelpers)

set(PROMPTCACHE_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/cmake/promptcache"
    CACHE STRING "Where promptcache's CMake package files are installed")

install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/promptcache" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(TARGETS promptcache EXPORT promptcacheTargets)
install(EXPORT promptcacheTargets NAMESPACE promptcache:: DESTINATION "${PROMPTCACHE_INSTALL_CMAKEDIR}")

configure_package_config_file(
  "${PROJECT_SOURCE_DIR}/cmake/promptcacheConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/promptcacheConfig.cmake"
  INSTALL_DESTINATION "${PROMPTCACHE_INSTALL_CMAKEDIR}")
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/promptcacheConfigVersion.cmake"
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMajorVersion ARCH_INDEPENDENT)
install(FILES "${PROJECT_BINARY_DIR}/promptcacheConfig.cmake"
              "${PROJECT_BINARY_DIR}/promptcacheConfigVersion.cmake"
              "${PROJECT_SOURCE_DIR}/cmake/FindxxHash.cmake"
        DESTINATION "${PROMPTCACHE_INSTALL_CMAKEDIR}")

configure_file("${PROJECT_SOURCE_DIR}/cmake/promptcache.pc.in" "${PROJECT_BINARY_DIR}/promptcache.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/promptcache.pc" DESTINATION "${CMAKE_INSTALL_DATADIR}/pkgconfig")
