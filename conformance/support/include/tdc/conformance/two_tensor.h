// TwoTensor: PyTorch's test tensor subclass (torch/testing/_internal/two_tensor.py) in C++. A
// wrapper tensor holding two inner tensors `a` and `b` of the same shape, strides, dtype and
// device; every op runs on the `a`s and on the `b`s separately and tensor results are re-wrapped
// (non-tensor results are `a`'s). The outer metadata is `a`'s.
//
// [Note: TwoTensor's dispatch] A Python wrapper subclass is reached through the Python dispatch
// key, below autograd and above the backends, so it sees every op that has an autograd formula
// (CompositeImplicitAutograd ops decompose above it). C++ cannot use that key without a Python
// interpreter, so TwoTensor's TensorImpl carries PrivateUse2 as its backend, and the first
// two_tensor() registers one boxed kernel for PrivateUse2: on every aten op that is not
// CompositeImplicitAutograd (a direct registration wins over the CompositeExplicitAutograd
// kernels, which would otherwise build plain results from TensorOptions) and as the fallback of
// every other namespace. Autograd runs above it on the wrapper, as for the Python class. The
// kernel returns the wrapper argument itself for an op that writes an argument (in-place, out=),
// like return_and_correct_aliasing; a plain `out` written from TwoTensor inputs holds `b`'s
// result afterwards, as in PyTorch. The process owns PrivateUse2 from then on: a binary that also
// plugs a backend into PrivateUse2 cannot use TwoTensor.
#pragma once

#include <ATen/core/Tensor.h>

namespace tdc::conformance {

// TwoTensor(a, b). Throws std::invalid_argument naming the mismatch when a and b differ in shape,
// strides, storage offset, dtype, device or layout (as the Python constructor asserts).
// The result requires grad when a does; a and b are held detached.
at::Tensor two_tensor(const at::Tensor& a, const at::Tensor& b);

bool is_two_tensor(const at::Tensor& t);

// The inner tensors; throws std::invalid_argument when `t` is not a TwoTensor (`who` names the caller).
struct TwoParts {
  at::Tensor a, b;
};
TwoParts two_parts(const at::Tensor& t, const char* who);

}  // namespace tdc::conformance
