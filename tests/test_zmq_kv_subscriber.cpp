// End-to-end test of zmq_kv_subscriber.hpp: a Python publisher
// (tests/kv_event_wire/e2e_publisher.py, Debian python3-zmq + python3-msgpack)
// speaks the vLLM / SGLang protocol on loopback with ephemeral ports, drops
// batches, repeats one, mixes a KV-offloading tier's events into its steps,
// clears its GPU tier, restarts at seq 0 with its clock stepped back, loses a
// run longer than its replay buffer, and has one publisher the subscriber
// joins late. The subscriber's index must then equal an index fed directly
// the batches the documented policy keeps, and the engines' own block counts
// where they are known exactly. Bounded by a deadline; every wait is a poll
// with a timeout.
#include <promptcache/zmq_kv_subscriber.hpp>

#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"

// C linkage names the process environment from any namespace (a test group wraps this file in one).
extern "C" char** environ;

#ifndef PROMPTCACHE_E2E_PYTHON
#error "PROMPTCACHE_E2E_PYTHON must name a python3 with the msgpack and zmq modules"
#endif
#ifndef PROMPTCACHE_E2E_PUBLISHER
#error "PROMPTCACHE_E2E_PUBLISHER must name tests/kv_event_wire/e2e_publisher.py"
#endif

using promptcache::KvIndex;
using promptcache::KvPublisherCounters;
using promptcache::KvWorker;
using promptcache::KvWorkerMatch;

namespace {

// A child process with pipes to its stdin and from its stdout.
class Child {
 public:
  explicit Child(const std::vector<std::string>& argv) {
    int in[2], out[2];
    REQUIRE(pipe(in) == 0);
    REQUIRE(pipe(out) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    std::vector<char*> args;
    for (const auto& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const int rc = posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    to_ = in[1];
    from_ = out[0];
    REQUIRE(rc == 0);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() { finish(); }

  // A line of the child's output if one is complete within `timeout_ms`.
  std::optional<std::string> line(int timeout_ms) {
    for (;;) {
      const auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string l = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return l;
      }
      pollfd p{from_, POLLIN, 0};
      if (::poll(&p, 1, timeout_ms) <= 0) return std::nullopt;
      char chunk[4096];
      const ssize_t n = read(from_, chunk, sizeof chunk);
      if (n <= 0) return std::nullopt;
      buf_.append(chunk, static_cast<std::size_t>(n));
    }
  }

  // Closes the child's stdin (its signal to exit) and waits for it.
  int finish() {
    if (pid_ <= 0) return status_;
    close(to_);
    close(from_);
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = 0;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return status_;
  }

 private:
  pid_t pid_ = 0;
  int to_ = -1;
  int from_ = -1;
  int status_ = -1;
  std::string buf_;
};

// A prefix the engine holds, and how many blocks long it is.
struct Held {
  std::size_t depth = 0;
  std::vector<std::uint32_t> tokens;
  std::vector<std::uint64_t> names;  // the engine's block names along the chain, as indexed
};

struct Expected {
  KvWorker worker;
  std::uint64_t last_seq = 0;
  std::uint64_t duplicates = 0, restarts = 0, recovered = 0, unrecoverable = 0, resets = 0;
  std::optional<std::size_t> gpu_blocks;  // the engine's block count, when the view must equal it
  std::vector<std::vector<std::byte>> payloads;
  std::vector<std::vector<std::uint32_t>> queries;
  std::vector<Held> routable;  // late join: stored in full after it
  std::vector<Held> extends;   // late join: stored after it under a prefix stored before
};

std::vector<std::byte> from_hex(const std::string& hex) {
  std::vector<std::byte> out(hex.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<std::byte>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

std::vector<Expected> read_expected(const std::string& path, std::size_t& block_size) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::vector<Expected> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::string word;
    l >> word;
    if (word == "block_size") {
      l >> block_size;
    } else if (word == "worker") {
      Expected e;
      std::string k;
      std::string gpu;
      l >> e.worker.worker_id >> e.worker.dp_rank >> k >> e.last_seq >> k >> e.duplicates >> k >>
          e.restarts >> k >> e.recovered >> k >> e.unrecoverable >> k >> e.resets >> k >> gpu;
      if (gpu != "-") e.gpu_blocks = std::stoul(gpu);
      out.push_back(std::move(e));
    } else if (word == "payload") {
      std::string hex;
      l >> hex;
      out.back().payloads.push_back(from_hex(hex));
    } else if (word == "query") {
      std::vector<std::uint32_t> q;
      std::uint32_t t = 0;
      while (l >> t)
        q.push_back(t);
      out.back().queries.push_back(std::move(q));
    } else if (word == "routable" || word == "extends") {
      Held h;
      l >> h.depth;
      std::string item;
      bool names = false;
      while (l >> item) {
        if (item == "names") {
          names = true;
        } else if (!names) {
          h.tokens.push_back(static_cast<std::uint32_t>(std::stoul(item)));
        } else if (item.size() == 64) {  // a 32-byte name: its last 8 bytes, big-endian
          h.names.push_back(std::stoull(item.substr(48), nullptr, 16));
        } else {  // a signed integer name, as the decoder reads it
          h.names.push_back(static_cast<std::uint64_t>(std::stoll(item)));
        }
      }
      (word == "routable" ? out.back().routable : out.back().extends).push_back(std::move(h));
    }
  }
  return out;
}

std::vector<KvWorkerMatch> sorted_matches(const KvIndex& index, std::span<const std::uint64_t> q) {
  auto m = index.find_matches(q);
  std::sort(m.begin(), m.end());
  return m;
}

// The depth to which `worker` holds the prefix `tokens`; 0 when it holds none.
std::size_t depth_of(const KvIndex& index, const KvWorker& worker,
                     const std::vector<std::uint32_t>& tokens, std::size_t block_size) {
  const auto hashes = promptcache::local_block_hashes(tokens, block_size);
  for (const KvWorkerMatch& m : index.find_matches(hashes))
    if (m.worker == worker) return m.blocks;
  return 0;
}

struct Scenario {
  std::unique_ptr<promptcache::ZmqKvSubscriber> sub;
  std::vector<Expected> expected;
  std::size_t block_size = 0;
};

promptcache::ZmqKvSubscriberOptions patient_options() {
  promptcache::ZmqKvSubscriberOptions o;
  o.replay_timeout = std::chrono::seconds(20);
  return o;
}

// Runs the publisher's scenario to its end against a subscriber driven by
// poll(), and reads the expectation file.
void run_scenario(Scenario& sc) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  const std::string expect_path = (std::filesystem::temp_directory_path() /
                                   ("promptcache_kv_e2e_" + std::to_string(getpid()) + ".txt"))
                                      .string();
  Child pub({PROMPTCACHE_E2E_PYTHON, PROMPTCACHE_E2E_PUBLISHER, expect_path});
  const auto first = pub.line(30000);
  REQUIRE(first.has_value());
  std::istringstream eps(*first);
  std::string pub_a, replay_a, pub_b, replay_b, pub_c, replay_c;
  eps >> pub_a >> replay_a >> pub_b >> replay_b >> pub_c >> replay_c;
  REQUIRE(!replay_c.empty());

  // A subscribes to its topic, B and C to everything; all have replay sockets.
  sc.sub = std::make_unique<promptcache::ZmqKvSubscriber>(
      std::vector<promptcache::KvPublisherEndpoint>{{pub_a, replay_a, KvWorker{7, 0}, "kv"},
                                                    {pub_b, replay_b, KvWorker{7, 1}, ""},
                                                    {pub_c, replay_c, KvWorker{7, 2}, ""}},
      // The publisher is a Python process that serves replays between its
      // steps; on a loaded machine (sanitizers, parallel tests) an answer can
      // take seconds, and a replay taken for silent would reset a view.
      patient_options());
  promptcache::ZmqKvSubscriber& sub = *sc.sub;
  bool done = false;
  for (;;) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    sub.poll(std::chrono::milliseconds(50));
    if (!done) {
      if (const auto l = pub.line(0)) {
        REQUIRE(*l == "DONE");
        done = true;
        sc.expected = read_expected(expect_path, sc.block_size);
        REQUIRE(sc.expected.size() == 3);
      }
      continue;
    }
    bool all = true;
    for (std::size_t i = 0; i < sc.expected.size(); ++i)
      all = all && sub.last_seq(i) == sc.expected[i].last_seq;
    if (all) break;
  }
  CHECK(pub.finish() == 0);
  std::filesystem::remove(expect_path);
}

}  // namespace

TEST_CASE(
    "end to end: a Python publisher with drops, duplicates, offload batches, a tier clear, a "
    "restart with its clock stepped back, a lost run and a late join",
    "[zmq_kv_subscriber][e2e]") {
  Scenario sc;
  run_scenario(sc);
  const promptcache::ZmqKvSubscriber& sub = *sc.sub;
  const std::vector<Expected>& expected = sc.expected;
  const std::size_t block_size = sc.block_size;

  // The reference: a fresh index fed the kept batches of each publisher.
  KvIndex ref;
  promptcache::KvEventWireDecoder decoder;
  for (const Expected& e : expected) {
    std::uint64_t id = 0;
    for (const auto& payload : e.payloads) {
      promptcache::KvWireBatch b;
      REQUIRE(decoder.decode(payload, b).ok());
      for (const auto& ev : b.events)
        ref.apply(e.worker, promptcache::KvEvent{id++, ev});
    }
  }

  const KvIndex& got = sub.index();
  CHECK(got.check_invariants());
  std::size_t queried = 0;
  std::size_t matched = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const Expected& e = expected[i];
    INFO("publisher " << i);
    CHECK(got.block_count(e.worker) == ref.block_count(e.worker));
    CHECK(ref.block_count(e.worker) > 0);
    // Offload events skipped, the GPU tier clear applied, the restart seen:
    // the view is the engine's own GPU blocks.
    if (e.gpu_blocks) CHECK(got.block_count(e.worker) == *e.gpu_blocks);
    for (const auto& q : e.queries) {
      const auto hashes = promptcache::local_block_hashes(q, block_size);
      const auto want = sorted_matches(ref, hashes);
      CHECK(sorted_matches(got, hashes) == want);
      matched += want.empty() ? 0U : 1U;
      ++queried;
    }
    const KvPublisherCounters c = sub.counters(i);
    CHECK(c.duplicates == e.duplicates);
    CHECK(c.restarts == e.restarts);
    CHECK(c.gaps_recovered == e.recovered);
    CHECK(c.gaps_unrecoverable == e.unrecoverable);
    CHECK(c.gaps == e.recovered + e.unrecoverable);
    CHECK(c.resets == e.resets);
    CHECK(c.malformed == 0);
    CHECK(c.bad_frames == 0);
    CHECK(c.replay_timeouts == 0);
    CHECK(c.dp_rank_mismatches == 0);
    CHECK(c.unknown_events == 0);  // TierBlocksCleared is known
    CHECK(c.ignored_events > 0);   // the offload tier's events
  }
  CHECK(got.total_blocks() == ref.total_blocks());
  CHECK(queried > 100);
  CHECK(matched > 10);

  // Late join (C): caught up from the oldest buffered batch, the rest of its
  // history an unrecoverable gap, and every chain stored in full after the
  // join routable to its whole depth.
  const Expected& late = expected[2];
  const KvPublisherCounters c = sub.counters(2);
  CHECK(late.last_seq > late.payloads.size());  // the buffer no longer reached seq 0
  CHECK(c.batches_applied == late.payloads.size());
  CHECK(c.gaps_unrecoverable == 1);
  REQUIRE(!late.routable.empty());
  for (const Held& h : late.routable)
    CHECK(depth_of(got, late.worker, h.tokens, block_size) == h.depth);
}

TEST_CASE("late join: blocks that extend a prefix stored before the join are routable",
          "[zmq_kv_subscriber][e2e][late_join_index]") {
  // A chain stored after the join under a prefix stored before it: the view
  // never saw the prefix, but the engine holds the chain whole, so a request
  // that names the chain's blocks is routed to its full depth. The subscriber's
  // index keeps such chains as orphans (its default); under refuse they were lost.
  Scenario sc;
  run_scenario(sc);
  const Expected& late = sc.expected[2];
  const KvIndex& got = sc.sub->index();
  REQUIRE(!late.extends.empty());
  CHECK(got.orphan_count(late.worker) > 0);
  for (const Held& h : late.extends) {
    REQUIRE(h.names.size() == h.depth);
    const auto hashes = promptcache::local_block_hashes(h.tokens, sc.block_size);
    std::size_t depth = 0;
    for (const KvWorkerMatch& m : got.find_matches(hashes, h.names))
      if (m.worker == late.worker) depth = m.blocks;
    CHECK(depth == h.depth);
    // Without the names, tokens alone cannot place the chain: the prefix
    // under it was never seen, so no tree path reaches it.
    CHECK(depth_of(got, late.worker, h.tokens, sc.block_size) < h.depth);
  }
}
