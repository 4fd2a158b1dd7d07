// PipelineStage (torch.distributed.pipelining.PipelineStage): one contiguous piece of a model on
// one rank of the pipeline group, and everything a schedule does with it per microbatch.
//
//   auto stage = std::make_shared<pipelining::PipelineStage>(piece, /*stage_index=*/rank, /*num_stages=*/pp,
//                                                            at::kCPU, pp_group);
//   pipelining::ScheduleGPipe schedule(*stage, /*n_microbatches=*/8, loss_fn);
//   rank == 0 ? schedule.step({x}) : schedule.step({}, target);
//
// The stage's module may be plain, DDP-wrapped (tdc::ddp::DistributedDataParallel) or an FSDP2
// root (fsdp::fully_shard): the schedules drive their gradient synchronisation (docs/pipelining.md).
// Shapes are inferred on the first step ([Note: shape inference] in shape_inference.cpp); no
// input/output metadata is given here.
#pragma once

#include <memory>

#include <c10/core/Device.h>

#include "tdc/comm/process_group.h"
#include "tdc/nn/module.h"

namespace tdc::pipelining {

class PipelineStage {
 public:
  // Throws std::invalid_argument naming the value when stage_index is outside [0, num_stages),
  // num_stages < 1, or the module is null.
  PipelineStage(nn::ModulePtr submod, int stage_index, int num_stages, c10::Device device, comm::GroupPtr group = {});
  ~PipelineStage();
  PipelineStage(const PipelineStage&) = delete;
  PipelineStage& operator=(const PipelineStage&) = delete;

  nn::Module& submod() const;
  const nn::ModulePtr& submod_ptr() const;
  int stage_index() const;
  int num_stages() const;
  bool is_first() const { return stage_index() == 0; }
  bool is_last() const { return stage_index() == num_stages() - 1; }
  const comm::GroupPtr& group() const;
  int group_rank() const;
  int group_size() const;
  c10::Device device() const;

  // What a schedule runs on the stage (stage_impl.h, internal to impl/pipelining).
  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tdc::pipelining
