// Internal to impl/comm and impl/mesh: the built-in backend factories and the collective entry
// points that let one tdc collective be built from another without counting it twice.
#pragma once

#include <optional>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "tdc/comm/collectives.h"
#include "tdc/comm/debug_mode.h"
#include "tdc/comm/process_group.h"

namespace tdc::comm::detail {

// backend_gloo.cpp (the one TU that includes ProcessGroupGloo.hpp).
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    const GroupOptions& options);

// backend_nccl.cpp; returns false (and registers nothing) when LibTorch has no NCCL.
bool nccl_available();
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    const GroupOptions& options);

// The collectives of collectives.h with the CommDebugMode key to record under (nullopt: record
// nothing). functional.cpp uses them to count c10d_functional.* instead of c10d.*.
Work all_reduce(at::Tensor& tensor, ReduceOp op, const GroupPtr& group, bool async_op,
                std::optional<OpKind> record_as);
Work all_gather_into_tensor(at::Tensor& output, const at::Tensor& input, const GroupPtr& group,
                            bool async_op, std::optional<OpKind> record_as);
Work reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input, ReduceOp op,
                           const GroupPtr& group, bool async_op, std::optional<OpKind> record_as);


}  // namespace tdc::comm::detail
