// The engine-side cost of publishing KV events (kv_event_publisher.hpp), as a
// ratio to the cache's own insert with a plain event sink, measured in the same
// run: PagedPrefixCache inserts of distinct prompts (16 blocks of 16 tokens
// each), a batch every 32 inserts, then one state dump of everything cached.
//
// Usage: kv_event_publisher_throughput [inserts (20000)] [rounds (3)]
#include <promptcache/kv_event_publisher.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t inserts = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 20000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  constexpr std::size_t page = 16, tokens_per_prompt = 256;
  std::vector<std::vector<std::uint32_t>> prompts(inserts);
  for (std::size_t i = 0; i < inserts; ++i)
    for (std::size_t t = 0; t < tokens_per_prompt; ++t)
      prompts[i].push_back(static_cast<std::uint32_t>(i * 1000 + t));
  const std::vector<std::uint32_t> pages(tokens_per_prompt / page);
  const double blocks = static_cast<double>(inserts * (tokens_per_prompt / page));
  std::printf("%zu inserts, %.0f blocks of %zu tokens\n", inserts, blocks, page);
  for (int round = 0; round < rounds; ++round) {
    double plain = 0, published = 0, dump = 0;
    std::size_t bytes = 0, dump_bytes = 0, held = 0;
    {
      std::uint64_t events = 0;
      promptcache::PagedPrefixCache<> cache(page, promptcache::eviction::Lru{},
                                            [&](const promptcache::KvEvent&) { ++events; });
      const auto t0 = std::chrono::steady_clock::now();
      for (const auto& p : prompts)
        cache.insert(p, pages);
      plain = seconds_since(t0);
    }
    {
      promptcache::KvEventPublisher pub;
      promptcache::PagedPrefixCache<> cache(page, promptcache::eviction::Lru{}, pub.sink());
      const auto t0 = std::chrono::steady_clock::now();
      for (std::size_t i = 0; i < inserts; ++i) {
        cache.insert(prompts[i], pages);
        if (i % 32 == 31 || i + 1 == inserts) bytes += pub.flush()->payload.size();
      }
      published = seconds_since(t0);
      held = pub.state_blocks();
      std::vector<std::byte> request(8, std::byte{0xff});
      request[7] = std::byte{0xfe};
      const auto t1 = std::chrono::steady_clock::now();
      pub.answer_replay(request,
                        [&](std::uint64_t, std::span<const char> p) { dump_bytes += p.size(); });
      dump = seconds_since(t1);
    }
    std::printf(
        "round %d: insert with a plain sink %.3f s, with the publisher %.3f s (%.1fx; %.2f us per "
        "block), %.1f bytes per block; dump of %zu blocks %.3f s (%.2f M blocks/s, %zu bytes)\n",
        round, plain, published, published / plain, published / blocks * 1e6,
        static_cast<double>(bytes) / blocks, held, dump, static_cast<double>(held) / dump / 1e6,
        dump_bytes);
  }
  return 0;
}
