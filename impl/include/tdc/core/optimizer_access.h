// Reading LibTorch's per-parameter optimizer state (Adam, AdamW, SGD) by name: libtdc's base, for
// the optimizer state dict (checkpoint) and for wrappers that convert it (FSDP1's flat
// parameters). Internal to libtdc.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::optim {
class Optimizer;
}

namespace tdc::core {

enum class OptimKind { Adam, AdamW, SGD };

// Throws std::invalid_argument for optimizers other than LibTorch's Adam, AdamW and SGD.
OptimKind optimizer_kind(torch::optim::Optimizer& optim);

// A parameter's state: named tensors (the optimizer's own, so writing into them updates it) in
// PyTorch's order ("exp_avg", "exp_avg_sq"[, "max_exp_avg_sq"]; SGD "momentum_buffer"), and
// Adam's integer step ([Note: LibTorch's optimizer step is an integer]).
struct ParamState {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::optional<int64_t> step;
};

// nullopt when the optimizer holds no state for `param`. The first form throws like
// optimizer_kind.
std::optional<ParamState> optimizer_param_state(torch::optim::Optimizer& optim, const at::Tensor& param);
std::optional<ParamState> optimizer_param_state(torch::optim::Optimizer& optim, OptimKind kind,
                                                const at::Tensor& param);

}  // namespace tdc::core
