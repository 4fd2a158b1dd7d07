// Setting live tensors from a state dict (set_model_state_dict, set_optimizer_state_dict): every
// given value is checked against its target and converted to the target's local layout first
// (resharding, slicing full tensors, broadcasting from rank 0), and only then copied in, so a
// failure on any rank changes nothing on any rank. Internal to libtdc.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdc/state_dict/state_dict.h"

namespace tdc::checkpoint::detail {

struct Assignment {
  std::string key;
  at::Tensor dst;  // the live tensor (a parameter, a buffer, an optimizer state tensor)
  at::Tensor src;  // its new value, same shape, on its device
};

// `targets`: key -> the live value (tensor or DTensor; its local tensor is written). `given`: the
// caller's dict (its JSON entries are ignored here). `who` names the API in messages.
// Collective over the world when any value is distributed or broadcast_from_rank0 is set.
std::vector<Assignment> stage(const std::string& who, const StateDict& targets, const StateDict& given,
                              const StateDictOptions& options);
// Copies every src into its dst (no autograd). Cannot fail once stage() succeeded.
void commit(const std::vector<Assignment>& assignments);

// set_optimizer_state_dict's checks and conversions; the returned function commits them (it
// cannot fail), so set_state_dict can stage the model and the optimizer before changing either.
std::function<void()> stage_optimizer(nn::Module& model, torch::optim::Optimizer& optim, const StateDict& given,
                                      const StateDictOptions& options);

}  // namespace tdc::checkpoint::detail
