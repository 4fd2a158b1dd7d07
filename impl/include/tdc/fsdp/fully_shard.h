// FSDP2: fully_shard (torch.distributed.fsdp.fully_shard) for tdc::nn modules.
//
// fully_shard(module) makes `module` own one parameter group: every parameter in its subtree
// that no nested fully_shard'ed module already owns. Apply it bottom-up (blocks, then the root).
// Each parameter is sharded on dim 0 (or the dim shard_placement_fn picks) over the mesh's shard
// dim, torch.chunk rule, padded to equal rows for the collectives. The registered parameter
// becomes the rank's shard: a leaf the optimizer sees, with a DTensorSpec (tensor/module_params.h)
// so it reads back as a DTensor (2-D with tensor parallel: (StridedShard(0), Shard(0)) when
// both shard dim 0, (Shard(0), Shard(d)) / (Shard(0), Replicate()) otherwise).
//
// Runtime, per group (architecture.md): before the module's forward one all-gather of all the
// group's shards (copy-in to one buffer, collective, copy-out to per-parameter views), exposed
// to the module as parameter substitutes; one autograd node per group whose backward
// reduce-scatters all the group's gradients at once (and all-reduces them over the replicate
// dim with HSDP) into the shards' .grad. reshard_after_forward frees the unsharded storage after
// forward and all-gathers it again (into the same storage) before the module's backward. The
// root is initialised lazily at its first forward and does not reshard after forward (its
// parameters would be gathered again at once for backward). Gradients are averaged over the
// data-parallel ranks (PyTorch's FSDP2 scaling).
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

// ------------------------------------------------------------------ all-gather extensions
// PyTorch's fsdp_pre_all_gather / fsdp_post_all_gather protocol (test_fully_shard_extensions.py),
// registered per
// parameter (C++ has no tensor subclasses or instance attributes on tensors). For a parameter with
// an extension, FSDP all-gathers what pre_all_gather returns instead of the shard, and builds the
// unsharded parameter with post_all_gather:
//  * pre_all_gather(local shard, shard mesh (1-D: the shard dim even under HSDP), outer size and
//    stride (the unsharded parameter's), the module that registers the parameter, mp policy)
//    -> tensors to gather (each gathered along dim 0; every rank must give the same shapes, so a
//    hook pads uneven shards itself) + metadata. pre_all_gather_v1(local, mesh) is the older
//    signature, used when pre_all_gather is empty.
//  * post_all_gather(gathered outputs, metadata, param dtype, out): the first time out is nullptr
//    and it returns {unsharded, to_free}; later out points at that unsharded tensor, to be
//    refilled in place (the outputs are then the same tensors as the first time: FSDP gathers
//    into the same buffers). An unsharded result with more dim-0 rows than the parameter (padded
//    shards) is narrowed to the parameter's rows.
// Gradients take FSDP's usual reduce-scatter path.
struct PreAllGatherResult {
  std::vector<at::Tensor> tensors;
  std::shared_ptr<void> metadata;
};
struct PostAllGatherResult {
  at::Tensor unsharded;
  std::vector<at::Tensor> to_free;  // freed by FSDP at reshard (their storage)
};
struct AllGatherExtension {
  std::function<PreAllGatherResult(const at::Tensor& local, const DeviceMesh& mesh,
                                   const std::vector<int64_t>& outer_size,
                                   const std::vector<int64_t>& outer_stride, nn::Module& module,
                                   const MixedPrecisionPolicy& mp)>
      pre_all_gather;
  std::function<PreAllGatherResult(const at::Tensor& local, const DeviceMesh& mesh)> pre_all_gather_v1;
  std::function<PostAllGatherResult(const std::vector<at::Tensor>& outputs, const std::shared_ptr<void>& metadata,
                                    at::ScalarType param_dtype, at::Tensor* out)>
      post_all_gather;
};

class FSDPState;

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

// The FSDPModule methods of a fully_shard'ed module.
class FSDPModule {
 public:
  explicit FSDPModule(std::shared_ptr<FSDPState> state) : state_(std::move(state)) {}
  nn::Module& module() const;
  // All-gathers the group now (async: the returned handle finishes it); the next forward uses it.
  UnshardHandle unshard(bool async_op = false);
  // Frees the unsharded parameters (the shards stay).
  void reshard();
  // false: backward accumulates unsharded gradients without reduce-scatter (no_sync); the next
  // backward with sync reduces them. recurse: every fully_shard'ed module in the subtree.
  void set_requires_gradient_sync(bool requires_gradient_sync, bool recurse = true);
  void set_reshard_after_backward(bool reshard_after_backward, bool recurse = true);
  void set_reshard_after_forward(bool reshard_after_forward, bool recurse = true);
  // Explicit prefetching: after this module's forward starts / backward starts, these modules'
  // all-gathers are issued.
  void set_modules_to_forward_prefetch(const std::vector<nn::Module*>& modules);
  void set_modules_to_backward_prefetch(const std::vector<nn::Module*>& modules);
  // Whether this backward is the last before the optimizer step. PyTorch uses it to skip waiting
  // for reductions in gradient-accumulation backwards; tdc's reductions finish inside backward,
  // so it is recorded (is_last_backward()) and changes nothing.
  void set_is_last_backward(bool is_last_backward);
  bool is_last_backward() const;
  FSDPState& state() const { return *state_; }

 private:
  std::shared_ptr<FSDPState> state_;
};

// Shards `module` in place and returns its FSDPModule handle. Throws std::invalid_argument naming
// the module when it is already fully_shard'ed, the mesh has 3+ dims, or a parameter is not
// floating point / not on the mesh's device (unless CPU offload); nothing is changed then.
FSDPModule fully_shard(nn::Module& module, const FullyShardOptions& options = {});

// The FSDPModule of a fully_shard'ed module; throws naming the module type otherwise.
FSDPModule as_fsdp(nn::Module& module);
bool is_fully_sharded(const nn::Module& module);

// Registers `extension` for the parameter at `fqn` under `module` (module is, or contains, the
// fully_shard'ed module that owns the parameter). Call after fully_shard (and after to_empty),
// before the forward. Throws naming the FQN when no fully_shard'ed module owns it or a hook is
// missing.
void set_all_gather_extension(nn::Module& module, const std::string& fqn, AllGatherExtension extension);

// Materialises a model built on the meta device (module.to(at::kMeta), then fully_shard) on
// `device`: every shard and other parameter gets uninitialised storage there (spec:
// `module.to_empty(device=...)`), ties kept; initialise the parameters afterwards. Buffers move
// too, except meta buffers (an error naming the buffer: LibTorch cannot re-point them). Works
// on models with and without fully_shard'ed modules.
void to_empty(nn::Module& module, c10::Device device);

// Counters for tests (per calling thread): live unsharded parameter bytes now, and the peak
// since reset. Unsharded storage is counted from all-gather until reshard.
struct MemoryStats {
  int64_t unsharded_bytes = 0;
  int64_t peak_unsharded_bytes = 0;
};
MemoryStats memory_stats();
void reset_peak_memory_stats();

}  // namespace tdc::fsdp
