// Shared by the NATS transport tests: the index a subscriber should hold, built by
// decoding the published batches straight into a KvIndex, and the comparison of two
// indexes worker by worker.
#pragma once

#include <promptcache/kv_event_wire.hpp>
#include <promptcache/kv_index.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "catch.hpp"

namespace promptcache_test {

// `batches` applied straight to `index` as `worker`'s, as the subscriber applies them.
inline void apply_direct(promptcache::KvIndex& index, const promptcache::KvWorker& worker,
                         const std::vector<std::string>& batches) {
  promptcache::KvEventWireDecoder decoder;
  promptcache::KvWireStreamState state;
  promptcache::KvWireBatch batch;
  std::uint64_t id = 0;
  for (const auto& b : batches) {
    REQUIRE(decoder.decode(b.data(), b.size(), batch, state).ok());
    for (const auto& e : batch.events)
      (void)index.apply(worker, promptcache::KvEvent{id++, e});
  }
}

// Every worker's view in `got` equals its view in `want`.
inline void require_same(const promptcache::KvIndex& got, const promptcache::KvIndex& want) {
  // workers() lists in the order the index met them.
  std::vector<promptcache::KvWorker> a = got.workers();
  std::vector<promptcache::KvWorker> b = want.workers();
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  REQUIRE(a == b);
  for (const promptcache::KvWorker& w : b) {
    INFO("worker " << w.worker_id << " rank " << w.dp_rank);
    CHECK(got.block_count(w) == want.block_count(w));
    CHECK(got.dump(w) == want.dump(w));
  }
  CHECK(got.total_blocks() == want.total_blocks());
}

}  // namespace promptcache_test
