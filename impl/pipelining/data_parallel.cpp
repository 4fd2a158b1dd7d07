// How a stage's backward and REDUCE_GRAD drive the data parallelism wrapped around its module
// (PyTorch's backward_maybe_with_nosync and perform_reduce_grad).
//
// [Note: pipelining and data parallelism] Gradients of a step's microbatches accumulate on the
// stage and are reduced over the data-parallel ranks once:
//   - DDP: every backward but the stage's last runs under no_sync; the last (B, or W under zero
//     bubble) synchronises, so DDP averages the sum over the microbatches. tdc's reducer decides
//     at backward time, so nothing needs arming in forward (PyTorch reaches into
//     reducer.prepare_for_backward).
//   - FSDP2: before every backward, gradient sync, reshard-after-backward and is-last-backward are
//     off: the unsharded gradients accumulate (in the reduce dtype) and the parameters stay
//     unsharded. REDUCE_GRAD turns them back on and reduce-scatters what accumulated
//     (FSDPModule::finish_gradient_accumulation), which also reshards.
//   - Then, and only then, REDUCE_GRAD divides by n_microbatches: after the reduction, on the
//     sharded gradients for FSDP, once per step.
#include <ATen/ATen.h>

#include "stage_impl.h"
#include "tdc/ddp/ddp.h"

namespace tdc::pipelining {

namespace {
std::vector<fsdp::FSDPModule> fsdp_modules(nn::Module& root) {
  std::vector<fsdp::FSDPModule> out;
  for (auto& [name, m] : root.named_modules_tdc()) {
    if (fsdp::is_fully_sharded(*m)) out.push_back(fsdp::as_fsdp(*m));
  }
  return out;
}
}  // namespace

void PipelineStage::Impl::run_backward_with_dp(BackwardKind, bool last_backward, const std::function<void()>& body) {
  switch (dp) {
    case DataParallel::DDP: {
      auto& ddp_module = static_cast<ddp::DistributedDataParallel&>(*submod);
      if (last_backward) {
        body();
      } else {
        auto no_sync = ddp_module.no_sync();
        body();
      }
      return;
    }
    case DataParallel::FSDP: {
      fsdp::FSDPModule root = fsdp::as_fsdp(*submod);
      root.set_is_last_backward(false);
      root.set_reshard_after_backward(false);
      root.set_requires_gradient_sync(false);
      body();
      return;
    }
    case DataParallel::None:
      body();
      return;
  }
}

void PipelineStage::Impl::reduce_grad(int scale) {
  if (dp == DataParallel::FSDP) {
    fsdp::FSDPModule root = fsdp::as_fsdp(*submod);
    root.set_is_last_backward(true);
    root.set_reshard_after_backward(true);
    root.set_requires_gradient_sync(true);
    root.finish_gradient_accumulation();
  }
  if (scale == 1) return;
  at::NoGradGuard no_grad;
  for (auto& p : submod->params()) {
    if (p.grad().defined()) p.mutable_grad().div_(scale);
  }
}

void PipelineStage::Impl::fsdp_unshard_async() {
  for (auto& m : fsdp_modules(*submod)) unshard_handles.push_back(m.unshard(/*async_op=*/true));
}

void PipelineStage::Impl::fsdp_wait_unshard() {
  for (auto& h : unshard_handles) h.wait();
  unshard_handles.clear();
}

void PipelineStage::Impl::fsdp_reshard() {
  for (auto& m : fsdp_modules(*submod)) m.reshard();
}

}  // namespace tdc::pipelining
