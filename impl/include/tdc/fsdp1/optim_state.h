// FSDP1 optimizer state in state-dict form: the state of flat parameters (or of the original
// parameters' shard views) converted to and from per-original-parameter entries laid out as the
// parameters' sharded state-dict entries. tdc::checkpoint's optimizer state dict calls these for
// models whose root is an FSDP1 wrapper, through this public header; FSDP1 knows nothing of the
// state-dict API ([Note: libtdc's layering]).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdc/tensor/state_dict.h"
#include "tdc/fsdp1/fully_sharded_data_parallel.h"

namespace tdc::fsdp1::detail {

// A tensor the optimizer steps (a flat parameter's shard, an original parameter's view, or a
// parameter FSDP does not manage) and the FQNs of the original parameters it stands for.
struct OptimizerParam {
  at::Tensor param;
  std::vector<std::string> fqns;
};
std::vector<OptimizerParam> optimizer_params(FullyShardedDataParallel& root);

// Per original parameter, in optimizer_params() order: its FQN and its state tensors by name, as
// sharded state-dict entries (fresh copies; [Note: FSDP1 sharded state-dict layout]). Collective.
struct ParamEntries {
  std::string fqn;
  std::vector<std::pair<std::string, tensor::StateDictValue>> tensors;
};
std::vector<ParamEntries> optimizer_state_entries(FullyShardedDataParallel& root, torch::optim::Optimizer& optim);

// Writes `entries` ("state.<fqn>.<name>" keys, values in any form slot_value accepts; missing
// keys keep their state) into the optimizer's state tensors. Collective; the entries are checked
// (shapes) before anything is written.
void write_optimizer_state_entries(FullyShardedDataParallel& root, torch::optim::Optimizer& optim,
                                   const tensor::StateDict& entries);

}  // namespace tdc::fsdp1::detail
