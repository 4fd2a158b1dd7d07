// The parameters one fully_shard call owns (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py):
// their ShardedState ([Note: FSDP lifecycles] in common.h), unshard / wait / reshard, and the
// reduce-scatter of their gradients in backward.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "collectives.h"
#include "common.h"
#include "param.h"
#include "tdc/fsdp/fully_shard.h"

namespace tdc::fsdp {

class ParamGroup {
 public:
  ParamGroup(std::vector<FSDPParam> params, MeshInfo mesh_info, const FullyShardOptions& options);

  std::vector<FSDPParam>& params() { return params_; }
  const std::vector<FSDPParam>& params() const { return params_; }
  bool empty() const { return params_.empty(); }
  const MeshInfo& mesh_info() const { return mesh_info_; }
  const MixedPrecisionPolicy& mp_policy() const { return mp_; }
  const OffloadPolicy& offload_policy() const { return offload_; }
  // Module FQN (or type) for lifecycle errors; set by the state at lazy init.
  void set_label(std::string label) { label_ = std::move(label); }
  const std::string& label() const { return label_; }

  // ---------------------------------------------------------------- ShardedState
  ShardedState sharded_state() const { return sharded_state_; }
  // SHARDED (or stale UNSHARDED) -> UNSHARDING -> (sync) UNSHARDED. A no-op when UNSHARDED and up
  // to date; a sync unshard while UNSHARDING waits for the pending gather.
  void unshard(bool async_op = false);
  // UNSHARDING -> UNSHARDED (copy-out); a no-op in the other states.
  void wait_for_unshard();
  // UNSHARDED -> SHARDED (storage freed, substitutes removed); a no-op when SHARDED. Throws
  // naming the module and both states when UNSHARDING.
  void reshard();
  // What FSDP's own hooks do: finish a pending gather nobody waited for, then reshard.
  void finish_and_reshard();
  // Every parameter adopts a shard tensor re-registered behind FSDP's back (nn::to_empty).
  void reset_sharded_params();

  // ---------------------------------------------------------------- forward / backward
  // Autograd nodes of this group whose backward has not run yet (one per forward call with grad):
  // a module called twice before backward reshards only after its last node ran, since the other
  // call's saved tensors alias the same unsharded storage.
  void add_pending_node() { ++pending_nodes_; }
  bool finish_pending_node() {
    pending_nodes_ = std::max(0, pending_nodes_ - 1);
    return pending_nodes_ == 0;
  }
  void clear_pending_nodes() { pending_nodes_ = 0; }
  void check_unmodified(const char* when) const;
  // Outside backward: reduces the gradients kept by no_sync and adds them to the shards' .grad.
  void reduce_unsynced_grads();
  // [Note: async reduce-scatter] (state.cpp): issues the reduce-scatter of these gradients
  // without waiting (under no_sync: keeps them, as reduce_grads); finish_reduce waits for it and
  // adds the shard gradients to the shards' .grad. A no-op with nothing pending.
  void reduce_grads_async(const std::vector<at::Tensor>& grads);
  void finish_reduce();

  // ---------------------------------------------------------------- knobs (FSDPModule setters)
  bool reshard_after_forward = true;
  bool reshard_after_backward = true;
  bool requires_gradient_sync = true;

 private:
  bool up_to_date() const;
  // Adds shard gradients to the shards' .grad as autograd's AccumulateGrad would.
  void accumulate_into_shards(const std::vector<at::Tensor>& shard_grads);

  std::vector<FSDPParam> params_;
  MeshInfo mesh_info_;
  MixedPrecisionPolicy mp_;
  OffloadPolicy offload_;
  std::string label_;
  ShardedState sharded_state_ = ShardedState::SHARDED;
  std::optional<AllGatherResult> all_gather_result_;  // set exactly while UNSHARDING
  std::optional<ReduceScatterResult> reduce_result_;  // set from reduce_grads_async to finish_reduce
  int pending_nodes_ = 0;
  CollectiveChecks checks_;
};

}  // namespace tdc::fsdp
