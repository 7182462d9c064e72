// A KV-aware routing front end in miniature: subscribes to the KV event
// streams of vLLM / SGLang engines (--kv-events-config with the zmq
// publisher) and, for each request read from stdin (token ids separated by
// spaces, one request per line), prints how many leading KV blocks each
// engine rank already holds: the number a router weighs against load.
//
//   zmq_router --block-size 16
//       --publisher tcp://10.0.0.5:5557,tcp://10.0.0.5:5558,1,0
//       --publisher tcp://10.0.0.6:5557,,2,0      (one command line)
//
// A publisher is ENDPOINT,REPLAY_ENDPOINT,WORKER_ID,DP_RANK (an empty replay
// endpoint means no replay: gaps reset that worker's view). Data-parallel
// rank r of an engine publishes on its base port + r. Give the engines'
// block size (and, for LoRA requests, their adapter name with --lora).
// "stats" on a line of its own prints the subscriber counters.
#include <promptcache/zmq_kv_subscriber.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

int usage() {
  std::cerr << "usage: zmq_router --block-size N [--lora NAME] "
               "--publisher ENDPOINT,REPLAY,WORKER_ID,DP_RANK [--publisher ...]\n";
  return 2;
}

bool parse_publisher(const std::string& arg, promptcache::KvPublisherEndpoint& out) {
  std::vector<std::string> parts;
  std::stringstream in(arg);
  std::string part;
  while (std::getline(in, part, ','))
    parts.push_back(part);
  if (parts.size() != 4 || parts[0].empty()) return false;
  try {
    out.endpoint = parts[0];
    out.replay_endpoint = parts[1];
    out.worker.worker_id = std::stoull(parts[2]);
    out.worker.dp_rank = static_cast<std::uint32_t>(std::stoul(parts[3]));
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

void print_stats(const promptcache::ZmqKvSubscriber& sub) {
  for (std::size_t i = 0; i < sub.publisher_count(); ++i) {
    const auto c = sub.counters(i);
    std::cout << "publisher " << i << ": batches " << c.batches_applied << ", events "
              << c.events_applied << ", gaps " << c.gaps << " (recovered " << c.gaps_recovered
              << ", reset " << c.gaps_unrecoverable << "), restarts " << c.restarts
              << ", duplicates " << c.duplicates << ", malformed " << c.malformed << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t block_size = 0;
  std::string lora;
  std::vector<promptcache::KvPublisherEndpoint> publishers;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage();
    const std::string v = argv[++i];
    if (a == "--block-size") {
      block_size = std::strtoul(v.c_str(), nullptr, 10);
    } else if (a == "--lora") {
      lora = v;
    } else if (a == "--publisher") {
      promptcache::KvPublisherEndpoint p;
      if (!parse_publisher(v, p)) return usage();
      publishers.push_back(p);
    } else {
      return usage();
    }
  }
  if (block_size == 0 || publishers.empty()) return usage();

  promptcache::ZmqKvSubscriberOptions options;
  options.wire.block_size = static_cast<std::uint32_t>(block_size);
  promptcache::ZmqKvSubscriber sub(publishers, options);
  sub.start();  // events apply in the background while requests are answered

  promptcache::BlockHashOptions hash_options;
  hash_options.seed = promptcache::block_hash_seed(lora);
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line == "stats") {
      print_stats(sub);
      continue;
    }
    std::vector<std::uint32_t> tokens;
    std::istringstream in(line);
    std::uint64_t t = 0;
    while (in >> t)
      tokens.push_back(static_cast<std::uint32_t>(t));
    const auto hashes = promptcache::local_block_hashes(tokens, block_size, hash_options);
    auto matches = sub.with_index(
        [&](const promptcache::KvIndex& index) { return index.find_matches(hashes); });
    std::sort(matches.begin(), matches.end(),
              [](const auto& a, const auto& b) { return a.blocks > b.blocks; });
    std::cout << hashes.size() << " full blocks;";
    if (matches.empty()) std::cout << " no worker holds the first one";
    for (const auto& m : matches)
      std::cout << " worker " << m.worker.worker_id << " rank " << m.worker.dp_rank << ": "
                << m.blocks;
    std::cout << std::endl;
  }
  sub.stop();
  if (sub.thread_error()) {
    std::cerr << "subscriber stopped on an error\n";
    return 1;
  }
  return 0;
}
