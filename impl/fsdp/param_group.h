// Internal to impl/fsdp: one parameter of a fully_shard'ed module (FSDPParam) and the group of
// parameters one fully_shard call owns (ParamGroup): its all-gather (copy-in, collective,
// copy-out; extension gathers), reshard (storage freed in place), and gradient reduce-scatter.
// fully_shard.cpp builds groups and drives them from module hooks and autograd.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdc/comm/collectives.h"
#include "tdc/fsdp/fully_shard.h"
#include "tdc/tensor/dtensor.h"

namespace tdc::fsdp {

// ------------------------------------------------------------------ parameters and groups

struct FSDPParam {
  std::string fqn;                                        // relative to the fully_shard'ed module
  std::vector<std::pair<nn::Module*, std::string>> uses;  // every registration (tied params)
  std::vector<int64_t> local_shape;  // what the module computes with (TP-local when TP'd)
  at::ScalarType orig_dtype = at::kFloat;
  at::ScalarType param_dtype = at::kFloat;  // unsharded dtype (mp_policy.param_dtype or orig)
  int64_t dim = 0;                          // FSDP shard dim of the local tensor
  int64_t rows = 0, padded = 0, my_rows = 0, row_numel = 1;
  bool requires_grad = true;
  at::Tensor shard;      // the registered leaf
  at::Tensor unsharded;  // local_shape, param_dtype; storage freed while resharded
  int64_t gathered_version = -1;  // shard version the unsharded data was gathered from
  at::Tensor grad_accum;          // unsharded gradient accumulated without sync
  tensor::DTensorSpec spec;
  // All-gather extension (set_all_gather_extension): the gathered buffers are kept (same
  // storage every time: post_all_gather refills `unsharded` from them).
  std::shared_ptr<AllGatherExtension> ext;
  std::vector<at::Tensor> ext_outputs, ext_to_free;
  std::shared_ptr<void> ext_meta;
};

struct ParamGroup {
  std::vector<FSDPParam> params;
  DeviceMesh mesh{std::shared_ptr<const DeviceMesh::State>()};
  DeviceMesh shard_mesh{std::shared_ptr<const DeviceMesh::State>()};  // the 1-D shard dim of `mesh`
  comm::GroupPtr shard_pg, replicate_pg;
  int64_t shard_size = 1, shard_rank = 0, replicate_size = 1;
  MixedPrecisionPolicy mp;
  OffloadPolicy offload;
  bool unsharded = false;
  // Autograd nodes of this group whose backward has not run yet (one per forward call with grad):
  // a module called twice before backward reshards only after its last node ran, since the other
  // call's saved tensors alias the same unsharded storage.
  int pending_nodes = 0;
  bool gather_checked = false, reduce_checked = false;  // [Note: FSDP's collectives skip ...]
  bool reshard_after_backward = true;
  bool requires_sync = true;
  // A pending async all-gather: finish() copies out.
  struct Pending {
    comm::Work work;
    std::vector<std::pair<std::vector<size_t>, at::Tensor>> outs;  // param indices per dtype bucket
  };
  std::optional<Pending> pending;

  // dtype buckets: params with the same unsharded dtype share one collective (extension
  // parameters are gathered on their own).
  std::map<at::ScalarType, std::vector<size_t>> buckets() const;
  // The unsharded tensors hold the shards' current values (gathered, no shard changed since).
  bool valid() const;

  // All-gather: start (copy-in and the collective, async or not), finish (wait, copy-out into
  // the unsharded tensors, re-allocating freed storage); unshard = both unless already valid.
  void start_all_gather(bool async_op);
  void finish_all_gather();
  void unshard(bool async_op = false);
  // An extension parameter: pre_all_gather, then one all-gather per returned tensor into the
  // kept buffers (synchronous; copied in without a version bump: autograd saved aliases);
  // finish_extension runs post_all_gather.
  void gather_extension(FSDPParam& p);
  void finish_extension(FSDPParam& p);
  // Frees the unsharded storage (and the extension buffers), clears the substitutes.
  void reshard();

  // Throws naming the parameter when a shard changed since it was gathered.
  void check_unmodified(const char* when) const;
  // Unsharded gradients (param_dtype, undefined = none) -> shard gradients (orig dtype).
  std::vector<at::Tensor> reduce(const std::vector<at::Tensor>& grads);
};

}  // namespace tdc::fsdp
