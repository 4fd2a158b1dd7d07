// Pipeline schedules (torch.distributed.pipelining.Schedule*): run one training step over
// n_microbatches microbatches on the stages of this rank.
//
//   ScheduleInterleaved1F1B schedule({stage0.get(), stage2.get()}, /*n_microbatches=*/8, loss_fn);
//   std::vector<at::Tensor> losses;
//   if (rank == 0) schedule.step({x});                     // first stage: the whole batch
//   else schedule.step({}, target, &losses);               // last stage: the target
//
// Every schedule is a PipelineScheduleRuntime: its compute order (schedule_ir.h) is lowered to
// per-rank action lists at construction, checked ([Note: schedule validation]) and executed
// action by action with asynchronous sends and receives. PyTorch runs GPipe and 1F1B with loops of
// their own; tdc runs the same orders through the one runtime (docs/decisions.md).
// A test or a user may assign `pipeline_order_with_comms` by hand (as PyTorch's seed test does);
// step() checks the new lists before running them.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdc/nn/module.h"
#include "tdc/pipelining/schedule_ir.h"
#include "tdc/pipelining/stage.h"

namespace tdc::pipelining {

// loss_fn(output of the last stage for one microbatch, that microbatch's target) -> scalar.
using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

class PipelineScheduleRuntime {
 public:
  // `stages`: this rank's stages (not owned; they must outlive the schedule). Without loss_fn the
  // schedule only runs forwards. scale_grads divides the accumulated gradients by n_microbatches
  // once, after the data-parallel reduction (right for mean-reduced losses).
  // Throws std::invalid_argument naming the value for: no stages, n_microbatches < 1, stages of
  // different pipelines (num_stages / group), a stage index twice; and, collectively over the
  // pipeline group, when the stages of all ranks do not cover 0..num_stages-1 exactly once.
  PipelineScheduleRuntime(std::vector<PipelineStage*> stages, int n_microbatches, LossFn loss_fn = {},
                          bool scale_grads = true);
  virtual ~PipelineScheduleRuntime();

  // One step. inputs: the whole batch (first stage's rank only; split on dim 0 into
  // n_microbatches equal chunks; an uneven split is refused). target: the last stage's rank only.
  // losses (optional): filled with the per-microbatch losses on the last stage's rank. Returns the
  // last stage's outputs concatenated on dim 0 (empty on other ranks).
  nn::Tensors step(const nn::Tensors& inputs = {}, const at::Tensor& target = {},
                   std::vector<at::Tensor>* losses = nullptr);

  int n_microbatches() const { return n_microbatches_; }
  bool scale_grads() const { return scale_grads_; }
  int pp_rank() const { return rank_; }
  int pp_size() const { return pp_size_; }
  int num_stages() const { return num_stages_; }

  // The compute-only order of every rank (bubbles as nullopt); empty for a hand-driven runtime.
  ComputeOrder pipeline_order;
  // The lists step() executes, per pipeline rank. Assignable.
  ActionLists pipeline_order_with_comms;

 protected:
  // Lowers `order` into pipeline_order_with_comms and validates it (subclass constructors).
  void set_compute_order(ComputeOrder order);

 private:
  struct Run;  // one step's state (runtime.cpp)
  void check_stages_cover_pipeline() const;
  void check_lists_before_step();

  std::vector<PipelineStage*> stages_;
  int n_microbatches_;
  LossFn loss_fn_;
  bool scale_grads_;
  int rank_ = 0, pp_size_ = 1, num_stages_ = 1;
  bool stages_initialized_ = false;
  ActionLists validated_;           // the lists last checked by validate_comms
  std::set<int> unsharded_stages_;  // FSDP stages UNSHARD made active (PyTorch keeps them across steps)
};

// The five seed schedules. Single-stage schedules take this rank's one stage; the others take
// every stage of this rank (stage r + k*pp for k = 0, 1, ...).
class ScheduleGPipe : public PipelineScheduleRuntime {
 public:
  ScheduleGPipe(PipelineStage& stage, int n_microbatches, LossFn loss_fn = {}, bool scale_grads = true);
};
class Schedule1F1B : public PipelineScheduleRuntime {
 public:
  // Throws std::invalid_argument (PyTorch's message) when n_microbatches < num_stages.
  Schedule1F1B(PipelineStage& stage, int n_microbatches, LossFn loss_fn = {}, bool scale_grads = true);
};
class ScheduleLoopedBFS : public PipelineScheduleRuntime {
 public:
  ScheduleLoopedBFS(std::vector<PipelineStage*> stages, int n_microbatches, LossFn loss_fn = {},
                    bool scale_grads = true);
};
class ScheduleInterleaved1F1B : public PipelineScheduleRuntime {
 public:
  // Throws std::invalid_argument (PyTorch's message) when the rounds max(1, n/pp) do not divide n.
  ScheduleInterleaved1F1B(std::vector<PipelineStage*> stages, int n_microbatches, LossFn loss_fn = {},
                          bool scale_grads = true);
};
class ScheduleInterleavedZeroBubble : public PipelineScheduleRuntime {
 public:
  // Backward split into I (input gradients, sent upstream at once) and W (weight gradients).
  ScheduleInterleavedZeroBubble(std::vector<PipelineStage*> stages, int n_microbatches, LossFn loss_fn = {},
                                bool scale_grads = true);
};

// A schedule by name (PyTorch's get_schedule_class + construction): single-stage kinds take
// exactly one stage.
std::unique_ptr<PipelineScheduleRuntime> make_schedule(ScheduleKind kind, std::vector<PipelineStage*> stages,
                                                       int n_microbatches, LossFn loss_fn = {},
                                                       bool scale_grads = true);

}  // namespace tdc::pipelining
