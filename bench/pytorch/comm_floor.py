#!/usr/bin/env python3
"""The collectives of one MLPStack training step alone, on PyTorch's own Gloo: what DDP and FSDP2
move at world 2 with no model, no copies and no hooks (docs/bench/README.md, "What FSDP2's step
spends beyond DDP's").

    .venv/bin/python bench/pytorch/comm_floor.py [--case ddp|fsdp|both] [--steps N]

MLPStack(256)'s three blocks hold 394,240, 525,568 and 394,240 float32 parameters (5.26 MB).
  * ddp: the two bucket all-reduces of DDP (the first bucket 1 MiB, as DDP's first bucket cap,
    then the rest);
  * fsdp: FSDP2's nine collectives with every block resharded after forward: the all-gathers of
    blocks 1, 2, 3 (forward), then per block 3, 2, 1 its all-gather and its reduce-scatter
    (backward). At two ranks tdc runs both as one all-to-all each ([Note: a two-rank gather sends
    its input as it is] and [Note: a reduce-scatter by all-to-all, in the ring's order] in
    impl/comm), so this does the same with all_to_all_single.
Two ranks (torch.multiprocessing spawn), Gloo over TCP on 127.0.0.1, one intra-op thread each;
20 warm-up steps, then N timed ones; prints rank 0's median step in ms. Run it under
`/usr/bin/time` once per case to get the CPU time it takes (user + system, both ranks, minus a
run of `--case none` for the start-up).
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BLOCKS = [394240, 525568, 394240]
FIRST_BUCKET = 262144  # 1 MiB of float32


def ddp_step(flat):
    first, rest = flat[:FIRST_BUCKET].clone(), flat[FIRST_BUCKET:].clone()
    dist.all_reduce(first)
    dist.all_reduce(rest)


def gather(rank, out, shard):
    # The two-rank gather: the shard to the peer, the peer's shard into its half of `out`.
    n = shard.numel()
    splits = [0, 0]
    splits[1 - rank] = n
    dist.all_to_all_single(out.narrow(0, (1 - rank) * n, n), shard, splits, splits)


def fsdp_step(rank, gathers, scatters):
    for n in BLOCKS:
        gather(rank, *gathers[n])
    for n in reversed(BLOCKS):
        gather(rank, *gathers[n])
        grads, reduced = scatters[n]
        dist.all_to_all_single(reduced, grads)


def run(rank, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    flat = torch.randn(sum(BLOCKS))
    gathers = {n: (torch.empty(n), torch.randn(n // 2)) for n in BLOCKS}
    scatters = {n: (torch.randn(n), torch.empty(n)) for n in BLOCKS}
    steps = {
        "none": lambda: None,
        "ddp": lambda: ddp_step(flat),
        "fsdp": lambda: fsdp_step(rank, gathers, scatters),
    }
    for case in ["ddp", "fsdp"] if args.case == "both" else [args.case]:
        step = steps[case]
        for _ in range(20):
            step()
        dist.barrier()
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        times.sort()
        if rank == 0:
            print(f"{case}: median {1e3 * times[len(times) // 2]:.2f} ms over {args.steps} steps", flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", choices=["ddp", "fsdp", "both", "none"], default="both")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--port", type=int, default=29611)
    args = p.parse_args()
    mp.spawn(run, args=(args,), nprocs=2)


if __name__ == "__main__":
    main()
