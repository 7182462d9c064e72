// promptcache single-include header generated from include/promptcache/version.hpp
// by scripts/amalgamate.py. Do not edit: edit the sources and regenerate.
#pragma once
// ---- begin promptcache/version.hpp ----
#ifndef PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_VERSION_HPP
#define PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_VERSION_HPP
// promptcache: version.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The single source of the library's version: CMakeLists.txt, the Conan recipe
// and the tests read it from here.

#define PROMPTCACHE_VERSION_MAJOR 0
#define PROMPTCACHE_VERSION_MINOR 1
#define PROMPTCACHE_VERSION_PATCH 0

/// The version as one comparable integer: major * 10000 + minor * 100 + patch.
#define PROMPTCACHE_VERSION \
  (PROMPTCACHE_VERSION_MAJOR * 10000 + PROMPTCACHE_VERSION_MINOR * 100 + PROMPTCACHE_VERSION_PATCH)
#endif  // PROMPTCACHE_SINGLE_INCLUDE_PROMPTCACHE_VERSION_HPP
// ---- end promptcache/version.hpp ----
