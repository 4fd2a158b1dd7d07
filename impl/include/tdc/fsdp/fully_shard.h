// FSDP2 for tdc::nn modules: fully_shard (torch.distributed.fsdp.fully_shard).
//
//   for (auto& block : model->blocks) fsdp::fully_shard(*block);
//   fsdp::FSDPModule root = fsdp::fully_shard(*model, {.reshard_after_forward = true});
//   model->forward(x).sum().backward();   // gradients land in the shards' .grad
//
// fully_shard(module) makes `module` own one parameter group: every parameter in its subtree that
// no nested fully_shard'ed module already owns. Apply it bottom-up (blocks, then the root). Each
// parameter is sharded on dim 0 (or the dim shard_placement_fn picks) over the mesh's shard dim,
// torch.chunk rule. The registered parameter becomes the rank's shard: a leaf the optimizer sees,
// with a DTensorSpec (tensor/module_params.h) so it reads back as a DTensor (2-D with tensor
// parallel: (StridedShard(0), Shard(0)) when both shard dim 0, (Shard(0), Shard(d)) /
// (Shard(0), Replicate()) otherwise). Before the module's forward its parameters are all-gathered;
// after it they are freed again (reshard_after_forward), and gathered again for its backward,
// which reduce-scatters their gradients into the shards' .grad, averaged over the data-parallel
// ranks (PyTorch's FSDP2 scaling). The first fully_shard'ed module to run forward is the root: it
// keeps its parameters between forward and backward. How it works: docs/fsdp.md.
//
// Related headers: fsdp/all_gather_extension.h (fsdp_pre/post_all_gather), fsdp/testing.h (memory
// counters), nn/to_empty.h (meta-device models).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "tdc/device_mesh.h"
#include "tdc/nn/module.h"
#include "tdc/tensor/dtensor.h"
#include "tdc/tensor/placement.h"

namespace tdc::fsdp {

struct FullyShardOptions;
class FSDPModule;

// Shards `module` in place and returns its FSDPModule handle. Throws std::invalid_argument naming
// the module when it is already fully_shard'ed, the mesh has 3+ dims, or a parameter is not
// floating point / not on the mesh's device (unless CPU offload); nothing is changed then.
FSDPModule fully_shard(nn::Module& module, const FullyShardOptions& options);
inline FSDPModule fully_shard(nn::Module& module);  // default options

// The FSDPModule of a fully_shard'ed module; throws naming the module type otherwise.
FSDPModule as_fsdp(nn::Module& module);
bool is_fully_sharded(const nn::Module& module);

// ------------------------------------------------------------------ options

struct MixedPrecisionPolicy {
  std::optional<at::ScalarType> param_dtype;   // unsharded parameters (forward/backward compute)
  std::optional<at::ScalarType> reduce_dtype;  // gradient reduce-scatter / all-reduce
  std::optional<at::ScalarType> output_dtype;  // forward outputs cast to this
  bool cast_forward_inputs = true;             // floating inputs cast to param_dtype
};

// CPUOffloadPolicy: sharded parameters, their gradients and so the optimizer state live on the
// CPU; the all-gather copies them to the mesh's device. On a CPU mesh it changes nothing
// observable but is accepted (PyTorch needs an accelerator to show it).
struct OffloadPolicy {
  bool cpu_offload = false;
  bool pin_memory = true;
};
inline OffloadPolicy CPUOffloadPolicy(bool pin_memory = true) { return OffloadPolicy{true, pin_memory}; }

// The shard placement of one parameter: Shard(d) on the shard mesh dim; nullopt = Shard(0). It
// sees the parameter as registered (the TP-local tensor when tensor parallel distributed it), its
// TP spec (nullptr when not distributed) and its FQN relative to the fully_shard'ed module.
using ShardPlacementFn = std::function<std::optional<tensor::Shard>(
    const at::Tensor& param, const tensor::DTensorSpec* tp_spec, const std::string& fqn)>;

struct FullyShardOptions {
  // 1-D: shard over it. 2-D: HSDP, (replicate, shard). Default: every rank of the default group.
  std::optional<DeviceMesh> mesh;
  // true / false, or an int k (a divisor of the shard world size): reshard after forward to a
  // world of k. k == 1 keeps the whole parameter (as false); other k reshard fully in tdc (same
  // values; memory as true, PyTorch's keeps a 1/k piece; docs/decisions.md).
  std::variant<bool, int64_t> reshard_after_forward = true;
  ShardPlacementFn shard_placement_fn;
  MixedPrecisionPolicy mp_policy;
  OffloadPolicy offload_policy;
  std::vector<std::string> ignored_params;  // FQNs (relative to the module) left alone
};

// ------------------------------------------------------------------ FSDPModule

// An async unshard (FSDPModule.unshard(async_op=True)); wait() finishes it. Dropping it waits.
class UnshardHandle {
 public:
  UnshardHandle() = default;
  explicit UnshardHandle(std::function<void()> wait) : wait_(std::move(wait)) {}
  UnshardHandle(UnshardHandle&&) noexcept = default;
  UnshardHandle& operator=(UnshardHandle&&) noexcept = default;
  ~UnshardHandle() { wait(); }
  void wait() {
    if (wait_) {
      auto w = std::move(wait_);
      wait_ = nullptr;
      w();
    }
  }

 private:
  std::function<void()> wait_;
};

class FSDPState;  // the runtime behind a handle (not part of the API)

// The FSDPModule methods of a fully_shard'ed module.
class FSDPModule {
 public:
  nn::Module& module() const;
  // All-gathers the group now (async: the returned handle finishes it); the next forward uses it.
  // unshard and reshard are for use outside this module's forward and outside backward (FSDP's
  // hooks own the parameters there): a call from inside throws std::logic_error naming the module
  // and its state. reshard while an async unshard is pending throws too (wait on the handle).
  UnshardHandle unshard(bool async_op = false);
  // Frees the unsharded parameters (the shards stay).
  void reshard();
  // false: backward accumulates unsharded gradients without reduce-scatter (no_sync); the next
  // backward with sync reduces them. recurse: every fully_shard'ed module in the subtree.
  void set_requires_gradient_sync(bool requires_gradient_sync, bool recurse = true);
  void set_reshard_after_backward(bool reshard_after_backward, bool recurse = true);
  void set_reshard_after_forward(bool reshard_after_forward, bool recurse = true);
  // Explicit prefetching: after this module's forward starts / backward starts, these modules'
  // all-gathers are issued, in place of the implicit choice (the module that ran next in the
  // last forward / runs backward next: [Note: implicit prefetch] in impl/fsdp/state.cpp).
  void set_modules_to_forward_prefetch(const std::vector<nn::Module*>& modules);
  void set_modules_to_backward_prefetch(const std::vector<nn::Module*>& modules);
  // Whether this backward is the last before the optimizer step. PyTorch uses it to skip waiting
  // for reductions in gradient-accumulation backwards; tdc's reductions finish inside backward,
  // so it is recorded (is_last_backward()) and changes nothing.
  void set_is_last_backward(bool is_last_backward);
  bool is_last_backward() const;
  // Ends gradient accumulation from outside backward, for every fully_shard'ed module in this
  // module's subtree: the unsharded gradients kept while requires_gradient_sync was false are
  // reduce-scattered (in the reduce dtype) and added to the shards' .grad, and every group is
  // resharded. What PyTorch's pipelining does at REDUCE_GRAD by calling each parameter group's
  // post_backward and the root's final callback. Collective over the data-parallel mesh; outside
  // forward and backward only (throws like unshard()).
  void finish_gradient_accumulation();

 private:
  friend FSDPModule fully_shard(nn::Module&, const FullyShardOptions&);
  friend FSDPModule as_fsdp(nn::Module&);
  explicit FSDPModule(std::shared_ptr<FSDPState> state) : state_(std::move(state)) {}
  std::shared_ptr<FSDPState> state_;
};

inline FSDPModule fully_shard(nn::Module& module) { return fully_shard(module, FullyShardOptions{}); }

}  // namespace tdc::fsdp
