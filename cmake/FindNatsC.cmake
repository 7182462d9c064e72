# FindNatsC
# ---------
# Provides the imported target NatsC::nats: the NATS C client (libnats,
# <nats/nats.h>).
#
# Found by its header and library, not by its CMake package (cnats): Debian's
# (libnats-dev) names a static library the package does not install, and
# loading it stops the configure with an error even when QUIET.
#
# Result variables: NatsC_FOUND, NatsC_VERSION (from nats/version.h).

include(FindPackageHandleStandardArgs)

find_path(NatsC_INCLUDE_DIR NAMES nats/nats.h)
find_library(NatsC_LIBRARY NAMES nats)
mark_as_advanced(NatsC_INCLUDE_DIR NatsC_LIBRARY)

set(NatsC_VERSION "")
if(NatsC_INCLUDE_DIR AND EXISTS "${NatsC_INCLUDE_DIR}/nats/version.h")
  file(STRINGS "${NatsC_INCLUDE_DIR}/nats/version.h" _natsc_version REGEX "^#define NATS_VERSION_STRING")
  string(REGEX MATCH "\"([0-9.]+)\"" _ "${_natsc_version}")
  set(NatsC_VERSION "${CMAKE_MATCH_1}")
endif()

find_package_handle_standard_args(NatsC REQUIRED_VARS NatsC_INCLUDE_DIR NatsC_LIBRARY
                                  VERSION_VAR NatsC_VERSION)

if(NatsC_FOUND AND NOT TARGET NatsC::nats)
  add_library(NatsC::nats INTERFACE IMPORTED)
  set_target_properties(NatsC::nats PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${NatsC_INCLUDE_DIR}"
                                               INTERFACE_LINK_LIBRARIES "${NatsC_LIBRARY}")
endif()
