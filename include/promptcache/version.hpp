// promptcache: version.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The single source of the library's version: CMakeLists.txt, the Conan recipe
// and the tests read it from here.
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
#endif
#if !defined(PROMPTCACHE_VERSION_HPP) && (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) >= 202002L
#define PROMPTCACHE_VERSION_HPP

#define PROMPTCACHE_VERSION_MAJOR 0
#define PROMPTCACHE_VERSION_MINOR 2
#define PROMPTCACHE_VERSION_PATCH 0

/// The version as one comparable integer: major * 10000 + minor * 100 + patch. Minor and
/// patch get two decimal digits each, so they stay below 100 (checked below): a minor of 100
/// would read as the next major version.
#define PROMPTCACHE_VERSION \
  (PROMPTCACHE_VERSION_MAJOR * 10000 + PROMPTCACHE_VERSION_MINOR * 100 + PROMPTCACHE_VERSION_PATCH)

static_assert(PROMPTCACHE_VERSION_MAJOR >= 0 && PROMPTCACHE_VERSION_MINOR >= 0 &&
                  PROMPTCACHE_VERSION_MINOR < 100 && PROMPTCACHE_VERSION_PATCH >= 0 &&
                  PROMPTCACHE_VERSION_PATCH < 100,
              "PROMPTCACHE_VERSION packs minor and patch into two decimal digits each");

#endif  // PROMPTCACHE_VERSION_HPP
