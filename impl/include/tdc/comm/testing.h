// Test patch points of tdc::comm: what PyTorch's tests reach by monkey-patching
// dist.all_gather_into_tensor / dist.reduce_scatter_tensor. Not part of the collectives API.
#pragma once

#include <functional>

#include "tdc/comm/collectives.h"

namespace tdc::comm {

// PyTorch's patch_all_gather / patch_reduce_scatter (torch.testing._internal.common_fsdp): while a patch object lives on the calling
// thread (rank), all_gather_into_tensor / reduce_scatter_tensor call its function instead, with
// the arguments and `call_original` (the real collective: call it, or not, exactly once to keep
// the ranks in step). Tests use them to delay or observe collectives (e.g. a sleep before every
// reduce-scatter). Per thread, so no barrier is needed around the swap; nested patches: the
// newest wins, and its call_original runs the real op. The differentiable collectives
// (functional.h) and DTensor's are not patched, as PyTorch's patch targets the c10d entry points.
using AllGatherPatch = std::function<Work(at::Tensor& output, const at::Tensor& input, const GroupPtr& group,
                                          bool async_op, const std::function<Work()>& call_original)>;
using ReduceScatterPatch =
    std::function<Work(at::Tensor& output, const at::Tensor& input, ReduceOp op, const GroupPtr& group, bool async_op,
                       const std::function<Work()>& call_original)>;
class PatchAllGather {
 public:
  explicit PatchAllGather(AllGatherPatch fn);
  ~PatchAllGather();
  PatchAllGather(const PatchAllGather&) = delete;
  PatchAllGather& operator=(const PatchAllGather&) = delete;

 private:
  AllGatherPatch previous_;
};
class PatchReduceScatter {
 public:
  explicit PatchReduceScatter(ReduceScatterPatch fn);
  ~PatchReduceScatter();
  PatchReduceScatter(const PatchReduceScatter&) = delete;
  PatchReduceScatter& operator=(const PatchReduceScatter&) = delete;

 private:
  ReduceScatterPatch previous_;
};

}  // namespace tdc::comm
