// DDP benchmark: step time of DistributedDataParallel against single-process training on the same
// global batch, for two models at world sizes 2 and 4 (fork launcher, 1 ATen thread per rank).
//
//   tdc_bench ddp --out FILE [--repeat N] [--worlds 2|4|2,4]   (or: ./tdc bench ddp --out FILE)
//
// A step is forward + loss (MSE / token cross-entropy) + backward + SGD update. The single-process case
// runs the whole global batch in one process (a world of 1, no DDP); a DDP case runs world_size
// ranks, each on global_batch / world_size samples, DDP's bucketed all-reduces overlapping
// backward. Each case: 2 untimed warm-up steps, then N timed steps; the figure is rank 0's median
// step (ranks move in lock step: every step ends in the same all-reduces). Ratio = DDP / single:
// below 1 means DDP's parallelism paid for its communication on this host (on a 2-core machine,
// world 4 oversubscribes the cores, so its ratio says more about the host than about DDP).
// Output schema: docs/results-schema.md, "DDP benchmark".
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include "bench_common.h"
#include "bench_models.h"
#include "tdc/comm/collectives.h"
#include "tdc/conformance/support.h"
#include "tdc/ddp/ddp.h"
#include "tdc/harness/launch.h"
#include "tdc/harness/results.h"
#include "tdc/fixtures/models.h"

#include "benchmarks.h"

namespace bench_ddp {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

constexpr int kWarmup = 2;

// The benchmark models: fixtures::MLPStack(256) (MSE on [B, 256]) and fixtures::Transformer
// (dim 128, 2 blocks, vocab 512, sequence 64, no dropout; token cross-entropy on [B, 64]).
struct ModelCase {
  const char* name;
  int64_t global_batch;
  tdc::nn::ModulePtr (*make)();
  tdc::nn::Tensors (*inputs)(int64_t batch, at::Generator& gen);
  at::Tensor (*target)(int64_t batch, at::Generator& gen);
};

using namespace tdc::bench::models;

at::Tensor loss_of(const at::Tensor& y, const at::Tensor& target) {
  if (target.scalar_type() == at::kLong) return at::cross_entropy_loss(y.flatten(0, 1), target.flatten());
  return at::mse_loss(y, target);
}

const ModelCase kModels[] = {
    {"MLPStack", 64, &make_mlp_stack, &mlp_inputs, &mlp_target},
    {"Transformer", 16, &make_transformer, &tf_inputs, &tf_target},
};

// One case on the calling rank; rank 0 writes {"step_ms", "buckets", "params"} to `result`.
void run_case(const ModelCase& m, bool use_ddp, int repeat, const std::string& result) {
  auto group = tdc::conformance::world();
  const int world = group->size(), rank = group->rank();
  tdc::nn::ModulePtr model = m.make();
  std::shared_ptr<tdc::ddp::DistributedDataParallel> ddp;
  tdc::nn::Module* call = model.get();
  if (use_ddp) {
    ddp = std::make_shared<tdc::ddp::DistributedDataParallel>(model, group);
    call = ddp.get();
  }
  const int64_t local_batch = m.global_batch / world;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4321 + rank);
  tdc::nn::Tensors inputs = m.inputs(local_batch, gen);
  at::Tensor target = m.target(local_batch, gen);
  std::vector<at::Tensor> params = model->params();
  int64_t numel = 0;
  for (const auto& p : params) numel += p.numel();

  std::vector<double> ms;
  if (world > 1) tdc::comm::barrier(group);
  for (int i = 0; i < kWarmup + repeat; ++i) {
    auto t0 = Clock::now();
    at::Tensor loss = loss_of((*call)(inputs).at(0), target);
    loss.backward();
    {
      at::NoGradGuard no_grad;
      for (auto& p : params) {
        p.add_(p.grad(), -1e-3);
        p.mutable_grad().reset();
      }
    }
    double t = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (i >= kWarmup) ms.push_back(t);
  }
  if (rank != 0) return;
  json r = {
      {"step_ms", tdc::bench::median(ms)}, {"buckets", ddp ? ddp->last_backward().buckets : 0}, {"params", numel}};
  std::ofstream(result) << r.dump() << "\n";
}

// `tdc_bench ddp` (bench/cpp/main.cpp).
int run(int argc, char** argv) {
  const tdc::bench::Args args = tdc::bench::parse_args(argc, argv, "tdc_bench ddp", 10, "timed steps per case", true);
  const std::string& out_path = args.out;
  const int repeat = args.repeat;

  const tdc::bench::TempDir tmp("tdc-bench-ddp");
  const fs::path& dir = tmp.path();
  const int total = static_cast<int>(std::size(kModels) * (1 + args.worlds.size()));
  int done = 0;
  auto bench_start = Clock::now();
  std::string started_at = tdc::harness::iso_now();

  // Runs one case in a fresh world; returns rank 0's result or prints why it failed.
  auto run = [&](const ModelCase& m, int world, bool use_ddp) -> std::optional<json> {
    std::string result = (dir / fmt::format("{}-{}.json", m.name, world)).string();
    tdc::harness::LaunchSpec spec;
    spec.suite = "DDPBench";
    spec.name = fmt::format("{}_{}_{}", m.name, use_ddp ? "ddp" : "single", world);
    spec.world_size = world;
    spec.launcher = tdc::harness::Launcher::Fork;
    spec.timeout_s = 120 + 2.0 * repeat;
    const std::string label =
        fmt::format("[{}/{}] {:<11} {:<6} world {}", done + 1, total, m.name, use_ddp ? "ddp" : "single", world);
    auto j = tdc::bench::run_case_and_read(spec, label, result, [&] { run_case(m, use_ddp, repeat, result); });
    ++done;
    return j;
  };

  json cases = json::object(), models = json::object();
  bool ok = true;
  for (const ModelCase& m : kModels) {
    auto single = run(m, 1, false);
    if (!single) {
      ok = false;
      break;
    }
    double single_ms = (*single)["step_ms"].get<double>();
    models[m.name] = {{"global_batch", m.global_batch}, {"params", (*single)["params"]}, {"single_step_ms", single_ms}};
    for (int world : args.worlds) {
      auto d = run(m, world, true);
      if (!d) {
        ok = false;
        break;
      }
      double ddp_ms = (*d)["step_ms"].get<double>();
      cases[m.name][std::to_string(world)] = {{"ddp_step_ms", ddp_ms},
                                              {"single_step_ms", single_ms},
                                              {"ratio", single_ms > 0 ? ddp_ms / single_ms : 0.0},
                                              {"local_batch", m.global_batch / world},
                                              {"buckets", (*d)["buckets"]}};
    }
    if (!ok) break;
  }
  if (!ok) return 1;

  json out = {
      {"cases", cases},
      {"models", models},
      {"world_sizes", args.worlds},
      {"repeat", repeat},
      {"warmup", kWarmup},
      {"launcher", "fork"},
      {"threads_per_rank", 1},
      {"bucket_cap_mb", tdc::ddp::DDPOptions{}.bucket_cap_mb},
  };
  out.update(tdc::bench::run_info(started_at, bench_start));
  if (!tdc::bench::write_result("tdc_bench ddp", out_path, out)) return 1;
  fmt::print(stderr, "-> {}\n", out_path);
  return 0;
}

}  // namespace bench_ddp
