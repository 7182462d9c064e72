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
// costs work per token and layer. Every resumed state is checked against a full recompute,
// and the program stops with an error if one differs.
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

// Where a call's prefill started from.
enum class Resumed { nothing, system_prompt, own_state };

struct Totals {
  std::size_t calls = 0, prompt_tokens = 0, reused = 0, recomputed = 0, checked = 0;
  std::size_t resumed[3] = {0, 0, 0};  // indexed by Resumed
  double lookup_ns = 0;
};

struct Call {
  Ids reply;
  std::size_t reused = 0;
};

// One stateless API call: the full prompt in, the reply out; the pool is the only memory.
Call handle_call(Pool& pool, const ToyModel& model, const Ids& prompt, std::size_t reply_len,
                 Totals& totals) {
  const auto t0 = std::chrono::steady_clock::now();
  auto hit = pool.find_longest_prefix(prompt);
  totals.lookup_ns +=
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  std::vector<LayerCache> caches;
  Call call;
  if (hit) {
    caches = hit->entry->caches;  // refcount bumps only
    call.reused = hit->matched;
  }
  caches = model.prefill(caches, prompt.data() + call.reused, prompt.size() - call.reused);
  // A resumed state must equal a from-scratch prefill: the pool never hands out wrong state.
  if (model.prefill({}, prompt.data(), prompt.size())[0].state->digest != caches[0].state->digest) {
    std::fprintf(stderr, "error: the state resumed from the pool differs from a full prefill\n");
    std::exit(1);
  }
  ++totals.checked;
  Ids full = prompt;
  for (std::size_t i = 0; i < reply_len; ++i) {
    const Token t = model.next_token(caches);
    call.reply.push_back(t);
    full.push_back(t);
    caches = model.prefill(caches, &t, 1);
  }
  pool.insert(std::move(full), std::move(caches));
  ++totals.calls;
  totals.prompt_tokens += prompt.size();
  totals.reused += call.reused;
  totals.recomputed += prompt.size() - call.reused;
  return call;
}

Ids words(std::uint32_t salt, std::size_t n) {
  Ids v;
  std::uint32_t x = salt * 2654435761U + 1;
  for (std::size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v.push_back(x % 32000);
  }
  return v;
}

double percent(std::size_t part, std::size_t whole) {
  return whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
}

}  // namespace

int main() {
  const ToyModel model;
  constexpr std::size_t kConversations = 6;
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

  std::printf(
      "A stateless chat server: every call carries the whole conversation, and the server\n"
      "prefills only what the prompt cache pool does not already hold.\n"
      "%zu conversations share a %zu-token system prompt, prefilled once at start and pinned.\n"
      "The pool keeps at most %zu entries (the system prompt + 5 conversations), evicting the\n"
      "least recently used, so a conversation that stays idle too long loses its own state.\n\n",
      kConversations, system.size(), options.max_entries);

  // Who calls when: conversations 0-2 are chatty; 3-5 open early and come back only at the
  // end, by which time 3's state has been evicted (LRU) and it resumes from the pinned system
  // prompt, while 4 and 5 still find their own.
  const std::vector<std::vector<std::size_t>> schedule{
      {3, 4, 5, 0, 1, 2}, {0, 1, 2}, {0, 1, 2}, {0, 1, 2, 5, 4, 3}};
  std::vector<Ids> history(kConversations, system);
  std::vector<std::size_t> turns(kConversations, 0);
  Totals totals;
  std::printf("%4s %4s %4s  %13s %13s %10s  %s\n", "call", "conv", "turn", "prompt tokens",
              "reused tokens", "prefilled", "resumed from");
  for (std::size_t round = 0; round < schedule.size(); ++round) {
    for (const std::size_t c : schedule[round]) {
      Ids& h = history[c];
      const std::size_t turn = ++turns[c];
      const Ids user = words(static_cast<std::uint32_t>(100 * c + round + 2), 30 + 10 * c);
      h.insert(h.end(), user.begin(), user.end());
      const Call call = handle_call(pool, model, h, 24, totals);
      Resumed from = Resumed::nothing;
      const char* what = "nothing: full prefill";
      if (call.reused > system.size()) {
        from = Resumed::own_state;
        what = "its own previous turn";
      } else if (call.reused == system.size()) {
        from = Resumed::system_prompt;
        what = turn == 1 ? "the system prompt only (first turn)"
                         : "the system prompt only (its own state was evicted)";
      }
      ++totals.resumed[static_cast<int>(from)];
      std::printf("%4zu %4zu %4zu  %13zu %13zu %10zu  %s\n", totals.calls, c, turn, h.size(),
                  call.reused, h.size() - call.reused, what);
      h.insert(h.end(), call.reply.begin(), call.reply.end());
    }
  }

  const auto s = pool.stats();
  std::printf(
      "\nEvery resumed state was compared with a full prefill of its prompt: %zu of %zu equal.\n",
      totals.checked, totals.calls);
  std::printf(
      "Calls: %zu. Resumed from their own previous turn: %zu; from the system prompt only: %zu; "
      "from nothing: %zu.\n",
      totals.calls, totals.resumed[static_cast<int>(Resumed::own_state)],
      totals.resumed[static_cast<int>(Resumed::system_prompt)],
      totals.resumed[static_cast<int>(Resumed::nothing)]);
  std::printf(
      "Prompt tokens: %zu, of which %zu (%.0f%%) came from the pool and %zu were prefilled.\n",
      totals.prompt_tokens, totals.reused, percent(totals.reused, totals.prompt_tokens),
      totals.recomputed);
  std::printf("Mean pool lookup: %.0f ns.\n", totals.lookup_ns / static_cast<double>(totals.calls));
  std::printf(
      "Pool at exit: %zu entries (%zu pinned). %llu lookups, %llu found a prefix (the system\n"
      "prompt counts). Inserts: %llu new entries, %llu extended a conversation's entry in place,\n"
      "%llu replaced identical ids. Evicted: %llu least recently used, %llu idle past the TTL.\n",
      s.entries, s.pinned_entries, static_cast<unsigned long long>(s.lookups),
      static_cast<unsigned long long>(s.hits), static_cast<unsigned long long>(s.inserted),
      static_cast<unsigned long long>(s.extended), static_cast<unsigned long long>(s.updated),
      static_cast<unsigned long long>(s.evicted_lru),
      static_cast<unsigned long long>(s.evicted_ttl));
  return 0;
}
