// nn::to_empty (tdc/nn/to_empty.h).
#include "tdc/nn/to_empty.h"

#include <stdexcept>
#include <unordered_map>

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace tdc::nn {

void to_empty(Module& module, c10::Device device) {
  std::unordered_map<const c10::TensorImpl*, at::Tensor> replaced;  // old tensor -> its new one
  for (auto& [prefix, m] : module.named_modules_tdc()) {
    for (const auto& item : m->named_parameters(/*recurse=*/false)) {
      const at::Tensor& t = item.value();
      if (!t.defined()) continue;
      auto it = replaced.find(t.unsafeGetTensorImpl());
      if (it == replaced.end()) {
        // empty_like, as Module.to_empty: a tensor subclass (a wrapper tensor) stays one.
        at::Tensor fresh = at::empty_like(t.detach(), t.options().device(device)).requires_grad_(t.requires_grad());
        it = replaced.emplace(t.unsafeGetTensorImpl(), fresh).first;
      }
      m->replace_param(item.key(), it->second);
    }
    for (const auto& [name, b] : m->named_bufs(/*recurse=*/false)) {
      // Buffers keep their identity (LibTorch's registry holds them too): set_data, which LibTorch
      // allows between dense devices but not from meta.
      if (b.is_meta()) {
        throw std::invalid_argument(fmt::format(
            "to_empty: buffer '{}' is on the meta device; tdc can materialise meta parameters but not meta buffers "
            "(build buffers on a real device)",
            prefix.empty() ? name : prefix + "." + name));
      }
      at::Tensor(b).set_data(at::empty(b.sizes(), b.options().device(device)));
    }
  }
}

}  // namespace tdc::nn
