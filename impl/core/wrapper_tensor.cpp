// Wrapper tensors (tdc/core/wrapper_tensor.h).
#include "tdc/core/wrapper_tensor.h"

namespace tdc::core {

WrapperTensorImpl::WrapperTensorImpl(c10::DispatchKeySet keys, const at::Tensor& like)
    : c10::TensorImpl(keys, like.dtype(), like.device()) {
  set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  set_storage_access_should_throw();
}

bool is_wrapper(const at::Tensor& t) {
  return t.defined() && dynamic_cast<const WrapperTensorImpl*>(t.unsafeGetTensorImpl()) != nullptr;
}

std::vector<at::Tensor> parts_of(const at::Tensor& t) {
  if (const auto* w = t.defined() ? dynamic_cast<const WrapperTensorImpl*>(t.unsafeGetTensorImpl()) : nullptr) {
    return w->parts();
  }
  return {t};
}

}  // namespace tdc::core
