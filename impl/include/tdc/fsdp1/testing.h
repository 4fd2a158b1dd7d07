// Test observers of tdc::fsdp1: what PyTorch's test_fsdp_core reaches by mock-patching FSDP1's
// internals (spec E.4). Not part of the FSDP1 API.
//
//   _register_pre_backward_hooks (wrapped with a counter)   -> Observers::on_register_pre_backward_hooks
//   _register_post_backward_hook (replaced by a mock)       -> Observers::on_register_post_backward_hook
//   FlatParamHandle._use_unsharded_views(as_params)         -> Observers::on_use_unsharded_views
//   FSDP1's _reshard (patched to sleep before the free)     -> Observers::before_reshard
//   len(output._backward_hooks)                             -> pre_backward_hook_count(output)
//   (tdc's own) flat parameters by unshard state            -> overlap_state(units)
#pragma once

#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tdc::fsdp1 {
class FullyShardedDataParallel;
}

namespace tdc::fsdp1::testing {

struct Observers {
  // Each time a unit registers its pre-backward hooks on forward outputs (once per forward of a
  // unit, as PyTorch's _register_pre_backward_hooks).
  std::function<void()> on_register_pre_backward_hook_call;
  // Each time a unit arms the post-backward hook of its flat parameter (once per forward of a
  // unit with parameters that require grad).
  std::function<void()> on_register_post_backward_hook;
  // Each time a unit exposes its unsharded views; as_params = true when they are registered as
  // parameters (summon_full_params), false when installed as plain tensors (forward/backward).
  std::function<void(bool as_params)> on_use_unsharded_views;
  // Right before a unit frees its unsharded flat parameter.
  std::function<void(const FullyShardedDataParallel& unit)> before_reshard;
};

// Installs observers for the calling thread (rank) while it lives; nested: the newest wins.
class ScopedObservers {
 public:
  explicit ScopedObservers(Observers observers);
  ~ScopedObservers();
  ScopedObservers(const ScopedObservers&) = delete;
  ScopedObservers& operator=(const ScopedObservers&) = delete;

 private:
  Observers previous_;
};

// How many backward hooks are registered on `tensor` and not removed: PyTorch's
// len(output._backward_hooks), read from the tensor's autograd metadata (every hook anyone
// registered through Tensor::register_hook), not from a count FSDP1 keeps of its own.
int pre_backward_hook_count(const at::Tensor& tensor);

// How many of `units` have their all-gather in flight (UNSHARDING: [Note: FSDP1 async prefetch])
// and their gradient reduction in flight ([Note: FSDP1 async reduce-scatter]); units without
// parameters count in neither.
struct OverlapState {
  int unsharding = 0;
  int reducing = 0;
};
OverlapState overlap_state(const std::vector<FullyShardedDataParallel*>& units);

}  // namespace tdc::fsdp1::testing
