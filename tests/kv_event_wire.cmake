# The KV event wire tests read their fixtures from tests/kv_event_wire/.
foreach(_pc_t IN ITEMS test_kv_event_wire test_kv_event_wire_fuzz)
  if(TARGET ${_pc_t})
    target_compile_definitions(
      ${_pc_t} PRIVATE PROMPTCACHE_KV_WIRE_FIXTURES="${CMAKE_CURRENT_SOURCE_DIR}/kv_event_wire")
  endif()
endforeach()
