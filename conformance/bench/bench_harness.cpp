// Harness benchmark: wall time of one 4-rank test through tdc::harness::launch(), per launcher.
//
//   tdc_bench_harness --out FILE [--repeat N]     (or: ./tdc bench harness --out FILE)
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

#include "tdc/comm/collectives.h"
#include "tdc/conformance/support.h"
#include "tdc/harness/launch.h"
#include "tdc/harness/results.h"

namespace {

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
    throw std::runtime_error(fmt::format("all_reduce: expected {} everywhere, got {}", kWorldSize,
                                         t[0].item<float>()));
}

const Case kCases[] = {{"empty", &empty_body}, {"all_reduce", &all_reduce_body}};

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  // Nearest rank.
  size_t k = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(k, 1, v.size()) - 1];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

[[noreturn]] void usage_error(const std::string& what) {
  fmt::print(stderr, "tdc_bench_harness: error: {}\nusage: tdc_bench_harness --out FILE [--repeat N]\n", what);
  std::exit(2);
}

void write_atomic(const std::string& path, const std::string& text) {
  std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(fmt::format("cannot create '{}': {}", tmp, std::strerror(errno)));
    out << text;
    out.flush();
    if (!out) throw std::runtime_error(fmt::format("cannot write '{}'", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw std::runtime_error(
        fmt::format("cannot rename '{}' to '{}': {}", tmp, path, std::strerror(errno)));
}

}  // namespace

int main(int argc, char** argv) {
  std::string error;
  if (!tdc::harness::init(&argc, argv, &error)) usage_error(error);
  std::string out_path;
  int repeat = 20;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* flag) -> std::string {
      std::string prefix = std::string(flag) + "=";
      if (a.rfind(prefix, 0) == 0) return a.substr(prefix.size());
      if (i + 1 >= argc) usage_error(fmt::format("{} needs a value", flag));
      return argv[++i];
    };
    if (a == "--out" || a.rfind("--out=", 0) == 0) {
      out_path = value("--out");
    } else if (a == "--repeat" || a.rfind("--repeat=", 0) == 0) {
      std::string v = value("--repeat");
      char* end = nullptr;
      long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end || n < 1 || n > 100000)
        usage_error(fmt::format("--repeat must be a positive integer, got '{}'", v));
      repeat = static_cast<int>(n);
    } else if (a == "-h" || a == "--help") {
      fmt::print("usage: tdc_bench_harness --out FILE [--repeat N]   (N timed launches per case "
                 "and launcher, default 20)\n");
      return 0;
    } else {
      usage_error(fmt::format("unknown argument '{}'", a));
    }
  }
  if (out_path.empty()) usage_error("--out FILE is required");

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
          fmt::print(stderr, "\ntdc_bench_harness: {} launch of case '{}' (#{}) ended {}: {}\n", lname,
                     c.name, i, tdc::harness::to_string(outcome.status), outcome.message);
          return 1;
        }
        if (i > 0) ms.push_back(t);
        ++done;
        std::string line = fmt::format("[{}/{}] {:<6} {:<10} #{:<3} {:7.1f} ms  (median so far {:.1f} ms)",
                                       done, total, lname, c.name, i, t, median(ms));
        if (tty)
          fmt::print(stderr, "\r\x1b[K{}", line);
        else if (i == repeat)
          fmt::print(stderr, "{}\n", line);
      }
      double med = median(ms);
      cases[lname][c.name] = {{"median_ms", med}, {"p90_ms", percentile(ms, 0.9)},
                              {"n", static_cast<int>(ms.size())}};
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
      {"host", tdc::harness::hostname()},
      {"libtorch_version",
       fmt::format("{}.{}.{}", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH)},
      {"started_at", started_at},
      {"duration_s",
       std::chrono::duration<double>(std::chrono::steady_clock::now() - bench_start).count()},
  };
  try {
    std::filesystem::path parent = std::filesystem::path(out_path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    write_atomic(out_path, out.dump(2) + "\n");
  } catch (const std::exception& e) {
    fmt::print(stderr, "tdc_bench_harness: {}\n", e.what());
    return 1;
  }
  fmt::print(stderr, "fork {:.1f} ms/test, thread {:.1f} ms/test (all_reduce median) -> {}\n",
             all_reduce_median["fork"], all_reduce_median["thread"], out_path);
  return 0;
}
