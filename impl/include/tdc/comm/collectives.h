// Collectives for the rest of tdc (the torch.distributed c10d API, in C++).
// Every call takes an optional group (default: the calling rank's default group) and is
// synchronous unless async_op is true, in which case the returned Work must be waited on.
//
// Emulations (used where a backend lacks an op, and counted as the op the caller asked for;
// ProcessGroup::native_avg() / native_reduce_scatter() say which a group uses):
//   ReduceOp::AVG                   = SUM, then divide by the group size (floating point only;
//                                     integer AVG is rejected on every backend)
//   reduce_scatter_tensor           = alltoall_base + local reduction in rank order (plug-ins
//                                     without a native one); on Gloo, SUM and AVG at any group
//                                     size = alltoall_base + a local sum in the order of Gloo's
//                                     ring all-reduce, Gloo's own bits ([Note: a reduce-scatter by
//                                     all-to-all, in the ring's order], backend_registry.h)
// Dtypes: Gloo in LibTorch 2.13 runs every op here on f32, f64, bf16 and f16 natively (probed and
// tested), so there is no upcasting emulation.
// Non-contiguous tensors are staged through a contiguous copy and written back. Outputs are
// written through autograd-free aliases and their version counter is bumped once.
// Argument checks: when enabled (default; TDC_COMM_CHECKS=0 disables), each collective first
// exchanges a small fingerprint (op, dtype, shape) so that ranks that disagree get an error
// naming the op, the group and every rank's tensor, instead of a hang (comm/argument_checks.h).
// Test patch points that intercept collectives: comm/testing.h.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "tdc/comm/process_group.h"
#include "tdc/comm/reduce_op.h"

namespace tdc::comm {

// A pending collective. wait() finishes it, including any emulation step. Waiting twice is a
// no-op. Destroying a Work that was never waited waits for it.
class Work {
 public:
  Work() = default;
  Work(c10::intrusive_ptr<c10d::Work> work, std::function<void()> then = {});
  Work(Work&&) noexcept;
  Work& operator=(Work&&) noexcept;
  ~Work();
  void wait();
  bool done() const { return !work_ && !then_; }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::function<void()> then_;
};

Work all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::SUM, const GroupPtr& group = {}, bool async_op = false);
// output: size() * input.size(0) rows, same trailing shape, contiguous.
Work all_gather_into_tensor(at::Tensor& output, const at::Tensor& input, const GroupPtr& group = {},
                            bool async_op = false);
// input: size() * output.size(0) rows. ReduceOp SUM or AVG (MAX/MIN also work, emulated).
Work reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input, ReduceOp op = ReduceOp::SUM,
                           const GroupPtr& group = {}, bool async_op = false);
// Split sizes along dim 0; empty = even split.
Work all_to_all_single(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_split_sizes = {},
                       const std::vector<int64_t>& input_split_sizes = {}, const GroupPtr& group = {},
                       bool async_op = false);
// src is a group rank.
Work broadcast(at::Tensor& tensor, int src, const GroupPtr& group = {}, bool async_op = false);
// dst/src are group ranks. No cross-rank check (point-to-point). The returned Work is pending and
// dropping it waits: `send(t, 1);` blocks, `auto w = send(t, 1);` overlaps (isend).
Work send(const at::Tensor& tensor, int dst, const GroupPtr& group = {}, int tag = 0);
Work recv(at::Tensor& tensor, int src, const GroupPtr& group = {}, int tag = 0);
void barrier(const GroupPtr& group = {});

}  // namespace tdc::comm
