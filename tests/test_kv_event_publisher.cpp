// kv_event_publisher.hpp: the bytes of every layout against an encoder written
// in Python from vLLM's msgspec classes (tests/kv_event_wire/vllm_encoder.py),
// the replay buffer and the answers to bad requests, and an engine (a
// PagedPrefixCache) followed over ZeroMQ on loopback by ZmqKvSubscriber: live,
// through replays, and by a router joining after many steps, which is exact
// only with the state dump. Every wait polls with a bounded number of rounds.
#include <promptcache/kv_event_publisher.hpp>
#include <promptcache/zmq_kv_subscriber.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "catch.hpp"

using promptcache::KvBlock;
using promptcache::KvEncodedBatch;
using promptcache::KvEvent;
using promptcache::KvEventPublisher;
using promptcache::KvEventPublisherOptions;
using promptcache::KvIndex;
using promptcache::KvWireLayout;
using promptcache::KvWorker;
using promptcache::PagedPrefixCache;
using promptcache::PagedStoredPages;
using promptcache::ZmqKvEventPublisher;
using promptcache::ZmqKvEventPublisherOptions;
using promptcache::ZmqKvSubscriber;
namespace kv_event = promptcache::kv_event;
using namespace std::chrono_literals;

namespace {

const KvWorker W{7, 0};

std::string hex(std::span<const char> b) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (const char c : b) {
    const auto u = static_cast<unsigned char>(c);
    s += digits[u >> 4U];
    s += digits[u & 15U];
  }
  return s;
}

// ---- a scenario, fed to the publisher and written as JSON for the Python encoder ----

struct Ev {
  std::string kind;  // stored, removed, cleared
  std::vector<std::uint64_t> hashes;
  std::optional<std::uint64_t> parent;
  std::vector<std::uint32_t> tokens;
  std::uint64_t ns = 0;
};

struct Batch {
  double ts = 0;
  std::vector<Ev> events;
};

std::string json_list(const auto& v) {
  std::ostringstream o;
  o << '[';
  for (std::size_t i = 0; i < v.size(); ++i)
    o << (i ? "," : "") << v[i];
  o << ']';
  return o.str();
}

// A namespace's seed as the publisher is told it (set_namespace).
struct Seed {
  std::string lora;
  std::optional<std::int64_t> id;
  std::string salt;
};

std::string to_json(const std::vector<Batch>& batches, std::optional<std::uint32_t> dp_rank,
                    const std::map<std::uint64_t, Seed>& seeds) {
  std::ostringstream o;
  o.precision(17);
  o << '[';
  for (std::size_t b = 0; b < batches.size(); ++b) {
    o << (b ? "," : "") << "{\"ts\":" << batches[b].ts << ",\"dp_rank\":";
    if (dp_rank)
      o << *dp_rank;
    else
      o << "null";
    o << ",\"events\":[";
    for (std::size_t i = 0; i < batches[b].events.size(); ++i) {
      const Ev& e = batches[b].events[i];
      o << (i ? "," : "") << "{\"kind\":\"" << e.kind << "\"";
      if (e.kind != "cleared") o << ",\"hashes\":" << json_list(e.hashes);
      if (e.kind == "stored") {
        o << ",\"parent\":";
        if (e.parent)
          o << *e.parent;
        else
          o << "null";
        o << ",\"tokens\":" << json_list(e.tokens)
          << ",\"block_size\":" << e.tokens.size() / e.hashes.size();
        // A namespace not described: the cache's default, its id as the salt.
        const auto it = seeds.find(e.ns);
        const Seed seed = it != seeds.end() ? it->second
                          : e.ns != 0       ? Seed{"", std::nullopt, std::to_string(e.ns)}
                                            : Seed{};
        if (!seed.lora.empty()) {
          o << ",\"lora_name\":\"" << seed.lora << "\"";
          if (seed.id) o << ",\"lora_id\":" << *seed.id;
        }
        if (!seed.salt.empty()) o << ",\"cache_salt\":\"" << seed.salt << "\"";
      }
      o << '}';
    }
    o << "]}";
  }
  o << ']';
  return o.str();
}

void feed(KvEventPublisher& pub, const Ev& e) {
  KvEvent ev;
  PagedStoredPages pages;
  if (e.kind == "stored") {
    kv_event::Stored s;
    s.parent_hash = e.parent;
    for (const std::uint64_t h : e.hashes)
      s.blocks.push_back(KvBlock{h, 0});
    ev.data = s;
    pages.ns = e.ns;
    pages.tokens = e.tokens;
  } else if (e.kind == "removed") {
    ev.data = kv_event::Removed{e.hashes};
  } else {
    ev.data = kv_event::Cleared{};
  }
  pub.on_event(ev, pages);
}

#ifndef PROMPTCACHE_PUB_NO_PYTHON
// The Python encoder's lines ("<layout> <hex>") for `json`.
std::vector<std::string> python_lines(const std::string& json) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("promptcache_pub_" + std::to_string(::getpid()) + ".json");
  {
    std::ofstream f(path);
    f << json;
  }
  const std::string cmd =
      std::string(PROMPTCACHE_PUB_PYTHON) + " " + PROMPTCACHE_PUB_ENCODER + " " + path.string();
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
    out.append(buf, n);
  const int rc = ::pclose(p);
  std::filesystem::remove(path);
  REQUIRE(rc == 0);
  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);)
    lines.push_back(l);
  return lines;
}
#endif

const std::vector<Batch> kScenario = {
    {1234.5,
     {
         // Hashes above 2^63 (uint64 form), a root chain of two 4-token blocks.
         {"stored", {0xF000000000000001ULL, 2}, std::nullopt, {1, 2, 3, 4, 5, 6, 7, 8}, 0},
         // A LoRA namespace's chain under a parent, token ids in every int width.
         {"stored", {300, 70000}, 2, {0, 127, 128, 255, 256, 65535, 65536, 4294967295U}, 7},
         {"removed", {0xF000000000000001ULL, 5}, std::nullopt, {}, 0},
     }},
    {1700000000.125, {{"cleared", {}, std::nullopt, {}, 0}}},
    // 20 blocks of 1 token: arrays of 16 or more entries (array16).
    {2.0,
     {{"stored",
       {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20},
       std::nullopt,
       {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20},
       0}}},
    // Salted namespaces: described with a LoRA and without, and one by default.
    {3.5,
     {{"stored", {41, 42}, std::nullopt, {1, 2, 3, 4, 5, 6, 7, 8}, 9},
      {"stored", {43}, 42, {9, 10, 11, 12}, 11},
      {"stored", {44, 45}, std::nullopt, {1, 2, 3, 4, 5, 6, 7, 8}, 12}}},
};

// ---- the engine and its router ------------------------------------------------------

// The blocks a worker's view holds: (parent, block hash, tokens hash), parent 0 at the root.
std::set<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>> view(const KvIndex& index,
                                                                       const KvWorker& w) {
  std::set<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>> out;
  for (const KvEvent& e : index.dump(w)) {
    const auto& s = std::get<kv_event::Stored>(e.data);
    std::uint64_t parent = s.parent_hash.value_or(0);
    for (const KvBlock& b : s.blocks) {
      out.emplace(parent, b.block_hash, b.tokens_hash);
      parent = b.block_hash;
    }
  }
  return out;
}

// A paged engine publishing over ZeroMQ, and a KvIndex fed its events directly: the
// view a router must reach.
struct Engine {
  explicit Engine(ZmqKvEventPublisherOptions o)
      : pub(std::move(o)),
        cache(4, promptcache::eviction::Lru{}, [this](const KvEvent& e, const PagedStoredPages& p) {
          pub.events().on_event(e, p);
          REQUIRE(truth.apply(W, e).ok());
        }) {}

  // One step: stores prompt `i` (a shared system prefix of 2 blocks, then 1-3 blocks of
  // its own) and, every 3rd step, evicts 2 pages. Returns the batch's seq.
  std::optional<std::uint64_t> step(std::uint32_t i) {
    std::vector<std::uint32_t> tokens = {9, 9, 9, 9, 8, 8, 8, 8};
    const std::uint32_t own = 4U * (1U + i % 3U);
    for (std::uint32_t t = 0; t < own; ++t)
      tokens.push_back(1000U * (i + 1U) + t);
    std::vector<std::uint32_t> pages(tokens.size() / 4);
    for (auto& p : pages)
      p = next_page++;
    cache.insert(tokens, pages);
    prompts.push_back(tokens);
    if (i % 3 == 2) cache.evict(2);
    return pub.end_step();
  }

  ZmqKvEventPublisher pub;
  KvIndex truth;
  PagedPrefixCache<> cache;
  std::uint32_t next_page = 0;
  std::vector<std::vector<std::uint32_t>> prompts;
};

ZmqKvEventPublisherOptions loopback(std::size_t buffer, bool dump = true) {
  ZmqKvEventPublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  o.replay_endpoint = "tcp://127.0.0.1:*";
  o.events.buffer_batches = buffer;
  o.events.state_dump = dump;
  o.events.clock = [] { return 1.0; };
  return o;
}

promptcache::ZmqKvSubscriberOptions sub_options(bool dumps) {
  promptcache::ZmqKvSubscriberOptions o;
  o.state_dumps = dumps;
  o.replay_timeout = 10s;  // the engine answers between its steps
  return o;
}

// Serves replays until `done` holds and no request came for 30 polls (120 ms) in a row: the
// live messages a dump covered are settled by replay questions, which must be
// answered before the subscriber stops (unanswered, an old seq counts as a restart)
// and before the engine publishes on (a buffer of a few batches would no longer reach
// back to the question, which then counts as a second lost range and a second dump).
void settle(const std::function<std::size_t()>& serve_once, const std::function<bool()>& done) {
  int quiet = 0;
  for (int i = 0; i < 8000 && !(done() && quiet >= 30); ++i)
    quiet = serve_once() == 0 ? quiet + 1 : 0;
  REQUIRE(done());
  REQUIRE(quiet >= 30);
}

void settle(Engine& e, const std::function<bool()>& done) {
  settle([&] { return e.pub.poll_replay(4ms); }, done);
}

std::optional<std::uint64_t> last_seq(const ZmqKvSubscriber& sub) {
  return sub.last_seq(0);
}

// Steps until the subscriber has received a live message (a SUB socket drops what is
// published before its subscription arrives), then serves replays until it applied the
// last batch and asks nothing more.
std::uint32_t join(Engine& e, ZmqKvSubscriber& sub, std::uint32_t i) {
  std::optional<std::uint64_t> seq;
  for (int round = 0; round < 400 && sub.counters(0).messages == 0; ++round) {
    seq = e.step(i++);
    e.pub.poll_replay(5ms);
  }
  REQUIRE(sub.counters(0).messages > 0);
  settle(e, [&] { return last_seq(sub) == seq; });
  return i;
}

}  // namespace

TEST_CASE("batches match an independent encoder of vLLM's msgspec classes, in every layout",
          "[kv_event_publisher]") {
#ifdef PROMPTCACHE_PUB_NO_PYTHON
  WARN("no python3 with msgpack: byte checks skipped");
#else
  const std::map<std::uint64_t, Seed> seeds = {{7, {"an-adapter-name-longer-than-32-bytes", 3, ""}},
                                               {9, {"lora-b", 4, "tenant-9"}},
                                               {11, {"", std::nullopt, "t11"}}};
  for (const std::optional<std::uint32_t> rank :
       {std::optional<std::uint32_t>(2), std::optional<std::uint32_t>()}) {
    const std::vector<std::string> expected = python_lines(to_json(kScenario, rank, seeds));
    REQUIRE(expected.size() == 3 * kScenario.size());
    std::size_t line = 0;
    for (const KvWireLayout layout :
         {KvWireLayout::map, KvWireLayout::array_map, KvWireLayout::array}) {
      KvEventPublisherOptions o;
      o.layout = layout;
      o.dp_rank = rank;
      std::size_t b = 0;
      o.clock = [&b] { return kScenario[b].ts; };
      KvEventPublisher pub(o);
      for (const auto& [ns, sd] : seeds) {
        if (sd.salt.empty())
          pub.set_lora(ns, sd.lora, sd.id);
        else
          pub.set_namespace(ns, sd.lora, sd.salt, sd.id);
      }
      const char* name = layout == KvWireLayout::map         ? "map"
                         : layout == KvWireLayout::array_map ? "array_map"
                                                             : "array";
      for (b = 0; b < kScenario.size(); ++b) {
        for (const Ev& e : kScenario[b].events)
          feed(pub, e);
        const std::optional<KvEncodedBatch> enc = pub.flush();
        REQUIRE(enc);
        CHECK(enc->seq == b);
        // The Python lines come batch by batch, layouts in this order.
        const std::size_t at = 3 * b + static_cast<std::size_t>(layout);
        CAPTURE(name, b, rank.has_value());
        CHECK(expected[at] == std::string(name) + " " + hex(enc->payload));
        ++line;
      }
    }
    CHECK(line == expected.size());
  }
#endif
}

TEST_CASE("every batch decodes back to the events published", "[kv_event_publisher]") {
  for (const KvWireLayout layout :
       {KvWireLayout::map, KvWireLayout::array_map, KvWireLayout::array}) {
    KvEventPublisherOptions o;
    o.layout = layout;
    o.dp_rank = 3;
    KvEventPublisher pub(o);
    for (const Ev& e : kScenario[0].events)
      feed(pub, e);
    const auto enc = pub.flush();
    REQUIRE(enc);
    promptcache::KvEventWireDecoder decoder;
    promptcache::KvWireBatch batch;
    REQUIRE(decoder.decode(enc->payload.data(), enc->payload.size(), batch).ok());
    CHECK(batch.dp_rank == 3U);
    REQUIRE(batch.events.size() == 3);
    const auto& s = std::get<kv_event::Stored>(batch.events[1]);
    CHECK(s.parent_hash == 2U);
    CHECK(s.blocks.size() == 2);
    CHECK(std::get<kv_event::Removed>(batch.events[2]).block_hashes ==
          std::vector<std::uint64_t>{0xF000000000000001ULL, 5});
  }
}

TEST_CASE("seqs, the replay buffer and its answers", "[kv_event_publisher]") {
  KvEventPublisherOptions o;
  o.buffer_batches = 3;
  o.state_dump = false;
  KvEventPublisher pub(o);
  CHECK_FALSE(pub.flush());  // a step without events publishes nothing, as vLLM
  for (std::uint64_t i = 0; i < 5; ++i) {
    feed(pub, Ev{"removed", {i + 1}, std::nullopt, {}, 0});
    CHECK(pub.flush()->seq == i);
  }
  CHECK(pub.buffered_batches() == 3);
  const auto ask = [&](std::vector<std::byte> start) {
    std::vector<std::uint64_t> seqs;
    pub.answer_replay(start, [&](std::uint64_t s, std::span<const char> payload) {
      seqs.push_back(s);
      if (s == KvEventPublisher::end_marker) CHECK(payload.empty());
    });
    return seqs;
  };
  const auto be = [](std::uint64_t v) {
    std::vector<std::byte> b(8);
    for (std::size_t i = 0; i < 8; ++i)
      b[i] = static_cast<std::byte>(v >> (56U - 8U * i));
    return b;
  };
  const std::uint64_t end = KvEventPublisher::end_marker;
  CHECK(ask(be(0)) == std::vector<std::uint64_t>{2, 3, 4, end});  // 0 and 1 dropped
  CHECK(ask(be(3)) == std::vector<std::uint64_t>{3, 4, end});
  CHECK(ask(be(9)) == std::vector<std::uint64_t>{end});
  // Without state_dump a dump request is answered as vLLM answers it.
  CHECK(ask(be(KvEventPublisher::dump_request)) == std::vector<std::uint64_t>{end});
  CHECK(ask({}) == std::vector<std::uint64_t>{end});
  CHECK(ask(std::vector<std::byte>(3)) == std::vector<std::uint64_t>{end});
  CHECK(ask(std::vector<std::byte>(9)) == std::vector<std::uint64_t>{end});
  CHECK(pub.stats().bad_requests == 3);
  CHECK(pub.stats().replay_requests == 4);
  CHECK(pub.stats().batches_replayed == 5);
}

TEST_CASE("a stored event without its tokens is refused", "[kv_event_publisher]") {
  KvEventPublisher pub;
  KvEvent e{0, kv_event::Stored{std::nullopt, {KvBlock{1, 1}, KvBlock{2, 2}}}};
  const std::vector<std::uint32_t> three = {1, 2, 3};
  CHECK_THROWS_AS(pub.on_event(e, PagedStoredPages{}), std::invalid_argument);
  CHECK_THROWS_AS(pub.on_event(e, PagedStoredPages{0, three}), std::invalid_argument);
  CHECK(pub.pending_events() == 0);
}

TEST_CASE("the paged cache gives a token sink the tokens of the pages it stores",
          "[kv_event_publisher]") {
  std::vector<std::vector<std::uint32_t>> seen;
  std::vector<std::uint64_t> namespaces;
  PagedPrefixCache<> c(2, promptcache::eviction::Lru{},
                       [&](const KvEvent& e, const PagedStoredPages& p) {
                         if (std::holds_alternative<kv_event::Stored>(e.data)) {
                           seen.emplace_back(p.tokens.begin(), p.tokens.end());
                           namespaces.push_back(p.ns);
                         } else {
                           CHECK(p.tokens.empty());
                         }
                       });
  CHECK(c.publishes_events());
  const std::vector<std::uint32_t> a = {1, 2, 3, 4, 5}, b = {1, 2, 3, 4, 6, 7};
  const std::vector<std::uint32_t> pages = {10, 11, 12};
  c.insert(a, pages, 5);
  c.insert(b, pages, 5);  // only the third page is new
  c.evict(1);
  REQUIRE(seen.size() == 2);
  CHECK(seen[0] == std::vector<std::uint32_t>{1, 2, 3, 4});
  CHECK(seen[1] == std::vector<std::uint32_t>{6, 7});
  CHECK(namespaces == std::vector<std::uint64_t>{5, 5});
  PagedPrefixCache<> moved(std::move(c));
  CHECK(moved.publishes_events());
  CHECK_FALSE(c.publishes_events());
}

TEST_CASE("a router hashes every namespace's blocks as the cache does: LoRA names and salts",
          "[kv_event_publisher]") {
  // The cache's namespaces: 0 and 12 by default (12's id is its salt), 7 with a LoRA,
  // 9 with a LoRA and a salt, 11 with a salt only.
  const auto run = [](KvWireLayout layout, bool describe_9) {
    KvEventPublisherOptions o;
    o.layout = layout;
    KvEventPublisher pub(o);
    KvIndex truth;
    PagedPrefixCache<> cache(4, promptcache::eviction::Lru{},
                             [&](const KvEvent& e, const PagedStoredPages& p) {
                               pub.on_event(e, p);
                               REQUIRE(truth.apply(W, e).ok());
                             });
    cache.configure_namespace(7, "lora-a");
    cache.configure_namespace(9, "lora-b", "tenant-9");
    cache.configure_namespace(11, "", "t11");
    pub.set_lora(7, "lora-a", 1);
    if (describe_9) pub.set_namespace(9, "lora-b", "tenant-9");
    pub.set_namespace(11, "", "t11");
    const std::vector<std::uint32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    std::uint32_t page = 0;
    for (const std::uint64_t ns : {0U, 7U, 9U, 11U, 12U}) {
      std::vector<std::uint32_t> pages(3);
      for (auto& pg : pages)
        pg = page++;
      cache.insert(tokens, pages, ns);
      // A continuation: its event's first block is not the chain's.
      std::vector<std::uint32_t> longer = tokens;
      longer.insert(longer.end(), {20, 21, 22, 23});
      const std::vector<std::uint32_t> more = {pages[0], pages[1], pages[2], page++};
      cache.insert(longer, more, ns);
    }
    const auto enc = pub.flush();
    REQUIRE(enc);
    promptcache::KvWireBatch batch;
    REQUIRE(promptcache::KvEventWireDecoder()
                .decode(enc->payload.data(), enc->payload.size(), batch)
                .ok());
    KvIndex router;
    std::uint64_t id = 0;
    for (const auto& d : batch.events)
      REQUIRE(router.apply(W, KvEvent{id++, d}).ok());
    return std::pair(view(router, W), view(truth, W));
  };
  // What configure_namespace refuses cannot be described either.
  KvEventPublisher pub;
  CHECK_THROWS_AS(pub.set_namespace(5, "", ""), std::invalid_argument);
  CHECK_THROWS_AS(pub.set_namespace(5, "", "6"), std::invalid_argument);
  CHECK_NOTHROW(pub.set_namespace(5, "", "5"));
  CHECK_NOTHROW(pub.set_namespace(5, "lora-a", ""));
  CHECK_NOTHROW(pub.set_namespace(0, "", ""));
  for (const KvWireLayout layout :
       {KvWireLayout::map, KvWireLayout::array_map, KvWireLayout::array}) {
    const auto [router, truth] = run(layout, true);
    CHECK(truth.size() == 20);
    CHECK(router == truth);
    // Namespace 9 published without its description: its blocks hash otherwise.
    const auto [undescribed, truth2] = run(layout, false);
    CHECK(undescribed != truth2);
    CHECK(undescribed.size() == truth2.size());
  }
}

TEST_CASE("a router follows the engine live and through replays", "[kv_event_publisher]") {
  Engine e(loopback(10000));
  ZmqKvSubscriber sub({{e.pub.endpoint(), e.pub.replay_endpoint(), W, ""}}, sub_options(true));
  sub.start();
  std::uint32_t i = join(e, sub, 0);
  for (const std::uint32_t end = i + 30; i < end; ++i)
    e.step(i);
  const std::uint64_t last = e.pub.events().next_seq() - 1U;
  settle(e, [&] { return last_seq(sub) == last; });
  sub.stop();
  REQUIRE(sub.thread_error() == nullptr);
  CHECK(view(sub.index(), W) == view(e.truth, W));
  CHECK(!view(e.truth, W).empty());
  // Routing answers what the cache would match, prompt by prompt.
  for (const auto& p : e.prompts) {
    const auto hashes = promptcache::local_block_hashes(p, 4);
    const auto m = sub.index().find_matches(hashes);
    const std::size_t cached = e.cache.peek(p) / 4;
    CHECK((m.empty() ? 0 : m[0].blocks) == cached);
  }
  const auto c = sub.counters(0);
  CHECK(c.malformed == 0);
  CHECK(c.index_rejected == 0);
  CHECK(c.dumps == 0);  // nothing was lost: no dump asked for
}

TEST_CASE("a router joining late replays the buffered batches", "[kv_event_publisher]") {
  Engine e(loopback(10000, false));
  std::uint32_t i = 0;
  for (; i < 40; ++i)
    e.step(i);
  ZmqKvSubscriber sub({{e.pub.endpoint(), e.pub.replay_endpoint(), W, ""}}, sub_options(true));
  sub.start();
  join(e, sub, i);
  const std::uint64_t last = e.pub.events().next_seq() - 1U;
  settle(e, [&] { return last_seq(sub) == last; });
  sub.stop();
  CHECK(view(sub.index(), W) == view(e.truth, W));
  const auto c = sub.counters(0);
  CHECK(c.gaps_recovered >= 1);
  CHECK(c.batches_replayed >= 40);
  CHECK(c.gaps_unrecoverable == 0);
  CHECK(e.pub.events().stats().batches_replayed >= 40);
}

TEST_CASE("a router joining after the buffer moved on is exact only with the state dump",
          "[kv_event_publisher]") {
  for (const bool dumps : {false, true}) {
    CAPTURE(dumps);
    Engine e(loopback(4));
    std::uint32_t i = 0;
    for (; i < 60; ++i)
      e.step(i);
    REQUIRE(e.pub.events().state_blocks() == view(e.truth, W).size());
    ZmqKvSubscriber sub({{e.pub.endpoint(), e.pub.replay_endpoint(), W, ""}}, sub_options(dumps));
    sub.start();
    i = join(e, sub, i);
    // And it stays exact as the engine goes on.
    for (const std::uint32_t end = i + 10; i < end; ++i)
      e.step(i);
    const std::uint64_t last = e.pub.events().next_seq() - 1U;
    settle(e, [&] { return last_seq(sub) == last; });
    sub.stop();
    const auto c = sub.counters(0);
    CHECK(c.gaps_unrecoverable >= 1);
    if (dumps) {
      CHECK(c.dumps == 1);
      CHECK(view(sub.index(), W) == view(e.truth, W));
      CHECK(e.pub.events().stats().dumps == 1);
    } else {
      // The shared system prefix, stored before the join, is missing: everything
      // under it is refused or kept as orphans, never routable.
      CHECK(c.dumps == 0);
      CHECK(view(sub.index(), W) != view(e.truth, W));
      const auto hashes = promptcache::local_block_hashes(e.prompts.back(), 4);
      CHECK(sub.index().find_matches(hashes).empty());
    }
  }
}

TEST_CASE("the replay socket answers malformed requests with the end marker",
          "[kv_event_publisher]") {
  Engine e(loopback(8));
  e.step(0);
  e.step(1);
  zmq::context_t ctx;
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(e.pub.replay_endpoint());
  // The frames after the identity a ROUTER prepends: what each request gets back.
  const auto ask = [&](const std::vector<std::string>& frames) {
    std::vector<zmq::const_buffer> parts;
    for (const auto& f : frames)
      parts.push_back(zmq::buffer(f));
    REQUIRE(zmq::send_multipart(dealer, parts));
    std::vector<std::vector<std::string>> replies;
    for (int round = 0; round < 2000; ++round) {
      e.pub.poll_replay(1ms);
      std::vector<zmq::message_t> r;
      while (zmq::recv_multipart(dealer, std::back_inserter(r), zmq::recv_flags::dontwait)) {
        std::vector<std::string> s;
        for (const auto& m : r)
          s.push_back(m.to_string());
        replies.push_back(s);
        r.clear();
        if (s.size() == 3 && s[1] == std::string(8, '\xff')) return replies;
      }
    }
    FAIL("no end marker");
    return replies;
  };
  const std::string end(8, '\xff');
  const auto seq = [](std::uint64_t v) {
    std::string s(8, '\0');
    for (std::size_t k = 0; k < 8; ++k)
      s[k] = static_cast<char>(v >> (56U - 8U * k));
    return s;
  };
  const std::vector<std::string> end_reply = {"", end, ""};
  using Replies = std::vector<std::vector<std::string>>;
  CHECK(ask({""}) == Replies{end_reply});                       // no seq frame
  CHECK(ask({"", "abc"}) == Replies{end_reply});                // short
  CHECK(ask({"", std::string(9, 'x')}) == Replies{end_reply});  // long
  CHECK(ask({"", seq(0), "extra"}) == Replies{end_reply});      // a frame too many
  CHECK(ask({"x", seq(0)}) == Replies{end_reply});              // no delimiter
  CHECK(e.pub.events().stats().bad_requests == 5);
  // Still serving: a good request gets the two batches, then the end marker.
  const Replies good = ask({"", seq(0)});
  REQUIRE(good.size() == 3);
  CHECK(good[0][1] == seq(0));
  CHECK(good[1][1] == seq(1));
  // A dump is tagged with the last seq and decodes to stored events.
  const Replies dump = ask({"", seq(KvEventPublisher::dump_request)});
  REQUIRE(dump.size() >= 2);
  std::size_t blocks = 0;
  for (std::size_t k = 0; k + 1 < dump.size(); ++k) {
    CHECK(dump[k][1] == seq(1));
    promptcache::KvEventWireDecoder decoder;
    promptcache::KvWireBatch batch;
    REQUIRE(decoder.decode(dump[k][2].data(), dump[k][2].size(), batch).ok());
    for (const auto& ev : batch.events)
      blocks += std::get<kv_event::Stored>(ev).blocks.size();
  }
  CHECK(blocks == view(e.truth, W).size());
}

TEST_CASE("a dump of an empty cache is one batch without events, before the first: none",
          "[kv_event_publisher]") {
  KvEventPublisher pub;
  std::vector<std::uint64_t> seqs;
  std::vector<std::byte> req(8, std::byte{0xff});
  req[7] = std::byte{0xfe};
  const auto send = [&](std::uint64_t s, std::span<const char>) { seqs.push_back(s); };
  pub.answer_replay(req, send);
  CHECK(seqs == std::vector<std::uint64_t>{KvEventPublisher::end_marker});
  feed(pub, Ev{"cleared", {}, std::nullopt, {}, 0});
  pub.flush();
  seqs.clear();
  pub.answer_replay(req, send);
  CHECK(seqs == std::vector<std::uint64_t>{0, KvEventPublisher::end_marker});
}

TEST_CASE("a dump that is absent, mixes seqs or does not decode leaves the view as the gap left it",
          "[kv_event_publisher]") {
  // A batch storing one root block `name` of 4 tokens.
  const auto batch_of = [](std::uint64_t name) {
    KvEventPublisher enc;
    feed(enc, Ev{"stored", {name}, std::nullopt, {1, 2, 3, static_cast<std::uint32_t>(name)}, 0});
    const auto b = enc.flush();
    return std::string(b->payload.data(), b->payload.size());
  };
  const auto seq = [](std::uint64_t v) {
    std::string s(8, '\0');
    for (std::size_t k = 0; k < 8; ++k)
      s[k] = static_cast<char>(v >> (56U - 8U * k));
    return s;
  };
  const std::string end(8, '\xff');
  enum class Dump { none, mixed_seqs, garbage };
  for (const Dump kind : {Dump::none, Dump::mixed_seqs, Dump::garbage}) {
    CAPTURE(static_cast<int>(kind));
    zmq::context_t ctx;
    zmq::socket_t pub(ctx, zmq::socket_type::pub), router(ctx, zmq::socket_type::router);
    pub.set(zmq::sockopt::linger, 0);
    router.set(zmq::sockopt::linger, 0);
    pub.bind("tcp://127.0.0.1:*");
    router.bind("tcp://127.0.0.1:*");
    ZmqKvSubscriber sub(
        {{pub.get(zmq::sockopt::last_endpoint), router.get(zmq::sockopt::last_endpoint), W, ""}},
        sub_options(true));
    sub.start();
    const std::string live = batch_of(50);
    // Serves one request: a replay finds nothing buffered; a dump gets `kind`.
    const auto serve = [&] {
      zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, 5ms) <= 0) return;
      std::vector<zmq::message_t> req;
      REQUIRE(zmq::recv_multipart(router, std::back_inserter(req)));
      REQUIRE(req.size() == 3);
      const auto reply = [&](const std::string& s, const std::string& payload) {
        std::array<zmq::const_buffer, 4> m = {zmq::buffer(req[0].data(), req[0].size()),
                                              zmq::const_buffer(nullptr, 0), zmq::buffer(s),
                                              zmq::buffer(payload)};
        REQUIRE(zmq::send_multipart(router, m));
      };
      if (req[2].to_string() == seq(KvEventPublisher::dump_request)) {
        if (kind == Dump::mixed_seqs) {
          reply(seq(5), batch_of(60));
          reply(seq(6), batch_of(61));
        } else if (kind == Dump::garbage) {
          reply(seq(5), "\xc1 not msgpack");
        }
      }
      reply(end, "");
    };
    for (int round = 0; round < 2000 && sub.counters(0).dumps_unavailable == 0; ++round) {
      if (sub.counters(0).messages == 0) {
        const std::string five = seq(5);
        std::array<zmq::const_buffer, 3> m = {zmq::const_buffer(nullptr, 0), zmq::buffer(five),
                                              zmq::buffer(live)};
        REQUIRE(zmq::send_multipart(pub, m));
      }
      serve();
    }
    sub.stop();
    const auto c = sub.counters(0);
    CHECK(c.dumps_unavailable == 1);
    CHECK(c.dumps == 0);
    CHECK(c.gaps_unrecoverable == 1);
    CHECK(c.malformed == (kind == Dump::garbage ? 1U : 0U));
    // The live batch alone: the view the gap left.
    KvIndex expected;
    promptcache::KvEventWireDecoder decoder;
    promptcache::KvWireBatch b;
    REQUIRE(decoder.decode(live.data(), live.size(), b).ok());
    REQUIRE(expected.apply(W, KvEvent{0, b.events[0]}).ok());
    CHECK(view(sub.index(), W) == view(expected, W));
    CHECK(sub.last_seq(0) == 5U);
  }
}

TEST_CASE("a dump holds exactly the blocks the events leave, parents first, whatever the order",
          "[kv_event_publisher]") {
  // Events a paged cache never sends (inner removals, stores under parents not held that
  // are stored later), checked against a map of hash -> (parent, tokens).
  struct Held {
    std::optional<std::uint64_t> parent;
    std::vector<std::uint32_t> tokens;
  };
  std::map<std::uint64_t, Held> model;
  KvEventPublisher pub;
  std::mt19937_64 rng(7);
  std::uint64_t next = 1;
  const auto pick = [&]() -> std::optional<std::uint64_t> {
    if (model.empty()) return std::nullopt;
    auto it = model.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng() % model.size()));
    return it->first;
  };
  const auto check_dump = [&] {
    std::vector<std::byte> req(8, std::byte{0xff});
    req[7] = std::byte{0xfe};
    std::vector<std::string> payloads;
    pub.answer_replay(req, [&](std::uint64_t s, std::span<const char> p) {
      if (s != KvEventPublisher::end_marker) payloads.emplace_back(p.data(), p.size());
    });
    std::map<std::uint64_t, std::pair<std::optional<std::uint64_t>, std::uint64_t>> seen;
    promptcache::KvEventWireDecoder decoder;
    for (const std::string& p : payloads) {
      promptcache::KvWireBatch b;
      REQUIRE(decoder.decode(p.data(), p.size(), b).ok());
      for (const auto& ev : b.events) {
        const auto& s = std::get<kv_event::Stored>(ev);
        std::optional<std::uint64_t> parent = s.parent_hash;
        for (const KvBlock& blk : s.blocks) {
          // A held parent comes first.
          if (parent && model.count(*parent) != 0) CHECK(seen.count(*parent) == 1);
          CHECK(seen.emplace(blk.block_hash, std::make_pair(parent, blk.tokens_hash)).second);
          parent = blk.block_hash;
        }
      }
    }
    REQUIRE(seen.size() == model.size());
    for (const auto& [h, held] : model) {
      REQUIRE(seen.count(h) == 1);
      CHECK(seen[h].first == held.parent);
      CHECK(seen[h].second == promptcache::local_block_hashes(held.tokens, 2).at(0));
    }
  };
  std::map<std::uint64_t, int> waiters;  // unheld parent -> blocks stored under it
  for (int op = 0; op < 3000; ++op) {
    const auto r = rng() % 100;
    if (r < 55) {
      // A chain of 1-3 blocks under a held parent, no parent, or one stored later.
      std::optional<std::uint64_t> parent;
      const auto how = rng() % 4;
      if (how < 2) parent = pick();
      if (how == 3) parent = next + 3 + rng() % 20;  // past this chain
      // Blocks waiting for `next` go under it: its parent must not descend from them.
      if (parent && waiters.count(next) != 0) {
        std::vector<std::uint64_t> todo = {next};
        std::set<std::uint64_t> below;
        while (!todo.empty()) {
          const std::uint64_t x = todo.back();
          todo.pop_back();
          for (const auto& [h, held] : model)
            if (held.parent == x && below.insert(h).second) todo.push_back(h);
        }
        if (below.count(*parent) != 0) parent.reset();
      }
      if (parent && model.count(*parent) == 0) ++waiters[*parent];
      Ev e{"stored", {}, parent, {}, 0};
      const std::size_t n = 1 + rng() % 3;
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint64_t h = next++;
        e.hashes.push_back(h);
        const std::vector<std::uint32_t> t = {static_cast<std::uint32_t>(rng()),
                                              static_cast<std::uint32_t>(h)};
        e.tokens.insert(e.tokens.end(), t.begin(), t.end());
        model[h] = Held{i == 0 ? parent : std::optional<std::uint64_t>(h - 1), t};
        if (i + 1 < n && waiters.count(next) != 0) break;
      }
      // A chain cut short by the cycle guard keeps what it stored.
      e.tokens.resize(e.hashes.size() * 2);
      feed(pub, e);
    } else if (r < 95) {
      if (const auto h = pick()) {
        feed(pub, Ev{"removed", {*h}, std::nullopt, {}, 0});
        model.erase(*h);
      }
    } else if (r < 96) {
      feed(pub, Ev{"cleared", {}, std::nullopt, {}, 0});
      model.clear();
    }
    pub.flush();
    if (op % 250 == 0) check_dump();
  }
  check_dump();
  CHECK(pub.state_blocks() == model.size());
}

TEST_CASE("an outage longer than the replay buffer is repaired by the state dump",
          "[kv_event_publisher]") {
  // The publisher's own logic with a transport the test controls, so that a run of
  // batches can be lost on the way (never sent) while still buffered and dumped.
  KvEventPublisherOptions o;
  o.buffer_batches = 4;
  o.clock = [] { return 1.0; };
  KvEventPublisher pub(o);
  KvIndex truth;
  PagedPrefixCache<> cache(4, promptcache::eviction::Lru{},
                           [&](const KvEvent& e, const PagedStoredPages& p) {
                             pub.on_event(e, p);
                             REQUIRE(truth.apply(W, e).ok());
                           });
  zmq::context_t ctx;
  zmq::socket_t pub_socket(ctx, zmq::socket_type::pub), router(ctx, zmq::socket_type::router);
  pub_socket.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::linger, 0);
  pub_socket.bind("tcp://127.0.0.1:*");
  router.bind("tcp://127.0.0.1:*");
  ZmqKvSubscriber sub({{pub_socket.get(zmq::sockopt::last_endpoint),
                        router.get(zmq::sockopt::last_endpoint), W, ""}},
                      sub_options(true));
  sub.start();
  const auto seq_bytes = [](std::uint64_t v) {
    std::string s(8, '\0');
    for (std::size_t k = 0; k < 8; ++k)
      s[k] = static_cast<char>(v >> (56U - 8U * k));
    return s;
  };
  const auto serve = [&]() -> std::size_t {
    zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, 4ms) <= 0) return 0;
    std::vector<zmq::message_t> req;
    REQUIRE(zmq::recv_multipart(router, std::back_inserter(req)));
    REQUIRE(req.size() == 3);
    pub.answer_replay({static_cast<const std::byte*>(req[2].data()), req[2].size()},
                      [&](std::uint64_t s, std::span<const char> payload) {
                        const std::string sb = seq_bytes(s);
                        std::array<zmq::const_buffer, 4> m = {
                            zmq::buffer(req[0].data(), req[0].size()),
                            zmq::const_buffer(nullptr, 0), zmq::buffer(sb),
                            zmq::const_buffer(payload.data(), payload.size())};
                        REQUIRE(zmq::send_multipart(router, m));
                      });
    return 1;
  };
  std::uint32_t i = 0;
  // One step: a prompt under the shared prefix; sent unless lost.
  const auto step = [&](bool send) {
    std::vector<std::uint32_t> tokens = {9, 9, 9, 9};
    for (std::uint32_t t = 0; t < 8; ++t)
      tokens.push_back(1000U * (i + 1U) + t);
    const std::vector<std::uint32_t> pages(3, i);
    cache.insert(tokens, pages);
    if (i % 4 == 3) cache.evict(2);
    ++i;
    const auto b = pub.flush();
    REQUIRE(b);
    if (send) {
      const std::string sb = seq_bytes(b->seq);
      std::array<zmq::const_buffer, 3> m = {
          zmq::const_buffer(nullptr, 0), zmq::buffer(sb),
          zmq::const_buffer(b->payload.data(), b->payload.size())};
      REQUIRE(zmq::send_multipart(pub_socket, m));
    }
    return b->seq;
  };
  const auto follow = [&](std::uint64_t last) {
    for (int round = 0; round < 4000 && sub.last_seq(0) != last; ++round)
      serve();
    REQUIRE(sub.last_seq(0) == last);
  };
  // Joined (whatever its first messages needed), then following live.
  std::uint64_t last = 0;
  for (int round = 0; round < 400 && sub.counters(0).messages == 0; ++round) {
    last = step(true);
    serve();
  }
  follow(last);
  for (int k = 0; k < 5; ++k)
    last = step(true);
  settle(serve, [&] { return sub.last_seq(0) == last; });
  const auto before = sub.counters(0);
  // 30 batches lost on the way; the buffer keeps the last 4 of them.
  for (int k = 0; k < 30; ++k)
    step(false);
  last = step(true);
  follow(last);
  for (int k = 0; k < 5; ++k)
    last = step(true);
  settle(serve, [&] { return sub.last_seq(0) == last; });
  sub.stop();
  const auto c = sub.counters(0);
  CAPTURE(before.gaps_unrecoverable, before.dumps, c.restarts, c.gaps, c.resets, c.duplicates,
          c.dumps_unavailable, c.replay_timeouts);
  // The lost run: one gap the buffer no longer covers, repaired by one dump.
  CHECK(c.gaps_unrecoverable == before.gaps_unrecoverable + 1);
  CHECK(c.dumps == before.dumps + 1);
  CHECK(c.restarts == 0);
  CHECK(view(sub.index(), W) == view(truth, W));
}
