# Optional targets for the headers that need third-party libraries. Each is
# defined only when its dependency is found; the tests, benchmarks and
# examples that need one are skipped (with a message) when it is missing.
#
#   promptcache::kv_event_wire       kv_event_wire.hpp: msgpack-cxx (header-only,
#                                    used without Boost)
#   promptcache::zmq_kv_subscriber   zmq_kv_subscriber.hpp: the above plus
#                                    cppzmq and libzmq
#
# Debian's msgpack-cxx CMake package requires Boost even though the headers
# work without it (MSGPACK_NO_BOOST), so msgpack-cxx is found by its header.
include_guard(GLOBAL)

find_path(PROMPTCACHE_MSGPACK_CXX_INCLUDE_DIR NAMES msgpack/v2/parse.hpp
          DOC "Directory holding msgpack-cxx's msgpack.hpp")
mark_as_advanced(PROMPTCACHE_MSGPACK_CXX_INCLUDE_DIR)

if(PROMPTCACHE_MSGPACK_CXX_INCLUDE_DIR)
  add_library(promptcache_kv_event_wire INTERFACE)
  add_library(promptcache::kv_event_wire ALIAS promptcache_kv_event_wire)
  target_link_libraries(promptcache_kv_event_wire INTERFACE promptcache::block_hash)
  target_include_directories(promptcache_kv_event_wire SYSTEM
                             INTERFACE "${PROMPTCACHE_MSGPACK_CXX_INCLUDE_DIR}")
  target_compile_definitions(promptcache_kv_event_wire INTERFACE MSGPACK_NO_BOOST)
  message(STATUS "promptcache: msgpack-cxx found, promptcache::kv_event_wire available")
else()
  message(STATUS "promptcache: msgpack-cxx not found (Debian: libmsgpack-cxx-dev); "
                 "promptcache::kv_event_wire and what needs it are skipped")
endif()

if(TARGET promptcache_kv_event_wire)
  # cppzmq's own package (it finds libzmq through CMake or pkg-config), else
  # the header and the library by hand.
  find_package(cppzmq CONFIG QUIET)
  if(NOT TARGET cppzmq)
    find_path(PROMPTCACHE_CPPZMQ_INCLUDE_DIR NAMES zmq.hpp)
    find_library(PROMPTCACHE_LIBZMQ NAMES zmq libzmq)
    mark_as_advanced(PROMPTCACHE_CPPZMQ_INCLUDE_DIR PROMPTCACHE_LIBZMQ)
    if(PROMPTCACHE_CPPZMQ_INCLUDE_DIR AND PROMPTCACHE_LIBZMQ)
      add_library(promptcache_cppzmq INTERFACE IMPORTED)
      set_target_properties(
        promptcache_cppzmq PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${PROMPTCACHE_CPPZMQ_INCLUDE_DIR}"
                                      INTERFACE_LINK_LIBRARIES "${PROMPTCACHE_LIBZMQ}")
      set(_pc_zmq_target promptcache_cppzmq)
    endif()
  else()
    set(_pc_zmq_target cppzmq)
  endif()
  find_package(Threads)
  if(_pc_zmq_target AND Threads_FOUND)
    add_library(promptcache_zmq_kv_subscriber INTERFACE)
    add_library(promptcache::zmq_kv_subscriber ALIAS promptcache_zmq_kv_subscriber)
    target_link_libraries(promptcache_zmq_kv_subscriber INTERFACE promptcache::kv_event_wire
                                                                  ${_pc_zmq_target} Threads::Threads)
    message(STATUS "promptcache: cppzmq found, promptcache::zmq_kv_subscriber available")
  else()
    message(STATUS "promptcache: cppzmq/libzmq not found (Debian: cppzmq-dev libzmq3-dev); "
                   "promptcache::zmq_kv_subscriber and what needs it are skipped")
  endif()
endif()

# promptcache_optional_requirement(<name> <out-var>): the optional target that
# the test, benchmark, example or header called <name> needs ("" for none).
function(promptcache_optional_requirement name out)
  if(name MATCHES "zmq")
    set(${out} promptcache::zmq_kv_subscriber PARENT_SCOPE)
  elseif(name MATCHES "kv_event_wire")
    set(${out} promptcache::kv_event_wire PARENT_SCOPE)
  else()
    set(${out} "" PARENT_SCOPE)
  endif()
endfunction()
