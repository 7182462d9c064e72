// The replay tool's trace reader: valid lines, every error path with its line
// number, skip-or-stop, and the pseudo-token expansion.
#include "replay.hpp"

#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"

namespace rp = promptcache::replay;

namespace {

rp::Trace parse(const std::string& text, std::size_t block_size = 4,
                rp::OnError on_error = rp::OnError::skip) {
  std::istringstream in(text);
  return rp::parse_trace(in, block_size, on_error);
}

}  // namespace

TEST_CASE("replay trace: valid lines, blank lines and CRLF", "[replay]") {
  const rp::Trace t = parse(
      "{\"timestamp\": 0, \"input_length\": 6, \"output_length\": 3, \"hash_ids\": [7, 8]}\n"
      "\n"
      "   \n"
      "{\"timestamp\": 12.5, \"input_length\": 8, \"output_length\": 0, \"hash_ids\": [7, 9], "
      "\"extra\": true}\r\n");
  CHECK(t.errors.empty());
  CHECK(t.lines == 4);
  REQUIRE(t.requests.size() == 2);
  CHECK(t.requests[0].line == 1);
  CHECK(t.requests[1].line == 4);
  CHECK(t.requests[1].timestamp_ms == 12.5);
  CHECK(t.requests[0].input_length == 6);
  CHECK(t.requests[0].output_length == 3);
  CHECK(t.prompt_tokens() == 14);
  // Prefix tree: 7 shared, 8 and 9 its children.
  CHECK(t.node_count() == 3);
  CHECK(t.requests[0].nodes[0] == t.requests[1].nodes[0]);
  CHECK(t.requests[0].nodes[1] != t.requests[1].nodes[1]);
  CHECK(t.node_parent[t.requests[1].nodes[1]] == t.requests[1].nodes[0]);
  CHECK(t.node_depth[t.requests[1].nodes[1]] == 1);
  CHECK(t.node_hash[t.requests[1].nodes[1]] == 9);
}

TEST_CASE("replay trace: an id reused under another parent is another prefix", "[replay]") {
  const rp::Trace t = parse(
      "{\"timestamp\": 0, \"input_length\": 8, \"output_length\": 1, \"hash_ids\": [1, 5]}\n"
      "{\"timestamp\": 1, \"input_length\": 8, \"output_length\": 1, \"hash_ids\": [2, 5]}\n");
  REQUIRE(t.requests.size() == 2);
  CHECK(t.node_count() == 4);
  CHECK(t.requests[0].nodes[1] != t.requests[1].nodes[1]);
}

TEST_CASE("replay trace: every malformed line is reported with its number", "[replay]") {
  const std::string good =
      "{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [1]}";
  const std::vector<std::pair<std::string, std::string>> cases{
      {"{\"timestamp\": 0, \"input_length\": 4", "parse error"},
      {"[1, 2, 3]", "not a JSON object"},
      {"{\"input_length\": 4, \"output_length\": 1, \"hash_ids\": [1]}", "missing \"timestamp\""},
      {"{\"timestamp\": -1, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [1]}",
       "\"timestamp\" must be"},
      {"{\"timestamp\": \"0\", \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [1]}",
       "\"timestamp\" must be"},
      {"{\"timestamp\": 0, \"output_length\": 1, \"hash_ids\": [1]}", "missing \"input_length\""},
      {"{\"timestamp\": 0, \"input_length\": -4, \"output_length\": 1, \"hash_ids\": [1]}",
       "\"input_length\" must be a non-negative integer"},
      {"{\"timestamp\": 0, \"input_length\": 4.5, \"output_length\": 1, \"hash_ids\": [1]}",
       "\"input_length\" must be a non-negative integer"},
      {"{\"timestamp\": 0, \"input_length\": 4, \"hash_ids\": [1]}", "missing \"output_length\""},
      {"{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 1}", "missing \"hash_ids\""},
      {"{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": 1}",
       "\"hash_ids\" must be an array"},
      {"{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [\"a\"]}",
       "non-negative integers"},
      {"{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [-1]}",
       "non-negative integers"},
      {"{\"timestamp\": 0, \"input_length\": 9, \"output_length\": 1, \"hash_ids\": [1, 2]}",
       "needs 3 blocks"},
      {"{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": "
       "[1073741824]}",
       "exceeds 1073741823"},
      // ceil(input_length / 4) near SIZE_MAX: the count must not wrap to 0 blocks.
      {"{\"timestamp\": 0, \"input_length\": 18446744073709551615, \"output_length\": 0, "
       "\"hash_ids\": []}",
       "needs 4611686018427387904 blocks"},
      {"{\"timestamp\": 0, \"input_length\": 18446744073709551613, \"output_length\": 0, "
       "\"hash_ids\": []}",
       "needs 4611686018427387904 blocks"},
  };
  for (const auto& [line, message] : cases) {
    INFO(line);
    const rp::Trace t = parse(good + "\n" + line + "\n" + good + "\n");
    REQUIRE(t.errors.size() == 1);
    CHECK(t.errors[0].line == 2);
    CHECK(t.errors[0].message.find(message) != std::string::npos);
    // skip: the lines around it are kept.
    CHECK(t.requests.size() == 2);
    CHECK(t.requests[1].line == 3);
    // stop: parsing ends at the bad line, what came before is kept.
    const rp::Trace s = parse(good + "\n" + line + "\n" + good + "\n", 4, rp::OnError::stop);
    REQUIRE(s.errors.size() == 1);
    CHECK(s.errors[0].line == 2);
    CHECK(s.requests.size() == 1);
    CHECK(s.lines == 2);
  }
  // The same at the default block size: one error, the line skipped.
  const rp::Trace t = parse(
      "{\"timestamp\":0,\"input_length\":18446744073709551615,\"output_length\":0,"
      "\"hash_ids\":[]}\n",
      512);
  REQUIRE(t.errors.size() == 1);
  CHECK(t.errors[0].message.find("needs 36028797018963968 blocks") != std::string::npos);
  CHECK(t.requests.empty());
}

TEST_CASE("replay trace: block size 0, empty input, empty prompts", "[replay]") {
  const rp::Trace z = parse("{}\n", 0);
  REQUIRE(z.errors.size() == 1);
  CHECK(z.errors[0].line == 0);
  CHECK(z.requests.empty());
  const rp::Trace big = parse("{}\n", rp::max_block_size + 1);
  REQUIRE(big.errors.size() == 1);
  CHECK(big.errors[0].line == 0);
  CHECK(big.requests.empty());
  // The largest block size: one id (0), whose 2^32 tokens fit in 32 bits.
  const rp::Trace top = parse(
      "{\"timestamp\": 0, \"input_length\": 4294967296, \"output_length\": 1, "
      "\"hash_ids\": [0]}\n",
      rp::max_block_size);
  CHECK(top.errors.empty());
  CHECK(top.prompt_tokens() == 4294967296ULL);

  const rp::Trace e = parse("");
  CHECK(e.requests.empty());
  CHECK(e.errors.empty());

  const rp::Trace p =
      parse("{\"timestamp\": 0, \"input_length\": 0, \"output_length\": 5, \"hash_ids\": []}\n");
  REQUIRE(p.requests.size() == 1);
  CHECK(p.requests[0].nodes.empty());
  CHECK(p.prompt_tokens() == 0);
}

TEST_CASE("replay trace: pseudo-tokens are distinct per id and cut to the input length",
          "[replay]") {
  const rp::Trace t = parse(
      "{\"timestamp\": 0, \"input_length\": 6, \"output_length\": 1, \"hash_ids\": [2, 3]}\n");
  REQUIRE(t.requests.size() == 1);
  CHECK(rp::block_tokens(t.requests[0], 0, 4) == 4);
  CHECK(rp::block_tokens(t.requests[0], 1, 4) == 2);
  std::vector<std::uint32_t> tokens;
  rp::expand_tokens(t.requests[0], 4, tokens);
  CHECK(tokens == std::vector<std::uint32_t>{8, 9, 10, 11, 12, 13});
  CHECK(rp::max_hash_id(512) == 8388607);
  CHECK(rp::max_hash_id(1) == 4294967295ULL);
}

TEST_CASE("replay options: token counts, lists and bad flags", "[replay]") {
  CHECK(rp::parse_tokens("1.5M") == 1'500'000);
  CHECK(rp::parse_tokens("250K") == 250'000);
  CHECK(rp::parse_tokens("4096") == 4096);
  CHECK(rp::parse_tokens("0") == 0);
  CHECK_THROWS_AS(rp::parse_tokens(""), std::invalid_argument);
  CHECK_THROWS_AS(rp::parse_tokens("M"), std::invalid_argument);
  CHECK_THROWS_AS(rp::parse_tokens("-1M"), std::invalid_argument);
  CHECK_THROWS_AS(rp::parse_tokens("1X"), std::invalid_argument);
  CHECK(rp::split_list("a,,b,") == std::vector<std::string>{"a", "b"});

  const char* ok[] = {"replay",      "--capacities", "1M,2M", "--routing",
                      "cache-aware", "--workers",    "3",     "--json",
                      "--on-error",  "stop"};
  const rp::Options o = rp::parse_options(10, ok);
  CHECK(o.capacities == std::vector<std::size_t>{1'000'000, 2'000'000});
  CHECK(o.routing == std::vector<rp::RoutePolicy>{rp::RoutePolicy::cache_aware});
  CHECK(o.cluster.workers == 3);
  CHECK(o.json);
  CHECK(o.on_error == rp::OnError::stop);

  const std::vector<std::vector<const char*>> bad{
      {"replay", "--workers"},           {"replay", "--workers", "0"},
      {"replay", "--workers", "x"},      {"replay", "--routing", "fastest"},
      {"replay", "--on-error", "maybe"}, {"replay", "--block-size", "0"},
      {"replay", "--time-scale", "0"},   {"replay", "--temperature", "-1"},
      {"replay", "--frobnicate"},        {"replay", "--capacities", ","}};
  for (const auto& args : bad) {
    INFO(args.back());
    CHECK_THROWS_AS(rp::parse_options(static_cast<int>(args.size()), args.data()),
                    std::invalid_argument);
  }
  // Names and sizes are checked while parsing, before any work: the message
  // names the flag and the item.
  const std::vector<std::pair<std::vector<const char*>, std::string>> unknown{
      {{"replay", "--worker-cache", "paged:foo"}, "--worker-cache: unknown cache 'paged:foo'"},
      {{"replay", "--worker-cache", "block:adaptive"}, "unknown cache 'block:adaptive'"},
      {{"replay", "--structures", "block,paged:lur"},
       "--structures: unknown structure 'paged:lur'"},
      {{"replay", "--structures", "blocks"}, "unknown structure 'blocks'"},
      {{"replay", "--structures", "belady:lru"}, "unknown structure 'belady:lru'"},
      {{"replay", "--block-size", "1", "--capacities", "4294967297"},
       "--capacities: 4294967297 tokens is more than 4294967296 pages"},
      {{"replay", "--block-size", "1", "--worker-capacity", "4294967297"},
       "--worker-capacity: 4294967297 tokens is more than 4294967296 pages"},
  };
  for (const auto& [args, message] : unknown) {
    INFO(args.back());
    try {
      (void)rp::parse_options(static_cast<int>(args.size()), args.data());
      FAIL("accepted");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).find(message) != std::string::npos);
    }
  }
  // What needs no paged cache may be larger; exactly max_pages pages is fine.
  const std::vector<std::vector<const char*>> fine{
      {"replay", "--structures", "belady,block:adaptive,paged:filo,pool-common", "--worker-cache",
       "block:lru"},
      {"replay", "--block-size", "1", "--capacities", "4294967296", "--worker-capacity",
       "4294967296"},
      {"replay", "--block-size", "1", "--capacities", "5000G", "--structures", "block,belady",
       "--no-cluster"},
      {"replay", "--block-size", "1", "--capacities", "5000G", "--no-sweep", "--worker-cache",
       "block:lru", "--worker-capacity", "5000G"},
  };
  for (const auto& args : fine) {
    INFO(args[2]);
    CHECK_NOTHROW(rp::parse_options(static_cast<int>(args.size()), args.data()));
  }
  // --help prints the usage: names it would reject do not stop it.
  for (const std::vector<const char*>& args :
       {std::vector<const char*>{"replay", "--help", "--worker-cache", "foo"},
        std::vector<const char*>{"replay", "--structures", "blocks", "-h"}})
    CHECK(rp::parse_options(static_cast<int>(args.size()), args.data()).help);
  CHECK(rp::structure_names().front() == "belady");
  CHECK(rp::structure_names().back() == "paged:adaptive");
  CHECK(rp::structure_names().size() == 5 + rp::all_structures().size());

  CHECK(rp::selected({}, "block", "lru"));
  CHECK(rp::selected({"block"}, "block", "lru"));
  CHECK(rp::selected({"block:lru"}, "block", "lru"));
  CHECK_FALSE(rp::selected({"block:adaptive"}, "block", "lru"));
}
