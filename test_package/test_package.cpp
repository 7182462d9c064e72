#include <promptcache/promptcache.hpp>
#ifdef TEST_PACKAGE_BLOCK_HASH
#include <promptcache/block_hash.hpp>
#endif
#ifdef TEST_PACKAGE_KV_EVENT_WIRE
#include <promptcache/kv_event_wire.hpp>
#endif
#ifdef TEST_PACKAGE_ZMQ_KV_SUBSCRIBER
#include <promptcache/zmq_kv_subscriber.hpp>
#endif

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

int main() {
  const auto state = promptcache::CursorState<>::live(0);
  bool ok =
      std::holds_alternative<promptcache::cursor::Contiguous<std::uint64_t>>(state.observe(1));
#ifdef TEST_PACKAGE_BLOCK_HASH
  const std::vector<std::uint32_t> tokens = {1, 2, 3, 4};
  ok = ok && promptcache::local_block_hashes(tokens, 4).at(0) == 14643705804678351452ULL;
#endif
#ifdef TEST_PACKAGE_KV_EVENT_WIRE
  // An empty KVEventBatch: [ts, []].
  const unsigned char payload[] = {0x92, 0xce, 0x69, 0x2d, 0x81, 0xb6, 0x90};
  promptcache::KvWireBatch batch;
  ok = ok &&
       promptcache::decode_kv_event_batch(std::as_bytes(std::span<const unsigned char>(payload)),
                                          batch, promptcache::KvWireOptions{})
           .ok();
#endif
#ifdef TEST_PACKAGE_ZMQ_KV_SUBSCRIBER
  promptcache::ZmqKvSubscriber subscriber({{"inproc://test-package", "", {1, 0}, ""}});
  ok = ok && subscriber.poll(std::chrono::milliseconds(0)) == 0;
#endif
  std::printf("promptcache %d.%d.%d %s\n", PROMPTCACHE_VERSION_MAJOR, PROMPTCACHE_VERSION_MINOR,
              PROMPTCACHE_VERSION_PATCH, ok ? "works" : "is broken");
  return ok ? 0 : 1;
}
