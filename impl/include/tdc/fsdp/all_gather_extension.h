// FSDP2 all-gather extensions: PyTorch's fsdp_pre_all_gather / fsdp_post_all_gather protocol
// (test/distributed/_composable/fsdp/test_fully_shard_extensions.py), registered per parameter
// (C++ has no tensor subclasses or instance attributes on tensors).
//
// For a parameter with an extension, FSDP all-gathers what pre_all_gather returns instead of the
// shard, and builds the unsharded parameter with post_all_gather:
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
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "tdc/device_mesh.h"
#include "tdc/fsdp/fully_shard.h"
#include "tdc/nn/module.h"

namespace tdc::fsdp {

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
                                   const std::vector<int64_t>& outer_size, const std::vector<int64_t>& outer_stride,
                                   nn::Module& module, const MixedPrecisionPolicy& mp)>
      pre_all_gather;
  std::function<PreAllGatherResult(const at::Tensor& local, const DeviceMesh& mesh)> pre_all_gather_v1;
  std::function<PostAllGatherResult(const std::vector<at::Tensor>& outputs, const std::shared_ptr<void>& metadata,
                                    at::ScalarType param_dtype, at::Tensor* out)>
      post_all_gather;
};

// Registers `extension` for the parameter at `fqn` under `module` (module is, or contains, the
// fully_shard'ed module that owns the parameter). Call after fully_shard (and after to_empty),
// before the forward. Throws naming the FQN when no fully_shard'ed module owns it or a hook is
// missing.
void set_all_gather_extension(nn::Module& module, const std::string& fqn, AllGatherExtension extension);

}  // namespace tdc::fsdp
