"""PyTorch's side of `tdc parity` (cli/parity.cpp): runs parity scenarios with real PyTorch 2.13.

Each scenario (fixtures/scenarios/*.json, schema in docs/results-schema.md, "Parity scenarios")
names a model, the seeds of its initial weights and data, a world size, a mesh, a parallelism
recipe, an optimizer and a number of steps. For each one this script

  1. draws the initial weights (torch.manual_seed(init_seed), then the model's constructor) and
     every step's global batches (a generator seeded with data_seed) and writes them to
     INPUTS/<name>.safetensors: init.<fqn> (full parameters), data.step<s>.micro<m>.input/.target;
     the FSDP1 test models of common_fsdp (NestedWrappedModule, TransformerWithSharedParams) seed
     their own weights (deterministic=True) and draw their own inputs (get_input, per rank): each
     rank's inputs go in as data.step<s>.rank<r>.input<i>;
     tdc's side (tdc_parity_runner) loads the same file, so both start from the same numbers;
  2. trains on world_size forked ranks (gloo on the CPU, 1 thread per rank) with PyTorch's own
     DDP / tensor parallel / fully_shard / FSDP1 (FullyShardedDataParallel) / pipelining / DCP,
     as the recipe says;
  3. writes TRACES/<name>.pytorch.json (schema "tdc-parity-trace/1"): per step the loss (mean of
     the local losses of the ranks that compute one) and the gradient norm (of the full gradients,
     before the optimizer step), and after the last step sum / abs_sum / norm of every full
     parameter. tdc's runner computes the same quantities in the same order.

  python run_scenario.py --inputs DIR --traces DIR SCENARIO.json [SCENARIO.json ...]

Exit status 0 when every scenario ran, 1 when one failed (the others still run).
"""

import argparse
import datetime
import json
import logging
import math
import os
import re
import sys
import tempfile
import time
import traceback
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from torch.distributed._composable import checkpoint  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, ShardingStrategy, fully_shard  # noqa: E402
from torch.distributed.fsdp.wrap import ModuleWrapPolicy  # noqa: E402
from torch.distributed.pipelining import PipelineStage  # noqa: E402
from torch.distributed.pipelining.schedules import Schedule1F1B, ScheduleGPipe  # noqa: E402
from torch.distributed.tensor import DTensor, Shard  # noqa: E402
from torch.distributed.tensor.parallel import (  # noqa: E402
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.multiprocessing.spawn import ProcessException  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "fixtures", "golden"))
# PyTorch's own test models (common_fsdp's MLP / MLPStack, common_dtensor's Transformer), loaded
# from the installed wheel as the fixture goldens load them (the modules need expecttest to import).
from pytorch_fixtures import dtensor_module, fsdp_module  # noqa: E402

FSDP_MODELS = fsdp_module()
DTENSOR_MODELS = dtensor_module()
# MLPStack.parallelize looks these up in its module's globals.
FSDP_MODELS.__dict__.update(ColwiseParallel=ColwiseParallel, RowwiseParallel=RowwiseParallel,
                            SequenceParallel=SequenceParallel, Shard=Shard,
                            parallelize_module=parallelize_module, checkpoint=checkpoint,
                            fully_shard=fully_shard, ModuleWrapPolicy=ModuleWrapPolicy,
                            ShardingStrategy=ShardingStrategy)
# The FSDP1 test models (common_fsdp), built as the FSDP1 tests build them: deterministic=True.
FSDP1_MODELS = {"nested_wrapped_module": FSDP_MODELS.NestedWrappedModule,
                "transformer_with_shared_params": FSDP_MODELS.TransformerWithSharedParams}
FSDP_WRAPPED = "_fsdp_wrapped_module."
SCHEDULES = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ------------------------------------------------------------------ model, data, loss
class RankGroup:
    """What an FSDP1 test model reads of its process group (rank, size): for drawing a rank's inputs
    outside the ranks."""

    def __init__(self, rank, size):
        self._rank, self._size = rank, size

    def rank(self):
        return self._rank

    def size(self):
        return self._size


def build_model(model, group=None):
    kind = model["type"]
    if kind in FSDP1_MODELS:  # unwrapped (NO_FSDP), on the CPU, seeded by the fixture itself
        return FSDP1_MODELS[kind].init(group or RankGroup(0, 1), FSDP_MODELS.FSDPInitMode.NO_FSDP,
                                       FSDP_MODELS.DEVICEInitMode.DEVICE_NEVER, deterministic=True)
    if kind == "mlp_stack":
        return FSDP_MODELS.MLPStack(model["dim"])
    if kind == "mlp_layers":
        return nn.Sequential(*[FSDP_MODELS.MLP(model["dim"]) for _ in range(model["layers"])])
    if kind == "transformer":
        args = DTENSOR_MODELS.ModelArgs(n_layers=model["n_layers"], vocab_size=model["vocab_size"],
                                        max_seq_len=model["seq_len"], dim=model["dim"],
                                        n_heads=model["n_heads"], dropout_p=0.0, weight_tying=True)
        return DTENSOR_MODELS.Transformer(args)
    raise ValueError(f"unknown model type '{kind}'")


def blocks(model, kind):
    """The modules that get activation checkpointing and their own fully_shard."""
    if kind == "transformer":
        return list(model.layers)
    return [m for m in model if not isinstance(m, nn.LayerNorm)]


def loss_of(y, target):
    if target.dtype == torch.long:
        return F.cross_entropy(y.flatten(0, 1), target.flatten())
    return F.mse_loss(y, target)


def draw_inputs(sc):
    if sc["model"]["type"] in FSDP1_MODELS:
        return draw_fsdp1_inputs(sc)
    torch.manual_seed(sc["init_seed"])
    model = build_model(sc["model"])
    out = {f"init.{k}": v.detach().clone().contiguous() for k, v in model.named_parameters()}
    g = torch.Generator().manual_seed(sc["data_seed"])
    m, batch = sc["model"], sc["batch"]
    for s in range(sc["steps"]):
        for micro in range(sc["recipe"].get("grad_accum", 1)):
            key = f"data.step{s}.micro{micro}"
            if m["type"] == "transformer":
                out[key + ".input"] = torch.randint(m["vocab_size"], (batch, m["seq_len"]), generator=g)
                out[key + ".target"] = torch.randint(m["vocab_size"], (batch, m["seq_len"]), generator=g)
            else:
                out[key + ".input"] = torch.randn(batch, m["dim"], generator=g)
                out[key + ".target"] = torch.randn(batch, m["dim"], generator=g)
    return out


def draw_fsdp1_inputs(sc):
    """The fixture's own weights and, per step and rank, what its get_input gives that rank (the
    FSDP1 tests call get_input every step; it reseeds with 1 + rank, so every step sees the same)."""
    ws = sc["world_size"]
    model = build_model(sc["model"])
    out = {f"init.{k}": v.detach().clone().contiguous() for k, v in model.named_parameters()}
    per_rank = [build_model(sc["model"], RankGroup(r, ws)).get_input(torch.device("cpu")) for r in range(ws)]
    for s in range(sc["steps"]):
        for r, tensors in enumerate(per_rank):
            for i, t in enumerate(tensors):
                out[f"data.step{s}.rank{r}.input{i}"] = t.clone().contiguous()
    return out


# ------------------------------------------------------------------ the recipes
class Run:
    """One rank's parallelized model: what trains, what the optimizer sees, how FQNs map."""

    def __init__(self):
        self.call = None       # what forward calls (the model, or its DDP wrapper)
        self.parts = []        # [(fqn prefix offset or None, module)]: modules whose params are traced
        self.schedule = None   # pipelining only
        self.pp_rank = 0
        self.pp_size = 1
        self.dp_index, self.dp_size = 0, 1
        self.fsdp_root = None  # for set_requires_gradient_sync
        self.ddp = None
        self.fsdp1_root = None  # the root FullyShardedDataParallel (recipe fsdp1)
        self.test_model = None  # the FSDP1 test model (its inputs, get_loss)


def mesh_of(sc):
    mesh = sc["mesh"]
    if sc["world_size"] == 1 and sc["recipe"]["kind"] == "none":
        return None
    return init_device_mesh("cpu", tuple(mesh["shape"]), mesh_dim_names=tuple(mesh["dim_names"]))


def mp_policy(recipe):
    mp_spec = recipe.get("mixed_precision")
    if not mp_spec:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=DTYPES[mp_spec["param_dtype"]],
                                reduce_dtype=DTYPES[mp_spec.get("reduce_dtype", "float32")])


def clean_fqn(fqn):
    return fqn.replace(FSDP_WRAPPED, "")


def build_fsdp1(sc, inputs, mesh):
    """As test_fsdp_core's _test_fsdp_parity: model_class.init(group, RECURSIVE, DEVICE_BEFORE,
    fsdp_kwargs, deterministic=True), then a root FSDP unit when init did not wrap the root; the
    weights of the inputs file are then written into the full parameters (summon_full_params with
    writeback)."""
    recipe = sc["recipe"]
    group = mesh.get_group()
    # device_id: FSDP1 refuses a CPU module unless told that the CPU is the compute device.
    kwargs = {"sharding_strategy": ShardingStrategy[recipe["sharding_strategy"]],
              "use_orig_params": recipe.get("use_orig_params", False), "device_id": torch.device("cpu")}
    cls = FSDP1_MODELS[sc["model"]["type"]]
    model = cls.init(group, FSDP_MODELS.FSDPInitMode.RECURSIVE, FSDP_MODELS.DEVICEInitMode.DEVICE_BEFORE,
                     dict(kwargs), deterministic=True)
    if not isinstance(model, FSDP):
        model = FSDP(model, group, **kwargs)
    with FSDP.summon_full_params(model, writeback=True), torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(inputs[f"init.{clean_fqn(name)}"])
    run = Run()
    run.fsdp1_root = model
    run.test_model = model.module
    run.call = model
    run.dp_index, run.dp_size = mesh.get_local_rank(), mesh.size()
    run.parts = [(None, model)]
    return run


def build(sc, inputs, mesh):
    recipe, kind, mtype = sc["recipe"], sc["recipe"]["kind"], sc["model"]["type"]
    if kind == "fsdp1":
        return build_fsdp1(sc, inputs, mesh)
    torch.manual_seed(sc.get("init_seed", 0))  # (the FSDP1 test models seed themselves)
    model = build_model(sc["model"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(inputs[f"init.{name}"])
    run = Run()
    ac = recipe.get("activation_checkpointing", False)
    if kind == "pipeline":
        return build_pipeline(sc, model, mesh, run)
    if kind in ("none", "ddp", "fsdp", "hsdp") and ac:
        for b in blocks(model, mtype):
            checkpoint(b)
    if kind == "none":
        run.call = model
        if mtype in FSDP1_MODELS:  # an FSDP1 test model unwrapped: the reference for recipe fsdp1
            run.test_model = model
    elif kind == "ddp":
        run.ddp = DDP(model, process_group=mesh.get_group())
        run.call = run.ddp
        run.dp_index, run.dp_size = mesh.get_local_rank(), mesh.size()
    elif kind == "tp":
        parallelize_module(model, mesh, mlp_stack_tp_plan())
        run.call = model
    elif kind in ("fsdp", "hsdp"):
        for b in blocks(model, mtype):
            fully_shard(b, mesh=mesh, mp_policy=mp_policy(recipe))
        run.fsdp_root = fully_shard(model, mesh=mesh, mp_policy=mp_policy(recipe))
        run.call = model
        run.dp_index, run.dp_size = dist.get_rank(), dist.get_world_size()
    elif kind == "tp_fsdp":
        model.parallelize(mesh["tp"], mesh["dp"], ac, mp_policy=mp_policy(recipe))
        run.fsdp_root = model
        run.call = model
        run.dp_index, run.dp_size = mesh["dp"].get_local_rank(), mesh["dp"].size()
    else:
        raise ValueError(f"unknown recipe '{kind}'")
    run.parts = [(None, model)]
    return run


def mlp_stack_tp_plan():
    """common_fsdp's MLPStack.parallelize plan (without sequence parallel)."""
    plan = {}
    for i in range(3):
        plan[f"{i}.in_proj"] = ColwiseParallel(use_local_output=False)
        plan[f"{i}.out_proj"] = RowwiseParallel(use_local_output=False) if i < 2 else RowwiseParallel()
    return plan


def build_pipeline(sc, model, mesh, run):
    """One stage per pp rank (GPipe / 1F1B); FSDP2 per layer and stage root when dp > 1, as
    test_composability's test_pp_fsdp builds it."""
    recipe = sc["recipe"]
    pp_mesh = mesh["pp"]
    pp_group = pp_mesh.get_group()
    run.pp_rank, run.pp_size = pp_mesh.get_local_rank(), pp_mesh.size()
    layers = list(model)
    per_stage = len(layers) // run.pp_size
    offset = run.pp_rank * per_stage
    stage_module = nn.Sequential(*layers[offset:offset + per_stage])
    if "dp" in mesh.mesh_dim_names:
        dp_mesh = mesh["dp"]
        run.dp_index, run.dp_size = dp_mesh.get_local_rank(), dp_mesh.size()
        for layer in stage_module:
            fully_shard(layer, mesh=dp_mesh, mp_policy=mp_policy(recipe), reshard_after_forward=False)
        fully_shard(stage_module, mesh=dp_mesh, mp_policy=mp_policy(recipe))
    stage = PipelineStage(stage_module, run.pp_rank, run.pp_size, torch.device("cpu"), group=pp_group)
    run.schedule = SCHEDULES[recipe["schedule"]](stage, n_microbatches=recipe["microbatches"], loss_fn=loss_of)
    run.parts = [(offset, stage_module)]
    return run


def make_optimizer(sc, run):
    o = sc["optimizer"]
    params = [p for _, m in run.parts for p in m.parameters()]
    if o["type"] == "sgd":
        return torch.optim.SGD(params, lr=o["lr"], momentum=o.get("momentum", 0.0))
    if o["type"] == "adam":
        return torch.optim.Adam(params, lr=o["lr"])
    raise ValueError(f"unknown optimizer '{o['type']}'")


# ------------------------------------------------------------------ what is traced
def model_fqn(fqn, offset):
    if offset is None:
        return fqn
    layer, rest = fqn.split(".", 1)
    return f"{int(layer) + offset}.{rest}"


def full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def all_ranks_sum(values):
    """{key: value} summed over the ranks (float64 all-reduce, keys in sorted order)."""
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return {k: float(v) for k, v in zip(keys, t.tolist())}


def fsdp1_grad_squares(run):
    """[Note: FSDP1 gradient trace] A rank holds only its shard of each unit's flat gradient.
    use_orig_params=True: per original parameter (its local 1-D part, empty or without a gradient
    when the shard holds none of it); use_orig_params=False: per unit, the flat parameter's local
    shard ("<unit FQN>._flat_param", wrapper-free). Squares are summed in float64 on each rank and
    then over the ranks; the padding is zero."""
    local = {}
    if run.fsdp1_root._use_orig_params:
        for fqn, p in run.fsdp1_root.named_parameters():
            g = p.grad
            local[clean_fqn(fqn)] = 0.0 if g is None else float((g.detach().double() ** 2).sum())
    else:
        for fqn, m in run.fsdp1_root.named_modules():
            if not isinstance(m, FSDP) or m._handle is None:
                continue
            g = m._handle.flat_param.grad
            if g is None:
                raise RuntimeError(f"FSDP unit '{fqn}' has no flat gradient after backward")
            key = clean_fqn(f"{fqn}.{FSDP_WRAPPED}_flat_param" if fqn else f"{FSDP_WRAPPED}_flat_param")
            local[key] = float((g.detach().double() ** 2).sum())
    return all_ranks_sum(local)


def grad_squares(run):
    """{fqn: sum of squares of the full gradient} (float64); collective for DTensors."""
    if run.fsdp1_root is not None:
        return fsdp1_grad_squares(run)
    out = {}
    for offset, m in run.parts:
        for fqn, p in m.named_parameters():
            if p.grad is None:
                raise RuntimeError(f"parameter '{fqn}' has no gradient after backward")
            g = full(p.grad).detach().double()
            out[model_fqn(fqn, offset)] = float((g * g).sum())
    return out


def param_checksums(run):
    out = {}
    if run.fsdp1_root is not None:  # the full parameters, as summon_full_params shows them
        with FSDP.summon_full_params(run.fsdp1_root, writeback=False):
            for fqn, p in run.fsdp1_root.named_parameters():
                v = p.detach().double()
                out[clean_fqn(fqn)] = {"sum": float(v.sum()), "abs_sum": float(v.abs().sum()),
                                       "norm": float(v.norm())}
        return out
    for offset, m in run.parts:
        for fqn, p in m.named_parameters():
            v = full(p.detach()).double()
            out[model_fqn(fqn, offset)] = {"sum": float(v.sum()), "abs_sum": float(v.abs().sum()),
                                           "norm": float(v.norm())}
    return out


# ------------------------------------------------------------------ one rank
def local(t, run):
    return torch.chunk(t, run.dp_size)[run.dp_index]


def train_step(sc, run, inputs, s):
    """Forward + backward of every micro step; the rank's mean local loss, or None (pipelining
    ranks without the last stage)."""
    recipe = sc["recipe"]
    if run.test_model is not None:  # the fixture's inputs for this rank and its loss
        rank = dist.get_rank()
        x, i = [], 0
        while f"data.step{s}.rank{rank}.input{i}" in inputs:
            x.append(inputs[f"data.step{s}.rank{rank}.input{i}"])
            i += 1
        x = tuple(x)
        loss = run.test_model.get_loss(x, run.call(*x))
        run.test_model.run_backward(loss)
        return float(loss)
    if run.schedule is not None:
        x = local(inputs[f"data.step{s}.micro0.input"], run)
        y = local(inputs[f"data.step{s}.micro0.target"], run)
        if run.pp_rank == 0:
            run.schedule.step(x)
            return None
        if run.pp_rank == run.pp_size - 1:
            losses = []
            run.schedule.step(target=y, losses=losses)
            return sum(float(v) for v in losses) / len(losses)
        run.schedule.step()
        return None
    accum = recipe.get("grad_accum", 1)
    total = 0.0
    for micro in range(accum):
        sync = micro == accum - 1
        if run.fsdp_root is not None:
            run.fsdp_root.set_requires_gradient_sync(sync)
        x = local(inputs[f"data.step{s}.micro{micro}.input"], run)
        y = local(inputs[f"data.step{s}.micro{micro}.target"], run)
        if run.ddp is not None and not sync:
            with run.ddp.no_sync():
                loss = loss_of(run.call(x), y)
                (loss / accum).backward()
        else:
            loss = loss_of(run.call(x), y)
            (loss / accum).backward()
        total += float(loss)
    return total / accum


def resume(sc, inputs, mesh, run, optim, ckpt_dir):
    """Saves model + optimizer with DCP, builds everything anew and loads them back."""
    msd, osd = get_state_dict(run.parts[0][1], optim)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt_dir)
    fresh = build(sc, inputs, mesh)
    fresh_optim = make_optimizer(sc, fresh)
    msd, osd = get_state_dict(fresh.parts[0][1], fresh_optim)
    sd = {"model": msd, "optim": osd}
    dcp.load(sd, checkpoint_id=ckpt_dir)
    set_state_dict(fresh.parts[0][1], fresh_optim, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    return fresh, fresh_optim


def run_rank(rank, sc, init_file, inputs_path, result_dir):
    torch.set_num_threads(1)
    # DTensor's note that a 2-D gather takes two all-gathers (TP x FSDP2) is not about the values.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    ws = sc["world_size"]
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=ws,
                            timeout=datetime.timedelta(seconds=120))
    # [Note: no destroy_process_group] The rank ends without destroying its process group: in
    # torch 2.13, ~ProcessGroupGloo (main thread, holding the GIL) waits for the gloo run loop,
    # which may be destroying a finished DDP all-reduce work whose thread-local state needs the
    # GIL: a deadlock seen in about 1 run in 3. A barrier makes sure that every rank is done with
    # every collective; the process then exits (os._exit) with the group alive.
    inputs = load_file(inputs_path)
    mesh = mesh_of(sc)
    run = build(sc, inputs, mesh)
    optim = make_optimizer(sc, run)
    resume_at = sc["recipe"].get("checkpoint_resume_at")
    losses, grad_sq = [], []
    for s in range(sc["steps"]):
        if resume_at is not None and s == resume_at:
            run, optim = resume(sc, inputs, mesh, run, optim, os.path.join(result_dir, "checkpoint"))
        losses.append(train_step(sc, run, inputs, s))
        grad_sq.append(grad_squares(run))
        optim.step()
        optim.zero_grad(set_to_none=True)
    result = {"losses": losses, "grad_sq": grad_sq, "params": param_checksums(run)}
    with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()


# ------------------------------------------------------------------ merge (as tdc_parity_runner)
def merge(sc, rank_results):
    """Per step: loss = mean of the reporting ranks' losses (rank order); gradient norm = sqrt of
    the sum over FQNs (sorted) of each parameter's squared norm (lowest rank's value). Params:
    the lowest rank's checksums of each FQN."""
    steps = []
    for s in range(sc["steps"]):
        reported = [r["losses"][s] for r in rank_results if r["losses"][s] is not None]
        if not reported:
            raise RuntimeError(f"step {s}: no rank reported a loss")
        total = 0.0
        for v in reported:
            total += v
        sq = {}
        for r in rank_results:
            for k, v in r["grad_sq"][s].items():
                sq.setdefault(k, v)
        acc = 0.0
        for k in sorted(sq):
            acc += sq[k]
        steps.append({"step": s, "loss": total / len(reported), "grad_norm": math.sqrt(acc)})
    params = {}
    for r in rank_results:
        for k, v in r["params"].items():
            params.setdefault(k, v)
    return {"schema": "tdc-parity-trace/1", "scenario": sc["name"], "side": "pytorch",
            "version": torch.__version__, "world_size": sc["world_size"], "steps": steps,
            "params": dict(sorted(params.items()))}


def release(version):
    """'2.12.1+cu130' -> (2, 12, 1); '2.12' -> (2, 12, 0)."""
    parts = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if not parts:
        raise ValueError(f"not a release: {version!r}")
    return tuple(int(p or 0) for p in parts.groups())


def check_requirement(sc):
    """A scenario's "requires" (docs/results-schema.md): `tdc parity` does not pass a scenario this
    LibTorch cannot run; an oracle older than the LibTorch could still get one, and says so."""
    req = sc.get("requires")
    if req and release(torch.__version__) < release(req["pytorch"]):
        raise RuntimeError(f"needs PyTorch >= {req['pytorch']} (this is {torch.__version__}): {req['why']}")


def fail_once_for_tests(name):
    """CTest tdc_parity_retries_oracle_failure: with TDC_PARITY_ORACLE_FAIL_ONCE=FILE, the first
    scenario run fails (as if the oracle's process had died) and leaves FILE; later runs go on."""
    marker = os.environ.get("TDC_PARITY_ORACLE_FAIL_ONCE")
    if marker and not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError(f"{name}: failing once on purpose (TDC_PARITY_ORACLE_FAIL_ONCE)")


def run_scenario(path, inputs_dir, traces_dir):
    with open(path) as f:
        sc = json.load(f)
    check_requirement(sc)
    fail_once_for_tests(sc["name"])
    inputs_path = os.path.join(inputs_dir, f"{sc['name']}.safetensors")
    save_file(draw_inputs(sc), inputs_path)
    with tempfile.TemporaryDirectory(prefix="tdc-parity-py.") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        mp.start_processes(run_rank, args=(sc, init_file, inputs_path, tmp), nprocs=sc["world_size"],
                           start_method="fork")
        results = []
        for r in range(sc["world_size"]):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                results.append(json.load(f))
    trace = merge(sc, results)
    out = os.path.join(traces_dir, f"{sc['name']}.pytorch.json")
    tmp_out = out + ".tmp"
    with open(tmp_out, "w") as f:
        json.dump(trace, f, indent=1)
        f.write("\n")
    os.replace(tmp_out, out)
    return sc["name"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", required=True, help="directory for <name>.safetensors (weights + data)")
    parser.add_argument("--traces", required=True, help="directory for <name>.pytorch.json")
    parser.add_argument("scenarios", nargs="+", help="scenario JSON files")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the parent forks the ranks: no parallel ATen work before a fork
    os.makedirs(args.inputs, exist_ok=True)
    os.makedirs(args.traces, exist_ok=True)
    failed = 0
    for i, path in enumerate(args.scenarios):
        t0 = time.monotonic()
        label = f"[pytorch {i + 1}/{len(args.scenarios)}] {os.path.basename(path)}"
        print(f"{label} ...", end=" ", flush=True, file=sys.stderr)
        try:
            run_scenario(path, args.inputs, args.traces)
            print(f"done ({time.monotonic() - t0:.1f} s)", flush=True, file=sys.stderr)
        except ProcessException as e:
            failed += 1
            print(f"FAILED: {e}", flush=True, file=sys.stderr)
        except Exception:  # noqa: BLE001  (report and go on with the next scenario)
            failed += 1
            print("FAILED:\n" + traceback.format_exc(), flush=True, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
