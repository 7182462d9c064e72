// Throughput of the KV event ingestion path: msgpack payload bytes ->
// decoded KvEventData (tokens hashed per block, as Dynamo's router does) ->
// applied to a KvIndex. Reports blocks/s, events/s and MB/s for
//
//   unpack   msgpack-cxx's own msgpack::unpack into an object tree (the
//            generic parse a decoder built on the library API would pay;
//            the baseline the decoder is compared with)
//   decode   KvEventWireDecoder::decode (parse + validate + hash tokens)
//   apply    KvIndex::apply of the already decoded events
//   total    decode + apply, the router's ingestion cost
//   cold     decode + apply of the whole stream, warm-up included, into an
//            empty index (a router starting up: the index grows)
//
// for two workloads: SGLang-style (array layout, integer hashes) and
// vLLM-style (map layout, 32-byte hashes). The variants run interleaved in
// each round; the figures are medians over the rounds, in thread CPU time. Target: at least
// 1 M blocks/s decoded and applied on one core.
//
// Usage: kv_event_wire_throughput [rounds=7] [blocks per round=200000]
#include <promptcache/kv_event_wire.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr std::uint32_t block_size = 16;
constexpr std::size_t workers = 4;

struct Workload {
  std::vector<std::string> payloads;  // round-robin over `workers`
  std::size_t warm = 0;               // payloads before the timed ones
  std::size_t blocks = 0;             // timed payloads only, as events and bytes
  std::size_t stored = 0;             // ... of which stored (the rest removed)
  std::size_t events = 0;
  std::size_t bytes = 0;
  std::size_t all_blocks = 0;  // warm-up included
  std::size_t all_stored = 0;
};

void pack_hash(msgpack::packer<msgpack::sbuffer>& p, std::uint64_t h, bool as_bytes) {
  if (!as_bytes) {
    p.pack(h);
    return;
  }
  unsigned char b[32] = {};
  for (std::size_t i = 0; i < 8; ++i) {
    b[24 + i] = static_cast<unsigned char>(h >> (56U - 8U * i));
    b[i] = static_cast<unsigned char>(h >> (8U * i));  // the rest of a sha256 digest
  }
  p.pack_bin(32);
  p.pack_bin_body(reinterpret_cast<const char*>(b), 32);
}

// Engine-like batches, one worker per payload in turn: a stored event starts
// a chain or extends the worker's newest one by 1..64 blocks; once a worker
// holds more than `live_cap` blocks its oldest chain is evicted (one removal
// naming its blocks, leaves first), so the index reaches a steady size. The
// first `warm` payloads bring it there and are not timed.
Workload make_workload(bool vllm, std::size_t target_blocks, std::uint64_t seed) {
  constexpr std::size_t live_cap = 16384;
  std::mt19937_64 rng(seed);
  Workload w;
  std::vector<std::vector<std::vector<std::uint64_t>>> chains(workers);
  std::vector<std::size_t> live(workers, 0);
  std::uint64_t next_name = 1;
  std::size_t turn = 0;
  std::size_t all_blocks = 0;
  const std::size_t warm_blocks = workers * live_cap * 2;
  while (w.blocks < target_blocks) {
    const std::size_t worker = turn++ % workers;
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> p(buf);
    const std::size_t n_events = 1 + rng() % 3;
    if (vllm) {
      p.pack_map(3);
      p.pack(std::string("ts"));
    } else {
      p.pack_array(3);
    }
    p.pack(1764600000.0 + static_cast<double>(turn) * 0.001);
    if (vllm) p.pack(std::string("events"));
    p.pack_array(static_cast<std::uint32_t>(n_events));
    std::size_t batch_blocks = 0;
    std::size_t batch_stored = 0;
    for (std::size_t e = 0; e < n_events; ++e) {
      auto& cs = chains[worker];
      if (live[worker] > live_cap) {
        const std::vector<std::uint64_t> old = std::move(cs.front());
        cs.erase(cs.begin());
        live[worker] -= old.size();
        if (vllm) {
          p.pack_map(3);
          p.pack(std::string("type"));
          p.pack(std::string("BlockRemoved"));
          p.pack(std::string("block_hashes"));
        } else {
          p.pack_array(3);
          p.pack(std::string("BlockRemoved"));
        }
        p.pack_array(static_cast<std::uint32_t>(old.size()));
        for (auto it = old.rbegin(); it != old.rend(); ++it)
          pack_hash(p, *it, vllm);
        if (vllm) p.pack(std::string("medium"));
        p.pack(std::string("GPU"));
        batch_blocks += old.size();
      } else {
        const std::size_t n = 1 + rng() % 64;
        std::optional<std::uint64_t> parent;
        if (!cs.empty() && rng() % 2 == 0) {
          parent = cs.back().back();
        } else {
          cs.emplace_back();
        }
        if (vllm) {
          p.pack_map(8);
          p.pack(std::string("type"));
          p.pack(std::string("BlockStored"));
          p.pack(std::string("block_hashes"));
        } else {
          p.pack_array(8);
          p.pack(std::string("BlockStored"));
        }
        p.pack_array(static_cast<std::uint32_t>(n));
        for (std::size_t i = 0; i < n; ++i) {
          const std::uint64_t name = next_name++ * 0x9e3779b97f4a7c15ULL;
          cs.back().push_back(name);
          pack_hash(p, name, vllm);
        }
        live[worker] += n;
        if (vllm) p.pack(std::string("parent_block_hash"));
        if (parent)
          pack_hash(p, *parent, vllm);
        else
          p.pack_nil();
        if (vllm) p.pack(std::string("token_ids"));
        p.pack_array(static_cast<std::uint32_t>(n * block_size));
        for (std::size_t i = 0; i < n * block_size; ++i)
          p.pack(static_cast<std::uint32_t>(rng() % 128000));
        if (vllm) p.pack(std::string("block_size"));
        p.pack(block_size);
        if (vllm) p.pack(std::string("lora_id"));
        p.pack_nil();
        if (vllm) p.pack(std::string("medium"));
        p.pack(std::string("GPU"));
        if (vllm) p.pack(std::string("lora_name"));
        p.pack_nil();
        batch_blocks += n;
        batch_stored += n;
      }
    }
    if (vllm) p.pack(std::string("data_parallel_rank"));
    p.pack(static_cast<std::uint32_t>(worker));
    w.payloads.emplace_back(buf.data(), buf.size());
    all_blocks += batch_blocks;
    w.all_blocks += batch_blocks;
    w.all_stored += batch_stored;
    if (all_blocks <= warm_blocks) {
      w.warm = w.payloads.size();
    } else {
      w.blocks += batch_blocks;
      w.stored += batch_stored;
      w.events += n_events;
      w.bytes += buf.size();
    }
  }
  return w;
}

volatile std::size_t sink = 0;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// CPU time of this thread: the machine may be shared, and the claim is about
// what one core does.
double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

template <class F>
double seconds(F&& f) {
  const double t0 = thread_seconds();
  f();
  return thread_seconds() - t0;
}

// Applies payloads [from, to) of `decoded` to `index`.
void apply_range(promptcache::KvIndex& index, std::vector<std::uint64_t>& ids,
                 const std::vector<promptcache::KvWireBatch>& decoded, std::size_t from,
                 std::size_t to) {
  for (std::size_t i = from; i < to; ++i) {
    const promptcache::KvWorker worker{i % workers, 0};
    for (const auto& e : decoded[i].events)
      sink = sink + index.apply(worker, promptcache::KvEvent{ids[i % workers]++, e}).blocks_stored;
  }
}

void run(const char* name, const Workload& w, int rounds) {
  promptcache::KvEventWireDecoder decoder;
  std::vector<promptcache::KvWireBatch> decoded(w.payloads.size());
  for (std::size_t i = 0; i < w.payloads.size(); ++i)
    if (!decoder.decode(w.payloads[i].data(), w.payloads[i].size(), decoded[i]).ok()) std::abort();
  const std::size_t n = w.payloads.size();
  std::vector<double> t_unpack, t_decode, t_apply, t_total, t_cold;
  std::size_t rejected = 0;
  for (int r = 0; r < rounds; ++r) {
    t_unpack.push_back(seconds([&] {
      std::size_t k = 0;
      for (std::size_t i = w.warm; i < n; ++i) {
        const msgpack::object_handle oh =
            msgpack::unpack(w.payloads[i].data(), w.payloads[i].size());
        k += oh.get().via.array.size;
      }
      sink = sink + k;
    }));
    promptcache::KvWireBatch b;
    t_decode.push_back(seconds([&] {
      for (std::size_t i = w.warm; i < n; ++i)
        if (!decoder.decode(w.payloads[i].data(), w.payloads[i].size(), b).ok()) std::abort();
    }));
    {
      promptcache::KvIndex index;
      std::vector<std::uint64_t> ids(workers, 0);
      apply_range(index, ids, decoded, 0, w.warm);
      t_apply.push_back(seconds([&] { apply_range(index, ids, decoded, w.warm, n); }));
      const auto& c = index.counters();
      rejected = c.parent_not_found + c.block_conflicts + c.gaps + c.events_stale;
    }
    {
      promptcache::KvIndex index;
      std::vector<std::uint64_t> ids(workers, 0);
      apply_range(index, ids, decoded, 0, w.warm);
      t_total.push_back(seconds([&] {
        for (std::size_t i = w.warm; i < n; ++i) {
          if (!decoder.decode(w.payloads[i].data(), w.payloads[i].size(), b).ok()) std::abort();
          const promptcache::KvWorker worker{i % workers, 0};
          for (const auto& e : b.events)
            sink = sink +
                   index.apply(worker, promptcache::KvEvent{ids[i % workers]++, e}).blocks_stored;
        }
      }));
    }
    t_cold.push_back(seconds([&] {  // from an empty index: growth included
      promptcache::KvIndex index;
      std::vector<std::uint64_t> ids(workers, 0);
      for (std::size_t i = 0; i < n; ++i) {
        if (!decoder.decode(w.payloads[i].data(), w.payloads[i].size(), b).ok()) std::abort();
        const promptcache::KvWorker worker{i % workers, 0};
        for (const auto& e : b.events)
          sink =
              sink + index.apply(worker, promptcache::KvEvent{ids[i % workers]++, e}).blocks_stored;
      }
    }));
  }
  const double mb = static_cast<double>(w.bytes) / 1e6;
  const double blocks = static_cast<double>(w.blocks);
  const double events = static_cast<double>(w.events);
  std::printf(
      "%s: %zu timed payloads (after %zu warm-up), %zu events, %zu blocks (%zu stored, %zu "
      "removed), %.1f MB (%.1f bytes/block), %zu events rejected by the index\n",
      name, n - w.warm, w.warm, w.events, w.blocks, w.stored, w.blocks - w.stored, mb,
      static_cast<double>(w.bytes) / blocks, rejected);
  const auto line = [&](const char* what, double t) {
    std::printf(
        "  %-7s %6.2f M blocks/s (%5.2f M stored/s) %6.3f M events/s %7.1f MB/s  "
        "(median %.2f ms)\n",
        what, blocks / t / 1e6, static_cast<double>(w.stored) / t / 1e6, events / t / 1e6, mb / t,
        t * 1e3);
  };
  const double u = median(t_unpack), d = median(t_decode), a = median(t_apply), t = median(t_total);
  line("unpack", u);
  line("decode", d);
  line("apply", a);
  line("total", t);
  const double c = median(t_cold);
  std::printf(
      "  cold    %6.2f M blocks/s (%5.2f M stored/s): decode + apply of all %zu payloads "
      "into an empty index (median %.2f ms)\n",
      static_cast<double>(w.all_blocks) / c / 1e6, static_cast<double>(w.all_stored) / c / 1e6, n,
      c * 1e3);
  std::printf("  decode / msgpack::unpack time: %.2fx; total / (decode + apply): %.2fx\n", d / u,
              t / (d + a));
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  const std::size_t blocks = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 200000;
  if (rounds < 1 || blocks < 1) {
    std::fprintf(stderr, "usage: kv_event_wire_throughput [rounds] [blocks per round]\n");
    return 2;
  }
  std::printf("block size %u tokens, %zu workers, %d rounds (medians)\n", block_size, workers,
              rounds);
  run("SGLang-style (array layout, int hashes)", make_workload(false, blocks, 1), rounds);
  run("vLLM-style (map layout, 32-byte hashes)", make_workload(true, blocks, 2), rounds);
  return 0;
}
