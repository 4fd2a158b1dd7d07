// Pipelining benchmark, tdc side: step time of tdc's pipeline schedules (PipelineStage +
// PipelineScheduleRuntime) for the five seed schedules at pp 2 and 4, on plain stages of an 8-layer
// MLP (fork launcher, 1 ATen thread per rank).
//
//   tdc_bench pipelining --out FILE [--repeat N] [--worlds 2|4|2,4]   (or: ./tdc bench pipelining --out FILE)
//
// `tdc bench pipelining` runs this, then bench/pytorch/pipelining_pytorch.py (PyTorch's own
// torch.distributed.pipelining on the same model, batch, placement and step) and merges both into
// one JSON + a PNG plot.
//
// Model: 8 layers of fixtures::MLPModuleComposability(kHidden) (test_composability.py's MLPModule:
// net1 Linear, ReLU, net2 Linear); global batch kBatch rows, kMicrobatches microbatches; loss =
// fixtures::loss_fn (cross_entropy with soft targets * 1e-4). No data parallelism: world = pp.
// Single-stage schedules put stage r on rank r; multi-stage ones 2 stages per rank, stage r + pp*i
// (the loop placement), each stage holding 8 / num_stages consecutive layers.
// A step is schedule.step (rank 0 the input, the last rank the target) + SGD step (lr 1e-3, no
// momentum) over the rank's stage modules + zero_grad(set_to_none). Each case: kWarmup untimed
// steps (the first infers the shapes), then N timed steps; the figure is rank 0's median step
// (rank 0 runs stage 0, which starts a step first and finishes it last).
// The bubble fraction of each schedule comes from its compute order ([Note: bubble fraction]).
// Output schema: docs/results-schema.md, "Pipelining benchmark" ("tdc" part).
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/optim/sgd.h>

#include "bench_common.h"
#include "tdc/comm/collectives.h"
#include "tdc/conformance/support.h"
#include "tdc/fixtures/models.h"
#include "tdc/harness/launch.h"
#include "tdc/harness/results.h"
#include "tdc/nn/layers.h"
#include "tdc/pipelining/schedule.h"
#include "tdc/pipelining/schedule_ir.h"

#include "benchmarks.h"

namespace bench_pipelining {

namespace fs = std::filesystem;
namespace pipelining = tdc::pipelining;
using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;
using pipelining::ScheduleKind;

constexpr int kWarmup = 3;
constexpr double kLr = 1e-3;
constexpr int kLayers = 8;
constexpr int64_t kHidden = 512;
constexpr int64_t kBatch = 64;
constexpr int kMicrobatches = 8;
constexpr int kStagesPerRankMulti = 2;
const ScheduleKind kSchedules[] = {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B,
                                   ScheduleKind::LoopedBFS, ScheduleKind::InterleavedZeroBubble};

int stages_per_rank(ScheduleKind kind) { return pipelining::is_single_stage(kind) ? 1 : kStagesPerRankMulti; }

// [Note: bubble fraction] From the schedule's compute order (pipelining::compute_order, PyTorch's
// pipeline_order: one list per rank, a slot per time step, idle slots as nullopt), with every
// compute action (F, B, I, W) taking one unit of time: the schedule lasts T = the longest rank's
// list, rank r is busy for the number of its actions, and the bubble fraction is the mean over
// ranks of (T - busy_r) / T. Real B take about twice an F (and I, W about one each), so this is
// the schedule's shape, not a measurement.
constexpr const char* kBubbleDefinition =
    "mean over ranks of idle slots / total slots in the schedule's compute order (pipeline_order), every compute "
    "action (F, B, I, W) one unit of time; total slots = the longest rank's order";

double bubble_fraction(ScheduleKind kind, int pp) {
  const pipelining::ComputeOrder order = pipelining::compute_order(
      kind, {.pp = pp, .stages_per_rank = stages_per_rank(kind), .n_microbatches = kMicrobatches});
  size_t total = 0;
  for (const auto& [rank, actions] : order) total = std::max(total, actions.size());
  double sum = 0;
  for (const auto& [rank, actions] : order) {
    const auto busy = std::count_if(actions.begin(), actions.end(), [](const auto& a) { return a.has_value(); });
    sum += static_cast<double>(total - busy) / static_cast<double>(total);
  }
  return sum / static_cast<double>(order.size());
}

// One case on the calling rank; rank 0 writes {"step_ms", "p90_ms", "params"} to `result`.
void run_case(ScheduleKind kind, int repeat, const std::string& result) {
  auto group = tdc::conformance::world();
  const int pp = group->size(), rank = group->rank();
  at::manual_seed(1234);  // the same model on every rank
  std::vector<tdc::nn::ModulePtr> layers;
  for (int i = 0; i < kLayers; ++i) layers.push_back(std::make_shared<tdc::fixtures::MLPModuleComposability>(kHidden));
  const int per_rank = stages_per_rank(kind);
  const int num_stages = pp * per_rank;
  const int per_stage = kLayers / num_stages;
  std::vector<std::shared_ptr<pipelining::PipelineStage>> stages;
  std::vector<pipelining::PipelineStage*> raw;
  std::vector<at::Tensor> params;
  for (int i = 0; i < per_rank; ++i) {
    const int idx = rank + pp * i;
    auto module = std::make_shared<tdc::nn::Sequential>(
        std::vector<tdc::nn::ModulePtr>(layers.begin() + idx * per_stage, layers.begin() + (idx + 1) * per_stage));
    for (const auto& p : module->params()) params.push_back(p);
    stages.push_back(std::make_shared<pipelining::PipelineStage>(module, idx, num_stages, at::kCPU, group));
    raw.push_back(stages.back().get());
  }
  layers.clear();
  auto schedule = pipelining::make_schedule(
      kind, raw, kMicrobatches, [](const at::Tensor& y, const at::Tensor& t) { return tdc::fixtures::loss_fn(y, t); });
  torch::optim::SGD opt(params, torch::optim::SGDOptions(kLr));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4321);
  const at::Tensor x = at::randn({kBatch, kHidden}, gen);
  const at::Tensor target = at::rand({kBatch, kHidden}, gen);

  std::vector<double> ms;
  tdc::comm::barrier(group);
  for (int i = 0; i < kWarmup + repeat; ++i) {
    auto t0 = Clock::now();
    if (rank == 0) {
      schedule->step({x});
    } else if (rank == pp - 1) {
      schedule->step({}, target);
    } else {
      schedule->step();
    }
    opt.step();
    opt.zero_grad(/*set_to_none=*/true);
    double t = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (i >= kWarmup) ms.push_back(t);
  }
  if (rank != 0) return;
  int64_t numel = 0;  // the whole model's parameters (every rank built all 8 layers alike)
  {
    at::manual_seed(1234);
    tdc::fixtures::MLPModuleComposability layer(kHidden);
    for (const auto& p : layer.params()) numel += p.numel() * kLayers;
  }
  json r = {{"step_ms", tdc::bench::median(ms)}, {"p90_ms", tdc::bench::percentile(ms, 0.9)}, {"params", numel}};
  std::ofstream(result) << r.dump() << "\n";
}

// `tdc_bench pipelining` (bench/cpp/main.cpp).
int run(int argc, char** argv) {
  const tdc::bench::Args args =
      tdc::bench::parse_args(argc, argv, "tdc_bench pipelining", 10, "timed steps per case", true);
  const tdc::bench::TempDir tmp("tdc-bench-pipelining");
  const fs::path& dir = tmp.path();
  const int total = static_cast<int>(args.worlds.size() * std::size(kSchedules));
  int done = 0;
  auto bench_start = Clock::now();
  std::string started_at = tdc::harness::iso_now();

  json cases = json::object();
  int64_t params = 0;
  for (int pp : args.worlds) {
    for (ScheduleKind kind : kSchedules) {
      const std::string name(pipelining::schedule_name(kind));
      const std::string result = (dir / fmt::format("{}-{}.json", name, pp)).string();
      tdc::harness::LaunchSpec spec;
      spec.suite = "PipeliningBench";
      spec.name = fmt::format("{}_pp{}", name, pp);
      spec.world_size = pp;
      spec.launcher = tdc::harness::Launcher::Fork;
      spec.timeout_s = 120 + 2.0 * args.repeat;
      const std::string label = fmt::format("[tdc {}/{}] pp {} {:<30}", ++done, total, pp, name);
      auto j = tdc::bench::run_case_and_read(spec, label, result, [&] { run_case(kind, args.repeat, result); });
      if (!j) return 1;
      params = (*j)["params"].get<int64_t>();
      cases[std::to_string(pp)][name] = {{"tdc_step_ms", (*j)["step_ms"]},
                                         {"tdc_p90_ms", (*j)["p90_ms"]},
                                         {"stages_per_rank", stages_per_rank(kind)},
                                         {"num_stages", pp * stages_per_rank(kind)},
                                         {"bubble_fraction", bubble_fraction(kind, pp)}};
    }
  }

  json schedules = json::array();
  for (ScheduleKind kind : kSchedules) schedules.push_back(std::string(pipelining::schedule_name(kind)));
  json out = {
      {"cases", cases},
      {"model",
       {{"layers", kLayers},
        {"hidden", kHidden},
        {"params", params},
        {"global_batch", kBatch},
        {"n_microbatches", kMicrobatches},
        {"layer", "test_composability.py's MLPModule: net1 Linear(H, H), ReLU, net2 Linear(H, H)"},
        {"loss", "cross_entropy(y, soft target) * 1e-4"}}},
      {"pp_sizes", args.worlds},
      {"schedules", schedules},
      {"placement",
       "single-stage schedules: stage r on rank r; multi-stage: 2 stages per rank, stage r + pp * i; 8 / num_stages "
       "layers per stage; no data parallelism (world = pp)"},
      {"bubble_definition", kBubbleDefinition},
      {"repeat", args.repeat},
      {"warmup", kWarmup},
      {"step", "schedule.step + SGD step (lr 1e-3, no momentum) over the rank's stages, zero_grad(set_to_none)"},
      {"timing", "rank 0's median step (rank 0 runs stage 0: first to start a step, last to finish it)"},
      {"launcher", "fork"},
      {"threads_per_rank", 1},
  };
  out.update(tdc::bench::run_info(started_at, bench_start));
  if (!tdc::bench::write_result("tdc_bench pipelining", args.out, out)) return 1;
  fmt::print(stderr, "-> {}\n", args.out);
  return 0;
}

}  // namespace bench_pipelining
