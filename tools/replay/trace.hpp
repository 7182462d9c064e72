// Mooncake-format traces: parsing, validation and expansion into token ids.
//
// One request per line, a JSON object with `timestamp` (ms), `input_length`,
// `output_length` and `hash_ids` (ids of the prompt's blocks of `block_size`
// tokens; equal ids are equal content, and a request's ids are its prefix
// chain). Blank lines are skipped. A malformed line gets an error naming its
// line number; the caller chooses whether parsing continues past it.
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <limits>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace promptcache::replay {

/// One request of a trace.
struct Request {
  double timestamp_ms = 0.0;            ///< Arrival time in milliseconds.
  std::size_t input_length = 0;         ///< Prompt tokens.
  std::size_t output_length = 0;        ///< Generated tokens.
  std::vector<std::uint64_t> hash_ids;  ///< Block ids, root first.
  /// Prefix-tree node of each block: equal node ids are equal prefixes (the
  /// tree over hash-id chains), so block-level simulations stay prefix-exact
  /// even if a trace reuses an id under two different parents.
  std::vector<std::uint32_t> nodes;
  std::size_t line = 0;  ///< 1-based line number in the source.
};

/// A line that could not be used.
struct TraceError {
  std::size_t line = 0;  ///< 1-based line number.
  std::string message;   ///< What is wrong with it.
};

/// What to do with a malformed line.
enum class OnError : std::uint8_t {
  skip,  ///< Record the error, drop the line, keep parsing.
  stop,  ///< Record the error and stop parsing (requests before it are kept).
};

/// A parsed trace: its requests in file order and the prefix tree of its blocks.
struct Trace {
  std::size_t block_size = 512;            ///< Tokens per hash-id block.
  std::vector<Request> requests;           ///< Valid requests, in file order.
  std::vector<TraceError> errors;          ///< Malformed lines.
  std::size_t lines = 0;                   ///< Lines read (blank ones included).
  std::vector<std::uint32_t> node_parent;  ///< Parent node of each node (npos: a root block).
  std::vector<std::uint32_t> node_depth;   ///< Depth of each node (0: a root block).
  std::vector<std::uint64_t> node_hash;    ///< The hash id of each node.
  static constexpr std::uint32_t npos = std::numeric_limits<std::uint32_t>::max();

  /// Sum of input_length over the requests.
  [[nodiscard]] std::size_t prompt_tokens() const {
    std::size_t n = 0;
    for (const Request& r : requests)
      n += r.input_length;
    return n;
  }
  /// Number of distinct prefix-tree nodes (blocks with distinct prefixes).
  [[nodiscard]] std::size_t node_count() const { return node_parent.size(); }
};

/// Tokens of block `i` of `r` (the last block is cut to input_length).
[[nodiscard]] inline std::size_t block_tokens(const Request& r, std::size_t i,
                                              std::size_t block_size) {
  const std::size_t n = r.hash_ids.size();
  return i + 1 < n ? block_size : r.input_length - block_size * (n - 1);
}

/// The largest hash id whose pseudo-tokens fit in 32 bits at `block_size`.
[[nodiscard]] inline std::uint64_t max_hash_id(std::size_t block_size) {
  return (std::uint64_t{std::numeric_limits<std::uint32_t>::max()} + 1) / block_size - 1;
}

/// Appends the pseudo-token ids of `r`: block i of hash id h is the tokens
/// h * block_size + j for j in [0, block tokens), so distinct ids never share a
/// token and equal ids give equal tokens.
inline void expand_tokens(const Request& r, std::size_t block_size,
                          std::vector<std::uint32_t>& out) {
  for (std::size_t i = 0; i < r.hash_ids.size(); ++i) {
    const std::size_t len = block_tokens(r, i, block_size);
    const auto base = static_cast<std::uint32_t>(r.hash_ids[i] * block_size);
    for (std::size_t j = 0; j < len; ++j)
      out.push_back(base + static_cast<std::uint32_t>(j));
  }
}

namespace detail {

inline bool get_size(const nlohmann::json& obj, const char* key, std::size_t& out,
                     std::string& err) {
  const auto it = obj.find(key);
  if (it == obj.end()) {
    err = std::string("missing \"") + key + "\"";
    return false;
  }
  if (!it->is_number_unsigned()) {
    err = std::string("\"") + key + "\" must be a non-negative integer";
    return false;
  }
  out = it->get<std::size_t>();
  return true;
}

// Validates one parsed line into `r`; false with `err` set when it is unusable.
inline bool read_request(const nlohmann::json& j, std::size_t block_size, Request& r,
                         std::string& err) {
  if (!j.is_object()) {
    err = "not a JSON object";
    return false;
  }
  const auto ts = j.find("timestamp");
  if (ts == j.end()) {
    err = "missing \"timestamp\"";
    return false;
  }
  if (!ts->is_number() || !std::isfinite(ts->get<double>()) || ts->get<double>() < 0.0) {
    err = "\"timestamp\" must be a finite number >= 0";
    return false;
  }
  r.timestamp_ms = ts->get<double>();
  if (!get_size(j, "input_length", r.input_length, err)) return false;
  if (!get_size(j, "output_length", r.output_length, err)) return false;
  const auto ids = j.find("hash_ids");
  if (ids == j.end()) {
    err = "missing \"hash_ids\"";
    return false;
  }
  if (!ids->is_array()) {
    err = "\"hash_ids\" must be an array";
    return false;
  }
  const std::uint64_t max_id = max_hash_id(block_size);
  r.hash_ids.clear();
  r.hash_ids.reserve(ids->size());
  for (const auto& v : *ids) {
    if (!v.is_number_unsigned()) {
      err = "\"hash_ids\" must hold non-negative integers";
      return false;
    }
    const auto id = v.get<std::uint64_t>();
    if (id > max_id) {
      err = "hash id " + std::to_string(id) + " exceeds " + std::to_string(max_id) +
            " (its tokens would not fit in 32 bits at block size " + std::to_string(block_size) +
            ")";
      return false;
    }
    r.hash_ids.push_back(id);
  }
  // ceil(input_length / block_size) without the overflow of the usual
  // (n + b - 1) / b near SIZE_MAX, where it would wrap to 0 blocks.
  const std::size_t want = r.input_length / block_size + (r.input_length % block_size != 0 ? 1 : 0);
  if (r.hash_ids.size() != want) {
    err = "\"hash_ids\" has " + std::to_string(r.hash_ids.size()) + " ids but input_length " +
          std::to_string(r.input_length) + " needs " + std::to_string(want) + " blocks of " +
          std::to_string(block_size);
    return false;
  }
  return true;
}

}  // namespace detail

/// The largest block size parse_trace accepts: one block's pseudo-tokens must
/// fit in 32 bits.
inline constexpr std::size_t max_block_size = std::size_t{1} << 32;

/// Parses a whole trace from `in`. `block_size` must be 1..max_block_size
/// (anything else is reported as an error on line 0 and nothing is read). A
/// line whose input_length would take the trace's total prompt tokens past
/// SIZE_MAX is malformed, so every sum over the accepted requests (the trace's
/// and each simulation's token totals) fits a size_t. Never throws on bad input.
[[nodiscard]] inline Trace parse_trace(std::istream& in, std::size_t block_size,
                                       OnError on_error = OnError::skip) {
  Trace t;
  t.block_size = block_size;
  if (block_size == 0 || block_size > max_block_size) {
    t.errors.push_back({0, "block size must be 1.." + std::to_string(max_block_size)});
    return t;
  }
  std::size_t total = 0;  // prompt tokens of the requests accepted so far
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::uint32_t> children;
  std::string line;
  while (std::getline(in, line)) {
    ++t.lines;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    Request r;
    r.line = t.lines;
    std::string err;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      err = e.what();
    }
    if (err.empty() && detail::read_request(j, block_size, r, err) &&
        r.input_length > std::numeric_limits<std::size_t>::max() - total)
      err = "input_length " + std::to_string(r.input_length) +
            " takes the trace's prompt tokens past " +
            std::to_string(std::numeric_limits<std::size_t>::max());
    if (err.empty()) {
      total += r.input_length;
      std::uint32_t parent = Trace::npos;
      r.nodes.reserve(r.hash_ids.size());
      for (std::uint64_t id : r.hash_ids) {
        auto [it, fresh] =
            children.try_emplace({parent, id}, static_cast<std::uint32_t>(t.node_parent.size()));
        if (fresh) {
          t.node_depth.push_back(parent == Trace::npos ? 0U : t.node_depth[parent] + 1U);
          t.node_parent.push_back(parent);
          t.node_hash.push_back(id);
        }
        parent = it->second;
        r.nodes.push_back(parent);
      }
      t.requests.push_back(std::move(r));
      continue;
    }
    t.errors.push_back({t.lines, err});
    if (on_error == OnError::stop) break;
  }
  return t;
}

}  // namespace promptcache::replay
