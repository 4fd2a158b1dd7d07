#!/usr/bin/env python3
"""PyTorch side of `tdc bench checkpoint`: save and load throughput of PyTorch's DCP HuggingFace writer/reader.

Run by the tdc CLI with the project's venv (.venv/bin/python, torch 2.13 CPU, safetensors):

    .venv/bin/python bench/pytorch/checkpoint_pytorch.py --out FILE --dir DIR [--mb MB] [--repeat N]

The state dict is that of bench/cpp/bench_checkpoint.cpp (layout() below is its kLayers rule):
8 layers, each "layers.<i>.weight" float32 [rows_i, 1024] and "layers.<i>.bias" float32 [rows_i],
rows_i odd (4k+1 or 4k+3, so that no world size of 2 or 4 divides it) and large enough that the 16
tensors hold at least MB * 10^6 bytes. Every entry is a DTensor Shard(0) over a 1-D CPU mesh of the
world, laid out as FSDP2 shards a parameter (torch.chunk rows: ceil(rows / world) per rank, the
last rank fewer), built with DTensor.from_local (random normal values, a generator per rank).

Per world size (2 and 4; world_size processes started with torch.multiprocessing spawn, Gloo over a
FileStore, torch.set_num_threads(1) per rank), N repeats of:
  * save: dcp.save(sd, storage_writer=HuggingFaceStorageWriter(d, save_distributed=True)) into a
    fresh directory d under DIR (files fsynced: FileSystemWriter's sync_files default);
  * cold load: every file of d dropped from the page cache (fsync + posix_fadvise DONTNEED; mincore
    measures what stayed resident), then dcp.load(target, storage_reader=HuggingFaceStorageReader(d))
    into a second state dict of the same layout;
  * warm load: the same load again, the files now in the page cache.
Each call is timed from the end of a barrier to its return; a repeat's figure is the slowest rank's
time (all-reduce MAX), the case's figure the best over repeats. The first load is checked bit-exact
against the saved values. Progress goes to stderr; the JSON (docs/results-schema.md, "Checkpoint
benchmark", "pytorch" part) goes to --out.
"""
import argparse
import ctypes
import ctypes.util
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from bench_common import write_json  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

N_LAYERS = 8
COLS = 1024
ITEMSIZE = 4  # float32


def layout(mb):
    """[(key, shape)]: bench_checkpoint.cpp's rule (its layout())."""
    budget = mb * 1_000_000 // N_LAYERS  # bytes per layer (weight + bias)
    base = -(-budget // (ITEMSIZE * (COLS + 1)))
    out = []
    for i in range(N_LAYERS):
        rows = (base // 4) * 4 + (1 if i % 2 == 0 else 3)
        if rows < base:
            rows += 4
        out.append((f"layers.{i}.weight", [rows, COLS]))
        out.append((f"layers.{i}.bias", [rows]))
    return out


def total_bytes(lay):
    n = 0
    for _, shape in lay:
        e = 1
        for s in shape:
            e *= s
        n += e * ITEMSIZE
    return n


def local_rows(n, world, rank):
    """Shard(0)'s rows of `rank` (torch.chunk: ceil(n / world) per rank, the last ones fewer)."""
    c = -(-n // world)
    lo = min(rank * c, n)
    return lo, min(lo + c, n)


# ---------------------------------------------------------------- page cache

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
PROT_READ, MAP_SHARED = 1, 1
PAGE = os.sysconf("SC_PAGE_SIZE")


def files_of(d):
    return sorted(os.path.join(d, f) for f in os.listdir(d) if os.path.isfile(os.path.join(d, f)))


def evict(d):
    """Drops every file of d from the page cache (clean pages only, hence the fsync)."""
    for path in files_of(d):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident(d):
    """(resident pages, pages) of the files of d, by mincore."""
    res = total = 0
    for path in files_of(d):
        size = os.path.getsize(path)
        if size == 0:
            continue
        pages = (size + PAGE - 1) // PAGE
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = _libc.mmap(None, size, PROT_READ, MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap {path}")
            try:
                vec = (ctypes.c_ubyte * pages)()
                if _libc.mincore(addr, size, vec) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore {path}")
                res += sum(1 for v in vec if v & 1)
            finally:
                _libc.munmap(addr, size)
        finally:
            os.close(fd)
        total += pages
    return res, total


def dir_bytes(d):
    return sum(os.path.getsize(p) for p in files_of(d))


# ---------------------------------------------------------------- ranks

def rank_main(rank, world, store_path, base, result_path, mb, repeat):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    try:
        mesh = init_device_mesh("cpu", (world,))
        g = torch.Generator().manual_seed(1234 + rank)
        sd, target = {}, {}
        for key, shape in layout(mb):
            lo, hi = local_rows(shape[0], world, rank)
            local_shape = [hi - lo] + shape[1:]
            stride = tuple(COLS if len(shape) == 2 and d == 0 else 1 for d in range(len(shape)))
            sd[key] = DTensor.from_local(torch.randn(local_shape, generator=g), mesh, [Shard(0)],
                                         run_check=False, shape=torch.Size(shape), stride=stride)
            target[key] = DTensor.from_local(torch.zeros(local_shape), mesh, [Shard(0)], run_check=False,
                                             shape=torch.Size(shape), stride=stride)

        def timed(call):
            dist.barrier()
            t0 = time.perf_counter()
            call()
            t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return t.item()

        save_s, load_s, warm_s, res_max = [], [], [], 0.0
        previous = None
        for r in range(repeat):
            d = os.path.join(base, f"pytorch-ws{world}-r{r}")
            save_s.append(timed(lambda: dcp.save(
                sd, storage_writer=HuggingFaceStorageWriter(d, save_distributed=True))))
            if rank == 0 and previous:
                shutil.rmtree(previous)  # one checkpoint on disk at a time
            previous = d
            if rank == 0:
                evict(d)
                res, pages = resident(d)
                res_max = max(res_max, res / max(pages, 1))
            load_s.append(timed(lambda: dcp.load(target, storage_reader=HuggingFaceStorageReader(d))))
            if r == 0:
                for key in sd:
                    if not torch.equal(target[key].to_local(), sd[key].to_local()):
                        raise RuntimeError(f"rank {rank}: '{key}' loaded differs from what was saved")
            warm_s.append(timed(lambda: dcp.load(target, storage_reader=HuggingFaceStorageReader(d))))
        if rank == 0:
            files = len([f for f in os.listdir(previous) if f.endswith(".safetensors")])
            result = {"save_s": min(save_s), "load_s": min(load_s), "load_warm_s": min(warm_s),
                      "save_s_all": save_s, "load_s_all": load_s, "load_warm_s_all": warm_s,
                      "files": files, "checkpoint_bytes": dir_bytes(previous),
                      "resident_before_cold_load": res_max}
            shutil.rmtree(previous)
            with open(result_path, "w") as f:
                json.dump(result, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def load_average():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dir", help="where the checkpoints go (default: a temp dir under the current directory)")
    ap.add_argument("--mb", type=int, default=256, help="MB (10^6 bytes) of tensor data, at least")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--world-sizes", default="2,4")
    a = ap.parse_args()
    if a.repeat < 1 or a.mb < 1:
        ap.error("--repeat and --mb must be >= 1")
    try:
        import safetensors
    except ImportError as e:
        sys.exit(f"checkpoint_pytorch.py: the safetensors package is missing ({e}): "
                 f"{sys.executable} -m pip install safetensors==0.8.0")
    worlds = [int(w) for w in a.world_sizes.split(",") if w]
    start = time.perf_counter()
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    load_start = load_average()
    lay = layout(a.mb)
    nbytes = total_bytes(lay)

    parent = a.dir or os.getcwd()
    os.makedirs(parent, exist_ok=True)
    cases = {}
    with tempfile.TemporaryDirectory(prefix="tdc-bench-checkpoint-py-", dir=parent) as tmp:
        for world in worlds:
            t0 = time.perf_counter()
            store = os.path.join(tmp, f"store-{world}")
            result = os.path.join(tmp, f"result-{world}.json")
            mp.start_processes(rank_main, args=(world, store, tmp, result, a.mb, a.repeat),
                               nprocs=world, join=True, start_method="spawn")
            with open(result) as f:
                c = json.load(f)
            for k in ("save", "load", "load_warm"):
                c[f"{k}_mb_s"] = nbytes / c[f"{k}_s"] / 1e6
            cases[str(world)] = c
            print(f"[pytorch] world {world}: save {c['save_mb_s']:.0f} MB/s, load {c['load_mb_s']:.0f} MB/s "
                  f"(warm {c['load_warm_mb_s']:.0f})  ({time.perf_counter() - t0:.1f} s)",
                  file=sys.stderr, flush=True)

    out = {
        "cases": cases,
        "state_dict": {"tensors": [[k, s] for k, s in lay], "dtype": "float32", "total_bytes": nbytes},
        "world_sizes": worlds,
        "repeat": a.repeat,
        "writer": "dcp.save(sd, storage_writer=HuggingFaceStorageWriter(dir, save_distributed=True))",
        "reader": "dcp.load(sd, storage_reader=HuggingFaceStorageReader(dir))",
        "backend": "gloo",
        "launcher": "torch.multiprocessing spawn",
        "threads_per_rank": 1,
        "torch_version": torch.__version__,
        "safetensors_version": safetensors.__version__,
        "python_version": platform.python_version(),
        "load_average": {"start": load_start, "end": load_average()},
        "started_at": started_at,
        "duration_s": time.perf_counter() - start,
    }
    write_json(a.out, out)


if __name__ == "__main__":
    main()
