# Consumption tests: build a tiny program against promptcache the ways users
# do, with no network. Each configures and builds tests/consumer/ afresh.
set(_pc_consumer_src "${PROJECT_SOURCE_DIR}/tests/consumer")
set(_pc_consumer_bin "${PROJECT_BINARY_DIR}/consumers")
set(_pc_prefix "${_pc_consumer_bin}/prefix")

# promptcache_add_consumer_test(<name> <mode> [extra -D options...])
function(promptcache_add_consumer_test name mode)
  add_test(
    NAME ${name}
    COMMAND
      "${CMAKE_CTEST_COMMAND}" --build-and-test "${_pc_consumer_src}" "${_pc_consumer_bin}/${name}"
      --build-generator "${CMAKE_GENERATOR}" --build-noclean --build-options
      "-DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}" "-DCMAKE_BUILD_TYPE=Release"
      "-DPROMPTCACHE_CONSUME=${mode}" "-DPROMPTCACHE_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
      "-DCMAKE_PREFIX_PATH=${_pc_prefix}" ${ARGN} --test-command promptcache_consumer)
  set_tests_properties(${name} PROPERTIES LABELS consumer)
endfunction()

if(PROMPTCACHE_INSTALL)
  add_test(NAME consumer_install COMMAND "${CMAKE_COMMAND}" --install "${PROJECT_BINARY_DIR}"
                                         --prefix "${_pc_prefix}")
  set_tests_properties(consumer_install PROPERTIES FIXTURES_SETUP promptcache_installed
                                                   LABELS consumer)

  promptcache_add_consumer_test(consumer_find_package find_package)
  set_tests_properties(consumer_find_package PROPERTIES FIXTURES_REQUIRED promptcache_installed)

  # A major version we do not provide must be refused by the version file.
  promptcache_add_consumer_test(consumer_find_package_wrong_version find_package
                                "-DPROMPTCACHE_REQUIRE_VERSION=99")
  set_tests_properties(consumer_find_package_wrong_version
                       PROPERTIES FIXTURES_REQUIRED promptcache_installed WILL_FAIL TRUE)

  # The installed pkg-config file names the installed headers.
  find_program(PROMPTCACHE_PKG_CONFIG pkg-config)
  if(PROMPTCACHE_PKG_CONFIG)
    add_test(NAME consumer_pkg_config
             COMMAND "${CMAKE_COMMAND}" -E env "PKG_CONFIG_PATH=${_pc_prefix}/share/pkgconfig"
                     "${PROMPTCACHE_PKG_CONFIG}" --cflags --modversion promptcache)
    set_tests_properties(
      consumer_pkg_config PROPERTIES FIXTURES_REQUIRED promptcache_installed LABELS consumer
                                     PASS_REGULAR_EXPRESSION "${PROJECT_VERSION}")
  endif()
endif()

promptcache_add_consumer_test(consumer_add_subdirectory add_subdirectory)
promptcache_add_consumer_test(consumer_fetchcontent fetchcontent)
promptcache_add_consumer_test(consumer_single_include single_include)

# The generated single-include headers must match the sources.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME single_include_up_to_date
           COMMAND "${Python3_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/scripts/amalgamate.py" --check)
  add_test(NAME packaging_metadata
           COMMAND "${Python3_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/tests/check_packaging.py"
                   "${PROJECT_VERSION}")
endif()
