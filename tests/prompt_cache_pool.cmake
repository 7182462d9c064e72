# Extra CMake for the prompt-cache pool tests (included from tests/CMakeLists.txt).
# The thread tests need the platform's thread library.
find_package(Threads REQUIRED)
foreach(_pc_pool_test IN ITEMS test_manual_clock test_synchronized_prompt_cache_pool)
  if(TARGET ${_pc_pool_test})
    target_link_libraries(${_pc_pool_test} PRIVATE Threads::Threads)
  endif()
endforeach()
