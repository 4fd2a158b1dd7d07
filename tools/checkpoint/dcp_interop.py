"""PyTorch's side of tdc's checkpoint interop tests (conformance/interop/).

Both sides train the same model one Adam step and hand each other a DCP checkpoint in the
HuggingFace safetensors layout (docs/design/dcp-hf-format.md, "Python side of interop
tests"): DIR/model/ holds the model state dict, DIR/optim/ the optimizer state dict's tensors
({"state": ...}: keys state.<fqn>.exp_avg / exp_avg_sq / step). A reference directory REF holds
the saving side's full state dict as plain safetensors (keys model.<fqn> and
optim.state.<fqn>.<name>), which the loading side compares with bit for bit.

  save: train, dcp.save with HuggingFaceStorageWriter(save_distributed=True), write REF.
  load: dcp.load with HuggingFaceStorageReader into the sharded state dict, set_state_dict, then
        compare the full state dict (model and optimizer) with REF: same keys, torch.equal.

--nproc N forks N ranks (gloo, CPU; layouts fsdp and fsdp_tp); the layout plain runs in this one
process without a process group:

  python dcp_interop.py save --layout fsdp --nproc 2 --dir CKPT --ref REF
  python dcp_interop.py load --layout plain --dir CKPT --ref REF

Exit status: 0 when everything matched, 1 on a mismatch (each one printed), 2 on bad usage.
"""

import argparse
import glob
import json
import os
import sys
import tempfile
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
import torch.nn as nn
from safetensors import safe_open
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)
from torch.multiprocessing.spawn import ProcessException

# The models: fixtures/golden/pytorch_fixtures.py, one module for every Python side of tdc.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "fixtures", "golden"))
from pytorch_fixtures import fsdp_module  # noqa: E402

DIM = 6  # uneven on 4 ranks: some FSDP shards are empty
MLP_FQNS = ("0", "1.0", "2")  # the MLPs of the model, as the TP plan names them


# common_fsdp.py's MLP, loaded from the wheel by the fixture module (its import needs expecttest).
MLP = fsdp_module().MLP


def build_model(layout: str, seed: int) -> nn.Module:
    """test_fsdp_dsd's base model, parallelized per layout (same seed on every rank)."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        MLP(DIM, with_buffer=True),
        nn.Sequential(MLP(DIM), nn.Linear(DIM, DIM)),
        MLP(DIM),
    )
    if layout == "plain":
        return model
    ws = dist.get_world_size()
    if layout == "fsdp":
        dp_mesh = init_device_mesh("cpu", (ws,))
    else:  # fsdp_tp
        mesh = init_device_mesh("cpu", (2, ws // 2), mesh_dim_names=("dp", "tp"))
        plan = {}
        for mlp in MLP_FQNS:
            plan[f"{mlp}.in_proj"] = ColwiseParallel()
            plan[f"{mlp}.out_proj"] = RowwiseParallel()
        parallelize_module(model, mesh["tp"], plan)
        dp_mesh = mesh["dp"]
    for child in model:
        fully_shard(child, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    return model


def train_one_step(model: nn.Module) -> torch.optim.Optimizer:
    """Adam(lr=0.01), one step on model(x).sum(), x = randn(2, DIM) identical on every rank."""
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    x = torch.randn(2, DIM, generator=torch.Generator().manual_seed(1))
    model(x).sum().backward()
    optim.step()
    optim.zero_grad()
    return optim


def full_state(model: nn.Module, optim: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The full state dict as the reference keys it (rank 0 only; other ranks get {})."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd = get_model_state_dict(model, options=opts)
    osd = get_optimizer_state_dict(model, optim, options=opts)
    out = {f"model.{k}": v for k, v in msd.items()}
    for fqn, state in osd.get("state", {}).items():
        for name, value in state.items():
            out[f"optim.state.{fqn}.{name}"] = value
    return out


def read_reference(ref: str) -> dict[str, torch.Tensor]:
    """Every tensor of REF's *.safetensors files: full tensors (DCP_SHARDING_INFO, if present,
    must give offset 0 for each, as a one-rank tdc save writes)."""
    files = sorted(glob.glob(os.path.join(ref, "*.safetensors")))
    if not files:
        raise SystemExit(f"reference '{ref}' has no *.safetensors file")
    out: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(path, framework="pt") as f:
            info = json.loads((f.metadata() or {}).get("DCP_SHARDING_INFO", "{}"))
            for key in f.keys():
                offsets = info.get(key, {}).get("saved_offsets", [])
                if any(offsets):
                    raise SystemExit(f"reference '{path}': '{key}' is a chunk at {offsets}, not a full tensor")
                if key in out:
                    raise SystemExit(f"reference '{ref}': key '{key}' is in two files")
                out[key] = f.get_tensor(key)
    return out


def compare(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> list[str]:
    """Every difference between got (this run's full state) and want (the reference)."""
    errors = [f"missing in this run: {k}" for k in sorted(want.keys() - got.keys())]
    errors += [f"not in the reference: {k}" for k in sorted(got.keys() - want.keys())]
    for key in sorted(got.keys() & want.keys()):
        g, w = got[key], want[key]
        if g.dtype != w.dtype or g.shape != w.shape:
            errors.append(f"{key}: got {g.dtype} {list(g.shape)}, reference {w.dtype} {list(w.shape)}")
        elif not torch.equal(g, w):
            diff = (g.double() - w.double()).abs().max().item()
            errors.append(f"{key}: values differ, max abs difference {diff:.3e}")
    return errors


def save(args, model: nn.Module, rank: int) -> list[str]:
    optim = train_one_step(model)
    msd, osd = get_state_dict(model, optim)
    # save_distributed=True: one file per rank (a rank-0-only writer would let ranks overwrite
    # each other). Only the optimizer's tensors: non-tensors break the HF writer.
    writer = dcp.HuggingFaceStorageWriter
    dcp.save(msd, storage_writer=writer(os.path.join(args.dir, "model"), save_distributed=True))
    dcp.save({"state": osd["state"]}, storage_writer=writer(os.path.join(args.dir, "optim"), save_distributed=True))
    full = full_state(model, optim)
    if rank == 0:
        os.makedirs(args.ref, exist_ok=True)
        save_file(full, os.path.join(args.ref, "reference.safetensors"), metadata={"format": "pt"})
        print(f"dcp_interop save: {args.layout}, {len(full)} tensors in {args.dir}, reference {args.ref}")
    return []


def load(args, model: nn.Module, rank: int) -> list[str]:
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    msd, osd = get_state_dict(model, optim)  # materialises Adam's state
    reader = dcp.HuggingFaceStorageReader
    dcp.load(msd, storage_reader=reader(os.path.join(args.dir, "model")))
    dcp.load({"state": osd["state"]}, storage_reader=reader(os.path.join(args.dir, "optim")))
    set_state_dict(model, optim, model_state_dict=msd, optim_state_dict=osd)
    full = full_state(model, optim)
    if rank != 0:
        return []
    errors = compare(full, read_reference(args.ref))
    if not errors:
        print(f"dcp_interop load: {args.layout}, {len(full)} tensors bit-exact with {args.ref}")
    return errors


def run(rank: int, args: argparse.Namespace, init_file: str) -> None:
    """One rank. Exits with status 1 on rank 0 when the comparison found differences."""
    if args.layout != "plain":
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=args.nproc)
    else:  # DCP warns that it runs without a process group: intended here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    try:
        # load starts from other values than save's, so that a value the load missed shows
        if args.command == "save":
            errors = save(args, build_model(args.layout, seed=0), rank)
        else:
            errors = load(args, build_model(args.layout, seed=1), rank)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    for e in errors:
        print(f"dcp_interop {args.command}: {e}", file=sys.stderr)
    if errors:
        sys.exit(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["save", "load"])
    parser.add_argument("--layout", choices=["plain", "fsdp", "fsdp_tp"], required=True)
    parser.add_argument("--nproc", type=int, default=1, help="ranks (processes), default 1")
    parser.add_argument("--dir", required=True, help="checkpoint directory (model/ and optim/ inside)")
    parser.add_argument("--ref", required=True, help="reference directory (full state dict)")
    args = parser.parse_args()
    if args.layout == "plain" and args.nproc != 1:
        parser.error(f"layout plain runs on one process, --nproc is {args.nproc}")
    if args.layout == "fsdp_tp" and args.nproc % 2:
        parser.error(f"layout fsdp_tp needs an even --nproc (a 2 x nproc/2 mesh), got {args.nproc}")

    with tempfile.TemporaryDirectory(prefix="dcp_interop.") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        if args.nproc == 1:
            run(0, args, init_file)
            return 0
        # Forked ranks stay in this process's process group, so whoever kills this process's group
        # (the tdc harness on a timeout) kills the ranks too; torchrun would start them in new
        # sessions and leave them behind.
        try:
            mp.start_processes(run, args=(args, init_file), nprocs=args.nproc, start_method="fork")
        except ProcessException as e:
            print(f"dcp_interop {args.command}: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
