# The KV event wire tests read their fixtures from tests/kv_event_wire/.
foreach(_pc_name IN ITEMS test_kv_event_wire test_kv_event_wire_fuzz test_kv_event_wire_tape)
  promptcache_test_target(${_pc_name} _pc_t)
  if(TARGET ${_pc_t})
    target_compile_definitions(
      ${_pc_t} PRIVATE PROMPTCACHE_KV_WIRE_FIXTURES="${CMAKE_CURRENT_SOURCE_DIR}/kv_event_wire")
  endif()
endforeach()

# promptcache_find_python_with(<cache var> <ok var> <modules>): a python3 into the
# cache variable, /usr/bin's first (Debian's python3-msgpack and python3-zmq live in
# the system interpreter even when another python3 comes first on PATH); <ok var>
# is TRUE when it imports the modules (e.g. "msgpack, zmq").
function(promptcache_find_python_with var ok_var modules)
  find_program(${var} NAMES python3 HINTS /usr/bin NO_DEFAULT_PATH)
  if(NOT ${var})
    find_program(${var} NAMES python3)
  endif()
  set(_ok FALSE)
  if(${var})
    execute_process(COMMAND "${${var}}" -c "import ${modules}" RESULT_VARIABLE _rc OUTPUT_QUIET
                    ERROR_QUIET)
    if(_rc EQUAL 0)
      set(_ok TRUE)
    endif()
  endif()
  set(${ok_var} ${_ok} PARENT_SCOPE)
endfunction()

# The end-to-end subscriber test runs a Python publisher that needs the
# msgpack and zmq modules.
# (Definitions and libraries go to the file's executable, its group's where it has one.)
promptcache_test_target(test_zmq_kv_subscriber _pc_zmq_target)
if(TARGET ${_pc_zmq_target})
  promptcache_find_python_with(PROMPTCACHE_E2E_PYTHON _pc_e2e_ok "msgpack, zmq")
  target_compile_definitions(
    ${_pc_zmq_target}
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
promptcache_test_target(test_kv_event_publisher _pc_pub_target)
if(TARGET ${_pc_pub_target})
  target_link_libraries(${_pc_pub_target} PRIVATE promptcache::zmq_kv_subscriber)
  promptcache_find_python_with(PROMPTCACHE_PUB_PYTHON _pc_pub_py_ok "msgpack")
  target_compile_definitions(
    ${_pc_pub_target}
    PRIVATE PROMPTCACHE_PUB_PYTHON="${PROMPTCACHE_PUB_PYTHON}"
            PROMPTCACHE_PUB_ENCODER="${CMAKE_CURRENT_SOURCE_DIR}/kv_event_wire/vllm_encoder.py")
  if(NOT _pc_pub_py_ok)
    message(STATUS "test_kv_event_publisher: no python3 with msgpack, its byte checks are skipped")
    target_compile_definitions(${_pc_pub_target} PRIVATE PROMPTCACHE_PUB_NO_PYTHON=1)
  endif()
endif()
