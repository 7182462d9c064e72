# FindxxHash
# ----------
# Provides the imported target xxHash::xxhash.
#
# Prefers xxHash's own CMake package (as installed by vcpkg, Conan or an
# upstream build), and otherwise looks for the header: Debian's libxxhash-dev
# ships xxhash.h without a CMake config. promptcache only needs the header,
# since it compiles xxHash inline (XXH_INLINE_ALL).
#
# The version asked for (promptcache asks for 0.8.1) is checked whichever way
# xxHash is found.
#
# Result variables: xxHash_FOUND, xxHash_INCLUDE_DIR, xxHash_VERSION.

include(FindPackageHandleStandardArgs)

if(NOT TARGET xxHash::xxhash)
  find_package(xxHash CONFIG QUIET)
endif()

# _pc_xxhash_header_version(<dir>): xxHash_VERSION from <dir>/xxhash.h, if there.
macro(_pc_xxhash_header_version dir)
  if(EXISTS "${dir}/xxhash.h")
    file(STRINGS "${dir}/xxhash.h" _xxhash_version_lines
         REGEX "^#define XXH_VERSION_(MAJOR|MINOR|RELEASE)[ \t]+[0-9]+")
    foreach(_xxhash_part MAJOR MINOR RELEASE)
      string(REGEX MATCH "XXH_VERSION_${_xxhash_part}[ \t]+([0-9]+)" _ "${_xxhash_version_lines}")
      set(_xxhash_${_xxhash_part} "${CMAKE_MATCH_1}")
    endforeach()
    if(NOT _xxhash_MAJOR STREQUAL "")
      set(xxHash_VERSION "${_xxhash_MAJOR}.${_xxhash_MINOR}.${_xxhash_RELEASE}")
    endif()
  endif()
endmacro()

if(TARGET xxHash::xxhash)
  # xxHash's own package (or a target the including project made): the version
  # its package reports, else the one of the xxhash.h it points at, is checked
  # like a bare header's. A version that cannot be told is accepted.
  if(NOT xxHash_VERSION)
    set(xxHash_VERSION "")
    get_target_property(_xxhash_dirs xxHash::xxhash INTERFACE_INCLUDE_DIRECTORIES)
    foreach(_xxhash_dir IN LISTS _xxhash_dirs)
      if(_xxhash_dir MATCHES "^\\$<BUILD_INTERFACE:([^$<>]*)>$")  # a target of the including project
        set(_xxhash_dir "${CMAKE_MATCH_1}")
      endif()
      if(xxHash_VERSION STREQUAL "" AND NOT _xxhash_dir MATCHES "\\$<")
        _pc_xxhash_header_version("${_xxhash_dir}")
      endif()
    endforeach()
  endif()
  set(xxHash_TARGET xxHash::xxhash)
  if(xxHash_VERSION STREQUAL "")
    find_package_handle_standard_args(xxHash REQUIRED_VARS xxHash_TARGET)
  else()
    find_package_handle_standard_args(
      xxHash
      REQUIRED_VARS xxHash_TARGET
      VERSION_VAR xxHash_VERSION)
  endif()
  return()
endif()

find_path(xxHash_INCLUDE_DIR NAMES xxhash.h)
mark_as_advanced(xxHash_INCLUDE_DIR)

if(xxHash_INCLUDE_DIR)
  _pc_xxhash_header_version("${xxHash_INCLUDE_DIR}")
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
