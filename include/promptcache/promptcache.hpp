// promptcache: promptcache.hpp
// SPDX-License-Identifier: Apache-2.0
//
// Umbrella header: includes every public promptcache header.
#pragma once

#include "promptcache/block_hash.hpp"
#include "promptcache/coarse_steady_clock.hpp"
#include "promptcache/cursor.hpp"
#include "promptcache/kv_index.hpp"
#include "promptcache/kv_router.hpp"
#include "promptcache/manual_clock.hpp"
#include "promptcache/paged_eviction_policy.hpp"
#include "promptcache/paged_prefix_cache.hpp"
#include "promptcache/prompt_cache_pool.hpp"
#include "promptcache/synchronized_prompt_cache_pool.hpp"
#include "promptcache/version.hpp"
