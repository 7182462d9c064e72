// Fuzz harness for the KV event wire decoder (kv_event_wire.hpp). The first byte
// picks one of two modes.
//
// Raw bytes: the rest of the input is cut into payloads that are decoded as they
// are, under options from the input (router block size, device_only, payload and
// depth limits). A decode must never crash, leak or read past the payload (each
// payload sits in its own exactly sized buffer); an error must leave an empty
// batch; an accepted batch must be consistent; the limits must hold; and a reused
// decoder must answer what a fresh one answers.
//
// Structured: the input describes a batch of events (stored with int, signed and
// byte-string hashes, parents, plain and Eagle token lists, LoRA names, cache salts
// (an event's, SGLang's metadata map, or among the first block's keys), media keys,
// mediums, attention groups; removed; cleared; unknown tags; extreme timestamps and
// ranks). The harness computes the batch the documented rules give, encodes the
// events with msgpack-cxx in every layout the publishers use (array batch with
// array events as SGLang and older vLLM send, array batch with map events, map
// batch with map events; shortest or fixed-width integers, unsigned or in a
// signed format that holds the value, omitted or nil defaults, keys in any order,
// unknown keys and trailing elements), decodes each and compares. The batches of
// one input are also one publisher's stream: each is decoded with the stream's
// KvWireStreamState too, against a model of the group kinds it learns (a plain
// map, capped as documented), and a payload that is rejected must leave the
// state as it was. Then every strict prefix of one encoding must be rejected as
// truncated (empty at length 0) with an empty batch, a byte appended must be
// rejected as trailing bytes, and the depth and size limits must cut exactly at
// the encoding's depth and size.
//
// One operation is one decode. The count of truncated prefixes decoded is printed
// separately at exit.
#include <fuzzer/FuzzedDataProvider.h>
#include <promptcache/kv_event_wire.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "fuzz_support.hpp"

namespace {

using promptcache::KvBlock;
using promptcache::KvEventData;
using promptcache::KvEventWireDecoder;
using promptcache::KvWireBatch;
using promptcache::KvWireErrc;
using promptcache::KvWireOptions;
using promptcache::KvWireStatus;
using promptcache::KvWireStreamState;
namespace kv_event = promptcache::kv_event;
using Bytes = std::vector<std::byte>;
using Packer = msgpack::packer<msgpack::sbuffer>;

constexpr std::uint32_t u32max = std::numeric_limits<std::uint32_t>::max();
constexpr std::uint64_t u64max = std::numeric_limits<std::uint64_t>::max();

fuzz::OperationReport report{"fuzz_kv_event_wire"};

std::uint64_t& truncations() {
  static std::uint64_t n = 0;
  return n;
}

struct TruncationReport {
  ~TruncationReport() {
    std::fprintf(stderr, "fuzz_kv_event_wire: %llu of the operations decoded a truncated payload\n",
                 static_cast<unsigned long long>(truncations()));
  }
} truncation_report;

// ---- checks shared by both modes -----------------------------------------------------------

bool same_batch(const KvWireBatch& a, const KvWireBatch& b) {
  return std::bit_cast<std::uint64_t>(a.ts) == std::bit_cast<std::uint64_t>(b.ts) &&
         a.dp_rank == b.dp_rank && a.events == b.events && a.unknown_events == b.unknown_events &&
         a.ignored_events == b.ignored_events && a.dropped_blocks == b.dropped_blocks &&
         a.blocks == b.blocks;
}

// Prints a batch, for the report of a divergence.
void print_batch(const char* what, const KvWireBatch& b) {
  std::fprintf(stderr, "%s: ts %016llx rank %lld unknown %zu ignored %zu dropped %zu blocks %zu\n",
               what, static_cast<unsigned long long>(std::bit_cast<std::uint64_t>(b.ts)),
               b.dp_rank ? static_cast<long long>(*b.dp_rank) : -1LL, b.unknown_events,
               b.ignored_events, b.dropped_blocks, b.blocks);
  for (const KvEventData& e : b.events) {
    if (const auto* s = std::get_if<kv_event::Stored>(&e)) {
      std::fprintf(stderr, "  stored parent %s%016llx:", s->parent_hash ? "" : "none ",
                   static_cast<unsigned long long>(s->parent_hash.value_or(0)));
      for (const KvBlock& k : s->blocks)
        std::fprintf(stderr, " %016llx/%016llx", static_cast<unsigned long long>(k.block_hash),
                     static_cast<unsigned long long>(k.tokens_hash));
    } else if (const auto* r = std::get_if<kv_event::Removed>(&e)) {
      std::fprintf(stderr, "  removed:");
      for (const std::uint64_t h : r->block_hashes)
        std::fprintf(stderr, " %016llx", static_cast<unsigned long long>(h));
    } else {
      std::fprintf(stderr, "  cleared");
    }
    std::fprintf(stderr, "\n");
  }
}

// Compares a decoded batch with the expected one; prints both when they differ.
bool matches(const KvWireBatch& got, const KvWireBatch& want) {
  if (same_batch(got, want)) return true;
  print_batch("decoded", got);
  print_batch("expected", want);
  return false;
}

// A rejected payload leaves an empty batch; an accepted one is consistent.
void check_shape(const KvWireStatus& st, const KvWireBatch& b) {
  if (!st.ok()) {
    FUZZ_CHECK(!st.detail.empty());
    FUZZ_CHECK(same_batch(b, KvWireBatch{}));
    return;
  }
  FUZZ_CHECK(st.detail.empty());
  std::size_t blocks = 0;
  for (const KvEventData& e : b.events) {
    if (const auto* s = std::get_if<kv_event::Stored>(&e)) {
      FUZZ_CHECK(!s->blocks.empty());
      blocks += s->blocks.size();
    } else if (const auto* r = std::get_if<kv_event::Removed>(&e)) {
      blocks += r->block_hashes.size();
    }
  }
  FUZZ_CHECK(blocks == b.blocks);
}

Bytes exact_copy(const void* data, std::size_t n) {
  Bytes out(n);
  if (n > 0) std::memcpy(out.data(), data, n);
  return out;
}

// ---- raw bytes -----------------------------------------------------------------------------

void raw_mode(FuzzedDataProvider& in) {
  KvWireOptions o;
  o.block_size = in.ConsumeBool() ? 0U : in.ConsumeIntegralInRange<std::uint32_t>(1, 20);
  o.device_only = in.ConsumeBool();
  if (in.ConsumeIntegralInRange<int>(0, 7) == 0)
    o.max_payload_bytes = in.ConsumeIntegralInRange<std::size_t>(0, 64);
  if (in.ConsumeIntegralInRange<int>(0, 7) == 0)
    o.max_depth = in.ConsumeIntegralInRange<std::uint32_t>(0, 8);
  KvEventWireDecoder decoder(o);
  KvWireBatch batch, fresh;
  while (in.remaining_bytes() > 0) {
    const std::size_t len = in.ConsumeIntegralInRange<std::size_t>(0, 1024);
    const Bytes payload = in.ConsumeBytes<std::byte>(len);
    ++fuzz::operations();
    const KvWireStatus st = decoder.decode(payload, batch);
    check_shape(st, batch);
    if (payload.empty()) FUZZ_CHECK(st.code == KvWireErrc::empty);
    if (payload.size() > o.max_payload_bytes) FUZZ_CHECK(st.code == KvWireErrc::too_large);
    // Scratch buffers carry nothing from one payload to the next.
    const KvWireStatus st2 = promptcache::decode_kv_event_batch(payload, fresh, o);
    FUZZ_CHECK(st.code == st2.code && st.event == st2.event && st.detail == st2.detail);
    FUZZ_CHECK(same_batch(batch, fresh));
  }
}

// ---- structured ----------------------------------------------------------------------------

// A block hash as sent, and the 64-bit name the decoder must give it.
struct WireHash {
  enum Kind : std::uint8_t { uint, fixed, sint, bin } kind = uint;
  std::uint64_t value = 0;
  std::vector<unsigned char> bytes;

  [[nodiscard]] std::uint64_t name() const {
    if (kind != bin) return value;
    std::uint64_t v = 0;  // the integer value of the bytes, modulo 2^64
    for (const unsigned char b : bytes)
      v = (v << 8) | b;
    return v;
  }
};

// A key of extra_keys: a string, or a [string, offset] pair.
struct MediaKey {
  std::string s;
  bool pair = false;
  std::optional<std::uint64_t> hash;  // what the key names, if a media hash
};

// An optional string field: absent, nil, or a value.
struct OptStr {
  enum State : std::uint8_t { absent, nil, value } state = absent;
  std::string s;
  [[nodiscard]] bool present() const { return state != absent; }
  [[nodiscard]] bool is_str() const { return state == value; }
};

struct OptUint {
  enum State : std::uint8_t { absent, nil, value } state = absent;
  std::uint64_t v = 0;
  [[nodiscard]] bool present() const { return state != absent; }
};

struct WireEvent {
  enum Type : std::uint8_t { stored, removed, cleared, unknown } type = stored;
  std::string tag;  // for unknown events
  std::vector<WireHash> hashes;
  std::optional<WireHash> parent;
  bool parent_present = true;         // map form: the key is written (nil when no parent)
  std::vector<std::uint32_t> tokens;  // with Eagle: the pair firsts, then the last second
  bool eagle = false;
  std::uint32_t block_size = 0;
  OptUint lora_id;
  OptStr medium;
  bool medium_int = false;  // a medium of the wrong type (ignored by the rules)
  OptStr lora_name;
  // Only with no LoRA name: the array layout carries it as SGLang's metadata
  // map in lora_name's position.
  OptStr cache_salt;
  bool has_extra = false;
  std::vector<std::optional<std::vector<MediaKey>>> extra;  // per block: nil or keys
  OptUint group_idx;
  OptStr spec_kind;
  std::size_t trailing = 0;  // unknown elements or keys after the known ones
};

struct WireBatch {
  enum TsKind : std::uint8_t { f64, f32, uint, sint } ts_kind = f64;
  std::uint64_t ts_bits = 0;
  OptUint rank;
  bool rank_short_key = false;  // "dp_rank" instead of "data_parallel_rank"
  std::vector<WireEvent> events;
  std::size_t trailing = 0;
};

class Generator {
 public:
  explicit Generator(FuzzedDataProvider& in) : in_(in) {}

  WireBatch batch() {
    WireBatch b;
    b.ts_kind = static_cast<WireBatch::TsKind>(in_.ConsumeIntegralInRange<int>(0, 3));
    switch (in_.ConsumeIntegralInRange<int>(0, 3)) {
      case 0:
        b.ts_bits = in_.ConsumeIntegral<std::uint64_t>();  // any bits: NaN, inf, denormals
        break;
      case 1:
        b.ts_bits = b.ts_kind == WireBatch::f64 || b.ts_kind == WireBatch::f32
                        ? std::bit_cast<std::uint64_t>(1.7e9 + in_.ConsumeIntegral<std::uint16_t>())
                        : 1700000000U;
        break;
      case 2:
        b.ts_bits = b.ts_kind == WireBatch::sint ? static_cast<std::uint64_t>(-1) : 0U;
        break;
      default:
        b.ts_bits = b.ts_kind == WireBatch::uint ? u64max : std::bit_cast<std::uint64_t>(-0.0);
        break;
    }
    if (b.ts_kind == WireBatch::sint) b.ts_bits |= std::uint64_t{1} << 63;  // a negative integer
    b.rank = opt_uint({0, 1, 7, u32max});
    b.rank_short_key = in_.ConsumeBool();
    for (std::size_t n = in_.ConsumeIntegralInRange<std::size_t>(0, 6); n > 0; --n)
      b.events.push_back(event());
    b.trailing = in_.ConsumeIntegralInRange<int>(0, 7) == 0 ? 1U + pick(2) : 0U;
    return b;
  }

 private:
  std::size_t pick(std::size_t n) { return in_.ConsumeIntegralInRange<std::size_t>(0, n - 1); }

  OptUint opt_uint(std::initializer_list<std::uint64_t> values) {
    OptUint o;
    o.state = static_cast<OptUint::State>(in_.ConsumeIntegralInRange<int>(0, 2));
    if (o.state == OptUint::value) o.v = values.begin()[pick(values.size())];
    return o;
  }

  OptStr opt_str(std::initializer_list<const char*> values) {
    OptStr o;
    o.state = static_cast<OptStr::State>(in_.ConsumeIntegralInRange<int>(0, 2));
    if (o.state == OptStr::value) o.s = values.begin()[pick(values.size())];
    return o;
  }

  WireHash hash() {
    WireHash h;
    h.kind = static_cast<WireHash::Kind>(in_.ConsumeIntegralInRange<int>(0, 3));
    switch (h.kind) {
      case WireHash::uint:
      case WireHash::fixed:
        h.value = in_.ConsumeBool() ? in_.ConsumeIntegral<std::uint64_t>()
                                    : in_.ConsumeIntegralInRange<std::uint64_t>(0, 300);
        break;
      case WireHash::sint:  // SGLang's Python hashes: negative values
        h.value = in_.ConsumeIntegral<std::uint64_t>() | (std::uint64_t{1} << 63);
        break;
      case WireHash::bin: {  // vLLM's sha256 / xxh128 hashes, or shorter
        static constexpr std::size_t sizes[] = {32, 16, 8, 1, 3, 9};
        h.bytes.resize(sizes[pick(6)]);
        for (unsigned char& c : h.bytes)
          c = in_.ConsumeIntegral<unsigned char>();
        break;
      }
    }
    return h;
  }

  std::uint32_t token() {
    switch (in_.ConsumeIntegralInRange<int>(0, 7)) {
      case 0:
        return u32max;
      case 1:
        return in_.ConsumeIntegral<std::uint32_t>();
      default:
        return in_.ConsumeIntegralInRange<std::uint32_t>(0, 200);
    }
  }

  MediaKey media_key() {
    MediaKey k;
    k.pair = in_.ConsumeBool();
    static constexpr char hex[] = "0123456789abcdefABCDEF";
    switch (in_.ConsumeIntegralInRange<int>(0, 4)) {
      case 0:
      case 1: {  // a 64-digit hexadecimal media identifier
        std::uint64_t v = 0;
        for (int i = 0; i < 64; ++i) {
          const std::size_t d = pick(22);
          k.s.push_back(hex[d]);
          if (i < 16) v = (v << 4) | (d < 16 ? d : d - 6);
        }
        k.hash = v;
        break;
      }
      case 2:  // 64 characters, not all hexadecimal
        k.s.assign(63, '0');
        k.s.insert(pick(64), 1, 'g');
        break;
      case 3:  // a salt key (maybe empty), or a LoRA name
        k.s = std::array<const char*, 5>{"dynamo-cache-salt:", "dynamo-cache-salt:t1",
                                         "dynamo-cache-salt:tenant-2", "lora-a",
                                         "dynamo-cache-salt:x"}[pick(5)];
        break;
      default:  // a shorter id, or another string
        k.s = std::string(pick(70), 'a');
        if (k.s.size() == 64) k.s.back() = 'z';
        break;
    }
    return k;
  }

  WireEvent event() {
    WireEvent e;
    e.type = static_cast<WireEvent::Type>(std::min(in_.ConsumeIntegralInRange<int>(0, 7), 3));
    e.trailing = in_.ConsumeIntegralInRange<int>(0, 7) == 0 ? 1U + pick(2) : 0U;
    e.medium = opt_str({"GPU", "CPU", "cpu", "DISK", ""});
    e.medium_int = e.medium.state == OptStr::nil && in_.ConsumeBool();
    e.group_idx = opt_uint({0, 0, 1, 5, 2, 255, 256, u64max});
    e.spec_kind = opt_str(
        {"full_attention", "mla_attention", "sink_full_attention", "sliding_window", "mamba"});
    switch (e.type) {
      case WireEvent::unknown:
        e.tag = in_.ConsumeBool() ? "BlockStoredV2" : "";
        return e;
      case WireEvent::cleared:
        return e;
      case WireEvent::removed:
        for (std::size_t n = pick(5); n > 0; --n)
          e.hashes.push_back(hash());
        return e;
      case WireEvent::stored:
        break;
    }
    const std::size_t blocks = pick(6);
    for (std::size_t n = blocks; n > 0; --n)
      e.hashes.push_back(hash());
    if (in_.ConsumeBool()) e.parent = hash();
    e.parent_present = e.parent.has_value() || in_.ConsumeBool();
    switch (in_.ConsumeIntegralInRange<int>(0, 15)) {
      case 0:
        e.block_size = u32max;  // never complete
        break;
      case 1:
        e.block_size = in_.ConsumeBool() ? 0U : 1U;  // 0: an offload tier's, skipped
        break;
      default:
        e.block_size = in_.ConsumeIntegralInRange<std::uint32_t>(1, 16);
        break;
    }
    // Mostly every block complete; sometimes fewer or more tokens.
    std::size_t n_tokens = e.block_size == u32max ? pick(4) : blocks * e.block_size;
    if (in_.ConsumeIntegralInRange<int>(0, 3) == 0)
      n_tokens = pick(n_tokens + (e.block_size == u32max ? 1U : e.block_size) + 1U);
    e.eagle = n_tokens > 0 && in_.ConsumeIntegralInRange<int>(0, 3) == 0;
    for (std::size_t i = n_tokens + (e.eagle ? 1U : 0U); i > 0; --i)
      e.tokens.push_back(token());
    e.lora_id = opt_uint({0, 3, u64max});
    e.lora_name = opt_str({"", "lora-a", "adapters/b", "GPU", "dynamo-cache-salt:x"});
    if (!e.lora_name.is_str()) e.cache_salt = opt_str({"", "t1", "tenant-2"});
    e.has_extra = in_.ConsumeBool();
    if (e.has_extra) {
      for (std::size_t b = pick(blocks + 2); b > 0; --b) {
        if (in_.ConsumeBool()) {
          e.extra.emplace_back(std::nullopt);
          continue;
        }
        std::vector<MediaKey> keys;
        for (std::size_t k = pick(4); k > 0; --k)
          keys.push_back(media_key());
        e.extra.emplace_back(std::move(keys));
      }
    }
    return e;
  }

  FuzzedDataProvider& in_;
};

// ---- the batch the rules give --------------------------------------------------------------

// Dynamo's salt among the first block's keys: the first plain string past
// "dynamo-cache-salt:" with something after it, one copy of the LoRA name
// skipped.
std::string_view extra_keys_salt(const WireEvent& e, const std::string& lora) {
  if (!e.has_extra || e.extra.empty() || !e.extra[0]) return {};
  constexpr std::string_view prefix = "dynamo-cache-salt:";
  bool lora_seen = lora.empty();
  for (const MediaKey& k : *e.extra[0]) {
    if (k.pair) continue;
    if (!lora_seen && k.s == lora) {
      lora_seen = true;
      continue;
    }
    if (k.s.size() > prefix.size() && k.s.compare(0, prefix.size(), prefix) == 0)
      return std::string_view(k.s).substr(prefix.size());
  }
  return {};
}

// The group kinds a stream state has learned, as the documentation states them:
// group -> main, recorded only below the cap, the last record holding.
using GroupModel = std::map<std::uint64_t, bool>;

// `groups` null: the stateless rule; otherwise the stream's model, updated.
bool skipped_by_rule(const WireEvent& e, const KvWireOptions& o, GroupModel* groups) {
  const bool has_group = e.group_idx.state == OptUint::value;
  bool other = false;
  // A removal names no kind (the array layout's element after group_idx is
  // vLLM's locality; the map layout sends none here).
  if (e.type != WireEvent::removed && e.spec_kind.is_str()) {
    const bool main = e.spec_kind.s == "full_attention" || e.spec_kind.s == "mla_attention" ||
                      e.spec_kind.s == "sink_full_attention";
    if (groups != nullptr && has_group && e.group_idx.v < KvWireStreamState::max_groups)
      (*groups)[e.group_idx.v] = main;
    other = !main;
  } else if (has_group) {
    const auto it = groups != nullptr ? groups->find(e.group_idx.v) : GroupModel::iterator();
    other = groups != nullptr && it != groups->end() ? !it->second : e.group_idx.v != 0;
  }
  if (o.device_only && e.medium.is_str() && e.medium.s != "GPU") return true;
  return other;
}

bool same_groups(const KvWireStreamState& s, const GroupModel& m) {
  if (s.known_groups() != m.size()) return false;
  for (const auto& [g, main] : m)
    if (s.is_main_group(g) != main) return false;
  return !s.is_main_group(KvWireStreamState::max_groups).has_value();
}

double ts_of(const WireBatch& b) {
  switch (b.ts_kind) {
    case WireBatch::f64:
      return std::bit_cast<double>(b.ts_bits);
    case WireBatch::f32:
      return static_cast<double>(static_cast<float>(std::bit_cast<double>(b.ts_bits)));
    case WireBatch::uint:
      return static_cast<double>(b.ts_bits);
    case WireBatch::sint:
      return static_cast<double>(static_cast<std::int64_t>(b.ts_bits));
  }
  return 0.0;
}

KvWireBatch expected(const WireBatch& wb, const KvWireOptions& o, GroupModel* groups = nullptr) {
  KvWireBatch out;
  out.ts = ts_of(wb);
  if (wb.rank.state == OptUint::value) out.dp_rank = static_cast<std::uint32_t>(wb.rank.v);
  for (const WireEvent& e : wb.events) {
    if (e.type == WireEvent::unknown) {
      ++out.unknown_events;
      continue;
    }
    if (e.type == WireEvent::cleared) {
      out.events.emplace_back(kv_event::Cleared{});
      continue;
    }
    if (skipped_by_rule(e, o, groups)) {
      ++out.ignored_events;
      continue;
    }
    if (e.type == WireEvent::removed) {
      kv_event::Removed r;
      for (const WireHash& h : e.hashes)
        r.block_hashes.push_back(h.name());
      out.blocks += r.block_hashes.size();
      out.events.emplace_back(std::move(r));
      continue;
    }
    std::size_t kept = 0;
    if ((o.block_size == 0 || e.block_size == o.block_size) && e.block_size != 0) {
      const std::size_t usable = e.tokens.size() - (e.eagle ? 1U : 0U);
      kept = std::min(e.hashes.size(), usable / e.block_size);
    }
    out.dropped_blocks += e.hashes.size() - kept;
    if (kept == 0) {
      ++out.ignored_events;
      continue;
    }
    std::vector<std::vector<std::uint64_t>> media(kept);
    for (std::size_t b = 0; b < kept && b < e.extra.size(); ++b)
      if (e.extra[b])
        for (const MediaKey& k : *e.extra[b])
          if (k.hash) media[b].push_back(*k.hash);
    std::vector<std::span<const std::uint64_t>> spans(media.begin(), media.end());
    promptcache::BlockHashOptions ho;
    const std::string lora = e.lora_name.is_str() ? e.lora_name.s : "";
    ho.seed = promptcache::block_hash_seed(
        lora, e.cache_salt.is_str() ? std::string_view(e.cache_salt.s) : extra_keys_salt(e, lora));
    ho.media = spans;
    ho.eagle = e.eagle;
    const std::span<const std::uint32_t> window(e.tokens.data(),
                                                kept * e.block_size + (e.eagle ? 1U : 0U));
    const std::vector<std::uint64_t> locals =
        promptcache::local_block_hashes(window, e.block_size, ho);
    kv_event::Stored s;
    if (e.parent) s.parent_hash = e.parent->name();
    for (std::size_t b = 0; b < kept; ++b)
      s.blocks.push_back(KvBlock{e.hashes[b].name(), locals[b]});
    out.blocks += kept;
    out.events.emplace_back(std::move(s));
  }
  return out;
}

// ---- encoding ------------------------------------------------------------------------------

enum class Layout { array_array, array_map, map_map };

class Encoder {
 public:
  Encoder(FuzzedDataProvider& in, msgpack::sbuffer& buf) : in_(in), buf_(buf), p_(buf) {}

  // Nesting depth of the value written (the root container counts 1).
  [[nodiscard]] std::uint32_t max_depth() const { return max_depth_; }

  void batch(const WireBatch& b, Layout layout) {
    if (layout == Layout::map_map) {
      // Keys in an order from the input; the rank under one of its two names.
      std::vector<int> keys{0, 1};
      if (b.rank.present()) keys.push_back(2);
      for (std::size_t t = 0; t < b.trailing; ++t)
        keys.push_back(3);
      shuffle(keys);
      open_map(keys.size());
      for (const int k : keys) {
        if (k == 0) {
          str("ts");
          ts(b);
        } else if (k == 1) {
          str("events");
          events(b, layout);
        } else if (k == 2) {
          str(b.rank_short_key ? "dp_rank" : "data_parallel_rank");
          opt_uint(b.rank);
        } else {
          str("unknown_key");
          p_.pack_true();
        }
      }
      close();
      return;
    }
    const bool rank = b.rank.present() || b.trailing > 0;
    open_array(2U + (rank ? 1U : 0U) + b.trailing);
    ts(b);
    events(b, layout);
    if (rank) {
      if (b.rank.state == OptUint::value)
        uint(b.rank.v);
      else
        p_.pack_nil();
    }
    for (std::size_t t = 0; t < b.trailing; ++t)
      str("extra");
    close();
  }

 private:
  void open_array(std::size_t n) {
    p_.pack_array(static_cast<std::uint32_t>(n));
    max_depth_ = std::max(max_depth_, ++depth_);
  }
  void open_map(std::size_t n) {
    p_.pack_map(static_cast<std::uint32_t>(n));
    max_depth_ = std::max(max_depth_, ++depth_);
  }
  void close() { --depth_; }

  void str(std::string_view s) {
    p_.pack_str(static_cast<std::uint32_t>(s.size()));
    p_.pack_str_body(s.data(), static_cast<std::uint32_t>(s.size()));
  }

  // Shortest form mostly (as msgspec writes), fixed 64-bit width sometimes, and
  // sometimes a signed format wide enough for the value (the same number).
  void uint(std::uint64_t v) {
    const int form = in_.ConsumeIntegralInRange<int>(0, 11);
    if (form == 0)
      p_.pack_fix_uint64(v);
    else if (form == 1 && v <= 0x7fU)
      p_.pack_fix_int8(static_cast<std::int8_t>(v));
    else if (form == 2 && v <= 0x7fffU)
      p_.pack_fix_int16(static_cast<std::int16_t>(v));
    else if (form == 3 && v <= 0x7fffffffU)
      p_.pack_fix_int32(static_cast<std::int32_t>(v));
    else if (form == 4 && v <= 0x7fffffffffffffffU)
      p_.pack_fix_int64(static_cast<std::int64_t>(v));
    else
      p_.pack_uint64(v);
  }

  void opt_uint(const OptUint& o) {
    if (o.state == OptUint::value)
      uint(o.v);
    else
      p_.pack_nil();
  }

  void opt_str(const OptStr& o) {
    if (o.state == OptStr::value)
      str(o.s);
    else
      p_.pack_nil();
  }

  void ts(const WireBatch& b) {
    switch (b.ts_kind) {
      case WireBatch::f64:
        real(0xcb, b.ts_bits, 8);
        break;
      case WireBatch::f32:
        real(0xca,
             std::bit_cast<std::uint32_t>(static_cast<float>(std::bit_cast<double>(b.ts_bits))), 4);
        break;
      case WireBatch::uint:
        uint(b.ts_bits);
        break;
      case WireBatch::sint:
        p_.pack_int64(static_cast<std::int64_t>(b.ts_bits));
        break;
    }
  }

  // A float as msgspec writes it, always in float form (msgpack-cxx's packer writes
  // integral values as integers).
  void real(unsigned char marker, std::uint64_t bits, int bytes) {
    char out[9];
    out[0] = static_cast<char>(marker);
    for (int i = 0; i < bytes; ++i)
      out[1 + i] = static_cast<char>((bits >> (8 * (bytes - 1 - i))) & 0xffU);
    buf_.write(out, static_cast<std::size_t>(1 + bytes));
  }

  void hash(const WireHash& h) {
    switch (h.kind) {
      case WireHash::uint:
        p_.pack_uint64(h.value);
        break;
      case WireHash::fixed:
        p_.pack_fix_uint64(h.value);
        break;
      case WireHash::sint:
        p_.pack_int64(static_cast<std::int64_t>(h.value));
        break;
      case WireHash::bin:
        p_.pack_bin(static_cast<std::uint32_t>(h.bytes.size()));
        p_.pack_bin_body(reinterpret_cast<const char*>(h.bytes.data()),
                         static_cast<std::uint32_t>(h.bytes.size()));
        break;
    }
  }

  void hashes(const WireEvent& e) {
    open_array(e.hashes.size());
    for (const WireHash& h : e.hashes)
      hash(h);
    close();
  }

  void parent(const WireEvent& e) {
    if (e.parent)
      hash(*e.parent);
    else
      p_.pack_nil();
  }

  void tokens(const WireEvent& e) {
    if (!e.eagle) {
      open_array(e.tokens.size());
      for (const std::uint32_t t : e.tokens)
        uint(t);
      close();
      return;
    }
    // [token, next] pairs: tokens[i] and tokens[i + 1].
    open_array(e.tokens.size() - 1U);
    for (std::size_t i = 0; i + 1 < e.tokens.size(); ++i) {
      open_array(2);
      uint(e.tokens[i]);
      uint(e.tokens[i + 1]);
      close();
    }
    close();
  }

  void medium(const WireEvent& e) {
    if (e.medium_int)
      p_.pack_uint64(0);
    else
      opt_str(e.medium);
  }

  void extra(const WireEvent& e) {
    if (!e.has_extra) {
      p_.pack_nil();
      return;
    }
    open_array(e.extra.size());
    for (const auto& block : e.extra) {
      if (!block) {
        p_.pack_nil();
        continue;
      }
      open_array(block->size());
      for (const MediaKey& k : *block) {
        if (k.pair) {
          open_array(2);
          str(k.s);
          uint(7);
          close();
        } else {
          str(k.s);
        }
      }
      close();
    }
    close();
  }

  const char* tag(const WireEvent& e) {
    switch (e.type) {
      case WireEvent::stored:
        return "BlockStored";
      case WireEvent::removed:
        return "BlockRemoved";
      case WireEvent::cleared:
        return "AllBlocksCleared";
      case WireEvent::unknown:
        break;
    }
    return e.tag.c_str();
  }

  void events(const WireBatch& b, Layout layout) {
    open_array(b.events.size());
    for (const WireEvent& e : b.events) {
      if (layout == Layout::array_array)
        array_event(e);
      else
        map_event(e);
    }
    close();
  }

  // Positional fields in declaration order; trailing defaults may be left out.
  void array_event(const WireEvent& e) {
    if (e.type == WireEvent::stored) {
      // BlockStored: hashes, parent, tokens, block_size, lora_id, medium, lora_name,
      // extra_keys, group_idx, spec_kind.
      std::size_t last = 4;
      if (e.lora_id.present()) last = 5;
      if (e.medium.present() || e.medium_int) last = 6;
      if (e.lora_name.present() || e.cache_salt.present()) last = 7;
      if (e.has_extra) last = 8;
      if (e.group_idx.present()) last = 9;
      if (e.spec_kind.present()) last = 10;
      if (e.trailing == 0) last = std::max(last, 4U + pick(7));
      const std::size_t n = e.trailing > 0 ? 11U + e.trailing : last + 1U;
      open_array(n);
      str(tag(e));
      hashes(e);
      parent(e);
      tokens(e);
      uint(e.block_size);
      for (std::size_t pos = 5; pos < n; ++pos) {
        switch (pos) {
          case 5:
            opt_uint(e.lora_id);
            break;
          case 6:
            medium(e);
            break;
          case 7:
            if (e.cache_salt.present()) {
              open_map(1);
              str("cache_salt");
              opt_str(e.cache_salt);
              close();
            } else {
              opt_str(e.lora_name);
            }
            break;
          case 8:
            extra(e);
            break;
          case 9:
            opt_uint(e.group_idx);
            break;
          case 10:
            opt_str(e.spec_kind);
            break;
          default:
            str("future field");
            break;
        }
      }
      close();
    } else if (e.type == WireEvent::removed) {
      // BlockRemoved: hashes, medium, group_idx, locality (here any string,
      // a kind's name included: it must not classify the removal).
      std::size_t last = 1;
      if (e.medium.present() || e.medium_int) last = 2;
      if (e.group_idx.present()) last = 3;
      if (e.spec_kind.present()) last = 4;
      const std::size_t n = e.trailing > 0 ? 5U + e.trailing : last + 1U;
      open_array(n);
      str(tag(e));
      hashes(e);
      for (std::size_t pos = 2; pos < n; ++pos) {
        if (pos == 2)
          medium(e);
        else if (pos == 3)
          opt_uint(e.group_idx);
        else if (pos == 4)
          opt_str(e.spec_kind);
        else
          p_.pack_nil();
      }
      close();
    } else {
      open_array(1U + e.trailing);
      str(tag(e));
      for (std::size_t t = 0; t < e.trailing; ++t)
        uint(t);
      close();
    }
  }

  // Keys in an order from the input; absent fields omitted.
  void map_event(const WireEvent& e) {
    enum Key : std::uint8_t {
      type,
      hashes_k,
      parent_k,
      tokens_k,
      block_size_k,
      lora_id_k,
      medium_k,
      lora_name_k,
      salt_k,
      extra_k,
      group_k,
      spec_k,
      unknown_k
    };
    std::vector<int> keys{type};
    if (e.type == WireEvent::stored) {
      keys.insert(keys.end(), {hashes_k, tokens_k, block_size_k});
      if (e.parent_present) keys.push_back(parent_k);
      if (e.lora_id.present()) keys.push_back(lora_id_k);
      if (e.lora_name.present()) keys.push_back(lora_name_k);
      if (e.cache_salt.present()) keys.push_back(salt_k);
      if (e.has_extra) keys.push_back(extra_k);
    }
    if (e.type == WireEvent::stored || e.type == WireEvent::removed) {
      if (e.type == WireEvent::removed) keys.push_back(hashes_k);
      if (e.medium.present() || e.medium_int) keys.push_back(medium_k);
      if (e.group_idx.present()) keys.push_back(group_k);
      if (e.spec_kind.present() && e.type != WireEvent::removed) keys.push_back(spec_k);
    }
    for (std::size_t t = 0; t < e.trailing; ++t)
      keys.push_back(unknown_k);
    shuffle(keys);
    open_map(keys.size());
    for (const int k : keys) {
      switch (k) {
        case type:
          str("type");
          str(tag(e));
          break;
        case hashes_k:
          str("block_hashes");
          hashes(e);
          break;
        case parent_k:
          str("parent_block_hash");
          parent(e);
          break;
        case tokens_k:
          str("token_ids");
          tokens(e);
          break;
        case block_size_k:
          str("block_size");
          uint(e.block_size);
          break;
        case lora_id_k:
          str("lora_id");
          opt_uint(e.lora_id);
          break;
        case medium_k:
          str("medium");
          medium(e);
          break;
        case lora_name_k:
          str("lora_name");
          opt_str(e.lora_name);
          break;
        case salt_k:
          str("cache_salt");
          opt_str(e.cache_salt);
          break;
        case extra_k:
          str("extra_keys");
          extra(e);
          break;
        case group_k:
          str("group_idx");
          opt_uint(e.group_idx);
          break;
        case spec_k:
          str("kv_cache_spec_kind");
          opt_str(e.spec_kind);
          break;
        default:
          p_.pack_uint64(9);  // a non-string key: skipped
          str("value");
          break;
      }
    }
    close();
  }

  std::size_t pick(std::size_t n) { return in_.ConsumeIntegralInRange<std::size_t>(0, n - 1); }

  void shuffle(std::vector<int>& v) {
    for (std::size_t i = v.size(); i > 1; --i)
      std::swap(v[i - 1], v[pick(i)]);
  }

  FuzzedDataProvider& in_;
  msgpack::sbuffer& buf_;
  Packer p_;
  std::uint32_t depth_ = 0;
  std::uint32_t max_depth_ = 0;
};

void structured_mode(FuzzedDataProvider& in) {
  KvEventWireDecoder decoder;
  KvWireBatch got;
  KvWireStreamState stream;  // the input's batches as one publisher's stream
  GroupModel groups;
  // Several batches per input: each is encoded in every layout.
  while (in.remaining_bytes() > 0) {
    KvWireOptions o;
    o.device_only = in.ConsumeBool();
    const WireBatch wb = Generator(in).batch();
    switch (in.ConsumeIntegralInRange<int>(0, 3)) {
      case 0:  // the first stored event's block size
        for (const WireEvent& e : wb.events)
          if (e.type == WireEvent::stored) {
            o.block_size = e.block_size;
            break;
          }
        break;
      case 1:
        o.block_size = in.ConsumeIntegralInRange<std::uint32_t>(1, 16);
        break;
      default:
        break;
    }
    decoder = KvEventWireDecoder(o);
    const KvWireBatch want = expected(wb, o);
    GroupModel next_groups = groups;
    const KvWireBatch want_stream = expected(wb, o, &next_groups);
    KvWireStreamState next_stream = stream;
    const auto truncated_layout = in.ConsumeIntegralInRange<int>(0, 2);
    for (int l = 0; l < 3; ++l) {
      msgpack::sbuffer buf;
      Encoder enc(in, buf);
      enc.batch(wb, static_cast<Layout>(l));
      const Bytes payload = exact_copy(buf.data(), buf.size());
      ++fuzz::operations();
      const KvWireStatus st = decoder.decode(payload, got);
      check_shape(st, got);
      FUZZ_CHECK(st.ok());
      FUZZ_CHECK(matches(got, want));
      // The same payload as the next batch of the stream.
      KvWireStreamState s = stream;
      ++fuzz::operations();
      const KvWireStatus ss = decoder.decode(payload, got, s);
      check_shape(ss, got);
      FUZZ_CHECK(ss.ok());
      FUZZ_CHECK(matches(got, want_stream));
      FUZZ_CHECK(same_groups(s, next_groups));
      next_stream = s;
      if (l != truncated_layout) continue;

      // Every strict prefix is truncated; never half a batch.
      for (std::size_t n = 0; n < payload.size(); ++n) {
        const Bytes prefix = exact_copy(payload.data(), n);
        ++fuzz::operations();
        ++truncations();
        KvWireStreamState rejected = stream;
        const KvWireStatus t =
            n % 2 == 0 ? decoder.decode(prefix, got) : decoder.decode(prefix, got, rejected);
        check_shape(t, got);
        FUZZ_CHECK(t.code == (n == 0 ? KvWireErrc::empty : KvWireErrc::truncated));
        FUZZ_CHECK(rejected == stream);  // a rejected payload teaches nothing
      }
      // A byte after the batch.
      Bytes longer = payload;
      longer.push_back(static_cast<std::byte>(in.ConsumeIntegral<std::uint8_t>()));
      ++fuzz::operations();
      KvWireStatus t = decoder.decode(longer, got);
      check_shape(t, got);
      FUZZ_CHECK(t.code == KvWireErrc::trailing_bytes);
      // The limits cut exactly at the payload's depth and size.
      KvWireOptions tight = o;
      tight.max_depth = enc.max_depth() - 1U;
      tight.max_payload_bytes = payload.size();
      KvEventWireDecoder shallow(tight);
      ++fuzz::operations();
      t = shallow.decode(payload, got);
      check_shape(t, got);
      FUZZ_CHECK(t.code == KvWireErrc::too_deep);
      tight.max_depth = enc.max_depth();
      KvEventWireDecoder exact(tight);
      ++fuzz::operations();
      t = exact.decode(payload, got);
      FUZZ_CHECK(t.ok() && matches(got, want));
      tight.max_payload_bytes = payload.size() - 1U;
      KvEventWireDecoder small(tight);
      ++fuzz::operations();
      t = small.decode(payload, got);
      check_shape(t, got);
      FUZZ_CHECK(t.code == KvWireErrc::too_large);
    }
    stream = next_stream;
    groups = std::move(next_groups);
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {  // the publisher restarts
      stream.reset();
      groups.clear();
      FUZZ_CHECK(stream == KvWireStreamState());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  FuzzedDataProvider in(data + 1, size - 1);
  if (data[0] < 0x40)
    raw_mode(in);
  else
    structured_mode(in);
  return 0;
}
