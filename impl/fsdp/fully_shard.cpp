// FSDP2's API (tdc/fsdp/fully_shard.h): fully_shard and the FSDPModule methods
// (torch/distributed/fsdp/_fully_shard/_fully_shard.py). The runtime is in state.cpp (hooks),
// param_group.cpp (ShardedState), param.cpp (one parameter) and collectives.cpp.
#include "tdc/fsdp/fully_shard.h"

#include <stdexcept>

#include <fmt/format.h>

#include "init.h"
#include "state.h"

namespace tdc::fsdp {

FSDPModule fully_shard(nn::Module& module, const FullyShardOptions& options) {
  check_not_fully_sharded(module);
  const DeviceMesh mesh = options.mesh ? *options.mesh : default_mesh();
  check_options(module, mesh, options);
  std::vector<ParamPlan> plan = plan_params(module, mesh, options);  // validates; changes nothing
  const MeshInfo mesh_info = MeshInfo::of(mesh);
  std::vector<FSDPParam> params;
  params.reserve(plan.size());
  for (auto& pl : plan) params.emplace_back(std::move(pl), mesh_info, options);
  auto state = std::make_shared<FSDPState>(module, ParamGroup(std::move(params), mesh_info, options));
  for (auto& p : state->group().params()) p.register_sharded();
  register_state(module, state);
  state->register_hooks();
  return FSDPModule(state);
}

bool is_fully_sharded(const nn::Module& module) { return state_of(module) != nullptr; }

FSDPModule as_fsdp(nn::Module& module) {
  auto s = state_of(module);
  if (!s) {
    throw std::invalid_argument(
        fmt::format("module of type '{}' was never fully_shard'ed: it has no FSDPModule "
                    "methods (call fully_shard on it first)",
                    module.type_name()));
  }
  return FSDPModule(s);
}

// ------------------------------------------------------------------ FSDPModule

nn::Module& FSDPModule::module() const { return state_->module(); }

UnshardHandle FSDPModule::unshard(bool async_op) {
  state_->check_user_control(async_op ? "unshard(async_op=true)" : "unshard()");
  state_->group().unshard(async_op);
  if (!async_op) return UnshardHandle();
  std::weak_ptr<FSDPState> weak = state_;
  return UnshardHandle([weak] {
    if (auto s = weak.lock()) s->group().wait_for_unshard();
  });
}

void FSDPModule::reshard() {
  state_->check_user_control("reshard()");
  state_->group().reshard();
}

namespace {
// This state, or with recurse every FSDP state in its module's subtree.
template <class F>
void for_states(FSDPState& state, bool recurse, F&& f) {
  if (!recurse) {
    f(state);
    return;
  }
  for (auto& s : states_in(state.module())) f(*s);
}
}  // namespace

void FSDPModule::set_requires_gradient_sync(bool sync, bool recurse) {
  for_states(*state_, recurse, [sync](FSDPState& s) { s.group().requires_gradient_sync = sync; });
}
void FSDPModule::set_reshard_after_backward(bool on, bool recurse) {
  for_states(*state_, recurse, [on](FSDPState& s) { s.group().reshard_after_backward = on; });
}
void FSDPModule::set_reshard_after_forward(bool on, bool recurse) {
  for_states(*state_, recurse, [on](FSDPState& s) {
    if (!s.is_root()) s.group().reshard_after_forward = on;
  });
}
void FSDPModule::set_modules_to_forward_prefetch(const std::vector<nn::Module*>& modules) {
  for (nn::Module* m : modules) as_fsdp(*m);  // each must be fully_shard'ed (throws naming it)
  state_->set_forward_prefetch(modules);
}
void FSDPModule::set_modules_to_backward_prefetch(const std::vector<nn::Module*>& modules) {
  for (nn::Module* m : modules) as_fsdp(*m);
  state_->set_backward_prefetch(modules);
}
void FSDPModule::set_is_last_backward(bool on) { state_->is_last_backward = on; }

void FSDPModule::finish_gradient_accumulation() {
  state_->check_user_control("finish_gradient_accumulation()");
  for (auto& s : states_in(state_->module())) {
    s->group().reduce_unsynced_grads();
    s->group().finish_and_reshard();
  }
}
bool FSDPModule::is_last_backward() const { return state_->is_last_backward; }

}  // namespace tdc::fsdp
