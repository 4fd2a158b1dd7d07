#pragma once

#include <string>
// The one place where tdc adapts to differences between the LibTorch versions it supports
// (2.11, 2.12, 2.13, 2.14; docs/compat.md). Every difference is a [Note] below naming the versions
// and the API; code elsewhere uses the names defined here and never tests TORCH_VERSION_* itself.
//
// Detection prefers the API's own shape (decltype) over version numbers, so that a patch release
// that backports a change needs no edit here; the versions in each note say where it was seen.
#include <type_traits>
#include <utility>

#include <torch/csrc/autograd/function.h>  // node.h in 2.13+, function.h (which includes it) in all
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

namespace tdc::compat {

// [Note: autograd Node pointers]
// torch::autograd::Node is held by std::shared_ptr<Node> in 2.11 and 2.12, and by
// c10::intrusive_ptr<Node> from 2.13 on (grad_accumulator, grad_fn, Edge::function all changed
// together; torch/csrc/autograd/node.h appeared then, function.h stayed as the include that works
// in every version). NodePtr is whatever grad_accumulator() returns; both pointer types have
// get(), operator bool and operator->, which is all tdc uses.
using NodePtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));
static_assert(std::is_same_v<NodePtr, decltype(std::declval<torch::autograd::Edge>().function)>,
              "LibTorch: Edge::function and grad_accumulator() hold autograd Nodes differently");

// [Note: Gloo's reduce-scatter honours the op]
// ProcessGroupGloo::_reduce_scatter_base (reduce_scatter_tensor) once built the result on an
// all-reduce and ignored the op (always SUM). In every supported release it honours SUM, MAX and
// MIN for float32, bfloat16 and float16: probed live with each release's PyTorch, 2.11.0, 2.12.1,
// 2.13.0 and 2.14.1 (tools/compat/gloo_reduce_scatter_probe.py; docs/compat.md), and covered on
// each by CommTest's reduce-scatter tests. Below 2.11 tdc does not build, so no older answer is
// needed; a release where it changes again gets its condition here.
inline constexpr bool kGlooReduceScatterHonoursOp = TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 11;

// [Note: how c10d refuses a reduce-scatter a backend lacks] A c10d::Backend that overrides no
// reduce-scatter refuses _reduce_scatter_base with "Backend <name> does not support
// _reduce_scatter_base" (2.11-2.13, read in their Backend.hpp); 2.14 adds reduce_scatter_single,
// the two forward to each other and a guard refuses with "... does not support
// reduce_scatter_single". Either text means "lacks it" ([Note: native ops or emulation]).
inline bool is_reduce_scatter_refusal(const char* what) {
  const std::string w = what ? what : "";
  return w.find("does not support _reduce_scatter_base") != std::string::npos ||
         w.find("does not support reduce_scatter_single") != std::string::npos;
}

// The LibTorch version this translation unit was compiled against, "major.minor.patch".
inline constexpr int kTorchMajor = TORCH_VERSION_MAJOR;
inline constexpr int kTorchMinor = TORCH_VERSION_MINOR;
inline constexpr int kTorchPatch = TORCH_VERSION_PATCH;

}  // namespace tdc::compat
