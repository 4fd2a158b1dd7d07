// Unit tests of tdc::pipelining's stages and runtime (the schedule IR has its own suite,
// pipelining_schedule_test.cpp; PyTorch's seed tests are conformance/seed/test_composability.cpp).
//
// Training parity: every schedule, with DDP, FSDP2 and FSDP2 mixed precision, over three SGD steps
// on a (dp 2, pp 2) mesh, against one single-process model that sees both dp batches (mean loss,
// so the dp average of the per-rank gradients is the reference gradient). PyTorch's PP + DDP
// fails on its second step (docs/pipelining.md); DDP under zero bubble does not reduce in PyTorch
// (pytorch#144530) and does here.
// Bad input: every refusal the issue lists, each naming the value.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <torch/optim/sgd.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tdc/comm/collectives.h"
#include "tdc/conformance/checks.h"
#include "tdc/conformance/support.h"
#include "tdc/ddp/ddp.h"
#include "tdc/device_mesh.h"
#include "tdc/fixtures/models.h"
#include "tdc/fsdp/fully_shard.h"
#include "tdc/fsdp/testing.h"
#include "tdc/harness/harness.h"
#include "tdc/harness/subtests.h"
#include "tdc/nn/layers.h"
#include "tdc/pipelining/schedule.h"
#include "tdc/tensor/module_params.h"

namespace {

using namespace tdc;
using conformance::error_of;
using harness::Axis;
using harness::ctx;
using pipelining::PipelineStage;
using pipelining::ScheduleKind;
using ::testing::HasSubstr;

constexpr int64_t kDim = 10;
constexpr int kLayers = 8, kMicrobatches = 8;

at::Tensor loss(const at::Tensor& y, const at::Tensor& t) { return fixtures::loss_fn(y, t, 1.0); }

std::vector<nn::ModulePtr> make_layers(int n) {
  std::vector<nn::ModulePtr> layers;
  for (int i = 0; i < n; ++i) layers.push_back(std::make_shared<fixtures::MLPModuleComposability>(kDim));
  auto list = std::make_shared<nn::ModuleList>(layers);
  conformance::sync_from_rank0(*list);
  return layers;
}

enum class Dp { DDP, FSDP, FSDP_MP };

// This rank's stages (stage r + pp k) of the layers, wrapped for data parallelism.
struct Pipeline {
  std::vector<std::shared_ptr<PipelineStage>> stages;
  std::vector<std::pair<nn::ModulePtr, int>> modules;  // (stage module, offset of its first layer)
  std::unique_ptr<pipelining::PipelineScheduleRuntime> schedule;
};

Pipeline build(ScheduleKind kind, Dp dp, const DeviceMesh& dp_mesh, const comm::GroupPtr& pp_group,
               const std::vector<nn::ModulePtr>& layers, pipelining::LossFn loss_fn, bool scale_grads = true) {
  const int pp = pp_group->size(), per_rank = pipelining::is_single_stage(kind) ? 1 : 2;
  const int num_stages = pp * per_rank, per_stage = static_cast<int>(layers.size()) / num_stages;
  Pipeline out;
  std::vector<PipelineStage*> raw;
  for (int k = 0; k < per_rank; ++k) {
    const int index = pp_group->rank() + pp * k, offset = index * per_stage;
    nn::ModulePtr m = std::make_shared<nn::Sequential>(
        std::vector<nn::ModulePtr>(layers.begin() + offset, layers.begin() + offset + per_stage));
    if (dp == Dp::DDP) {
      m = std::make_shared<ddp::DistributedDataParallel>(m, dp_mesh.get_group());
    } else {
      fsdp::FullyShardOptions o{.mesh = dp_mesh};
      if (dp == Dp::FSDP_MP) o.mp_policy = {.param_dtype = at::kBFloat16, .reduce_dtype = at::kFloat};
      for (auto& [name, layer] : m->named_children_tdc()) fsdp::fully_shard(*layer, o);
      fsdp::fully_shard(*m, o);
    }
    out.stages.push_back(std::make_shared<PipelineStage>(m, index, num_stages, c10::kCPU, pp_group));
    out.modules.emplace_back(m, offset);
    raw.push_back(out.stages.back().get());
  }
  out.schedule = pipelining::make_schedule(kind, raw, kMicrobatches, std::move(loss_fn), scale_grads);
  return out;
}

// "[module.]<layer>.<rest>" of a stage -> the reference Sequential's name.
std::string reference_name(const std::string& fqn, int offset) {
  std::string name = fqn.rfind("module.", 0) == 0 ? fqn.substr(7) : fqn;
  const size_t dot = name.find('.');
  return std::to_string(std::stoi(name.substr(0, dot)) + offset) + name.substr(dot);
}

at::Tensor param_named(nn::Module& m, const std::string& fqn, bool grad) {
  for (auto& [name, p] : m.named_params()) {
    if (name == fqn) return grad ? p.grad() : p.detach();
  }
  throw std::invalid_argument("no parameter " + fqn);
}

// Three SGD steps of the pipeline against the single-process reference; gradients compared at
// every step, parameters after it. float32: rtol 1e-5, atol 1e-4: only the summation order differs
// (per-microbatch and per-rank sums, then the dp average) and the loss is unscaled, so gradients
// reach ~10 and rounding differences ~1e-5 by the third step; a wrong scaling or a lost
// microbatch moves them by 10% or more. Mixed precision: the reference computes in a bf16 copy of its float32 weights, as
// FSDP's unsharded parameters are, with the seed test's loss scale (1e-4) and tolerances (atol 5e-5,
// rtol 2e-2; gradients ~1e-4..1e-3), and a learning rate of 100 so that the steps move the weights
// by ~1e-2; parameters then get lr x atol per step taken (a step moves them by lr x gradient).
void train_parity(ScheduleKind kind, Dp dp) {
  DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"dp", "pp"});
  DeviceMesh dp_mesh = mesh["dp"];
  comm::GroupPtr pp_group = mesh["pp"].get_group();
  at::manual_seed(ctx().seed);
  std::vector<nn::ModulePtr> layers = make_layers(kLayers);
  std::vector<nn::ModulePtr> copies;
  for (auto& l : layers) copies.push_back(l->deep_copy());
  auto ref = std::make_shared<nn::Sequential>(copies);
  const bool mp = dp == Dp::FSDP_MP;
  const double scale = mp ? 1e-4 : 1.0, lr = mp ? 100.0 : 0.05;
  auto scaled_loss = [scale](const at::Tensor& y, const at::Tensor& t) { return fixtures::loss_fn(y, t, scale); };
  Pipeline pipe = build(kind, dp, dp_mesh, pp_group, layers, scaled_loss);
  std::vector<at::Tensor> params;
  for (auto& [m, offset] : pipe.modules) {
    for (auto& p : m->params()) params.push_back(p);
  }
  torch::optim::SGD optim(params, torch::optim::SGDOptions(lr));
  torch::optim::SGD ref_optim(ref->params(), torch::optim::SGDOptions(lr));
  const double rtol = mp ? 2e-2 : 1e-5, atol = mp ? 5e-5 : 1e-4;
  const at::ScalarType compute_dtype = mp ? at::kBFloat16 : at::kFloat;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(ctx().seed + 1);
  for (int step = 0; step < 3; ++step) {
    std::vector<at::Tensor> x, t;
    for (int d = 0; d < 2; ++d) {
      x.push_back(at::rand({kMicrobatches, kDim}, gen).to(compute_dtype));
      t.push_back(at::rand({kMicrobatches, kDim}, gen).to(compute_dtype));
    }
    const int64_t d = dp_mesh.get_local_rank();
    optim.zero_grad();
    if (pp_group->rank() == 0) {
      pipe.schedule->step({x[d]});
    } else {
      std::vector<at::Tensor> losses;
      pipe.schedule->step({}, t[d], &losses);
      EXPECT_EQ(losses.size(), static_cast<size_t>(kMicrobatches));
    }
    // The reference: both dp batches, mean loss, gradients averaged over them.
    ref_optim.zero_grad();
    nn::ModulePtr compute = mp ? ref->deep_copy() : ref;
    compute->to(compute_dtype);
    for (int k = 0; k < 2; ++k) (scaled_loss(compute->forward({x[k]})[0], t[k]) / 2.0).backward();
    auto ref_params = ref->params(), computed = compute->params();
    for (size_t i = 0; i < ref_params.size(); ++i) ref_params[i].mutable_grad() = computed[i].grad().to(at::kFloat);
    for (auto& [m, offset] : pipe.modules) {
      for (auto& np : tensor::named_params_with_specs(*m)) {
        const std::string name = reference_name(np.fqn, offset);
        EXPECT_TRUE(conformance::assert_close(np.full_grad(), param_named(*ref, name, true),
                                              conformance::Tolerance{rtol, atol}))
            << "step " << step << ", gradient of " << name;
      }
    }
    optim.step();
    ref_optim.step();
    for (auto& [m, offset] : pipe.modules) {
      for (auto& np : tensor::named_params_with_specs(*m)) {
        const std::string name = reference_name(np.fqn, offset);
        const double param_atol = mp ? lr * atol * (step + 1) : atol;
        EXPECT_TRUE(conformance::assert_close(np.full(), param_named(*ref, name, false),
                                              conformance::Tolerance{rtol, param_atol}))
            << "step " << step << ", parameter " << name;
      }
    }
  }
}

TDC_DIST_TEST(PipelineTraining, parity_over_three_steps_every_schedule_and_dp, .world_size = 4, .timeout_s = 300) {
  conformance::world();
  harness::subtests(Axis<std::string>("schedule", {"ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B",
                                                   "ScheduleLoopedBFS", "ScheduleInterleavedZeroBubble"}),
                    Axis<std::string>("dp", {"DDP", "FSDP", "FSDP_MP"}),
                    [](const std::string& schedule, const std::string& dp) {
                      train_parity(pipelining::schedule_kind(schedule), dp == "DDP"    ? Dp::DDP
                                                                        : dp == "FSDP" ? Dp::FSDP
                                                                                       : Dp::FSDP_MP);
                    });
}

// scale_grads=false with a summed loss gives the gradient of the whole batch's summed loss: the
// mean-loss gradient (scale_grads=true) times the number of rows.
TDC_DIST_TEST(PipelineTraining, scale_grads_false_with_a_summed_loss, .world_size = 2, .timeout_s = 120) {
  conformance::world();
  DeviceMesh mesh = init_device_mesh("cpu", {1, 2}, {"dp", "pp"});
  at::manual_seed(ctx().seed);
  std::vector<nn::ModulePtr> a = make_layers(4), b;
  for (auto& l : a) b.push_back(l->deep_copy());
  auto sum_loss = [](const at::Tensor& y, const at::Tensor& t) { return loss(y, t) * y.size(0); };
  Pipeline mean = build(ScheduleKind::OneFOneB, Dp::DDP, mesh["dp"], mesh["pp"].get_group(), a, loss, true);
  Pipeline sum = build(ScheduleKind::OneFOneB, Dp::DDP, mesh["dp"], mesh["pp"].get_group(), b, sum_loss, false);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(ctx().seed);
  at::Tensor x = at::rand({kMicrobatches, kDim}, gen), t = at::rand({kMicrobatches, kDim}, gen);
  for (Pipeline* p : {&mean, &sum}) ctx().rank == 0 ? p->schedule->step({x}) : p->schedule->step({}, t);
  auto pa = mean.modules[0].first->params(), pb = sum.modules[0].first->params();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(conformance::assert_close(pb[i].grad(), pa[i].grad() * x.size(0)));
}

// The last rank gets the merged outputs and one loss per microbatch; their mean is the full
// batch's loss.
TDC_DIST_TEST(PipelineStep, outputs_and_losses_on_the_last_rank, .world_size = 2, .timeout_s = 120) {
  conformance::world();
  DeviceMesh mesh = init_device_mesh("cpu", {1, 2}, {"dp", "pp"});
  at::manual_seed(ctx().seed);
  std::vector<nn::ModulePtr> layers = make_layers(4), copies;
  for (auto& l : layers) copies.push_back(l->deep_copy());
  nn::Sequential ref(copies);
  Pipeline p = build(ScheduleKind::GPipe, Dp::DDP, mesh["dp"], mesh["pp"].get_group(), layers, loss);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(ctx().seed);
  at::Tensor x = at::rand({kMicrobatches, kDim}, gen), t = at::rand({kMicrobatches, kDim}, gen);
  if (ctx().rank == 0) {
    EXPECT_TRUE(p.schedule->step({x}).empty());
    return;
  }
  std::vector<at::Tensor> losses;
  nn::Tensors out = p.schedule->step({}, t, &losses);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(conformance::assert_close(out[0], ref(x).detach()));
  ASSERT_EQ(losses.size(), static_cast<size_t>(kMicrobatches));
  EXPECT_TRUE(conformance::assert_close(at::stack(losses).mean(), loss(ref(x), t).detach()));
}

// A stage module that records the random numbers its forward draws.
class RandomDraws : public nn::Module {
 public:
  RandomDraws() : nn::Module("RandomDraws") { register_param("w", at::ones({kDim})); }
  nn::Tensors forward(const nn::Tensors& in) override {
    draws.push_back(at::rand({1}).item<float>());
    return {in[0] * p("w")};
  }
  nn::ModulePtr clone_empty() const override { return std::make_shared<RandomDraws>(); }
  std::vector<float> draws;
};

// Shape inference runs stage 0's module once more on the first step; the numbers the real
// forwards draw must be the ones they would draw without it.
TDC_DIST_TEST(PipelineStep, shape_inference_leaves_the_rng_alone, .world_size = 2, .timeout_s = 120) {
  conformance::world();
  auto m = std::make_shared<RandomDraws>();
  PipelineStage stage(ctx().rank == 0 ? nn::ModulePtr(m) : nn::ModulePtr(std::make_shared<nn::Sequential>()),
                      ctx().rank, 2, c10::kCPU, comm::default_group());
  pipelining::ScheduleGPipe schedule(stage, 4, [](const at::Tensor& y, const at::Tensor&) { return y.sum(); });
  at::manual_seed(99);
  ctx().rank == 0 ? schedule.step({at::ones({4, kDim})}) : schedule.step({}, at::zeros({4, kDim}));
  if (ctx().rank != 0) return;
  at::manual_seed(99);
  std::vector<float> expected;
  for (int i = 0; i < 4; ++i) expected.push_back(at::rand({1}).item<float>());
  ASSERT_EQ(m->draws.size(), 5u);  // the inference forward, then 4 microbatches
  EXPECT_EQ(std::vector<float>(m->draws.begin() + 1, m->draws.end()), expected);
}

// ---------------------------------------------------------------- bad input

TDC_DIST_TEST(PipelineBadInput, schedules_refuse_microbatch_counts_as_pytorch, .world_size = 2, .timeout_s = 60) {
  conformance::world();
  std::vector<nn::ModulePtr> layers = make_layers(4);
  DeviceMesh mesh = init_device_mesh("cpu", {1, 2}, {"dp", "pp"});
  PipelineStage stage(std::make_shared<nn::Sequential>(), ctx().rank, 2, c10::kCPU, comm::default_group());
  EXPECT_EQ(error_of([&] { pipelining::Schedule1F1B(stage, 1, loss); }),
            "Number of microbatches (1) must be greater than or equal to the number of stages (2).");
  PipelineStage s0(std::make_shared<nn::Sequential>(), ctx().rank, 4, c10::kCPU, comm::default_group());
  PipelineStage s1(std::make_shared<nn::Sequential>(), ctx().rank + 2, 4, c10::kCPU, comm::default_group());
  EXPECT_EQ(error_of([&] {
              pipelining::ScheduleInterleaved1F1B({&s0, &s1}, 5, loss);
            }),
            "Interleaved 1F1B requires the number of microbatches to be a multiple of the number of rounds (2), but "
            "got 5.");
  EXPECT_THAT(error_of([&] { pipelining::ScheduleGPipe(stage, 0, loss); }),
              HasSubstr("n_microbatches must be >= 1, got 0"));
}

TDC_DIST_TEST(PipelineBadInput, stages_must_cover_the_pipeline_once, .world_size = 2, .timeout_s = 60) {
  conformance::world();
  EXPECT_THAT(error_of([&] { PipelineStage(std::make_shared<nn::Sequential>(), 2, 2, c10::kCPU); }),
              HasSubstr("stage_index 2 is outside [0, 2)"));
  // Both ranks claim stage 0: every rank learns that stage 1 is missing and 0 repeated.
  PipelineStage stage(std::make_shared<nn::Sequential>(), 0, 2, c10::kCPU, comm::default_group());
  EXPECT_THAT(error_of([&] { pipelining::ScheduleGPipe(stage, 2, loss); }),
              HasSubstr("cover 0..1 exactly once; missing: [1], on several ranks: [0]"));
  // Stage r + 1 on rank r (not the loop placement).
  PipelineStage a(std::make_shared<nn::Sequential>(), 1 - ctx().rank, 2, c10::kCPU, comm::default_group());
  EXPECT_THAT(error_of([&] { pipelining::ScheduleGPipe(a, 2, loss); }),
              HasSubstr(fmt::format("stage {} is on pipeline rank {}", 1 - ctx().rank, ctx().rank)));
}

// A batch smaller than n_microbatches, or one that does not split evenly: the first rank names
// the shape, the other ranks stop too (no hang).
TDC_DIST_TEST(PipelineBadInput, batches_that_do_not_split_stop_every_rank, .world_size = 2, .timeout_s = 60) {
  conformance::world();
  std::vector<nn::ModulePtr> layers = make_layers(2);
  PipelineStage stage(std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{layers[ctx().rank]}), ctx().rank, 2,
                      c10::kCPU, comm::default_group());
  pipelining::ScheduleGPipe schedule(stage, 4, loss);
  for (int64_t rows : {3, 6}) {
    std::string err = error_of([&] {
      ctx().rank == 0 ? schedule.step({at::ones({rows, kDim})}) : schedule.step({}, at::ones({4, kDim}));
    });
    if (ctx().rank == 0) {
      EXPECT_THAT(err, HasSubstr(fmt::format("the input of shape [{}, 10]", rows)));
      EXPECT_THAT(err, HasSubstr(rows < 4 ? "needs at least 4 rows" : "does not split evenly into 4 microbatches"));
    } else {
      EXPECT_THAT(err, HasSubstr("another pipeline rank refused its step() arguments"));
    }
  }
  EXPECT_THAT(
      error_of([&] {
        ctx().rank == 0 ? schedule.step({at::ones({4, kDim})}) : schedule.step({});
      }),
      HasSubstr(ctx().rank == 1 ? "the last stage's rank must pass the target" : "another pipeline rank refused"));
}

// A module whose output grows on the second step: the sending stage names both shapes. Its peer,
// waiting for activations that never come, gives up after the pipeline group's timeout.
class GrowsOnSecondStep : public nn::Module {
 public:
  GrowsOnSecondStep() : nn::Module("GrowsOnSecondStep") { register_param("w", at::ones({kDim})); }
  nn::Tensors forward(const nn::Tensors& in) override {
    at::Tensor y = in[0] * p("w");
    return {calls++ > 4 ? at::cat({y, y}, 1) : y};  // 1 inference + 4 microbatches, then wider
  }
  nn::ModulePtr clone_empty() const override { return std::make_shared<GrowsOnSecondStep>(); }
  int calls = 0;
};

TDC_DIST_TEST(PipelineBadInput, an_output_shape_that_changes_after_inference, .world_size = 2, .timeout_s = 60) {
  conformance::world();
  comm::GroupPtr pp = comm::new_group({0, 1}, {.timeout = std::chrono::seconds(5)});
  nn::ModulePtr m = ctx().rank == 0 ? nn::ModulePtr(std::make_shared<GrowsOnSecondStep>())
                                    : nn::ModulePtr(std::make_shared<nn::Sequential>());
  PipelineStage stage(m, ctx().rank, 2, c10::kCPU, pp);
  pipelining::ScheduleGPipe schedule(stage, 4, [](const at::Tensor& y, const at::Tensor&) { return y.sum(); });
  auto run = [&] { ctx().rank == 0 ? schedule.step({at::ones({4, kDim})}) : schedule.step({}, at::ones({4, kDim})); };
  run();
  std::string err = error_of(run);
  if (ctx().rank == 0) {
    EXPECT_THAT(err,
                HasSubstr("PipelineStage 0 (pipeline rank 0 of 2): microbatch 0's output 0 is [1, 20] Float but the "
                          "first step inferred [1, 10] Float"));
  } else {
    EXPECT_NE(err, "(no error)");
  }
}

// Hand-written lists are checked before they run: a RESHARD without UNSHARD names the rank and
// the action instead of failing inside FSDP.
TDC_DIST_TEST(PipelineBadInput, a_hand_written_reshard_without_unshard, .world_size = 1, .timeout_s = 60) {
  conformance::world();
  std::vector<nn::ModulePtr> layers = make_layers(2);
  auto m = std::make_shared<nn::Sequential>(layers);
  for (auto& l : layers) fsdp::fully_shard(*l);
  fsdp::fully_shard(*m);
  PipelineStage stage(m, 0, 1, c10::kCPU, comm::default_group());
  pipelining::PipelineScheduleRuntime runtime({&stage}, 1);
  runtime.pipeline_order_with_comms = {{0, {*pipelining::parse_action("0RESHARD"), *pipelining::parse_action("0F0")}}};
  std::string err = error_of([&] { runtime.step({at::ones({1, kDim})}); });
  EXPECT_THAT(err, HasSubstr("rank 0"));
  EXPECT_THAT(err, HasSubstr("0RESHARD"));
  EXPECT_THAT(err, HasSubstr("UNSHARD"));
  EXPECT_EQ(fsdp::sharded_counts(*m).unsharded, 0);
}

}  // namespace
