# FindxxHash
# ----------
# Provides the imported target xxHash::xxhash.
#
# Prefers xxHash's own CMake package (as installed by vcpkg, Conan or an
# upstream build), and otherwise looks for the header: Debian's libxxhash-dev
# ships xxhash.h without a CMake config. promptcache only needs the header,
# since it compiles xxHash inline (XXH_INLINE_ALL).
#
# Result variables: xxHash_FOUND, xxHash_INCLUDE_DIR, xxHash_VERSION.

include(FindPackageHandleStandardArgs)

if(NOT TARGET xxHash::xxhash)
  find_package(xxHash CONFIG QUIET)
endif()

if(TARGET xxHash::xxhash)
  if(NOT xxHash_VERSION)
    set(xxHash_VERSION "unknown")
  endif()
  set(xxHash_FOUND TRUE)
  if(NOT xxHash_FIND_QUIETLY)
    message(STATUS "Found xxHash: target xxHash::xxhash (version ${xxHash_VERSION})")
  endif()
  return()
endif()

find_path(xxHash_INCLUDE_DIR NAMES xxhash.h)
mark_as_advanced(xxHash_INCLUDE_DIR)

if(xxHash_INCLUDE_DIR AND EXISTS "${xxHash_INCLUDE_DIR}/xxhash.h")
  file(STRINGS "${xxHash_INCLUDE_DIR}/xxhash.h" _xxhash_version_lines
       REGEX "^#define XXH_VERSION_(MAJOR|MINOR|RELEASE)[ \t]+[0-9]+")
  foreach(_xxhash_part MAJOR MINOR RELEASE)
    string(REGEX MATCH "XXH_VERSION_${_xxhash_part}[ \t]+([0-9]+)" _ "${_xxhash_version_lines}")
    set(_xxhash_${_xxhash_part} "${CMAKE_MATCH_1}")
  endforeach()
  set(xxHash_VERSION "${_xxhash_MAJOR}.${_xxhash_MINOR}.${_xxhash_RELEASE}")
endif()

find_package_handle_standard_args(
  xxHash
  REQUIRED_VARS xxHash_INCLUDE_DIR
  VERSION_VAR xxHash_VERSION)

if(xxHash_FOUND AND NOT TARGET xxHash::xxhash)
  add_library(xxHash::xxhash INTERFACE IMPORTED)
  set_target_properties(xxHash::xxhash PROPERTIES INTERFACE_INCLUDE_DIRECTORIES
                                                  "${xxHash_INCLUDE_DIR}")
endif()
