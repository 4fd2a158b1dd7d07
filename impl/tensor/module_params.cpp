// Distributed parameters of tdc::nn modules: local tensor registered, DTensorSpec as metadata.
#include "tdc/tensor/module_params.h"

#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tdc::tensor {

void set_param_spec(nn::Module& module, const std::string& name, const DTensorSpec& spec) {
  const at::Tensor* found = module.find_param(name);
  if (!found) module.p(name);  // throws naming the module and the parameters it has
  const at::Tensor& local = *found;
  std::vector<int64_t> expect = spec.local_shape();
  if (local.sizes().vec() != expect) {
    throw std::invalid_argument(
        fmt::format("set_param_spec: parameter '{}' of {} has local shape [{}] but {} gives this rank [{}]", name,
                    module.type_name(), fmt::join(local.sizes(), ", "), spec.to_string(), fmt::join(expect, ", ")));
  }
  module.set_param_meta(name, spec);
}

const DTensorSpec* param_spec(const nn::Module& module, const std::string& name) {
  const std::any* meta = module.param_meta(name);
  return meta ? std::any_cast<DTensorSpec>(meta) : nullptr;
}

std::optional<DTensor> param_dtensor(nn::Module& root, const std::string& fqn) {
  auto [owner, name] = root.owner_of(fqn);
  const at::Tensor* t = owner->find_param(name);
  if (!t) throw std::invalid_argument(fmt::format("param_dtensor: no parameter '{}' under {}", fqn, root.type_name()));
  const DTensorSpec* spec = param_spec(*owner, name);
  if (!spec) return std::nullopt;
  return DTensor(*t, *spec);
}

at::Tensor NamedParam::full() const { return dtensor ? dtensor->full_tensor().detach() : tensor.detach(); }

at::Tensor NamedParam::full_grad() const {
  if (!tensor.grad().defined()) return {};
  if (!dtensor) return tensor.grad();
  return dtensor->grad()->full_tensor();
}

std::vector<NamedParam> named_params_with_specs(nn::Module& root) {
  std::vector<NamedParam> out;
  for (auto& [fqn, t] : root.named_params()) {
    auto [owner, name] = root.owner_of(fqn);
    NamedParam np{fqn, t, std::nullopt};
    if (const DTensorSpec* spec = param_spec(*owner, name)) np.dtensor = DTensor(t, *spec);
    out.push_back(std::move(np));
  }
  return out;
}

}  // namespace tdc::tensor
