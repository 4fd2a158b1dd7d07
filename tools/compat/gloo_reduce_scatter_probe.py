"""Does this PyTorch's Gloo reduce_scatter_tensor honour the op? ([Note: Gloo's reduce-scatter
honours the op], impl/include/tdc/libtorch_compat.h)

Run with the PyTorch to probe (no GPU needed):
    .venv-2.11.0/bin/python tools/compat/gloo_reduce_scatter_probe.py
Two Gloo ranks reduce-scatter [r+1, 10(r+1), -r, 5] with SUM, MAX and MIN in float32, bfloat16
and float16 and compare every rank's chunk with the expected one. Exit 0 when all are right,
1 (listing the wrong ones) otherwise.
"""
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def expected(op, index):
    values = [[r + 1.0, 10.0 * (r + 1), -r, 5.0] for r in range(WORLD)]
    column = [v[index] for v in values]
    return {"SUM": sum(column), "MAX": max(column), "MIN": min(column)}[op]


def rank_main(rank, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    wrong = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for op in ("SUM", "MAX", "MIN"):
            x = torch.tensor([rank + 1.0, 10.0 * (rank + 1), -rank, 5.0], dtype=dtype)
            y = torch.empty(2, dtype=dtype)
            dist.reduce_scatter_tensor(y, x, op=getattr(dist.ReduceOp, op))
            want = [expected(op, 2 * rank + i) for i in range(2)]
            if y.float().tolist() != want:
                wrong.append(f"rank {rank} {dtype} {op}: got {y.float().tolist()}, want {want}")
    queue.put(wrong)
    dist.destroy_process_group()


def main():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, port, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    wrong = [w for _ in procs for w in queue.get(timeout=120)]
    for p in procs:
        p.join()
    print(f"torch {torch.__version__}: Gloo reduce_scatter_tensor", "honours the op" if not wrong else "is WRONG:")
    for w in wrong:
        print("  " + w)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
