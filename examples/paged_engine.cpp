// A toy paged-KV engine scheduler around PagedPrefixCache: a fixed budget of KV
// pages handed out from a free list, requests that reuse cached prefixes (lock
// while running, insert on finish), eviction when the free list runs dry, and a
// router-side KvIndex fed only by the cache's KV events. At the end it prints
// the hit rate, the evictions, and whether the router's index agrees with the
// cache for every conversation.
#include <promptcache/paged_prefix_cache.hpp>

#include <cstdint>
#include <cstdio>
#include <deque>
#include <random>
#include <vector>

namespace {

using PageId = std::uint32_t;
using Cache = promptcache::PagedPrefixCache<PageId>;

constexpr std::size_t page_size = 16;
constexpr std::size_t page_budget = 1024;  // KV pages of the "GPU"
constexpr std::size_t max_running = 8;
constexpr std::size_t run_steps = 3;  // scheduler steps a request runs for

struct Request {
  std::vector<std::uint32_t> tokens;  // prompt, then the generated tokens
  std::size_t output = 0;             // tokens to generate
  std::vector<PageId> pages;          // one per (partial) page of tokens + output
  promptcache::PagedPrefixHandle locked;
  std::size_t conversation = 0;
  std::size_t steps_left = run_steps;
};

}  // namespace

int main() {
  std::vector<PageId> free_pages;
  for (PageId p = page_budget; p-- > 0;)
    free_pages.push_back(p);

  // The router side: a KvIndex fed by this worker's events.
  promptcache::KvIndex router;
  const promptcache::KvWorker worker{1, 0};
  std::size_t events_rejected = 0;
  Cache cache(page_size, promptcache::eviction::Lru{}, [&](const promptcache::KvEvent& e) {
    if (!router.apply(worker, e).ok()) ++events_rejected;
  });

  // Conversations: one of 4 system prompts, then turns that each extend the
  // previous one (the prompt of turn t is the whole history of turn t - 1).
  std::mt19937 rng(3);
  const auto random_tokens = [&](std::size_t n) {
    std::vector<std::uint32_t> t(n);
    for (auto& x : t)
      x = static_cast<std::uint32_t>(rng() % 32000U);
    return t;
  };
  std::vector<std::vector<std::uint32_t>> systems;
  for (int i = 0; i < 4; ++i)
    systems.push_back(random_tokens(8 * page_size));
  std::vector<std::vector<std::uint32_t>> history(48);
  for (std::size_t c = 0; c < history.size(); ++c)
    history[c] = systems[c % systems.size()];

  std::deque<Request> waiting;
  std::vector<Request> running;
  std::size_t finished = 0, prompt_tokens = 0, reused_tokens = 0, evicted = 0, stalls = 0;
  std::size_t duplicates = 0;
  const std::size_t total_requests = 400;
  std::size_t submitted = 0;

  for (std::size_t step = 0; finished < total_requests; ++step) {
    // New turns arrive: a user message appended to the conversation so far.
    while (submitted < total_requests && waiting.size() < 4) {
      Request r;
      r.conversation = rng() % history.size();
      const auto user = random_tokens(page_size * (1 + rng() % 4) + rng() % page_size);
      r.tokens = history[r.conversation];
      r.tokens.insert(r.tokens.end(), user.begin(), user.end());
      r.output = 8 + rng() % 40;
      waiting.push_back(std::move(r));
      ++submitted;
    }

    // Admit waiting requests while pages last.
    while (!waiting.empty() && running.size() < max_running) {
      Request& r = waiting.front();
      const auto hit = cache.match(r.tokens);
      const std::size_t total_tokens = r.tokens.size() + r.output;
      const std::size_t need = (total_tokens + page_size - 1) / page_size - hit.pages.size();
      cache.lock(hit.handle);  // the matched pages must survive the eviction below
      if (free_pages.size() < need)
        evicted +=
            cache.evict(need - free_pages.size(), [&](PageId p) { free_pages.push_back(p); });
      if (free_pages.size() < need) {  // everything else is locked: wait for a finish
        cache.unlock(hit.handle);
        ++stalls;
        break;
      }
      prompt_tokens += r.tokens.size();
      reused_tokens += hit.matched;
      r.pages = hit.pages;
      for (std::size_t i = 0; i < need; ++i) {
        r.pages.push_back(free_pages.back());
        free_pages.pop_back();
      }
      r.locked = hit.handle;
      running.push_back(std::move(r));
      waiting.pop_front();
    }

    // Run one step; finished requests give their pages to the cache.
    for (std::size_t i = 0; i < running.size();) {
      Request& r = running[i];
      if (--r.steps_left > 0) {
        ++i;
        continue;
      }
      const auto generated = random_tokens(r.output);
      r.tokens.insert(r.tokens.end(), generated.begin(), generated.end());
      const auto ins = cache.insert(r.tokens, r.pages);
      // The cache keeps its own copy of pages it already had, and never takes
      // the partial last page: both go back to the free list.
      for (const PageId p : ins.duplicates)
        free_pages.push_back(p);
      for (std::size_t p = r.tokens.size() / page_size; p < r.pages.size(); ++p)
        free_pages.push_back(r.pages[p]);
      duplicates += ins.duplicates.size();
      cache.unlock(r.locked);
      history[r.conversation] = r.tokens;
      running[i] = std::move(running.back());
      running.pop_back();
      ++finished;
    }
    if (step > 100000) {
      std::puts("scheduler made no progress");
      return 1;
    }
  }

  // The router's view must match the cache's, page for page, for every conversation.
  std::size_t agree = 0;
  for (const auto& h : history) {
    promptcache::BlockHashOptions o;
    o.seed = cache.namespace_seed(0);
    const auto hashes = promptcache::local_block_hashes(h, page_size, o);
    const auto m = router.find_matches(hashes);
    const std::size_t routed = m.empty() ? 0 : m[0].blocks;
    agree += routed * page_size == cache.peek(h) ? 1U : 0U;
  }
  const auto& s = cache.stats();
  std::printf("requests finished:       %zu\n", finished);
  std::printf("prompt tokens reused:    %.1f%% (%zu of %zu)\n",
              100.0 * static_cast<double>(reused_tokens) / static_cast<double>(prompt_tokens),
              reused_tokens, prompt_tokens);
  std::printf("pages evicted:           %zu (admissions that waited: %zu)\n", evicted, stalls);
  std::printf("duplicate pages freed:   %zu\n", duplicates);
  std::printf("cached pages at the end: %zu of %zu (free: %zu)\n", cache.cached_pages(),
              page_budget, free_pages.size());
  std::printf("KV events published:     %llu (rejected by the index: %zu)\n",
              static_cast<unsigned long long>(s.events), events_rejected);
  std::printf("router index agrees:     %zu of %zu conversations; %zu blocks vs %zu pages\n", agree,
              history.size(), router.block_count(worker), cache.cached_pages());
  const bool ok = agree == history.size() && events_rejected == 0 &&
                  router.block_count(worker) == cache.cached_pages() &&
                  cache.cached_pages() + free_pages.size() == page_budget &&
                  cache.check_invariants();
  std::puts(ok ? "ok" : "MISMATCH");
  return ok ? 0 : 1;
}
