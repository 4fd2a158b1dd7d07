// Internal to impl/comm: the built-in backend factories.
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

}  // namespace tdc::comm::detail
