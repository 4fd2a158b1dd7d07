// The FSDP state of one fully_shard'ed module (torch/distributed/fsdp/_fully_shard/_fsdp_state.py):
// its module hooks, lazy init of the root, prefetching and its TrainingState ([Note: FSDP
// lifecycles] in common.h); and the registry from modules to states.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common.h"
#include "param_group.h"
#include "tdc/nn/module.h"

namespace tdc::fsdp {

class FSDPState : public std::enable_shared_from_this<FSDPState> {
 public:
  FSDPState(nn::Module& module, ParamGroup group);

  nn::Module& module() const { return *module_; }
  ParamGroup& group() { return group_; }
  TrainingState training_state() const { return training_state_; }
  // "'blocks.0' (TransformerBlock)": the FQN under the root once lazily initialised.
  const std::string& label() const { return label_; }
  bool is_root() const { return is_root_.value_or(false); }

  // Installs the forward pre-hook and forward hook on the module.
  void register_hooks();

  // ---------------------------------------------------------------- FSDPModule's controls
  // unshard()/reshard() from the public API: legal outside this module's forward and outside any
  // backward pass (FSDP's hooks own the parameters there). Throws naming both states.
  void check_user_control(const char* action) const;
  void set_forward_prefetch(std::vector<nn::Module*> modules) { forward_prefetch_ = std::move(modules); }
  void set_backward_prefetch(std::vector<nn::Module*> modules) { backward_prefetch_ = std::move(modules); }
  bool is_last_backward = true;

  // ---------------------------------------------------------------- hooks (state.cpp)
  nn::Tensors pre_forward(nn::Tensors inputs);
  nn::Tensors post_forward(nn::Tensors outputs);
  void pre_backward();
  std::vector<at::Tensor> post_backward(const std::vector<at::Tensor>& grads);

 private:
  void lazy_init();
  void root_post_backward();
  void queue_root_post_backward();  // root only: root_post_backward at the end of this backward
  // Issues async unshards of `modules` (explicit prefetch).
  static void prefetch_unshard(const std::vector<nn::Module*>& modules);
  // [Note: implicit prefetch] (state.cpp): the forward / backward order this iteration records
  // and the state it prefetches by default.
  void record_pre_forward_and_prefetch();
  void record_post_forward();
  void implicit_backward_prefetch();
  void prefetch_in_tree(const FSDPState* target);  // root only: an async unshard of `target`
  static bool backward_in_flight();
  void apply_unshard_function();

  nn::Module* module_;
  ParamGroup group_;
  std::string label_;
  TrainingState training_state_ = TrainingState::IDLE;
  std::optional<bool> is_root_;                 // unset until lazy init
  std::vector<std::weak_ptr<FSDPState>> tree_;  // root only: every state under it (itself included)
  std::weak_ptr<FSDPState> root_;               // set at lazy init (the root's is itself)
  // Root only, [Note: implicit prefetch]: the states in pre-forward order, this iteration's and the
  // last's, and in post-forward order (with multiplicity) since the last backward.
  std::vector<FSDPState*> pre_forward_order_, last_pre_forward_order_, post_forward_order_;
  std::vector<size_t> post_forward_indices_;  // this state's places in the root's post_forward_order_
  std::weak_ptr<FSDPState> pending_reduce_;   // root only: the state whose reduce-scatter is in flight
  std::vector<nn::Module*> forward_prefetch_, backward_prefetch_;
  bool root_backward_queued_ = false;  // root only: its end-of-backward callback is queued
};

// ---------------------------------------------------------------- registry
std::shared_ptr<FSDPState> state_of(const nn::Module& module);
void register_state(nn::Module& module, std::shared_ptr<FSDPState> state);
// Every FSDP state in `module`'s subtree, itself included, in named_modules order.
std::vector<std::shared_ptr<FSDPState>> states_in(const nn::Module& module);

}  // namespace tdc::fsdp
