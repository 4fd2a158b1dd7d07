// FSDP2's collectives as free functions over a group's parameters
// (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py): all-gather (copy-in, collective,
// copy-out) and the reduce-scatter of gradients.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common.h"
#include "param.h"
#include "tdc/comm/collectives.h"

namespace tdc::fsdp {

// Whether a group's first all-gather / reduce-scatter was checked across ranks:
// [Note: FSDP's collectives skip the argument checks after the first] (collectives.cpp).
struct CollectiveChecks {
  bool all_gather = false;
  bool reduce_scatter = false;
};

// One all-gather per unsharded dtype (extension parameters are gathered on their own, at issue).
struct AllGatherResult {
  comm::Work work;
  struct Bucket {
    std::vector<size_t> params;  // indices into the group's parameters
    at::Tensor output;           // [shard_size * sum(padded_numel)]
  };
  std::vector<Bucket> buckets;
};

// Copy-in and issue: every parameter's rows into one buffer per dtype, then the collective (async
// or not; wait on the result's work). Records the gathered shard versions.
AllGatherResult foreach_all_gather(std::vector<FSDPParam>& params, const MeshInfo& mesh_info,
                                   const MixedPrecisionPolicy& mp, bool async_op, CollectiveChecks& checks);
// Waits, then copies out into each parameter's unsharded tensor.
void foreach_all_gather_copy_out(AllGatherResult& result, std::vector<FSDPParam>& params, const MeshInfo& mesh_info);

// Reduce-scatter of gradients (PyTorch's foreach_reduce): unsharded gradients (param dtype,
// undefined = none) plus any kept by no_sync -> this rank's shard gradients (orig dtype),
// averaged over the data-parallel ranks (all-reduced over the replicate dim with HSDP). One
// collective per reduce dtype. An entry stays undefined for a parameter without gradient.
std::vector<at::Tensor> foreach_reduce(std::vector<FSDPParam>& params, const std::vector<at::Tensor>& grads,
                                       const MeshInfo& mesh_info, std::optional<at::ScalarType> reduce_dtype,
                                       CollectiveChecks& checks);

// foreach_reduce in two halves, for a reduce-scatter that runs behind the rest of backward
// ([Note: async reduce-scatter] in state.cpp): the copy-in and the collective (async or not), then
// wait + all-reduce over the replicate dim + division + the shard gradients.
struct ReduceScatterResult {
  comm::Work work;
  struct Bucket {
    std::vector<size_t> params;  // indices into the group's parameters
    at::Tensor input;            // [shard_size, sum(padded_numel)]: alive until the collective ends
    at::Tensor reduced;          // [sum(padded_numel)]
  };
  std::vector<Bucket> buckets;
  bool argument_checks = false;  // the replicate all-reduce is checked like the reduce-scatter
};
ReduceScatterResult foreach_reduce_scatter(std::vector<FSDPParam>& params, const std::vector<at::Tensor>& grads,
                                           const MeshInfo& mesh_info, std::optional<at::ScalarType> reduce_dtype,
                                           CollectiveChecks& checks, bool async_op);
std::vector<at::Tensor> foreach_reduce_finish(ReduceScatterResult& result, std::vector<FSDPParam>& params,
                                              const MeshInfo& mesh_info);

}  // namespace tdc::fsdp
