# The NATS tests start their own nats-server (loopback, a free port, a
# temporary store directory) and stop it by its pid, even when a case fails.
# Without libnats the test is not built; without nats-server it is built but
# not run. Either way ctest lists it as not run, with the reason printed here.
# It is not among the ThreadSanitizer tests (tests/CMakeLists.txt); built with
# -fsanitize=thread it runs without reports and without suppressions, but
# libnats is not instrumented, so races inside it would go unseen.
find_program(PROMPTCACHE_NATS_SERVER NAMES nats-server HINTS /usr/sbin /usr/local/bin)
if(TARGET test_nats_kv_subscriber)
  target_compile_definitions(test_nats_kv_subscriber
                             PRIVATE PROMPTCACHE_NATS_SERVER="${PROMPTCACHE_NATS_SERVER}")
  set_tests_properties(test_nats_kv_subscriber PROPERTIES TIMEOUT 120)
  if(NOT PROMPTCACHE_NATS_SERVER)
    message(STATUS "test_nats_kv_subscriber disabled: nats-server not found (Debian: nats-server)")
    set_tests_properties(test_nats_kv_subscriber PROPERTIES DISABLED TRUE)
  endif()
else()
  message(STATUS "test_nats_kv_subscriber skipped: promptcache::nats_kv_subscriber needs libnats "
                 "(Debian: libnats-dev)")
  add_test(NAME test_nats_kv_subscriber COMMAND "${CMAKE_COMMAND}" -E echo
                                                "skipped: libnats not found")
  set_tests_properties(test_nats_kv_subscriber PROPERTIES DISABLED TRUE)
endif()
