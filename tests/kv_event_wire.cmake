# The KV event wire tests read their fixtures from tests/kv_event_wire/.
foreach(_pc_name IN ITEMS test_kv_event_wire test_kv_event_wire_fuzz test_kv_event_wire_tape)
  promptcache_test_target(${_pc_name} _pc_t)
  if(TARGET ${_pc_t})
    target_compile_definitions(
      ${_pc_t} PRIVATE PROMPTCACHE_KV_WIRE_FIXTURES="${CMAKE_CURRENT_SOURCE_DIR}/kv_event_wire")
  endif()
endforeach()

# The end-to-end subscriber test runs a Python publisher that needs the
# msgpack and zmq modules (Debian python3-msgpack python3-zmq, which live in
# /usr/bin/python3 even when another python3 comes first on PATH).
if(TARGET test_zmq_kv_subscriber)
  find_program(PROMPTCACHE_E2E_PYTHON NAMES python3 HINTS /usr/bin NO_DEFAULT_PATH)
  if(NOT PROMPTCACHE_E2E_PYTHON)
    find_program(PROMPTCACHE_E2E_PYTHON NAMES python3)
  endif()
  set(_pc_e2e_ok FALSE)
  if(PROMPTCACHE_E2E_PYTHON)
    execute_process(COMMAND "${PROMPTCACHE_E2E_PYTHON}" -c "import msgpack, zmq"
                    RESULT_VARIABLE _pc_py_rc OUTPUT_QUIET ERROR_QUIET)
    if(_pc_py_rc EQUAL 0)
      set(_pc_e2e_ok TRUE)
    endif()
  endif()
  target_compile_definitions(
    test_zmq_kv_subscriber
    PRIVATE PROMPTCACHE_E2E_PYTHON="${PROMPTCACHE_E2E_PYTHON}"
            PROMPTCACHE_E2E_PUBLISHER="${CMAKE_CURRENT_SOURCE_DIR}/kv_event_wire/e2e_publisher.py")
  set_tests_properties(test_zmq_kv_subscriber PROPERTIES TIMEOUT 180)
  if(NOT _pc_e2e_ok)
    message(STATUS "test_zmq_kv_subscriber disabled: no python3 with the msgpack and zmq modules")
    set_tests_properties(test_zmq_kv_subscriber PROPERTIES DISABLED TRUE)
  endif()
endif()

# The publisher's test follows it with ZmqKvSubscriber and checks its bytes
# against an encoder written in Python (the msgpack module alone).
if(TARGET test_kv_event_publisher)
  target_link_libraries(test_kv_event_publisher PRIVATE promptcache::zmq_kv_subscriber)
  find_program(PROMPTCACHE_PUB_PYTHON NAMES python3 HINTS /usr/bin NO_DEFAULT_PATH)
  if(NOT PROMPTCACHE_PUB_PYTHON)
    find_program(PROMPTCACHE_PUB_PYTHON NAMES python3)
  endif()
  set(_pc_pub_py_ok FALSE)
  if(PROMPTCACHE_PUB_PYTHON)
    execute_process(COMMAND "${PROMPTCACHE_PUB_PYTHON}" -c "import msgpack"
                    RESULT_VARIABLE _pc_py_rc OUTPUT_QUIET ERROR_QUIET)
    if(_pc_py_rc EQUAL 0)
      set(_pc_pub_py_ok TRUE)
    endif()
  endif()
  target_compile_definitions(
    test_kv_event_publisher
    PRIVATE PROMPTCACHE_PUB_PYTHON="${PROMPTCACHE_PUB_PYTHON}"
            PROMPTCACHE_PUB_ENCODER="${CMAKE_CURRENT_SOURCE_DIR}/kv_event_wire/vllm_encoder.py")
  if(NOT _pc_pub_py_ok)
    message(STATUS "test_kv_event_publisher: no python3 with msgpack, its byte checks are skipped")
    target_compile_definitions(test_kv_event_publisher PRIVATE PROMPTCACHE_PUB_NO_PYTHON=1)
  endif()
endif()
