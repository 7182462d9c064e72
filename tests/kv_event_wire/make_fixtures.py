#!/usr/bin/python3
"""Writes the KV event wire fixtures used by tests/test_kv_event_wire.cpp.

Each fixture is one KVEventBatch payload encoded the way msgspec encodes it
(floats as float64, integers in their shortest msgpack form, None as nil,
bytes as bin, struct fields in declaration order; array_like structs write
every field, map structs with omit_defaults drop fields equal to their
default), in one of the three layouts vLLM and SGLang publish:

  * array batch, array events (SGLang; vLLM up to about 0.11)
  * array batch, map events (recent vLLM)
  * map batch, map events (vLLM main)

Next to each <name>.msgpack goes <name>.golden, the expected decode in a
line format the C++ test reads (tokens are listed, not hashed: the test
hashes them with block_hash.hpp, whose Dynamo compatibility is tested on its
own):

  ts <float repr>
  dp_rank <n> | dp_rank none
  counts <unknown events> <ignored events> <dropped blocks>
  stored parent=<u64>|none lora=<name>|- eagle=<0|1> block_size=<n>
  block <u64 block hash> tokens <t...> [media <u64...>]
  removed <u64...>
  cleared                (AllBlocksCleared, or TierBlocksCleared of the GPU)

malformed.txt lists the payloads that must be rejected, with the error code.

Run with Debian's python3-msgpack: /usr/bin/python3 tests/kv_event_wire/make_fixtures.py
The output is deterministic.
"""
import pathlib
import random
import struct

import msgpack

OUT = pathlib.Path(__file__).resolve().parent
U64 = (1 << 64) - 1


def pack(obj):
    # msgspec's msgpack encoder: bin for bytes, float64, shortest ints.
    return msgpack.packb(obj, use_bin_type=True, use_single_float=False)


def name_of(h):
    """The 64-bit name the decoder must give a wire block hash."""
    if isinstance(h, bytes):
        return int.from_bytes(h, "big") & U64
    return h & U64  # signed hashes are taken as two's complement


class Stored:
    def __init__(self, hashes, parent, tokens, block_size, lora_id=None, medium="GPU",
                 lora_name=None, extra_keys=None, group_idx=None, spec_kind=None):
        self.hashes, self.parent, self.tokens = hashes, parent, tokens
        self.block_size, self.lora_id, self.medium = block_size, lora_id, medium
        self.lora_name, self.extra_keys = lora_name, extra_keys
        self.group_idx, self.spec_kind = group_idx, spec_kind

    def array(self, fields=9, extra=()):
        full = ["BlockStored", self.hashes, self.parent, self.tokens, self.block_size,
                self.lora_id, self.medium, self.lora_name, self.extra_keys,
                self.group_idx, self.spec_kind]
        return full[:fields] + list(extra)

    def map(self, type_at=0, extra=None):
        # vLLM's BlockStored: fields without a default are always written;
        # extra_keys, group_idx and the spec kind only when not None.
        m = [("block_hashes", self.hashes), ("parent_block_hash", self.parent),
             ("token_ids", self.tokens), ("block_size", self.block_size),
             ("lora_id", self.lora_id), ("medium", self.medium),
             ("lora_name", self.lora_name)]
        if self.extra_keys is not None:
            m.append(("extra_keys", self.extra_keys))
        if self.group_idx is not None:
            m.append(("group_idx", self.group_idx))
        if self.spec_kind is not None:
            m.append(("kv_cache_spec_kind", self.spec_kind))
        m += list((extra or {}).items())
        m.insert(type_at, ("type", "BlockStored"))
        return dict(m)


class Removed:
    def __init__(self, hashes, medium="GPU", group_idx=None):
        self.hashes, self.medium, self.group_idx = hashes, medium, group_idx

    def array(self, fields=3, extra=()):
        return (["BlockRemoved", self.hashes, self.medium, self.group_idx][:fields] + list(extra))

    def map(self, type_at=0, extra=None):
        m = [("block_hashes", self.hashes), ("medium", self.medium)]
        if self.group_idx is not None:
            m.append(("group_idx", self.group_idx))
        m += list((extra or {}).items())
        m.insert(type_at, ("type", "BlockRemoved"))
        return dict(m)


def golden(ts, dp_rank, expected, unknown=0, ignored=0, dropped=0):
    """expected: list of ("stored", Stored, kept_blocks, media_per_block, eagle)
    | ("removed", hashes) | ("cleared",)."""
    lines = [f"ts {ts!r}", f"dp_rank {dp_rank if dp_rank is not None else 'none'}",
             f"counts {unknown} {ignored} {dropped}"]
    for e in expected:
        if e[0] == "cleared":
            lines.append("cleared")
        elif e[0] == "removed":
            lines.append("removed " + " ".join(str(name_of(h)) for h in e[1]))
        else:
            _, s, kept, media, eagle = e
            parent = "none" if s.parent is None else str(name_of(s.parent))
            lora = s.lora_name if isinstance(s.lora_name, str) and s.lora_name else "-"
            lines.append(f"stored parent={parent} lora={lora} eagle={int(eagle)} "
                         f"block_size={s.block_size}")
            flat = s.tokens
            if eagle:  # [t, next] pairs -> firsts, then the last pair's second
                flat = [p[0] for p in s.tokens] + [s.tokens[-1][1]]
            bs = s.block_size
            for b in range(kept):
                window = flat[b * bs:(b + 1) * bs + (1 if eagle else 0)]
                line = f"block {name_of(s.hashes[b])} tokens " + " ".join(map(str, window))
                if media and b < len(media) and media[b]:
                    line += " media " + " ".join(str(m) for m in media[b])
                lines.append(line)
    return "\n".join(lines) + "\n"


def write(name, payload, gold):
    (OUT / f"{name}.msgpack").write_bytes(payload)
    (OUT / f"{name}.golden").write_text(gold)


def main():
    rng = random.Random(20260)

    def toks(n):
        return [rng.randrange(0, 1 << 17) for _ in range(n)]

    # 1. Old SGLang / vLLM: [ts, [events]], array events of six fields
    # (tag .. lora_id); SGLang's hashes are signed 64-bit.
    s1 = Stored([-5, -(1 << 63), 7], None, toks(12), 4, lora_id=None)
    s2 = Stored([(1 << 63) - 1], -5, toks(4), 4)
    events = [s1.array(fields=6), s2.array(fields=6), ["BlockRemoved", [7, -(1 << 63)]],
              ["AllBlocksCleared"]]
    ts = 1764590000.25
    write("sglang_array_v0", pack([ts, events]),
          golden(ts, None, [("stored", s1, 3, None, False), ("stored", s2, 1, None, False),
                            ("removed", [7, -(1 << 63)]), ("cleared",)]))

    # 2. SGLang with dp rank: medium, a LoRA name, and a version that puts a
    # metadata map where lora_name goes (not a LoRA name: unseeded).
    s1 = Stored([11, 12], None, toks(32), 16, lora_id=3, medium="GPU", lora_name="sql-adapter")
    s2 = Stored([13], 12, toks(16), 16, lora_id=None, medium="GPU",
                lora_name={"priority": 1, "tags": ["a"]})
    events = [s1.array(fields=8), s2.array(fields=8), Removed([12]).array(fields=2)]
    ts = 1764590001.5
    write("sglang_array_dp", pack([ts, events, 2]),
          golden(ts, 2, [("stored", s1, 2, None, False), ("stored", s2, 1, None, False),
                         ("removed", [12])]))

    # 3. vLLM array events with every field, unsigned hashes above 2^63,
    # extra_keys with multimodal identifiers (plain and [id, offset]), a
    # group index 0, extra trailing elements, an unknown event tag, and nil dp rank.
    mm1 = "ab" * 32
    mm2 = "0123456789abcdef" + "0" * 48
    s1 = Stored([U64, (1 << 63) + 1, 1 << 63], U64 - 1, toks(24), 8, lora_id=None,
                medium="GPU", lora_name=None,
                extra_keys=[[mm1], None, [[mm2, 3], "not-a-media-id", 17, b"\x01"]], group_idx=0)
    events = [s1.array(fields=10, extra=["full_attention", None, "future"]),
              ["BlockEvicted", [1, 2]],
              Removed([U64], medium=None).array(fields=4, extra=[None, 9])]
    ts = 1764590002.0
    media = [[int(mm1[:16], 16)], [], [int(mm2[:16], 16)]]
    write("vllm_array_events", pack([ts, events, None]),
          golden(ts, None, [("stored", s1, 3, media, False), ("removed", [U64])], unknown=1))

    # 4. Recent vLLM: array batch of map events; 32- and 16-byte hashes,
    # "type" not first, unknown keys, an unknown tag, a CPU-medium event
    # (ignored), a sliding-window group (ignored).
    h = [bytes(rng.randrange(256) for _ in range(32)) for _ in range(4)]
    h16 = bytes(rng.randrange(256) for _ in range(16))
    s1 = Stored(h[:2], None, toks(32), 16, medium="GPU", lora_name=None)
    s2 = Stored([h[2], h16], h[1], toks(33), 16, medium=None, lora_name="chat-lora")
    s_cpu = Stored([h[3]], None, toks(16), 16, medium="CPU")
    s_sw = Stored([h[3]], None, toks(16), 16, medium="GPU", group_idx=1,
                  spec_kind="sliding_window")
    events = [s1.map(type_at=0), s2.map(type_at=3, extra={"future_field": [1, {"x": None}]}),
              {"type": "BlockPinned", "block_hashes": [h[0]]}, s_cpu.map(),
              s_sw.map(type_at=5), Removed([h[0], h16]).map(type_at=2)]
    ts = 1764590003.75
    write("vllm_array_map_events", pack([ts, events, 1]),
          golden(ts, 1, [("stored", s1, 2, None, False), ("stored", s2, 2, None, False),
                         ("removed", [h[0], h16])], unknown=1, ignored=2))

    # 5. vLLM main: map batch, map events, defaults omitted (no dp rank, no
    # extra_keys), group 0 with a main-attention spec kind, a group 1 event
    # without a kind (ignored), a removal, then a clear.
    h = [bytes(rng.randrange(256) for _ in range(32)) for _ in range(3)]
    s1 = Stored(h[:2], None, toks(20), 10, lora_id=None, medium="GPU", lora_name=None,
                group_idx=0, spec_kind="mla_attention")
    s_g1 = Stored([h[2]], None, toks(10), 10, group_idx=1)
    events = [s1.map(), s_g1.map(), Removed([h[1]]).map(), {"type": "AllBlocksCleared"}]
    ts = 1764590004.125
    write("vllm_map_batch", pack({"ts": ts, "events": events}),
          golden(ts, None, [("stored", s1, 2, None, False), ("removed", [h[1]]), ("cleared",)],
                 ignored=1))

    # 6. Map batch in another key order with the dp rank, and Eagle
    # [token, next] pairs.
    pairs_flat = toks(9)
    pairs = [[pairs_flat[i], pairs_flat[i + 1]] for i in range(8)]
    s1 = Stored([101, 102], None, pairs, 4)
    ts = 1764590005.0
    write("vllm_map_batch_eagle",
          pack({"data_parallel_rank": 3, "events": [s1.map(type_at=1)], "ts": ts}),
          golden(ts, 3, [("stored", s1, 2, None, True)]))

    # 7. Incomplete tokens: the blocks past the last complete one are not
    # published; a stored event left with no block is ignored. Also a
    # shortest-possible array event (no lora_id) and a float32 timestamp.
    s1 = Stored([201, 202, 203], None, toks(10), 4)  # 2 full blocks of 4
    s2 = Stored([204], 203, toks(3), 4)              # none
    s3 = Stored([205], None, toks(4), 4)
    events = [s1.array(fields=6), s2.array(fields=6), s3.array(fields=5)]
    ts32 = struct.unpack(">f", struct.pack(">f", 1.5))[0]
    payload = b"\x93" + b"\xca" + struct.pack(">f", ts32) + pack(events) + pack(0)
    write("incomplete_tokens", payload,
          golden(ts32, 0, [("stored", s1, 2, None, False), ("stored", s3, 1, None, False)],
                 ignored=1, dropped=2))

    # 8. Empty events list, integer timestamp.
    write("empty_events", pack([1764590006, []]), golden(1764590006.0, None, []))

    # 9. A KV-offloading step: stores and removals on another medium (block
    # size 0, no token ids) among the step's GPU events, vLLM's BlockRemoved
    # with locality after group_idx, and tier-scoped clears of both media.
    s1 = Stored([301, 302], None, toks(8), 4)
    s2 = Stored([303], 302, toks(4), 4)
    events = [s1.array(fields=7),
              ["BlockStored", [77], None, [], 0, None, "CPU"],
              ["BlockStored", [78], None, [], 0, None, "GPU"],
              Removed([302], group_idx=0).array(fields=4, extra=("LOCAL",)),
              Removed([77], medium="CPU").array(),
              ["TierBlocksCleared", "CPU"],
              ["TierBlocksCleared", "GPU"],
              s2.array(fields=7)]
    ts = 1764590007.25
    write("vllm_offload_batch", pack([ts, events, 0]),
          golden(ts, 0, [("stored", s1, 2, None, False), ("removed", [302]), ("cleared",),
                         ("stored", s2, 1, None, False)], ignored=4, dropped=1))

    # 10. The same step with map events in a map batch (vLLM main).
    events = [s1.map(),
              Stored([77], None, [], 0, medium="CPU").map(),
              Removed([302], group_idx=0).map(extra={"locality": "LOCAL"}),
              {"type": "TierBlocksCleared", "medium": "CPU_TIER1"},
              {"type": "TierBlocksCleared", "medium": "GPU", "ownership": "kvcr"},
              s2.map()]
    write("vllm_offload_map_batch", pack({"ts": ts, "events": events, "data_parallel_rank": 0}),
          golden(ts, 0, [("stored", s1, 2, None, False), ("removed", [302]), ("cleared",),
                         ("stored", s2, 1, None, False)], ignored=2))

    # Malformed payloads and the error each must give.
    good = (OUT / "vllm_array_events.msgpack").read_bytes()
    bad = {
        "empty": (b"", "empty"),
        "truncated_half": (good[:len(good) // 2], "truncated"),
        "truncated_last_byte": (good[:-1], "truncated"),
        "reserved_byte": (b"\xc1", "invalid_msgpack"),
        "trailing_bytes": (good + b"\x00", "trailing_bytes"),
        "huge_array_length": (b"\x92\xcb" + struct.pack(">d", 1.0) + b"\xdd\xff\xff\xff\xff",
                              "truncated"),
        "huge_str_length": (b"\xdb\xff\xff\xff\xff" + b"ab", "truncated"),
        "huge_bin_length": (b"\x92\x01\x91\x92\xabBlockStored\xc6\xff\xff\xff\xf0", "truncated"),
        "deep_nesting": (b"\x91" * 4096 + b"\xc0", "too_deep"),
        "scalar_batch": (pack(42), "bad_batch"),
        "short_batch": (pack([1.0]), "bad_batch"),
        "ts_string": (pack(["now", []]), "bad_batch"),
        "events_not_array": (pack([1.0, {"a": 1}]), "bad_batch"),
        "dp_rank_negative": (pack([1.0, [], -1]), "bad_batch"),
        "dp_rank_too_big": (pack([1.0, [], 1 << 32]), "bad_batch"),
        "map_batch_without_events": (pack({"ts": 1.0}), "bad_batch"),
        "map_batch_without_ts": (pack({"events": []}), "bad_batch"),
        "event_scalar": (pack([1.0, [7]]), "bad_event"),
        "event_empty_array": (pack([1.0, [[]]]), "bad_event"),
        "event_tag_int": (pack([1.0, [[1, [2]]]]), "bad_event"),
        "event_map_without_type": (pack([1.0, [{"block_hashes": [1]}]]), "bad_event"),
        "stored_without_tokens": (pack([1.0, [["BlockStored", [1], None]]]), "bad_event"),
        "stored_without_block_size": (pack([1.0, [["BlockStored", [1], None, [1, 2]]]]),
                                      "bad_event"),
        "stored_hash_string": (pack([1.0, [["BlockStored", ["x"], None, [1], 1]]]), "bad_value"),
        "stored_hash_float": (pack([1.0, [["BlockStored", [1.5], None, [1], 1]]]), "bad_value"),
        "stored_hash_empty_bytes": (pack([1.0, [["BlockStored", [b""], None, [1], 1]]]),
                                    "bad_value"),
        "stored_parent_string": (pack([1.0, [["BlockStored", [1], "p", [1], 1]]]), "bad_value"),
        "stored_token_negative": (pack([1.0, [["BlockStored", [1], None, [-1], 1]]]), "bad_value"),
        "stored_token_too_big": (pack([1.0, [["BlockStored", [1], None, [1 << 32], 1]]]),
                                 "bad_value"),
        "stored_token_pair_short": (pack([1.0, [["BlockStored", [1], None, [[1]], 1]]]),
                                    "bad_value"),
        "stored_block_size_negative": (pack([1.0, [["BlockStored", [1], None, [1], -4]]]),
                                       "bad_value"),
        "stored_hashes_not_array": (pack([1.0, [["BlockStored", 5, None, [1], 1]]]), "bad_value"),
        "stored_lora_name_int": (pack([1.0, [["BlockStored", [1], None, [1], 1, None, "GPU", 7]]]),
                                 "bad_value"),
        "stored_lora_name_map_key": (pack([1.0, [{"type": "BlockStored", "block_hashes": [1],
                                                  "parent_block_hash": None, "token_ids": [1],
                                                  "block_size": 1, "lora_name": {"a": 1}}]]),
                                     "bad_value"),
        "stored_extra_keys_string": (pack([1.0, [{"type": "BlockStored", "block_hashes": [1],
                                                  "parent_block_hash": None, "token_ids": [1],
                                                  "block_size": 1, "extra_keys": "x"}]]),
                                     "bad_value"),
        "stored_extra_keys_entry_int": (
            pack([1.0, [["BlockStored", [1], None, [1], 1, None, "GPU", None, [3]]]]), "bad_value"),
        "tier_cleared_without_medium": (pack([1.0, [["TierBlocksCleared"]]]), "bad_event"),
        "tier_cleared_medium_int": (pack([1.0, [{"type": "TierBlocksCleared", "medium": 0}]]),
                                    "bad_value"),
        "removed_without_hashes": (pack([1.0, [["BlockRemoved"]]]), "bad_event"),
        "removed_hash_nil": (pack([1.0, [["BlockRemoved", [None]]]]), "bad_value"),
        "bad_second_event": (pack([1.0, [["AllBlocksCleared"], ["BlockRemoved", 3]]]),
                             "bad_value"),
    }
    lines = []
    for name, (payload, code) in bad.items():
        (OUT / f"malformed_{name}.msgpack").write_bytes(payload)
        lines.append(f"malformed_{name}.msgpack {code}")
    (OUT / "malformed.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
