#!/usr/bin/env python3
"""Plot of `tdc bench checkpoint`'s merged JSON: save and load throughput (MB/s) of tdc, PyTorch's DCP
HuggingFace writer/reader and dd, grouped by world size, with the ratios written above each group.

    .venv/bin/python bench/pytorch/checkpoint_plot.py --json FILE --png FILE
"""
import argparse
import json
import sys

from bench_common import import_pyplot  # noqa: E402

plt = import_pyplot("checkpoint_plot.py")

PANELS = [  # (title, [(key in the case, label, colour, hatch)], ratios: (key, label, target))
    ("save", [("tdc_save_mb_s", "tdc", "#1565c0", None),
              ("pytorch_save_mb_s", "PyTorch DCP HF writer", "#ef6c00", None),
              ("dd_write_mb_s", "dd write (conv=fsync)", "#9e9e9e", None)],
     [("save_vs_pytorch", "tdc / PyTorch", 1.0), ("save_vs_dd", "tdc / dd", 0.5)]),
    ("load (solid: files dropped from the page cache first; hatched: cached)",
     [("tdc_load_mb_s", "tdc", "#1565c0", None),
      ("pytorch_load_mb_s", "PyTorch DCP HF reader", "#ef6c00", None),
      ("dd_read_mb_s", "dd read (uncached)", "#9e9e9e", None),
      ("tdc_load_warm_mb_s", "tdc, warm (cached)", "#90caf9", "//"),
      ("pytorch_load_warm_mb_s", "PyTorch, warm (cached)", "#ffcc80", "//")],
     [("load_vs_pytorch", "tdc / PyTorch", 1.0), ("load_vs_dd", "tdc / dd", 0.5)]),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--png", required=True)
    a = ap.parse_args()
    with open(a.json) as f:
        j = json.load(f)
    worlds = sorted(j.get("cases", {}).items(), key=lambda kv: int(kv[0]))
    if not worlds:
        sys.exit("checkpoint_plot.py: no cases in " + a.json)

    fig, axes = plt.subplots(1, len(PANELS), figsize=(6.2 * len(PANELS), 5.4), dpi=110)
    for ax, (title, series, ratios) in zip(axes, PANELS):
        width = 0.8 / len(series)
        top = max((c.get(k) or 0) for _, c in worlds for k, _, _, _ in series) or 1
        for s, (key, label, colour, hatch) in enumerate(series):
            xs = [g + (s - (len(series) - 1) / 2) * width for g in range(len(worlds))]
            ys = [c.get(key) or 0 for _, c in worlds]
            bars = ax.bar(xs, ys, width, label=label, color=colour, hatch=hatch, edgecolor="white")
            for b, y in zip(bars, ys):
                ax.text(b.get_x() + b.get_width() / 2, y + top * 0.01, f"{y:.0f}", ha="center", va="bottom",
                        fontsize=7)
        for g, (_, c) in enumerate(worlds):
            lines, ok = [], True
            for key, label, target in ratios:
                r = c.get(key, 0)
                ok = ok and r >= target
                lines.append(f"{label} = {r:.2f} (target >= {target:g})")
            ax.text(g, top * 1.1, "\n".join(lines), ha="center", va="bottom", fontsize=8, fontweight="bold",
                    color="#2e7d32" if ok else "#c62828")
        ax.set_xticks(range(len(worlds)), [f"world {w}" for w, _ in worlds])
        ax.set_ylabel("MB/s (10^6 bytes of tensor data per second)")
        ax.set_ylim(0, top * 1.35)
        ax.set_title(title, fontsize=10)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.08), fontsize=8, ncol=3, frameon=False)
        ax.grid(axis="y", alpha=0.3)
    sd, disk = j.get("state_dict", {}), j.get("disk", {})
    fig.suptitle(f"Checkpoint benchmark: {sd.get('total_bytes', 0) / 1e6:.0f} MB float32 in "
                 f"{len(sd.get('tensors', []))} DTensors Shard(0); best of {j.get('repeat', '?')} call(s) x "
                 f"{j.get('rounds', 1)} round(s)\n{j.get('host', '?')} ({j.get('cpus', '?')} CPUs), "
                 f"{disk.get('fstype', '?')} on {disk.get('device', '?')}, Gloo, 1 thread per rank, "
                 f"LibTorch {j.get('libtorch_version', '?')} / torch {j.get('torch_version', '?')}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(a.png)


if __name__ == "__main__":
    main()
