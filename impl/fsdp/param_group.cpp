// ParamGroup (param_group.h): one fully_shard'ed module's parameters and their ShardedState.
#include "param_group.h"

#include <algorithm>
#include <variant>

#include <ATen/core/grad_mode.h>

namespace tdc::fsdp {

ParamGroup::ParamGroup(std::vector<FSDPParam> params, MeshInfo mesh_info, const FullyShardOptions& options)
    : params_(std::move(params)),
      mesh_info_(std::move(mesh_info)),
      mp_(options.mp_policy),
      offload_(options.offload_policy) {
  // An int k reshards to a world of k after forward: k == 1 keeps the whole parameter (False);
  // any other divisor is resharded fully here (same values, at most the memory of True).
  const auto& raf = options.reshard_after_forward;
  reshard_after_forward = std::holds_alternative<bool>(raf) ? std::get<bool>(raf) : std::get<int64_t>(raf) != 1;
}

bool ParamGroup::up_to_date() const {
  return std::all_of(params_.begin(), params_.end(), [](const FSDPParam& p) { return p.up_to_date(); });
}

void ParamGroup::unshard(bool async_op) {
  if (params_.empty()) return;
  if (std::any_of(params_.begin(), params_.end(), [](const FSDPParam& p) { return p.registration_changed(); })) {
    reset_sharded_params();
  }
  switch (sharded_state_) {
    case ShardedState::UNSHARDING:
      if (!async_op) wait_for_unshard();
      return;
    case ShardedState::UNSHARDED:
      if (up_to_date()) return;
      break;  // stale: a shard changed in place; gather again into the same storage
    case ShardedState::SHARDED:
      break;
  }
  all_gather_result_ = foreach_all_gather(params_, mesh_info_, mp_, async_op, checks_);
  sharded_state_ = ShardedState::UNSHARDING;
  if (!async_op) wait_for_unshard();
}

void ParamGroup::wait_for_unshard() {
  if (sharded_state_ != ShardedState::UNSHARDING) return;
  foreach_all_gather_copy_out(*all_gather_result_, params_, mesh_info_);
  all_gather_result_.reset();
  sharded_state_ = ShardedState::UNSHARDED;
}

void ParamGroup::reshard() {
  check_state(label_, "reshard()", sharded_state_, {ShardedState::SHARDED, ShardedState::UNSHARDED});
  if (sharded_state_ == ShardedState::SHARDED) return;
  for (auto& p : params_) p.free_unsharded();
  sharded_state_ = ShardedState::SHARDED;
}

void ParamGroup::finish_and_reshard() {
  wait_for_unshard();
  reshard();
}

void ParamGroup::reset_sharded_params() {
  finish_and_reshard();
  for (auto& p : params_) p.reset_sharded_param(offload_);
}

void ParamGroup::check_unmodified(const char* when) const {
  for (const auto& p : params_) p.check_unmodified(when);
}

void ParamGroup::reduce_unsynced_grads() {
  if (std::none_of(params_.begin(), params_.end(), [](const FSDPParam& p) { return p.has_unsynced_grad(); })) return;
  const std::vector<at::Tensor> none(params_.size());
  accumulate_into_shards(foreach_reduce(params_, none, mesh_info_, mp_.reduce_dtype, checks_));
}

void ParamGroup::reduce_grads_async(const std::vector<at::Tensor>& grads) {
  check_unmodified("backward");
  finish_reduce();
  if (!requires_gradient_sync) {
    for (size_t i = 0; i < params_.size(); ++i) params_[i].accumulate_unsynced_grad(grads[i], mp_.reduce_dtype);
    return;
  }
  reduce_result_ = foreach_reduce_scatter(params_, grads, mesh_info_, mp_.reduce_dtype, checks_, /*async_op=*/true);
}

void ParamGroup::finish_reduce() {
  if (!reduce_result_) return;
  ReduceScatterResult result = std::move(*reduce_result_);
  reduce_result_.reset();
  accumulate_into_shards(foreach_reduce_finish(result, params_, mesh_info_));
}

void ParamGroup::accumulate_into_shards(const std::vector<at::Tensor>& shard_grads) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!shard_grads[i].defined()) continue;
    at::Tensor& grad = params_[i].sharded().mutable_grad();
    if (grad.defined()) {
      grad.add_(shard_grads[i]);
    } else {
      // A view of the reduce-scatter output would refuse the optimizer's zero_grad (detach_).
      grad = shard_grads[i].is_view() ? shard_grads[i].clone() : shard_grads[i];
    }
  }
}

}  // namespace tdc::fsdp
