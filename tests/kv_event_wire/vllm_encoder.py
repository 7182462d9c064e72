#!/usr/bin/env python3
"""An encoder of vLLM's KV event classes written from their msgspec definitions
(vllm/distributed/kv_events.py), independent of kv_event_publisher.hpp, for
tests/test_kv_event_publisher.cpp to compare bytes with.

msgspec rules modelled here: a struct with array_like=False is a map of its
fields in declaration order, a tagged struct's "type" first; with
omit_defaults=True a field equal to its default is left out, a field without a
default is always written (None as nil). An array_like struct is an array of
every field in declaration order (msgspec omits no default there), a tagged one
starting with its tag. Tuples are arrays; integers take their smallest form;
floats 8 bytes; strings are str (str8 from 32 bytes on).

Usage: vllm_encoder.py SCENARIO.json
SCENARIO is a list of batches {"ts", "dp_rank", "events": [...]}, each event
{"kind": "stored", "hashes", "parent", "tokens", "block_size", "lora_name",
"lora_id", "cache_salt"} or {"kind": "removed", "hashes"} or {"kind": "cleared"}. Prints, per
batch, one line per layout: "<layout> <hex>", layouts map, array_map, array.
"""
import json
import sys

import msgpack

REQUIRED = object()

# (field, default) in declaration order; REQUIRED: no default.
EVENT_BATCH = [("ts", REQUIRED), ("events", REQUIRED), ("data_parallel_rank", None)]
BLOCK_STORED = [
    ("block_hashes", REQUIRED),
    ("parent_block_hash", REQUIRED),
    ("token_ids", REQUIRED),
    ("block_size", REQUIRED),
    ("lora_id", REQUIRED),
    ("medium", REQUIRED),
    ("lora_name", REQUIRED),
    ("extra_keys", None),
    ("group_idx", None),
    ("kv_cache_spec_kind", None),
    ("kv_cache_spec_sliding_window", None),
]
BLOCK_REMOVED = [("block_hashes", REQUIRED), ("medium", REQUIRED), ("group_idx", None)]
ALL_BLOCKS_CLEARED = []


def struct(fields, values, array_like, tag=None):
    if array_like:
        out = [] if tag is None else [tag]
        for name, default in fields:
            out.append(values.get(name, None if default is REQUIRED else default))
        return out
    out = {} if tag is None else {"type": tag}
    for name, default in fields:
        value = values.get(name, None if default is REQUIRED else default)
        if default is not REQUIRED and value == default:
            continue
        out[name] = value
    return out


def event(e, array_like):
    if e["kind"] == "stored":
        n = len(e["hashes"])
        lora = e.get("lora_name")
        salt = e.get("cache_salt")
        # vLLM lists, per block, the keys its hash covers besides the tokens
        # (a LoRA request's adapter name; a cache salt in the first block's,
        # here in the form Dynamo's vLLM integration gives it), None for a
        # block with none.
        extra = []
        for i in range(n):
            keys = ((lora,) if lora else ()) + (
                ("dynamo-cache-salt:" + salt,) if salt and i == 0 else ())
            extra.append(keys if keys else None)
        values = {
            "block_hashes": e["hashes"],
            "parent_block_hash": e.get("parent"),
            "token_ids": e["tokens"],
            "block_size": e["block_size"],
            "lora_id": e.get("lora_id"),
            "medium": "GPU",
            "lora_name": lora,
            "extra_keys": extra if extra else None,
            "group_idx": 0,
        }
        return struct(BLOCK_STORED, values, array_like, "BlockStored")
    if e["kind"] == "removed":
        values = {"block_hashes": e["hashes"], "medium": "GPU", "group_idx": 0}
        return struct(BLOCK_REMOVED, values, array_like, "BlockRemoved")
    return struct(ALL_BLOCKS_CLEARED, {}, array_like, "AllBlocksCleared")


def batch(b, batch_array, event_array):
    values = {
        "ts": float(b["ts"]),
        "events": [event(e, event_array) for e in b["events"]],
        "data_parallel_rank": b.get("dp_rank"),
    }
    return msgpack.packb(struct(EVENT_BATCH, values, batch_array), use_bin_type=True)


def main():
    with open(sys.argv[1]) as f:
        scenario = json.load(f)
    for b in scenario:
        for name, batch_array, event_array in (
            ("map", False, False),
            ("array_map", True, False),
            ("array", True, True),
        ):
            print(name, batch(b, batch_array, event_array).hex())


if __name__ == "__main__":
    main()
