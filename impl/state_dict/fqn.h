// PyTorch's FQNs for state dicts: a module's own FQNs minus the segments of wrapper modules
// (DDP's "module."), as torch.distributed.checkpoint.state_dict's _get_fqns does. Internal.
#pragma once

#include <map>
#include <string>

#include "tdc/nn/module.h"

namespace tdc::fsdp1 {
class FullyShardedDataParallel;
}

namespace tdc::checkpoint::detail {

// The child name a wrapper module hides from state-dict FQNs ("module" for DDP), or "" when
// `module` is not a wrapper; "_fsdp_wrapped_module" for FSDP1.
std::string wrapper_child(const nn::Module& module);
// The model as an FSDP1 root (its state dicts come from FSDP1, [Note: FSDP1 sharded state-dict
// layout]); nullptr when `model` is no FSDP1 wrapper. A model that is not one but holds FSDP1
// units is std::invalid_argument naming the first unit (wrap the root too, as PyTorch's DSD
// expects of FSDP1 models).
fsdp1::FullyShardedDataParallel* fsdp1_root(nn::Module& model);
// "module.0.in_proj.weight" under a DDP root -> "0.in_proj.weight".
std::string clean_fqn(nn::Module& root, const std::string& fqn);
// Every parameter of `root` (tied ones once) by its TensorImpl, with its PyTorch FQN.
std::map<const void*, std::string> param_fqns(nn::Module& root);

}  // namespace tdc::checkpoint::detail
