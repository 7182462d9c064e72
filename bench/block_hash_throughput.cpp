// Block hashing throughput: GB/s of token bytes hashed per block (block sizes
// 16, 64, 512, Dynamo's local hash) against one XXH3_64bits call over the same
// bytes, measured in the same run. The ratio one-shot / per-block is the cost
// of cutting the sequence into blocks; the target is <= 2x at block size 64.
//
// Usage: block_hash_throughput [tokens=262144] [repeats=7]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "promptcache/block_hash.hpp"

namespace {

using Clock = std::chrono::steady_clock;

volatile std::uint64_t g_sink = 0;  // keeps every result observable

// Best-of-`repeats` seconds per call of `fn`, each repeat running `fn` enough
// times to last ~50 ms.
double seconds_per_call(const std::function<std::uint64_t()>& fn, int repeats) {
  std::size_t iterations = 1;
  for (;;) {  // calibrate
    const auto start = Clock::now();
    for (std::size_t i = 0; i < iterations; ++i)
      g_sink = g_sink + fn();
    if (std::chrono::duration<double>(Clock::now() - start).count() > 0.05) break;
    iterations *= 2;
  }
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    for (std::size_t i = 0; i < iterations; ++i)
      g_sink = g_sink + fn();
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::min(best, s / static_cast<double>(iterations));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t num_tokens = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 262144;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 7;
  if (num_tokens == 0 || repeats <= 0) {
    std::fprintf(stderr, "usage: %s [tokens > 0] [repeats > 0]\n", argv[0]);
    return 2;
  }

  std::mt19937 gen(42);
  std::vector<std::uint32_t> tokens(num_tokens);
  for (auto& t : tokens)
    t = static_cast<std::uint32_t>(gen() % 152064);  // a Qwen-sized vocab
  const double bytes = static_cast<double>(num_tokens * sizeof(std::uint32_t));
  std::vector<std::uint64_t> out(num_tokens + 1);
  std::vector<std::uint64_t> seq(num_tokens + 1);

  const auto one_shot = [&] {
    return promptcache::detail::xxh3_64(tokens.data(), tokens.size() * sizeof(std::uint32_t));
  };

  std::printf("block hashing throughput, %zu tokens (%.1f MiB), best of %d\n", num_tokens,
              bytes / (1024.0 * 1024.0), repeats);
  std::printf("%-28s %12s %14s %12s\n", "case", "GB/s", "one-shot GB/s", "ratio");

  const auto row = [&](const std::string& name, const std::function<std::uint64_t()>& fn) {
    const double base = bytes / seconds_per_call(one_shot, repeats) / 1e9;
    const double gbs = bytes / seconds_per_call(fn, repeats) / 1e9;
    std::printf("%-28s %12.2f %14.2f %11.2fx\n", name.c_str(), gbs, base, base / gbs);
  };

  for (const std::size_t block_size : {std::size_t{16}, std::size_t{64}, std::size_t{512}}) {
    row("local, block " + std::to_string(block_size), [&] {
      const std::size_t n = promptcache::local_block_hashes(tokens, block_size, out);
      return out[n / 2];
    });
  }
  row("local+sequence, block 64", [&] {
    const std::size_t n = promptcache::local_block_hashes(tokens, 64, out);
    promptcache::sequence_hashes(std::span(out).first(n), seq);
    return n == 0 ? 0 : seq[n - 1];
  });
  row("local, block 64, Eagle", [&] {
    const std::size_t n = promptcache::local_block_hashes(tokens, 64, out, {.eagle = true});
    return out[n / 2];
  });
  row("local, block 64, LE-encoded", [&] {  // the big-endian-host path
    const std::size_t n = promptcache::detail::local_block_hashes<false>(tokens, 64, out, {});
    return out[n / 2];
  });
  std::printf("(ratio = one-shot GB/s / case GB/s; lower is better)\n");
  return g_sink == 0xFFFFFFFFFFFFFFFFULL ? 1 : 0;
}
