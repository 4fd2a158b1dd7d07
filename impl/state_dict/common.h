// What the model and optimizer halves of the state-dict API share: the full form of a sharded
// state dict, and (from DCP's detail header) the group the ranks act in and agreement. Internal to
// the state_dict component.
#pragma once

#include "tdc/checkpoint/detail/agreement.h"
#include "tdc/state_dict/state_dict.h"
#include "tdc/tensor/detail/layout.h"

namespace tdc::checkpoint::detail {

using tensor::global_shape;
using tensor::kind_name;          // "tensor", "DTensor (Shard(0)) on mesh ...", "JSON value"
using tensor::detail::shape_str;  // "[2, 3]"

// The full form of a sharded state dict (full_state_dict): DTensors gathered (a collective per
// entry, in order), on the CPU with cpu_offload, where only rank 0 keeps the result.
StateDict to_full(const StateDict& sharded, const StateDictOptions& options);

}  // namespace tdc::checkpoint::detail
