#!/usr/bin/env python3
"""Plot of `tdc bench pipelining`'s merged JSON: per pp size, grouped bars of the median step time
of each schedule (tdc vs PyTorch) with the ratio above each group; and a panel with each schedule's
bubble fraction (from its compute order, unit-time actions) at each pp size.

    .venv/bin/python bench/pytorch/pipelining_plot.py --json FILE --png FILE
"""
import argparse
import json
import sys

from bench_common import import_pyplot  # noqa: E402

plt = import_pyplot("pipelining_plot.py")

SERIES = [  # (key in the case, label, colour)
    ("tdc_step_ms", "tdc", "#1565c0"),
    ("pytorch_step_ms", "PyTorch torch.distributed.pipelining", "#ef6c00"),
]
PP_COLOURS = ["#7e57c2", "#26a69a", "#8d6e63"]


def short(name):
    return name.replace("Schedule", "").replace("Interleaved", "Interleaved\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--png", required=True)
    a = ap.parse_args()
    with open(a.json) as f:
        j = json.load(f)
    pps = sorted(j.get("cases", {}), key=int)
    if not pps:
        sys.exit("pipelining_plot.py: no cases in " + a.json)
    # The JSON's keys are sorted; "schedules" keeps the order the benchmark ran them in.
    schedules = [n for n in j.get("schedules", []) if n in j["cases"][pps[0]]] or list(j["cases"][pps[0]])

    fig, axes = plt.subplots(1, len(pps) + 1, figsize=(6.2 * len(pps) + 4.5, 5.4), dpi=110,
                             gridspec_kw={"width_ratios": [3] * len(pps) + [2]})
    top = max(c.get(k, 0) or 0 for pp in pps for c in j["cases"][pp].values() for k, _, _ in SERIES)
    width = 0.8 / len(SERIES)
    for ax, pp in zip(axes, pps):
        cases = j["cases"][pp]
        for s, (key, label, colour) in enumerate(SERIES):
            xs = [g + (s - (len(SERIES) - 1) / 2) * width for g in range(len(schedules))]
            ys = [cases[n].get(key, 0) or 0 for n in schedules]
            bars = ax.bar(xs, ys, width, label=label, color=colour)
            for b, y in zip(bars, ys):
                ax.text(b.get_x() + b.get_width() / 2, y + top * 0.01, f"{y:.0f}", ha="center", va="bottom",
                        fontsize=7)
        for g, n in enumerate(schedules):
            r = cases[n].get("ratio")
            if r:
                ax.text(g, top * 1.1, f"tdc / PyTorch\n= {r:.2f}", ha="center", va="bottom", fontsize=8,
                        fontweight="bold", color="#2e7d32" if r <= 1 else "#c62828")
        ax.set_xticks(range(len(schedules)), [short(n) for n in schedules], fontsize=8)
        ax.set_ylim(0, top * 1.35)
        ax.set_ylabel("median step time (ms)")
        ax.set_title(f"pp {pp} (world {pp}; multi-stage schedules: 2 stages per rank)", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(loc="upper left", fontsize=8, frameon=False)

    ax = axes[-1]
    bw = 0.8 / len(pps)
    for i, pp in enumerate(pps):
        xs = [g + (i - (len(pps) - 1) / 2) * bw for g in range(len(schedules))]
        ys = [j["cases"][pp][n].get("bubble_fraction", 0) for n in schedules]
        bars = ax.bar(xs, ys, bw, label=f"pp {pp}", color=PP_COLOURS[i % len(PP_COLOURS)])
        for b, y in zip(bars, ys):
            ax.text(b.get_x() + b.get_width() / 2, y + 0.005, f"{y:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(schedules)), [short(n) for n in schedules], fontsize=8)
    ax.set_ylabel("bubble fraction")
    ax.set_ylim(0, max(0.1, max(c.get("bubble_fraction", 0) for pp in pps for c in j["cases"][pp].values()) * 1.3))
    ax.set_title("bubble fraction: idle / total slots of the compute order\n(unit-time F, B, I, W; mean over ranks)",
                 fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8, frameon=False)

    m = j.get("model", {})
    fig.suptitle(
        f"Pipelining benchmark: {m.get('layers', '?')}-layer MLP (hidden {m.get('hidden', '?')}), batch "
        f"{m.get('global_batch', '?')}, {m.get('n_microbatches', '?')} microbatches; schedule.step + SGD step, "
        f"{j.get('repeat', '?')} timed steps per case, median over {j.get('rounds', 1)} round(s)\n"
        f"{j.get('host', '?')} ({j.get('cpus', '?')} CPUs), 1 thread per rank, Gloo, LibTorch "
        f"{j.get('libtorch_version', '?')} / torch {j.get('torch_version', '?')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(a.png)


if __name__ == "__main__":
    main()
