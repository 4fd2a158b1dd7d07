// PyTorch's FQNs for state dicts: a module's own FQNs minus the segments of wrapper modules
// (DDP's "module."), as torch.distributed.checkpoint.state_dict's _get_fqns does. Internal.
#pragma once

#include <map>
#include <string>

#include "tdc/nn/module.h"

namespace tdc::checkpoint::detail {

// The child name a wrapper module hides from state-dict FQNs ("module" for DDP), or "" when
// `module` is not a wrapper. FSDP1's wrapper adds itself here.
std::string wrapper_child(const nn::Module& module);
// "module.0.in_proj.weight" under a DDP root -> "0.in_proj.weight".
std::string clean_fqn(nn::Module& root, const std::string& fqn);
// Every parameter of `root` (tied ones once) by its TensorImpl, with its PyTorch FQN.
std::map<const void*, std::string> param_fqns(nn::Module& root);

}  // namespace tdc::checkpoint::detail
