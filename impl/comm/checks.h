// Cross-rank argument checks (see [Note: cross-rank argument checks] in checks.cpp).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdc/comm/collectives.h"
#include "tdc/comm/process_group.h"

namespace tdc::comm::detail {

enum class Coll : int64_t { AllReduce, AllGather, ReduceScatter, AllToAll, Broadcast, Barrier };
const char* coll_name(Coll c);

struct CheckArgs {
  Coll op;
  at::Tensor tensor;  // the tensor whose dtype and shape must agree (may be undefined)
  std::optional<ReduceOp> reduce;
  int64_t root = -1;
  bool ignore_dim0 = false;     // all_to_all_single with explicit split sizes
  std::vector<int64_t> splits;  // all_to_all_single: n input splits, then n output splits
  std::string local_error;      // this rank's own argument error, if any
};

// Throws (on every rank alike) when ranks disagree or any rank's arguments are bad. With checks
// off, only throws this rank's local error.
void agree(const ProcessGroup& g, const CheckArgs& args);

bool checks_enabled();
void tls_checks_set(bool enabled);
std::string describe(const at::Tensor& t);       // "float32[4, 8]"
std::string group_label(const ProcessGroup& g);  // "group 'world' (size 4)"

}  // namespace tdc::comm::detail
