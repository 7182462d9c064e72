// A fleet in one process: four engines, each a PagedPrefixCache publishing
// its KV events over NATS (vLLM KVEventBatch payloads, through
// NatsKvPublisher), and two router replicas, each a NatsKvSubscriber with its
// own KvIndex. The second replica starts after the engines have served their
// traffic and catches up from the engines' replay buffers. Both replicas then
// route the same request with KvRouter and print their decision: the same
// worker, because both views equal every engine's cache (checked with
// KvIndex::block_hashes against PagedPrefixCache::block_hashes).
//
//   fleet                      starts nats-server on 127.0.0.1 (a free port)
//   fleet --url nats://h:4222  uses a running server
//   fleet --nats-server PATH   the nats-server program (default: from PATH)
//
// Exit status 0 when both replicas agree and equal the engines, 1 otherwise.
#include <promptcache/block_hash.hpp>
#include <promptcache/kv_router.hpp>
#include <promptcache/nats_kv_subscriber.hpp>
#include <promptcache/paged_prefix_cache.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace pc = promptcache;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t kPageSize = 16;  // tokens per KV block
const std::string kPrefix = pc::dynamo_kv_events_subject("dynamo", "backend");

// ---- nats-server, when no URL is given ----

int free_loopback_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  close(fd);
  return ok ? ntohs(a.sin_port) : -1;
}

// nats-server -a 127.0.0.1 -p <port>, killed when this object goes.
class LocalServer {
 public:
  LocalServer(const std::string& program, int port) {
    const std::string p = std::to_string(port);
    pid_ = fork();
    if (pid_ == 0) {
      // The server's log stays out of the example's output.
      const int null = open("/dev/null", O_WRONLY);
      if (null >= 0) {
        dup2(null, 1);
        dup2(null, 2);
      }
      execlp(program.c_str(), program.c_str(), "-a", "127.0.0.1", "-p", p.c_str(),
             static_cast<char*>(nullptr));
      std::perror(program.c_str());
      _exit(127);
    }
  }
  LocalServer(const LocalServer&) = delete;
  LocalServer& operator=(const LocalServer&) = delete;
  ~LocalServer() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
  }

 private:
  pid_t pid_ = -1;
};

// Waits (bounded: 200 attempts 25 ms apart) until the server accepts a
// connection; libnats retries by itself.
bool wait_ready(const std::string& url) {
  natsOptions* o = nullptr;
  if (natsOptions_Create(&o) != NATS_OK) return false;
  natsOptions_SetURL(o, url.c_str());
  natsOptions_SetMaxReconnect(o, 200);
  natsOptions_SetReconnectWait(o, 25);
  natsOptions_SetRetryOnFailedConnect(o, true, nullptr, nullptr);
  natsConnection* nc = nullptr;
  const natsStatus s = natsConnection_Connect(&nc, o);
  natsOptions_Destroy(o);
  natsConnection_Destroy(nc);
  return s == NATS_OK;
}

// ---- an engine ----

// One KV event as a vLLM KVEventBatch (array layout): [ts, [event], dp rank].
std::string encode(const pc::KvEvent& e, std::span<const std::uint32_t> stored_tokens) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_array(3);
  p.pack(static_cast<double>(std::chrono::duration_cast<std::chrono::microseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count()) /
         1e6);
  p.pack_array(1);
  if (const auto* st = std::get_if<pc::kv_event::Stored>(&e.data)) {
    p.pack_array(8);
    p.pack(std::string("BlockStored"));
    p.pack_array(static_cast<std::uint32_t>(st->blocks.size()));
    for (const pc::KvBlock& b : st->blocks)
      p.pack(b.block_hash);
    if (st->parent_hash)
      p.pack(*st->parent_hash);
    else
      p.pack_nil();
    p.pack(std::vector<std::uint32_t>(stored_tokens.begin(), stored_tokens.end()));
    p.pack(kPageSize);
    p.pack_nil();                // lora_id
    p.pack(std::string("GPU"));  // medium
    p.pack_nil();                // lora_name
  } else if (const auto* rm = std::get_if<pc::kv_event::Removed>(&e.data)) {
    p.pack_array(3);
    p.pack(std::string("BlockRemoved"));
    p.pack(rm->block_hashes);
    p.pack(std::string("GPU"));
  } else {
    p.pack_array(1);
    p.pack(std::string("AllBlocksCleared"));
  }
  p.pack_nil();
  return std::string(buf.data(), buf.size());
}

// A paged prefix cache whose events go out through a NatsKvPublisher, seq
// 0, 1, ... A Stored event names the pages at the end of the prompt being
// inserted, so the sink takes their tokens from it.
class Engine {
 public:
  Engine(const std::string& url, std::uint64_t id) : worker_{id, 0} {
    pc::NatsKvPublisherOptions o;
    o.connection.url = url;
    o.prefix = kPrefix;
    o.worker = worker_;
    pub_ = std::make_unique<pc::NatsKvPublisher>(o);
    cache_ = std::make_unique<pc::PagedPrefixCache<std::uint32_t>>(
        kPageSize, pc::eviction::Lru{}, [this](const pc::KvEvent& e) {
          std::span<const std::uint32_t> tokens;
          if (const auto* st = std::get_if<pc::kv_event::Stored>(&e.data)) {
            const std::size_t q = prompt_.size() / kPageSize;
            tokens = std::span<const std::uint32_t>(prompt_).subspan(
                (q - st->blocks.size()) * kPageSize, st->blocks.size() * kPageSize);
          }
          pub_->publish(seq_++, encode(e, tokens));
        });
  }

  // Serves a prompt: reuses its cached prefix, stores the rest, keeps the
  // cache under `capacity` pages.
  void serve(const std::vector<std::uint32_t>& prompt, std::size_t capacity = 64) {
    const auto m = cache_->match(prompt);
    std::vector<std::uint32_t> pages = m.pages;
    while (pages.size() < prompt.size() / kPageSize)
      pages.push_back(next_page_++);
    prompt_ = prompt;
    cache_->insert(prompt, pages);
    if (cache_->cached_pages() > capacity) cache_->evict(cache_->cached_pages() - capacity);
  }

  const pc::KvWorker& worker() const { return worker_; }
  std::uint64_t published() const { return seq_; }
  std::vector<std::uint64_t> blocks() const { return cache_->block_hashes(); }
  bool flush() { return pub_->flush(2000ms); }

 private:
  pc::KvWorker worker_;
  std::unique_ptr<pc::NatsKvPublisher> pub_;
  std::unique_ptr<pc::PagedPrefixCache<std::uint32_t>> cache_;
  std::vector<std::uint32_t> prompt_;
  std::uint64_t seq_ = 0;
  std::uint32_t next_page_ = 0;
};

// `pages` pages of tokens starting at `from`.
std::vector<std::uint32_t> text(std::uint32_t from, std::size_t pages) {
  std::vector<std::uint32_t> t(pages * kPageSize);
  for (std::size_t i = 0; i < t.size(); ++i)
    t[i] = from + static_cast<std::uint32_t>(i);
  return t;
}

std::vector<std::uint32_t> operator+(std::vector<std::uint32_t> a,
                                     const std::vector<std::uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Waits (bounded) until the replica has applied every engine's last batch.
bool caught_up(pc::NatsKvSubscriber& replica, const std::vector<std::unique_ptr<Engine>>& engines) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < deadline) {
    bool all = true;
    for (const auto& e : engines)
      all = all && replica.last_seq(e->worker()) == e->published() - 1;
    if (all) return true;
    // The replica's own thread applies; this one checks now and then.
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  std::string url;
  std::string program = "nats-server";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--url" && i + 1 < argc) {
      url = argv[++i];
    } else if (a == "--nats-server" && i + 1 < argc) {
      program = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--url nats://host:port] [--nats-server PATH]\n", argv[0]);
      return 2;
    }
  }
  try {
    std::unique_ptr<LocalServer> server;
    if (url.empty()) {
      const int port = free_loopback_port();
      url = "nats://127.0.0.1:" + std::to_string(port);
      server = std::make_unique<LocalServer>(program, port);
      std::printf("started %s on %s\n", program.c_str(), url.c_str());
    }
    if (!wait_ready(url)) {
      std::fprintf(stderr, "no NATS server answers at %s\n", url.c_str());
      return 1;
    }

    // Replica A follows the engines from the start.
    pc::NatsKvSubscriberOptions so;
    so.connection.url = url;
    so.prefix = kPrefix;
    pc::NatsKvSubscriber replica_a(so);
    replica_a.start();

    // Four engines; every prompt starts with the same system prompt, and
    // engine i has served document i (and a little of the others).
    std::vector<std::unique_ptr<Engine>> engines;
    for (std::uint64_t i = 0; i < 4; ++i)
      engines.push_back(std::make_unique<Engine>(url, 100 + i));
    const std::vector<std::uint32_t> system = text(1, 4);
    for (std::size_t round = 0; round < 20; ++round)
      for (std::size_t i = 0; i < engines.size(); ++i) {
        const auto doc = static_cast<std::uint32_t>(10000 * (i + 1));
        engines[i]->serve(system + text(doc, 6) +
                          text(doc + 1000 + static_cast<std::uint32_t>(round) * 50, 1));
        const auto other = static_cast<std::uint32_t>(10000 * ((i + 1 + round % 3) % 4 + 1));
        engines[i]->serve(system + text(other, 2));
      }
    for (auto& e : engines)
      e->flush();

    // Replica B starts now: the first batch it sees from each engine is a
    // gap, which the engine's replay buffer fills from seq 0.
    pc::NatsKvSubscriber replica_b(so);
    replica_b.start();
    for (auto& e : engines)
      e->serve(system + text(900000, 1));  // one more batch each
    for (auto& e : engines)
      e->flush();

    bool ok = true;
    for (auto* r : {&replica_a, &replica_b}) {
      const char* name = r == &replica_a ? "A" : "B";
      if (!caught_up(*r, engines)) {
        std::printf("replica %s: did not catch up\n", name);
        ok = false;
        continue;
      }
      bool equal = true;
      for (const auto& e : engines)
        equal = equal && r->with_index([&](const pc::KvIndex& index) {
          return index.block_hashes(e->worker());
        }) == e->blocks();
      std::printf(
          "replica %s: %zu blocks from %zu batches replayed; index %s every engine's cache\n", name,
          r->with_index([](const pc::KvIndex& index) { return index.total_blocks(); }),
          static_cast<std::size_t>(r->total_counters().batches_replayed),
          equal ? "equals" : "DIFFERS FROM");
      ok = ok && equal;
    }

    // The request: the system prompt, document 2, a new question.
    const std::vector<std::uint32_t> request = system + text(30000, 6) + text(777777, 2);
    const std::vector<std::uint64_t> locals = pc::local_block_hashes(request, kPageSize);
    const std::vector<std::uint64_t> names = pc::sequence_hashes(locals);
    const pc::KvRouter router(pc::KvRouterConfig{1.0, 0.0, kPageSize});
    std::vector<std::uint64_t> chosen;
    for (auto* r : {&replica_a, &replica_b}) {
      const auto decision = r->with_index([&](const pc::KvIndex& index) {
        std::vector<pc::KvWorkerLoad> loads;
        for (const auto& e : engines)
          loads.push_back(pc::KvWorkerLoad{e->worker(), 0, index.block_count(e->worker()), 0});
        return router.select(request.size(), index.find_matches(locals, names), loads);
      });
      if (!decision) return 1;
      chosen.push_back(decision->chosen.worker.worker_id);
      std::printf("replica %s routes the request (%zu blocks) to worker %llu: %zu blocks cached\n",
                  r == &replica_a ? "A" : "B", locals.size(),
                  static_cast<unsigned long long>(decision->chosen.worker.worker_id),
                  decision->chosen.matched_blocks);
    }
    replica_a.stop();
    replica_b.stop();
    ok = ok && chosen[0] == chosen[1];
    std::printf("%s\n", ok ? "both replicas agree" : "the replicas DISAGREE");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fleet: %s\n", e.what());
    return 1;
  }
}
