// Differentiable collectives (torch.distributed._functional_collectives): they return new
// tensors and carry gradients. Counted by CommDebugMode under c10d_functional.* names.
//
//   all_gather_tensor      forward: all-gather along gather_dim   backward: reduce-scatter (SUM)
//   reduce_scatter_tensor  forward: reduce-scatter along dim      backward: all-gather
//   all_reduce             forward: all-reduce                    backward: all-reduce (SUM)
// With ReduceOp::AVG the backward is scaled by 1/size (all-gather / n, resp. all-reduce AVG);
// MAX/MIN run forward but throw in backward (not linear). The group used in forward is kept for
// backward.
#pragma once

#include <ATen/core/Tensor.h>

#include "tdc/comm/collectives.h"
#include "tdc/comm/process_group.h"

namespace tdc::comm::functional {

at::Tensor all_gather_tensor(const at::Tensor& input, int64_t gather_dim = 0, const GroupPtr& group = {});
at::Tensor reduce_scatter_tensor(const at::Tensor& input, ReduceOp op = ReduceOp::SUM, int64_t scatter_dim = 0,
                                 const GroupPtr& group = {});
at::Tensor all_reduce(const at::Tensor& input, ReduceOp op = ReduceOp::SUM, const GroupPtr& group = {});

}  // namespace tdc::comm::functional
