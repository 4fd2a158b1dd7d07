// One parameter of a fully_shard'ed module (torch/distributed/fsdp/_fully_shard/_fsdp_param.py):
// its shard (the registered leaf the optimizer sees), its unsharded tensor and the move between
// them, its DTensor spec, its unsynced gradient (no_sync) and its all-gather extension.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common.h"
#include "tdc/core/storage.h"
#include "tdc/fsdp/all_gather_extension.h"
#include "tdc/fsdp/fully_shard.h"
#include "tdc/tensor/dtensor.h"

namespace tdc::fsdp {

using core::alloc_storage;
using core::copy_quietly;
using core::free_storage;
using core::has_storage_allocated;

using ParamUses = std::vector<std::pair<nn::Module*, std::string>>;

// What fully_shard decided for one parameter before changing anything (init.cpp).
struct ParamPlan {
  std::string fqn;                               // relative to the fully_shard'ed module
  at::Tensor tensor;                             // as registered (TP-local when TP distributed it)
  ParamUses uses;                                // every registration (tied parameters have several)
  const tensor::DTensorSpec* tp_spec = nullptr;  // its tensor-parallel spec, if any
  int64_t dim = 0;                               // FSDP shard dim of the local tensor
};

// [Note: FSDP tensors] The shard is the registered parameter: a leaf that requires grad, with a
// DTensorSpec so it reads back as a DTensor. The unsharded tensor (local shape, param dtype) is
// made once and keeps its identity: reshard frees its storage in place and unshard re-allocates
// it, so the tensors the module computed with and the ones autograd saved see the new data. Along
// the shard dim the parameter's `rows` are split by torch.chunk and each rank's piece is padded to
// `padded` rows in the collectives' buffers.
class FSDPParam {
 public:
  // Shards the planned tensor: rank 0's values (as PyTorch's init broadcast), this rank's chunk,
  // on the CPU with offloading. Changes nothing in the module (register_sharded does).
  FSDPParam(ParamPlan plan, const MeshInfo& mesh_info, const FullyShardOptions& options);

  const std::string& fqn() const { return fqn_; }
  const ParamUses& uses() const { return uses_; }
  const at::Tensor& sharded() const { return sharded_; }
  const at::Tensor& unsharded() const { return unsharded_; }
  const std::vector<int64_t>& local_shape() const { return local_shape_; }
  at::ScalarType orig_dtype() const { return orig_dtype_; }
  at::ScalarType param_dtype() const { return param_dtype_; }
  bool requires_grad() const { return requires_grad_; }

  // The shard becomes the registered parameter (every use) with its DTensorSpec.
  void register_sharded();
  // After nn::to_empty (or any re-registration) the module holds a new shard tensor: adopt it
  // (PyTorch's reset_sharded_param). A no-op when the registration is still this shard.
  void reset_sharded_param(const OffloadPolicy& offload);
  // The tensor the module has registered for this parameter now (the shard, unless replaced).
  const at::Tensor& registered() const;
  bool registration_changed() const { return !registered().is_same(sharded_); }

  // ---------------------------------------------------------------- all-gather layout
  // Elements of this parameter in one rank's slice of the all-gather buffer (padded rows).
  int64_t padded_numel() const { return padded_ * row_numel_; }
  int64_t shard_numel() const { return my_rows_ * row_numel_; }
  // This rank's rows, flattened (shard dim first): the all-gather input.
  at::Tensor all_gather_input() const;
  // Marks the shard's current version as the one being gathered.
  void record_gathered_version() { gathered_version_ = sharded_._version(); }
  bool up_to_date() const { return sharded_._version() == gathered_version_; }
  // Throws naming the parameter when its shard changed since it was gathered.
  void check_unmodified(const char* when) const;

  // ---------------------------------------------------------------- sharded <-> unsharded
  // Writes the gathered rows (this parameter's [shard_size, padded_numel] columns of the output)
  // into the unsharded tensor, re-allocating freed storage.
  void to_unsharded(const at::Tensor& gathered_columns, int64_t shard_size);
  // Frees the unsharded storage (and the extension's buffers); removes the substitutes.
  void free_unsharded();
  // Hands `unsharded` (the group's autograd output for this parameter) to every use.
  void set_substitutes(const at::Tensor& unsharded) const;

  // ---------------------------------------------------------------- gradients
  // no_sync: keeps the unsharded gradient for the next synced backward, in the reduce dtype when
  // one is set (as PyTorch's unsharded_accumulated_grad: bf16 microbatch gradients add up in fp32).
  void accumulate_unsynced_grad(const at::Tensor& grad, std::optional<at::ScalarType> reduce_dtype);
  // The gradient to reduce (this backward's plus the kept one; undefined if neither).
  at::Tensor take_grad_to_reduce(const at::Tensor& grad);
  bool has_unsynced_grad() const { return grad_accum_.defined(); }
  // This rank's rows of a reduced gradient, as a gradient of the shard (orig dtype).
  at::Tensor sharded_grad(const at::Tensor& reduced_rows) const;
  // The rows of an unsharded gradient in this parameter's layout: [rows, row_numel].
  at::Tensor rows_of(const at::Tensor& unsharded_grad, at::ScalarType dtype) const;
  int64_t rows() const { return rows_; }
  int64_t row_numel() const { return row_numel_; }

  // ---------------------------------------------------------------- all-gather extension (extension.cpp)
  bool has_extension() const { return ext_ != nullptr; }
  void set_extension(AllGatherExtension extension);
  // pre_all_gather, then one all-gather per returned tensor into the kept buffers.
  void extension_all_gather(const MeshInfo& mesh_info, const MixedPrecisionPolicy& mp);
  // post_all_gather into the unsharded tensor.
  void extension_to_unsharded();

 private:
  void init_spec(const ParamPlan& plan, const MeshInfo& mesh_info);
  void count_unsharded_bytes(bool on);

  std::string fqn_;
  ParamUses uses_;
  std::vector<int64_t> local_shape_;  // what the module computes with (TP-local when TP'd)
  at::ScalarType orig_dtype_ = at::kFloat;
  at::ScalarType param_dtype_ = at::kFloat;  // unsharded dtype (mp_policy.param_dtype or orig)
  int64_t dim_ = 0;
  int64_t rows_ = 0, padded_ = 0, my_rows_ = 0, row_numel_ = 1;
  bool requires_grad_ = true;
  at::Tensor sharded_;
  at::Tensor unsharded_;            // undefined until the first gather
  bool unsharded_counted_ = false;  // its bytes are in memory_stats (fsdp/testing.h)
  int64_t gathered_version_ = -1;   // shard version the unsharded data was gathered from; -1: never
  at::Tensor grad_accum_;           // unsharded gradient kept by no_sync; undefined: none
  tensor::DTensorSpec spec_;
  // All-gather extension: the gathered buffers are kept (same storage every time: post_all_gather
  // refills `unsharded_` from them).
  std::shared_ptr<AllGatherExtension> ext_;
  std::vector<at::Tensor> ext_outputs_, ext_to_free_;
  std::shared_ptr<void> ext_meta_;
};

}  // namespace tdc::fsdp
