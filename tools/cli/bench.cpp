// `tdc bench harness`: runs the harness benchmark (tdc_bench_harness, a separate binary so that
// its forks start from a clean process) and prints its numbers against the targets.
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "process.h"

namespace tdc::cli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::vector<OptionSpec> kBenchOptions = {
    {"out", "FILE", "where the benchmark writes its JSON (default results/bench-harness.json)"},
    {"repeat", "N", "timed launches per case and launcher (default 20; the smoke test uses 3)"},
    {"build-dir", "DIR", "build directory (default $TDC_BUILD)"},
};

constexpr const char* kBenchUsage =
    "usage: tdc bench harness [--out FILE] [--repeat N]\n\n"
    "Times tdc::harness::launch() for 4-rank tests (cases 'empty' and 'all_reduce', launchers\n"
    "fork and thread): wall time per test including process/thread start, rendezvous, body and\n"
    "teardown. Writes JSON (docs/results-schema.md, 'Harness benchmark') and prints a table.\n\n"
    "Options:\n";

double number_at(const json& j, const fs::path& file, const std::string& key) {
  if (!j.contains(key) || !j[key].is_number())
    throw std::runtime_error(fmt::format("benchmark output '{}': field '{}' is missing or not a "
                                         "number", file.string(), key));
  return j[key].get<double>();
}

}  // namespace

int bench_command(const std::vector<std::string>& args) {
  ParsedArgs a = parse_args("bench", kBenchOptions, args, true);
  if (a.help || a.positional.empty()) {
    fmt::print("{}{}", kBenchUsage, format_options(kBenchOptions));
    return a.help ? kExitOk : kExitUsage;
  }
  if (a.positional.size() != 1 || a.positional[0] != "harness")
    throw UsageError(fmt::format("bench: unknown benchmark '{}' (available: harness)",
                                 fmt::join(a.positional, " ")));
  fs::path build = resolve_build_dir(a.get("build-dir"));
  fs::path out = fs::absolute(a.get("out").value_or("results/bench-harness.json"));
  int repeat = 20;
  if (auto v = a.get("repeat")) repeat = parse_positive_int("bench", "repeat", *v);
  fs::path exe = build / "tdc_bench_harness";
  if (!fs::exists(exe))
    throw UsageError(fmt::format("benchmark binary '{}' does not exist: build it (ninja -C {} "
                                 "tdc_bench_harness)", exe.string(), build.string()));

  SpawnOptions so;
  so.argv = {exe.string(), "--out", out.string(), "--repeat", std::to_string(repeat)};
  Child child = Child::spawn(so);
  int status = child.wait();
  if (interrupted()) return kExitInterrupted;
  if (exit_code(status) != 0) {
    fmt::print(stderr, "tdc bench: {} failed: {}\n", exe.string(), describe_exit(status));
    return kExitFailed;
  }

  std::ifstream in(out);
  if (!in) throw std::runtime_error(fmt::format("benchmark output '{}' was not written", out.string()));
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    throw std::runtime_error(fmt::format("benchmark output '{}' is not valid JSON: {}", out.string(), e.what()));
  }
  double fork_ms = number_at(j, out, "fork_ms_per_test");
  double thread_ms = number_at(j, out, "thread_ms_per_test");

  fmt::print("\nharness benchmark: world size {}, host {}, LibTorch {}\n", j.value("world_size", 0),
             j.value("host", std::string("?")), j.value("libtorch_version", std::string("?")));
  fmt::print("{:<8} {:<12} {:>10} {:>10} {:>5}\n", "launcher", "case", "median_ms", "p90_ms", "n");
  if (j.contains("cases") && j["cases"].is_object()) {
    for (const auto& [launcher, cases] : j["cases"].items()) {
      for (const auto& [name, c] : cases.items()) {
        fmt::print("{:<8} {:<12} {:>10.1f} {:>10.1f} {:>5}\n", launcher, name,
                   c.value("median_ms", 0.0), c.value("p90_ms", 0.0), c.value("n", 0));
      }
    }
  }
  const json targets = j.value("targets", json::object());
  auto verdict = [&](const char* key, double v) {
    double target = targets.value(key, 0.0);
    return target > 0 ? fmt::format("{:.1f} ms (target {:.0f} ms: {})", v, target,
                                    v <= target ? "met" : "NOT met")
                      : fmt::format("{:.1f} ms", v);
  };
  fmt::print("\nfork_ms_per_test   {}\nthread_ms_per_test {}\nwritten to {}\n",
             verdict("fork_ms_per_test", fork_ms), verdict("thread_ms_per_test", thread_ms),
             out.string());
  return kExitOk;
}

}  // namespace tdc::cli
