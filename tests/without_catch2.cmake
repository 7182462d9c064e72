# What a user does without the test framework installed (cmake -P; run by the
# consumer_without_catch2 test). Catch2 (and, in one case, xxHash) is hidden
# with CMAKE_DISABLE_FIND_PACKAGE_<name>:
#  1. configure with default options and install: must work, without xxHash too;
#  2. scripts/demo's configuration, the demo preset: builds every example and
#     the replay tool, with -Werror (g++ -O2 is the opt preset's compiler and
#     flags, so scripts/test need not build them in opt as well).
# Arguments: SOURCE_DIR, WORK_DIR, CXX.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

function(run)
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY "${SOURCE_DIR}" RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(JOIN " " cmd ${ARGN})
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}\n${err}")
  endif()
endfunction()

# 1. A plain install, with and without xxHash.
foreach(view catch2 catch2_xxhash)
  set(hide -DCMAKE_DISABLE_FIND_PACKAGE_Catch2=ON)
  if(view STREQUAL "catch2_xxhash")
    list(APPEND hide -DCMAKE_DISABLE_FIND_PACKAGE_xxHash=ON)
  endif()
  run("${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}/plain_${view}" "-DCMAKE_CXX_COMPILER=${CXX}" ${hide})
  run("${CMAKE_COMMAND}" --install "${WORK_DIR}/plain_${view}" --prefix "${WORK_DIR}/prefix_${view}")
  foreach(file include/promptcache/promptcache.hpp include/promptcache/block_hash.hpp
               share/cmake/promptcache/promptcacheConfig.cmake
               share/cmake/promptcache/promptcache_block_hashTargets.cmake)
    if(NOT EXISTS "${WORK_DIR}/prefix_${view}/${file}")
      message(FATAL_ERROR "plain install without ${view}: ${file} is missing")
    endif()
  endforeach()
  message(STATUS "configure + install without ${view}: ok")
endforeach()

# 2. The demo preset (what scripts/demo runs), into a directory of our own.
run("${CMAKE_COMMAND}" --preset demo -B "${WORK_DIR}/demo" "-DCMAKE_CXX_COMPILER=${CXX}"
    -DCMAKE_DISABLE_FIND_PACKAGE_Catch2=ON -DPROMPTCACHE_WARNINGS_AS_ERRORS=ON)
run("${CMAKE_COMMAND}" --build "${WORK_DIR}/demo" -j 2)
file(GLOB examples RELATIVE "${SOURCE_DIR}/examples" "${SOURCE_DIR}/examples/*.cpp")
foreach(example IN LISTS examples)
  get_filename_component(name "${example}" NAME_WE)
  if(NOT EXISTS "${WORK_DIR}/demo/examples/${name}")
    message(FATAL_ERROR "the demo preset did not build examples/${name}")
  endif()
endforeach()
# The replay tool too, where the configuration found nlohmann-json (the tools default ON).
file(STRINGS "${WORK_DIR}/demo/CMakeCache.txt" tools REGEX "^PROMPTCACHE_BUILD_TOOLS:BOOL=ON$")
if(tools AND NOT EXISTS "${WORK_DIR}/demo/tools/promptcache_replay")
  message(FATAL_ERROR "the demo preset did not build tools/promptcache_replay")
endif()
message(STATUS "demo preset without Catch2 built every example: ${examples}")
