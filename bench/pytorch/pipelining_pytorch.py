#!/usr/bin/env python3
"""PyTorch side of `tdc bench pipelining`: step time of PyTorch's own torch.distributed.pipelining.

Run by the tdc CLI with the project's venv (.venv/bin/python, torch 2.13 CPU):

    .venv/bin/python bench/pytorch/pipelining_pytorch.py --out FILE [--repeat N] [--warmup W]
                                                         [--hidden H] [--pp-sizes 2,4]

The model, batch, placement and step are those of bench/cpp/bench_pipelining.cpp:
  * 8 layers of test_composability.py's MLPModule(H) (net1 Linear(H, H), ReLU, net2 Linear(H, H),
    kaiming-uniform weights), H = 512 by default; global batch 64 rows, n_microbatches 8 (8 rows
    each); loss = test_composability.py's loss_fn (cross_entropy with soft targets * 1e-4);
  * plain stages (no data parallelism: world = pp); single-stage schedules (ScheduleGPipe,
    Schedule1F1B) put stage r on rank r; multi-stage ones (ScheduleInterleaved1F1B,
    ScheduleLoopedBFS, ScheduleInterleavedZeroBubble) put 2 stages on each rank, stage r + pp * i
    (the loop placement); every stage holds 8 / num_stages consecutive layers.
A step is schedule.step (rank 0 the input, the last rank the target) + torch.optim.SGD(lr=1e-3)
over the rank's stage modules + zero_grad(set_to_none). Per pp size: pp processes
(torch.multiprocessing spawn), Gloo over a FileStore in a temp dir, torch.set_num_threads(1) per
rank; each schedule in turn: W untimed warm-up steps (the first infers the shapes), N timed ones,
rank 0's median (rank 0 runs the first stage, which starts a step first and ends it last).
Progress goes to stderr (a line per case); the JSON (schema: docs/results-schema.md, "Pipelining
benchmark", "pytorch" part) goes to --out.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
from bench_common import write_json  # noqa: E402

# The models: fixtures/golden/pytorch_fixtures.py, one module for every Python side of tdc.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "fixtures", "golden"))
from pytorch_fixtures import loss_fn  # noqa: E402
from pytorch_fixtures import MLPModuleComposability as MLPModule  # noqa: E402  (test_composability.py's)

LR = 1e-3
TOTAL_LAYERS = 8
GLOBAL_BATCH = 64
N_MICROBATCHES = 8
STAGES_PER_RANK_MULTI = 2
SCHEDULES = ["ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleLoopedBFS",
             "ScheduleInterleavedZeroBubble"]
SINGLE_STAGE = {"ScheduleGPipe", "Schedule1F1B"}


def p90(v):
    v = sorted(v)
    k = max(1, min(len(v), -(-9 * len(v) // 10)))  # nearest rank, as tdc's bench_common.h
    return v[k - 1]


def run_schedule(name, rank, pp, hidden, warmup, repeat):
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as S
    torch.manual_seed(1234)  # the same model on every rank
    layers = [MLPModule(hidden) for _ in range(TOTAL_LAYERS)]
    per_rank = 1 if name in SINGLE_STAGE else STAGES_PER_RANK_MULTI
    num_stages = pp * per_rank
    per_stage = TOTAL_LAYERS // num_stages
    stages, modules = [], []
    for i in range(per_rank):
        idx = rank + pp * i
        module = nn.Sequential(*layers[idx * per_stage:(idx + 1) * per_stage])
        modules.append(module)
        stages.append(PipelineStage(module, idx, num_stages, torch.device("cpu")))
    del layers
    cls = getattr(S, name)
    schedule = cls(stages[0] if per_rank == 1 else stages, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn)
    opt = torch.optim.SGD([p for m in modules for p in m.parameters()], lr=LR)
    g = torch.Generator().manual_seed(4321)
    x = torch.randn(GLOBAL_BATCH, hidden, generator=g)
    target = torch.rand(GLOBAL_BATCH, hidden, generator=g)
    ms = []
    dist.barrier()
    for i in range(warmup + repeat):
        t0 = time.perf_counter()
        if rank == 0:
            schedule.step(x)
        elif rank == pp - 1:
            schedule.step(target=target)
        else:
            schedule.step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t = (time.perf_counter() - t0) * 1e3
        if i >= warmup:
            ms.append(t)
    return ms, sum(p.numel() for m in modules for p in m.parameters())


def rank_main(rank, pp, store_path, result_path, hidden, warmup, repeat):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=pp,
                            timeout=datetime.timedelta(seconds=300))
    try:
        results = {}
        for name in SCHEDULES:
            t0 = time.perf_counter()
            ms, _ = run_schedule(name, rank, pp, hidden, warmup, repeat)
            results[name] = {"step_ms": statistics.median(ms), "p90_ms": p90(ms),
                             "stages_per_rank": 1 if name in SINGLE_STAGE else STAGES_PER_RANK_MULTI}
            if rank == 0:
                print(f"[pytorch] pp {pp} {name:<30} ... {results[name]['step_ms']:.2f} ms/step  "
                      f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
            dist.barrier()
        if rank == 0:
            with open(result_path, "w") as f:
                json.dump(results, f)
    finally:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--pp-sizes", default="2,4")
    a = ap.parse_args()
    if a.repeat < 1 or a.warmup < 1 or a.hidden < 1:
        ap.error("--repeat, --warmup and --hidden must be >= 1 (the first step infers the shapes)")
    pps = [int(p) for p in a.pp_sizes.split(",") if p]
    torch.set_num_threads(1)
    start = time.perf_counter()
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    params = sum(p.numel() for p in MLPModule(a.hidden).parameters()) * TOTAL_LAYERS

    cases = {}
    with tempfile.TemporaryDirectory(prefix="tdc-bench-pipelining-py-") as tmp:
        for pp in pps:
            store = os.path.join(tmp, f"store-{pp}")
            result = os.path.join(tmp, f"result-{pp}.json")
            mp.start_processes(rank_main, args=(pp, store, result, a.hidden, a.warmup, a.repeat),
                               nprocs=pp, join=True, start_method="spawn")
            with open(result) as f:
                cases[str(pp)] = json.load(f)

    out = {
        "cases": cases,
        "model": {"layers": TOTAL_LAYERS, "hidden": a.hidden, "params": params, "global_batch": GLOBAL_BATCH,
                  "n_microbatches": N_MICROBATCHES},
        "pp_sizes": pps,
        "schedules": SCHEDULES,
        "repeat": a.repeat,
        "warmup": a.warmup,
        "step": "schedule.step + torch.optim.SGD(lr=1e-3) step, zero_grad(set_to_none)",
        "backend": "gloo",
        "launcher": "torch.multiprocessing spawn",
        "threads_per_rank": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "started_at": started_at,
        "duration_s": time.perf_counter() - start,
    }
    write_json(a.out, out)


if __name__ == "__main__":
    main()
