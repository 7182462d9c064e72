# The NATS tests start their own nats-server (loopback, a free port, a
# temporary store directory) and stop it by its pid, even when a case fails.
# Without libnats the test is not built; without nats-server it is built but
# not run. Either way ctest lists it as not run, with the reason printed here.
# test_nats_kv_snapshot_store is among the ThreadSanitizer tests
# (tests/CMakeLists.txt) for the subscriber's own locking; libnats is not
# instrumented, so races inside it would go unseen.
find_program(PROMPTCACHE_NATS_SERVER NAMES nats-server HINTS /usr/sbin /usr/local/bin)
# test_nats_fleet runs 8 engines and 3 router replicas through one server and
# its faults (tests/support/nats_server.hpp starts and kills the server); its
# bigger variant is tagged [soak] (a ctest entry of its own, run optimized).
foreach(_pc_nats_test IN ITEMS test_nats_kv_subscriber test_nats_kv_snapshot_store test_nats_fleet)
  promptcache_test_target(${_pc_nats_test} _pc_t)
  if(TARGET ${_pc_t})
    target_compile_definitions(${_pc_t} PRIVATE PROMPTCACHE_NATS_SERVER="${PROMPTCACHE_NATS_SERVER}")
    set(_pc_nats_entries ${_pc_nats_test})
    set_tests_properties(${_pc_nats_test} PROPERTIES TIMEOUT 300)
    if(TEST ${_pc_nats_test}_soak)
      # About 30 s at -O2 and 2 to 3 minutes under ASan on a shared 2-core machine.
      list(APPEND _pc_nats_entries ${_pc_nats_test}_soak)
      set_tests_properties(${_pc_nats_test}_soak PROPERTIES TIMEOUT 900)
    endif()
    if(NOT PROMPTCACHE_NATS_SERVER)
      message(STATUS "${_pc_nats_test} disabled: nats-server not found (Debian: nats-server)")
      set_tests_properties(${_pc_nats_entries} PROPERTIES DISABLED TRUE)
    endif()
  else()
    message(STATUS "${_pc_nats_test} skipped: promptcache::nats_kv_subscriber needs libnats "
                   "(Debian: libnats-dev)")
    add_test(NAME ${_pc_nats_test} COMMAND "${CMAKE_COMMAND}" -E echo "skipped: libnats not found")
    set_tests_properties(${_pc_nats_test} PROPERTIES DISABLED TRUE)
  endif()
endforeach()
