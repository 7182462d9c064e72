// The msgpack parser of the KV event wire decoder (detail::MpTape) against
// msgpack-cxx's own parser driven by a visitor that writes the same tape:
// on the fixtures, their mutations and truncations, generated values of
// every msgpack format (edge lengths, the reserved type byte, an ext 32 of
// 2^32 - 1 bytes) and random bytes, under several depth limits, both must
// stop for the same reason, end at the same byte and write the same tape.
// Deterministic: fixed seeds.
#include <promptcache/kv_event_wire.hpp>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "catch.hpp"

#ifndef PROMPTCACHE_KV_WIRE_FIXTURES
#error "PROMPTCACHE_KV_WIRE_FIXTURES must name the fixture directory"
#endif

namespace {

using promptcache::detail::MpKind;
using promptcache::detail::MpNode;
using promptcache::detail::MpParse;
using Bytes = std::vector<unsigned char>;

// The reference: a msgpack-cxx parse visitor writing the tape.
class Reference : public msgpack::null_visitor {
 public:
  Reference(const char* base, std::uint32_t max_depth) : base_(base), max_depth_(max_depth) {}

  bool visit_nil() { return leaf(MpKind::nil, 0, 0); }
  bool visit_boolean(bool v) { return leaf(MpKind::boolean, v ? 1U : 0U, 0); }
  bool visit_positive_integer(std::uint64_t v) { return leaf(MpKind::uint, v, 0); }
  bool visit_negative_integer(std::int64_t v) {
    return leaf(v < 0 ? MpKind::sint : MpKind::uint, static_cast<std::uint64_t>(v), 0);
  }
  bool visit_float32(float v) {
    return leaf(MpKind::real, std::bit_cast<std::uint64_t>(static_cast<double>(v)), 0);
  }
  bool visit_float64(double v) { return leaf(MpKind::real, std::bit_cast<std::uint64_t>(v), 0); }
  bool visit_str(const char* v, std::uint32_t size) { return leaf(MpKind::str, offset(v), size); }
  bool visit_bin(const char* v, std::uint32_t size) { return leaf(MpKind::bin, offset(v), size); }
  bool visit_ext(const char* v, std::uint32_t size) { return leaf(MpKind::ext, offset(v), size); }
  bool start_array(std::uint32_t n) { return open(MpKind::array, n); }
  bool end_array() { return close(); }
  bool start_map(std::uint32_t n) { return open(MpKind::map, n); }
  bool end_map() { return close(); }
  void parse_error(std::size_t, std::size_t) { invalid = true; }
  void insufficient_bytes(std::size_t, std::size_t) { truncated = true; }

  std::vector<MpNode> tape;
  bool invalid = false;
  bool truncated = false;
  bool too_deep = false;

 private:
  std::uint64_t offset(const char* p) const {
    return p == nullptr ? 0U : static_cast<std::uint64_t>(p - base_);
  }
  bool leaf(MpKind kind, std::uint64_t bits, std::uint32_t size) {
    MpNode n;
    n.bits = bits;
    n.size = size;
    n.kind = kind;
    n.end = static_cast<std::uint32_t>(tape.size() + 1U);
    tape.push_back(n);
    return true;
  }
  bool open(MpKind kind, std::uint32_t n) {
    if (open_.size() >= max_depth_) {
      too_deep = true;
      return false;
    }
    open_.push_back(static_cast<std::uint32_t>(tape.size()));
    MpNode node;
    node.size = n;
    node.kind = kind;
    tape.push_back(node);
    return true;
  }
  bool close() {
    tape[open_.back()].end = static_cast<std::uint32_t>(tape.size());
    open_.pop_back();
    return true;
  }

  const char* base_;
  std::uint32_t max_depth_;
  std::vector<std::uint32_t> open_;
};

struct Outcome {
  MpParse status = MpParse::ok;
  std::size_t used = 0;
  std::vector<MpNode> tape;
};

Outcome reference(const Bytes& b, std::uint32_t max_depth) {
  const char* base = reinterpret_cast<const char*>(b.data());
  Reference v(base, max_depth);
  Outcome o;
  std::size_t off = 0;
  bool parsed = false;
  try {
    parsed = msgpack::parse(base, b.size(), off, v);
  } catch (const std::bad_alloc&) {
    throw;
  } catch (...) {
    o.status = MpParse::overflow;
    return o;
  }
  if (v.too_deep)
    o.status = MpParse::too_deep;
  else if (v.invalid)
    o.status = MpParse::invalid;
  else if (!parsed || v.truncated)
    o.status = MpParse::truncated;
  o.used = off;
  o.tape = std::move(v.tape);
  return o;
}

// Compares one input; `tape` is reused, as the decoder reuses its own.
void check(promptcache::detail::MpTape& tape, const Bytes& b, std::uint32_t max_depth) {
  if (b.empty()) return;  // the decoder refuses empty payloads before parsing
  const Outcome want = reference(b, max_depth);
  std::size_t used = 0;
  const MpParse got = tape.parse(b.data(), b.size(), max_depth, used);
  INFO("bytes " << b.size() << " depth " << max_depth);
  REQUIRE(static_cast<int>(got) == static_cast<int>(want.status));
  if (got != MpParse::ok) return;
  REQUIRE(used == want.used);
  REQUIRE(tape.size() == want.tape.size());
  for (std::uint32_t i = 0; i < want.tape.size(); ++i) {
    const MpNode& x = tape[i];
    const MpNode& y = want.tape[i];
    INFO("node " << i);
    REQUIRE(static_cast<int>(x.kind) == static_cast<int>(y.kind));
    REQUIRE(x.size == y.size);
    REQUIRE(x.end == y.end);
    // An empty string's offset is never read (msgpack-cxx passes whatever
    // pointer it holds).
    const bool bytes = x.kind == MpKind::str || x.kind == MpKind::bin || x.kind == MpKind::ext;
    if (!bytes || x.size != 0U) REQUIRE(x.bits == y.bits);
  }
}

// Paths are built by append: g++ 12 at -O2 reports a false -Warray-bounds on
// operator+(std::string&&, const char*) once these calls are inlined.
Bytes fixture(std::string_view stem, std::string_view ext) {
  std::string path(PROMPTCACHE_KV_WIRE_FIXTURES);
  path.append("/").append(stem).append(ext);
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return Bytes(chars.begin(), chars.end());
}

// A random value of any format, with the lengths at the format edges.
class Generator {
 public:
  explicit Generator(std::uint32_t seed) : rng_(seed) {}

  void value(Bytes& out, int depth) {
    const auto pick = uniform(0, depth > 5 ? 15 : 19);
    switch (pick) {
      case 0:
        out.push_back(static_cast<unsigned char>(uniform(0, 0x7f)));
        break;
      case 1:
        out.push_back(static_cast<unsigned char>(uniform(0xe0, 0xff)));
        break;
      case 2:
        out.push_back(static_cast<unsigned char>(uniform(0xc0, 0xc3)));  // 0xc1 included
        break;
      case 3:    // uint 8/16/32/64
      case 4: {  // int 8/16/32/64, either sign
        const unsigned w = 1U << uniform(0, 3);
        out.push_back(static_cast<unsigned char>((pick == 3 ? 0xccU : 0xd0U) + (w == 1   ? 0U
                                                                                : w == 2 ? 1U
                                                                                : w == 4 ? 2U
                                                                                         : 3U)));
        raw(out, w);
        break;
      }
      case 5:
        out.push_back(0xca);
        raw(out, 4);
        break;
      case 6:
        out.push_back(0xcb);
        raw(out, 8);
        break;
      case 7:
      case 8:
      case 9: {  // str / bin: fix, 8, 16, 32 headers, zero length included
        const std::size_t len = length();
        const unsigned form = static_cast<unsigned>(uniform(0, 3));
        const bool str = pick != 9;
        if (str && form == 0 && len < 32) {
          out.push_back(static_cast<unsigned char>(0xa0U + len));
        } else {
          const unsigned w = form == 0 ? 1U : 1U << (form - 1U);
          out.push_back(static_cast<unsigned char>((str ? 0xd9U : 0xc4U) + (w == 1   ? 0U
                                                                            : w == 2 ? 1U
                                                                                     : 2U)));
          be(out, len, w);
        }
        for (std::size_t i = 0; i < len; ++i)
          out.push_back(static_cast<unsigned char>(uniform(0, 255)));
        break;
      }
      case 10: {  // fixext 1/2/4/8/16
        const unsigned k = static_cast<unsigned>(uniform(0, 4));
        out.push_back(static_cast<unsigned char>(0xd4U + k));
        raw(out, 1U + (1U << k));
        break;
      }
      case 11: {  // ext 8/16/32
        const unsigned k = static_cast<unsigned>(uniform(0, 2));
        const std::size_t len = length();
        out.push_back(static_cast<unsigned char>(0xc7U + k));
        be(out, len, 1U << k);
        raw(out, static_cast<unsigned>(1U + len));
        break;
      }
      case 12: {  // ext 32 declaring 2^32 - 1 bytes
        out.push_back(0xc9);
        be(out, 0xffffffffU, 4);
        raw(out, static_cast<unsigned>(uniform(0, 3)));
        break;
      }
      case 13:
      case 14:
      case 15: {  // a declared length past the end, or random bytes
        raw(out, static_cast<unsigned>(uniform(1, 6)));
        break;
      }
      default: {  // array or map, fix / 16 / 32 headers
        const bool map = pick >= 18;
        const std::size_t n = static_cast<std::size_t>(uniform(0, 5)) == 0
                                  ? static_cast<std::size_t>(uniform(0, 40))
                                  : static_cast<std::size_t>(uniform(0, 4));
        const unsigned form = static_cast<unsigned>(uniform(0, 2));
        if (form == 0 && n < 16) {
          out.push_back(static_cast<unsigned char>((map ? 0x80U : 0x90U) + n));
        } else {
          const unsigned w = form == 2 ? 4U : 2U;
          out.push_back(static_cast<unsigned char>((map ? 0xdeU : 0xdcU) + (w == 4 ? 1U : 0U)));
          be(out, n, w);
        }
        for (std::size_t i = 0; i < (map ? 2U * n : n); ++i)
          value(out, depth + 1);
        break;
      }
    }
  }

  std::uint64_t uniform(std::uint64_t lo, std::uint64_t hi) {
    return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng_);
  }

 private:
  std::size_t length() {
    switch (uniform(0, 4)) {
      case 0:
        return 0;
      case 1:
        return static_cast<std::size_t>(uniform(1, 31));
      case 2:
        return static_cast<std::size_t>(uniform(250, 260));
      default:
        return static_cast<std::size_t>(uniform(0, 8));
    }
  }
  void raw(Bytes& out, unsigned n) {
    for (unsigned i = 0; i < n; ++i)
      out.push_back(static_cast<unsigned char>(uniform(0, 255)));
  }
  static void be(Bytes& out, std::uint64_t v, unsigned w) {
    for (unsigned i = w; i-- > 0;)
      out.push_back(static_cast<unsigned char>(v >> (8U * i)));
  }

  std::mt19937_64 rng_;
};

}  // namespace

TEST_CASE("the wire parser matches msgpack-cxx on the fixtures, mutated and cut",
          "[kv_event_wire]") {
  promptcache::detail::MpTape tape;
  std::mt19937_64 rng(20261204);
  for (const char* n :
       {"sglang_array_v0", "sglang_array_dp", "vllm_array_events", "vllm_array_map_events",
        "vllm_map_batch", "vllm_map_batch_eagle", "incomplete_tokens", "empty_events"}) {
    const Bytes seed = fixture(n, ".msgpack");
    for (const std::uint32_t depth : {16U, 3U, 1U, 0U})
      check(tape, seed, depth);
    for (std::size_t len = 0; len <= seed.size(); ++len)
      check(tape, Bytes(seed.begin(), seed.begin() + static_cast<std::ptrdiff_t>(len)), 16);
    for (int m = 0; m < 400; ++m) {
      Bytes b = seed;
      const int edits = 1 + static_cast<int>(rng() % 4U);
      for (int e = 0; e < edits && !b.empty(); ++e) {
        const std::size_t at = static_cast<std::size_t>(rng() % b.size());
        switch (rng() % 4U) {
          case 0:
            b[at] = static_cast<unsigned char>(rng());
            break;
          case 1:
            b[at] ^= static_cast<unsigned char>(1U << (rng() % 8U));
            break;
          case 2:
            b.insert(b.begin() + static_cast<std::ptrdiff_t>(at),
                     static_cast<unsigned char>(rng()));
            break;
          default:
            b.erase(b.begin() + static_cast<std::ptrdiff_t>(at));
            break;
        }
      }
      check(tape, b, 16);
      check(tape, b, 4);
    }
  }
}

TEST_CASE("the wire parser matches msgpack-cxx on values of every format and random bytes",
          "[kv_event_wire]") {
  promptcache::detail::MpTape tape;
  Generator gen(7);
  for (int i = 0; i < 3000; ++i) {
    Bytes b;
    const int values = 1 + static_cast<int>(gen.uniform(0, 2));  // more than one: trailing bytes
    for (int v = 0; v < values; ++v)
      gen.value(b, 0);
    for (const std::uint32_t depth : {16U, 2U, 0U})
      check(tape, b, depth);
    if (b.size() > 1) {  // and a cut inside it
      const std::size_t cut = static_cast<std::size_t>(gen.uniform(1, b.size() - 1));
      check(tape, Bytes(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(cut)), 16);
    }
  }
  for (int i = 0; i < 3000; ++i) {
    Bytes b(static_cast<std::size_t>(gen.uniform(1, 24)));
    for (auto& c : b)
      c = static_cast<unsigned char>(gen.uniform(0, 255));
    check(tape, b, 16);
  }
}

TEST_CASE("the wire parser handles each type byte alone and at its format's edges",
          "[kv_event_wire]") {
  promptcache::detail::MpTape tape;
  for (unsigned t = 0; t < 256; ++t) {
    check(tape, Bytes{static_cast<unsigned char>(t)}, 16);
    for (unsigned pad = 1; pad <= 20; ++pad) {
      for (const unsigned fill : {0x00U, 0x01U, 0xffU}) {
        Bytes b(pad + 1U, static_cast<unsigned char>(fill));
        b[0] = static_cast<unsigned char>(t);
        check(tape, b, 16);
      }
    }
  }
  // Deep nesting: exactly max_depth levels parse, one more is too deep.
  for (const std::uint32_t depth : {1U, 6U, 16U}) {
    Bytes b(depth, 0x91);
    b.push_back(0x01);
    check(tape, b, depth);
    check(tape, b, depth - 1U);
    Bytes empty(depth - 1U, 0x91);
    empty.push_back(0x90);
    check(tape, empty, depth - 1U);
    check(tape, empty, depth);
  }
}

TEST_CASE("the wire parser matches msgpack-cxx on long runs of unsigned integers, cut anywhere",
          "[kv_event_wire]") {
  // Token id lists: arrays of unsigned integers of every width, now and then
  // another value, nested in an event array; every cut of a few of them.
  promptcache::detail::MpTape tape;
  Generator gen(11);
  for (int i = 0; i < 200; ++i) {
    Bytes b{0x92, 0x01};
    const auto n = static_cast<std::size_t>(gen.uniform(0, 300));
    b.push_back(0xdc);
    b.push_back(static_cast<unsigned char>(n >> 8U));
    b.push_back(static_cast<unsigned char>(n));
    for (std::size_t k = 0; k < n; ++k) {
      switch (gen.uniform(0, 12)) {
        case 0:
          b.push_back(0xcc);
          b.push_back(static_cast<unsigned char>(gen.uniform(0, 255)));
          break;
        case 1:
          b.push_back(0xcf);
          for (int j = 0; j < 8; ++j)
            b.push_back(static_cast<unsigned char>(gen.uniform(0, 255)));
          break;
        case 2:
          gen.value(b, 4);
          break;
        case 3:
        case 4:
          b.push_back(static_cast<unsigned char>(gen.uniform(0, 0x7f)));
          break;
        case 5:
        case 6:
          b.push_back(0xcd);
          b.push_back(static_cast<unsigned char>(gen.uniform(0, 255)));
          b.push_back(static_cast<unsigned char>(gen.uniform(0, 255)));
          break;
        default:
          b.push_back(0xce);
          for (int j = 0; j < 4; ++j)
            b.push_back(static_cast<unsigned char>(gen.uniform(0, 255)));
          break;
      }
    }
    check(tape, b, 16);
    check(tape, b, 1);
    for (int c = 0; c < 12 && b.size() > 1; ++c) {
      const std::size_t cut = c < 10 ? b.size() - 1 -
                                           static_cast<std::size_t>(gen.uniform(
                                               0, std::min<std::size_t>(b.size() - 1, 20)))
                                     : static_cast<std::size_t>(gen.uniform(1, b.size() - 1));
      check(tape, Bytes(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(cut)), 16);
    }
  }
}
