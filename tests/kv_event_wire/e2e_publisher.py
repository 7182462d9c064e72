#!/usr/bin/python3
"""KV event publishers for the end-to-end subscriber test.

Speaks the vLLM / SGLang ZeroMQ protocol: a PUB socket sending
[topic, seq (8 bytes big-endian), payload] and a ROUTER replay socket that
answers [client, empty, start] with [client, empty, seq, payload] for every
buffered batch with seq >= start, then [client, empty, -1, empty]. The PUB is
an XPUB so that publishing starts only once the subscriber's subscription has
arrived (no sleeping for the slow-joiner problem); to a SUB it is the same.

Three publishers run a generated engine workload (a prefix cache storing
chains of blocks, evicting leaves, sometimes clearing). Their steps also
carry a KV-offloading tier's events in the same batches: stores of GPU
blocks on a CPU medium with block size 0 and no token ids, and removals
there, which the subscriber must skip while applying the step's GPU events.

  A  SGLang-style (array batch, array events, signed int hashes, dp rank 0;
     its engine clears its cache now and then; removals carry group_idx and
     vLLM's locality after the medium):
     drops seq 10 and seqs 40-42 (replayed), repeats an old batch, then
     restarts at seq 0 with its first two batches lost (replayed from the new
     buffer) and its wall clock stepped back an hour.
  B  vLLM-style (map batch, map events, 32-byte hashes, dp rank 1; clears
     only once, late, so only the subscriber's reset can drop what it held
     before): drops seq 5 (replayed), repeats an old batch, loses a run
     longer than its replay buffer (unrecoverable: the subscriber resets B
     and continues from the oldest buffered batch), then resets its GPU
     prefix cache with a tier-scoped clear (TierBlocksCleared, GPU, next to
     a CPU tier's).
  C  vLLM-style, dp rank 2, joined late: it published more batches than its
     replay buffer holds before the subscriber connected, so the subscriber
     catches up from the oldest buffered batch and counts the gap as
     unrecoverable.

After each deliberate loss it waits for the subscriber's replay request, so
the outcome does not depend on timing. It prints one line with the six
endpoints, writes the expectation file (what an index fed only the kept
batches must equal, the counters the subscriber must show, the engine's own
GPU block count where the subscriber must know it exactly, and for C the
prefixes stored after the join), prints DONE, and keeps answering replays
until its stdin closes.

Usage: e2e_publisher.py <expectation-file>
"""
import random
import sys

import msgpack
import zmq

BLOCK_SIZE = 4
BUFFER_STEPS = 16
WAIT_MS = 20000
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True, use_single_float=False)


class Engine:
    """A prefix cache: blocks form chains; events describe its changes."""

    def __init__(self, rng, hash_kind, clear_prob):
        self.rng, self.hash_kind, self.clear_prob = rng, hash_kind, clear_prob
        self.blocks = {}     # name -> (parent name | None, full token prefix)
        self.children = {}   # name -> set of child names
        self.prefixes = []   # every stored prefix, for the final queries
        self.stored_at = {}  # name -> seq of the batch that stored it
        self.cur_seq = 0

    def new_name(self):
        while True:
            if self.hash_kind == "signed":
                n = self.rng.randrange(-(1 << 63), 1 << 63)
            else:
                n = bytes(self.rng.randrange(256) for _ in range(32))
            if n not in self.blocks:
                return n

    def step(self):
        """A list of (kind, fields) events for one batch."""
        events = []
        for _ in range(self.rng.randrange(1, 4)):
            r = self.rng.random()
            if r < self.clear_prob and self.blocks:
                self.blocks.clear()
                self.children.clear()
                events.append(("cleared", None))
            elif r < 0.30 and self.blocks:
                leaves = [b for b in self.blocks if not self.children.get(b)]
                gone = self.rng.sample(leaves, min(len(leaves), self.rng.randrange(1, 3)))
                for b in gone:
                    parent = self.blocks.pop(b)[0]
                    if parent is not None:
                        self.children[parent].discard(b)
                    self.children.pop(b, None)
                events.append(("removed", gone))
            else:
                parent = None
                prefix = []
                if self.blocks and self.rng.random() < 0.7:
                    parent = self.rng.choice(sorted(self.blocks, key=repr))
                    prefix = list(self.blocks[parent][1])
                n = self.rng.randrange(1, 4)
                tokens = [self.rng.randrange(0, 1000) for _ in range(n * BLOCK_SIZE)]
                names = []
                up = parent
                for i in range(n):
                    name = self.new_name()
                    prefix += tokens[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE]
                    self.blocks[name] = (up, list(prefix))
                    self.stored_at[name] = self.cur_seq
                    self.children.setdefault(up, set()).add(name)
                    up = name
                    names.append(name)
                self.prefixes.append(list(prefix))
                events.append(("stored", (names, parent, tokens)))
                if n >= 2:  # the offloading connector copies them to its CPU tier
                    events.append(("offloaded", names))
        return events

    def tier_clear(self):
        """A GPU prefix-cache reset that leaves the offload tier alone."""
        self.blocks.clear()
        self.children.clear()
        return [("tier_cleared", "CPU_TIER1"), ("tier_cleared", "GPU")]

    def chain(self, name):
        out = []
        while name is not None:
            out.append(name)
            name = self.blocks[name][0]
        return out[::-1]


def encode_sglang(ts, events, dp_rank):
    out = []
    for kind, f in events:
        if kind == "stored":
            names, parent, tokens = f
            out.append(["BlockStored", names, parent, tokens, BLOCK_SIZE, None, "GPU", None])
        elif kind == "removed":
            out.append(["BlockRemoved", f, "GPU", 0, "LOCAL"])
            out.append(["BlockRemoved", f[:1], "CPU_TIER1"])
        elif kind == "offloaded":
            out.append(["BlockStored", f, None, [], 0, None, "CPU_TIER1", None])
        elif kind == "tier_cleared":
            out.append(["TierBlocksCleared", f])
        else:
            out.append(["AllBlocksCleared"])
    return pack([ts, out, dp_rank])


def encode_vllm(ts, events, dp_rank):
    out = []
    for kind, f in events:
        if kind == "stored":
            names, parent, tokens = f
            out.append({"type": "BlockStored", "block_hashes": names, "parent_block_hash": parent,
                        "token_ids": tokens, "block_size": BLOCK_SIZE, "lora_id": None,
                        "medium": "GPU", "lora_name": None})
        elif kind == "removed":
            out.append({"type": "BlockRemoved", "block_hashes": f, "medium": "GPU"})
        elif kind == "offloaded":
            out.append({"type": "BlockStored", "block_hashes": f, "parent_block_hash": None,
                        "token_ids": [], "block_size": 0, "lora_id": None, "medium": "CPU",
                        "lora_name": None})
        elif kind == "tier_cleared":
            out.append({"type": "TierBlocksCleared", "medium": f})
        else:
            out.append({"type": "AllBlocksCleared"})
    return pack({"ts": ts, "events": out, "data_parallel_rank": dp_rank})


class Publisher:
    def __init__(self, ctx, rng, worker_id, dp_rank, style):
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.SNDHWM, 100000)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind("tcp://127.0.0.1:*")
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind("tcp://127.0.0.1:*")
        self.worker_id, self.dp_rank, self.style = worker_id, dp_rank, style
        # B and C never clear at random: what the subscriber held before B's
        # lost run must be gone only because of the reset.
        self.engine = Engine(rng, "signed" if style == "sglang" else "bytes",
                             0.02 if style == "sglang" else 0.0)
        self.old_prefixes = []  # prefixes stored before a restart
        self.seq = 0
        self.buffer = []      # (seq, payload), at most BUFFER_STEPS
        self.kept = []        # payloads an index fed after the last reset applies
        self.requests = 0
        self.counts = {"duplicates": 0, "restarts": 0, "recovered": 0, "unrecoverable": 0,
                       "resets": 0}
        self.exact = True     # the subscriber's view must equal the engine's blocks
        self.join_seq = None  # C: the oldest batch the subscriber could get
        self.ts = 1764600000.0 + worker_id

    def endpoints(self):
        return [self.pub.getsockopt(zmq.LAST_ENDPOINT).decode(),
                self.router.getsockopt(zmq.LAST_ENDPOINT).decode()]

    def make_batch(self, tier_clear=False):
        """The next batch: encoded, buffered, kept; returns (seq, payload)."""
        self.ts += 0.001
        self.engine.cur_seq = self.seq
        events = self.engine.step()
        if tier_clear:
            events += self.engine.tier_clear() + self.engine.step()
        enc = encode_sglang if self.style == "sglang" else encode_vllm
        payload = enc(self.ts, events, self.dp_rank)
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        del self.buffer[:-BUFFER_STEPS]
        self.kept.append(payload)
        return seq, payload

    def send(self, seq, payload):
        self.pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload])

    def step(self, drop=False, tier_clear=False):
        seq, payload = self.make_batch(tier_clear)
        if not drop:
            self.send(seq, payload)

    def serve_replay(self):
        client, _, start = self.router.recv_multipart()
        start = int.from_bytes(start, "big")
        for seq, payload in self.buffer:
            if seq >= start:
                self.router.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
        self.router.send_multipart([client, b"", END_SEQ, b""])
        self.requests += 1

    def restart(self):
        """A new engine process: empty cache, seq from 0, empty buffer."""
        self.old_prefixes += self.engine.prefixes
        self.engine = Engine(self.engine.rng, self.engine.hash_kind, self.engine.clear_prob)
        self.ts -= 3600.0  # its wall clock stepped back: timestamps are no evidence
        self.seq = 0
        self.buffer = []
        self.kept = []


def serve_until(pubs, cond, what):
    poller = zmq.Poller()
    for p in pubs:
        poller.register(p.router, zmq.POLLIN)
    while not cond():
        ready = dict(poller.poll(WAIT_MS))
        if not ready:
            sys.exit(f"e2e_publisher: timed out waiting for {what}")
        for p in pubs:
            if p.router in ready:
                p.serve_replay()


def serve_pending(pubs):
    for p in pubs:
        while p.router.poll(0):
            p.serve_replay()


def wait_for_subscriber(p):
    if not p.pub.poll(WAIT_MS):
        sys.exit("e2e_publisher: no subscriber")
    p.pub.recv()  # the subscription message


def main():
    out_path = sys.argv[1]
    rng = random.Random(1234)
    ctx = zmq.Context()
    a = Publisher(ctx, rng, worker_id=7, dp_rank=0, style="sglang")
    b = Publisher(ctx, rng, worker_id=7, dp_rank=1, style="vllm")
    c = Publisher(ctx, rng, worker_id=7, dp_rank=2, style="vllm")
    pubs = [a, b, c]
    # C publishes before anyone listens: 40 batches, more than its buffer.
    for _ in range(40):
        c.make_batch()
    c.exact = False  # its view lacks what was stored before the join
    print(" ".join(a.endpoints() + b.endpoints() + c.endpoints()), flush=True)
    for p in pubs:
        wait_for_subscriber(p)

    def lose(p, count):
        """Drops the next `count` batches, sends the one after and waits for
        the replay request it causes."""
        for _ in range(count):
            p.step(drop=True)
        before = p.requests
        p.step()
        serve_until(pubs, lambda: p.requests > before, "a replay request")

    for i in range(100):
        for p in pubs:
            if p is a and i == 10:
                lose(a, 1)
                a.counts["recovered"] += 1
            elif p is a and i == 40:
                lose(a, 3)
                a.counts["recovered"] += 1
            elif p is b and i == 5:
                lose(b, 1)
                b.counts["recovered"] += 1
            elif p is a and i == 25 or p is b and i == 31:
                old = p.buffer[-4]
                p.send(*old)  # a late duplicate of an applied batch
                p.counts["duplicates"] += 1
                p.step()
            elif p is c and i == 0:
                # The first live message: a gap from 0 that the buffer no
                # longer covers; the subscriber takes what is buffered.
                lose(c, 0)
                c.counts["unrecoverable"] += 1
                c.join_seq = c.seq - BUFFER_STEPS
                c.kept = c.kept[-BUFFER_STEPS:]
            elif p is b and i == 80:
                b.step(tier_clear=True)
            elif p is b and i == 50:
                lose(b, BUFFER_STEPS + 2)
                b.counts["unrecoverable"] += 1
                b.counts["resets"] += 1
                # The subscriber resets B and continues from the oldest batch
                # still buffered when it asked.
                b.kept = b.kept[-BUFFER_STEPS:]
            elif p is a and i == 70:
                a.restart()
                lose(a, 2)
                a.counts["restarts"] += 1
                a.counts["resets"] += 1
                a.counts["recovered"] += 1  # the lost first two batches of the new run
            else:
                p.step()
        # Replay requests the subscriber makes on its own are served as well.
        serve_pending(pubs)

    with open(out_path, "w") as f:
        f.write(f"block_size {BLOCK_SIZE}\n")
        for p in pubs:
            n = p.counts
            gpu = str(len(p.engine.blocks)) if p.exact else "-"
            f.write(f"worker {p.worker_id} {p.dp_rank} last_seq {p.seq - 1} duplicates "
                    f"{n['duplicates']} restarts {n['restarts']} recovered {n['recovered']} "
                    f"unrecoverable {n['unrecoverable']} resets {n['resets']} gpu_blocks {gpu}\n")
            for payload in p.kept:
                f.write("payload " + payload.hex() + "\n")
            for q in p.old_prefixes + p.engine.prefixes:
                f.write("query " + " ".join(map(str, q)) + "\n")
            if p.join_seq is None:
                continue
            # The engine's chains now, by where they started: stored in full
            # after the join, or extending a prefix stored before it.
            e = p.engine
            for leaf in sorted((x for x in e.blocks if not e.children.get(x)), key=repr):
                chain = e.chain(leaf)
                if e.stored_at[leaf] < p.join_seq:
                    continue
                kind = ("routable" if all(e.stored_at[x] >= p.join_seq for x in chain)
                        else "extends")
                names = " ".join(x.hex() if isinstance(x, bytes) else str(x) for x in chain)
                f.write(f"{kind} {len(chain)} " + " ".join(map(str, e.blocks[leaf][1])) +
                        " names " + names + "\n")
    print("DONE", flush=True)

    poller = zmq.Poller()
    for p in pubs:
        poller.register(p.router, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    while True:
        ready = dict(poller.poll(WAIT_MS * 3))
        if not ready or sys.stdin.fileno() in ready:
            break  # stdin closed (or the test is gone)
        for p in pubs:
            if p.router in ready:
                p.serve_replay()
    for p in pubs:
        p.pub.close()
        p.router.close()
    ctx.term()


if __name__ == "__main__":
    main()
