# Findcppzmq
# ----------
# Provides the imported target cppzmq (cppzmq's zmq.hpp and libzmq).
#
# Prefers cppzmq's own CMake package (Debian's cppzmq-dev, vcpkg, Conan or an
# upstream install; it finds libzmq itself), and otherwise looks for zmq.hpp and
# the libzmq library by hand.
#
# Result variables: cppzmq_FOUND, cppzmq_VERSION (when the package says).

include(FindPackageHandleStandardArgs)

# cppzmq's package stops the configure (FATAL_ERROR, even when QUIET) where
# libzmq is missing: it is asked only where libzmq's header is found.
find_path(cppzmq_ZMQ_INCLUDE_DIR NAMES zmq.h)
mark_as_advanced(cppzmq_ZMQ_INCLUDE_DIR)
if(NOT TARGET cppzmq AND cppzmq_ZMQ_INCLUDE_DIR)
  find_package(cppzmq CONFIG QUIET)
endif()

if(TARGET cppzmq)
  set(cppzmq_TARGET cppzmq)
  find_package_handle_standard_args(
    cppzmq
    REQUIRED_VARS cppzmq_TARGET
    VERSION_VAR cppzmq_VERSION)
  return()
endif()

find_path(cppzmq_INCLUDE_DIR NAMES zmq.hpp)
find_library(cppzmq_ZMQ_LIBRARY NAMES zmq libzmq)
mark_as_advanced(cppzmq_INCLUDE_DIR cppzmq_ZMQ_LIBRARY)

find_package_handle_standard_args(cppzmq REQUIRED_VARS cppzmq_INCLUDE_DIR cppzmq_ZMQ_INCLUDE_DIR cppzmq_ZMQ_LIBRARY)

if(cppzmq_FOUND AND NOT TARGET cppzmq)
  add_library(cppzmq INTERFACE IMPORTED)
  set_target_properties(cppzmq PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${cppzmq_INCLUDE_DIR}"
                                          INTERFACE_LINK_LIBRARIES "${cppzmq_ZMQ_LIBRARY}")
endif()
