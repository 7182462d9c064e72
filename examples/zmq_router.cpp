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
// "stats" on a line of its own prints the subscriber counters. Numbers out of
// range (a token id above 2^32 - 1, a negative number, a block size of 0 or
// above 2^32 - 1, the 32-bit field of the engines' events) are rejected; if the
// subscriber's thread stops on an error, the router stops with it rather than
// answer from an index that no longer follows the engines.
#include <promptcache/zmq_kv_subscriber.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <exception>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

int usage(const std::string& why) {
  std::cerr << "zmq_router: " << why
            << "\nusage: zmq_router --block-size N [--lora NAME] "
               "--publisher ENDPOINT,REPLAY,WORKER_ID,DP_RANK [--publisher ...]\n"
               "  N: 1..4294967295; WORKER_ID: 0..2^64-1; DP_RANK: 0..4294967295\n"
               "  then one request per line on stdin: token ids 0..4294967295\n";
  return 2;
}

// A decimal number in [0, max], the whole string (no sign, no spaces).
bool parse_number(const std::string& s, std::uint64_t max, std::uint64_t& out) {
  const char* end = s.data() + s.size();
  const auto [ptr, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc{} && ptr == end && !s.empty() && out <= max;
}

bool parse_publisher(const std::string& arg, promptcache::KvPublisherEndpoint& out) {
  std::vector<std::string> parts;
  std::stringstream in(arg);
  std::string part;
  while (std::getline(in, part, ','))
    parts.push_back(part);
  std::uint64_t rank = 0;
  if (parts.size() != 4 || parts[0].empty() ||
      !parse_number(parts[2], std::numeric_limits<std::uint64_t>::max(), out.worker.worker_id) ||
      !parse_number(parts[3], std::numeric_limits<std::uint32_t>::max(), rank))
    return false;
  out.endpoint = parts[0];
  out.replay_endpoint = parts[1];
  out.worker.dp_rank = static_cast<std::uint32_t>(rank);
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

// The message of the exception `error` holds.
std::string what(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t block_size = 0;
  std::string lora;
  std::vector<promptcache::KvPublisherEndpoint> publishers;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage(a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--block-size") {
      if (!parse_number(v, std::numeric_limits<std::uint32_t>::max(), block_size) ||
          block_size == 0)
        return usage("bad block size '" + v + "'");
    } else if (a == "--lora") {
      lora = v;
    } else if (a == "--publisher") {
      promptcache::KvPublisherEndpoint p;
      if (!parse_publisher(v, p)) return usage("bad publisher '" + v + "'");
      publishers.push_back(p);
    } else {
      return usage("unknown option " + a);
    }
  }
  if (block_size == 0) return usage("--block-size is required");
  if (publishers.empty()) return usage("at least one --publisher is required");

  promptcache::ZmqKvSubscriberOptions options;
  options.wire.block_size = static_cast<std::uint32_t>(block_size);  // checked above
  std::unique_ptr<promptcache::ZmqKvSubscriber> sub;
  try {
    sub = std::make_unique<promptcache::ZmqKvSubscriber>(publishers, options);
    sub->start();  // events apply in the background while requests are answered
  } catch (const std::exception& e) {
    std::cerr << "zmq_router: cannot subscribe: " << e.what() << "\n";
    return 1;
  }

  promptcache::BlockHashOptions hash_options;
  hash_options.seed = promptcache::block_hash_seed(lora);
  std::string line;
  while (std::getline(std::cin, line)) {
    if (!sub->running()) break;  // the thread died: the index no longer follows the engines
    if (line == "stats") {
      print_stats(*sub);
      continue;
    }
    std::vector<std::uint32_t> tokens;
    std::istringstream in(line);
    std::string word;
    std::uint64_t t = 0;
    bool ok = true;
    while (ok && in >> word) {
      ok = parse_number(word, std::numeric_limits<std::uint32_t>::max(), t);
      tokens.push_back(static_cast<std::uint32_t>(t));
    }
    if (!ok) {
      std::cerr << "zmq_router: bad token id '" << word << "': token ids are 0..4294967295\n";
      continue;
    }
    const auto hashes = promptcache::local_block_hashes(tokens, block_size, hash_options);
    auto matches = sub->with_index(
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
  sub->stop();
  if (const std::exception_ptr error = sub->thread_error()) {
    std::cerr << "zmq_router: the subscriber stopped on an error: " << what(error) << "\n";
    return 1;
  }
  return 0;
}
