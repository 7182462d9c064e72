// PagedPrefixCache against a C++ port of SGLang's RadixCache design
// (bench/sglang_radix_port.hpp) on the same workload, at 10k, 100k and 1M cached
// pages and page sizes 1, 16 and 64.
//
// Workload: requests are one of 64 shared system prompts (16 steps) followed by
// 8..56 steps of request-specific tokens, a step being one page; the caches are
// filled with requests until they hold the target number of pages. Page size 1
// runs twice: with 1-token steps, and with 16-token steps (the requests of page
// size 16, one page per token: the prompts an engine with 1-token pages holds
// for the same traffic, in 16x fewer requests at the same page count). Then, in 7 rounds that
// alternate the two implementations:
// - match: 512 cached requests (plus a page the cache does not hold), sampled at
//   random; ns per matched page. Ours writes the page ids into a caller's table
//   (the span overload), the port into a reused vector. The floor is a memcmp of
//   the same query over the matched tokens, against a copy of itself ("hot") and
//   against the request's tokens in a flat store of every request ("store").
// - insert: 64 new requests; ns per page of the request (walked + stored).
// - evict: 64 calls, each freeing one request's worth of pages (what an engine
//   asks for before admitting a request); ns per freed page. The caches are back
//   at the target size after each round.
// A third cache publishes KV events (it hashes every page) and runs the same
// insert and evict rounds ("+events").
// Memory: PagedPrefixCache::memory() (index bytes, token ids excluded) without
// and with events, and the heap growth measured with mallinfo2 around building
// each structure (token ids subtracted).
//
// Branching (after the table, or alone with --branching): requests branch off one long
// context at many points; see branching() below.
//
// Usage: paged_prefix_cache [--quick | --only <pages> <page size> [<step>] | --branching]
//   --quick: 10k and 100k pages only; --only: one cell, request lengths in steps of
//   <step> tokens (default: the page size); --branching: the branching table only
#include <promptcache/paged_prefix_cache.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bench_platform.hpp"
#include "sglang_radix_port.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using PageId = std::uint32_t;
using Cache = promptcache::PagedPrefixCache<PageId>;
using Port = bench::SglangRadixPort<PageId>;

constexpr std::size_t system_prompts = 64;
constexpr std::size_t system_pages = 16;
constexpr std::size_t rounds = 7;
constexpr std::size_t match_batch = 512;
constexpr std::size_t write_batch = 64;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Request r's tokens, regenerated on demand from its number.
struct Workload {
  std::size_t ps;  // tokens per step of the request lengths below
  std::vector<std::vector<std::uint32_t>> systems;

  explicit Workload(std::size_t step) : ps(step) {
    std::mt19937 rng(7);
    for (std::size_t s = 0; s < system_prompts; ++s) {
      std::vector<std::uint32_t> t(system_pages * ps);
      for (auto& x : t)
        x = static_cast<std::uint32_t>(rng() % 50000U);
      systems.push_back(std::move(t));
    }
  }

  void request(std::uint64_t r, std::vector<std::uint32_t>& out) const {
    std::mt19937_64 rng(r * 0x9E3779B97F4A7C15ULL + 1);
    const auto& sys = systems[rng() % system_prompts];
    const std::size_t own = (8 + rng() % 49) * ps;
    out.assign(sys.begin(), sys.end());
    for (std::size_t i = 0; i < own; ++i)
      out.push_back(static_cast<std::uint32_t>(rng() % 50000U));
  }
};

struct Row {
  std::size_t pages = 0, ps = 0;
  double match_ours = 0, match_port = 0, match_memcmp = 0, match_store = 0;
  double r_match_store = 0, r_match_port = 0, r_insert = 0, r_evict = 0;
  double insert_ours = 0, insert_port = 0;
  double evict_ours = 0, evict_port = 0, insert_events = 0, evict_events = 0;
  double mem_index = 0, mem_index_hashes = 0, heap_ours = 0, heap_port = 0;
};

// Request lengths come in steps of `step` tokens (the page size, unless asked otherwise).
Row run(std::size_t target_pages, std::size_t ps, std::size_t step) {
  Row row;
  row.pages = target_pages;
  row.ps = ps;
  Workload w(step);
  std::vector<std::uint32_t> tok;
  std::vector<PageId> ids;
  PageId next_page = 0;
  const auto page_ids = [&](std::size_t n) {
    ids.resize(n);
    for (auto& p : ids)
      p = next_page++;
  };

  // Build both caches with the same requests (the port first, so its heap
  // growth is measured alone; then ours).
  std::uint64_t requests = 0;
  std::size_t token_total = 0;
  std::vector<std::uint32_t> store;  // every request's tokens, for the memcmp floor
  std::vector<std::size_t> store_off;
  const std::size_t heap0 = promptcache_bench::heap_in_use();
  auto port = std::make_unique<Port>(ps);
  {
    std::size_t cached = 0;
    for (std::uint64_t r = 0; cached < target_pages; ++r) {
      w.request(r, tok);
      page_ids(tok.size() / ps);
      const std::size_t hit = port->insert(tok, ids);
      store_off.push_back(store.size());
      store.insert(store.end(), tok.begin(), tok.end());
      cached += (tok.size() - hit) / ps;
      token_total += tok.size() - hit;
      requests = r + 1;
    }
  }
  const std::size_t heap1 = promptcache_bench::heap_in_use();
  auto ours = std::make_unique<Cache>(ps);
  for (std::uint64_t r = 0; r < requests; ++r) {
    w.request(r, tok);
    page_ids(tok.size() / ps);
    ours->insert(tok, ids);
  }
  const std::size_t heap2 = promptcache_bench::heap_in_use();
  const std::size_t cached = ours->cached_pages();
  const double token_bytes = static_cast<double>(token_total * sizeof(std::uint32_t));
  row.mem_index = static_cast<double>(ours->memory().index_bytes) / static_cast<double>(cached);
  row.heap_port = (static_cast<double>(heap1 - heap0) - token_bytes) / static_cast<double>(cached);
  row.heap_ours = (static_cast<double>(heap2 - heap1) - token_bytes) / static_cast<double>(cached);
  // The same index publishing KV events (hashing every page) to a sink.
  std::size_t events = 0;
  auto hashed = std::make_unique<Cache>(ps, promptcache::eviction::Lru{},
                                        [&](const promptcache::KvEvent&) { ++events; });
  for (std::uint64_t r = 0; r < requests; ++r) {
    w.request(r, tok);
    page_ids(tok.size() / ps);
    hashed->insert(tok, ids);
  }
  row.mem_index_hashes =
      static_cast<double>(hashed->memory().index_bytes) / static_cast<double>(cached);

  // Match queries: cached requests plus one uncached page.
  std::mt19937_64 rng(11);
  std::vector<std::uint32_t> qbuf, qcopy;
  std::vector<std::size_t> qoff{0};
  std::vector<const std::uint32_t*> qstored;  // the query's tokens where the store keeps them
  for (std::size_t i = 0; i < match_batch; ++i) {
    const std::uint64_t r = rng() % requests;
    qstored.push_back(store.data() + store_off[r]);
    w.request(r, tok);
    for (std::size_t j = 0; j < ps; ++j)
      tok.push_back(60000U + static_cast<std::uint32_t>(j));
    qbuf.insert(qbuf.end(), tok.begin(), tok.end());
    qoff.push_back(qbuf.size());
  }
  qcopy = qbuf;
  std::vector<PageId> out;
  out.reserve(1024);
  // Ours writes the ids into a caller's page table, as an engine does: room for the longest
  // query, so no match is capped.
  std::size_t longest = 0;
  for (std::size_t i = 0; i < match_batch; ++i)
    longest = std::max(longest, (qoff[i + 1] - qoff[i]) / ps);
  std::vector<PageId> table(longest);
  std::size_t matched_pages = 0;
  for (std::size_t i = 0; i < match_batch; ++i)
    matched_pages += ours->peek(std::span(qbuf).subspan(qoff[i], qoff[i + 1] - qoff[i])) / ps;

  std::vector<double> m_ours, m_port, m_memcmp, m_store, i_ours, i_port, e_ours, e_port, i_ev, e_ev;
  const auto ns = [](Clock::time_point a, Clock::time_point b, std::size_t pages) {
    return static_cast<double>(
               std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count()) /
           static_cast<double>(pages);
  };
  std::size_t sink = 0;
  // Match rounds first: they leave the cached content as it is.
  for (std::size_t round = 0; round < rounds; ++round) {
    auto t0 = Clock::now();
    std::size_t got = 0;
    for (std::size_t i = 0; i < match_batch; ++i)
      got += ours->match(std::span(qbuf).subspan(qoff[i], qoff[i + 1] - qoff[i]), 0,
                         std::span<PageId>(table))
                 .matched;
    auto t1 = Clock::now();
    std::size_t got_port = 0;
    for (std::size_t i = 0; i < match_batch; ++i) {
      port->match_prefix(std::span(qbuf).subspan(qoff[i], qoff[i + 1] - qoff[i]), out);
      got_port += out.size();
    }
    auto t2 = Clock::now();
    std::size_t differ = 0;
    for (std::size_t i = 0; i < match_batch; ++i) {
      const std::size_t n = qoff[i + 1] - qoff[i] - ps;  // the matched tokens
      differ += std::memcmp(qbuf.data() + qoff[i], qcopy.data() + qoff[i], n * 4) == 0 ? 0U : 1U;
    }
    auto t3 = Clock::now();
    for (std::size_t i = 0; i < match_batch; ++i) {
      const std::size_t n = qoff[i + 1] - qoff[i] - ps;
      differ += std::memcmp(qbuf.data() + qoff[i], qstored[i], n * 4) == 0 ? 0U : 1U;
    }
    auto t4 = Clock::now();
    sink += differ;
    if (got != matched_pages * ps || got_port != matched_pages) {
      std::fprintf(stderr, "match results differ: %zu %zu %zu\n", got / ps, got_port,
                   matched_pages);
      std::exit(1);
    }
    m_ours.push_back(ns(t0, t1, matched_pages));
    m_port.push_back(ns(t1, t2, matched_pages));
    m_memcmp.push_back(ns(t2, t3, matched_pages));
    m_store.push_back(ns(t3, t4, matched_pages));
  }

  // Insert rounds: a batch of new requests, then evict what they added (one
  // request's worth per call), in the same order for both.
  std::uint64_t next_request = requests;
  for (std::size_t round = 0; round < rounds; ++round) {
    std::vector<std::vector<std::uint32_t>> batch(write_batch);
    std::vector<std::vector<PageId>> batch_ids(write_batch);
    std::size_t batch_pages = 0;
    for (std::size_t i = 0; i < write_batch; ++i) {
      w.request(next_request++, batch[i]);
      page_ids(batch[i].size() / ps);
      batch_ids[i] = ids;
      batch_pages += ids.size();
    }
    const std::size_t before = ours->cached_pages();
    auto t0 = Clock::now();
    for (std::size_t i = 0; i < write_batch; ++i)
      ours->insert(batch[i], batch_ids[i]);
    auto t1 = Clock::now();
    for (std::size_t i = 0; i < write_batch; ++i)
      port->insert(batch[i], batch_ids[i]);
    auto t2 = Clock::now();
    for (std::size_t i = 0; i < write_batch; ++i)
      hashed->insert(batch[i], batch_ids[i]);
    auto t3 = Clock::now();
    i_ours.push_back(ns(t0, t1, batch_pages));
    i_port.push_back(ns(t1, t2, batch_pages));
    i_ev.push_back(ns(t2, t3, batch_pages));

    const std::size_t added = ours->cached_pages() - before;
    const std::size_t per_call = std::max<std::size_t>(1, added / write_batch);
    std::size_t freed_ours = 0, freed_port = 0;
    t0 = Clock::now();
    for (std::size_t i = 0; i < write_batch && freed_ours < added; ++i)
      freed_ours += ours->evict(i + 1 < write_batch ? per_call : added - freed_ours,
                                [&](PageId p) { sink += p; });
    t1 = Clock::now();
    for (std::size_t i = 0; i < write_batch && freed_port < added; ++i)
      freed_port += port->evict((i + 1 < write_batch ? per_call : added - freed_port) * ps,
                                [&](PageId p) { sink += p; }) /
                    ps;
    t2 = Clock::now();
    std::size_t freed_ev = 0;
    for (std::size_t i = 0; i < write_batch && freed_ev < added; ++i)
      freed_ev += hashed->evict(i + 1 < write_batch ? per_call : added - freed_ev,
                                [&](PageId p) { sink += p; });
    t3 = Clock::now();
    e_ours.push_back(ns(t0, t1, freed_ours));
    e_port.push_back(ns(t1, t2, freed_port));
    e_ev.push_back(ns(t2, t3, freed_ev));
  }
  if (sink == 42) std::puts("");
  // Ratios are taken within each round (the two runs sit next to each other in
  // time, so a load spike on the machine hits both) and then the median.
  const auto ratio = [](const std::vector<double>& a, const std::vector<double>& b) {
    std::vector<double> r;
    for (std::size_t i = 0; i < a.size(); ++i)
      r.push_back(a[i] / b[i]);
    return median(r);
  };
  row.r_match_store = ratio(m_ours, m_store);
  row.r_match_port = ratio(m_port, m_ours);
  row.r_insert = ratio(i_port, i_ours);
  row.r_evict = ratio(e_port, e_ours);
  row.match_ours = median(m_ours);
  row.match_port = median(m_port);
  row.match_memcmp = median(m_memcmp);
  row.match_store = median(m_store);
  row.insert_ours = median(i_ours);
  row.insert_port = median(i_port);
  row.evict_ours = median(e_ours);
  row.evict_port = median(e_port);
  row.insert_events = median(i_ev);
  row.evict_events = median(e_ev);
  if (events == 0) std::puts("");
  return row;
}

struct BranchRow {
  std::size_t ps = 0, points = 0;
  bool random = false;
  double match_ns = 0, match_page_ns = 0, insert_ns = 0;
  double block_ratio = 0;  // memory().token_bytes over the cached pages' token bytes
  double heap_mb = 0, live_mb = 0;
};

// Branching: one context of `context_pages` pages is cached, then requests branch off it at
// every `stride`-th page (from the end toward the start, or in random order): each matches
// the context up to its branch point (splitting the node there) and inserts 4 pages of its
// own after it, as agent forks, tree search or retries that diverge late do. Reports ns
// per match and per matched page, ns per insert, memory().token_bytes against the cached
// tokens, and the heap the cache holds at the end (median over rounds, a fresh cache each).
BranchRow branching(std::size_t ps, std::size_t context_pages, std::size_t stride, bool random) {
  BranchRow row;
  row.ps = ps;
  row.random = random;
  std::mt19937 rng(5);
  std::vector<std::uint32_t> context(context_pages * ps);
  for (auto& x : context)
    x = static_cast<std::uint32_t>(rng() % 50000U);
  std::vector<std::size_t> points;
  for (std::size_t b = context_pages - stride; b >= stride; b -= stride)
    points.push_back(b);
  if (random) std::shuffle(points.begin(), points.end(), rng);
  row.points = points.size();
  constexpr std::size_t own = 4;
  std::vector<PageId> ids(context_pages + own), table(context_pages);
  std::iota(ids.begin(), ids.end(), PageId{0});
  std::vector<std::uint32_t> request;
  std::vector<double> m_ns, m_page_ns, i_ns, ratio, heap;
  std::size_t sink = 0;
  for (std::size_t round = 0; round < rounds; ++round) {
    const std::size_t heap0 = promptcache_bench::heap_with_mmap();
    {
      Cache c(ps);
      c.insert(context, ids);
      std::uint32_t fresh = 60000;
      Clock::duration t_match{}, t_insert{};
      std::size_t matched = 0;
      for (const std::size_t b : points) {
        request.assign(context.begin(), context.begin() + static_cast<std::ptrdiff_t>(b * ps));
        for (std::size_t i = 0; i < own * ps; ++i)
          request.push_back(fresh++);
        const auto t0 = Clock::now();
        const auto m = c.match(std::span(request).first(b * ps), 0, std::span<PageId>(table));
        const auto t1 = Clock::now();
        const auto r = c.insert(request, ids);
        const auto t2 = Clock::now();
        t_match += t1 - t0;
        t_insert += t2 - t1;
        matched += m.matched / ps;
        sink += r.inserted_pages;
      }
      const auto ns = [](Clock::duration d) {
        return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
      };
      const auto n = static_cast<double>(points.size());
      m_ns.push_back(ns(t_match) / n);
      m_page_ns.push_back(ns(t_match) / static_cast<double>(matched));
      i_ns.push_back(ns(t_insert) / n);
      const double live = static_cast<double>(c.cached_pages() * ps * sizeof(std::uint32_t));
      ratio.push_back(static_cast<double>(c.memory().token_bytes) / live);
      heap.push_back(static_cast<double>(promptcache_bench::heap_with_mmap() - heap0) / 1e6);
      row.live_mb = live / 1e6;
    }
  }
  if (sink == 42) std::puts("");
  row.match_ns = median(m_ns);
  row.match_page_ns = median(m_page_ns);
  row.insert_ns = median(i_ns);
  row.block_ratio = median(ratio);
  row.heap_mb = median(heap);
  return row;
}

void print_branching() {
  // Each round builds a fresh cache. Pages the allocator hands back to the system when the
  // previous round's cache goes would be faulted in again inside the timed calls (several
  // microseconds each on a VM): that measures the allocator's trimming, not the cache. Keep
  // freed memory in the process, and big blocks on the heap, so that rounds after the first
  // (the median) run on a warm heap, as an engine's does.
  promptcache_bench::keep_freed_memory();
  std::printf(
      "\nBranching off one context of 1,000 pages (page size 1: 16,000 tokens, a branch every "
      "16th): match and insert per branch, median of %zu rounds\n",
      rounds);
  std::printf(
      "| page | branches | order | match ns | match ns/page | insert ns | token bytes / cached "
      "| heap MB | cached token MB |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& [ps, pages, stride] :
       {std::tuple{std::size_t{16}, std::size_t{1000}, std::size_t{1}},
        std::tuple{std::size_t{1}, std::size_t{16000}, std::size_t{16}}}) {
    for (const bool random : {false, true}) {
      const BranchRow r = branching(ps, pages, stride, random);
      std::printf("| %zu | %zu | %s | %.0f | %.2f | %.0f | %.2f | %.2f | %.3f |\n", r.ps, r.points,
                  r.random ? "random" : "descending", r.match_ns, r.match_page_ns, r.insert_ns,
                  r.block_ratio, r.heap_mb, r.live_mb);
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  if (argc > 1 && std::string(argv[1]) == "--branching") {
    print_branching();
    return 0;
  }
  std::vector<std::size_t> sizes{10000, 100000};
  // (page size, request-length step in tokens). At page size 1 the workload is run twice:
  // with requests as long in pages as at the other sizes (so 16x shorter in tokens than at
  // page size 16), and with the same requests as at page size 16, one page per token, which
  // is what an engine with 1-token pages stores for the same traffic.
  std::vector<std::pair<std::size_t, std::size_t>> cells{{1, 1}, {1, 16}, {16, 16}, {64, 64}};
  if (!quick) sizes.push_back(1000000);
  if (argc > 3 && std::string(argv[1]) == "--only") {  // --only <pages> <page size> [<step>]
    sizes = {std::stoul(argv[2])};
    const std::size_t ps = std::stoul(argv[3]);
    cells = {{ps, argc > 4 ? std::stoul(argv[4]) : ps}};
  }
  std::printf(
      "ns per page, median of %zu interleaved rounds; ratios are per-round medians: port / "
      "ours, and ours / memcmp store for match\n",
      rounds);
  std::printf(
      "| pages | page | match ours | memcmp hot | memcmp store | ours/store | match port | "
      "port/ours | insert ours | insert port | port/ours | insert +events | evict ours | evict "
      "port | port/ours | evict +events | index B/page | +events | heap B/page ours | heap "
      "B/page port |\n");
  std::printf(
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const std::size_t n : sizes) {
    for (const auto& [ps, step] : cells) {
      const Row r = run(n, ps, step);
      const std::string page =
          step == ps ? std::to_string(ps)
                     : std::to_string(ps) + " (" + std::to_string(step) + "-token steps)";
      std::printf(
          "| %zu | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f | %.1f | %.1f | %.1f | %.1f | "
          "%.1f | %.1f | %.0f | %.1f | %.1f | %.1f | %.1f | %.1f |\n",
          r.pages, page.c_str(), r.match_ours, r.match_memcmp, r.match_store, r.r_match_store,
          r.match_port, r.r_match_port, r.insert_ours, r.insert_port, r.r_insert, r.insert_events,
          r.evict_ours, r.evict_port, r.r_evict, r.evict_events, r.mem_index, r.mem_index_hashes,
          r.heap_ours, r.heap_port);
      std::fflush(stdout);
    }
  }
  if (argc <= 3) print_branching();
  return 0;
}
