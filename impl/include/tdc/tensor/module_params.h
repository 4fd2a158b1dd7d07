// Parameters that TP and FSDP have distributed: the module keeps the rank's local tensor as the
// registered parameter (what optimizers and DDP see) and the DTensorSpec as the parameter's
// metadata (tdc::nn::Module::set_param_meta), so the parameter reads back as a DTensor
// (architecture.md: "Parameters sharded by TP/FSDP carry their spec in module metadata").
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tdc/nn/module.h"
#include "tdc/tensor/dtensor.h"

namespace tdc::tensor {

// Records `spec` as the layout of `module`'s direct parameter `name`. The registered tensor must
// have the spec's local shape on this rank (std::invalid_argument naming both otherwise).
void set_param_spec(nn::Module& module, const std::string& name, const DTensorSpec& spec);
// The recorded spec, or nullptr for a plain (undistributed) parameter.
const DTensorSpec* param_spec(const nn::Module& module, const std::string& name);

// The parameter at dotted `fqn` under `root` as a DTensor (its local tensor is the registered
// parameter, so .grad() and the optimizer see the same tensor); nullopt for a plain parameter.
// Throws naming the FQN when there is no such parameter.
std::optional<DTensor> param_dtensor(nn::Module& root, const std::string& fqn);

// Every parameter of `root` in named_params() order; distributed ones as their DTensor, plain
// ones as nullopt next to the tensor.
struct NamedParam {
  std::string fqn;
  at::Tensor tensor;               // the registered (local) parameter
  std::optional<DTensor> dtensor;  // set when the parameter is distributed
  // The whole parameter (all-gathered when distributed; a collective on the spec's mesh).
  at::Tensor full() const;
  // Its whole gradient (undefined when there is none; all-gathered when distributed).
  at::Tensor full_grad() const;
};
std::vector<NamedParam> named_params_with_specs(nn::Module& root);

}  // namespace tdc::tensor
