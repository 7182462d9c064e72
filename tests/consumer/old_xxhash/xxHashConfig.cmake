# A stand-in for the CMake package of an xxHash older than promptcache accepts
# (its version file says 0.7.0): found through xxHash_DIR, it must be refused.
if(NOT TARGET xxHash::xxhash)
  add_library(xxHash::xxhash INTERFACE IMPORTED)
endif()
