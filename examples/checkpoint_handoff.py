"""PyTorch's half of examples/checkpoint_handoff.cpp (docs/checkpoint.md): load the checkpoint tdc
saved, train one step, save one for tdc. Needs the safetensors package (./tdc installs it)."""
import sys

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

ckpt = sys.argv[1]
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
optim = torch.optim.Adam(model.parameters(), lr=1e-3)
msd, osd = get_state_dict(model, optim)  # creates Adam's state so that every key exists
dcp.load(msd, storage_reader=dcp.HuggingFaceStorageReader(ckpt + "/model"))
state = {"state": osd["state"]}  # tensors only: tdc keeps param_groups in its JSON manifest
dcp.load(state, storage_reader=dcp.HuggingFaceStorageReader(ckpt + "/optim"))
set_state_dict(model, optim, model_state_dict=msd, optim_state_dict=osd)
assert optim.state_dict()["state"][0]["step"].item() == 1.0, "tdc saved after one Adam step"

model(torch.ones(3, 4)).sum().backward()
optim.step()
msd, osd = get_state_dict(model, optim)
dcp.save(msd, storage_writer=dcp.HuggingFaceStorageWriter(ckpt + "/from-pytorch/model"))
dcp.save({"state": osd["state"]}, storage_writer=dcp.HuggingFaceStorageWriter(ckpt + "/from-pytorch/optim"))
print("PyTorch loaded tdc's checkpoint, trained one step and saved its own")
