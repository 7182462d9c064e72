#!/usr/bin/python3
"""Plots of promptcache_replay's CSV output (--csv FILE).

  scripts/plot_replay.py replay.csv [--out DIR]

writes DIR/replay_hit_rate.png (prompt tokens served from cache vs capacity,
one line per structure and policy, Belady's bound dashed) and
DIR/replay_routing.png (the cluster's routing policies side by side).
Needs matplotlib (Debian: python3-matplotlib, for /usr/bin/python3).
"""
import argparse
import csv
import os
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot_replay.py: matplotlib is missing (apt-get install python3-matplotlib)")


def load(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def plot_sweep(rows, out):
    sweep = [r for r in rows if r["section"] == "sweep"]
    if not sweep:
        return None
    series = {}
    for r in sweep:
        name = r["structure"] if r["policy"] in ("-", "optimal") else f'{r["structure"]}:{r["policy"]}'
        series.setdefault(name, []).append(
            (int(r["capacity_tokens"]) / 1e6, 100.0 * float(r["hit_rate"]))
        )
    fig, ax = plt.subplots(figsize=(9, 5.5))
    ax.set_prop_cycle(color=plt.get_cmap("tab20").colors)
    for name, pts in series.items():
        pts.sort()
        xs, ys = zip(*pts)
        style = dict(marker="o", markersize=3, linewidth=1.2)
        if name == "belady":
            style.update(color="black", linestyle="--", linewidth=1.8, label="Belady (offline optimum)")
        else:
            style["label"] = name
        ax.plot(xs, ys, **style)
    ax.set_xscale("log")
    ax.set_xlabel("cache capacity (million tokens)")
    ax.set_ylabel("prompt tokens served from cache (%)")
    ax.set_title("Hit rate vs capacity, one engine")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    fig.tight_layout()
    path = os.path.join(out, "replay_hit_rate.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_cluster(rows, out):
    runs = [r for r in rows if r["section"] == "cluster"]
    if not runs:
        return None
    names = [r["policy"] for r in runs]
    metrics = [
        ("hit rate (%)", [100.0 * float(r["hit_rate"]) for r in runs]),
        ("prefill tokens (M)", [int(r["computed_tokens"]) / 1e6 for r in runs]),
        ("imbalance (max/mean busy)", [float(r["imbalance"]) for r in runs]),
        ("TTFT proxy p50 / p99 (s)", None),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(13, 3.8))
    colors = ["#8c8c8c", "#5b8bd9", "#e0a030", "#3aa655"]
    for ax, (title, values) in zip(axes, metrics):
        if values is None:
            p50 = [float(r["ttft_p50_s"]) for r in runs]
            p99 = [float(r["ttft_p99_s"]) for r in runs]
            x = range(len(names))
            ax.bar([i - 0.2 for i in x], p50, width=0.4, label="p50", color="#5b8bd9")
            ax.bar([i + 0.2 for i in x], p99, width=0.4, label="p99", color="#d9534f")
            ax.set_xticks(list(x))
            ax.legend(fontsize=7)
        else:
            ax.bar(range(len(names)), values, color=colors[: len(names)])
            ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    r0 = runs[0]
    fig.suptitle(
        f'Routing over {r0["workers"]} workers x {int(r0["capacity_tokens"]) / 1e6:g}M tokens ({r0["structure"]})',
        fontsize=10,
    )
    fig.tight_layout()
    path = os.path.join(out, "replay_routing.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="CSV written by promptcache_replay --csv")
    ap.add_argument("--out", default=".", help="directory for the PNG files (default: .)")
    a = ap.parse_args()
    rows = load(a.csv)
    os.makedirs(a.out, exist_ok=True)
    written = [p for p in (plot_sweep(rows, a.out), plot_cluster(rows, a.out)) if p]
    if not written:
        sys.exit("plot_replay.py: no sweep or cluster rows in " + a.csv)
    for p in written:
        print(p)


if __name__ == "__main__":
    main()
