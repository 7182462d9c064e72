# test_block_hash_libxxhash: block_hash.hpp compiles xxHash inline; these
# translation units prove it coexists with a program that also links libxxhash
# and includes <xxhash.h> itself, before or after the header (see
# tests/block_hash_interop/). It needs a linkable xxHash library: the imported
# target when it is one (vcpkg, Conan), otherwise libxxhash found on the system.
set(_pc_bh_xxhash_library "")
if(TARGET xxHash::xxhash)
  get_target_property(_pc_bh_xxhash_type xxHash::xxhash TYPE)
  if(NOT _pc_bh_xxhash_type STREQUAL "INTERFACE_LIBRARY")
    set(_pc_bh_xxhash_library xxHash::xxhash)
  endif()
endif()
if(NOT _pc_bh_xxhash_library)
  find_library(PROMPTCACHE_XXHASH_LIBRARY NAMES xxhash)
  mark_as_advanced(PROMPTCACHE_XXHASH_LIBRARY)
  if(PROMPTCACHE_XXHASH_LIBRARY)
    set(_pc_bh_xxhash_library "${PROMPTCACHE_XXHASH_LIBRARY}")
  endif()
endif()

if(_pc_bh_xxhash_library)
  set(_pc_bh_dir "${CMAKE_CURRENT_SOURCE_DIR}/block_hash_interop")
  promptcache_add_test(
    test_block_hash_libxxhash "${_pc_bh_dir}/libxxhash_user.cpp" "${_pc_bh_dir}/plain_then_header.cpp"
    "${_pc_bh_dir}/header_then_plain.cpp" "${_pc_bh_dir}/inline_then_header.cpp")
  target_include_directories(test_block_hash_libxxhash PRIVATE "${_pc_bh_dir}")
  target_link_libraries(test_block_hash_libxxhash PRIVATE "${_pc_bh_xxhash_library}")
else()
  message(STATUS "promptcache: no linkable libxxhash found, test_block_hash_libxxhash skipped")
endif()
