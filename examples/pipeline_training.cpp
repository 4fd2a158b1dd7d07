// Pipeline-parallel training with tdc::pipelining (docs/pipelining.md walks through it; CTest runs
// it): a 4-layer MLP cut into 4 stages, 2 per rank, trained by ScheduleInterleaved1F1B over 2
// processes for a few SGD steps. The loss must go down.
//
//   tdc_example_pipelining [DIR]     (DIR: where the ranks rendezvous; default: a temp dir)
//
// The two ranks are forked here (run_ranks.h) to keep the example self-contained.
#include <cstdio>

#include <ATen/ATen.h>
#include <torch/optim/sgd.h>

#include "run_ranks.h"

#include "tdc/comm/process_group.h"
#include "tdc/nn/layers.h"
#include "tdc/pipelining/schedule.h"

namespace nn = tdc::nn;
namespace pp = tdc::pipelining;

constexpr int kStages = 4, kMicrobatches = 4, kSteps = 5;

// Stage s: Linear(16, 16) + ReLU. Every rank seeds alike, so each builds the same full model and
// keeps its own stages.
nn::ModulePtr make_stage(int s) {
  at::manual_seed(s);
  return std::make_shared<nn::Sequential>(
      std::vector<nn::ModulePtr>{std::make_shared<nn::Linear>(16, 16), std::make_shared<nn::ReLU>()});
}

int train(int rank, int world, const c10::intrusive_ptr<c10d::Store>& store) {
  auto group = tdc::comm::init_process_group(store, rank, world);
  // Rank r runs stages r and r + 2 (the loop placement of the interleaved schedules).
  auto first = std::make_shared<pp::PipelineStage>(make_stage(rank), rank, kStages, c10::kCPU, group);
  auto second = std::make_shared<pp::PipelineStage>(make_stage(rank + 2), rank + 2, kStages, c10::kCPU, group);
  auto mse = [](const at::Tensor& y, const at::Tensor& target) { return at::mse_loss(y, target); };
  pp::ScheduleInterleaved1F1B schedule({first.get(), second.get()}, kMicrobatches, mse);
  std::printf("rank %d runs:\n%s", rank,
              pp::format_lists({{rank, schedule.pipeline_order_with_comms.at(rank)}}).c_str());

  std::vector<at::Tensor> params = first->submod().params();
  for (auto& p : second->submod().params()) params.push_back(p);
  torch::optim::SGD optim(params, torch::optim::SGDOptions(0.1));
  at::manual_seed(100);
  at::Tensor x = at::randn({8, 16}), target = at::rand({8, 16});  // the same batch on both ranks
  double first_loss = 0, last_loss = 0;
  for (int step = 0; step < kSteps; ++step) {
    optim.zero_grad();
    std::vector<at::Tensor> losses;
    if (rank == 0) {
      schedule.step({x});  // rank 0 holds stage 0: it feeds the batch
    } else {
      schedule.step({}, target, &losses);  // rank 1 holds stage 3: it has the target and the losses
    }
    optim.step();
    if (rank == 1) {
      last_loss = at::stack(losses).mean().item<double>();
      if (step == 0) first_loss = last_loss;
      std::printf("step %d: loss %.5f\n", step, last_loss);
    }
  }
  tdc::comm::destroy_process_group();
  if (rank == 1 && !(last_loss < first_loss)) {
    std::fprintf(stderr, "the loss did not go down: %.5f -> %.5f\n", first_loss, last_loss);
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) { return run_ranks(argc, argv, 2, "tdc-pp", train); }
