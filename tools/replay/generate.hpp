// Synthetic Mooncake-format traces of typical traffic shapes, seeded and
// deterministic (the same seed gives the same bytes on every platform: the
// generator draws from its own splitmix64 stream and rounds every length and
// time to an integer), so that a policy can be checked on more than one shape
// of reuse without downloading anything.
//
// Shapes (all lengths in tokens, times in ms; `block` is the block size):
//   conversation    multi-turn chats: a turn's prompt is the previous turn's
//                   prompt, its answer and a new user message, sent after a
//                   think time (median 60 s, long tail); 8 system prompts.
//   agent           tool/agent loops: an agent run repeats a long tool prompt
//                   (one of 40, 6K-20K tokens, Zipf popularity) plus a
//                   scratchpad that grows by each tool result, seconds apart
//                   (one step in four waits minutes for a human).
//   shared-prompts  single requests of many users under a few system prompts
//                   (6, Zipf): system prompt, the user's own profile (fixed
//                   per user, 5,000 users, Zipf) and a one-off question.
//   scan            a hot set (10 templates, 300 documents of 8K-16K tokens
//                   asked about with Zipf popularity) mixed half and half with
//                   long one-off documents (median 24K tokens) of which a
//                   quarter get one follow-up question a few seconds later.
//
// Ids follow the Mooncake convention: one id per block of `block` tokens, the
// last block possibly partial, and two requests share an id exactly when they
// share the whole prefix up to and including that block. Every new block gets a
// fresh id; a shared prefix is shared by copying its ids, so a prompt that
// extends another keeps its full blocks and gets a new id for the block its
// partial tail grows into (the content of that block changed).
#pragma once

#include "trace.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <iostream>
#include <ostream>
#include <queue>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace promptcache::replay {

/// The traffic shapes generate_trace() produces (see the file comment).
enum class TraceShape : std::uint8_t {
  conversation,    ///< Multi-turn chats whose context grows each turn, with think times.
  agent,           ///< Tool/agent loops reusing a long tool prompt.
  shared_prompts,  ///< Many users under a few system prompts.
  scan,            ///< A hot set mixed with long one-off documents.
};

/// The shape's name on the command line.
[[nodiscard]] inline const char* trace_shape_name(TraceShape s) {
  switch (s) {
    case TraceShape::conversation:
      return "conversation";
    case TraceShape::agent:
      return "agent";
    case TraceShape::shared_prompts:
      return "shared-prompts";
    case TraceShape::scan:
      return "scan";
  }
  return "?";
}

/// The shape named `s`. Throws std::invalid_argument if unknown.
[[nodiscard]] inline TraceShape parse_trace_shape(std::string_view s) {
  for (TraceShape t :
       {TraceShape::conversation, TraceShape::agent, TraceShape::shared_prompts, TraceShape::scan})
    if (s == trace_shape_name(t)) return t;
  throw std::invalid_argument("unknown trace shape: '" + std::string(s) +
                              "' (conversation, agent, shared-prompts, scan)");
}

/// What to generate.
struct GenerateOptions {
  TraceShape shape = TraceShape::conversation;  ///< Traffic shape.
  std::uint64_t seed = 1;                       ///< Seed of every random draw.
  std::size_t requests = 4000;                  ///< Requests to produce (exactly).
  std::size_t block_size = 512;                 ///< Tokens per hash-id block.
};

/// One generated request: a trace line plus the flow it belongs to.
struct GeneratedRequest {
  std::uint64_t timestamp_ms = 0;       ///< Arrival time, ms, non-decreasing over the trace.
  std::size_t input_length = 0;         ///< Prompt tokens.
  std::size_t output_length = 0;        ///< Generated tokens.
  std::vector<std::uint64_t> hash_ids;  ///< ceil(input_length / block_size) ids.
  /// The conversation, agent run or document this request belongs to (not
  /// written to the trace; for checks).
  std::size_t flow = 0;
};

namespace detail {

// splitmix64: a portable stream, so a seed means the same trace everywhere.
class GenRng {
 public:
  explicit GenRng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform integer in [lo, hi].
  std::size_t between(std::size_t lo, std::size_t hi) {
    return lo + static_cast<std::size_t>(next() % (hi - lo + 1));
  }
  bool chance(double p) { return uniform() < p; }
  double exponential(double mean) { return -mean * std::log(1.0 - uniform()); }
  // Log-normal with the given median and sigma of the log.
  double lognormal(double median, double sigma) {
    const double u1 = 1.0 - uniform();
    const double u2 = uniform();
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    return median * std::exp(sigma * z);
  }
  // A length: log-normal, rounded, clamped to [lo, hi].
  std::size_t length(double median, double sigma, std::size_t lo, std::size_t hi) {
    const double v = std::round(lognormal(median, sigma));
    return std::clamp(static_cast<std::size_t>(std::max(v, 0.0)), lo, hi);
  }

 private:
  std::uint64_t s_;
};

// Zipf(s) over n items by inverse CDF.
class GenZipf {
 public:
  GenZipf(std::size_t n, double s) : cdf_(n) {
    double sum = 0.0;
    for (std::size_t i = 0; i < n; ++i)
      cdf_[i] = sum += 1.0 / std::pow(static_cast<double>(i + 1), s);
    for (double& c : cdf_)
      c /= sum;
  }
  std::size_t operator()(GenRng& r) const {
    const double u = r.uniform();
    const auto it = std::upper_bound(cdf_.begin(), cdf_.end(), u);
    return std::min(static_cast<std::size_t>(it - cdf_.begin()), cdf_.size() - 1);
  }

 private:
  std::vector<double> cdf_;
};

// A prompt under construction: the ids of its full blocks and its length.
struct GenContext {
  std::vector<std::uint64_t> full;  // ids of the full blocks
  std::size_t tokens = 0;
};

class Generator {
 public:
  explicit Generator(const GenerateOptions& o) : o_(o), rng_(o.seed) {}

  // A fresh context of `n` new tokens.
  GenContext fresh(std::size_t n) {
    GenContext c;
    append(c, n);
    return c;
  }
  // Appends `n` new tokens: the blocks they complete get fresh ids.
  void append(GenContext& c, std::size_t n) {
    c.tokens += n;
    while (c.full.size() < c.tokens / o_.block_size)
      c.full.push_back(next_id_++);
  }
  // The request for prompt `c`: its full blocks and, if the prompt ends inside
  // a block, a fresh id for that partial block.
  GeneratedRequest request(const GenContext& c, double t_ms, std::size_t output, std::size_t flow) {
    GeneratedRequest r;
    r.timestamp_ms = static_cast<std::uint64_t>(std::llround(t_ms));
    r.input_length = c.tokens;
    r.output_length = output;
    r.hash_ids = c.full;
    if (c.tokens % o_.block_size != 0) r.hash_ids.push_back(next_id_++);
    r.flow = flow;
    return r;
  }
  GenRng& rng() { return rng_; }
  const GenerateOptions& options() const { return o_; }
  std::uint64_t ids_used() const { return next_id_; }

 private:
  GenerateOptions o_;
  GenRng rng_;
  std::uint64_t next_id_ = 0;
};

// Runs flows in time order until `o.requests` requests are out. A flow
// is a callback step(gen, now_ms, out) that appends its next request (if any)
// and returns the delay to its following one (negative: the flow ended);
// new flows arrive as a Poisson process of mean gap `arrival_ms`.
template <class NewSession>
std::vector<GeneratedRequest> run_sessions(Generator& g, double arrival_ms, NewSession&& make) {
  using Step = decltype(make(g, std::size_t{0}));
  std::vector<Step> flows;
  // (time, order of scheduling, flow): the order breaks time ties deterministically.
  using Event = std::tuple<double, std::uint64_t, std::size_t>;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  std::uint64_t order = 0;
  std::vector<GeneratedRequest> out;
  double next_arrival = 0.0;
  while (out.size() < g.options().requests) {
    if (events.empty() || next_arrival <= std::get<0>(events.top())) {
      flows.push_back(make(g, flows.size()));
      events.emplace(next_arrival, order++, flows.size() - 1);
      next_arrival += g.rng().exponential(arrival_ms);
      continue;
    }
    const auto [t, ord, s] = events.top();
    (void)ord;
    events.pop();
    const double delay = flows[s](g, t, out);
    if (delay >= 0.0) events.emplace(t + delay, order++, s);
  }
  out.resize(g.options().requests);
  return out;
}

// Time to generate `output` tokens at 20 ms per token (the decode the next
// turn waits for).
inline double decode_ms(std::size_t output) {
  return 20.0 * static_cast<double>(output);
}

inline std::vector<GeneratedRequest> gen_conversation(Generator& g) {
  std::vector<GenContext> systems;
  for (std::size_t i = 0; i < 8; ++i)
    systems.push_back(g.fresh(g.rng().between(800, 3000)));
  const GenZipf pick_system(systems.size(), 1.0);
  return run_sessions(g, 1000.0, [&](Generator& gg, std::size_t id) {
    GenRng& r = gg.rng();
    GenContext c = systems[pick_system(r)];
    gg.append(c, r.length(2000, 1.0, 50, 30000));
    // 1 + geometric(mean 3) turns; a conversation stops at 100K tokens of context.
    std::size_t turns = 1;
    while (r.chance(0.75) && turns < 40)
      ++turns;
    return [c, turns, id](Generator& gen, double now, std::vector<GeneratedRequest>& out) mutable {
      GenRng& rr = gen.rng();
      const std::size_t output = rr.length(300, 0.8, 10, 4000);
      out.push_back(gen.request(c, now, output, id));
      if (--turns == 0 || c.tokens > 100'000) return -1.0;
      gen.append(c, output + rr.length(1200, 1.2, 20, 40000));
      return decode_ms(output) + rr.lognormal(60'000.0, 1.2);
    };
  });
}

inline std::vector<GeneratedRequest> gen_agent(Generator& g) {
  std::vector<GenContext> tools;
  for (std::size_t i = 0; i < 40; ++i)
    tools.push_back(g.fresh(g.rng().between(6000, 20000)));
  const GenZipf pick_tool(tools.size(), 0.9);
  return run_sessions(g, 1000.0, [&](Generator& gg, std::size_t id) {
    GenRng& r = gg.rng();
    GenContext c = tools[pick_tool(r)];
    gg.append(c, r.length(500, 0.8, 20, 8000));
    std::size_t steps = 1;
    while (r.chance(0.875) && steps < 60)
      ++steps;
    return [c, steps, id](Generator& gen, double now, std::vector<GeneratedRequest>& out) mutable {
      GenRng& rr = gen.rng();
      const std::size_t output = rr.length(150, 0.7, 5, 2000);
      out.push_back(gen.request(c, now, output, id));
      if (--steps == 0 || c.tokens > 120'000) return -1.0;
      gen.append(c, output + rr.length(800, 1.0, 10, 30000));
      // The tool runs for seconds; one step in four waits for a human (minutes).
      const double wait =
          rr.chance(0.25) ? rr.lognormal(180'000.0, 1.0) : rr.lognormal(3000.0, 1.0);
      return decode_ms(output) + wait;
    };
  });
}

inline std::vector<GeneratedRequest> gen_shared_prompts(Generator& g) {
  std::vector<GenContext> systems;
  for (std::size_t i = 0; i < 6; ++i)
    systems.push_back(g.fresh(g.rng().between(1000, 8000)));
  const GenZipf pick_system(systems.size(), 1.2);
  // Each user's profile sits under one system prompt, created on first use.
  constexpr std::size_t users = 5000;
  const GenZipf pick_user(users, 0.6);
  std::vector<GenContext> profiles(users);
  std::vector<bool> made(users, false);
  return run_sessions(g, 200.0, [&](Generator& gg, std::size_t id) {
    GenRng& r = gg.rng();
    const std::size_t u = pick_user(r);
    if (!made[u]) {
      profiles[u] = systems[pick_system(r)];
      gg.append(profiles[u], r.length(3000, 0.6, 200, 12000));
      made[u] = true;
    }
    GenContext c = profiles[u];
    gg.append(c, r.length(300, 1.0, 10, 8000));
    bool sent = false;
    return [c, sent, id](Generator& gen, double now, std::vector<GeneratedRequest>& out) mutable {
      if (sent) return -1.0;
      out.push_back(gen.request(c, now, gen.rng().length(200, 0.8, 5, 2000), id));
      sent = true;
      return 0.0;
    };
  });
}

inline std::vector<GeneratedRequest> gen_scan(Generator& g) {
  std::vector<GenContext> templates;
  for (std::size_t i = 0; i < 10; ++i)
    templates.push_back(g.fresh(g.rng().between(2000, 4000)));
  const GenZipf pick_template(templates.size(), 1.0);
  constexpr std::size_t docs = 300;
  const GenZipf pick_doc(docs, 1.1);
  std::vector<GenContext> hot(docs);
  std::vector<bool> made(docs, false);
  return run_sessions(g, 500.0, [&](Generator& gg, std::size_t id) {
    GenRng& r = gg.rng();
    GenContext c;
    std::size_t follow_ups = 0;
    if (r.chance(0.5)) {  // a question about a hot document
      const std::size_t d = pick_doc(r);
      if (!made[d]) {
        hot[d] = templates[pick_template(r)];
        gg.append(hot[d], r.between(8000, 16000));
        made[d] = true;
      }
      c = hot[d];
    } else {  // a long one-off document, a quarter of them asked about again
      c = templates[pick_template(r)];
      gg.append(c, r.length(24000, 0.6, 8000, 100000));
      follow_ups = r.chance(0.25) ? 1 : 0;
    }
    gg.append(c, r.length(200, 1.0, 10, 4000));
    return [c, follow_ups, id](Generator& gen, double now,
                               std::vector<GeneratedRequest>& out) mutable {
      GenRng& rr = gen.rng();
      const std::size_t output = rr.length(300, 0.8, 10, 4000);
      out.push_back(gen.request(c, now, output, id));
      if (follow_ups == 0) return -1.0;
      --follow_ups;
      gen.append(c, output + rr.length(200, 1.0, 10, 4000));
      return decode_ms(output) + rr.lognormal(10'000.0, 0.8);
    };
  });
}

}  // namespace detail

/// Generates `o.requests` requests of shape `o.shape` from `o.seed`, in arrival
/// order. Deterministic: the same options give the same requests. Throws
/// std::invalid_argument for a block size of 0 or above 2^20, or a trace whose
/// ids would not fit the block size (see max_hash_id()).
[[nodiscard]] inline std::vector<GeneratedRequest> generate_trace(const GenerateOptions& o) {
  if (o.block_size == 0 || o.block_size > (std::size_t{1} << 20))
    throw std::invalid_argument("generate: block size must be 1..1048576");
  detail::Generator g(o);
  std::vector<GeneratedRequest> out;
  switch (o.shape) {
    case TraceShape::conversation:
      out = detail::gen_conversation(g);
      break;
    case TraceShape::agent:
      out = detail::gen_agent(g);
      break;
    case TraceShape::shared_prompts:
      out = detail::gen_shared_prompts(g);
      break;
    case TraceShape::scan:
      out = detail::gen_scan(g);
      break;
  }
  if (g.ids_used() > max_hash_id(o.block_size) + 1)
    throw std::invalid_argument("generate: " + std::to_string(g.ids_used()) +
                                " ids do not fit block size " + std::to_string(o.block_size));
  return out;
}

/// Writes `rs` as Mooncake JSONL (one request per line).
inline void write_trace(std::ostream& out, const std::vector<GeneratedRequest>& rs) {
  for (const GeneratedRequest& r : rs) {
    out << "{\"timestamp\": " << r.timestamp_ms << ", \"input_length\": " << r.input_length
        << ", \"output_length\": " << r.output_length << ", \"hash_ids\": [";
    for (std::size_t i = 0; i < r.hash_ids.size(); ++i)
      out << (i == 0 ? "" : ", ") << r.hash_ids[i];
    out << "]}\n";
  }
}

/// Usage of `promptcache_replay generate`.
[[nodiscard]] inline std::string generate_usage() {
  return R"(usage: promptcache_replay generate --shape SHAPE [options]

Writes a synthetic Mooncake-format trace (JSONL) to stdout. Deterministic: the
same options give the same bytes.

  --shape SHAPE      conversation   multi-turn chats, context growing each turn,
                                    think times of a minute or more
                     agent          tool/agent loops reusing a long tool prompt
                     shared-prompts many users under a few system prompts
                     scan           a hot document set mixed with long one-off
                                    documents
  --seed N           seed (default 1)
  --requests N       requests to write (default 4000)
  --block-size N     tokens per hash id block (default 512)
  --help             this text
)";
}

/// Parses the arguments after `generate`; sets `help` when --help is given.
/// Throws std::invalid_argument naming the flag on a bad or missing value.
[[nodiscard]] inline GenerateOptions parse_generate_options(const std::vector<std::string>& args,
                                                            bool& help) {
  GenerateOptions o;
  bool shape = false;
  help = false;
  auto number = [](const std::string& flag, const std::string& v) {
    if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || v.size() > 19)
      throw std::invalid_argument(flag + ": not a non-negative integer: '" + v + "'");
    return std::stoull(v);
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw std::invalid_argument(a + ": missing value");
      return args[++i];
    };
    if (a == "--help" || a == "-h") {
      help = true;
    } else if (a == "--shape") {
      o.shape = parse_trace_shape(value());
      shape = true;
    } else if (a == "--seed") {
      o.seed = number(a, value());
    } else if (a == "--requests") {
      o.requests = static_cast<std::size_t>(number(a, value()));
      if (o.requests == 0 || o.requests > 10'000'000)
        throw std::invalid_argument("--requests: must be 1..10000000");
    } else if (a == "--block-size") {
      o.block_size = static_cast<std::size_t>(number(a, value()));
      if (o.block_size == 0 || o.block_size > (std::size_t{1} << 20))
        throw std::invalid_argument("--block-size: must be 1..1048576");
    } else {
      throw std::invalid_argument("generate: unknown option: " + a + " (see generate --help)");
    }
  }
  if (!shape && !help) throw std::invalid_argument("generate: --shape is required");
  return o;
}

/// `promptcache_replay generate ...`: argv[0] is "generate". Writes the trace
/// to stdout; returns the exit status (2 on a bad command line).
inline int generate_main(int argc, const char* const* argv) {
  bool help = false;
  GenerateOptions o;
  try {
    o = parse_generate_options(std::vector<std::string>(argv + 1, argv + argc), help);
  } catch (const std::exception& e) {
    std::cerr << "promptcache_replay: " << e.what() << "\n";
    return 2;
  }
  if (help) {
    std::cout << generate_usage();
    return 0;
  }
  write_trace(std::cout, generate_trace(o));
  std::cout.flush();
  return std::cout ? 0 : 1;
}

}  // namespace promptcache::replay
