// promptcache: detail/dynamo_tape.hpp
// SPDX-License-Identifier: Apache-2.0
//
// The flat value tape that dynamo_kv_event.hpp decodes from, filled either by
// msgpack-cxx's parser (msgpack) or by the strict JSON reader below, and the
// writers of both formats. One schema walker then reads both encodings.
//
// The JSON reader accepts RFC 8259 JSON (one value, optional surrounding
// whitespace) and nothing else: no comments, no trailing commas, no NaN, no
// leading zeros, no unescaped control characters, no invalid UTF-8, no lone
// surrogates. Integers stay exact 64-bit values (never through a double):
// a non-negative integer literal that fits 64 bits is `uint`, a negative one
// that fits is `sint`, an integer literal outside [-2^63, 2^64) is `big`, and
// any literal with a fraction or exponent is `real` (its value is not kept).
#pragma once
#ifndef PROMPTCACHE_DETAIL_DYNAMO_TAPE_HPP
#define PROMPTCACHE_DETAIL_DYNAMO_TAPE_HPP

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#ifndef MSGPACK_NO_BOOST
#define MSGPACK_NO_BOOST
#endif
#include <msgpack.hpp>

namespace promptcache::detail {

enum class DynKind : std::uint8_t {
  nil,
  boolean,
  uint,
  sint,
  big,
  real,
  str,
  bin,
  ext,
  array,
  map
};

// One value in pre-order; a container's children follow it and `end` is the
// index past its last descendant, so any value is skipped in O(1).
struct DynNode {
  std::uint64_t bits = 0;  // uint / sint value (two's complement); str/bin: offset in the text
  std::uint32_t size = 0;  // array: elements; map: pairs; str/bin/ext: bytes
  std::uint32_t end = 0;
  DynKind kind = DynKind::nil;
};

enum class DynParse : std::uint8_t { ok, truncated, invalid, trailing, too_deep };

// Appends nodes; shared by both readers. Every node takes at least one input
// byte, so the tape never has more nodes than the payload has bytes.
class DynTapeWriter {
 public:
  DynTapeWriter(std::vector<DynNode>& tape, std::vector<std::uint32_t>& open,
                std::uint32_t max_depth) noexcept
      : tape_(tape), open_(open), max_depth_(max_depth) {}

  void leaf(DynKind kind, std::uint64_t bits, std::uint32_t size) {
    DynNode n;
    n.bits = bits;
    n.size = size;
    n.kind = kind;
    n.end = static_cast<std::uint32_t>(tape_.size() + 1U);
    tape_.push_back(n);
    count_child();
  }
  bool open(DynKind kind) {
    if (open_.size() >= max_depth_) return false;
    count_child();
    open_.push_back(static_cast<std::uint32_t>(tape_.size()));
    DynNode n;
    n.kind = kind;
    tape_.push_back(n);
    return true;
  }
  void close() {
    DynNode& n = tape_[open_.back()];
    n.end = static_cast<std::uint32_t>(tape_.size());
    if (n.kind == DynKind::map) n.size /= 2U;  // children counted keys and values
    open_.pop_back();
  }
  [[nodiscard]] std::size_t depth() const noexcept { return open_.size(); }

 private:
  void count_child() noexcept {
    if (!open_.empty()) ++tape_[open_.back()].size;
  }
  std::vector<DynNode>& tape_;
  std::vector<std::uint32_t>& open_;
  std::uint32_t max_depth_;
};

// msgpack-cxx parse visitor writing the tape (container sizes are counted as
// children arrive, so a declared length is never trusted before its bytes).
class DynMsgpackVisitor : public msgpack::null_visitor {
 public:
  DynMsgpackVisitor(DynTapeWriter& w, const char* base) noexcept : w_(w), base_(base) {}

  bool visit_nil() { return leaf(DynKind::nil, 0, 0); }
  bool visit_boolean(bool v) { return leaf(DynKind::boolean, v ? 1U : 0U, 0); }
  bool visit_positive_integer(std::uint64_t v) { return leaf(DynKind::uint, v, 0); }
  // The signed formats report every value here; a non-negative one is the
  // same number as its unsigned encoding (serde reads both as the integer).
  bool visit_negative_integer(std::int64_t v) {
    return leaf(v < 0 ? DynKind::sint : DynKind::uint, static_cast<std::uint64_t>(v), 0);
  }
  bool visit_float32(float) { return leaf(DynKind::real, 0, 0); }
  bool visit_float64(double) { return leaf(DynKind::real, 0, 0); }
  bool visit_str(const char* v, std::uint32_t size) { return leaf(DynKind::str, off(v), size); }
  bool visit_bin(const char* v, std::uint32_t size) { return leaf(DynKind::bin, off(v), size); }
  bool visit_ext(const char* v, std::uint32_t size) { return leaf(DynKind::ext, off(v), size); }
  bool start_array(std::uint32_t) { return open(DynKind::array); }
  bool end_array() {
    w_.close();
    return true;
  }
  bool start_map(std::uint32_t) { return open(DynKind::map); }
  bool end_map() {
    w_.close();
    return true;
  }
  void parse_error(std::size_t, std::size_t) { invalid = true; }
  void insufficient_bytes(std::size_t, std::size_t) { truncated = true; }

  bool invalid = false;
  bool truncated = false;
  bool too_deep = false;

 private:
  std::uint64_t off(const char* p) const noexcept {
    return p == nullptr ? 0U : static_cast<std::uint64_t>(p - base_);
  }
  bool leaf(DynKind k, std::uint64_t bits, std::uint32_t size) {
    w_.leaf(k, bits, size);
    return true;
  }
  bool open(DynKind k) {
    if (w_.open(k)) return true;
    too_deep = true;
    return false;
  }
  DynTapeWriter& w_;
  const char* base_;
};

// Parses one msgpack value covering all of `data`.
inline DynParse dyn_parse_msgpack(const char* data, std::size_t size, std::uint32_t max_depth,
                                  std::vector<DynNode>& tape, std::vector<std::uint32_t>& open) {
  tape.clear();
  open.clear();
  DynTapeWriter w(tape, open, max_depth);
  DynMsgpackVisitor v(w, data);
  std::size_t off = 0;
  bool parsed = false;
  try {
    parsed = msgpack::parse(data, size, off, v);
  } catch (const std::bad_alloc&) {
    throw;
  } catch (...) {  // msgpack-cxx's own size checks
    return DynParse::invalid;
  }
  if (v.too_deep) return DynParse::too_deep;
  if (v.invalid) return DynParse::invalid;
  if (!parsed || v.truncated) return DynParse::truncated;
  if (off != size) return DynParse::trailing;
  return DynParse::ok;
}

// The strict JSON reader. Strings are unescaped into `text` (str nodes index it).
class DynJsonReader {
 public:
  DynJsonReader(const char* data, std::size_t size, DynTapeWriter& w, std::string& text) noexcept
      : p_(data), end_(data + size), w_(w), text_(text) {}

  DynParse parse() {
    text_.clear();
    ws();
    if (p_ == end_) return DynParse::truncated;
    if (DynParse r = value(); r != DynParse::ok) return r;
    ws();
    return p_ == end_ ? DynParse::ok : DynParse::trailing;
  }

 private:
  void ws() noexcept {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r'))
      ++p_;
  }
  DynParse literal(std::string_view word) noexcept {
    const auto left = static_cast<std::size_t>(end_ - p_);
    const std::size_t n = left < word.size() ? left : word.size();
    if (std::memcmp(p_, word.data(), n) != 0) return DynParse::invalid;
    if (n < word.size()) return DynParse::truncated;
    p_ += word.size();
    return DynParse::ok;
  }
  DynParse value() {
    if (p_ == end_) return DynParse::truncated;
    switch (*p_) {
      case '{':
        return object();
      case '[':
        return array();
      case '"': {
        std::uint64_t at = 0;
        std::uint32_t len = 0;
        if (DynParse r = string(at, len); r != DynParse::ok) return r;
        w_.leaf(DynKind::str, at, len);
        return DynParse::ok;
      }
      case 't':
        if (DynParse r = literal("true"); r != DynParse::ok) return r;
        w_.leaf(DynKind::boolean, 1, 0);
        return DynParse::ok;
      case 'f':
        if (DynParse r = literal("false"); r != DynParse::ok) return r;
        w_.leaf(DynKind::boolean, 0, 0);
        return DynParse::ok;
      case 'n':
        if (DynParse r = literal("null"); r != DynParse::ok) return r;
        w_.leaf(DynKind::nil, 0, 0);
        return DynParse::ok;
      default:
        return number();
    }
  }
  DynParse object() {
    if (!w_.open(DynKind::map)) return DynParse::too_deep;
    ++p_;
    ws();
    if (p_ == end_) return DynParse::truncated;
    if (*p_ == '}') {
      ++p_;
      w_.close();
      return DynParse::ok;
    }
    for (;;) {
      if (p_ == end_) return DynParse::truncated;
      if (*p_ != '"') return DynParse::invalid;
      std::uint64_t at = 0;
      std::uint32_t len = 0;
      if (DynParse r = string(at, len); r != DynParse::ok) return r;
      w_.leaf(DynKind::str, at, len);
      ws();
      if (p_ == end_) return DynParse::truncated;
      if (*p_ != ':') return DynParse::invalid;
      ++p_;
      ws();
      if (DynParse r = value(); r != DynParse::ok) return r;
      ws();
      if (p_ == end_) return DynParse::truncated;
      if (*p_ == ',') {
        ++p_;
        ws();
        continue;
      }
      if (*p_ != '}') return DynParse::invalid;
      ++p_;
      w_.close();
      return DynParse::ok;
    }
  }
  DynParse array() {
    if (!w_.open(DynKind::array)) return DynParse::too_deep;
    ++p_;
    ws();
    if (p_ == end_) return DynParse::truncated;
    if (*p_ == ']') {
      ++p_;
      w_.close();
      return DynParse::ok;
    }
    for (;;) {
      if (DynParse r = value(); r != DynParse::ok) return r;
      ws();
      if (p_ == end_) return DynParse::truncated;
      if (*p_ == ',') {
        ++p_;
        ws();
        continue;
      }
      if (*p_ != ']') return DynParse::invalid;
      ++p_;
      w_.close();
      return DynParse::ok;
    }
  }
  static bool digit(char c) noexcept { return c >= '0' && c <= '9'; }
  DynParse number() {
    const bool neg = *p_ == '-';
    if (neg) ++p_;
    if (p_ == end_) return DynParse::truncated;
    if (!digit(*p_)) return DynParse::invalid;
    // Magnitude, exact while it fits 64 bits.
    std::uint64_t mag = 0;
    bool big = false;
    if (*p_ == '0') {
      ++p_;
      if (p_ != end_ && digit(*p_)) return DynParse::invalid;  // leading zero
    } else {
      while (p_ != end_ && digit(*p_)) {
        const auto d = static_cast<std::uint64_t>(*p_ - '0');
        if (mag > (std::numeric_limits<std::uint64_t>::max() - d) / 10U) big = true;
        if (!big) mag = mag * 10U + d;
        ++p_;
      }
    }
    bool real = false;
    if (p_ != end_ && *p_ == '.') {
      real = true;
      ++p_;
      if (p_ == end_) return DynParse::truncated;
      if (!digit(*p_)) return DynParse::invalid;
      while (p_ != end_ && digit(*p_))
        ++p_;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      real = true;
      ++p_;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (p_ == end_) return DynParse::truncated;
      if (!digit(*p_)) return DynParse::invalid;
      while (p_ != end_ && digit(*p_))
        ++p_;
    }
    if (real) {
      w_.leaf(DynKind::real, 0, 0);
    } else if (!neg) {
      w_.leaf(big ? DynKind::big : DynKind::uint, mag, 0);
    } else if (!big && mag <= (std::uint64_t{1} << 63)) {
      w_.leaf(mag == 0 ? DynKind::uint : DynKind::sint, ~mag + 1U, 0);  // -0 is 0
    } else {
      w_.leaf(DynKind::big, 0, 0);
    }
    return DynParse::ok;
  }
  static int hex(char c) noexcept {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  DynParse hex4(std::uint32_t& out) noexcept {
    out = 0;
    for (int i = 0; i < 4; ++i) {
      if (p_ == end_) return DynParse::truncated;
      const int h = hex(*p_++);
      if (h < 0) return DynParse::invalid;
      out = out * 16U + static_cast<std::uint32_t>(h);
    }
    return DynParse::ok;
  }
  void put_utf8(std::uint32_t cp) {
    if (cp < 0x80U) {
      text_.push_back(static_cast<char>(cp));
    } else if (cp < 0x800U) {
      text_.push_back(static_cast<char>(0xC0U | (cp >> 6)));
      text_.push_back(static_cast<char>(0x80U | (cp & 0x3FU)));
    } else if (cp < 0x10000U) {
      text_.push_back(static_cast<char>(0xE0U | (cp >> 12)));
      text_.push_back(static_cast<char>(0x80U | ((cp >> 6) & 0x3FU)));
      text_.push_back(static_cast<char>(0x80U | (cp & 0x3FU)));
    } else {
      text_.push_back(static_cast<char>(0xF0U | (cp >> 18)));
      text_.push_back(static_cast<char>(0x80U | ((cp >> 12) & 0x3FU)));
      text_.push_back(static_cast<char>(0x80U | ((cp >> 6) & 0x3FU)));
      text_.push_back(static_cast<char>(0x80U | (cp & 0x3FU)));
    }
  }
  // One UTF-8 sequence starting at p_ (a lead byte >= 0x80), copied if valid.
  DynParse utf8() {
    const auto b0 = static_cast<unsigned char>(*p_);
    int n = 0;
    std::uint32_t cp = 0;
    std::uint32_t min = 0;
    if (b0 >= 0xC2U && b0 <= 0xDFU) {
      n = 1, cp = b0 & 0x1FU, min = 0x80U;
    } else if (b0 >= 0xE0U && b0 <= 0xEFU) {
      n = 2, cp = b0 & 0x0FU, min = 0x800U;
    } else if (b0 >= 0xF0U && b0 <= 0xF4U) {
      n = 3, cp = b0 & 0x07U, min = 0x10000U;
    } else {
      return DynParse::invalid;
    }
    const char* q = p_ + 1;
    for (int i = 0; i < n; ++i, ++q) {
      if (q == end_) return DynParse::truncated;
      const auto b = static_cast<unsigned char>(*q);
      if ((b & 0xC0U) != 0x80U) return DynParse::invalid;
      cp = (cp << 6) | (b & 0x3FU);
    }
    if (cp < min || cp > 0x10FFFFU || (cp >= 0xD800U && cp <= 0xDFFFU)) return DynParse::invalid;
    text_.append(p_, q);
    p_ = q;
    return DynParse::ok;
  }
  DynParse string(std::uint64_t& at, std::uint32_t& len) {
    ++p_;  // the opening quote
    at = text_.size();
    for (;;) {
      if (p_ == end_) return DynParse::truncated;
      const char c = *p_;
      if (c == '"') {
        ++p_;
        break;
      }
      if (static_cast<unsigned char>(c) < 0x20U) return DynParse::invalid;
      if (static_cast<unsigned char>(c) >= 0x80U) {
        if (DynParse r = utf8(); r != DynParse::ok) return r;
        continue;
      }
      if (c != '\\') {
        text_.push_back(c);
        ++p_;
        continue;
      }
      ++p_;
      if (p_ == end_) return DynParse::truncated;
      const char e = *p_++;
      switch (e) {
        case '"':
        case '\\':
        case '/':
          text_.push_back(e);
          break;
        case 'b':
          text_.push_back('\b');
          break;
        case 'f':
          text_.push_back('\f');
          break;
        case 'n':
          text_.push_back('\n');
          break;
        case 'r':
          text_.push_back('\r');
          break;
        case 't':
          text_.push_back('\t');
          break;
        case 'u': {
          std::uint32_t cp = 0;
          if (DynParse r = hex4(cp); r != DynParse::ok) return r;
          if (cp >= 0xDC00U && cp <= 0xDFFFU) return DynParse::invalid;  // lone low surrogate
          if (cp >= 0xD800U && cp <= 0xDBFFU) {
            if (p_ == end_ || (p_ + 1 == end_ && *p_ == '\\')) return DynParse::truncated;
            if (*p_ != '\\' || p_[1] != 'u') return DynParse::invalid;
            p_ += 2;
            std::uint32_t lo = 0;
            if (DynParse r = hex4(lo); r != DynParse::ok) return r;
            if (lo < 0xDC00U || lo > 0xDFFFU) return DynParse::invalid;
            cp = 0x10000U + ((cp - 0xD800U) << 10) + (lo - 0xDC00U);
          }
          put_utf8(cp);
          break;
        }
        default:
          return DynParse::invalid;
      }
    }
    if (text_.size() - at > std::numeric_limits<std::uint32_t>::max()) return DynParse::invalid;
    len = static_cast<std::uint32_t>(text_.size() - at);
    return DynParse::ok;
  }

  const char* p_;
  const char* end_;
  DynTapeWriter& w_;
  std::string& text_;
};

// Parses one JSON text covering all of `data`.
inline DynParse dyn_parse_json(const char* data, std::size_t size, std::uint32_t max_depth,
                               std::vector<DynNode>& tape, std::vector<std::uint32_t>& open,
                               std::string& text) {
  tape.clear();
  open.clear();
  DynTapeWriter w(tape, open, max_depth);
  DynJsonReader r(data, size, w, text);
  return r.parse();
}

// --- writers ----------------------------------------------------------------

// The JSON writer: compact, as serde_json::to_vec writes (no spaces).
class DynJsonWriter {
 public:
  explicit DynJsonWriter(std::vector<std::byte>& out) noexcept : out_(out) {}
  void raw(std::string_view s) {
    for (const char c : s)
      out_.push_back(static_cast<std::byte>(c));
  }
  void key(std::string_view k) {  // keys here are plain ASCII identifiers
    raw("\"");
    raw(k);
    raw("\":");
  }
  void str(std::string_view s) {
    raw("\"");
    raw(s);
    raw("\"");
  }
  void u64(std::uint64_t v) {
    char buf[20];
    int n = 0;
    do {
      buf[n++] = static_cast<char>('0' + static_cast<int>(v % 10U));
      v /= 10U;
    } while (v != 0U);
    while (n > 0)
      out_.push_back(static_cast<std::byte>(buf[--n]));
  }

 private:
  std::vector<std::byte>& out_;
};

// A msgpack-cxx buffer appending to a byte vector.
class DynByteBuffer {
 public:
  explicit DynByteBuffer(std::vector<std::byte>& out) noexcept : out_(out) {}
  void write(const char* data, std::size_t size) {
    const auto* b = reinterpret_cast<const std::byte*>(data);
    out_.insert(out_.end(), b, b + size);
  }

 private:
  std::vector<std::byte>& out_;
};

}  // namespace promptcache::detail

#endif  // PROMPTCACHE_DETAIL_DYNAMO_TAPE_HPP
