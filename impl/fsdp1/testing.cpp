// FSDP1 test observers (testing.h).
#include "tdc/fsdp1/testing.h"

#include "common.h"
#include "flat_param.h"

#include <c10/util/intrusive_ptr.h>

#include <mutex>
#include <unordered_map>

namespace tdc::fsdp1::testing {

namespace {
thread_local Observers t_observers;

// Hooks per tensor, keyed by its TensorImpl (the weak pointer tells a dead tensor's reused address).
std::mutex g_mu;
std::unordered_map<const c10::TensorImpl*, std::pair<c10::weak_intrusive_ptr<c10::TensorImpl>, int>>& hook_counts() {
  static std::unordered_map<const c10::TensorImpl*, std::pair<c10::weak_intrusive_ptr<c10::TensorImpl>, int>> m;
  return m;
}
}  // namespace

ScopedObservers::ScopedObservers(Observers observers) : previous_(std::move(t_observers)) {
  t_observers = std::move(observers);
}
ScopedObservers::~ScopedObservers() { t_observers = std::move(previous_); }

int pre_backward_hook_count(const at::Tensor& tensor) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = hook_counts().find(tensor.unsafeGetTensorImpl());
  if (it == hook_counts().end() || it->second.first.expired()) return 0;
  return it->second.second;
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

void count_pre_backward_hook(const at::Tensor& tensor) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& m = hook_counts();
  for (auto it = m.begin(); it != m.end();) it = it->second.first.expired() ? m.erase(it) : std::next(it);
  auto it = m.find(tensor.unsafeGetTensorImpl());
  if (it == m.end()) {
    it = m.emplace(tensor.unsafeGetTensorImpl(),
                   std::make_pair(c10::weak_intrusive_ptr<c10::TensorImpl>(tensor.getIntrusivePtr()), 0))
             .first;
  }
  ++it->second.second;
}

}  // namespace detail
}  // namespace tdc::fsdp1::testing
