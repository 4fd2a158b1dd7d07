"""What PyTorch's Gloo collectives cost on this machine, and whether its reduce-scatter is an
all-reduce ([Note: a reduce-scatter by all-to-all, in the ring's order], tdc/comm/backend_registry.h;
docs/bench/README.md, "Gloo's reduce-scatter").

    .venv/bin/python tools/bench/gloo_collectives.py [--worlds 2,3,4]

Per world size, spawned ranks with one thread each time, for several full-tensor sizes (median
of 30 calls after 5 warm-up calls, rank 0's clock): all_gather_into_tensor, the same by
all_to_all_single (the shard copied n times first), reduce_scatter_tensor, the same by
all_to_all_single plus a sum of the n received rows, and all_reduce. Then, on values whose sums
round, whether reduce_scatter_tensor's result equals all_reduce's chunk bit for bit.
"""
import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [65536, 656_000, 1_314_048]  # floats of the full tensor: 0.26, 2.6 and 5.3 MB


def median_ms(fn, calls=30):
    for _ in range(5):
        fn()
    dist.barrier()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[calls // 2] * 1e3


def timings(rank, world):
    for numel in SIZES:
        numel = numel // world * world
        full, shard = torch.randn(numel), torch.randn(numel // world)
        received, repeated = torch.empty(numel), torch.empty(numel)

        def all_gather_by_alltoall():
            repeated.view(world, -1).copy_(shard.expand(world, -1))
            dist.all_to_all_single(full, repeated)

        def reduce_scatter_by_alltoall():
            dist.all_to_all_single(received, full)
            torch.sum(received.view(world, -1), 0, out=shard)

        ms = [
            median_ms(lambda: dist.all_gather_into_tensor(full, shard)),
            median_ms(all_gather_by_alltoall),
            median_ms(lambda: dist.reduce_scatter_tensor(shard, full)),
            median_ms(reduce_scatter_by_alltoall),
            median_ms(lambda: dist.all_reduce(full)),
        ]
        if rank == 0:
            print(f"| {world} | {numel * 4 / 1e6:.2f} MB | " + " | ".join(f"{m:.2f} ms" for m in ms) + " |",
                  flush=True)


def reduce_scatter_is_all_reduce(rank, world):
    gen = torch.Generator().manual_seed(7 + rank)
    n = 4096 * world
    x = torch.randn(n, generator=gen) * torch.logspace(-6, 6, n)[torch.randperm(n, generator=gen)]
    out = torch.empty(n // world)
    dist.reduce_scatter_tensor(out, x.clone())
    reduced = x.clone()
    dist.all_reduce(reduced)
    same = torch.tensor([int(torch.equal(out, reduced.view(world, -1)[rank]))])
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    if rank == 0:
        print(f"world {world}: reduce_scatter_tensor == all_reduce's chunk on every rank: {bool(same.item())}",
              flush=True)


def rank_main(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    timings(rank, world)
    reduce_scatter_is_all_reduce(rank, world)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", default="2,3,4", help="comma-separated world sizes (default 2,3,4)")
    args = parser.parse_args()
    print("| world | full tensor | all-gather | by all-to-all | reduce-scatter | by all-to-all | all-reduce |")
    print("|---|---|---|---|---|---|---|")
    for world in [int(w) for w in args.worlds.split(",")]:
        mp.spawn(rank_main, args=(world, free_port()), nprocs=world)


if __name__ == "__main__":
    main()
