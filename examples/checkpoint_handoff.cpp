// A C++ training job hands its checkpoint to PyTorch and takes PyTorch's back
// (docs/checkpoint.md walks through it; CTest runs all three steps):
//
//   tdc_example_checkpoint save DIR        C++: one Adam step, save DIR/model and DIR/optim
//   python checkpoint_handoff.py DIR       PyTorch: load them, one more step, save DIR/from-pytorch/...
//   tdc_example_checkpoint resume DIR      C++: load PyTorch's checkpoint and go on training
//
// One process and no process group (world 1); under a launcher every rank runs the same code and
// saves / loads its own shards.
#include <cstdio>
#include <string>

#include <ATen/ATen.h>
#include <torch/optim/adam.h>

#include "tdc/checkpoint/checkpoint.h"
#include "tdc/state_dict/state_dict.h"
#include "tdc/nn/layers.h"

namespace ckpt = tdc::checkpoint;

// nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)): FQNs "0.weight", "0.bias", "2.weight", ...
std::shared_ptr<tdc::nn::Sequential> make_model() {
  return std::make_shared<tdc::nn::Sequential>(
      std::vector<tdc::nn::ModulePtr>{std::make_shared<tdc::nn::Linear>(4, 8), std::make_shared<tdc::nn::ReLU>(),
                                      std::make_shared<tdc::nn::Linear>(8, 2)});
}

void train_step(tdc::nn::Module& model, torch::optim::Optimizer& optim) {
  model(at::ones({3, 4})).sum().backward();
  optim.step();
  optim.zero_grad();
}

int save(const std::string& dir) {
  at::manual_seed(0);
  auto model = make_model();
  torch::optim::Adam optim(model->params(), torch::optim::AdamOptions(1e-3));
  train_step(*model, optim);
  auto [msd, osd] = ckpt::get_state_dict(*model, optim);
  ckpt::save(msd, dir + "/model");  // also a plain HuggingFace model directory
  ckpt::save(osd, dir + "/optim");  // "state.<fqn>.exp_avg", ...; param_groups go to tdc-checkpoint.json
  std::printf("saved %zu model and %zu optimizer entries to %s\n", msd.size(), osd.size(), dir.c_str());
  return 0;
}

int resume(const std::string& dir) {
  auto model = make_model();
  torch::optim::Adam optim(model->params(), torch::optim::AdamOptions(1e-3));
  auto [msd, osd] = ckpt::get_state_dict(*model, optim);  // creates the optimizer's state, as PyTorch
  ckpt::load(msd, dir + "/from-pytorch/model");           // in place: the model's own tensors
  // PyTorch's optimizer checkpoint holds tensors only: the param_groups keep this optimizer's.
  ckpt::load(osd, dir + "/from-pytorch/optim", {.allow_partial_load = true});
  ckpt::set_optimizer_state_dict(*model, optim, osd);  // Adam's step is an integer in LibTorch
  const double step = ckpt::as_tensor(osd, "state.0.weight.step").item<double>();
  if (step != 2.0) {
    std::fprintf(stderr, "expected Adam step 2 (one C++ step + one PyTorch step), got %g\n", step);
    return 1;
  }
  train_step(*model, optim);
  std::printf("resumed at Adam step %g from PyTorch's checkpoint and trained one more step\n", step);
  return 0;
}

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[1] : "";
  if (mode != "save" && mode != "resume") {
    std::fprintf(stderr, "usage: %s save|resume DIR\n", argv[0]);
    return 2;
  }
  try {
    return mode == "save" ? save(argv[2]) : resume(argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
