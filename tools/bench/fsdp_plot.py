#!/usr/bin/env python3
"""Plot of `tdc bench fsdp`'s merged JSON: grouped bars of median step time per (model, world size)
for single-process, tdc DDP, tdc FSDP2 and PyTorch FSDP2, with the tdc FSDP2 / PyTorch FSDP2 ratio
written above each group.

    .venv/bin/python tools/bench/fsdp_plot.py --json FILE --png FILE
"""
import argparse
import json
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError as e:
    sys.exit(f"fsdp_plot.py: matplotlib is missing ({e}): run ./tdc setup, or "
             f"{sys.executable} -m pip install matplotlib")

SERIES = [  # (key in the case, label, colour)
    ("single_step_ms", "single process (tdc)", "#9e9e9e"),
    ("ddp_step_ms", "DDP (tdc)", "#64b5f6"),
    ("tdc_fsdp_step_ms", "FSDP2 (tdc)", "#1565c0"),
    ("pytorch_fsdp_step_ms", "FSDP2 (PyTorch fully_shard)", "#ef6c00"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--png", required=True)
    a = ap.parse_args()
    with open(a.json) as f:
        j = json.load(f)
    groups = []  # (label, case)
    for model, worlds in j["cases"].items():
        for world, c in sorted(worlds.items(), key=lambda kv: int(kv[0])):
            groups.append((f"{model}\nworld {world}", c))
    if not groups:
        sys.exit("fsdp_plot.py: no cases in " + a.json)

    width = 0.2
    fig, ax = plt.subplots(figsize=(2.6 * len(groups) + 1.5, 5.2), dpi=110)
    top = max(c.get(k, 0) or 0 for _, c in groups for k, _, _ in SERIES)
    for s, (key, label, colour) in enumerate(SERIES):
        xs = [g + (s - 1.5) * width for g in range(len(groups))]
        ys = [c.get(key, 0) or 0 for _, c in groups]
        bars = ax.bar(xs, ys, width, label=label, color=colour)
        for b, y in zip(bars, ys):
            ax.text(b.get_x() + b.get_width() / 2, y + top * 0.01, f"{y:.1f}", ha="center",
                    va="bottom", fontsize=7)
    for g, (_, c) in enumerate(groups):
        r = c.get("ratio")
        if r:
            ax.text(g, top * 1.12, f"tdc / PyTorch FSDP2\n= {r:.2f}", ha="center", va="bottom",
                    fontsize=9, fontweight="bold", color="#2e7d32" if r <= 1 else "#c62828")
    ax.set_xticks(range(len(groups)), [label for label, _ in groups])
    ax.set_ylabel("median step time (ms)")
    ax.set_ylim(0, top * 1.35)
    host = j.get("host", "?")
    ax.set_title(f"FSDP benchmark: forward + loss + backward + SGD step, {j.get('repeat', '?')} timed "
                 f"steps per case\n{host} ({j.get('cpus', '?')} CPUs), 1 thread per rank, Gloo, "
                 f"LibTorch {j.get('libtorch_version', '?')} / torch {j.get('torch_version', '?')}",
                 fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=8, ncol=4, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.png)


if __name__ == "__main__":
    main()
