// FlatParamHandle::gather_full_precision_together (flat_param.h): the full vectors of several flat
// parameters in as few all-gathers as [Note: FSDP1 gathers small flat parameters together] allows.
#include "flat_param.h"

#include "tdc/comm/argument_checks.h"
#include "tdc/comm/collectives.h"
#include "tdc/comm/process_group.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace tdc::fsdp1::detail {

namespace {

int64_t shard_bytes(const FlatParamHandle& h) {
  return h.shard_numel() * static_cast<int64_t>(c10::elementSize(h.param_dtype()));
}

// A handle may share an all-gather only when its shard is small: a large one gains nothing from
// sharing (its bytes, not the operation, cost) and would only grow the transient buffers.
bool small(const FlatParamHandle& h) { return h.sharded() && shard_bytes(h) < comm::ProcessGroup::kSmallInputBytes; }

// `next` can join a gather that begins with `first` and holds `bytes` so far: the same group,
// dtype and device, and the sum still small.
bool joins(const FlatParamHandle& first, const FlatParamHandle& next, int64_t bytes) {
  return small(next) && next.config().shard_pg == first.config().shard_pg &&
         next.param_dtype() == first.param_dtype() && next.flat_param().device() == first.flat_param().device() &&
         bytes + shard_bytes(next) <= comm::ProcessGroup::kSmallInputBytes;
}

// The end of the run of handles from `begin` that share one all-gather (begin + 1 at least).
size_t run_end(std::span<FlatParamHandle* const> handles, size_t begin) {
  size_t end = begin + 1;
  if (!small(*handles[begin])) return end;
  int64_t bytes = shard_bytes(*handles[begin]);
  while (end < handles.size() && joins(*handles[begin], *handles[end], bytes)) {
    bytes += shard_bytes(*handles[end]);
    ++end;
  }
  return end;
}

}  // namespace

// [Note: FSDP1 gathers small flat parameters together]
// summon_full_params and the state dicts that use it need every unit's full vector at once.
// PyTorch all-gathers them one unit at a time; each gather of a small flat parameter then costs
// a collective's fixed price (on Gloo a chain of thread and process wake-ups: docs/bench/suite_time.md)
// for a few hundred bytes. Here consecutive units whose shards are small (under
// ProcessGroup::kSmallInputBytes together) on the same group, dtype and device share one
// all-gather of their shards side by side: rank r sends [s1_r | s2_r | ...], and unit i's padded
// vector is column block i of the gathered (world × total) rows, read rank by rank. An all-gather
// moves bytes only, so each vector is bit for bit what its own all-gather gives
// (FSDP1GatherTogetherTest). Every rank forms the same runs: they depend on the tree's shard
// sizes, dtypes and groups, which the root compared at lazy init
// ([Note: FSDP1 checks its collectives once per tree]). The argument checks run when any
// handle of a run has not checked this dtype yet. A large shard keeps an all-gather of its own.
std::vector<at::Tensor> FlatParamHandle::gather_full_precision_together(std::span<FlatParamHandle* const> handles) {
  std::vector<at::Tensor> out;
  out.reserve(handles.size());
  for (size_t begin = 0; begin < handles.size();) {
    const size_t end = run_end(handles, begin);
    if (end == begin + 1) {
      out.push_back(handles[begin]->gather_full_precision());
    } else {
      for (auto& full : gather_run(handles.subspan(begin, end - begin))) out.push_back(std::move(full));
    }
    begin = end;
  }
  return out;
}

std::vector<at::Tensor> FlatParamHandle::gather_run(std::span<FlatParamHandle* const> run) {
  at::NoGradGuard no_grad;
  const comm::GroupPtr& group = run.front()->config_.shard_pg;
  const int64_t world = group->size();
  std::vector<at::Tensor> shards;
  bool first = false;
  for (FlatParamHandle* h : run) {
    if (h->padded_numel_ != world * h->shard_numel()) {
      throw std::logic_error("FlatParamHandle: a padded flat vector that is not world × its shard");
    }
    shards.push_back(h->flat_param_.detach());
    first = h->gathers_checked_.insert(h->param_dtype()).second || first;
  }
  const at::Tensor input = at::cat(shards);
  at::Tensor gathered = at::empty({world * input.numel()}, input.options());
  {
    comm::ScopedArgumentChecks checks(first && comm::argument_checks());
    comm::all_gather_into_tensor(gathered, input, group);
  }
  const at::Tensor rows = gathered.view({world, input.numel()});
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (FlatParamHandle* h : run) {
    out.push_back(rows.narrow(1, offset, h->shard_numel()).reshape({-1}));
    offset += h->shard_numel();
  }
  return out;
}

}  // namespace tdc::fsdp1::detail
