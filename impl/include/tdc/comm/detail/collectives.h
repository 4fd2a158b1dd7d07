// The collectives of collectives.h with the CommDebugMode key to record them under, for libtdc's
// components that build one collective from another (functional collectives, DTensor's
// redistribute) without counting it twice. Not for users.
#pragma once

#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdc/comm/collectives.h"
#include "tdc/comm/debug_mode.h"

namespace tdc::comm::detail {

// record_as: the CommDebugMode key to record under (nullopt: record nothing). functional.cpp uses them to count c10d_functional.* instead of c10d.*.
Work all_reduce(at::Tensor& tensor, ReduceOp op, const GroupPtr& group, bool async_op, std::optional<OpKind> record_as);
Work all_gather_into_tensor(at::Tensor& output, const at::Tensor& input, const GroupPtr& group, bool async_op,
                            std::optional<OpKind> record_as);
Work reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input, ReduceOp op, const GroupPtr& group,
                           bool async_op, std::optional<OpKind> record_as);

// all_gather_into_tensor of `inputs` flattened and concatenated, with its result wanted in
// `outputs`: outputs[r][i] receives rank r's inputs[i] (each the shape and dtype of inputs[i],
// any strides; written through autograd-free aliases, versions bumped once each). Counted,
// checked and patched (comm/testing.h) as that one all_gather_into_tensor. [Note: all-gathers
// into their destinations] (backend_registry.h): where the backend copies into the outputs itself,
// nothing is copied twice; elsewhere the flat result is copied out. FSDP2's unshard uses it.
Work all_gather_coalesced(const std::vector<std::vector<at::Tensor>>& outputs, const std::vector<at::Tensor>& inputs,
                          const GroupPtr& group, bool async_op);

}  // namespace tdc::comm::detail
