// chat_server: a stateless chat-server loop over a toy model, reusing prompt prefixes with
// promptcache::PromptCachePool.
//
// Like the hosted chat APIs, every call carries the whole conversation. The server looks up
// the longest cached prefix of the prompt, prefills only the rest, generates a reply, and
// stores the state after prompt + reply so the conversation's next turn resumes from it.
// Several conversations share one system prompt, which the server prefills once at start
// and pins: a conversation whose own state was evicted still resumes from it.
//
// The toy model's per-layer state is a running digest behind a shared_ptr: copying a
// LayerCache is a refcount bump (as with an engine's shared KV tensors), and prefilling
// costs work per token and layer. Every resumed state is checked against a full recompute.
#include <promptcache/prompt_cache_pool.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

using Token = std::uint32_t;
using Ids = std::vector<Token>;
constexpr std::size_t kLayers = 8;

// One layer's state after some tokens: a cheap, shared, immutable handle.
struct LayerCache {
  struct State {
    std::uint64_t digest;
    std::size_t tokens;
  };
  std::shared_ptr<const State> state;
};

class ToyModel {
 public:
  // Runs `tokens` through every layer, starting from `caches` (empty: from scratch).
  std::vector<LayerCache> prefill(const std::vector<LayerCache>& caches, const Token* tokens,
                                  std::size_t n) const {
    std::vector<LayerCache> out;
    for (std::size_t layer = 0; layer < kLayers; ++layer) {
      std::uint64_t d =
          caches.empty() ? 0x9E3779B97F4A7C15ULL + layer : caches[layer].state->digest;
      const std::size_t before = caches.empty() ? 0 : caches[layer].state->tokens;
      for (std::size_t i = 0; i < n; ++i) {
        // A few rounds of mixing stand in for attention + MLP over one token.
        for (int round = 0; round < 16; ++round) {
          d ^= tokens[i] + 0x9E3779B97F4A7C15ULL + (d << 6) + (d >> 2);
          d *= 0xff51afd7ed558ccdULL;
        }
      }
      out.push_back(
          LayerCache{std::make_shared<const LayerCache::State>(LayerCache::State{d, before + n})});
    }
    return out;
  }

  // Greedy "decoding": the next token is a function of the last layer's state.
  Token next_token(const std::vector<LayerCache>& caches) const {
    return static_cast<Token>(caches.back().state->digest % 32000);
  }
};

using Pool = promptcache::PromptCachePool<LayerCache, Token>;

struct Totals {
  std::size_t calls = 0, hits = 0, prompt_tokens = 0, reused = 0, recomputed = 0;
  double lookup_ns = 0;
};

// One stateless API call: the full prompt in, the reply out; the pool is the only memory.
Ids handle_call(Pool& pool, const ToyModel& model, const Ids& prompt, std::size_t reply_len,
                Totals& totals, std::size_t& reused_out) {
  const auto t0 = std::chrono::steady_clock::now();
  auto hit = pool.find_longest_prefix(prompt);
  totals.lookup_ns +=
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  std::vector<LayerCache> caches;
  std::size_t reused = 0;
  if (hit) {
    caches = hit->entry->caches;  // refcount bumps only
    reused = hit->matched;
    ++totals.hits;
  }
  caches = model.prefill(caches, prompt.data() + reused, prompt.size() - reused);
  // Resumed state must equal a from-scratch prefill: the pool never hands out wrong state.
  if (model.prefill({}, prompt.data(), prompt.size())[0].state->digest != caches[0].state->digest) {
    std::fprintf(stderr, "resumed state differs from a full prefill\n");
    std::exit(1);
  }
  Ids full = prompt;
  Ids reply;
  for (std::size_t i = 0; i < reply_len; ++i) {
    const Token t = model.next_token(caches);
    reply.push_back(t);
    full.push_back(t);
    caches = model.prefill(caches, &t, 1);
  }
  pool.insert(std::move(full), std::move(caches));
  ++totals.calls;
  totals.prompt_tokens += prompt.size();
  totals.reused += reused;
  totals.recomputed += prompt.size() - reused;
  reused_out = reused;
  return reply;
}

Ids words(std::uint32_t seed, std::size_t n) {
  Ids v;
  std::uint32_t x = seed * 2654435761U + 1;
  for (std::size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v.push_back(x % 32000);
  }
  return v;
}

}  // namespace

int main() {
  const ToyModel model;
  Pool::Options options;
  options.max_entries = 6;  // the system prompt + 5 conversations: LRU pressure on purpose
  options.ttl = std::chrono::minutes(5);
  options.min_cacheable_tokens = 8;
  Pool pool(options);

  // The shared system prompt: prefilled once, pinned, never evicted.
  const Ids system = words(1, 400);
  Pool::InsertOptions pinned;
  pinned.pinned = true;
  pool.insert(system, model.prefill({}, system.data(), system.size()), pinned);

  // Who calls when: conversations 0-2 are chatty; 3-5 open early and come back only at the
  // end, by which time 3's state has been evicted (LRU) and it resumes from the pinned system
  // prompt, while 4 and 5 still find their own.
  const std::vector<std::vector<std::size_t>> schedule{
      {3, 4, 5, 0, 1, 2}, {0, 1, 2}, {0, 1, 2}, {0, 1, 2, 5, 4, 3}};
  std::vector<Ids> history(6, system);
  Totals totals;
  std::printf("%-5s %-5s %8s %8s %10s\n", "conv", "turn", "prompt", "reused", "recomputed");
  for (std::size_t turn = 0; turn < schedule.size(); ++turn) {
    for (const std::size_t c : schedule[turn]) {
      Ids& h = history[c];
      const Ids user = words(static_cast<std::uint32_t>(100 * c + turn + 2), 30 + 10 * c);
      h.insert(h.end(), user.begin(), user.end());
      std::size_t reused = 0;
      const Ids reply = handle_call(pool, model, h, 24, totals, reused);
      std::printf("%-5zu %-5zu %8zu %8zu %10zu%s\n", c, turn, h.size(), reused, h.size() - reused,
                  reused == system.size() ? "   (from the pinned system prompt)" : "");
      h.insert(h.end(), reply.begin(), reply.end());
    }
  }

  const auto s = pool.stats();
  std::printf(
      "\ncalls %zu, hit rate %.0f%%, prefill tokens saved %zu of %zu (%.0f%%), "
      "mean lookup %.0f ns\n",
      totals.calls, 100.0 * static_cast<double>(totals.hits) / static_cast<double>(totals.calls),
      totals.reused, totals.prompt_tokens,
      100.0 * static_cast<double>(totals.reused) / static_cast<double>(totals.prompt_tokens),
      totals.lookup_ns / static_cast<double>(totals.calls));
  std::printf(
      "pool: %zu entries (%zu pinned); lookups %llu, hits %llu, inserted %llu, "
      "extended %llu, updated %llu, evicted lru %llu ttl %llu\n",
      s.entries, s.pinned_entries, static_cast<unsigned long long>(s.lookups),
      static_cast<unsigned long long>(s.hits), static_cast<unsigned long long>(s.inserted),
      static_cast<unsigned long long>(s.extended), static_cast<unsigned long long>(s.updated),
      static_cast<unsigned long long>(s.evicted_lru),
      static_cast<unsigned long long>(s.evicted_ttl));
  return 0;
}
