// Harness benchmark: wall time of one 4-rank test through tdc::harness::launch(), per launcher.
//
//   tdc_bench harness --out FILE [--repeat N]     (or: ./tdc bench harness --out FILE)
//
// Cases: "empty" (the body does nothing: pure launcher cost) and "all_reduce" (create the world
// process group and all-reduce 1024 floats: what a small real test pays). Each launch() call is
// timed end to end: start of ranks, rendezvous, body, teardown. One untimed warm-up launch per
// case and launcher comes first. Fork cases run before thread cases: thread ranks run ATen ops in
// this process, after which forking is unsafe (docs/design: "Fork hazard").
// Output schema: docs/results-schema.md, "Harness benchmark".
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include "bench_common.h"
#include "tdc/comm/collectives.h"
#include "tdc/conformance/support.h"
#include "tdc/harness/launch.h"
#include "tdc/harness/results.h"

#include "benchmarks.h"

namespace bench_harness {

using json = nlohmann::ordered_json;  // keys in the order written: headline numbers first
using tdc::harness::Launcher;

constexpr int kWorldSize = 4;
constexpr double kTargetForkMs = 50;
constexpr double kTargetThreadMs = 20;

struct Case {
  const char* name;
  void (*body)();
};

void empty_body() {}

void all_reduce_body() {
  auto g = tdc::conformance::world();
  at::Tensor t = at::ones({1024});
  tdc::comm::all_reduce(t);
  // A wrong sum means the benchmark measured something broken: fail the launch.
  if (t[0].item<float>() != static_cast<float>(kWorldSize))
    throw std::runtime_error(fmt::format("all_reduce: expected {} everywhere, got {}", kWorldSize, t[0].item<float>()));
}

const Case kCases[] = {{"empty", &empty_body}, {"all_reduce", &all_reduce_body}};

// `tdc_bench harness` (bench/cpp/main.cpp).
int run(int argc, char** argv) {
  const tdc::bench::Args args =
      tdc::bench::parse_args(argc, argv, "tdc_bench harness", 20, "timed launches per case and launcher");
  const std::string& out_path = args.out;
  const int repeat = args.repeat;

  const Launcher launchers[] = {Launcher::Fork, Launcher::Thread};
  const int total = static_cast<int>(std::size(launchers) * std::size(kCases)) * (repeat + 1);
  int done = 0;
  bool tty = ::isatty(STDERR_FILENO);
  auto bench_start = std::chrono::steady_clock::now();
  std::string started_at = tdc::harness::iso_now();

  json cases = json::object();
  std::map<std::string, double> all_reduce_median;
  for (Launcher launcher : launchers) {
    const char* lname = tdc::harness::to_string(launcher);
    for (const Case& c : kCases) {
      std::vector<double> ms;
      for (int i = 0; i <= repeat; ++i) {  // i == 0: warm-up, not timed
        tdc::harness::LaunchSpec spec;
        spec.suite = "HarnessBench";
        spec.name = fmt::format("{}_{}_{}", lname, c.name, i);  // unique: a fresh world per launch
        spec.world_size = kWorldSize;
        spec.launcher = launcher;
        spec.timeout_s = 60;
        auto t0 = std::chrono::steady_clock::now();
        tdc::harness::Outcome outcome = tdc::harness::launch(spec, c.body);
        double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (outcome.status != tdc::harness::Status::Pass) {
          fmt::print(stderr, "\ntdc_bench harness: {} launch of case '{}' (#{}) ended {}: {}\n", lname, c.name, i,
                     tdc::harness::to_string(outcome.status), outcome.message);
          return 1;
        }
        if (i > 0) ms.push_back(t);
        ++done;
        std::string line = fmt::format("[{}/{}] {:<6} {:<10} #{:<3} {:7.1f} ms  (median so far {:.1f} ms)", done, total,
                                       lname, c.name, i, t, tdc::bench::median(ms));
        if (tty)
          fmt::print(stderr, "\r\x1b[K{}", line);
        else if (i == repeat)
          fmt::print(stderr, "{}\n", line);
      }
      double med = tdc::bench::median(ms);
      cases[lname][c.name] = {
          {"median_ms", med}, {"p90_ms", tdc::bench::percentile(ms, 0.9)}, {"n", static_cast<int>(ms.size())}};
      if (std::string(c.name) == "all_reduce") all_reduce_median[lname] = med;
    }
  }
  if (tty) fmt::print(stderr, "\n");

  json out = {
      {"fork_ms_per_test", all_reduce_median["fork"]},
      {"thread_ms_per_test", all_reduce_median["thread"]},
      {"cases", cases},
      {"world_size", kWorldSize},
      {"repeat", repeat},
      {"targets", {{"fork_ms_per_test", kTargetForkMs}, {"thread_ms_per_test", kTargetThreadMs}}},
  };
  out.update(tdc::bench::run_info(started_at, bench_start));
  if (!tdc::bench::write_result("tdc_bench harness", out_path, out)) return 1;
  fmt::print(stderr, "fork {:.1f} ms/test, thread {:.1f} ms/test (all_reduce median) -> {}\n",
             all_reduce_median["fork"], all_reduce_median["thread"], out_path);
  return 0;
}

}  // namespace bench_harness
