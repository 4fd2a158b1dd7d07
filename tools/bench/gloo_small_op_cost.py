"""What one small collective costs in PyTorch's own Gloo, in wall time and in the CPU time of the
calling process (all its threads: the caller, Gloo's worker threads and its TCP loop), for the
choice of [Note: gathers by all-to-all] (tdc/comm/backend_registry.h; docs/bench/suite_time.md,
"Gathers by all-to-all").

    .venv/bin/python tools/bench/gloo_small_op_cost.py [--worlds 2,4] [--numel 16] [--calls 2000]

Per world size, spawned ranks with one thread each, a float32 tensor of --numel elements: each op
--calls times after 20 warm-up calls, two rounds; rank 0 prints wall, user and system time per
call (getrusage of the whole process). Ops: all_gather_into_tensor, the same by
all_to_all_single of the input repeated n times, all_reduce, all_to_all_single, broadcast,
barrier, and one isend + irecv per peer.
"""
import argparse
import os
import resource
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gloo_collectives import free_port  # this folder: the script's own


def ops(rank, world, numel):
    x = torch.randn(numel)
    out = torch.empty(numel * world)

    def by_alltoall():
        dist.all_to_all_single(out, x.repeat(world))

    def p2p():
        reqs = []
        for peer in range(world):
            if peer != rank:
                reqs.append(dist.isend(x, peer))
                reqs.append(dist.irecv(out[peer * numel:(peer + 1) * numel], peer))
        for r in reqs:
            r.wait()

    return {
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(out, x),
        "all-gather by all_to_all": by_alltoall,
        "all_reduce": lambda: dist.all_reduce(x),
        "all_to_all_single": lambda: dist.all_to_all_single(out, out.clone()),
        "broadcast": lambda: dist.broadcast(x, 0),
        "barrier": dist.barrier,
        "isend + irecv": p2p,
    }


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def run(rank, world, port, numel, calls):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    for round_ in range(2):
        for name, fn in ops(rank, world, numel).items():
            for _ in range(20):
                fn()
            dist.barrier()
            (u0, s0), t0 = cpu_s(), time.perf_counter()
            for _ in range(calls):
                fn()
            wall, (u1, s1) = time.perf_counter() - t0, cpu_s()
            if rank == 0:
                print(f"world {world} round {round_ + 1} {name:26s} wall {wall / calls * 1e6:7.1f} us"
                      f"  user {(u1 - u0) / calls * 1e6:6.1f} us  system {(s1 - s0) / calls * 1e6:6.1f} us",
                      flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", default="2,4")
    p.add_argument("--numel", type=int, default=16)
    p.add_argument("--calls", type=int, default=2000)
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for world in [int(w) for w in a.worlds.split(",")]:
        mp.spawn(run, args=(world, free_port(), a.numel, a.calls), nprocs=world)


if __name__ == "__main__":
    main()
