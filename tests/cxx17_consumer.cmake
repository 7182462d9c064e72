# Compiles each public header as C++17 (cmake -P; run by the consumer_cxx17_error
# test): the compile must fail with promptcache's one #error, and nothing else.
# Arguments: CXX, SOURCE_DIR, WORK_DIR.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
file(GLOB headers RELATIVE "${SOURCE_DIR}/include" "${SOURCE_DIR}/include/promptcache/*.hpp")
list(SORT headers)
set(failures "")
foreach(header IN LISTS headers)
  get_filename_component(name "${header}" NAME_WE)
  file(WRITE "${WORK_DIR}/${name}.cpp" "#include <${header}>\nint main() { return 0; }\n")
  execute_process(
    COMMAND "${CXX}" -std=c++17 -fsyntax-only -I "${SOURCE_DIR}/include" "${WORK_DIR}/${name}.cpp"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(REGEX MATCHALL "error:" errors "${out}${err}")
  list(LENGTH errors n)
  if(rc EQUAL 0 OR NOT n EQUAL 1 OR NOT err MATCHES "promptcache requires C\\+\\+20")
    list(APPEND failures "${header}")
    message(STATUS "${header}: exit ${rc}, ${n} errors:\n${err}")
  else()
    message(STATUS "${header}: one #error, as expected")
  endif()
endforeach()
list(LENGTH headers total)
if(failures)
  message(FATAL_ERROR "as C++17, these headers do not stop at one clear #error: ${failures}")
endif()
message(STATUS "all ${total} public headers stop a C++17 build with one #error")
