// FlatParamHandle: one FSDP1 unit's flat parameter (torch/distributed/fsdp/_flat_param.py) — the
// flattening plan, the shard, the unsharded vector and its views, gradient reduction.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "tdc/comm/collectives.h"
#include "tdc/comm/process_group.h"
#include "tdc/fsdp1/fully_sharded_data_parallel.h"
#include "tdc/nn/module.h"
#include "tdc/tensor/dtensor.h"

namespace tdc::fsdp1::detail {

// One original parameter inside the flat vector.
struct ParamSlot {
  nn::Module* module = nullptr;  // the module that registered it
  std::string name;              // its direct name there
  std::string fqn;               // relative to the unit's wrapped module, wrapper segments removed
  std::vector<int64_t> shape;
  int64_t numel = 0, offset = 0;  // in the unpadded flat vector
  bool requires_grad = true;
  // Set when the parameter is TP's local shard (FSDP over TP, the DTensor extension): its layout
  // over the TP mesh. The slot's shape is the local shape.
  std::optional<tensor::DTensorSpec> tp_spec;
};
// A further registration of a flattened parameter (weight tying): same tensor, another module.
struct SharedSlot {
  nn::Module* module = nullptr;
  std::string name;
  std::string fqn;
  size_t primary = 0;  // index into the slots
};

// [Note: FSDP1 unshard lifecycle] (FSDP2's ShardedState, for one flat parameter)
// SHARDED: only the shard exists (the unsharded vector's storage is freed). unshard(async) issues
// the all-gather into the re-allocated unsharded vector and goes to UNSHARDING; wait_for_unshard()
// finishes it: UNSHARDED. A sync unshard() does both; a sync unshard() while UNSHARDING waits for
// the gather a prefetch issued ([Note: FSDP1 async prefetch], unit_state.cpp). reshard() while
// UNSHARDING waits first, so storage is never freed under a collective still writing it. NO_SHARD
// has no collective: its unshard goes straight to UNSHARDED.
enum class UnshardState { SHARDED, UNSHARDING, UNSHARDED };
const char* to_string(UnshardState state);

struct HandleConfig {
  comm::GroupPtr shard_pg;      // the group the flat vector is sharded over
  comm::GroupPtr replicate_pg;  // hybrid strategies: gradients all-reduced over it too
  bool sharded = true;          // false: NO_SHARD (also any strategy on a 1-rank group)
  bool use_orig_params = false;
  std::optional<MixedPrecision> mp;
  double predivide = 1.0, postdivide = 1.0;
  c10::Device compute_device = c10::Device(c10::kCPU);
  std::string label;                                // for messages: "FSDP unit 'layers.0' (TransformerEncoderLayer)"
  const FullyShardedDataParallel* owner = nullptr;  // the unit (test observers name it)
};

// [Note: FSDP1 flat parameter]
// flat_param_ is this rank's shard of the padded flat vector: numel() = padded / world, the
// rank's chunk [rank * shard_numel, (rank + 1) * shard_numel) (NO_SHARD: the whole unpadded
// vector). It is a leaf requiring grad; its .grad is the sharded gradient. The unsharded vector
// (padded, compute dtype) is one tensor whose storage is freed at reshard and re-allocated at
// unshard, so views autograd saved in forward are valid again when backward re-gathers. Forward
// exposes views of it (original shapes) as parameter substitutes; gradients of those views arrive
// together in the unit's autograd node, are copied into one flat gradient, reduce-scattered (NO_SHARD:
// all-reduced) with PyTorch's pre/post-divide factors, cast back to the parameter dtype and added
// to the shard's .grad. use_orig_params: the original parameters are 1-D views of their part of
// the shard, and their .grad views of the sharded gradient.
class FlatParamHandle {
 public:
  FlatParamHandle(std::vector<ParamSlot> slots, std::vector<SharedSlot> shared, const std::vector<at::Tensor>& values,
                  HandleConfig config);

  const HandleConfig& config() const { return config_; }
  void set_owner(const FullyShardedDataParallel* owner, std::string label) {
    config_.owner = owner;
    config_.label = std::move(label);
  }
  const std::vector<ParamSlot>& slots() const { return slots_; }
  const std::vector<SharedSlot>& shared_slots() const { return shared_; }
  const at::Tensor& flat_param() const { return flat_param_; }
  int64_t numel() const { return numel_; }
  int64_t padded_numel() const { return padded_numel_; }
  int64_t shard_numel() const { return flat_param_.numel(); }
  int64_t shard_offset() const { return shard_offset_; }  // of this rank's shard in the flat vector
  bool sharded() const { return config_.sharded; }
  at::ScalarType param_dtype() const { return flat_param_.scalar_type(); }
  at::ScalarType compute_dtype() const;
  at::ScalarType reduce_dtype() const;

  HandleTrainingState state() const { return state_; }
  void set_state(HandleTrainingState next, const char* action, std::initializer_list<HandleTrainingState> allowed);

  // Moves the shard (and the unsharded vector) to `device`, re-deriving the original views and
  // re-registering them on `wrapped`.
  void move_to(c10::Device device, nn::Module& wrapped);
  // The registered tensors: use_orig_params = false: "_flat_param" on the wrapped module, the
  // original names empty; true: each original name holds its view of the shard.
  void register_sharded(nn::Module& wrapped);
  // summon_full_params: the original names hold `full` views (full precision), "_flat_param" hidden.
  void register_full(nn::Module& wrapped, const at::Tensor& full, bool with_grads);

  // All-gathers the compute-dtype unsharded vector (no-op when it is current). async_op: returns
  // with the gather in flight (UNSHARDING); wait_for_unshard() or a sync unshard() finishes it.
  void unshard(bool async_op = false);
  void wait_for_unshard();
  UnshardState unshard_state() const { return unshard_state_; }
  bool is_unsharded() const { return unshard_state_ != UnshardState::SHARDED; }
  // Frees the unsharded vector (sharded strategies; NO_SHARD drops its alias or low-precision copy).
  void reshard();
  // The full-precision padded flat vector, gathered fresh (summon_full_params, state dicts).
  at::Tensor gather_full_precision();
  // gather_full_precision() of each handle, in order, small ones sharing all-gathers
  // ([Note: FSDP1 gathers small flat parameters together], gather_together.cpp). Collective.
  static std::vector<at::Tensor> gather_full_precision_together(std::span<FlatParamHandle* const> handles);
  // Writes `full` (padded, full precision) back into this rank's shard.
  void write_back(const at::Tensor& full);
  // A tensor laid out as this rank's shard (numel == shard_numel()), all-gathered into the padded
  // flat vector (NO_SHARD: returned as is). Any dtype; collective over the shard group.
  at::Tensor gather_shard_shaped(const at::Tensor& shard) const;
  // This rank's [begin, end) of slot `i` inside its shard (empty when the slot lies elsewhere).
  std::pair<int64_t, int64_t> slot_range_in_shard(size_t i) const;
  // The gradient of the whole flat vector (padded), gathered; undefined when no gradient exists.
  at::Tensor gather_full_grad();

  // Views of the unsharded vector with the slots' shapes (one per slot).
  std::vector<at::Tensor> unsharded_views() const;
  std::vector<at::Tensor> views_of(const at::Tensor& flat) const;
  // Installs / removes the forward substitutes (shared slots get the primary's view).
  void install_substitutes(const std::vector<at::Tensor>& views);
  void clear_substitutes();

  // Gradients of the views (undefined = zero) -> the padded flat gradient in the compute dtype.
  at::Tensor flatten_grads(const std::vector<at::Tensor>& grads) const;
  // no_sync: keeps the flat gradient unsharded, summed over backwards.
  void accumulate_unsharded(const at::Tensor& flat_grad);
  // Reduces (with any kept no_sync gradient) and adds the result to the sharded gradient.
  // async_op: returns with the reduce-scatter (NO_SHARD: all-reduce) in flight; finish_reduce()
  // waits for it and does the rest ([Note: FSDP1 async reduce-scatter], unit_state.cpp).
  void reduce_and_accumulate(at::Tensor flat_grad, bool async_op = false);
  void finish_reduce();
  bool reduce_pending() const { return pending_reduce_.has_value(); }
  // The sharded gradient, or undefined (use_orig_params: from the original parameters' grads).
  at::Tensor sharded_grad() const;

  // The collectives this handle issues, one line each ("all_gather float32[6] -> [12]"), with the
  // group each runs on: what the root compares across ranks at lazy init. mark_collectives_checked()
  // then lets them skip the per-call argument checks.
  std::vector<std::pair<comm::GroupPtr, std::string>> collective_plan() const;
  void mark_collectives_checked();

  // Tensors the optimizer sees for this handle (the flat shard, or the original views).
  std::vector<at::Tensor> optimizer_params() const;

  bool ran_pre_backward = false;

 private:
  // Tells the test observers which views PyTorch's unshard would expose in this state.
  void notify_unsharded_views_by_state() const;

  void accumulate_sharded(const at::Tensor& new_shard_grad);
  // Hybrid strategies: the reduced gradient is all-reduced over the replicate group too.
  bool reduces_over_replicas() const;
  void set_unshard_state(UnshardState next, const char* action, std::initializer_list<UnshardState> allowed);
  void make_orig_views();
  // One all-gather for a run of handles that gather_full_precision_together joined.
  static std::vector<at::Tensor> gather_run(std::span<FlatParamHandle* const> run);

  std::vector<ParamSlot> slots_;
  std::vector<SharedSlot> shared_;
  HandleConfig config_;
  int64_t numel_ = 0, padded_numel_ = 0, shard_offset_ = 0;
  at::Tensor flat_param_;         // the shard (leaf)
  std::vector<at::Tensor> orig_;  // use_orig_params: the registered views of the shard
  at::Tensor unsharded_;          // padded, compute dtype; storage freed when resharded
  UnshardState unshard_state_ = UnshardState::SHARDED;
  // Set exactly while UNSHARDING: the gather in flight and its input (kept alive until it ends).
  comm::Work pending_gather_;
  at::Tensor pending_gather_input_;
  int64_t gathered_version_ = -1;  // flat_param_'s version the unsharded vector was made from
  // Set from an async reduce_and_accumulate to finish_reduce: the collective and its output.
  struct PendingReduce {
    comm::Work work;
    at::Tensor input, reduced;
  };
  std::optional<PendingReduce> pending_reduce_;
  at::Tensor grad_accum_;  // no_sync: unsharded flat gradient
  HandleTrainingState state_ = HandleTrainingState::IDLE;
  // [Note: FSDP's collectives skip the argument checks after the first] (fsdp/collectives.cpp):
  // a flat vector's collectives have the same layout at every step.
  // shard-shaped all-gathers (unshard, gather_shard_shaped) by dtype; the reduction; the replicate
  // group's all-reduce. Set by the first call, or for all at once by the root's lazy init
  // ([Note: FSDP1 checks its collectives once per tree], unit_state.cpp).
  mutable std::set<at::ScalarType> gathers_checked_;
  bool reduce_checked_ = false, replicate_checked_ = false;
};

}  // namespace tdc::fsdp1::detail
