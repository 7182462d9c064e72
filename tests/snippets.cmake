# The documentation's code: every ```cpp compile block of README.md and docs/*.md
# is built as its own program with the project's warnings (-Werror in the dev
# preset), and run as a test when it has a main(). A snippet that includes an
# optional header (kv_event_wire.hpp, zmq_kv_subscriber.hpp) links that
# header's target and is skipped, like the tests, when its dependency is
# missing. Included
# after the promptcache_threaded_tests target is defined.
#
# With PROMPTCACHE_TEST_SNIPPET_GROUP (the opt preset) the snippets build as one
# program instead, promptcache_snippet_group, from one translation unit: each snippet in
# a namespace of its own, the headers they include first (so a snippet's own
# #include lines are no-ops there), and a main() that runs the snippet named by its
# argument. The headers and the library code they share are then compiled once
# instead of once per snippet. A snippet's own includes are checked where the group
# is off (the asan and tsan presets).
option(PROMPTCACHE_TEST_SNIPPET_GROUP "Build the documentation snippets as one program" OFF)
set(_pc_group_sources "")
set(_pc_group_mains "")
set(_pc_group_reqs "")
file(GLOB _pc_docs CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/docs/*.md")
set(_pc_docs "${PROJECT_SOURCE_DIR}/README.md" ${_pc_docs})
list(SORT _pc_docs)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_pc_docs})
execute_process(
  COMMAND "${Python3_EXECUTABLE}" "${CMAKE_CURRENT_SOURCE_DIR}/extract_snippets.py"
          "${CMAKE_CURRENT_BINARY_DIR}/snippets" ${_pc_docs}
  WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}" RESULT_VARIABLE _pc_rc OUTPUT_VARIABLE _pc_snippets
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _pc_rc EQUAL 0)
  message(FATAL_ERROR "tests/extract_snippets.py failed")
endif()
string(REPLACE "\n" ";" _pc_snippets "${_pc_snippets}")
add_custom_target(promptcache_snippets)
set(_pc_count 0)
set(_pc_skipped 0)
foreach(_pc_line IN LISTS _pc_snippets)
  string(REPLACE "|" ";" _pc_line "${_pc_line}")
  list(GET _pc_line 0 _pc_name)
  list(GET _pc_line 1 _pc_has_main)
  list(GET _pc_line 2 _pc_headers)
  promptcache_optional_requirement("${_pc_headers}" _pc_req)
  if(_pc_req AND NOT TARGET ${_pc_req})
    math(EXPR _pc_skipped "${_pc_skipped} + 1")
    continue()
  endif()
  set(_pc_src "${CMAKE_CURRENT_BINARY_DIR}/snippets/${_pc_name}.cpp")
  if(PROMPTCACHE_TEST_SNIPPET_GROUP)
    list(APPEND _pc_group_sources "${_pc_src}")
    list(APPEND _pc_group_reqs ${_pc_req})
    if(_pc_has_main)
      list(APPEND _pc_group_mains ${_pc_name})
      add_test(NAME ${_pc_name} COMMAND promptcache_snippet_group ${_pc_name})
      set_tests_properties(${_pc_name} PROPERTIES LABELS snippet)
    endif()
    math(EXPR _pc_count "${_pc_count} + 1")
    continue()
  endif()
  if(_pc_has_main)
    add_executable(${_pc_name} "${_pc_src}")
    add_test(NAME ${_pc_name} COMMAND ${_pc_name})
    set_tests_properties(${_pc_name} PROPERTIES LABELS snippet)
  else()
    add_library(${_pc_name} OBJECT "${_pc_src}")
    promptcache_syntax_only_objects(${_pc_name})
  endif()
  target_link_libraries(${_pc_name} PRIVATE promptcache::block_hash promptcache::warnings
                                            Threads::Threads)
  if(_pc_req)
    target_link_libraries(${_pc_name} PRIVATE ${_pc_req})
  endif()
  add_dependencies(promptcache_snippets ${_pc_name})
  if(_pc_has_main AND _pc_name MATCHES "${_pc_threaded_names}")
    add_dependencies(promptcache_threaded_tests ${_pc_name})  # run by the tsan preset too
    set_property(TEST ${_pc_name} APPEND PROPERTY LABELS threaded)
  endif()
  math(EXPR _pc_count "${_pc_count} + 1")
endforeach()
if(PROMPTCACHE_TEST_SNIPPET_GROUP AND _pc_count GREATER 0)
  promptcache_add_group_program(promptcache_snippet_group "" "${_pc_group_sources}" "${_pc_group_mains}")
  target_link_libraries(promptcache_snippet_group PRIVATE promptcache::block_hash promptcache::warnings
                                                          Threads::Threads ${_pc_group_reqs})
  add_dependencies(promptcache_snippets promptcache_snippet_group)
endif()
message(STATUS "promptcache: ${_pc_count} documentation snippets compiled, ${_pc_skipped} skipped "
               "(optional dependency missing)")
