// The collectives of collectives.h with the CommDebugMode key to record them under, for libtdc's
// components that build one collective from another (functional collectives, DTensor's
// redistribute) without counting it twice. Not for users.
#pragma once

#include <optional>

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

}  // namespace tdc::comm::detail
