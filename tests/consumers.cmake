# Consumption tests: build a tiny program against promptcache the ways users
# do, with no network. Each configures and builds tests/consumer/ afresh, with no
# build type (no optimization: what they check is how the package is found and
# linked, and the optimized builds of the same code are the tests' and the demo's).
set(_pc_consumer_src "${PROJECT_SOURCE_DIR}/tests/consumer")
# The compiler of the consumers' programs (default: the build's). What they check is how
# the package is found, configured and used, which no compiler changes; scripts/test gives
# them clang++, which compiles them at -O0 in half the CPU time of g++. Not
# consumer_without_catch2: its demo build is the g++ -O2 -Werror build of the examples.
set(PROMPTCACHE_CONSUMER_CXX "${CMAKE_CXX_COMPILER}" CACHE STRING
    "Compiler of the consumption tests' programs, a path or a name on PATH (default: the build's)")
set(_pc_consumer_bin "${PROJECT_BINARY_DIR}/consumers")
set(_pc_prefix "${_pc_consumer_bin}/prefix")

# promptcache_add_consumer_test(<name> <mode> [extra -D options...])
function(promptcache_add_consumer_test name mode)
  add_test(
    NAME ${name}
    COMMAND
      "${CMAKE_CTEST_COMMAND}" --build-and-test "${_pc_consumer_src}" "${_pc_consumer_bin}/${name}"
      --build-generator "${CMAKE_GENERATOR}" --build-noclean --build-options
      "-DCMAKE_CXX_COMPILER=${PROMPTCACHE_CONSUMER_CXX}" "-DCMAKE_BUILD_TYPE="
      "-DPROMPTCACHE_CONSUME=${mode}" "-DPROMPTCACHE_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
      "-DCMAKE_PREFIX_PATH=${_pc_prefix}" "-DCMAKE_INSTALL_PREFIX=${_pc_consumer_bin}/${name}-prefix"
      ${ARGN} --test-command promptcache_consumer)
  # COST: each configures a project, which takes longer than most unit tests; ctest -j
  # starts the costliest first when it has no timings of an earlier run (a fresh clone).
  set_tests_properties(${name} PROPERTIES LABELS consumer COST 10)
endfunction()

# A consumer that uses only the std-only headers on a machine view without
# xxHash (CMake cannot find it, and the compiler sees an xxhash.h that fails).
set(_pc_no_xxhash "-DPROMPTCACHE_CONSUMER_BLOCK_HASH=OFF" "-DPROMPTCACHE_CONSUMER_HIDE_XXHASH=ON")
# A consumer of the msgpack (and, when found, ZeroMQ) components, on a machine
# that has their dependencies; skipped elsewhere.
set(_pc_wire_options "-DPROMPTCACHE_CONSUMER_WIRE=ON")
if(TARGET promptcache::zmq_kv_subscriber)
  list(APPEND _pc_wire_options "-DPROMPTCACHE_CONSUMER_ZMQ=ON")
endif()

if(PROMPTCACHE_INSTALL)
  # Installed with --prefix: nothing may point at the configure-time prefix.
  add_test(NAME consumer_install COMMAND "${CMAKE_COMMAND}" --install "${PROJECT_BINARY_DIR}"
                                         --prefix "${_pc_prefix}")
  set_tests_properties(consumer_install PROPERTIES FIXTURES_SETUP promptcache_installed
                                                   LABELS consumer)

  # Every library target the build tree defines (the INTERFACE targets of the
  # top directory, but the warning flags of our own programs) is installed.
  get_property(_pc_all_targets DIRECTORY "${PROJECT_SOURCE_DIR}" PROPERTY BUILDSYSTEM_TARGETS)
  set(_pc_library_targets "")
  foreach(_pc_t IN LISTS _pc_all_targets)
    get_target_property(_pc_type ${_pc_t} TYPE)
    if(_pc_type STREQUAL "INTERFACE_LIBRARY" AND NOT _pc_t STREQUAL "promptcache_warnings")
      list(APPEND _pc_library_targets ${_pc_t})
    endif()
  endforeach()
  string(REPLACE ";" "," _pc_library_targets "${_pc_library_targets}")
  add_test(NAME consumer_install_exports
           COMMAND "${CMAKE_COMMAND}" "-DPREFIX=${_pc_prefix}" "-DTARGETS=${_pc_library_targets}"
                   "-DCMAKEDIR=${PROMPTCACHE_INSTALL_CMAKEDIR}" "-DPKGCONFIGDIR=${PROMPTCACHE_INSTALL_PKGCONFIGDIR}"
                   -P "${PROJECT_SOURCE_DIR}/tests/installed_targets.cmake")
  set_tests_properties(consumer_install_exports PROPERTIES FIXTURES_REQUIRED promptcache_installed
                                                           LABELS consumer)

  promptcache_add_consumer_test(consumer_find_package find_package
                                "-DPROMPTCACHE_REQUIRE_VERSION=${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}")
  promptcache_add_consumer_test(consumer_find_package_no_xxhash find_package ${_pc_no_xxhash})
  # Asking for the block_hash component where xxHash is missing fails, and says why.
  promptcache_add_consumer_test(consumer_find_package_block_hash_no_xxhash find_package
                                "-DPROMPTCACHE_CONSUMER_HIDE_XXHASH=ON")
  set_tests_properties(consumer_find_package_block_hash_no_xxhash
                       PROPERTIES PASS_REGULAR_EXPRESSION "component 'block_hash' needs xxHash 0.8.1")
  # So is an xxHash older than 0.8.1 whose CMake package the project found first.
  promptcache_add_consumer_test(consumer_find_package_old_xxhash find_package
                                "-DPROMPTCACHE_CONSUMER_XXHASH_FIRST=${_pc_consumer_src}/old_xxhash")
  set_tests_properties(consumer_find_package_old_xxhash
                       PROPERTIES PASS_REGULAR_EXPRESSION "component 'block_hash' needs xxHash 0.8.1")
  # A major version we do not provide must be refused by the version file...
  promptcache_add_consumer_test(consumer_find_package_wrong_version find_package
                                "-DPROMPTCACHE_REQUIRE_VERSION=99")
  set(_pc_refused "not find a configuration file for package \"promptcache\" that is[ \n]+compatible")
  set_tests_properties(consumer_find_package_wrong_version PROPERTIES PASS_REGULAR_EXPRESSION "${_pc_refused}")
  # The msgpack and ZeroMQ components, where this machine has their dependencies.
  if(TARGET promptcache::kv_event_wire)
    promptcache_add_consumer_test(consumer_find_package_wire find_package ${_pc_wire_options})
    set_tests_properties(consumer_find_package_wire PROPERTIES FIXTURES_REQUIRED promptcache_installed
                                                               COST 15)
  else()
    message(STATUS "promptcache: consumer_find_package_wire skipped (no msgpack-cxx)")
  endif()
  set(_pc_version_tests consumer_find_package consumer_find_package_no_xxhash
                        consumer_find_package_block_hash_no_xxhash consumer_find_package_old_xxhash
                        consumer_find_package_wrong_version)
  # ...and, before 1.0, every minor version is a breaking release: 0.2 must not
  # satisfy a request for 0.1.
  if(PROJECT_VERSION_MAJOR EQUAL 0 AND PROJECT_VERSION_MINOR GREATER 0)
    math(EXPR _pc_older_minor "${PROJECT_VERSION_MINOR} - 1")
    promptcache_add_consumer_test(consumer_find_package_older_minor find_package
                                  "-DPROMPTCACHE_REQUIRE_VERSION=0.${_pc_older_minor}")
    set_tests_properties(consumer_find_package_older_minor PROPERTIES PASS_REGULAR_EXPRESSION "${_pc_refused}")
    list(APPEND _pc_version_tests consumer_find_package_older_minor)
  endif()
  set_tests_properties(${_pc_version_tests} PROPERTIES FIXTURES_REQUIRED promptcache_installed)

  # pkg-config: compile and run programs with the flags the installed .pc files
  # give, with and without xxHash visible.
  find_program(PROMPTCACHE_PKG_CONFIG pkg-config)
  if(PROMPTCACHE_PKG_CONFIG)
    add_test(NAME consumer_pkg_config
             COMMAND "${CMAKE_COMMAND}" "-DPKG_CONFIG=${PROMPTCACHE_PKG_CONFIG}"
                     "-DCXX=${PROMPTCACHE_CONSUMER_CXX}" "-DPREFIX=${_pc_prefix}"
                     "-DSOURCE_DIR=${PROJECT_SOURCE_DIR}" "-DWORK_DIR=${_pc_consumer_bin}/pkg_config"
                     "-DVERSION=${PROJECT_VERSION}" -P "${PROJECT_SOURCE_DIR}/tests/pkg_config_consumer.cmake")
    set_tests_properties(consumer_pkg_config PROPERTIES FIXTURES_REQUIRED promptcache_installed
                                                        LABELS consumer COST 20)
  endif()
endif()

promptcache_add_consumer_test(consumer_add_subdirectory add_subdirectory)
promptcache_add_consumer_test(consumer_add_subdirectory_no_xxhash add_subdirectory ${_pc_no_xxhash})
# A parent project that installs its own export set: works with PROMPTCACHE_INSTALL=ON.
promptcache_add_consumer_test(consumer_add_subdirectory_export add_subdirectory
                              "-DPROMPTCACHE_CONSUMER_EXPORT=ON")
if(TARGET promptcache::kv_event_wire)
  # The same with the msgpack and ZeroMQ components: they are in export sets too.
  promptcache_add_consumer_test(consumer_add_subdirectory_export_wire add_subdirectory
                                "-DPROMPTCACHE_CONSUMER_EXPORT=ON" ${_pc_wire_options})
  set_tests_properties(consumer_add_subdirectory_export_wire PROPERTIES COST 15)
endif()
promptcache_add_consumer_test(consumer_fetchcontent fetchcontent)
promptcache_add_consumer_test(consumer_single_include single_include)
promptcache_add_consumer_test(consumer_single_include_no_xxhash single_include ${_pc_no_xxhash})

# Installing, and building the demo (scripts/demo's preset), need no Catch2.
add_test(NAME consumer_without_catch2
         COMMAND "${CMAKE_COMMAND}" "-DCXX=${CMAKE_CXX_COMPILER}" "-DSOURCE_DIR=${PROJECT_SOURCE_DIR}"
                 "-DWORK_DIR=${_pc_consumer_bin}/without_catch2" -P "${PROJECT_SOURCE_DIR}/tests/without_catch2.cmake")
set_tests_properties(consumer_without_catch2 PROPERTIES LABELS consumer COST 50)

# A C++17 consumer gets one clear #error per header, not pages of errors.
add_test(NAME consumer_cxx17_error
         COMMAND "${CMAKE_COMMAND}" "-DCXX=${CMAKE_CXX_COMPILER}" "-DSOURCE_DIR=${PROJECT_SOURCE_DIR}"
                 "-DWORK_DIR=${_pc_consumer_bin}/cxx17" -P "${PROJECT_SOURCE_DIR}/tests/cxx17_consumer.cmake")
set_tests_properties(consumer_cxx17_error PROPERTIES LABELS consumer)

# Checks of the checkout itself, which no compiler or option changes, are labelled
# `checkout`: the asan test preset leaves them to opt, as it does the consumption tests.
# The vcpkg port's check of the checkout (CMake) agrees with the digest recorded
# by scripts/amalgamate.py (Python).
add_test(NAME port_source_hash COMMAND "${CMAKE_COMMAND}" "-DSOURCE_DIR=${PROJECT_SOURCE_DIR}" -P
                                       "${PROJECT_SOURCE_DIR}/tests/port_source_hash.cmake")
set_tests_properties(port_source_hash PROPERTIES LABELS checkout)

# The generated single-include headers must match the sources.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME single_include_up_to_date
           COMMAND "${Python3_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/scripts/amalgamate.py" --check)
  add_test(NAME docs_consistent COMMAND "${Python3_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/tests/check_docs.py")
  add_test(NAME packaging_metadata
           COMMAND "${Python3_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/tests/check_packaging.py"
                   "${PROJECT_VERSION}")
  set_tests_properties(single_include_up_to_date docs_consistent packaging_metadata
                       PROPERTIES LABELS checkout)
  # What vcpkg and Conan configure: the recipe's exports_sources alone, and the
  # checkout with the port's options; neither may configure a developer part.
  add_test(NAME packaging_configure
           COMMAND "${Python3_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/tests/check_packaging.py"
                   "${PROJECT_VERSION}" --configure "${CMAKE_COMMAND}" "${PROMPTCACHE_CONSUMER_CXX}"
                   "${_pc_consumer_bin}/packaging_configure")
  set_tests_properties(packaging_configure PROPERTIES LABELS consumer COST 20)
endif()
