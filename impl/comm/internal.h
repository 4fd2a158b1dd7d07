// Internal to impl/comm: the built-in backend factories, and the all-to-all that gathers.
#pragma once

#include <optional>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "tdc/comm/collectives.h"
#include "tdc/comm/detail/collectives.h"
#include "tdc/comm/process_group.h"

namespace tdc::comm::detail {

// backend_gloo.cpp (the one TU that includes ProcessGroupGloo.hpp).
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    const GroupOptions& options);

// backend_nccl.cpp; returns false (and registers nothing) when LibTorch has no NCCL.
bool nccl_available();
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    const GroupOptions& options);

// [Note: gathers by all-to-all] (backend_registry.h): starts, on g's backend, the exchange that
// leaves every rank's `in_flat` in `out_flat` (n * in_flat.numel() elements, in rank order): one
// all-to-all of `in_flat` repeated n times, or with two ranks of `in_flat` as it is ([Note: a
// two-rank gather sends its input as it is], collectives.cpp). The Work keeps both buffers alive.
c10::intrusive_ptr<c10d::Work> start_gather_by_alltoall(const ProcessGroup& g, at::Tensor& out_flat,
                                                        const at::Tensor& in_flat);

}  // namespace tdc::comm::detail
