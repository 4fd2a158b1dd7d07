"""PyTorch FSDP1 sharded state-dict layouts, measured live (issue 15; docs/fsdp1.md layouts table).

Runs PyTorch's FSDP1 on 4 CPU processes (gloo, device_id=cpu) and prints the placements of
SHARDED_STATE_DICT entries and optimizer state: FSDP1 on mesh["dp"] over TP (the DTensor
extension), on a 1-D mesh, and on a 2-D mesh given whole. tdc asserts the same placements in
FSDP1StateDict.ShardedLayoutMatchesPyTorch (conformance/unit/fsdp1_state_dict_test.cpp).

Usage: .venv/bin/python tools/parity/fsdp1_sharded_layouts.py
"""
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp, torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import parallelize_module, ColwiseParallel, RowwiseParallel
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, get_model_state_dict, StateDictOptions
from torch.distributed.fsdp.wrap import always_wrap_policy
# test_fsdp_dsd.py's SimpleModel: fixtures/golden/pytorch_fixtures.py, one module for every Python side.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "fixtures", "golden"))
from pytorch_fixtures import SimpleModel  # noqa: E402
def run(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    dist.init_process_group("gloo", rank=rank, world_size=4)
    torch.manual_seed(0); ref = SimpleModel(); ref_sd = ref.state_dict()
    mesh = init_device_mesh("cpu", (2,2), mesh_dim_names=("dp","tp"))
    torch.manual_seed(0); m = SimpleModel()
    m = parallelize_module(m, mesh["tp"], {"net1": ColwiseParallel(), "net2": RowwiseParallel()})
    m = FSDP(m, device_mesh=mesh["dp"], use_orig_params=True, device_id=torch.device("cpu"))
    from torch.distributed.fsdp._common_utils import _get_module_fsdp_state
    st = _get_module_fsdp_state(m)
    if rank==0: print("ext", type(st._fsdp_extension).__name__, "pg size", st.process_group.size())
    FSDP.set_state_dict_type(m, StateDictType.SHARDED_STATE_DICT)
    sd = m.state_dict()
    for k,v in sd.items():
        full = v.redistribute(v.device_mesh,[Replicate(),Replicate()]).to_local()
        ok = torch.allclose(full, ref_sd[k])
        if rank in (0,1,2,3): print(rank, k, type(v).__name__, v.placements, tuple(v.to_local().shape), "ok", ok, v.to_local().flatten()[:3].tolist(), flush=True)
    with FSDP.summon_full_params(m):
        for n,p in m.named_parameters():
            if rank==1: print("summon", n, type(p).__name__, getattr(p,'placements',None), tuple(p.shape), tuple(p.to_local().shape) if isinstance(p,DTensor) else "")
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    m(torch.rand(4,5)).sum().backward(); opt.step()
    osd = get_optimizer_state_dict(m, opt)
    for k,v in osd["state"].items():
        for s,t in v.items():
            if rank==2: print("osd", k, s, type(t).__name__, getattr(t,'placements',None), tuple(t.shape))
    if rank==0: print("param_groups", osd["param_groups"])
    for k,v in get_model_state_dict(m).items():
        if rank==3: print("msd", k, type(v).__name__, getattr(v,'placements',None), tuple(v.to_local().shape) if isinstance(v,DTensor) else "")
    # 1-D mesh extension
    mesh1 = init_device_mesh("cpu",(4,))
    m1 = FSDP(SimpleModel(), device_mesh=mesh1, use_orig_params=True, device_id=torch.device("cpu"))
    if rank==0: print("ext1d", _get_module_fsdp_state(m1)._fsdp_extension)
    # 2-D global mesh, no hybrid
    m2 = FSDP(SimpleModel(), device_mesh=mesh, use_orig_params=True, auto_wrap_policy=always_wrap_policy, device_id=torch.device("cpu"))
    st2 = _get_module_fsdp_state(m2)
    if rank==0: print("ext2d-global", st2._fsdp_extension, "pg size", st2.process_group.size(), "ranks", dist.get_process_group_ranks(st2.process_group))
    o2 = torch.optim.AdamW(m2.parameters(), lr=0.1); m2(torch.rand(4,5)).sum().backward(); o2.step()
    for k,v in get_model_state_dict(m2).items():
        if rank==1: print("msd2", k, type(v).__name__, getattr(v,'placements',None), tuple(v.to_local().shape) if isinstance(v,DTensor) else "")
    for k,v in get_optimizer_state_dict(m2, o2)["state"].items():
        for s,t in v.items():
            if rank==1: print("osd2", k, s, type(t).__name__, getattr(t,'placements',None), tuple(t.to_local().shape) if isinstance(t,DTensor) else t)
    with FSDP.state_dict_type(m2, StateDictType.SHARDED_STATE_DICT):
        so = FSDP.sharded_optim_state_dict(m2, o2)
        if rank==1: print("sharded_optim keys", list(so.keys()), {k: {s: (type(t).__name__, getattr(t,'placements',None)) for s,t in v.items()} for k,v in list(so["state"].items())[:2]}, so["param_groups"])
    with FSDP.state_dict_type(m2, StateDictType.FULL_STATE_DICT):
        fo = FSDP.optim_state_dict(m2, o2)
        if rank==0: print("full optim", {k: {s: (type(t).__name__, tuple(t.shape) if hasattr(t,'shape') else t) for s,t in v.items()} for k,v in list(fo["state"].items())[:2]})
    dist.destroy_process_group()
if __name__=="__main__": mp.start_processes(run, nprocs=4, start_method="fork")
