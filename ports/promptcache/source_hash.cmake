# promptcache_source_hash(<out-var> <source-dir>): the SHA-512 digest of the
# files this port builds from (CMakeLists.txt, LICENSE, cmake/*, every header
# under include/), computed exactly as scripts/amalgamate.py computes the
# digest it records in source.sha512 beside this file: one line
# "<sha512 of the file>  <path relative to the source dir>\n" per file, sorted
# by path, and the SHA-512 of those lines.
function(promptcache_source_hash out source_dir)
  file(GLOB _cmake_files LIST_DIRECTORIES false RELATIVE "${source_dir}" "${source_dir}/cmake/*")
  file(GLOB_RECURSE _headers LIST_DIRECTORIES false RELATIVE "${source_dir}" "${source_dir}/include/*.hpp")
  set(_files CMakeLists.txt LICENSE ${_cmake_files} ${_headers})
  list(SORT _files)
  set(_manifest "")
  foreach(_file IN LISTS _files)
    file(SHA512 "${source_dir}/${_file}" _digest)
    string(APPEND _manifest "${_digest}  ${_file}\n")
  endforeach()
  string(SHA512 _digest "${_manifest}")
  set(${out} "${_digest}" PARENT_SCOPE)
endfunction()
