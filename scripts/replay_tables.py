#!/usr/bin/python3
"""Reproduces the tables of docs/replay.md ("Five traffic shapes").

  scripts/replay_tables.py [--build-dir build/opt] [--out build/replay_tables]

Builds promptcache_replay in the build directory (configure it first, e.g.
`cmake --preset opt`: a Release build), generates the four synthetic shapes
with seeds 1, 2 and 3, and replays each trace and the shipped one under
`nice -n 10` with `--no-cluster --structures belady,paged` (seed 1 and the
shipped trace) or `belady,paged:lru,paged:adaptive` (seeds 2 and 3). Writes
every CSV and the traces to the output directory and prints the markdown
tables (seed 1 and the shipped trace) and one summary line per shape for
seeds 2 and 3. `--seeds 4,5 --no-shipped` checks other seeds the same way
(summary lines only; a seed of 1 in the list prints its tables).
`--default-run` also runs the tool with its defaults (every structure and
the cluster, on the shipped trace) into default.csv and default.txt, for the
results section and scripts/plot_replay.py, and the cluster with
`--worker-cache paged:adaptive` into cluster-adaptive.txt.

Aims checked for `adaptive` against `lru`, from the unrounded hit rates:
(b) more than 1% below lru; (a) under +10% where lru is under half the optimum.
"""
import argparse
import csv
import os
import re
import subprocess
import sys

SHAPES = ["conversation", "agent", "shared-prompts", "scan"]
POLICIES = ["lru", "lfu", "fifo", "slru", "mru", "filo", "adaptive"]  # priority == lru


def run(cmd, out=None):
    print("+", " ".join(cmd), file=sys.stderr)
    with open(out, "w") if out else open(os.devnull, "w") as f:
        subprocess.run(["nice", "-n", "10"] + cmd, check=True, stdout=f)


def capacity_name(tokens):
    return f"{tokens // 1000}K" if tokens < 1_000_000 else f"{tokens / 1e6:g}M"


def load(path):
    rates = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["section"] == "sweep":
                rates[(r["structure"], r["policy"], int(r["capacity_tokens"]))] = float(r["hit_rate"])
    return rates


def judge(rates, cap):
    lru, ada, opt = (rates[("paged", "lru", cap)], rates[("paged", "adaptive", cap)],
                     rates[("belady", "optimal", cap)])
    rel = ada / lru - 1 if lru > 0 else 0.0
    marks = []
    if rel < -0.01:
        marks.append("b")
    if lru < opt / 2 and rel < 0.10:
        marks.append("a")
    return rel, marks


def table(name, header, rates):
    caps = sorted({c for (_, _, c) in rates})
    lines = [f"### {name}", "", header, "",
             "| capacity | optimum | " + " | ".join(POLICIES) + " | adaptive vs lru |",
             "|---" * (len(POLICIES) + 3) + "|"]
    for c in caps:
        rel, marks = judge(rates, c)
        cells = [f"{rates[('belady', 'optimal', c)] * 100:.1f}%"]
        cells += [f"{rates[('paged', p, c)] * 100:.1f}%" for p in POLICIES]
        note = f" ({', '.join(marks)})" if marks else ""
        lines.append(f"| {capacity_name(c)} | " + " | ".join(cells) + f" | {rel * 100:+.1f}%{note} |")
    return "\n".join(lines) + "\n"


def summary(shape, seed, rates):
    caps = sorted({c for (_, _, c) in rates})
    rels = [(judge(rates, c), c) for c in caps]
    worst = min(rels, key=lambda x: x[0][0])
    below = [f"{capacity_name(c)} {r * 100:+.1f}%" for (r, m), c in rels if "b" in m]
    miss = [f"{capacity_name(c)} {r * 100:+.1f}%" for (r, m), c in rels if "a" in m]
    best = max(rels, key=lambda x: x[0][0])
    return (f"- `{shape}` seed {seed}: worst {worst[0][0] * 100:+.1f}% ({capacity_name(worst[1])}), "
            f"best {best[0][0] * 100:+.1f}% ({capacity_name(best[1])}); "
            f"below -1%: {', '.join(below) or 'none'}; under +10% where lru < optimum/2: "
            f"{', '.join(miss) or 'none'}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default="build/opt")
    ap.add_argument("--out", default="build/replay_tables")
    ap.add_argument("--default-run", action="store_true")
    ap.add_argument("--seeds", default="1,2,3", help="seeds of the generated shapes")
    ap.add_argument("--no-shipped", action="store_true", help="skip the shipped trace")
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.makedirs(a.out, exist_ok=True)
    subprocess.run(["nice", "-n", "10", "cmake", "--build", a.build_dir, "--target",
                    "promptcache_replay", "-j2"], check=True, stdout=subprocess.DEVNULL)
    tool = os.path.join(a.build_dir, "tools", "promptcache_replay")
    shipped = os.path.join(root, "tools", "replay", "data", "mooncake_synthetic_trace.jsonl")
    seeds = [int(x) for x in a.seeds.split(",")]
    traces = [] if a.no_shipped else [("mooncake (the shipped trace)", "mooncake", shipped, 1)]
    for shape in SHAPES:
        for seed in seeds:
            path = os.path.join(a.out, f"{shape}-{seed}.jsonl")
            run([tool, "generate", "--shape", shape, "--seed", str(seed)], path)
            traces.append((shape, shape, path, seed))
    out = []
    seeds23 = []
    for title, key, path, seed in traces:
        structures = "belady,paged" if seed == 1 else "belady,paged:lru,paged:adaptive"
        csv_path = os.path.join(a.out, f"{key}-{seed}.csv")
        txt_path = os.path.join(a.out, f"{key}-{seed}.txt")
        run([tool, "--trace", path, "--no-cluster", "--structures", structures, "--csv", csv_path],
            txt_path)
        rates = load(csv_path)
        if seed == 1:
            with open(txt_path) as f:
                m = re.search(r"(\d+) requests, (\d+) prompt tokens, (\d+) distinct blocks of (\d+) tokens",
                              f.read())
            header = f"{m.group(1)} requests, {m.group(2)} prompt tokens, {m.group(3)} distinct blocks of {m.group(4)} tokens"
            out.append(table(title, header, rates))
        else:
            seeds23.append(summary(key, seed, rates))
    if a.default_run:
        run([tool, "--csv", os.path.join(a.out, "default.csv")], os.path.join(a.out, "default.txt"))
        run([tool, "--no-sweep", "--worker-cache", "paged:adaptive"],
            os.path.join(a.out, "cluster-adaptive.txt"))
    print("\n".join(out))
    print("Other seeds:\n")
    print("\n".join(seeds23))


if __name__ == "__main__":
    main()
