// Pipelining parity with real PyTorch: tdc's PipelineStage + schedules under FSDP2 train the same
// model on the same data as PyTorch 2.13's torch.distributed.pipelining (the venv's torch), and
// the losses and gradients of every step, and the parameters after the last one, must match.
// The PyTorch side is tools/pipelining/pp_parity.py; rank 0 runs it.
//
// Scenario (test_composability.py's test_pp_fsdp in fp32, trained for kSteps steps):
//   world 4, mesh (dp=2, pp=2) ("dp", "pp"); 8 layers of MLPModule(10) (fixtures::
//   MLPModuleComposability); fully_shard on each layer of a stage (reshard_after_forward=false),
//   then on the stage root, MixedPrecisionPolicy fp32/fp32; stages as the seed test builds them
//   (ScheduleGPipe: stage = pp rank; ScheduleInterleaved1F1B: stages pp rank + 2 i);
//   n_microbatches 8; batches of 16 rows per dp index (2 rows per microbatch); loss =
//   fixtures::loss_fn (cross_entropy with soft targets * 1e-4); Adam(lr=1e-3, default betas and
//   eps) over the stage modules' parameters, zero_grad(set_to_none) after each step.
// pp_parity.py draws the initial weights and the batches (fixed seed) into inputs.safetensors;
// both sides start every schedule from those weights. It writes per step the last stage's
// per-microbatch losses and the full gradient of every parameter, and the parameters after the
// last step, into pytorch.safetensors; this test reads both with tdc's safetensors reader.
//
// Limits: starting Python and importing torch takes seconds on a loaded 2-core machine; the
// PyTorch side itself takes ~5 s. The test has a 300 s deadline and the PyTorch side is stopped
// after 240 s (kPythonLimitS).
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>

#include "tdc/checkpoint/detail/safetensors.h"
#include "tdc/comm/collectives.h"
#include "tdc/comm/process_group.h"
#include "tdc/conformance/pytorch_side.h"
#include "tdc/conformance/support.h"
#include "tdc/device_mesh.h"
#include "tdc/fixtures/models.h"
#include "tdc/fsdp/fully_shard.h"
#include "tdc/harness/harness.h"
#include "tdc/nn/layers.h"
#include "tdc/pipelining/schedule.h"
#include "tdc/tensor/module_params.h"

namespace {

using namespace tdc;
using harness::ctx;
using pipelining::ScheduleKind;
namespace fs = std::filesystem;
using TensorMap = std::map<std::string, at::Tensor>;

constexpr int kWorld = 4, kSteps = 3, kTotalLayers = 8, kMicrobatches = 8;
constexpr int64_t kDim = 10;
constexpr double kLr = 1e-3;
constexpr int kPythonLimitS = 240;
const ScheduleKind kSchedules[] = {ScheduleKind::GPipe, ScheduleKind::Interleaved1F1B};

// [Note: parity tolerances] Both sides run float32 on the same machine with 1 thread per rank.
// Forward, backward, FSDP's reduce-scatter and the scaling by 1/n_microbatches turn out to round
// alike: steps 0 and 1 are bit-identical for both schedules. LibTorch's C++ Adam and PyTorch's
// Python Adam round their second update differently (their arithmetic is ordered differently),
// so after step 1 parameters differ by 1 float32 ulp (max 3.0e-8 at |p| ~0.3), and step 2's
// losses by <= 1.2e-10 (9e-8 relative) and gradients by <= 2.9e-11 (3.9e-7 of the tensor's max).
// The checks are allclose, |tdc - PyTorch| <= atol + rtol * |PyTorch| elementwise:
//   losses (~1.2e-3), gradients (max per tensor 1e-4..5e-4): rtol 1e-5, atol 1e-9 (atol ~1e-5
//     of the magnitude, so that an element that rounds to ~0 is not judged relatively);
//   parameters (~0.3, moved ~1e-3 per Adam step): rtol 1e-6, atol 1e-7 (~10 ulp).
// That is 25x (gradients) and 10x (parameters) above what was measured, and far below what a bug
// does: a gradient scaled wrongly (x8 without scale_grads, /2 twice over dp) or a missing
// microbatch (1 of 8 contributions) moves gradients by >= 10 %.
constexpr double kRtol = 1e-5, kParamRtol = 1e-6;
constexpr double kLossAtol = 1e-9, kGradAtol = 1e-9, kParamAtol = 1e-7;

// ------------------------------------------------------------------ the PyTorch side

// Rank 0 runs pp_parity.py while the other ranks wait; true on every rank if it succeeded.
bool pytorch_side(const fs::path& out_dir) {
  return conformance::pytorch_side("tools/pipelining/pp_parity.py",
                                   fmt::format("--out '{}' --steps {}", out_dir.string(), kSteps), kPythonLimitS);
}

// Every tensor of a plain safetensors file (no DCP sharding: each entry is a whole tensor).
TensorMap read_safetensors(const fs::path& path) {
  const checkpoint::detail::FileHeader file = checkpoint::detail::read_header(path.string());
  TensorMap out;
  for (const auto& chunk : file.chunks) {
    out[chunk.key] = checkpoint::detail::read_rows(file, chunk, 0, chunk.shape.empty() ? 1 : chunk.shape[0]);
  }
  return out;
}

const at::Tensor& at_key(const TensorMap& m, const std::string& key) {
  auto it = m.find(key);
  if (it == m.end()) throw std::runtime_error(fmt::format("pp_parity.py wrote no tensor '{}'", key));
  return it->second;
}

// ------------------------------------------------------------------ tdc's side, as pp_parity.py

struct Stage {
  nn::ModulePtr module;  // the FSDP-wrapped Sequential of this stage's layers
  int offset = 0;        // index of its first layer in the 8-layer model
  std::shared_ptr<pipelining::PipelineStage> stage;
};

struct Pipeline {
  std::vector<Stage> stages;
  std::unique_ptr<pipelining::PipelineScheduleRuntime> schedule;
};

// _build_pp_schedule with test_pp_fsdp's apply_dp (fp32), from the weights pp_parity.py drew.
Pipeline build(ScheduleKind kind, const TensorMap& inputs, const comm::GroupPtr& pp_group, const DeviceMesh& dp_mesh) {
  std::vector<nn::ModulePtr> full_model;
  for (int i = 0; i < kTotalLayers; ++i) {
    auto layer = std::make_shared<fixtures::MLPModuleComposability>(kDim);
    at::NoGradGuard no_grad;
    for (auto& [name, p] : layer->named_params()) p.copy_(at_key(inputs, fmt::format("init.{}.{}", i, name)));
    full_model.push_back(layer);
  }
  const fsdp::FullyShardOptions config{.mesh = dp_mesh,
                                       .mp_policy = {.param_dtype = at::kFloat, .reduce_dtype = at::kFloat}};
  Pipeline out;
  auto build_stage = [&](int stage_idx, int num_stages) {
    const int layers_per_stage = kTotalLayers / num_stages;
    const int offset = stage_idx * layers_per_stage;
    auto partial_model = std::make_shared<nn::Sequential>(
        std::vector<nn::ModulePtr>(full_model.begin() + offset, full_model.begin() + offset + layers_per_stage));
    for (auto& [name, layer] : partial_model->named_children_tdc()) {
      fsdp::FullyShardOptions layer_config = config;
      layer_config.reshard_after_forward = false;
      fsdp::fully_shard(*layer, layer_config);
    }
    fsdp::fully_shard(*partial_model, config);
    out.stages.push_back(
        {partial_model, offset,
         std::make_shared<pipelining::PipelineStage>(partial_model, stage_idx, num_stages, at::kCPU, pp_group)});
  };
  if (pipelining::is_single_stage(kind)) {
    build_stage(pp_group->rank(), pp_group->size());
  } else {
    const int n_virtual = 2;
    for (int i = 0; i < n_virtual; ++i) build_stage(pp_group->rank() + n_virtual * i, pp_group->size() * n_virtual);
  }
  std::vector<pipelining::PipelineStage*> raw;
  for (auto& s : out.stages) raw.push_back(s.stage.get());
  out.schedule = pipelining::make_schedule(
      kind, raw, kMicrobatches, [](const at::Tensor& y, const at::Tensor& t) { return fixtures::loss_fn(y, t); });
  return out;
}

// "<layer>.<rest>" of a stage module's parameter -> its name in the 8-layer model.
std::string model_name(const std::string& fqn, int offset) {
  const size_t dot = fqn.find('.');
  return std::to_string(std::stoi(fqn.substr(0, dot)) + offset) + fqn.substr(dot);
}

// ------------------------------------------------------------------ comparison

// The largest differences seen in one quantity: max |tdc - PyTorch| and the same divided by the
// tensor's max |PyTorch| (scale-free), and how many tensors were compared.
struct MaxDiff {
  double abs = 0, rel = 0;
  int tensors = 0;
};

// allclose(got, want, rtol, atol) elementwise, in float64; records the differences.
void compare(const at::Tensor& got, const at::Tensor& want, double rtol, double atol, const std::string& what,
             MaxDiff& md) {
  ASSERT_TRUE(got.defined()) << what << ": tdc has none";
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const at::Tensor g = got.detach().to(at::kDouble), w = want.to(at::kDouble);
  const at::Tensor diff = (g - w).abs();
  const double max_diff = diff.max().item<double>();
  const double scale = w.abs().max().item<double>();
  md.abs = std::max(md.abs, max_diff);
  if (scale > 0) md.rel = std::max(md.rel, max_diff / scale);
  ++md.tensors;
  const bool close = (diff <= atol + rtol * w.abs()).all().item<bool>();
  EXPECT_TRUE(close) << what << ": max |tdc - PyTorch| " << max_diff << " (max |PyTorch| " << scale
                     << "), tolerance atol " << atol << " + rtol " << rtol << " * |PyTorch|";
}

// The maxima over all ranks (MAX all-reduce over the world), in place.
void max_over_ranks(std::vector<MaxDiff*> diffs, const comm::GroupPtr& world) {
  at::Tensor t = at::zeros({static_cast<int64_t>(diffs.size()), 3}, at::kDouble);
  for (size_t i = 0; i < diffs.size(); ++i) {
    t[i][0] = diffs[i]->abs;
    t[i][1] = diffs[i]->rel;
    t[i][2] = diffs[i]->tensors;
  }
  comm::all_reduce(t, comm::ReduceOp::MAX, world);
  for (size_t i = 0; i < diffs.size(); ++i) {
    diffs[i]->abs = t[i][0].item<double>();
    diffs[i]->rel = t[i][1].item<double>();
    diffs[i]->tensors = static_cast<int>(t[i][2].item<double>());
  }
}

// ------------------------------------------------------------------ the test

TDC_DIST_TEST(PipeliningParity, GPipeAndInterleaved1F1BWithFsdpMatchPyTorch, .world_size = kWorld, .timeout_s = 300) {
  TDC_SKIP_UNLESS_DEVICE("cpu");
  const fs::path dir = ctx().temp_dir / "pp_parity";
  if (!pytorch_side(dir)) return;
  const TensorMap inputs = read_safetensors(dir / "inputs.safetensors");
  const TensorMap want = read_safetensors(dir / "pytorch.safetensors");

  comm::GroupPtr world = conformance::world();
  DeviceMesh device_mesh = init_device_mesh("cpu", {kWorld / 2, 2}, {"dp", "pp"});
  comm::GroupPtr pp_group = device_mesh["pp"].get_group();
  DeviceMesh dp_mesh = device_mesh["dp"];
  const int64_t dp_rank = dp_mesh.get_local_rank();

  // [schedule][step] losses and gradients; [schedule] final parameters.
  MaxDiff loss_diff[2][kSteps], grad_diff[2][kSteps], param_diff[2];
  int steps_compared = 0;
  for (int k = 0; k < 2; ++k) {
    const ScheduleKind kind = kSchedules[k];
    const std::string sched(pipelining::schedule_name(kind));
    Pipeline pp = build(kind, inputs, pp_group, dp_mesh);
    std::vector<at::Tensor> params;
    for (auto& s : pp.stages) {
      for (auto& p : s.module->params()) params.push_back(p);
    }
    torch::optim::Adam optim(params, torch::optim::AdamOptions(kLr));
    for (int step = 0; step < kSteps; ++step) {
      const at::Tensor& x = at_key(inputs, fmt::format("step{}.dp{}.input", step, dp_rank));
      const at::Tensor& target = at_key(inputs, fmt::format("step{}.dp{}.target", step, dp_rank));
      std::vector<at::Tensor> losses;
      if (pp_group->rank() == 0) {
        pp.schedule->step({x});
      } else {
        pp.schedule->step({}, target, &losses);
        ASSERT_EQ(losses.size(), static_cast<size_t>(kMicrobatches)) << sched << " step " << step;
        compare(at::stack(losses).to(at::kFloat),
                at_key(want, fmt::format("{}.step{}.loss.dp{}", sched, step, dp_rank)), kRtol, kLossAtol,
                fmt::format("{} step {} losses (dp {})", sched, step, dp_rank), loss_diff[k][step]);
      }
      for (auto& s : pp.stages) {
        for (auto& np : tensor::named_params_with_specs(*s.module)) {  // full_grad: a collective over dp
          const std::string name = model_name(np.fqn, s.offset);
          ASSERT_TRUE(np.dtensor.has_value()) << name << ": FSDP left it a plain tensor";
          compare(np.full_grad(), at_key(want, fmt::format("{}.step{}.grad.{}", sched, step, name)), kRtol, kGradAtol,
                  fmt::format("{} step {} gradient of {}", sched, step, name), grad_diff[k][step]);
        }
      }
      ++steps_compared;
      optim.step();
      optim.zero_grad(/*set_to_none=*/true);
    }
    for (auto& s : pp.stages) {
      for (auto& np : tensor::named_params_with_specs(*s.module)) {
        const std::string name = model_name(np.fqn, s.offset);
        compare(np.full(), at_key(want, fmt::format("{}.final.{}", sched, name)), kParamRtol, kParamAtol,
                fmt::format("{} parameter {} after step {}", sched, name, kSteps), param_diff[k]);
      }
    }
  }
  EXPECT_EQ(steps_compared, kSteps * 2) << "steps x schedules compared on rank " << ctx().rank;

  std::vector<MaxDiff*> all;
  for (int k = 0; k < 2; ++k) {
    for (int s = 0; s < kSteps; ++s) all.insert(all.end(), {&loss_diff[k][s], &grad_diff[k][s]});
    all.push_back(&param_diff[k]);
  }
  max_over_ranks(all, world);
  if (ctx().rank != 0) return;
  // Every step compared 8 losses on each dp index's last stage and all 32 parameters' gradients.
  std::string table = fmt::format("{:<25} {:>5} {:<10} {:>8} {:>14} {:>16}\n", "schedule", "step", "what", "tensors",
                                  "max |diff|", "max |diff|/max|ref|");
  for (int k = 0; k < 2; ++k) {
    const std::string sched(pipelining::schedule_name(kSchedules[k]));
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_GT(loss_diff[k][s].tensors, 0) << sched << " step " << s << ": no losses compared";
      EXPECT_GT(grad_diff[k][s].tensors, 0) << sched << " step " << s << ": no gradients compared";
      for (auto [what, md] : {std::pair{"losses", &loss_diff[k][s]}, std::pair{"gradients", &grad_diff[k][s]}}) {
        table += fmt::format("{:<25} {:>5} {:<10} {:>8} {:>14.3e} {:>16.3e}\n", sched, s, what, md->tensors, md->abs,
                             md->rel);
      }
    }
    table += fmt::format("{:<25} {:>5} {:<10} {:>8} {:>14.3e} {:>16.3e}\n", sched, "final", "parameters",
                         param_diff[k].tensors, param_diff[k].abs, param_diff[k].rel);
  }
  std::printf(
      "tdc vs PyTorch 2.13 pipelining (FSDP2 fp32, dp 2 x pp 2, %d microbatches, Adam lr %g): %d steps x 2 "
      "schedules = %d steps compared on every rank (tensors: per rank, max over ranks):\n%s",
      kMicrobatches, kLr, kSteps, steps_compared, table.c_str());
}

}  // namespace
