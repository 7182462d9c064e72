// Tests for kv_event_wire.hpp: golden decodes of payloads in the three
// layouts vLLM and SGLang publish (tests/kv_event_wire/, written by
// make_fixtures.py with Python's msgpack following msgspec's rules), the
// malformed payloads each rejected with its error, and the decoding options.
#include <promptcache/kv_event_wire.hpp>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "catch.hpp"

#ifndef PROMPTCACHE_KV_WIRE_FIXTURES
#error "PROMPTCACHE_KV_WIRE_FIXTURES must name the fixture directory"
#endif

using promptcache::KvBlock;
using promptcache::KvEventData;
using promptcache::KvEventWireDecoder;
using promptcache::KvWireBatch;
using promptcache::KvWireErrc;
using promptcache::KvWireOptions;
using promptcache::KvWireStatus;
namespace kv_event = promptcache::kv_event;

namespace {

std::string fixture_path(const std::string& name) {
  // Appended in place: GCC 12 at -O2 mistakes operator+ on a temporary string for an
  // out-of-bounds copy when the standard headers come from a precompiled header.
  std::string path(PROMPTCACHE_KV_WIRE_FIXTURES);
  path += '/';
  path += name;
  return path;
}

std::vector<std::byte> read_bytes(const std::string& name) {
  std::ifstream in(fixture_path(name), std::ios::binary);
  REQUIRE(in.good());
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  for (std::size_t i = 0; i < chars.size(); ++i)
    out[i] = static_cast<std::byte>(chars[i]);
  return out;
}

std::string read_text(const std::string& name) {
  std::ifstream in(fixture_path(name));
  REQUIRE(in.good());
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The batch a .golden file describes; tokens hashes computed here with
// block_hash.hpp from the listed tokens, LoRA name and media hashes.
KvWireBatch parse_golden(const std::string& text) {
  KvWireBatch b;
  std::istringstream lines(text);
  std::string line;
  kv_event::Stored* cur = nullptr;
  std::string lora;
  bool eagle = false;
  std::size_t block_size = 0;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    std::string word;
    in >> word;
    if (word == "ts") {
      std::string v;
      in >> v;
      b.ts = std::stod(v);
    } else if (word == "dp_rank") {
      std::string v;
      in >> v;
      if (v != "none") b.dp_rank = static_cast<std::uint32_t>(std::stoul(v));
    } else if (word == "counts") {
      in >> b.unknown_events >> b.ignored_events >> b.dropped_blocks;
    } else if (word == "cleared") {
      b.events.emplace_back(kv_event::Cleared{});
      cur = nullptr;
    } else if (word == "removed") {
      kv_event::Removed r;
      std::uint64_t h = 0;
      while (in >> h)
        r.block_hashes.push_back(h);
      b.blocks += r.block_hashes.size();
      b.events.emplace_back(std::move(r));
      cur = nullptr;
    } else if (word == "stored") {
      kv_event::Stored s;
      std::string field;
      while (in >> field) {
        const auto eq = field.find('=');
        const std::string key = field.substr(0, eq), value = field.substr(eq + 1);
        if (key == "parent" && value != "none") s.parent_hash = std::stoull(value);
        if (key == "lora") lora = value == "-" ? std::string() : value;
        if (key == "eagle") eagle = value == "1";
        if (key == "block_size") block_size = std::stoul(value);
      }
      b.events.emplace_back(std::move(s));
      cur = &std::get<kv_event::Stored>(b.events.back());
    } else if (word == "block") {
      REQUIRE(cur != nullptr);
      std::uint64_t name = 0;
      in >> name >> word;
      REQUIRE(word == "tokens");
      std::vector<std::uint32_t> tokens;
      std::vector<std::uint64_t> media;
      bool in_media = false;
      while (in >> word) {
        if (word == "media") {
          in_media = true;
        } else if (in_media) {
          media.push_back(std::stoull(word));
        } else {
          tokens.push_back(static_cast<std::uint32_t>(std::stoul(word)));
        }
      }
      const std::span<const std::uint64_t> media_span(media);
      promptcache::BlockHashOptions o;
      o.seed = promptcache::block_hash_seed(lora);
      o.media = std::span<const std::span<const std::uint64_t>>(&media_span, 1);
      o.eagle = eagle;
      const auto locals = promptcache::local_block_hashes(tokens, block_size, o);
      REQUIRE(locals.size() == 1);
      cur->blocks.push_back(KvBlock{name, locals[0]});
      ++b.blocks;
    }
  }
  return b;
}

void check_same(const KvWireBatch& got, const KvWireBatch& want) {
  CHECK(got.ts == want.ts);
  CHECK(got.dp_rank == want.dp_rank);
  CHECK(got.unknown_events == want.unknown_events);
  CHECK(got.ignored_events == want.ignored_events);
  CHECK(got.dropped_blocks == want.dropped_blocks);
  CHECK(got.blocks == want.blocks);
  REQUIRE(got.events.size() == want.events.size());
  for (std::size_t i = 0; i < want.events.size(); ++i) {
    INFO("event " << i);
    CHECK(got.events[i] == want.events[i]);
  }
}

const char* const golden_fixtures[] = {
    "sglang_array_v0",    "sglang_array_dp",        "vllm_array_events", "vllm_array_map_events",
    "vllm_map_batch",     "vllm_map_batch_eagle",   "incomplete_tokens", "empty_events",
    "vllm_offload_batch", "vllm_offload_map_batch",
};

std::vector<std::byte> from_hex(std::string_view hex) {
  std::vector<std::byte> out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<std::byte>(std::stoul(std::string(hex.substr(i, 2)), nullptr, 16)));
  return out;
}

KvWireErrc errc_named(const std::string& s) {
  for (auto e : {KvWireErrc::ok, KvWireErrc::empty, KvWireErrc::too_large, KvWireErrc::truncated,
                 KvWireErrc::invalid_msgpack, KvWireErrc::trailing_bytes, KvWireErrc::too_deep,
                 KvWireErrc::bad_batch, KvWireErrc::bad_event, KvWireErrc::bad_value})
    if (promptcache::to_string(e) == s) return e;
  FAIL("unknown error code name " << s);
  return KvWireErrc::ok;
}

// msgspec-style packing helpers for payloads built in the tests.
using Buffer = msgpack::sbuffer;

}  // namespace

TEST_CASE("golden decodes of every layout", "[kv_event_wire]") {
  KvEventWireDecoder decoder;
  KvWireBatch got;
  for (const char* name : golden_fixtures) {
    INFO("fixture " << name);
    const auto bytes = read_bytes(std::string(name) + ".msgpack");
    const KvWireBatch want = parse_golden(read_text(std::string(name) + ".golden"));
    const KvWireStatus st = decoder.decode(bytes, got);
    INFO("status " << promptcache::to_string(st.code) << " " << st.detail);
    REQUIRE(st.ok());
    check_same(got, want);
  }
}

TEST_CASE("the golden fixtures hold what they claim to cover", "[kv_event_wire]") {
  // Guards the fixtures themselves: hashes of each kind and every layout.
  KvEventWireDecoder decoder;
  KvWireBatch b;
  REQUIRE(decoder.decode(read_bytes("sglang_array_v0.msgpack"), b).ok());
  const auto& s = std::get<kv_event::Stored>(b.events[0]);
  CHECK(s.blocks[0].block_hash == static_cast<std::uint64_t>(-5));  // signed
  CHECK(s.blocks[1].block_hash == std::uint64_t{1} << 63);          // INT64_MIN
  REQUIRE(decoder.decode(read_bytes("vllm_array_events.msgpack"), b).ok());
  CHECK(std::get<kv_event::Stored>(b.events[0]).blocks[0].block_hash == ~std::uint64_t{0});
  CHECK(std::get<kv_event::Stored>(b.events[0]).parent_hash == ~std::uint64_t{0} - 1U);
  REQUIRE(decoder.decode(read_bytes("vllm_map_batch.msgpack"), b).ok());
  CHECK_FALSE(b.dp_rank.has_value());
}

TEST_CASE("malformed payloads are rejected with their error and an empty batch",
          "[kv_event_wire]") {
  KvEventWireDecoder decoder;
  const auto good = read_bytes("vllm_array_map_events.msgpack");
  const KvWireBatch want = parse_golden(read_text("vllm_array_map_events.golden"));
  std::istringstream list(read_text("malformed.txt"));
  std::string file, code;
  std::size_t n = 0;
  while (list >> file >> code) {
    INFO("fixture " << file);
    KvWireBatch out;
    out.events.emplace_back(kv_event::Cleared{});  // must be cleared
    out.unknown_events = 9;
    const KvWireStatus st = decoder.decode(read_bytes(file), out);
    CHECK(st.code == errc_named(code));
    CHECK_FALSE(st.detail.empty());
    CHECK(out.events.empty());
    CHECK(out.unknown_events == 0);
    CHECK(out.blocks == 0);
    // The decoder is reusable after any error.
    KvWireBatch again;
    REQUIRE(decoder.decode(good, again).ok());
    check_same(again, want);
    ++n;
  }
  CHECK(n >= 30);
}

TEST_CASE("an error inside an event names the event", "[kv_event_wire]") {
  KvWireBatch out;
  const KvWireStatus st =
      KvEventWireDecoder().decode(read_bytes("malformed_bad_second_event.msgpack"), out);
  CHECK(st.code == KvWireErrc::bad_value);
  CHECK(st.event == 1);
}

TEST_CASE("empty strings decode: an empty tag is unknown, an empty LoRA name is no LoRA",
          "[kv_event_wire]") {
  // msgpack-cxx hands a zero-length string to the parser's visitor without a data pointer.
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_array(2);
  p.pack(1.0);
  p.pack_array(2);
  p.pack_array(1);
  p.pack(std::string());
  p.pack_array(8);
  p.pack(std::string("BlockStored"));
  p.pack_array(1);
  p.pack(7U);
  p.pack_nil();
  p.pack_array(1);
  p.pack(5U);
  p.pack(1U);
  p.pack_nil();
  p.pack_nil();
  p.pack(std::string());
  KvWireBatch out;
  const KvWireStatus st = KvEventWireDecoder().decode(buf.data(), buf.size(), out);
  REQUIRE(st.ok());
  CHECK(out.unknown_events == 1);
  REQUIRE(out.events.size() == 1);
  const std::vector<std::uint32_t> tokens{5};
  const auto local = promptcache::local_block_hashes(tokens, 1);
  CHECK(std::get<kv_event::Stored>(out.events[0]).blocks == std::vector<KvBlock>{{7, local.at(0)}});
}

TEST_CASE("byte-string hashes are named by their last 8 bytes, big-endian", "[kv_event_wire]") {
  std::vector<unsigned char> b32(32);
  for (std::size_t i = 0; i < b32.size(); ++i)
    b32[i] = static_cast<unsigned char>(i + 1);
  CHECK(promptcache::kv_wire_hash_from_bytes(b32) == 0x191a1b1c1d1e1f20ULL);
  const std::vector<unsigned char> b16(b32.begin(), b32.begin() + 16);
  CHECK(promptcache::kv_wire_hash_from_bytes(b16) == 0x090a0b0c0d0e0f10ULL);
  const std::vector<unsigned char> b3 = {0x01, 0x02, 0x03};
  CHECK(promptcache::kv_wire_hash_from_bytes(b3) == 0x010203ULL);
  const std::vector<unsigned char> ff(8, 0xff);
  CHECK(promptcache::kv_wire_hash_from_bytes(ff) == ~std::uint64_t{0});
  CHECK(promptcache::kv_wire_hash_from_bytes({}) == 0);
}

TEST_CASE("media hashes: 64 hex digits give their first 16 as a number", "[kv_event_wire]") {
  const std::string id = "0123456789ABCDEF" + std::string(48, 'a');
  CHECK(promptcache::kv_wire_media_hash(id) == 0x0123456789abcdefULL);
  CHECK_FALSE(promptcache::kv_wire_media_hash(id.substr(1)).has_value());
  CHECK_FALSE(promptcache::kv_wire_media_hash(id + "0").has_value());
  std::string bad_digit(63, '0');
  bad_digit += 'g';
  CHECK_FALSE(promptcache::kv_wire_media_hash(bad_digit).has_value());
  CHECK_FALSE(promptcache::kv_wire_media_hash("").has_value());
}

namespace {

// One logical batch (two stored events, a removal, a clear) packed in each
// layout by msgpack-cxx, as msgspec would write it.
enum class Layout { array_array, array_map, map_map };

void pack_stored(msgpack::packer<Buffer>& p, Layout layout, std::uint64_t h0, std::uint64_t h1,
                 bool with_parent, const std::vector<std::uint32_t>& tokens) {
  if (layout == Layout::array_array) {
    p.pack_array(9);
    p.pack(std::string("BlockStored"));
  } else {
    p.pack_map(8);
    p.pack(std::string("type"));
    p.pack(std::string("BlockStored"));
    p.pack(std::string("block_hashes"));
  }
  p.pack_array(2);
  p.pack(h0);
  p.pack(h1);
  if (layout != Layout::array_array) p.pack(std::string("parent_block_hash"));
  if (with_parent)
    p.pack(std::uint64_t{77});
  else
    p.pack_nil();
  if (layout != Layout::array_array) p.pack(std::string("token_ids"));
  p.pack(tokens);
  if (layout != Layout::array_array) p.pack(std::string("block_size"));
  p.pack(4);
  if (layout != Layout::array_array) p.pack(std::string("lora_id"));
  p.pack_nil();
  if (layout != Layout::array_array) p.pack(std::string("medium"));
  p.pack(std::string("GPU"));
  if (layout != Layout::array_array) p.pack(std::string("lora_name"));
  p.pack(std::string("lora-x"));
  if (layout == Layout::array_array) p.pack_nil();  // extra_keys (omitted in maps)
}

Buffer pack_batch(Layout layout) {
  Buffer buf;
  msgpack::packer<Buffer> p(buf);
  const std::vector<std::uint32_t> t1 = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<std::uint32_t> t2 = {9, 10, 11, 12, 13, 14, 15, 16};
  if (layout == Layout::map_map) {
    p.pack_map(3);
    p.pack(std::string("ts"));
    p.pack(12.5);
    p.pack(std::string("events"));
  } else {
    p.pack_array(3);
    p.pack(12.5);
  }
  p.pack_array(4);
  pack_stored(p, layout, 77, 78, false, t1);
  pack_stored(p, layout, 79, 80, true, t2);
  if (layout == Layout::array_array) {
    p.pack_array(3);
    p.pack(std::string("BlockRemoved"));
  } else {
    p.pack_map(3);
    p.pack(std::string("type"));
    p.pack(std::string("BlockRemoved"));
    p.pack(std::string("block_hashes"));
  }
  p.pack_array(1);
  p.pack(std::uint64_t{80});
  if (layout != Layout::array_array) p.pack(std::string("medium"));
  p.pack(std::string("GPU"));
  if (layout == Layout::array_array) {
    p.pack_array(1);
  } else {
    p.pack_map(1);
    p.pack(std::string("type"));
  }
  p.pack(std::string("AllBlocksCleared"));
  if (layout == Layout::map_map) p.pack(std::string("data_parallel_rank"));
  p.pack(5);
  return buf;
}

KvWireBatch decode_ok(const Buffer& buf, const KvWireOptions& options = {}) {
  KvWireBatch b;
  const KvWireStatus st = KvEventWireDecoder(options).decode(buf.data(), buf.size(), b);
  INFO(promptcache::to_string(st.code) << " " << st.detail);
  REQUIRE(st.ok());
  return b;
}

}  // namespace

TEST_CASE("the three layouts of one batch decode to the same events", "[kv_event_wire]") {
  const KvWireBatch a = decode_ok(pack_batch(Layout::array_array));
  const KvWireBatch m = decode_ok(pack_batch(Layout::array_map));
  const KvWireBatch mm = decode_ok(pack_batch(Layout::map_map));
  check_same(m, a);
  check_same(mm, a);
  REQUIRE(a.events.size() == 4);
  CHECK(a.dp_rank == 5u);
  CHECK(a.ts == 12.5);
  const auto& s = std::get<kv_event::Stored>(a.events[1]);
  CHECK(s.parent_hash == 77u);
  // The LoRA name seeds the tokens hash, as Dynamo's router hashes it.
  promptcache::BlockHashOptions o;
  o.seed = promptcache::block_hash_seed("lora-x");
  const std::vector<std::uint32_t> t2 = {9, 10, 11, 12, 13, 14, 15, 16};
  const auto locals = promptcache::local_block_hashes(t2, 4, o);
  CHECK(s.blocks == std::vector<KvBlock>{{79, locals[0]}, {80, locals[1]}});
  CHECK(std::get<kv_event::Stored>(a.events[0]).blocks[0].tokens_hash !=
        promptcache::local_block_hashes(std::vector<std::uint32_t>{1, 2, 3, 4}, 4)[0]);
}

namespace {

// One stored event of two blocks (tokens 1..8, block size 4) in a batch. In
// the array layout `lora` packs position 7 (a string, nil or SGLang's
// metadata map) and `extra_keys` position 8; in the map layout they pack the
// "lora_name" and "cache_salt" values (`salt`; nothing packs no key).
using Packer = msgpack::packer<Buffer>;
using PackFn = void (*)(Packer&);

Buffer salted_batch(bool map_event, PackFn lora, PackFn extra_keys, PackFn salt = nullptr) {
  Buffer buf;
  Packer p(buf);
  p.pack_array(2);
  p.pack(1.0);
  p.pack_array(1);
  const std::vector<std::uint32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  if (!map_event) {
    p.pack_array(9);
    p.pack(std::string("BlockStored"));
    p.pack(std::vector<std::uint64_t>{11, 12});
    p.pack_nil();
    p.pack(tokens);
    p.pack(4);
    p.pack_nil();  // lora_id
    p.pack(std::string("GPU"));
    lora(p);
    extra_keys(p);
    return buf;
  }
  p.pack_map(salt != nullptr ? 7U : 6U);
  p.pack(std::string("type"));
  p.pack(std::string("BlockStored"));
  p.pack(std::string("block_hashes"));
  p.pack(std::vector<std::uint64_t>{11, 12});
  p.pack(std::string("token_ids"));
  p.pack(tokens);
  p.pack(std::string("block_size"));
  p.pack(4);
  p.pack(std::string("lora_name"));
  lora(p);
  p.pack(std::string("extra_keys"));
  extra_keys(p);
  if (salt != nullptr) {
    p.pack(std::string("cache_salt"));
    salt(p);
  }
  return buf;
}

// The two blocks' tokens hashes under LoRA `lora` and salt `salt`.
std::vector<KvBlock> salted_blocks(std::string_view lora, std::string_view salt) {
  promptcache::BlockHashOptions o;
  o.seed = promptcache::block_hash_seed(lora, salt);
  const auto locals =
      promptcache::local_block_hashes(std::vector<std::uint32_t>{1, 2, 3, 4, 5, 6, 7, 8}, 4, o);
  return {{11, locals.at(0)}, {12, locals.at(1)}};
}

std::vector<KvBlock> stored_blocks(const Buffer& buf) {
  const KvWireBatch b = decode_ok(buf);
  REQUIRE(b.events.size() == 1);
  return std::get<kv_event::Stored>(b.events[0]).blocks;
}

void nil(Packer& p) {
  p.pack_nil();
}
void lora_a(Packer& p) {
  p.pack(std::string("lora-a"));
}
void sglang_meta(Packer& p) {  // SGLang's BlockStoredMetadata, a nested value first
  p.pack_map(3);
  p.pack(std::string("tags"));
  p.pack_array(2);
  p.pack(std::string("a"));
  p.pack_map(1);
  p.pack(std::string("cache_salt"));
  p.pack(std::string("not-this-one"));
  p.pack(std::string("cache_salt"));
  p.pack(std::string("tenant-1"));
  p.pack(std::string("session_id"));
  p.pack(std::string("s"));
}
void sglang_meta_nil_salt(Packer& p) {
  p.pack_map(1);
  p.pack(std::string("cache_salt"));
  p.pack_nil();
}
void sglang_meta_number_salt(Packer& p) {
  p.pack_map(1);
  p.pack(std::string("cache_salt"));
  p.pack(3);
}
void sglang_meta_unsalted(Packer& p) {
  p.pack_map(1);
  p.pack(std::string("session_id"));
  p.pack(std::string("s"));
}
void salt_1(Packer& p) {
  p.pack(std::string("tenant-1"));
}
void salt_empty(Packer& p) {
  p.pack(std::string());
}
void salt_number(Packer& p) {
  p.pack(5);
}
// The first block's keys: the LoRA name, an empty salt, then the salt; the
// second block's keys name another salt, which does not count.
void keys_salted(Packer& p) {
  p.pack_array(2);
  p.pack_array(3);
  p.pack(std::string("lora-a"));
  p.pack(std::string("dynamo-cache-salt:"));
  p.pack(std::string("dynamo-cache-salt:tenant-1"));
  p.pack_array(1);
  p.pack(std::string("dynamo-cache-salt:tenant-2"));
}
void keys_salt_in_second_block(Packer& p) {
  p.pack_array(2);
  p.pack_nil();
  p.pack_array(1);
  p.pack(std::string("dynamo-cache-salt:tenant-2"));
}
void keys_salt_in_pair(Packer& p) {  // only plain strings name a salt
  p.pack_array(1);
  p.pack_array(1);
  p.pack_array(2);
  p.pack(std::string("dynamo-cache-salt:tenant-1"));
  p.pack(0);
}
// A LoRA name that looks like a salt key is skipped once, as the LoRA's.
void lora_like_salt(Packer& p) {
  p.pack(std::string("dynamo-cache-salt:x"));
}
void keys_lora_like_salt(Packer& p) {
  p.pack_array(1);
  p.pack_array(3);
  p.pack(std::string("dynamo-cache-salt:x"));
  p.pack(std::string("dynamo-cache-salt:y"));
  p.pack(std::string("dynamo-cache-salt:x"));
}

}  // namespace

TEST_CASE("cache salts seed the tokens hash as Dynamo's router reads them", "[kv_event_wire]") {
  const std::vector<KvBlock> plain = salted_blocks("", "");
  const std::vector<KvBlock> salted = salted_blocks("", "tenant-1");
  const std::vector<KvBlock> lora_salted = salted_blocks("lora-a", "tenant-1");
  REQUIRE(plain != salted);
  REQUIRE(salted != lora_salted);
  // No salt anywhere: the LoRA seed alone.
  CHECK(stored_blocks(salted_batch(false, nil, nil)) == plain);
  CHECK(stored_blocks(salted_batch(false, sglang_meta_unsalted, nil)) == plain);
  // SGLang's metadata map in lora_name's position; a nil salt there leaves the
  // extra_keys to name one.
  CHECK(stored_blocks(salted_batch(false, sglang_meta, nil)) == salted);
  CHECK(stored_blocks(salted_batch(false, sglang_meta_nil_salt, nil)) == plain);
  CHECK(stored_blocks(salted_batch(false, sglang_meta_nil_salt, keys_salted)) ==
        salted_blocks("", "tenant-1"));
  // A map event's cache_salt, with the LoRA name.
  CHECK(stored_blocks(salted_batch(true, lora_a, nil, salt_1)) == lora_salted);
  // The first block's extra_keys (the LoRA name and an empty salt skipped),
  // for every block of the event; in both layouts.
  CHECK(stored_blocks(salted_batch(false, lora_a, keys_salted)) == lora_salted);
  CHECK(stored_blocks(salted_batch(true, lora_a, keys_salted)) == lora_salted);
  CHECK(stored_blocks(salted_batch(true, lora_a, keys_salted, nil)) == lora_salted);
  // An empty cache_salt is no salt, and the extra_keys are not read for one.
  CHECK(stored_blocks(salted_batch(true, lora_a, keys_salted, salt_empty)) ==
        salted_blocks("lora-a", ""));
  // Keys that name no salt: in a later block, inside a pair.
  CHECK(stored_blocks(salted_batch(false, nil, keys_salt_in_second_block)) == plain);
  CHECK(stored_blocks(salted_batch(false, nil, keys_salt_in_pair)) == plain);
  // The LoRA name is skipped once, where it stands: the key after it is the salt.
  CHECK(stored_blocks(salted_batch(false, lora_like_salt, keys_lora_like_salt)) ==
        salted_blocks("dynamo-cache-salt:x", "y"));
  // A salt that is not a string is refused, and the batch with it.
  for (const Buffer& bad : {salted_batch(true, lora_a, nil, salt_number),
                            salted_batch(false, sglang_meta_number_salt, nil)}) {
    KvWireBatch out;
    const KvWireStatus st = KvEventWireDecoder().decode(bad.data(), bad.size(), out);
    CHECK(st.code == KvWireErrc::bad_value);
    CHECK(out.events.empty());
  }
}

TEST_CASE("options: the router's block size and device-only media", "[kv_event_wire]") {
  KvWireOptions o;
  o.block_size = 4;
  CHECK(decode_ok(pack_batch(Layout::array_array), o).events.size() == 4);
  o.block_size = 8;  // every stored event has another block size: no blocks kept
  const KvWireBatch b = decode_ok(pack_batch(Layout::array_array), o);
  CHECK(b.events.size() == 2);  // the removal and the clear
  CHECK(b.ignored_events == 2);
  CHECK(b.dropped_blocks == 4);

  // A CPU-tier event applies only when device_only is off.
  const auto bytes = read_bytes("vllm_array_map_events.msgpack");
  KvWireBatch d;
  REQUIRE(KvEventWireDecoder().decode(bytes, d).ok());
  KvWireOptions all;
  all.device_only = false;
  KvWireBatch e;
  REQUIRE(KvEventWireDecoder(all).decode(bytes, e).ok());
  CHECK(e.events.size() == d.events.size() + 1);
  CHECK(e.ignored_events == d.ignored_events - 1);
}

TEST_CASE("an offload tier's events (block size 0, no tokens) skip; the step's GPU events apply",
          "[kv_event_wire]") {
  // [1.0, [["BlockStored", [77], nil, [], 0, nil, "CPU"]], 0], as vLLM's
  // KV-offloading connector publishes a store on the CPU tier.
  const auto cpu_store =
      from_hex("93cb3ff00000000000009197ab426c6f636b53746f726564914dc09000c0a343505500");
  KvWireBatch b;
  const KvWireStatus st = KvEventWireDecoder().decode(cpu_store, b);
  INFO(promptcache::to_string(st.code) << " " << st.detail);
  REQUIRE(st.ok());
  CHECK(b.events.empty());
  CHECK(b.ignored_events == 1);
  CHECK(b.dp_rank == 0U);

  // Mixed with the step's GPU events (vllm_offload_batch: a GPU store, a CPU
  // store, a GPU store without tokens, a removal with locality, a CPU
  // removal, a CPU and a GPU tier clear, a GPU store): only the others skip.
  KvWireBatch mixed;
  REQUIRE(KvEventWireDecoder().decode(read_bytes("vllm_offload_batch.msgpack"), mixed).ok());
  REQUIRE(mixed.events.size() == 4);
  CHECK(std::holds_alternative<kv_event::Stored>(mixed.events[0]));
  CHECK(std::get<kv_event::Removed>(mixed.events[1]).block_hashes ==
        std::vector<std::uint64_t>{302});
  CHECK(std::holds_alternative<kv_event::Cleared>(mixed.events[2]));
  CHECK(mixed.ignored_events == 4);
  CHECK(mixed.dropped_blocks == 1);  // the GPU store without tokens

  // A store of another medium is not read further: a wrong-typed content
  // there does not cost the batch.
  Buffer buf;
  msgpack::packer<Buffer> p(buf);
  p.pack_array(2);
  p.pack(1.0);
  p.pack_array(1);
  p.pack_array(7);
  p.pack(std::string("BlockStored"));
  p.pack(std::string("not hashes"));
  p.pack_nil();
  p.pack_nil();
  p.pack(-1);
  p.pack_nil();
  p.pack(std::string("DISK"));
  KvWireBatch odd;
  REQUIRE(KvEventWireDecoder().decode(buf.data(), buf.size(), odd).ok());
  CHECK(odd.ignored_events == 1);
  KvWireOptions all;
  all.device_only = false;  // every medium indexed: now its contents are checked
  CHECK(KvEventWireDecoder(all).decode(buf.data(), buf.size(), odd).code == KvWireErrc::bad_value);
}

TEST_CASE("BlockRemoved: fields after group_idx (vLLM's locality) do not skip the removal",
          "[kv_event_wire]") {
  for (const bool with_group : {false, true}) {
    Buffer buf;
    msgpack::packer<Buffer> p(buf);
    p.pack_array(2);
    p.pack(1.0);
    p.pack_array(2);
    p.pack_array(5);
    p.pack(std::string("BlockRemoved"));
    p.pack(std::vector<std::uint64_t>{5});
    p.pack(std::string("GPU"));
    if (with_group)
      p.pack(0U);
    else
      p.pack_nil();
    p.pack(std::string("LOCAL"));
    p.pack_array(6);
    p.pack(std::string("BlockRemoved"));
    p.pack(std::vector<std::uint64_t>{6});
    p.pack(std::string("GPU"));
    p.pack(0U);
    p.pack(std::string("REMOTE"));
    p.pack(std::string("a future field"));
    KvWireBatch b;
    promptcache::KvWireStreamState state;
    REQUIRE(KvEventWireDecoder().decode(buf.data(), buf.size(), b, state).ok());
    REQUIRE(b.events.size() == 2);
    CHECK(std::get<kv_event::Removed>(b.events[0]).block_hashes == std::vector<std::uint64_t>{5});
    CHECK(b.ignored_events == 0);
    CHECK(state.known_groups() == 0);  // "LOCAL" names no kind
  }
}

TEST_CASE("TierBlocksCleared: a clear of the indexed medium clears, of another skips",
          "[kv_event_wire]") {
  auto pack_clears = [](const std::vector<std::string>& media, bool maps) {
    Buffer buf;
    msgpack::packer<Buffer> p(buf);
    p.pack_array(2);
    p.pack(1.0);
    p.pack_array(static_cast<std::uint32_t>(media.size()));
    for (const std::string& m : media) {
      if (maps) {
        p.pack_map(3);
        p.pack(std::string("type"));
        p.pack(std::string("TierBlocksCleared"));
        p.pack(std::string("medium"));
        p.pack(m);
        p.pack(std::string("ownership"));
        p.pack(std::string("kvcr"));
      } else {
        p.pack_array(2);
        p.pack(std::string("TierBlocksCleared"));
        p.pack(m);
      }
    }
    return buf;
  };
  for (const bool maps : {false, true}) {
    const Buffer buf = pack_clears({"CPU", "GPU", "CPU_TIER2"}, maps);
    KvWireBatch b;
    REQUIRE(KvEventWireDecoder().decode(buf.data(), buf.size(), b).ok());
    REQUIRE(b.events.size() == 1);
    CHECK(std::holds_alternative<kv_event::Cleared>(b.events[0]));
    CHECK(b.ignored_events == 2);
    CHECK(b.unknown_events == 0);
    KvWireOptions all;
    all.device_only = false;  // one index over every medium: any tier's clear clears it
    REQUIRE(KvEventWireDecoder(all).decode(buf.data(), buf.size(), b).ok());
    CHECK(b.events.size() == 3);
  }
  // Applied, the GPU clear empties the worker's view.
  promptcache::KvIndex index;
  const promptcache::KvWorker w{1, 0};
  KvWireBatch s;
  REQUIRE(KvEventWireDecoder().decode(read_bytes("vllm_offload_batch.msgpack"), s).ok());
  std::uint64_t id = 0;
  for (std::size_t i = 0; i < 3; ++i)
    REQUIRE(index.apply(w, promptcache::KvEvent{id++, s.events[i]}).ok());
  CHECK(index.block_count(w) == 0);
}

TEST_CASE("options: payload size and nesting limits", "[kv_event_wire]") {
  const Buffer buf = pack_batch(Layout::map_map);
  KvWireOptions o;
  o.max_payload_bytes = buf.size();
  KvWireBatch b;
  CHECK(KvEventWireDecoder(o).decode(buf.data(), buf.size(), b).ok());
  o.max_payload_bytes = buf.size() - 1;
  CHECK(KvEventWireDecoder(o).decode(buf.data(), buf.size(), b).code == KvWireErrc::too_large);
  CHECK(b.events.empty());

  // This batch nests 4 containers deep (batch, events, event, block_hashes).
  KvWireOptions d;
  d.max_depth = 4;
  CHECK(KvEventWireDecoder(d).decode(buf.data(), buf.size(), b).ok());
  d.max_depth = 3;
  CHECK(KvEventWireDecoder(d).decode(buf.data(), buf.size(), b).code == KvWireErrc::too_deep);
}

TEST_CASE("decoded batches apply to a KvIndex", "[kv_event_wire]") {
  promptcache::KvIndex index;
  const promptcache::KvWorker w{1, 0};
  const KvWireBatch b = decode_ok(pack_batch(Layout::array_map));
  std::uint64_t id = 0;
  std::vector<promptcache::KvEventStatus> st;
  for (const KvEventData& e : b.events)
    st.push_back(index.apply(w, promptcache::KvEvent{id++, e}).status);
  using S = promptcache::KvEventStatus;
  CHECK(st == std::vector<S>{S::applied, S::applied, S::applied, S::applied});
  CHECK(index.block_count(w) == 0);  // cleared at the end
  CHECK(index.check_invariants());
}

TEST_CASE("duplicate hashes and unknown parents decode; the index refuses them unchanged",
          "[kv_event_wire]") {
  // Neither is a wire error: the decoder passes both on, and KvIndex answers for them.
  Buffer buf;
  msgpack::packer<Buffer> p(buf);
  p.pack_array(2);
  p.pack(3.0);
  p.pack_array(2);
  pack_stored(p, Layout::array_array, 5, 5, false, {1, 2, 3, 4, 5, 6, 7, 8});  // 5 twice
  pack_stored(p, Layout::array_array, 6, 7, true, {1, 2, 3, 4, 5, 6, 7, 8});   // parent 77
  const KvWireBatch b = decode_ok(buf);
  REQUIRE(b.events.size() == 2);
  promptcache::KvIndex index;
  const promptcache::KvWorker w{1, 0};
  using S = promptcache::KvEventStatus;
  CHECK(index.apply(w, promptcache::KvEvent{0, b.events[0]}).status == S::block_conflict);
  CHECK(index.apply(w, promptcache::KvEvent{1, b.events[1]}).status == S::parent_not_found);
  CHECK(index.block_count(w) == 0);
  CHECK(index.node_count() == 0);
  CHECK(index.check_invariants());
}

namespace {

// How a test writes an integer: as msgpack's compact unsigned encoding, or
// in one fixed signed width (msgpack-cxx reports every signed width through
// visit_negative_integer, non-negative values included).
enum class IntFormat { compact, int8, int16, int32, int64 };

void pack_int(msgpack::packer<Buffer>& p, IntFormat f, std::int64_t v) {
  switch (f) {
    case IntFormat::compact:
      if (v >= 0)
        p.pack(static_cast<std::uint64_t>(v));
      else
        p.pack(v);
      break;
    case IntFormat::int8:
      p.pack_fix_int8(static_cast<std::int8_t>(v));
      break;
    case IntFormat::int16:
      p.pack_fix_int16(static_cast<std::int16_t>(v));
      break;
    case IntFormat::int32:
      p.pack_fix_int32(static_cast<std::int32_t>(v));
      break;
    case IntFormat::int64:
      p.pack_fix_int64(v);
      break;
  }
}

// [ts, [BlockStored(hashes [7, 9], parent 3, tokens [1, 2, 3, 4], block_size 2,
// group_idx 0), BlockRemoved([9], group_idx 1), BlockRemoved([7], group_idx
// 0)], dp_rank 1], every integer but ts written in format `f`; `token` and
// `block_size` replace one token id and the block size.
Buffer pack_int_batch(IntFormat f, std::int64_t token = 2, std::int64_t block_size = 2,
                      std::int64_t dp_rank = 1, std::int64_t removed_group = 1) {
  Buffer buf;
  msgpack::packer<Buffer> p(buf);
  p.pack_array(3);
  p.pack(2.5);
  p.pack_array(3);
  p.pack_array(10);
  p.pack(std::string("BlockStored"));
  p.pack_array(2);
  pack_int(p, f, 7);
  pack_int(p, f, 9);
  pack_int(p, f, 3);  // parent
  p.pack_array(4);
  pack_int(p, f, 1);
  pack_int(p, f, token);
  pack_int(p, f, 3);
  pack_int(p, f, 4);
  pack_int(p, f, block_size);
  p.pack_nil();  // lora_id
  p.pack(std::string("GPU"));
  p.pack_nil();  // lora_name
  p.pack_nil();  // extra_keys
  pack_int(p, f, 0);
  for (const std::int64_t group : {removed_group, std::int64_t{0}}) {
    p.pack_array(4);
    p.pack(std::string("BlockRemoved"));
    p.pack_array(1);
    pack_int(p, f, group == 0 ? 7 : 9);
    p.pack(std::string("GPU"));
    pack_int(p, f, group);
  }
  pack_int(p, f, dp_rank);
  return buf;
}

KvWireStatus decode_status(const Buffer& buf, KvWireBatch& out) {
  return KvEventWireDecoder().decode(buf.data(), buf.size(), out);
}

}  // namespace

TEST_CASE("non-negative integers in signed msgpack formats read as the same unsigned values",
          "[kv_event_wire]") {
  const KvWireBatch want = decode_ok(pack_int_batch(IntFormat::compact));
  // The reference itself: the group 1 removal skipped, the group 0 one kept.
  REQUIRE(want.events.size() == 2);
  CHECK(want.ignored_events == 1);
  CHECK(want.dp_rank == 1u);
  CHECK(std::get<kv_event::Stored>(want.events[0]).parent_hash == 3u);
  CHECK(std::get<kv_event::Removed>(want.events[1]).block_hashes == std::vector<std::uint64_t>{7});

  for (const IntFormat f :
       {IntFormat::int8, IntFormat::int16, IntFormat::int32, IntFormat::int64}) {
    INFO("format " << static_cast<int>(f));
    // Token ids, block_size, hashes, the parent, group_idx and the dp rank.
    check_same(decode_ok(pack_int_batch(f)), want);

    // Negative values are still refused where they were, and still decode
    // where a negative value has a meaning (two's complement hashes).
    KvWireBatch out;
    KvWireStatus st = decode_status(pack_int_batch(f, -1), out);
    CHECK(st.code == KvWireErrc::bad_value);
    CHECK(out.events.empty());
    st = decode_status(pack_int_batch(f, 2, -2), out);
    CHECK(st.code == KvWireErrc::bad_value);
    st = decode_status(pack_int_batch(f, 2, 2, -1), out);
    CHECK(st.code == KvWireErrc::bad_batch);
    // A negative group_idx names no group: the removal applies, as before.
    const KvWireBatch neg = decode_ok(pack_int_batch(f, 2, 2, 1, -1));
    CHECK(neg.events.size() == 3);
    CHECK(neg.ignored_events == 0);
  }

  // The widest values: above 2^32 - 1 is still too big for a token id or a
  // block size; 2^63 - 1 as a hash is the same name as its unsigned form.
  KvWireBatch out;
  CHECK(decode_status(pack_int_batch(IntFormat::int64, std::int64_t{1} << 32), out).code ==
        KvWireErrc::bad_value);
  CHECK(decode_status(pack_int_batch(IntFormat::int64, 2, std::int64_t{1} << 32), out).code ==
        KvWireErrc::bad_value);
  CHECK(decode_status(pack_int_batch(IntFormat::int64, 2, 2, std::int64_t{1} << 32), out).code ==
        KvWireErrc::bad_batch);
  const std::int64_t top = std::numeric_limits<std::int64_t>::max();
  Buffer a, b;
  msgpack::packer<Buffer> pa(a), pb(b);
  for (auto [p, f] : {std::pair{&pa, IntFormat::int64}, std::pair{&pb, IntFormat::compact}}) {
    p->pack_array(2);
    pack_int(*p, f, 0);  // an integer ts
    p->pack_array(1);
    p->pack_array(2);
    p->pack(std::string("BlockRemoved"));
    p->pack_array(2);
    pack_int(*p, f, top);
    pack_int(*p, f, 0);
  }
  const KvWireBatch ra = decode_ok(a);
  check_same(ra, decode_ok(b));
  CHECK(std::get<kv_event::Removed>(ra.events.at(0)).block_hashes ==
        std::vector<std::uint64_t>{static_cast<std::uint64_t>(top), 0});
}

namespace {

using promptcache::KvWireStreamState;

// vLLM's map events of a hybrid model: a stored block with its group and
// spec kind, and a removal with its group only.
struct GroupEvent {
  bool stored = true;
  std::uint64_t hash = 0;
  std::optional<std::uint64_t> group;
  const char* kind = nullptr;  // stored only; nullptr: no kv_cache_spec_kind
  const char* medium = "GPU";
};

Buffer pack_group_batch(const std::vector<GroupEvent>& events, bool array_events = false) {
  Buffer buf;
  msgpack::packer<Buffer> p(buf);
  p.pack_map(2);
  p.pack(std::string("ts"));
  p.pack(1.0);
  p.pack(std::string("events"));
  p.pack_array(static_cast<std::uint32_t>(events.size()));
  for (const GroupEvent& e : events) {
    const std::uint32_t extra = (e.group ? 1U : 0U) + (e.kind != nullptr ? 1U : 0U);
    if (array_events) {
      // msgspec's positions: a kind needs its group slot before it.
      if (e.stored) {
        p.pack_array(9U + (e.kind != nullptr ? 2U : (e.group ? 1U : 0U)));
        p.pack(std::string("BlockStored"));
        p.pack(std::vector<std::uint64_t>{e.hash});
        p.pack_nil();
        p.pack(std::vector<std::uint32_t>{1, 2});
        p.pack(2U);
        p.pack_nil();
        p.pack(std::string(e.medium));
        p.pack_nil();
        p.pack_nil();
      } else {
        p.pack_array(3U + (e.group ? 1U : 0U));
        p.pack(std::string("BlockRemoved"));
        p.pack(std::vector<std::uint64_t>{e.hash});
        p.pack(std::string(e.medium));
      }
      if (e.group)
        p.pack(*e.group);
      else if (e.kind != nullptr)
        p.pack_nil();
      if (e.kind != nullptr) p.pack(std::string(e.kind));
      continue;
    }
    p.pack_map((e.stored ? 6U : 3U) + extra);
    p.pack(std::string("type"));
    p.pack(std::string(e.stored ? "BlockStored" : "BlockRemoved"));
    p.pack(std::string("block_hashes"));
    p.pack(std::vector<std::uint64_t>{e.hash});
    p.pack(std::string("medium"));
    p.pack(std::string(e.medium));
    if (e.stored) {
      p.pack(std::string("parent_block_hash"));
      p.pack_nil();
      p.pack(std::string("token_ids"));
      p.pack(std::vector<std::uint32_t>{1, 2});
      p.pack(std::string("block_size"));
      p.pack(2U);
    }
    if (e.group) {
      p.pack(std::string("group_idx"));
      p.pack(*e.group);
    }
    if (e.kind != nullptr) {
      p.pack(std::string("kv_cache_spec_kind"));
      p.pack(std::string(e.kind));
    }
  }
  return buf;
}

// Decodes with `state`, or statelessly when it is null; REQUIREs success.
KvWireBatch decode_group(const std::vector<GroupEvent>& events, KvWireStreamState* state,
                         bool array_events = false) {
  const Buffer buf = pack_group_batch(events, array_events);
  KvWireBatch b;
  KvEventWireDecoder decoder;
  const KvWireStatus st = state != nullptr ? decoder.decode(buf.data(), buf.size(), b, *state)
                                           : decoder.decode(buf.data(), buf.size(), b);
  INFO(promptcache::to_string(st.code) << " " << st.detail);
  REQUIRE(st.ok());
  return b;
}

GroupEvent stored_in(std::uint64_t hash, std::uint64_t group, const char* kind) {
  return GroupEvent{true, hash, group, kind, "GPU"};
}

GroupEvent removed_in(std::uint64_t hash, std::optional<std::uint64_t> group) {
  return GroupEvent{false, hash, group, nullptr, "GPU"};
}

}  // namespace

TEST_CASE("stream state: removals of a main attention group with an index other than 0 apply",
          "[kv_event_wire]") {
  for (const bool array_events : {false, true}) {
    INFO("array events " << array_events);
    // A hybrid model whose full-attention layers are group 1.
    promptcache::KvIndex with, without;
    const promptcache::KvWorker w{1, 0};
    KvWireStreamState state;
    std::uint64_t id = 0;
    for (const bool stateful : {true, false}) {
      promptcache::KvIndex& index = stateful ? with : without;
      KvWireStreamState* s = stateful ? &state : nullptr;
      const KvWireBatch stored = decode_group({stored_in(7, 1, "full_attention")}, s, array_events);
      REQUIRE(stored.events.size() == 1);
      for (const KvEventData& e : stored.events)
        index.apply(w, promptcache::KvEvent{id++, e});
      const KvWireBatch removed = decode_group({removed_in(7, 1)}, s, array_events);
      CHECK(removed.events.size() == (stateful ? 1U : 0U));
      CHECK(removed.ignored_events == (stateful ? 0U : 1U));
      for (const KvEventData& e : removed.events)
        index.apply(w, promptcache::KvEvent{id++, e});
    }
    CHECK(state.is_main_group(1) == true);
    CHECK(state.known_groups() == 1);
    CHECK(with.block_count(w) == 0);
    CHECK(without.block_count(w) == 1);  // the stateless rule keeps the evicted block
    CHECK(with.check_invariants());
  }
}

TEST_CASE("stream state: a sliding-window group is learned as another group; its removals skip",
          "[kv_event_wire]") {
  // Group 0 is the sliding window, group 1 the full attention (vLLM orders
  // groups by layer, so either can come first).
  KvWireStreamState state;
  const KvWireBatch stored =
      decode_group({stored_in(7, 0, "sliding_window"), stored_in(7, 1, "full_attention")}, &state);
  CHECK(stored.events.size() == 1);
  CHECK(stored.ignored_events == 1);
  CHECK(state.is_main_group(0) == false);
  CHECK(state.is_main_group(1) == true);

  // The sliding window evicts block 7 while the full attention keeps it: the
  // removal must not reach the index. Without the state, group 0 counts as
  // the main group and the removal would drop a block still held.
  const KvWireBatch with = decode_group({removed_in(7, 0)}, &state);
  CHECK(with.events.empty());
  CHECK(with.ignored_events == 1);
  const KvWireBatch without = decode_group({removed_in(7, 0)}, nullptr);
  CHECK(without.events.size() == 1);

  // Other non-main kinds are learned the same way.
  decode_group({stored_in(8, 2, "mamba"), stored_in(8, 3, "mla_attention")}, &state);
  CHECK(state.is_main_group(2) == false);
  CHECK(state.is_main_group(3) == true);
  const KvWireBatch r = decode_group({removed_in(8, 2), removed_in(8, 3)}, &state);
  REQUIRE(r.events.size() == 1);
  CHECK(std::get<kv_event::Removed>(r.events[0]).block_hashes == std::vector<std::uint64_t>{8});
  CHECK(r.ignored_events == 1);
}

TEST_CASE("stream state: unknown groups follow the stateless rule; a kind on the event decides",
          "[kv_event_wire]") {
  KvWireStreamState state;
  decode_group({stored_in(7, 1, "full_attention")}, &state);
  // Groups never named: 0 and no group apply, others skip, as without a state.
  for (KvWireStreamState* s : {&state, static_cast<KvWireStreamState*>(nullptr)}) {
    const KvWireBatch b =
        decode_group({removed_in(1, 0), removed_in(2, std::nullopt), removed_in(3, 5)}, s);
    REQUIRE(b.events.size() == 2);
    CHECK(b.ignored_events == 1);
  }
  // A stored event without a kind in a learned group uses the learned kind.
  const KvWireBatch b = decode_group({GroupEvent{true, 9, 1, nullptr, "GPU"}}, &state);
  CHECK(b.events.size() == 1);
  CHECK(decode_group({GroupEvent{true, 9, 1, nullptr, "GPU"}}, nullptr).events.empty());
  // A kind on the event wins over the learned one, and is learned in turn:
  // the last word on a group holds.
  const KvWireBatch sw = decode_group({stored_in(9, 1, "sliding_window")}, &state);
  CHECK(sw.events.empty());
  CHECK(state.is_main_group(1) == false);
  CHECK(decode_group({removed_in(7, 1)}, &state).events.empty());
  // A group is learned from a stored event of another medium too.
  decode_group({GroupEvent{true, 9, 4, "full_attention", "CPU"}}, &state);
  CHECK(state.is_main_group(4) == true);
  CHECK(decode_group({removed_in(9, 4)}, &state).events.size() == 1);
  // A group_idx that is negative or not an integer names no group: nothing
  // is learned, and a removal with it applies.
  Buffer odd;
  msgpack::packer<Buffer> p(odd);
  p.pack_array(2);
  p.pack(1.0);
  p.pack_array(3);
  p.pack_array(11);
  p.pack(std::string("BlockStored"));
  p.pack(std::vector<std::uint64_t>{11});
  p.pack_nil();
  p.pack(std::vector<std::uint32_t>{1, 2});
  p.pack(2U);
  for (int i = 0; i < 4; ++i)
    p.pack_nil();
  p.pack(-3);
  p.pack(std::string("sliding_window"));
  for (const bool text : {false, true}) {
    p.pack_array(4);
    p.pack(std::string("BlockRemoved"));
    p.pack(std::vector<std::uint64_t>{7});
    p.pack(std::string("GPU"));
    if (text)
      p.pack(std::string("1"));
    else
      p.pack(-1);
  }
  const std::size_t known = state.known_groups();
  KvWireBatch ob;
  REQUIRE(KvEventWireDecoder().decode(odd.data(), odd.size(), ob, state).ok());
  CHECK(ob.events.size() == 2);  // both removals; the sliding-window store skips
  CHECK(ob.ignored_events == 1);
  CHECK(state.known_groups() == known);
  // The kind of a group learned earlier in the same batch counts.
  KvWireStreamState fresh;
  const KvWireBatch same =
      decode_group({stored_in(5, 6, "full_attention"), removed_in(5, 6)}, &fresh);
  CHECK(same.events.size() == 2);
}

TEST_CASE("stream state: groups at or above max_groups are not learned", "[kv_event_wire]") {
  constexpr std::uint64_t cap = KvWireStreamState::max_groups;
  KvWireStreamState state;
  const KvWireBatch stored =
      decode_group({stored_in(7, cap - 1, "full_attention"), stored_in(8, cap, "full_attention"),
                    stored_in(9, ~std::uint64_t{0}, "full_attention")},
                   &state);
  CHECK(stored.events.size() == 3);  // the kind on each event decides
  CHECK(state.known_groups() == 1);
  CHECK(state.is_main_group(cap - 1) == true);
  CHECK_FALSE(state.is_main_group(cap).has_value());
  CHECK_FALSE(state.is_main_group(~std::uint64_t{0}).has_value());
  const KvWireBatch removed = decode_group(
      {removed_in(7, cap - 1), removed_in(8, cap), removed_in(9, ~std::uint64_t{0})}, &state);
  REQUIRE(removed.events.size() == 1);  // above the cap: a group other than 0 skips
  CHECK(std::get<kv_event::Removed>(removed.events[0]).block_hashes ==
        std::vector<std::uint64_t>{7});
  CHECK(removed.ignored_events == 2);
  // learn() at the cap is a no-op too.
  KvWireStreamState direct;
  direct.learn(cap, true);
  CHECK(direct == KvWireStreamState());
}

TEST_CASE("stream state: unchanged by a payload that does not decode; reset forgets",
          "[kv_event_wire]") {
  KvWireStreamState state;
  decode_group({stored_in(7, 1, "full_attention")}, &state);
  const KvWireStreamState before = state;

  // A batch that would teach group 2, then fails on its second event.
  Buffer buf;
  msgpack::packer<Buffer> p(buf);
  p.pack_array(2);
  p.pack(1.0);
  p.pack_array(2);
  p.pack_map(6);
  p.pack(std::string("type"));
  p.pack(std::string("BlockStored"));
  p.pack(std::string("block_hashes"));
  p.pack(std::vector<std::uint64_t>{3});
  p.pack(std::string("token_ids"));
  p.pack(std::vector<std::uint32_t>{1, 2});
  p.pack(std::string("block_size"));
  p.pack(2U);
  p.pack(std::string("group_idx"));
  p.pack(2U);
  p.pack(std::string("kv_cache_spec_kind"));
  p.pack(std::string("full_attention"));
  p.pack_array(1);
  p.pack(42U);  // an event tag that is not a string
  KvWireBatch out;
  KvEventWireDecoder decoder;
  CHECK(decoder.decode(buf.data(), buf.size(), out, state).code == KvWireErrc::bad_event);
  CHECK(out.events.empty());
  CHECK(state == before);
  CHECK_FALSE(state.is_main_group(2).has_value());
  // The same through the free function, and for a payload that is not msgpack.
  const auto span = std::as_bytes(std::span<const char>(buf.data(), buf.size()));
  CHECK(promptcache::decode_kv_event_batch(span, out, state).code == KvWireErrc::bad_event);
  CHECK(promptcache::decode_kv_event_batch(span.first(span.size() - 1), out, state).code ==
        KvWireErrc::truncated);
  CHECK(state == before);
  // The decoder stays stateless for its next stateless decode.
  const Buffer removal = pack_group_batch({removed_in(7, 1)});
  CHECK(decoder.decode(removal.data(), removal.size(), out).ok());
  CHECK(out.events.empty());
  CHECK(promptcache::decode_kv_event_batch(
            std::as_bytes(std::span<const char>(removal.data(), removal.size())), out, state)
            .ok());
  CHECK(out.events.size() == 1);

  // A publisher restart: the new process may group its layers differently.
  state.reset();
  CHECK(state.known_groups() == 0);
  CHECK(state == KvWireStreamState());
  CHECK(decode_group({removed_in(7, 1)}, &state).events.empty());
}
