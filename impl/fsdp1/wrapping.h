// Building FSDP1 units: the wrap plan (auto-wrap policy, nested units), the checks, the flat
// parameter of each unit (torch/distributed/fsdp/_wrap_utils.py, _init_utils.py).
#pragma once

#include "tdc/fsdp1/fully_sharded_data_parallel.h"

namespace tdc::fsdp1::detail {

// FullyShardedDataParallel::make: checks everything first (std::invalid_argument naming the
// module and the value; nothing changed), then wraps the policy's submodules bottom-up and the
// module itself.
FSDPPtr wrap_module(nn::ModulePtr module, const FSDPOptions& options);
// Whether `module` is wrapped by a unit (it is some unit's _fsdp_wrapped_module).
bool is_wrapped(const nn::Module& module);
void forget_wrapped(const nn::Module* module);  // the unit around it is gone
// std::invalid_argument when `unit`'s strategy cannot produce `type`.
void check_state_dict_type_supported(const FullyShardedDataParallel& unit, StateDictType type);

}  // namespace tdc::fsdp1::detail
