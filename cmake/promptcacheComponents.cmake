# promptcache_add_component(<name> DESCRIPTION <text>
#                           FIND <find_package args...> [AND <find_package args...>]...
#                           LINK <targets...> [REQUIRES <components...>]
#                           [PKG_CONFIG <pkg-config modules...>] [PKG_CONFIG_LIBS <flags...>]
#                           [ONLY_WHEN_FOUND])
#
# Declares an optional component: the INTERFACE target promptcache::<name>, which
# is promptcache::promptcache plus the components it REQUIRES plus third-party
# dependencies. Each dependency (one find_package call per AND-separated group)
# is looked for here without being required (a project that never links the
# target does not need it installed) and again, in the installed package, only
# when find_package(promptcache COMPONENTS <name>) asks for the component (or
# for one that requires it). Adding a component is one call of this function
# (plus cmake/Find<Package>.cmake when a dependency has no CMake package of its
# own: it is installed with the package config); the install rules, the package
# config and the pkg-config files follow.
#
# The target is always defined and installed, so an installed package offers
# every component whatever the building machine had. With ONLY_WHEN_FOUND, the
# build tree's alias promptcache::<name> exists only when the dependencies are
# found, which is how our own tests and examples decide to skip what needs it.
function(promptcache_add_component name)
  cmake_parse_arguments(PARSE_ARGV 1 _pc "ONLY_WHEN_FOUND" "DESCRIPTION"
                        "FIND;LINK;REQUIRES;PKG_CONFIG;PKG_CONFIG_LIBS")
  if(NOT _pc_FIND OR NOT _pc_LINK)
    message(FATAL_ERROR "promptcache_add_component(${name}): FIND and LINK are required")
  endif()

  add_library(promptcache_${name} INTERFACE)
  set_target_properties(promptcache_${name} PROPERTIES EXPORT_NAME ${name})
  set(_pc_required_targets "")
  set(_pc_missing "")
  foreach(_pc_req IN LISTS _pc_REQUIRES)
    list(APPEND _pc_required_targets promptcache_${_pc_req})
    get_property(_pc_req_available GLOBAL PROPERTY PROMPTCACHE_COMPONENT_${_pc_req}_AVAILABLE)
    if(NOT _pc_req_available)
      list(APPEND _pc_missing promptcache::${_pc_req})
    endif()
  endforeach()
  target_link_libraries(promptcache_${name} INTERFACE promptcache ${_pc_required_targets} ${_pc_LINK})

  # One find_package call per AND-separated group of arguments (none when a
  # required component is already unavailable).
  set(_pc_group "")
  set(_pc_skip "${_pc_missing}")
  foreach(_pc_arg IN LISTS _pc_FIND ITEMS AND)
    if(NOT _pc_arg STREQUAL "AND")
      list(APPEND _pc_group "${_pc_arg}")
      continue()
    endif()
    list(GET _pc_group 0 _pc_package)
    if(NOT _pc_skip)
      if(NOT ${_pc_package}_FOUND)
        find_package(${_pc_group} QUIET)
      endif()
      if(NOT ${_pc_package}_FOUND)
        list(APPEND _pc_missing ${_pc_package})
      endif()
    endif()
    set(_pc_group "")
  endforeach()
  set(_pc_available TRUE)
  if(_pc_missing)
    set(_pc_available FALSE)
    list(JOIN _pc_missing ", " _pc_missing)
    message(STATUS "promptcache: promptcache::${name} (${_pc_DESCRIPTION}) needs ${_pc_missing}, "
                   "not found; the targets that do not need it are unaffected")
  endif()
  if(_pc_available OR NOT _pc_ONLY_WHEN_FOUND)
    add_library(promptcache::${name} ALIAS promptcache_${name})
  endif()

  set_property(GLOBAL APPEND PROPERTY PROMPTCACHE_COMPONENTS ${name})
  set_property(GLOBAL PROPERTY PROMPTCACHE_COMPONENT_${name}_AVAILABLE ${_pc_available})
  set_property(GLOBAL PROPERTY PROMPTCACHE_COMPONENT_${name}_FIND "${_pc_FIND}")
  set_property(GLOBAL PROPERTY PROMPTCACHE_COMPONENT_${name}_REQUIRES "${_pc_REQUIRES}")
  set_property(GLOBAL PROPERTY PROMPTCACHE_COMPONENT_${name}_DESCRIPTION "${_pc_DESCRIPTION}")
  set_property(GLOBAL PROPERTY PROMPTCACHE_COMPONENT_${name}_PKG_CONFIG "${_pc_PKG_CONFIG}")
  set_property(GLOBAL PROPERTY PROMPTCACHE_COMPONENT_${name}_PKG_CONFIG_LIBS "${_pc_PKG_CONFIG_LIBS}")
endfunction()
