// Uses the public headers the way a downstream project would after installing
// or vendoring promptcache: the umbrella header (standard library only) and,
// when PROMPTCACHE_CONSUMER_BLOCK_HASH is defined, block_hash.hpp (xxHash),
// PROMPTCACHE_CONSUMER_WIRE kv_event_wire.hpp (msgpack-cxx) and
// PROMPTCACHE_CONSUMER_ZMQ zmq_kv_subscriber.hpp (cppzmq, libzmq).
#include <promptcache/promptcache.hpp>
#ifdef PROMPTCACHE_CONSUMER_BLOCK_HASH
#include <promptcache/block_hash.hpp>
#endif
#ifdef PROMPTCACHE_CONSUMER_WIRE
#include <promptcache/kv_event_wire.hpp>
#endif
#ifdef PROMPTCACHE_CONSUMER_ZMQ
#include <promptcache/zmq_kv_subscriber.hpp>
#endif

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <span>
#include <vector>

namespace {

struct Layer {
  int id = 0;
};

bool cursor_works() {
  const auto state = promptcache::CursorState<>::initial().advance_to(0);
  return std::holds_alternative<promptcache::cursor::Contiguous<std::uint64_t>>(state.observe(1));
}

bool pool_works() {
  auto pool = promptcache::PromptCachePool<Layer>::with_defaults();
  std::vector<std::uint32_t> prompt(32);
  std::iota(prompt.begin(), prompt.end(), 1U);
  pool.insert_or_update(prompt, {Layer{1}, Layer{2}}, 0, 0, false);
  prompt.push_back(99);
  const auto hit = pool.find_longest_prefix(prompt);
  return hit && hit->matched == 32 && hit->entry->caches.size() == 2;
}

// The index takes any well-mixed 64-bit block hashes.
bool index_works(const std::vector<std::uint64_t>& local, const std::vector<std::uint64_t>& seq) {
  promptcache::KvIndex index;
  promptcache::kv_event::Stored stored;
  for (std::size_t i = 0; i < local.size(); ++i)
    stored.blocks.push_back({seq[i], local[i]});
  const promptcache::KvWorker worker{7, 0};
  if (!index.apply(worker, {0, stored}).ok()) return false;
  const auto matches = index.find_matches(local);
  return matches.size() == 1 && matches[0].worker == worker && matches[0].blocks == local.size();
}

bool hash_and_index_work() {
#ifdef PROMPTCACHE_CONSUMER_BLOCK_HASH
  std::vector<std::uint32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  const auto local = promptcache::local_block_hashes(tokens, 4);
  const auto seq = promptcache::sequence_hashes(local);
  // Dynamo's published values for these two blocks.
  if (local.size() != 2 || local[0] != 14643705804678351452ULL || seq[1] != 4945711292740353085ULL)
    return false;
  return index_works(local, seq);
#else
  return index_works({0x9E3779B97F4A7C15ULL, 0xBF58476D1CE4E5B9ULL},
                     {0x94D049BB133111EBULL, 0x2545F4914F6CDD1DULL});
#endif
}

// An empty KVEventBatch as vLLM publishes it: [ts, []] with ts a uint32.
bool wire_works() {
#ifdef PROMPTCACHE_CONSUMER_WIRE
  const unsigned char payload[] = {0x92, 0xce, 0x69, 0x2d, 0x81, 0xb6, 0x90};
  promptcache::KvWireBatch batch;
  const auto status = promptcache::decode_kv_event_batch(
      std::as_bytes(std::span<const unsigned char>(payload)), batch, promptcache::KvWireOptions{});
  if (!status.ok() || batch.ts != 1764590006.0 || !batch.events.empty()) return false;
#endif
#ifdef PROMPTCACHE_CONSUMER_ZMQ
  // Links libzmq: a subscriber on an in-process endpoint nobody publishes to.
  promptcache::ZmqKvSubscriber subscriber({{"inproc://promptcache-consumer", "", {1, 0}, ""}});
  if (subscriber.publisher_count() != 1 || subscriber.poll(std::chrono::milliseconds(0)) != 0)
    return false;
#endif
  return true;
}

}  // namespace

int main() {
  const bool ok_cursor = cursor_works();
  const bool ok_pool = pool_works();
  const bool ok_index = hash_and_index_work();
  const bool ok_wire = wire_works();
#ifdef PROMPTCACHE_CONSUMER_BLOCK_HASH
  const char* index_label = "block hash + index";
#else
  const char* index_label = "index (no xxHash)";
#endif
#if defined(PROMPTCACHE_CONSUMER_ZMQ)
  const char* wire_label = ", wire + zmq ";
#elif defined(PROMPTCACHE_CONSUMER_WIRE)
  const char* wire_label = ", wire ";
#else
  const char* wire_label = nullptr;
#endif
  std::printf("promptcache %d.%d.%d: cursor %s, pool %s, %s %s%s%s\n", PROMPTCACHE_VERSION_MAJOR,
              PROMPTCACHE_VERSION_MINOR, PROMPTCACHE_VERSION_PATCH, ok_cursor ? "ok" : "broken",
              ok_pool ? "ok" : "broken", index_label, ok_index ? "ok" : "broken",
              wire_label ? wire_label : "", wire_label ? (ok_wire ? "ok" : "broken") : "");
  return ok_cursor && ok_pool && ok_index && ok_wire ? 0 : 1;
}
