# Install rules: the headers, one export set per target (so a component's
# dependency is looked for only when the component is asked for), the package
# config files, the dependencies' Find modules, and one pkg-config file per target.
include(CMakePackageConfigHelpers)

set(PROMPTCACHE_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/cmake/promptcache"
    CACHE STRING "Where promptcache's CMake package files are installed")
set(PROMPTCACHE_INSTALL_PKGCONFIGDIR "${CMAKE_INSTALL_DATADIR}/pkgconfig"
    CACHE STRING "Where promptcache's pkg-config files are installed")

install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/promptcache" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(TARGETS promptcache EXPORT promptcacheTargets)
install(EXPORT promptcacheTargets NAMESPACE promptcache:: DESTINATION "${PROMPTCACHE_INSTALL_CMAKEDIR}")

# pkg-config files locate the install through ${pcfiledir}, so an install made
# with `cmake --install --prefix DIR` (or moved afterwards) stays usable. They set
# no -std flag: the headers need C++20 or later and say so with #error otherwise,
# and a -std=c++20 here would downgrade a C++23 project.
if(IS_ABSOLUTE "${PROMPTCACHE_INSTALL_PKGCONFIGDIR}")
  set(_pc_pkgconfig_dir "${PROMPTCACHE_INSTALL_PKGCONFIGDIR}")
else()
  set(_pc_pkgconfig_dir "${CMAKE_INSTALL_PREFIX}/${PROMPTCACHE_INSTALL_PKGCONFIGDIR}")
endif()
if(IS_ABSOLUTE "${PROMPTCACHE_INSTALL_PKGCONFIGDIR}")
  set(PROMPTCACHE_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH _pc_up "${_pc_pkgconfig_dir}" "${CMAKE_INSTALL_PREFIX}")
  string(REGEX REPLACE "/$" "" _pc_up "${_pc_up}")
  set(PROMPTCACHE_PC_PREFIX "\${pcfiledir}/${_pc_up}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(PROMPTCACHE_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(PROMPTCACHE_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()

set(PROMPTCACHE_PC_NAME promptcache)
set(PROMPTCACHE_PC_DESCRIPTION "${PROJECT_DESCRIPTION}")
set(PROMPTCACHE_PC_REQUIRES "")
set(PROMPTCACHE_PC_LIBS "")
configure_file("${PROJECT_SOURCE_DIR}/cmake/promptcache.pc.in" "${PROJECT_BINARY_DIR}/promptcache.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/promptcache.pc" DESTINATION "${PROMPTCACHE_INSTALL_PKGCONFIGDIR}")

# Each component: its own export set and targets file, its lines in the package
# config (the find_package arguments of its dependencies and the components it
# requires), and a pkg-config file promptcache-<name> that requires promptcache,
# the components it requires and its dependencies' modules.
get_property(_pc_components GLOBAL PROPERTY PROMPTCACHE_COMPONENTS)
set(PROMPTCACHE_CONFIG_COMPONENTS "")
foreach(_pc_name IN LISTS _pc_components)
  get_property(_pc_find GLOBAL PROPERTY PROMPTCACHE_COMPONENT_${_pc_name}_FIND)
  get_property(_pc_requires GLOBAL PROPERTY PROMPTCACHE_COMPONENT_${_pc_name}_REQUIRES)
  get_property(_pc_description GLOBAL PROPERTY PROMPTCACHE_COMPONENT_${_pc_name}_DESCRIPTION)
  get_property(_pc_pkg_config GLOBAL PROPERTY PROMPTCACHE_COMPONENT_${_pc_name}_PKG_CONFIG)
  get_property(_pc_pkg_config_libs GLOBAL PROPERTY PROMPTCACHE_COMPONENT_${_pc_name}_PKG_CONFIG_LIBS)
  install(TARGETS promptcache_${_pc_name} EXPORT promptcache_${_pc_name}Targets)
  install(EXPORT promptcache_${_pc_name}Targets NAMESPACE promptcache::
          DESTINATION "${PROMPTCACHE_INSTALL_CMAKEDIR}")
  string(APPEND PROMPTCACHE_CONFIG_COMPONENTS
         "# ${_pc_description}\n"
         "set(_promptcache_component_${_pc_name} \"${_pc_find}\")\n"
         "set(_promptcache_component_${_pc_name}_requires \"${_pc_requires}\")\n")

  string(REPLACE "_" "-" PROMPTCACHE_PC_NAME "promptcache-${_pc_name}")
  set(PROMPTCACHE_PC_DESCRIPTION "promptcache: ${_pc_description}")
  foreach(_pc_req IN LISTS _pc_requires)
    string(REPLACE "_" "-" _pc_req "promptcache-${_pc_req} = ${PROJECT_VERSION}")
    list(PREPEND _pc_pkg_config "${_pc_req}")
  endforeach()
  list(PREPEND _pc_pkg_config "promptcache = ${PROJECT_VERSION}")
  list(JOIN _pc_pkg_config ", " PROMPTCACHE_PC_REQUIRES)
  list(JOIN _pc_pkg_config_libs " " PROMPTCACHE_PC_LIBS)
  configure_file("${PROJECT_SOURCE_DIR}/cmake/promptcache.pc.in"
                 "${PROJECT_BINARY_DIR}/${PROMPTCACHE_PC_NAME}.pc" @ONLY)
  install(FILES "${PROJECT_BINARY_DIR}/${PROMPTCACHE_PC_NAME}.pc"
          DESTINATION "${PROMPTCACHE_INSTALL_PKGCONFIGDIR}")
endforeach()
string(REPLACE ";" " " PROMPTCACHE_CONFIG_COMPONENT_NAMES "${_pc_components}")

configure_package_config_file(
  "${PROJECT_SOURCE_DIR}/cmake/promptcacheConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/promptcacheConfig.cmake"
  INSTALL_DESTINATION "${PROMPTCACHE_INSTALL_CMAKEDIR}")
# 0.x releases may break compatibility in any minor version, so 0.2 accepts only
# requests for 0.2.x; from 1.0 on, any request with the same major version.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(_pc_compatibility SameMinorVersion)
else()
  set(_pc_compatibility SameMajorVersion)
endif()
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/promptcacheConfigVersion.cmake"
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY ${_pc_compatibility} ARCH_INDEPENDENT)
# The Find modules of the components' dependencies (cmake/Find*.cmake), which
# the package config puts on the module path while it looks for them.
file(GLOB _pc_find_modules "${PROJECT_SOURCE_DIR}/cmake/Find*.cmake")
install(FILES "${PROJECT_BINARY_DIR}/promptcacheConfig.cmake"
              "${PROJECT_BINARY_DIR}/promptcacheConfigVersion.cmake" ${_pc_find_modules}
        DESTINATION "${PROMPTCACHE_INSTALL_CMAKEDIR}")
