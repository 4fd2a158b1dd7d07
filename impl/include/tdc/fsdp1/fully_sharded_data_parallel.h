// FSDP1 for tdc::nn modules: FullyShardedDataParallel (torch.distributed.fsdp.FullyShardedDataParallel).
//
//   fsdp1::FSDPOptions opts;
//   opts.auto_wrap_policy = fsdp1::ModuleWrapPolicy({"TransformerEncoderLayer"});
//   auto model = fsdp1::FullyShardedDataParallel::make(net, opts);   // net: an nn::ModulePtr
//   torch::optim::SGD opt(model->params(), 0.01);
//   model->forward({x})[0].sum().backward();                          // grads in the shards
//   opt.step();
//
// Each FSDP unit (the wrapper and every auto-wrapped or manually wrapped submodule) owns one flat
// parameter: the unit's parameters not owned by a nested unit, flattened and concatenated in
// named_params() order, padded to a multiple of the world size and sharded on dim 0 of that flat
// vector (this rank keeps its contiguous chunk). Forward all-gathers it and exposes views of the
// unsharded vector as the original parameters; backward reduce-scatters the flat gradient into the
// shard's .grad (all-reduce for NO_SHARD), scaled as PyTorch's FSDP1 (pre- and post-divide
// factors). How it works and where it departs from PyTorch: docs/fsdp1.md.
//
// Parameters as the optimizer sees them (model->params()):
//   use_orig_params = false: one "_flat_param" per unit (registered on the wrapped module, so its
//     FQN is "<unit>._fsdp_wrapped_module._flat_param"); the original names hold no tensor.
//   use_orig_params = true: the original parameters, each a 1-D view of this rank's part of the
//     flat shard (possibly empty); NO_SHARD: views with the original shapes.
// Inside summon_full_params both forms show the original parameters with their full values.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "tdc/tensor/state_dict.h"
#include "tdc/comm/process_group.h"
#include "tdc/device_mesh.h"
#include "tdc/fsdp1/wrap.h"
#include "tdc/nn/module.h"

namespace torch::optim {
class Optimizer;
}

namespace tdc::fsdp1 {

// FULL_SHARD: shard parameters, gradients, optimizer state; reshard after forward and backward.
// SHARD_GRAD_OP: keep parameters unsharded from forward to the end of backward.
// NO_SHARD: replicate (DDP-like: all-reduce gradients).
// HYBRID_SHARD / _HYBRID_SHARD_ZERO2: FULL_SHARD / SHARD_GRAD_OP within the shard dim of a 2-D
// device_mesh (replicate, shard), gradients all-reduced across the replicate dim.
enum class ShardingStrategy { FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, _HYBRID_SHARD_ZERO2 };
enum class BackwardPrefetch { BACKWARD_PRE, BACKWARD_POST };
enum class StateDictType { FULL_STATE_DICT, LOCAL_STATE_DICT, SHARDED_STATE_DICT };
const char* to_string(ShardingStrategy strategy);
const char* to_string(BackwardPrefetch prefetch);
const char* to_string(StateDictType type);

// [Note: FSDP1 lifecycles] (PyTorch's TrainingState and HandleTrainingState)
// A unit is in one TrainingState:
//   IDLE               -- outside forward/backward and summon_full_params;
//   FORWARD_BACKWARD   -- from its pre-forward to the root's end-of-backward callback;
//   SUMMON_FULL_PARAMS -- inside summon_full_params.
// Its flat parameter handle is in one HandleTrainingState:
//   IDLE -> FORWARD -> IDLE (after forward) -> BACKWARD_PRE -> BACKWARD_POST -> IDLE (end of backward),
//   IDLE -> SUMMON_FULL_PARAMS -> IDLE.
// Every transition is checked; a wrong one throws std::logic_error naming the unit, the action,
// the state it is in and the states the action needs.
enum class TrainingState { IDLE, FORWARD_BACKWARD, SUMMON_FULL_PARAMS };
enum class HandleTrainingState { IDLE, FORWARD, BACKWARD_PRE, BACKWARD_POST, SUMMON_FULL_PARAMS };
const char* to_string(TrainingState state);
const char* to_string(HandleTrainingState state);

// The flat parameter (and so its gradient and optimizer state) stays on the CPU; forward and
// backward copy it to the compute device. Lazy init throws when an offloaded unit's parameters
// sit elsewhere ("An FSDP-managed module with parameter CPU offloading enabled has parameters on
// <device>. Make sure to not move the module from CPU when offloading parameters.").
struct CPUOffload {
  bool offload_params = false;
};

// Low-precision training. param_dtype: the unsharded parameters (the shard is cast, then
// all-gathered); reduce_dtype: the gradient reduction (default: param_dtype); buffer_dtype: the
// buffers, cast at the root's lazy init. All-None (MixedPrecision{}) is full precision.
struct MixedPrecision {
  std::optional<at::ScalarType> param_dtype;
  std::optional<at::ScalarType> reduce_dtype;
  std::optional<at::ScalarType> buffer_dtype;
  bool keep_low_precision_grads = false;  // false: sharded gradients back in the parameter dtype
  bool cast_forward_inputs = false;       // every unit casts its floating inputs to param_dtype
  bool cast_root_forward_inputs = true;   // the root does
};

struct FSDPOptions {
  // The group the unit shards over; nullptr and no device_mesh: the default group (all ranks).
  comm::GroupPtr process_group;
  // Instead of process_group: 1-D (shard over it) or 2-D (replicate, shard) for the hybrid
  // strategies. A 2-D mesh with a non-hybrid strategy shards over dim 0, as PyTorch.
  std::optional<DeviceMesh> device_mesh;
  ShardingStrategy sharding_strategy = ShardingStrategy::FULL_SHARD;
  CPUOffload cpu_offload;
  WrapPolicy auto_wrap_policy;
  std::optional<BackwardPrefetch> backward_prefetch = BackwardPrefetch::BACKWARD_PRE;
  std::optional<MixedPrecision> mixed_precision;
  // Submodules (and their parameters and buffers) FSDP leaves alone.
  std::vector<nn::Module*> ignored_modules;
  // The compute device; nullopt: where the parameters are (the CPU on this machine).
  std::optional<c10::Device> device_id;
  // Broadcast rank 0's parameters and buffers to every rank at construction.
  bool sync_module_states = false;
  // Gather the next unit (in the first iteration's order) at the start of each forward.
  bool forward_prefetch = false;
  bool limit_all_gathers = true;  // accepted; tdc's gathers are issued in order anyway
  bool use_orig_params = false;
};

// summon_full_params(module, ...) options (PyTorch's keyword arguments).
struct SummonOptions {
  bool recurse = true;          // every unit in the subtree (false: the given unit only)
  bool writeback = true;        // changes to the full parameters persist into the shards
  bool rank0_only = false;      // only rank 0 sees full parameters (others: their shards)
  bool offload_to_cpu = false;  // the full parameters are CPU copies
  bool with_grads = false;      // full gradients too (use_orig_params = true only)
};

class UnitState;

// The FSDP1 wrapper: an nn::Module whose only child is the wrapped module, "_fsdp_wrapped_module".
class FullyShardedDataParallel : public nn::Module {
 public:
  // Wraps `module` (and, with an auto_wrap_policy, its submodules) in place: every managed
  // parameter becomes part of its unit's flat parameter. Throws std::invalid_argument, naming the
  // module and the value, and changes nothing when: the module (or a submodule the policy picks)
  // is already wrapped; use_orig_params = false and a unit's parameters mix dtypes or
  // requires_grad; a ModuleWrapPolicy type matches no module; a hybrid strategy lacks a 2-D mesh;
  // both process_group and device_mesh are given.
  static std::shared_ptr<FullyShardedDataParallel> make(nn::ModulePtr module, const FSDPOptions& options = {});

  nn::Tensors forward(const nn::Tensors& inputs) override;
  nn::ModulePtr clone_empty() const override;  // throws: copy the model before wrapping it
  // Moves the flat parameters, the other parameters and the buffers of the tree. A dtype change
  // throws std::invalid_argument (use mixed_precision, or convert before wrapping).
  void to(torch::Device device, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;

  nn::Module& module() const;  // the wrapped module (PyTorch's .module)
  const FSDPOptions& options() const;
  bool is_root() const;  // known after the first forward (lazy init)
  TrainingState training_state() const;
  HandleTrainingState handle_training_state() const;  // IDLE when the unit owns no parameters
  const comm::GroupPtr& process_group() const;

  // The unit's flat parameter: this rank's shard (NO_SHARD: the whole vector); undefined when the
  // unit owns no parameters. What the optimizer steps when use_orig_params = false.
  const at::Tensor& flat_param() const;
  // FQNs (relative to the wrapped module, wrapper segments removed) of the parameters in the flat
  // parameter, in flattening order.
  std::vector<std::string> flat_param_fqns() const;

  // Every FSDP unit in `module`'s tree, pre-order (FSDP.fsdp_modules); root_only: the outermost.
  static std::vector<FullyShardedDataParallel*> fsdp_modules(nn::Module& module, bool root_only = false);

  // Gradient accumulation without communication: backward passes while the guard lives keep
  // unsharded gradients; the first backward after it reduces them. Every unit of this tree.
  class NoSyncGuard;
  NoSyncGuard no_sync();

  // Clips the gradients of every parameter of this tree (sharded ones by their global norm, over
  // the process group) so that the total norm is at most max_norm; returns the total norm. Root
  // only, outside forward and backward.
  at::Tensor clip_grad_norm_(double max_norm, double norm_type = 2.0);

  // State dicts (PyTorch's state_dict_type context). FULL_STATE_DICT: full tensors, wrapper-free
  // FQNs; SHARDED_STATE_DICT: each parameter a DTensor Shard(0) over the unit's 1-D mesh;
  // LOCAL_STATE_DICT: "<unit>._flat_param" local shards. Buffers are full tensors in every type.
  //
  // [Note: FSDP1 sharded state-dict layout] (PyTorch's _create_chunk_dtensor / DTensorExtensions)
  // A SHARDED_STATE_DICT entry is the parameter's global value as a DTensor:
  //   1-D device_mesh or process_group:  (Shard(0)) over the unit's mesh;
  //   2-D device_mesh (hybrid or not):   (Replicate(), Shard(0)) over it -- PyTorch chunks over the
  //                                      last dim whatever group the unit shards over;
  //   device_mesh a slice of a larger mesh (the DTensor extension, FSDP over TP): over the whole
  //                                      mesh, Shard(0) on the slice's dim, the TP placement on the
  //                                      TP dim (Replicate() for parameters TP left alone).
  // Entries are copies: writing into them changes nothing until load_state_dict.
  class StateDictTypeGuard;
  static StateDictTypeGuard state_dict_type(nn::Module& module, StateDictType type);
  // Sets the type of every unit in `module`'s tree until changed again (FSDP.set_state_dict_type).
  static void set_state_dict_type(nn::Module& module, StateDictType type);
  StateDictType current_state_dict_type() const;
  tensor::StateDict state_dict();
  // Loads what state_dict() of the same type returned. Checks every key, dtype and shape first
  // (core::CheckpointError naming them) and changes nothing when one is wrong.
  void load_state_dict(const tensor::StateDict& state_dict, bool strict = true);

  // PyTorch's `_fsdp_extension` is a DTensorExtensions: device_mesh is a slice of a larger mesh
  // (mesh["dp"] of a ("dp", "tp") mesh), so the unit's parameters may be TP's local shards and its
  // sharded state dicts are DTensors over the whole mesh. False for a process_group, a 1-D mesh
  // made on its own and a 2-D mesh given whole.
  bool uses_dtensor_extension() const;

  // PyTorch's FSDP.optim_state_dict, FSDP.sharded_optim_state_dict and FSDP.optim_state_dict_to_load
  // are checkpoint::fsdp1_optim_state_dict & co (tdc/state_dict/state_dict.h): they are the
  // state-dict API's optimizer state dicts, and FSDP1 stays below that API (docs/decisions.md).

  // Internal: the runtime behind the wrapper.
  UnitState& unit() const { return *unit_; }
  FullyShardedDataParallel(nn::ModulePtr module, std::shared_ptr<UnitState> unit);
  ~FullyShardedDataParallel() override;

 private:
  std::shared_ptr<UnitState> unit_;
};
using FSDPPtr = std::shared_ptr<FullyShardedDataParallel>;

// Every unit of `module`'s tree shows its full parameters while the guard lives (PyTorch's
// FSDP.summon_full_params context). Not inside forward or backward (std::logic_error naming the
// unit and its state). Collective over each unit's group.
class SummonFullParams {
 public:
  SummonFullParams(nn::Module& module, const SummonOptions& options = {});
  ~SummonFullParams();
  SummonFullParams(const SummonFullParams&) = delete;
  SummonFullParams& operator=(const SummonFullParams&) = delete;

 private:
  std::vector<FullyShardedDataParallel*> units_;
  SummonOptions options_;
};
inline SummonFullParams summon_full_params(nn::Module& module, const SummonOptions& options = {}) {
  return SummonFullParams(module, options);
}

class FullyShardedDataParallel::NoSyncGuard {
 public:
  explicit NoSyncGuard(std::vector<FullyShardedDataParallel*> units);
  NoSyncGuard(NoSyncGuard&& other) noexcept;
  ~NoSyncGuard();

 private:
  std::vector<FullyShardedDataParallel*> units_;
  std::vector<bool> previous_;
};

class FullyShardedDataParallel::StateDictTypeGuard {
 public:
  StateDictTypeGuard(std::vector<FullyShardedDataParallel*> units, StateDictType type);
  StateDictTypeGuard(StateDictTypeGuard&& other) noexcept;
  ~StateDictTypeGuard();
  void release();  // keep the new type (set_state_dict_type)

 private:
  std::vector<FullyShardedDataParallel*> units_;
  std::vector<StateDictType> previous_;
};

}  // namespace tdc::fsdp1
