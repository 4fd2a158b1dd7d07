// FSDP1 test observers (testing.h).
#include "tdc/fsdp1/testing.h"

#include "common.h"
#include "flat_param.h"
#include "tdc/fsdp1/fully_sharded_data_parallel.h"
#include "unit_state.h"

#include <torch/csrc/autograd/variable.h>

#include <algorithm>

namespace tdc::fsdp1::testing {

namespace {
thread_local Observers t_observers;

}  // namespace

ScopedObservers::ScopedObservers(Observers observers) : previous_(std::move(t_observers)) {
  t_observers = std::move(observers);
}
ScopedObservers::~ScopedObservers() { t_observers = std::move(previous_); }

// [Note: hooks are read from autograd] Tensor::register_hook appends to the AutogradMeta's
// cpp_hooks_list_ (LibTorch 2.11-2.14 alike: VariableHooks::_register_hook) and remove_hook nulls
// the entry, so the live hooks are the non-null entries: what PyTorch's len(t._backward_hooks)
// counts. A hook registered twice, or never, shows here whoever registered it.
int pre_backward_hook_count(const at::Tensor& tensor) {
  auto* meta = torch::autograd::impl::get_autograd_meta(tensor);
  if (!meta || !meta->cpp_hooks_list_) return 0;
  return static_cast<int>(std::count_if(meta->cpp_hooks_list_->begin(), meta->cpp_hooks_list_->end(),
                                        [](const auto& hook) { return static_cast<bool>(hook); }));
}

OverlapState overlap_state(const std::vector<FullyShardedDataParallel*>& units) {
  OverlapState out;
  for (const FullyShardedDataParallel* u : units) {
    const auto* h = u->unit().handle();
    if (h == nullptr) continue;
    if (h->unshard_state() == fsdp1::detail::UnshardState::UNSHARDING) ++out.unsharding;
    if (h->reduce_pending()) ++out.reducing;
  }
  return out;
}

namespace detail {

void notify_register_pre_backward_hooks() {
  if (t_observers.on_register_pre_backward_hook_call) t_observers.on_register_pre_backward_hook_call();
}
void notify_register_post_backward_hook() {
  if (t_observers.on_register_post_backward_hook) t_observers.on_register_post_backward_hook();
}
void notify_unsharded_views(bool as_params) {
  if (t_observers.on_use_unsharded_views) t_observers.on_use_unsharded_views(as_params);
}
void notify_before_reshard(const fsdp1::detail::FlatParamHandle& handle) {
  if (t_observers.before_reshard && handle.config().owner) t_observers.before_reshard(*handle.config().owner);
}
}  // namespace detail
}  // namespace tdc::fsdp1::testing
