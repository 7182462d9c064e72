// promptcache: promptcache.hpp
// SPDX-License-Identifier: Apache-2.0
//
// Umbrella header: every public promptcache header that needs nothing but the
// standard library (the promptcache::promptcache target). Headers with a
// third-party dependency are included on their own, with their target:
// block_hash.hpp and paged_prefix_cache.hpp (xxHash, promptcache::block_hash),
// kv_event_wire.hpp (msgpack-cxx, promptcache::kv_event_wire) and
// zmq_kv_subscriber.hpp (ZeroMQ, promptcache::zmq_kv_subscriber).
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
#endif
#if !defined(PROMPTCACHE_PROMPTCACHE_HPP) && \
    (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) >= 202002L
#define PROMPTCACHE_PROMPTCACHE_HPP

#include "promptcache/coarse_steady_clock.hpp"
#include "promptcache/cursor.hpp"
#include "promptcache/kv_index.hpp"
#include "promptcache/kv_router.hpp"
#include "promptcache/manual_clock.hpp"
#include "promptcache/paged_eviction_policy.hpp"
#include "promptcache/prompt_cache_pool.hpp"
#include "promptcache/synchronized_prompt_cache_pool.hpp"
#include "promptcache/version.hpp"

#endif  // PROMPTCACHE_PROMPTCACHE_HPP
