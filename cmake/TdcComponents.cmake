# [Note: libtdc's components] libtdc is assembled from one CMake OBJECT library per component,
# tdc_<name>, built from the sources of impl/<name>/ (public headers: impl/include/tdc/<name>/).
# This table is the one statement of which component may use which: impl/CMakeLists.txt links
# each component's target to exactly these (so `cmake --graphviz` and docs/architecture.md show the
# build's own graph), and cmake/CheckLayering.cmake fails the build and `./tdc test` when an
# include crosses an edge that is not here. Each row: component, then what it may include.
# Order is bottom-up; no edge points up, so there are no circles. `core` (tdc/core/ and the
# top-level tdc/*.h) is the base every component uses.
#   checkpoint:  DCP (save, load, to_bytes, the safetensors files): a StateDict in, files out.
#   state_dict:  the state-dict API (get/set model and optimizer state dicts), which knows the
#                wrappers (DDP, FSDP2, FSDP1) as PyTorch's torch.distributed.checkpoint.state_dict
#                does, and stands on DCP's agreement utilities as PyTorch's does on DCP's.
set(TDC_LAYERS
  "comm|"
  "mesh|comm"
  "nn|"
  "tensor|comm mesh nn"
  "ddp|comm mesh nn tensor"
  "tp|comm mesh nn tensor"
  "fsdp|comm mesh nn tensor"
  "fsdp1|comm mesh nn tensor"
  "checkpoint|comm mesh tensor"
  "state_dict|comm mesh nn tensor ddp fsdp fsdp1 checkpoint"
  "pipelining|comm mesh nn tensor ddp fsdp")
