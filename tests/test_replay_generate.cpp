// The replay tool's trace generator: deterministic for a seed, valid Mooncake
// traces, and each shape has the reuse pattern it is named for.
#include "replay.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"

namespace rp = promptcache::replay;

namespace {

std::vector<rp::GeneratedRequest> generate(rp::TraceShape shape, std::uint64_t seed,
                                           std::size_t requests = 1500) {
  rp::GenerateOptions o;
  o.shape = shape;
  o.seed = seed;
  o.requests = requests;
  return rp::generate_trace(o);
}

std::string text(const std::vector<rp::GeneratedRequest>& rs) {
  std::ostringstream out;
  rp::write_trace(out, rs);
  return out.str();
}

// Full-block ids of a request (the last id is a partial block's when the
// prompt does not end on a block boundary).
std::vector<std::uint64_t> full_blocks(const rp::GeneratedRequest& r, std::size_t block) {
  std::vector<std::uint64_t> ids = r.hash_ids;
  if (r.input_length % block != 0) ids.pop_back();
  return ids;
}

bool starts_with(const std::vector<std::uint64_t>& a, const std::vector<std::uint64_t>& prefix) {
  return a.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), a.begin());
}

// Share of prompt tokens in full blocks whose id occurs in exactly one request.
double once_share(const std::vector<rp::GeneratedRequest>& rs, std::size_t block) {
  std::map<std::uint64_t, std::size_t> uses;
  std::size_t total = 0;
  for (const auto& r : rs) {
    total += r.input_length;
    for (std::uint64_t id : full_blocks(r, block))
      ++uses[id];
  }
  std::size_t once = 0;
  for (const auto& [id, n] : uses)
    if (n == 1) once += block;
  return static_cast<double>(once) / static_cast<double>(total);
}

const rp::TraceShape all_shapes[] = {rp::TraceShape::conversation, rp::TraceShape::agent,
                                     rp::TraceShape::shared_prompts, rp::TraceShape::scan};

}  // namespace

TEST_CASE("replay generate: the same seed gives the same trace, another seed another", "[replay]") {
  for (rp::TraceShape s : all_shapes) {
    INFO(rp::trace_shape_name(s));
    const std::string a = text(generate(s, 7, 300));
    CHECK(a == text(generate(s, 7, 300)));
    CHECK(a != text(generate(s, 8, 300)));
  }
}

TEST_CASE("replay generate: every shape is a valid Mooncake trace in arrival order", "[replay]") {
  for (rp::TraceShape s : all_shapes) {
    INFO(rp::trace_shape_name(s));
    const auto rs = generate(s, 3, 800);
    REQUIRE(rs.size() == 800);
    std::istringstream in(text(rs));
    const rp::Trace t = rp::parse_trace(in, 512);
    CHECK(t.errors.empty());
    REQUIRE(t.requests.size() == 800);
    for (std::size_t i = 1; i < rs.size(); ++i)
      CHECK(rs[i - 1].timestamp_ms <= rs[i].timestamp_ms);
    // Ids are prefix-exact: an id means one block content under one prefix.
    std::map<std::uint64_t, std::size_t> parent_of;  // id -> index of its predecessor + 1
    for (const auto& r : rs)
      for (std::size_t i = 0; i < r.hash_ids.size(); ++i) {
        const std::size_t parent = i == 0 ? 0 : static_cast<std::size_t>(r.hash_ids[i - 1]) + 1;
        const auto [it, fresh] = parent_of.try_emplace(r.hash_ids[i], parent);
        CHECK((fresh || it->second == parent));
      }
  }
}

TEST_CASE("replay generate: conversations grow turn by turn after a think time", "[replay]") {
  const auto rs = generate(rp::TraceShape::conversation, 1);
  std::map<std::size_t, const rp::GeneratedRequest*> last;
  std::size_t later_turns = 0;
  for (const auto& r : rs) {
    const auto it = last.find(r.flow);
    if (it != last.end()) {
      const rp::GeneratedRequest& prev = *it->second;
      ++later_turns;
      // The whole previous prompt (its full blocks) comes back, followed by the
      // answer and a new message, at least a second later.
      CHECK(starts_with(r.hash_ids, full_blocks(prev, 512)));
      CHECK(r.input_length > prev.input_length + prev.output_length);
      CHECK(r.timestamp_ms >= prev.timestamp_ms + 1000);
    }
    last[r.flow] = &r;
  }
  CHECK(later_turns > rs.size() / 2);  // most requests are a later turn
  CHECK(last.size() > 100);            // many conversations, interleaved
}

TEST_CASE("replay generate: agent steps repeat a long tool prompt", "[replay]") {
  const auto rs = generate(rp::TraceShape::agent, 1);
  // The tool prompts: the first full blocks (at least 6,000 tokens) shared by
  // the flows. Every request starts with one of at most 40.
  std::set<std::vector<std::uint64_t>> tools;
  std::map<std::size_t, std::size_t> steps;
  for (const auto& r : rs) {
    REQUIRE(r.input_length >= 6000);
    tools.insert(std::vector<std::uint64_t>(r.hash_ids.begin(), r.hash_ids.begin() + 11));
    ++steps[r.flow];
  }
  CHECK(tools.size() <= 40);
  CHECK(tools.size() >= 10);
  std::size_t looping = 0;
  for (const auto& [flow, n] : steps)
    looping += n >= 3 ? n : 0;
  CHECK(looping > rs.size() / 2);  // most requests are in flows of 3 steps or more
}

TEST_CASE("replay generate: shared prompts put many users under a few system prompts", "[replay]") {
  const auto rs = generate(rp::TraceShape::shared_prompts, 1);
  std::set<std::uint64_t> roots;
  for (const auto& r : rs) {
    REQUIRE(!r.hash_ids.empty());
    roots.insert(r.hash_ids.front());
  }
  CHECK(roots.size() <= 6);
  // Users: the blocks after the system prompt repeat for returning users, and
  // every request ends with its own question (a block no other request has).
  std::map<std::uint64_t, std::size_t> last_use;
  for (const auto& r : rs)
    ++last_use[r.hash_ids.back()];
  for (const auto& [id, n] : last_use)
    CHECK(n == 1);
  CHECK(once_share(rs, 512) < 0.5);
}

TEST_CASE("replay generate: the scan mix is dominated by long one-off documents", "[replay]") {
  const auto rs = generate(rp::TraceShape::scan, 1);
  std::size_t long_prompts = 0;
  for (const auto& r : rs)
    long_prompts += r.input_length >= 16000 ? 1 : 0;
  CHECK(long_prompts > rs.size() / 3);
  // Most prompt tokens are in blocks no other request uses.
  CHECK(once_share(rs, 512) > 0.4);
  // ... while the hot documents make a conversation-free reuse set: some
  // requests repeat a full prompt prefix of 8K tokens or more.
  std::map<std::vector<std::uint64_t>, std::size_t> heads;
  for (const auto& r : rs)
    if (r.hash_ids.size() > 20)
      ++heads[std::vector<std::uint64_t>(r.hash_ids.begin(), r.hash_ids.begin() + 20)];
  std::size_t repeated = 0;
  for (const auto& [h, n] : heads)
    repeated += n > 1 ? n : 0;
  CHECK(repeated > rs.size() / 5);
}

TEST_CASE("replay generate: the command line", "[replay]") {
  bool help = false;
  const auto o = rp::parse_generate_options(
      {"--shape", "agent", "--seed", "9", "--requests", "10", "--block-size", "16"}, help);
  CHECK(!help);
  CHECK(o.shape == rp::TraceShape::agent);
  CHECK(o.seed == 9);
  CHECK(o.requests == 10);
  CHECK(o.block_size == 16);
  (void)rp::parse_generate_options({"--help"}, help);
  CHECK(help);
  CHECK_THROWS_AS(rp::parse_generate_options({}, help), std::invalid_argument);
  CHECK_THROWS_AS(rp::parse_generate_options({"--shape", "nope"}, help), std::invalid_argument);
  CHECK_THROWS_AS(rp::parse_generate_options({"--shape", "scan", "--seed"}, help),
                  std::invalid_argument);
  CHECK_THROWS_AS(rp::parse_generate_options({"--shape", "scan", "--requests", "0"}, help),
                  std::invalid_argument);
  CHECK_THROWS_AS(rp::parse_generate_options({"--shape", "scan", "--block-size", "-1"}, help),
                  std::invalid_argument);
  CHECK_THROWS_AS(rp::parse_generate_options({"--shape", "scan", "--bogus"}, help),
                  std::invalid_argument);
  // A block size whose ids do not fit 32-bit pseudo-tokens is refused, not wrapped.
  rp::GenerateOptions big;
  big.shape = rp::TraceShape::scan;
  big.block_size = std::size_t{1} << 20;
  big.requests = 5000;  // at least one id per request, 4,096 ids at most
  CHECK_THROWS_AS(rp::generate_trace(big), std::invalid_argument);
}
