// LibTorch's per-parameter optimizer state by name (tdc/core/optimizer_access.h).
#include "tdc/core/optimizer_access.h"

#include <stdexcept>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace tdc::core {
namespace {

template <class S>
ParamState adam_like(S& s) {
  ParamState out{{{"exp_avg", s.exp_avg()}, {"exp_avg_sq", s.exp_avg_sq()}}, s.step()};
  if (s.max_exp_avg_sq().defined()) out.tensors.emplace_back("max_exp_avg_sq", s.max_exp_avg_sq());
  return out;
}

}  // namespace

OptimKind optimizer_kind(torch::optim::Optimizer& optim) {
  if (dynamic_cast<torch::optim::AdamW*>(&optim)) return OptimKind::AdamW;
  if (dynamic_cast<torch::optim::Adam*>(&optim)) return OptimKind::Adam;
  if (dynamic_cast<torch::optim::SGD*>(&optim)) return OptimKind::SGD;
  throw std::invalid_argument(
      "tdc::checkpoint: optimizer state dicts support LibTorch's Adam, AdamW and SGD; this optimizer is none of them");
}

std::optional<ParamState> optimizer_param_state(torch::optim::Optimizer& optim, const at::Tensor& param) {
  return optimizer_param_state(optim, optimizer_kind(optim), param);
}

std::optional<ParamState> optimizer_param_state(torch::optim::Optimizer& optim, OptimKind kind,
                                                const at::Tensor& param) {
  auto it = optim.state().find(param.unsafeGetTensorImpl());
  if (it == optim.state().end()) return std::nullopt;
  switch (kind) {
    case OptimKind::Adam:
      return adam_like(static_cast<torch::optim::AdamParamState&>(*it->second));
    case OptimKind::AdamW:
      return adam_like(static_cast<torch::optim::AdamWParamState&>(*it->second));
    case OptimKind::SGD: {
      auto& s = static_cast<torch::optim::SGDParamState&>(*it->second);
      return ParamState{{{"momentum_buffer", s.momentum_buffer()}}, std::nullopt};
    }
  }
  return std::nullopt;
}

}  // namespace tdc::core
