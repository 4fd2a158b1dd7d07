// UnitState: the runtime of one FSDP1 unit (torch/distributed/fsdp/_runtime_utils.py): lazy init
// of the root, pre/post-forward, pre/post-backward, prefetching, the end-of-backward callback.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "flat_param.h"
#include "tdc/fsdp1/fully_sharded_data_parallel.h"

namespace tdc::fsdp1 {

// [Note: an FSDP1 unit's role] (PyTorch's _is_root: None, then True or False)
// A unit's role is UNSET until a lazy init: the first unit whose forward runs (or that a state
// dict, summon_full_params or clip_grad_norm_ initialises) becomes the ROOT of every unit below
// it, and those become NON_ROOT. UNSET -> ROOT or UNSET -> NON_ROOT, once; NON_ROOT -> NON_ROOT
// when a tree is wrapped again (PyTorch relaxes its assert for that). A ROOT never becomes
// NON_ROOT: a unit that was initialised as a root and then wrapped by another unit is refused
// naming both, as PyTorch's _lazy_init asserts ("Non-root FSDP instance's `_is_root` should not
// have been set yet or should have been set to `False`").
enum class UnitRole { UNSET, ROOT, NON_ROOT };
const char* to_string(UnitRole role);

class UnitState : public std::enable_shared_from_this<UnitState> {
 public:
  UnitState(FSDPOptions options, comm::GroupPtr shard_pg, comm::GroupPtr replicate_pg,
            std::unique_ptr<detail::FlatParamHandle> handle, std::vector<nn::Module*> ignored);

  // ---- set up by FullyShardedDataParallel::make
  void attach(FullyShardedDataParallel* wrapper);
  FullyShardedDataParallel& wrapper() const { return *wrapper_; }
  nn::Module& wrapped() const;
  const FSDPOptions& options() const { return options_; }
  const comm::GroupPtr& shard_pg() const { return shard_pg_; }
  detail::FlatParamHandle* handle() const { return handle_.get(); }
  const std::string& label() const { return label_; }

  // ---- forward and backward
  nn::Tensors pre_forward(nn::Tensors inputs);
  nn::Tensors post_forward(nn::Tensors outputs);
  void pre_backward();
  void post_backward(const std::vector<at::Tensor>& grads);

  // ---- state
  TrainingState training_state() const { return training_state_; }
  void set_training_state(TrainingState next, const char* action, std::initializer_list<TrainingState> allowed);
  bool is_root() const { return role_ == UnitRole::ROOT; }
  bool sync_gradients = true;
  StateDictType state_dict_type = StateDictType::FULL_STATE_DICT;
  // Throws std::logic_error naming the unit when called inside forward/backward (action: what).
  void check_idle(const char* action) const;
  // Floating buffers cast to buffer_dtype by the root's lazy init: their original dtypes.
  std::vector<std::pair<at::Tensor, at::ScalarType>> cast_buffers;
  // Lazy init from outside forward (state dicts, summon, clip_grad_norm_ on an unrun model).
  void lazy_init();
  // The units of this root's tree, pre-order (root only; after lazy_init).
  const std::vector<UnitState*>& tree() const { return tree_; }

 private:
  void check_offloaded_devices() const;
  void agree_collective_plans();  // [Note: FSDP1 checks its collectives once per tree]
  [[noreturn]] void throw_plan_mismatch(const comm::GroupPtr& group, const std::vector<std::string>& units,
                                        const std::vector<std::string>& all) const;
  void cast_root_buffers();
  void apply_unshard_node();
  void prefetch(int direction);  // +1: next in forward order, -1: the one whose backward is next
  void root_end_of_backward();
  // [Note: FSDP1 and activation recompute]
  // A module checkpointed inside the unit (nn::checkpoint) reruns its forward during backward, in
  // a nested backward that autograd may order after the unit's post-backward node. So such a unit
  // installs leaf views of its unsharded vector as the parameters at pre-backward (the recompute
  // reads them and its gradients accumulate in their .grad), keeps the unsharded vector, and
  // reduces once, at the root's end of backward: the post-backward node's gradients plus the
  // leaves'. Reduction is linear, so the result equals the unrecomputed one.
  bool recomputes_inside() const;
  void install_backward_leaves();
  void finish_deferred_backward();
  void reduce_grads(const std::vector<at::Tensor>& grads);
  void finish_pending_reduce();  // root only: [Note: FSDP1 async reduce-scatter]
  std::vector<at::Tensor> backward_leaves_;
  std::vector<at::Tensor> deferred_grads_;
  // PyTorch's _reshard(state, handle, free): the reshard step after forward and after backward,
  // which frees the unsharded vector only when `free` (the before_reshard observer sees each step).
  void reshard(bool free);
  void record_execution(std::vector<UnitState*> UnitState::*order);

  FSDPOptions options_;
  comm::GroupPtr shard_pg_, replicate_pg_;
  std::unique_ptr<detail::FlatParamHandle> handle_;
  std::vector<nn::Module*> ignored_;
  FullyShardedDataParallel* wrapper_ = nullptr;
  std::string label_;
  TrainingState training_state_ = TrainingState::IDLE;
  UnitRole role_ = UnitRole::UNSET;
  UnitState* root_ = nullptr;
  std::vector<UnitState*> tree_;  // root: every unit below it, itself first
  // Root: units with parameters in the order of their pre-forwards and of their post-forwards in
  // the first iteration (forward prefetch walks the first, backward prefetch the second backwards).
  std::vector<UnitState*> pre_forward_order_, post_forward_order_;
  bool exec_order_frozen_ = false;
  bool end_of_backward_queued_ = false;
  UnitState* pending_reduce_ = nullptr;  // root only: the unit whose reduction is in flight
};

}  // namespace tdc::fsdp1
