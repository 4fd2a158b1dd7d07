// FSDP1 training with tdc::fsdp1 (docs/fsdp1.md walks through it; CTest runs it): a small MLP
// wrapped by FullyShardedDataParallel with one unit per Linear (ModuleWrapPolicy), FULL_SHARD,
// bf16 mixed precision, gradient accumulation with no_sync, gradient clipping, and a full state
// dict at the end. Two processes; the loss must go down and the state dict must hold the full,
// wrapper-free parameters.
//
//   tdc_example_fsdp1 [DIR]     (DIR: where the ranks rendezvous; default: a temp dir)
#include <cstdio>

#include <ATen/ATen.h>
#include <torch/optim/sgd.h>

#include "run_ranks.h"
#include "tdc/comm/process_group.h"
#include "tdc/fsdp1/fully_sharded_data_parallel.h"
#include "tdc/nn/layers.h"

namespace nn = tdc::nn;
namespace fsdp1 = tdc::fsdp1;

constexpr int kSteps = 6;

int train(int rank, int world, const c10::intrusive_ptr<c10d::Store>& store) {
  tdc::comm::init_process_group(store, rank, world);
  at::manual_seed(0);  // every rank builds the same model
  auto net = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(16, 32), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(32, 16)});

  fsdp1::FSDPOptions options;
  options.auto_wrap_policy = fsdp1::ModuleWrapPolicy({"Linear"});
  options.sharding_strategy = fsdp1::ShardingStrategy::FULL_SHARD;
  options.mixed_precision = fsdp1::MixedPrecision{.param_dtype = at::kBFloat16, .reduce_dtype = at::kFloat};
  auto model = fsdp1::FullyShardedDataParallel::make(net, options);
  // One flat parameter per Linear, each holding this rank's half: the optimizer steps those.
  torch::optim::SGD optim(model->params(), torch::optim::SGDOptions(0.05).momentum(0.9));

  at::manual_seed(100 + rank);  // each rank its own data
  at::Tensor x = at::randn({8, 16}), target = at::randn({8, 16});
  double first = 0, last = 0;
  for (int step = 0; step < kSteps; ++step) {
    optim.zero_grad();
    {
      auto no_sync = model->no_sync();  // first half of the batch: accumulate, no communication
      at::mse_loss((*model)(x.slice(0, 0, 4)).to(at::kFloat), target.slice(0, 0, 4)).backward();
    }
    at::Tensor loss = at::mse_loss((*model)(x.slice(0, 4)).to(at::kFloat), target.slice(0, 4));
    loss.backward();  // reduce-scatters both halves' gradients
    model->clip_grad_norm_(1.0);
    optim.step();
    last = loss.item<double>();
    if (step == 0) first = last;
    if (rank == 0) std::printf("step %d: loss %.5f\n", step, last);
  }
  tdc::tensor::StateDict sd = model->state_dict();  // FULL_STATE_DICT: full tensors
  if (rank == 0) {
    for (const auto& key : sd.keys()) {
      std::printf("%s %s\n", key.c_str(), c10::str(tdc::tensor::as_tensor(sd, key).sizes()).c_str());
    }
  }
  const bool full = sd.keys() == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"} &&
                    tdc::tensor::as_tensor(sd, "0.weight").sizes() == at::IntArrayRef{32, 16};
  tdc::comm::destroy_process_group();
  if (!(last < first) || !full) {
    std::fprintf(stderr, "rank %d: loss %.5f -> %.5f, full state dict: %d\n", rank, first, last, full);
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) { return run_ranks(argc, argv, 2, "tdc-fsdp1", train); }
