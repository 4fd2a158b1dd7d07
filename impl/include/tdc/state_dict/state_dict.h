// State dicts (torch.distributed.checkpoint.state_dict): a model's or an optimizer's state keyed by
// PyTorch's FQNs, whatever parallelism the model runs under (plain, DDP, TP, FSDP2 1-D / HSDP,
// TP x FSDP2), in the sharded form (DTensor entries: local shard + mesh + placements) or the full
// form (plain tensors), and back.
//
// A StateDict is flat and ordered; nested dicts use dotted keys, as DCP flattens them:
//   model:      "layers.0.weight" -> DTensor or tensor, persistent buffers included;
//   optimizer:  "state.layers.0.weight.exp_avg" -> DTensor or tensor (laid out as the parameter),
//               "state.layers.0.weight.step"    -> 0-dim float32 tensor (PyTorch's form),
//               "param_groups"                  -> JSON: [{"lr": ..., ..., "params": [FQNs]}].
// Copying a StateDict copies tensor handles, not data: a loaded entry writes into the tensor the
// model or optimizer holds.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "tdc/checkpoint/state_dict_value.h"
#include "tdc/nn/module.h"
#include "tdc/tensor/dtensor.h"

namespace torch::optim {
class Optimizer;
}
namespace tdc::fsdp1 {
class FullyShardedDataParallel;
}

namespace tdc::checkpoint {

struct StateDictOptions {
  // get: gather every sharded entry into a full tensor. set: the given dict holds full tensors
  // (on every rank, or on rank 0 only with broadcast_from_rank0).
  bool full_state_dict = false;
  // With full_state_dict: full tensors on the CPU, and only rank 0 gets them (other ranks get an
  // empty dict), as PyTorch.
  bool cpu_offload = false;
  // get: leave out parameters with requires_grad == false (and their optimizer state).
  bool ignore_frozen_params = false;
  // set: every key of the model must be in the dict and every key of the dict in the model;
  // otherwise CheckpointError naming every missing and every unexpected key.
  bool strict = true;
  // set with full_state_dict: only rank 0's dict has values; rank 0 broadcasts each tensor and
  // every rank keeps its shard. Other ranks may pass an empty dict.
  bool broadcast_from_rank0 = false;
};

// nn.Module.state_dict(): the model's parameters (DTensor where TP/FSDP sharded them) and
// persistent buffers, keyed by the module's own FQNs (wrapper segments such as DDP's "module."
// included, as PyTorch's module.state_dict()). An FSDP1 root gives its state_dict() under its
// current state_dict_type (wrapper-free FQNs, as PyTorch's FSDP1 hooks do).
StateDict module_state_dict(nn::Module& model);

// get_model_state_dict / set_model_state_dict. FQNs are PyTorch's: wrapper segments (DDP's
// "module.", FSDP1's "_fsdp_wrapped_module.") dropped. A model whose root is an FSDP1 wrapper
// (tdc::fsdp1) gives its SHARDED_STATE_DICT entries ([Note: FSDP1 sharded state-dict layout]):
// copies, which set_* writes back through FSDP1; optimizer state is laid out the same way per
// original parameter. set_* checks everything first (keys with strict, then per key the kind,
// dtype, global shape and placements, naming the key and both values) and changes nothing when it
// throws; then copies the values into the model's tensors in place (the optimizer keeps its
// references). A sharded entry may have other placements or another mesh than the model's
// parameter: it is redistributed (same mesh) or must be full.
StateDict get_model_state_dict(nn::Module& model, const StateDictOptions& options = {});
void set_model_state_dict(nn::Module& model, const StateDict& state_dict, const StateDictOptions& options = {});

// get_optimizer_state_dict / set_optimizer_state_dict for LibTorch's Adam, AdamW and SGD (other
// optimizers: std::invalid_argument naming the type). The optimizer's parameters must be
// parameters of `model` (the FQNs come from there). get initialises empty optimizer state the way
// PyTorch does (zero gradients, one step with lr 0) so that every key exists. set restores
// per-parameter state (step included) and the param_groups' hyperparameters.
StateDict get_optimizer_state_dict(nn::Module& model, torch::optim::Optimizer& optim,
                                   const StateDictOptions& options = {});
void set_optimizer_state_dict(nn::Module& model, torch::optim::Optimizer& optim, const StateDict& state_dict,
                              const StateDictOptions& options = {});

// get_state_dict / set_state_dict: both at once.
std::pair<StateDict, StateDict> get_state_dict(nn::Module& model, torch::optim::Optimizer& optim,
                                               const StateDictOptions& options = {});
void set_state_dict(nn::Module& model, torch::optim::Optimizer& optim, const StateDict& model_state_dict,
                    const StateDict& optim_state_dict, const StateDictOptions& options = {});

// PyTorch's FSDP1 optimizer state-dict calls, which are this API's optimizer state dicts for a
// model whose root is an FSDP1 wrapper. In PyTorch they are static methods of FSDP; here they live
// beside the API they use, so that FSDP1 stays below it ([Note: libtdc's layering]).
// `optim` must step the tree's params() (flat parameters or original views); Adam, AdamW, SGD.
// Collective over every unit's group.
//   fsdp1_optim_state_dict (FSDP.optim_state_dict): by `model`'s state_dict_type: FULL -> full
//     tensors on every rank, SHARDED -> DTensors laid out as the parameters' sharded entries
//     (LOCAL_STATE_DICT: std::invalid_argument).
//   fsdp1_sharded_optim_state_dict (FSDP.sharded_optim_state_dict): always the SHARDED form.
//   fsdp1_load_optim_state_dict (FSDP.optim_state_dict_to_load + optim.load_state_dict in one): any
//     of those forms (DTensors on any mesh are gathered); checks every key, shape and group first
//     (CheckpointError naming them) and changes nothing when one is wrong.
StateDict fsdp1_optim_state_dict(fsdp1::FullyShardedDataParallel& model, torch::optim::Optimizer& optim);
StateDict fsdp1_sharded_optim_state_dict(fsdp1::FullyShardedDataParallel& model, torch::optim::Optimizer& optim);
void fsdp1_load_optim_state_dict(fsdp1::FullyShardedDataParallel& model, torch::optim::Optimizer& optim,
                                 const StateDict& optim_state_dict);

}  // namespace tdc::checkpoint
