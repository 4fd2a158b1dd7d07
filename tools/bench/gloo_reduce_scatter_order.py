"""Whether PyTorch's Gloo reduce-scatter sums in the order tdc's reduce-scatter by all-to-all
assumes ([Note: a reduce-scatter by all-to-all, in the ring's order], tdc/comm/backend_registry.h;
impl/comm/ring_order.cpp; docs/bench/README.md, "A reduce-scatter by all-to-all at any world size").

    .venv/bin/python tools/bench/gloo_reduce_scatter_order.py [--worlds 3,4,5]

Per world size, spawned ranks call dist.reduce_scatter_tensor (SUM) on values whose sums round
(randn * e^(4 randn)) in four dtypes and twelve sizes per rank, and compare the result bit for bit
with the fold of Gloo's ring all-reduce (gloo/allreduce.cc, `ring`): segments of at most 1 MiB,
at least two per rank, a multiple of n in all; rank b's run of segments is summed starting from
rank b-1's values and going down the ring to rank b. Prints, per world, the elements that differ
(0 expected) and, for comparison, how many differ from a sum in rank order.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gloo_collectives import free_port  # this folder: the script's own

SIZES = [1, 2, 3, 7, 100, 1001, 16384, 65536, 100003, 262144, 300001, 600000]
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
MAX_SEGMENT_BYTES = 1024 * 1024  # gloo::AllreduceOptions::kMaxSegmentSize


def ring_block_numel(total_numel, elem, n):
    total_bytes = total_numel * elem
    max_segment = elem * max(1, MAX_SEGMENT_BYTES // elem)
    segments = max(-(-total_bytes // max_segment), 2 * n)
    segments = -(-segments // n) * n
    segment_bytes = -(-(-(-total_bytes // segments)) // elem) * elem
    return segments // n * segment_bytes // elem


def ring_fold(xs, rank, n):
    chunk = xs[0].numel() // n
    block = ring_block_numel(xs[0].numel(), xs[0].element_size(), n)
    out = torch.empty(chunk, dtype=xs[0].dtype)
    pos, last = rank * chunk, (rank + 1) * chunk
    while pos < last:
        b = pos // block
        end = min(last, (b + 1) * block)
        s = slice(pos, end)
        acc = xs[(b - 1) % n][s].clone()
        for j in range(2, n + 1):
            acc = acc + xs[(b - j) % n][s]
        out[pos - rank * chunk:end - rank * chunk] = acc
        pos = end
    return out


def bits(t):
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


def worker(rank, n, port, queue):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    differ = rank_order_differ = total = 0
    for dtype in DTYPES:
        for chunk in SIZES:
            g = torch.Generator().manual_seed(1000 * chunk + 7)
            xs = [(torch.randn(n * chunk, generator=g) * torch.exp(4 * torch.randn(n * chunk, generator=g))).to(dtype)
                  for _ in range(n)]
            out = torch.empty(chunk, dtype=dtype)
            reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # 2.13 renamed it
            reduce_scatter(out, xs[rank].clone())
            differ += int((bits(out) != bits(ring_fold(xs, rank, n))).sum())
            rank_order = xs[0][rank * chunk:(rank + 1) * chunk].clone()
            for k in range(1, n):
                rank_order = rank_order + xs[k][rank * chunk:(rank + 1) * chunk]
            rank_order_differ += int((bits(out) != bits(rank_order)).sum())
            total += chunk
    queue.put((rank, differ, rank_order_differ, total))
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="3,4,5")
    args = parser.parse_args()
    torch.set_num_threads(1)
    failed = False
    for n in [int(w) for w in args.worlds.split(",")]:
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        port = free_port()
        procs = [ctx.Process(target=worker, args=(r, n, port, queue)) for r in range(n)]
        for p in procs:
            p.start()
        results = sorted(queue.get() for _ in procs)
        for p in procs:
            p.join()
        differ = sum(r[1] for r in results)
        print(f"world {n}: {differ} of {sum(r[3] for r in results)} elements differ from the ring's fold "
              f"(rank order: {sum(r[2] for r in results)} differ)")
        failed |= differ != 0
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
