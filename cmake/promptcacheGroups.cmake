# Helpers for the project's own programs (tests, benchmarks), not for users of the
# library: included by the top-level CMakeLists.txt when one of those parts is built.

# promptcache_group_source(<var> <prefix> <sources...>): the text of one translation
# unit holding the sources: every #include line of them first (sorted, each once),
# then each source inside namespace <prefix><file name>, so that two sources may
# define the same names (their own #include lines are no-ops there, the headers' include
# guards being set). A source with an #include inside #if does not belong in a group:
# its include would be hoisted unconditionally (promptcache_groupable tells).
function(promptcache_group_source out prefix)
  set(_includes "")
  set(_bodies "")
  foreach(_src IN LISTS ARGN)
    get_filename_component(_name "${_src}" NAME_WE)
    file(STRINGS "${_src}" _lines REGEX "^[ \t]*#[ \t]*include[ \t]")
    list(APPEND _includes ${_lines})
    string(APPEND _bodies "namespace ${prefix}${_name} {\n#include \"${_src}\"\n}  // namespace ${prefix}${_name}\n")
  endforeach()
  list(REMOVE_DUPLICATES _includes)
  list(SORT _includes)
  string(REPLACE ";" "\n" _includes "${_includes}")
  set(${out} "${_includes}\n${_bodies}" PARENT_SCOPE)
endfunction()

# promptcache_groupable(<source> <var>): TRUE when the source has no conditional
# compilation (no #if, #ifdef, #ifndef line), so that promptcache_group_source may
# hoist its includes.
function(promptcache_groupable src out)
  file(STRINGS "${src}" _conditionals REGEX "^[ \t]*#[ \t]*if")
  if(_conditionals)
    set(${out} FALSE PARENT_SCOPE)
  else()
    set(${out} TRUE PARENT_SCOPE)
  endif()
endfunction()
