# Builds and runs programs with the compile flags that the installed pkg-config
# files give (cmake -P; run by the consumer_pkg_config test):
#  - promptcache on a view where only the install is visible (no libxxhash.pc),
#    compiled as C++23 (-std=c++2b, which Clang 14 also takes), which the flags
#    must not downgrade;
#  - promptcache-block-hash with the system's pkg-config files (libxxhash) too;
#  - promptcache-zmq-kv-subscriber with them, where cppzmq has a pkg-config file.
# Arguments: PKG_CONFIG, CXX, PREFIX (the install), SOURCE_DIR, WORK_DIR, VERSION.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    string(JOIN " " cmd ${ARGN})
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

function(pkg_flags module libdir)
  set(ENV{PKG_CONFIG_LIBDIR} "${libdir}")
  unset(ENV{PKG_CONFIG_PATH})
  run("${PKG_CONFIG}" --modversion ${module})
  if(NOT out STREQUAL VERSION)
    message(FATAL_ERROR "${module}: version '${out}', expected '${VERSION}'")
  endif()
  run("${PKG_CONFIG}" --cflags ${module})
  message(STATUS "${module}: ${out}")
  if(out MATCHES "-std=")
    message(FATAL_ERROR "${module} sets the language standard: ${out}")
  endif()
  separate_arguments(flags UNIX_COMMAND "${out}")
  set(found FALSE)
  foreach(flag IN LISTS flags)
    if(flag MATCHES "^-I(.*)")
      if(EXISTS "${CMAKE_MATCH_1}/promptcache/version.hpp")
        set(found TRUE)
      endif()
    endif()
  endforeach()
  if(NOT found)
    message(FATAL_ERROR "${module}: no -I flag names the installed headers (${out})")
  endif()
  set(flags "${flags}" PARENT_SCOPE)
endfunction()

set(own "${PREFIX}/share/pkgconfig")

# 1. Only the install is visible: promptcache needs nothing else.
pkg_flags(promptcache "${own}")
# The consumer program as C++23, with an xxhash.h that fails if included: the flags
# neither downgrade the standard nor need xxHash.
file(WRITE "${WORK_DIR}/cxx23.hpp"
     "static_assert(__cplusplus > 202002L, \"the pkg-config flags downgraded C++23\");\n")
run("${CXX}" -std=c++2b -include "${WORK_DIR}/cxx23.hpp" -I "${SOURCE_DIR}/tests/consumer/no_xxhash"
    ${flags} "${SOURCE_DIR}/tests/consumer/main.cpp" -o "${WORK_DIR}/core")
run("${WORK_DIR}/core")
message(STATUS "${out}")

# 2. With the system's pkg-config files: block hashing and its dependency.
set(ENV{PKG_CONFIG_LIBDIR} "")
run("${PKG_CONFIG}" --variable pc_path pkg-config)
pkg_flags(promptcache-block-hash "${own}:${out}")
run("${CXX}" -std=c++20 -DPROMPTCACHE_CONSUMER_BLOCK_HASH ${flags}
    "${SOURCE_DIR}/tests/consumer/main.cpp" -o "${WORK_DIR}/block_hash")
run("${WORK_DIR}/block_hash")
message(STATUS "${out}")

# 3. The ZeroMQ subscriber (and the wire decoder it requires), where the system
#    has cppzmq's pkg-config file: compile and link with --cflags --libs.
set(ENV{PKG_CONFIG_LIBDIR} "")
run("${PKG_CONFIG}" --variable pc_path pkg-config)
set(system_path "${out}")
set(ENV{PKG_CONFIG_LIBDIR} "${own}:${system_path}")
execute_process(COMMAND "${PKG_CONFIG}" --exists cppzmq RESULT_VARIABLE rc)
if(rc EQUAL 0)
  pkg_flags(promptcache-zmq-kv-subscriber "${own}:${system_path}")
  run("${PKG_CONFIG}" --libs promptcache-zmq-kv-subscriber)
  separate_arguments(libs UNIX_COMMAND "${out}")
  run("${CXX}" -std=c++20 -DPROMPTCACHE_CONSUMER_BLOCK_HASH -DPROMPTCACHE_CONSUMER_WIRE
      -DPROMPTCACHE_CONSUMER_ZMQ ${flags} "${SOURCE_DIR}/tests/consumer/main.cpp" ${libs}
      -o "${WORK_DIR}/zmq_kv_subscriber")
  run("${WORK_DIR}/zmq_kv_subscriber")
  message(STATUS "${out}")
else()
  message(STATUS "no cppzmq.pc: promptcache-zmq-kv-subscriber not tried")
endif()
