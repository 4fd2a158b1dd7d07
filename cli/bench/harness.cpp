// `tdc bench harness`: `tdc_bench harness` times tdc::harness::launch() per launcher and case; the
// table against the harness's targets.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/support.h"
#include "cli.h"

namespace tdc::cli::bench {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

int print_harness(const json& j, const fs::path& out) {
  double fork_ms = number_at(j, out, "fork_ms_per_test");
  double thread_ms = number_at(j, out, "thread_ms_per_test");
  fmt::print("\nharness benchmark: world size {}, host {}, LibTorch {}\n", j.value("world_size", 0),
             j.value("host", std::string("?")), j.value("libtorch_version", std::string("?")));
  fmt::print("{:<8} {:<12} {:>10} {:>10} {:>5}\n", "launcher", "case", "median_ms", "p90_ms", "n");
  if (j.contains("cases") && j["cases"].is_object()) {
    for (const auto& [launcher, cases] : j["cases"].items()) {
      for (const auto& [name, c] : cases.items()) {
        fmt::print("{:<8} {:<12} {:>10.1f} {:>10.1f} {:>5}\n", launcher, name, c.value("median_ms", 0.0),
                   c.value("p90_ms", 0.0), c.value("n", 0));
      }
    }
  }
  const json targets = j.value("targets", json::object());
  auto verdict = [&](const char* key, double v) {
    double target = targets.value(key, 0.0);
    return target > 0 ? fmt::format("{:.1f} ms (target {:.0f} ms: {})", v, target, v <= target ? "met" : "NOT met")
                      : fmt::format("{:.1f} ms", v);
  };
  fmt::print("\nfork_ms_per_test   {}\nthread_ms_per_test {}\nwritten to {}\n", verdict("fork_ms_per_test", fork_ms),
             verdict("thread_ms_per_test", thread_ms), out.string());
  return kExitOk;
}

}  // namespace

int bench_harness(const ParsedArgs&, const fs::path& build, const fs::path& out, std::optional<int> repeat) {
  int status = kExitOk;
  std::optional<json> j = run_benchmark(build, "harness", out, repeat.value_or(20), &status);
  return j ? print_harness(*j, out) : status;
}

}  // namespace tdc::cli::bench
