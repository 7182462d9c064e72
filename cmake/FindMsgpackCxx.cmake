# FindMsgpackCxx
# --------------
# Provides the imported target MsgpackCxx::headers: msgpack-cxx's headers, used
# without Boost (kv_event_wire.hpp defines MSGPACK_NO_BOOST).
#
# msgpack-cxx is found by its header, not by its CMake package: Debian's
# (libmsgpack-cxx-dev) requires Boost even though the headers work without it,
# and the package and target names differ between versions (msgpack,
# msgpack-cxx) and distributions.
#
# Result variables: MsgpackCxx_FOUND, MsgpackCxx_INCLUDE_DIR, MsgpackCxx_VERSION.

include(FindPackageHandleStandardArgs)

find_path(MsgpackCxx_INCLUDE_DIR NAMES msgpack/v2/parse.hpp DOC "Directory holding msgpack-cxx's msgpack.hpp")
mark_as_advanced(MsgpackCxx_INCLUDE_DIR)

set(MsgpackCxx_VERSION "")
if(MsgpackCxx_INCLUDE_DIR AND EXISTS "${MsgpackCxx_INCLUDE_DIR}/msgpack/version_master.hpp")
  file(STRINGS "${MsgpackCxx_INCLUDE_DIR}/msgpack/version_master.hpp" _msgpack_version_lines
       REGEX "^#define MSGPACK_VERSION_(MAJOR|MINOR|REVISION)[ \t]+[0-9]+")
  foreach(_msgpack_part MAJOR MINOR REVISION)
    string(REGEX MATCH "MSGPACK_VERSION_${_msgpack_part}[ \t]+([0-9]+)" _ "${_msgpack_version_lines}")
    set(_msgpack_${_msgpack_part} "${CMAKE_MATCH_1}")
  endforeach()
  if(NOT _msgpack_MAJOR STREQUAL "")
    set(MsgpackCxx_VERSION "${_msgpack_MAJOR}.${_msgpack_MINOR}.${_msgpack_REVISION}")
  endif()
endif()

find_package_handle_standard_args(
  MsgpackCxx
  REQUIRED_VARS MsgpackCxx_INCLUDE_DIR
  VERSION_VAR MsgpackCxx_VERSION)

if(MsgpackCxx_FOUND AND NOT TARGET MsgpackCxx::headers)
  add_library(MsgpackCxx::headers INTERFACE IMPORTED)
  set_target_properties(MsgpackCxx::headers PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${MsgpackCxx_INCLUDE_DIR}"
                                                       INTERFACE_COMPILE_DEFINITIONS MSGPACK_NO_BOOST)
endif()
