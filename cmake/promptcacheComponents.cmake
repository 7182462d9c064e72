# promptcache_add_component(<name> DESCRIPTION <text> FIND <find_package args...>
#                           LINK <targets...> [PKG_CONFIG <pkg-config modules...>])
#
# Declares an optional component: the INTERFACE target promptcache::<name>, which
# is promptcache::promptcache plus one third-party dependency. The dependency is
# looked for here without being required (a project that never links the target
# does not need it installed) and again, in the installed package, only when
# find_package(promptcache COMPONENTS <name>) asks for the component. Adding a
# component is one call of this function (plus cmake/Find<Package>.cmake when the
# dependency has no CMake package of its own: it is installed with the package
# config); the install rules, the package config and the pkg-config files follow.
function(promptcache_add_component name)
  cmake_parse_arguments(PARSE_ARGV 1 _pc "" "DESCRIPTION" "FIND;LINK;PKG_CONFIG")
  if(NOT _pc_FIND OR NOT _pc_LINK)
    message(FATAL_ERROR "promptcache_add_component(${name}): FIND and LINK are required")
  endif()

  add_library(promptcache_${name} INTERFACE)
  add_library(promptcache::${name} ALIAS promptcache_${name})
  set_target_properties(promptcache_${name} PROPERTIES EXPORT_NAME ${name})
  target_link_libraries(promptcache_${name} INTERFACE promptcache ${_pc_LINK})

  list(GET _pc_FIND 0 _pc_package)
  if(NOT ${_pc_package}_FOUND)
    find_package(${_pc_FIND} QUIET)
  endif()
  if(NOT ${_pc_package}_FOUND)
    message(STATUS "promptcache: ${_pc_package} not found; promptcache::${name} "
                   "(${_pc_DESCRIPTION}) needs it, the other targets do not")
  endif()

  set_property(GLOBAL APPEND PROPERTY PROMPTCACHE_COMPONENTS ${name})
  set_property(GLOBAL PROPERTY PROMPTCACHE_COMPONENT_${name}_FIND "${_pc_FIND}")
  set_property(GLOBAL PROPERTY PROMPTCACHE_COMPONENT_${name}_DESCRIPTION "${_pc_DESCRIPTION}")
  set_property(GLOBAL PROPERTY PROMPTCACHE_COMPONENT_${name}_PKG_CONFIG "${_pc_PKG_CONFIG}")
endfunction()
