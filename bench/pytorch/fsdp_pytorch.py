#!/usr/bin/env python3
"""PyTorch side of `tdc bench fsdp` / `fsdp1`: step time of PyTorch's own FSDP2 (torch.distributed.fsdp.fully_shard) or FSDP1 (FullyShardedDataParallel).

Run by the tdc CLI with the project's venv (.venv/bin/python, torch 2.13 CPU):

    .venv/bin/python bench/pytorch/fsdp_pytorch.py --out FILE [--repeat N] [--warmup W] [--fsdp1]

The models, batches and step are those of bench/cpp/bench_fsdp.cpp:
  * MLPStack(256) (common_fsdp.py's, i.e. MLP(256, x3), MLP(256), MLP(256, x3)), global batch 64,
    MSE loss on [B, 256];
  * Transformer(ModelArgs(n_layers=2, vocab_size=512, max_seq_len=64, dim=128, n_heads=4,
    dropout_p=0, weight tying)) (common_dtensor.py's), global batch 16, token cross-entropy.
The model classes are PyTorch's own test fixtures, loaded the way
fixtures/golden/pytorch_fixtures.py loads them (its loader is imported from there).

A step is forward + loss + backward + torch.optim.SGD(lr=1e-3).step() + zero_grad(set_to_none).
World sizes 2 and 4: world_size processes (torch.multiprocessing spawn), Gloo over a FileStore in
a temp dir, fully_shard on every block and then the root (--fsdp1: FullyShardedDataParallel around
the model with ModuleWrapPolicy on the block class, device_id cpu, FSDP1's defaults otherwise:
FULL_SHARD, BACKWARD_PRE, use_orig_params=False), global_batch / world_size samples per
rank, torch.set_num_threads(1) per rank; W untimed warm-up steps, N timed ones, rank 0's median.
The single-process reference (the whole global batch, plain module) runs in this process.
Progress goes to stderr (a line per case); the JSON (schema: docs/results-schema.md, "FSDP
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "fixtures", "golden"))

os.environ.setdefault("OMP_NUM_THREADS", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from bench_common import write_json  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

LR = 1e-3
MLP_DIM = 256
TF_ARGS = dict(n_layers=2, vocab_size=512, max_seq_len=64, dim=128, n_heads=4, dropout_p=0.0,
               weight_tying=True)
MODELS = {  # name -> global batch
    "MLPStack": 64,
    "Transformer": 16,
}


def fixture_modules():
    import pytorch_fixtures as g  # PyTorch's own fixture classes, loaded from the wheel
    return g.fsdp_module(), g.dtensor_module()


def build(name, fs, dt):
    torch.manual_seed(1234)  # the same initial weights on every rank
    if name == "MLPStack":
        return fs.MLPStack(MLP_DIM)
    return dt.Transformer(dt.ModelArgs(**TF_ARGS))


def blocks(name, model):
    return list(model.children()) if name == "MLPStack" else list(model.layers)


def make_batch(name, batch, rank):
    g = torch.Generator().manual_seed(4321 + rank)
    if name == "MLPStack":
        return torch.randn(batch, MLP_DIM, generator=g), torch.randn(batch, MLP_DIM, generator=g)
    v, s = TF_ARGS["vocab_size"], TF_ARGS["max_seq_len"]
    return (torch.randint(v, (batch, s), generator=g), torch.randint(v, (batch, s), generator=g))


def loss_of(y, target):
    if target.dtype == torch.long:
        return F.cross_entropy(y.flatten(0, 1), target.flatten())
    return F.mse_loss(y, target)


def time_steps(model, inp, target, warmup, repeat, barrier=None):
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ms = []
    if barrier:
        barrier()
    for i in range(warmup + repeat):
        t0 = time.perf_counter()
        loss = loss_of(model(inp), target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t = (time.perf_counter() - t0) * 1e3
        if i >= warmup:
            ms.append(t)
    return ms


def p90(v):
    v = sorted(v)
    k = max(1, min(len(v), -(-9 * len(v) // 10)))  # nearest rank, as tdc's bench_common.h
    return v[k - 1]


def shard(name, model, fs, dt, fsdp1):
    """The model to train: FSDP2 per block and root (in place), or an FSDP1 wrapper."""
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    if fsdp1:
        block = fs.MLP if name == "MLPStack" else dt.TransformerBlock
        return FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({block}),
                                        device_id=torch.device("cpu"))
    for b in blocks(name, model):
        fully_shard(b)
    fully_shard(model)
    return model


def rank_main(rank, world, store_path, result_path, warmup, repeat, fsdp1):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    try:
        fs, dt = fixture_modules()
        results = {}
        for name, global_batch in MODELS.items():
            t0 = time.perf_counter()
            model = shard(name, build(name, fs, dt), fs, dt, fsdp1)
            inp, target = make_batch(name, global_batch // world, rank)
            ms = time_steps(model, inp, target, warmup, repeat, barrier=dist.barrier)
            results[name] = {"fsdp_step_ms": statistics.median(ms), "fsdp_p90_ms": p90(ms),
                             "local_batch": global_batch // world}
            if rank == 0:
                print(f"[pytorch] {name:<11} {'fsdp1' if fsdp1 else 'fsdp'}   world {world} ... "
                      f"{results[name]['fsdp_step_ms']:.2f} ms/step  ({time.perf_counter() - t0:.1f} s)",
                      file=sys.stderr, flush=True)
            del model
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
    ap.add_argument("--world-sizes", default="2,4")
    ap.add_argument("--fsdp1", action="store_true", help="time FSDP1 (FullyShardedDataParallel), not FSDP2")
    a = ap.parse_args()
    if a.repeat < 1 or a.warmup < 0:
        ap.error("--repeat must be >= 1 and --warmup >= 0")
    worlds = [int(w) for w in a.world_sizes.split(",") if w]
    torch.set_num_threads(1)
    start = time.perf_counter()
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")

    fs, dt = fixture_modules()
    models, cases = {}, {}
    for name, global_batch in MODELS.items():
        t0 = time.perf_counter()
        model = build(name, fs, dt)
        inp, target = make_batch(name, global_batch, 0)
        ms = time_steps(model, inp, target, a.warmup, a.repeat)
        models[name] = {"global_batch": global_batch,
                        "params": sum(p.numel() for p in model.parameters()),
                        "single_step_ms": statistics.median(ms)}
        print(f"[pytorch] {name:<11} single world 1 ... {models[name]['single_step_ms']:.2f} ms/step  "
              f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
        cases[name] = {}

    with tempfile.TemporaryDirectory(prefix="tdc-bench-fsdp-py-") as tmp:
        for world in worlds:
            store = os.path.join(tmp, f"store-{world}")
            result = os.path.join(tmp, f"result-{world}.json")
            mp.start_processes(rank_main, args=(world, store, result, a.warmup, a.repeat, a.fsdp1),
                               nprocs=world, join=True, start_method="spawn")
            with open(result) as f:
                for name, r in json.load(f).items():
                    cases[name][str(world)] = r

    out = {
        "models": models,
        "cases": cases,
        "world_sizes": worlds,
        "fsdp": "FSDP1" if a.fsdp1 else "FSDP2",
        "repeat": a.repeat,
        "warmup": a.warmup,
        "step": "forward + loss + backward + torch.optim.SGD(lr=1e-3) step, zero_grad(set_to_none)",
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
