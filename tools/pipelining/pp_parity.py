"""PyTorch's side of tdc's pipelining parity test (conformance/interop/pipelining_parity_test.cpp).

Both sides train the same model the same way for a few steps and the tdc side compares, step by
step, its losses and gradients (and the parameters after the last step) with what PyTorch 2.13's
real torch.distributed.pipelining computed here.

Scenario (test_composability.py's test_pp_fsdp, fp32, trained for STEPS steps):
  world 4, mesh (dp=2, pp=2) ("dp", "pp"), gloo on the CPU, 1 thread per rank;
  8 layers of test_composability's MLPModule(10) (net1 Linear, ReLU, net2 Linear);
  fully_shard on each layer of a stage (reshard_after_forward=False), then on the stage root,
  MixedPrecisionPolicy(param_dtype=float32, reduce_dtype=float32);
  stages as the seed test builds them: ScheduleGPipe one per rank (stage = pp rank),
  ScheduleInterleaved1F1B two per rank (stage = pp rank + 2 i); n_microbatches 8;
  loss = cross_entropy(y, soft target) * 1e-4; optimizer Adam(lr=1e-3) (default betas, eps) over
  the stage modules' parameters, zero_grad(set_to_none=True) after each step.
Each schedule starts from the same initial weights and sees the same batches.

Writes two plain safetensors files into --out DIR (every tensor float32, full):
  inputs.safetensors   init.<layer>.<net1|net2>.<weight|bias>   the initial weights (seed --seed)
                       step<s>.dp<d>.input, step<s>.dp<d>.target   [BATCH, 10] per step and dp index
  pytorch.safetensors  <schedule>.step<s>.loss.dp<d>               [8] per-microbatch losses (last stage)
                       <schedule>.step<s>.grad.<layer>.<param>     full gradient (before the optimizer step)
                       <schedule>.final.<layer>.<param>            parameters after the last step
<layer> is the index in the 8-layer model, <schedule> ScheduleGPipe / ScheduleInterleaved1F1B.

  python pp_parity.py --out DIR [--steps 3] [--seed 0]

Ranks are forked (torch.multiprocessing, start_method fork) so that whoever kills this process's
group kills them too. Exit status 0 on success, 1 when a rank failed.
"""

import argparse
import datetime
import os
import sys
import tempfile
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402
from torch.distributed.pipelining import PipelineStage  # noqa: E402
from torch.distributed.pipelining.schedules import (  # noqa: E402
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.multiprocessing.spawn import ProcessException  # noqa: E402

# The models: fixtures/golden/pytorch_fixtures.py, one module for every Python side of tdc.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "fixtures", "golden"))
from pytorch_fixtures import loss_fn  # noqa: E402
from pytorch_fixtures import MLPModuleComposability as MLPModule  # noqa: E402  (test_composability.py's)

WORLD, DP, PP = 4, 2, 2
DIM, TOTAL_LAYERS, N_MICROBATCHES = 10, 8, 8
BATCH = 16  # rows per dp index and step: 2 rows per microbatch
LR = 1e-3
SCHEDULES = [ScheduleGPipe, ScheduleInterleaved1F1B]


def draw_inputs(seed: int, steps: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    out = {}
    for i in range(TOTAL_LAYERS):
        for name, value in MLPModule(DIM).state_dict().items():
            out[f"init.{i}.{name}"] = value.contiguous()
    for s in range(steps):
        for d in range(DP):
            out[f"step{s}.dp{d}.input"] = torch.rand(BATCH, DIM)
            out[f"step{s}.dp{d}.target"] = torch.rand(BATCH, DIM)  # soft targets, as _rand_microbatches
    return out


def build(schedule_class, inputs, pp_group, dp_mesh):
    """_build_pp_schedule with test_pp_fsdp's apply_dp (fp32). Returns (schedule, [(offset, module)])."""
    full_model = nn.ModuleList([MLPModule(DIM) for _ in range(TOTAL_LAYERS)])
    with torch.no_grad():
        for i, layer in enumerate(full_model):
            for name, p in layer.named_parameters():
                p.copy_(inputs[f"init.{i}.{name}"])
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)

    def build_stage(stage_idx, num_stages):
        layers_per_stage = TOTAL_LAYERS // num_stages
        offset = stage_idx * layers_per_stage
        partial_model = nn.Sequential(*full_model[offset: offset + layers_per_stage])
        for layer in partial_model:
            fully_shard(layer, mesh=dp_mesh, mp_policy=mp_policy, reshard_after_forward=False)
        fully_shard(partial_model, mesh=dp_mesh, mp_policy=mp_policy)
        stage = PipelineStage(partial_model, stage_idx, num_stages, torch.device("cpu"), group=pp_group)
        return stage, (offset, partial_model)

    if schedule_class is ScheduleGPipe:
        built = [build_stage(pp_group.rank(), pp_group.size())]
        stages = built[0][0]
    else:
        n_virtual = 2
        num_stages = pp_group.size() * n_virtual
        built = [build_stage(pp_group.rank() + n_virtual * i, num_stages) for i in range(n_virtual)]
        stages = [b[0] for b in built]
    schedule = schedule_class(stages, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn)
    return schedule, [b[1] for b in built]


def full_params(parts, what):
    """{<layer>.<param>: full tensor} of the stage modules; collective over dp (full_tensor)."""
    out = {}
    for offset, module in parts:
        for fqn, p in module.named_parameters():
            layer, rest = fqn.split(".", 1)
            t = p.grad if what == "grad" else p
            if t is None:
                raise RuntimeError(f"{fqn}: no gradient after the step")
            out[f"{int(layer) + offset}.{rest}"] = t.detach().full_tensor().clone().contiguous()
    return out


def run(rank: int, args, init_file: str, inputs_path: str, result_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=180))
    try:
        inputs = load_file(inputs_path)
        device_mesh = init_device_mesh("cpu", (DP, PP), mesh_dim_names=("dp", "pp"))
        pp_group = device_mesh["pp"].get_group()
        dp_mesh = device_mesh["dp"]
        dp_rank = dp_mesh.get_local_rank()
        out = {}
        for schedule_class in SCHEDULES:
            name = schedule_class.__name__
            schedule, parts = build(schedule_class, inputs, pp_group, dp_mesh)
            params = [p for _, m in parts for p in m.parameters()]
            optim = torch.optim.Adam(params, lr=LR)
            for s in range(args.steps):
                x = inputs[f"step{s}.dp{dp_rank}.input"]
                target = inputs[f"step{s}.dp{dp_rank}.target"]
                losses = []
                if pp_group.rank() == 0:
                    schedule.step(x)
                else:
                    schedule.step(target=target, losses=losses)
                    out[f"{name}.step{s}.loss.dp{dp_rank}"] = torch.stack([l.detach() for l in losses]).float()
                for k, v in full_params(parts, "grad").items():
                    out[f"{name}.step{s}.grad.{k}"] = v
                optim.step()
                optim.zero_grad(set_to_none=True)
            for k, v in full_params(parts, "param").items():
                out[f"{name}.final.{k}"] = v
            dist.barrier()
        # Every dp index writes its losses; gradients and parameters are full tensors, the same on
        # both dp indices, and dp index 0 writes them.
        if dp_rank != 0:
            out = {k: v for k, v in out.items() if ".loss." in k}
        save_file(out, os.path.join(result_dir, f"rank{rank}.safetensors"))
    finally:
        dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory for inputs.safetensors and pytorch.safetensors")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    os.makedirs(args.out, exist_ok=True)
    inputs_path = os.path.join(args.out, "inputs.safetensors")
    save_file(draw_inputs(args.seed, args.steps), inputs_path)

    with tempfile.TemporaryDirectory(prefix="pp_parity.") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        try:
            mp.start_processes(run, args=(args, init_file, inputs_path, tmp), nprocs=WORLD, start_method="fork")
        except ProcessException as e:
            print(f"pp_parity: {e}", file=sys.stderr)
            return 1
        result = {}
        for r in range(WORLD):
            for k, v in load_file(os.path.join(tmp, f"rank{r}.safetensors")).items():
                if k in result:
                    raise SystemExit(f"pp_parity: '{k}' written by two ranks")
                result[k] = v
    save_file(result, os.path.join(args.out, "pytorch.safetensors"))
    n_loss = sum(".loss." in k for k in result)
    n_grad = sum(".grad." in k for k in result)
    print(f"pp_parity: torch {torch.__version__}, {len(SCHEDULES)} schedules x {args.steps} steps: "
          f"{n_loss} loss vectors, {n_grad} gradients, {len(result) - n_loss - n_grad} final parameters "
          f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
