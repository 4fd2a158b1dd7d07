#!/usr/bin/env python3
"""Plot of `tdc bench fsdp`'s (and `fsdp1`'s) merged JSON: grouped bars of median step time per
(model, world size) for single-process, tdc DDP, tdc FSDP2 (and with its comm checks off) and PyTorch
FSDP2 -- or FSDP1 on both sides, as the JSON's "fsdp" says -- with the ratios written above each group
(tdc / PyTorch, and tdc's FSDP / tdc's DDP; green where the target is met).

    .venv/bin/python bench/pytorch/fsdp_plot.py --json FILE --png FILE
"""
import argparse
import json
import sys

from bench_common import import_pyplot  # noqa: E402

plt = import_pyplot("fsdp_plot.py")

SERIES = [  # (key in the case, label ({v}: FSDP2 or FSDP1), colour)
    ("single_step_ms", "single process (tdc)", "#9e9e9e"),
    ("ddp_step_ms", "DDP (tdc)", "#64b5f6"),
    ("tdc_fsdp_step_ms", "{v} (tdc)", "#1565c0"),
    ("tdc_fsdp_nochecks_step_ms", "{v} (tdc, comm checks off)", "#5c6bc0"),
    ("pytorch_fsdp_step_ms", "{v} (PyTorch {api})", "#ef6c00"),
]
PYTORCH_API = {"FSDP2": "fully_shard", "FSDP1": "FullyShardedDataParallel"}
DDP_TARGET = 1.5  # tdc FSDP step <= 1.5 x tdc DDP step (cli/bench/fsdp.cpp's kFsdpOverDdpTarget)


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

    v = j.get("fsdp", "FSDP2")
    series = [(k, label.format(v=v, api=PYTORCH_API.get(v, "?")), colour) for k, label, colour in SERIES
              if any(k in c for _, c in groups)]
    width = 0.8 / len(series)
    # At least 9 inches wide, so that the title and a legend of five entries fit over one or two groups.
    fig, ax = plt.subplots(figsize=(max(2.6 * len(groups) + 1.5, 9.0), 5.2), dpi=110)
    top = max(c.get(k, 0) or 0 for _, c in groups for k, _, _ in SERIES)
    text_size = 7 if len(groups) * 5 <= 20 else 6
    for s, (key, label, colour) in enumerate(series):
        xs = [g + (s - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ys = [c.get(key, 0) or 0 for _, c in groups]
        bars = ax.bar(xs, ys, width, label=label, color=colour)
        for b, y in zip(bars, ys):
            ax.text(b.get_x() + b.get_width() / 2, y + top * 0.01, f"{y:.0f}", ha="center",
                    va="bottom", fontsize=text_size)
    for g, (_, c) in enumerate(groups):
        r = c.get("ratio")
        if r:
            nc = c.get("ratio_nochecks")
            extra = f"\n(checks off: {nc:.2f})" if nc else ""
            ax.text(g, top * 1.08, f"tdc / PyTorch {v}\n= {r:.2f}{extra}", ha="center", va="bottom",
                    fontsize=9, fontweight="bold", color="#2e7d32" if r <= 1 else "#c62828")
        d = c.get("fsdp_over_ddp")
        if d:
            ax.text(g, top * 1.36, f"{v} / DDP = {d:.2f}", ha="center", va="bottom", fontsize=9,
                    fontweight="bold", color="#2e7d32" if d <= DDP_TARGET else "#c62828")
    ax.set_xticks(range(len(groups)), [label for label, _ in groups])
    ax.set_ylabel("median step time (ms)")
    ax.set_ylim(0, top * 1.5)
    host = j.get("host", "?")
    ax.set_title(f"{v} benchmark: forward + loss + backward + SGD step, {j.get('repeat', '?')} timed "
                 f"steps per case, median over {j.get('rounds', 1)} round(s)\n{host} ({j.get('cpus', '?')} CPUs), 1 thread per rank, Gloo, "
                 f"LibTorch {j.get('libtorch_version', '?')} / torch {j.get('torch_version', '?')}",
                 fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=8, ncol=min(len(series), 3),
              frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.png)


if __name__ == "__main__":
    main()
