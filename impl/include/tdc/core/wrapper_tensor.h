// Wrapper tensors: a tensor made of inner tensors, the C++ counterpart of a PyTorch tensor
// subclass built with _make_wrapper_subclass (TwoTensor, Float8 training tensors, ...).
//
// [Note: wrapper tensors] A wrapper tensor has no storage of its own: its TensorImpl carries the
// outer metadata (shape, strides, dtype, device) and the inner tensors hold the data, as a Python
// wrapper subclass's __tensor_flatten__ names them. The subclass that defines one routes ops to
// its inner tensors through a dispatch key of its own (conformance's TwoTensor uses PrivateUse2).
// tdc's components see wrappers only through `parts_of`:
//   * comm runs an in-place collective (all_reduce, broadcast) on each part, as c10d's ops do
//     when they dispatch through a subclass; the other collectives refuse a wrapper by name;
//   * FSDP2 frees and re-allocates the storage of each part of an unsharded parameter, and a
//     wrapper handed to its all-gather is first copied into the plain all-gather buffer (what
//     PyTorch's copy-in does: the copy runs on each part in turn into the same buffer).
// Nothing else needs to know: every op on a wrapper goes through its dispatch key.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

namespace tdc::core {

class WrapperTensorImpl : public c10::TensorImpl {
 public:
  // Outer metadata as `like`'s (shape, strides, offset, dtype, device); `keys` routes the ops.
  // Storage access throws: the data is in the parts.
  WrapperTensorImpl(c10::DispatchKeySet keys, const at::Tensor& like);
  // The inner tensors, in a fixed order (TwoTensor: a, b).
  virtual std::vector<at::Tensor> parts() const = 0;
};

// Whether `t` is a wrapper tensor.
bool is_wrapper(const at::Tensor& t);
// The inner tensors of a wrapper; {t} for any other tensor.
std::vector<at::Tensor> parts_of(const at::Tensor& t);

}  // namespace tdc::core
