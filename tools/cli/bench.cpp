// `tdc bench harness` / `tdc bench ddp`: runs a benchmark binary (tdc_bench_harness,
// tdc_bench_ddp: separate binaries so that their forks start from a clean process) and prints its
// numbers (the harness's against their targets).
#include <fstream>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "process.h"

namespace tdc::cli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::vector<OptionSpec> kBenchOptions = {
    {"out", "FILE", "where the benchmark writes its JSON (default results/bench-NAME.json)"},
    {"repeat", "N", "harness: timed launches per case and launcher (default 20; the smoke test "
                    "uses 3); ddp: timed steps per case (default 10)"},
    {"build-dir", "DIR", "build directory (default $TDC_BUILD)"},
};

constexpr const char* kBenchUsage =
    "usage: tdc bench harness [--out FILE] [--repeat N]\n"
    "       tdc bench ddp [--out FILE] [--repeat N]\n\n"
    "harness: times tdc::harness::launch() for 4-rank tests (cases 'empty' and 'all_reduce',\n"
    "launchers fork and thread): wall time per test including process/thread start, rendezvous,\n"
    "body and teardown. JSON: docs/results-schema.md, 'Harness benchmark'.\n"
    "ddp: DistributedDataParallel step time against single-process training on the same global\n"
    "batch (models MLPStack and Transformer, world sizes 2 and 4, fork launcher). JSON:\n"
    "docs/results-schema.md, 'DDP benchmark'.\n"
    "Both show progress, write JSON and print a table.\n\n"
    "Options:\n";

double number_at(const json& j, const fs::path& file, const std::string& key) {
  if (!j.contains(key) || !j[key].is_number())
    throw std::runtime_error(fmt::format("benchmark output '{}': field '{}' is missing or not a "
                                         "number", file.string(), key));
  return j[key].get<double>();
}

// Runs `exe` with --out/--repeat and returns its parsed JSON output (throws naming what failed).
std::optional<json> run_benchmark(const fs::path& build, const std::string& binary, const fs::path& out,
                                  std::optional<int> repeat, int* exit_status) {
  fs::path exe = build / binary;
  if (!fs::exists(exe))
    throw UsageError(fmt::format("benchmark binary '{}' does not exist: build it (ninja -C {} {})",
                                 exe.string(), build.string(), binary));
  SpawnOptions so;
  so.argv = {exe.string(), "--out", out.string()};
  if (repeat) so.argv.insert(so.argv.end(), {"--repeat", std::to_string(*repeat)});
  Child child = Child::spawn(so);
  int status = child.wait();
  if (interrupted()) {
    *exit_status = kExitInterrupted;
    return std::nullopt;
  }
  if (exit_code(status) != 0) {
    fmt::print(stderr, "tdc bench: {} failed: {}\n", exe.string(), describe_exit(status));
    *exit_status = kExitFailed;
    return std::nullopt;
  }
  std::ifstream in(out);
  if (!in) throw std::runtime_error(fmt::format("benchmark output '{}' was not written", out.string()));
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    throw std::runtime_error(fmt::format("benchmark output '{}' is not valid JSON: {}", out.string(), e.what()));
  }
}

int print_harness(const json& j, const fs::path& out) {
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

int print_ddp(const json& j, const fs::path& out) {
  if (!j.contains("cases") || !j["cases"].is_object())
    throw std::runtime_error(fmt::format("benchmark output '{}': field 'cases' is missing", out.string()));
  fmt::print("\nDDP benchmark: host {} ({} CPUs), LibTorch {}, {} timed steps per case, {} ATen "
             "thread(s) per rank\n", j.value("host", std::string("?")), j.value("cpus", 0),
             j.value("libtorch_version", std::string("?")), j.value("repeat", 0),
             j.value("threads_per_rank", 0));
  fmt::print("{:<12} {:>5} {:>12} {:>15} {:>7} {:>8}\n", "model", "world", "ddp_step_ms",
             "single_step_ms", "ratio", "buckets");
  for (const auto& [model, worlds] : j["cases"].items()) {
    for (const auto& [world, c] : worlds.items()) {
      fmt::print("{:<12} {:>5} {:>12.2f} {:>15.2f} {:>7.2f} {:>8}\n", model, world,
                 number_at(c, out, "ddp_step_ms"), number_at(c, out, "single_step_ms"),
                 number_at(c, out, "ratio"), c.value("buckets", 0));
    }
  }
  fmt::print("\nratio = DDP step / single-process step on the same global batch\nwritten to {}\n",
             out.string());
  return kExitOk;
}

}  // namespace

int bench_command(const std::vector<std::string>& args) {
  ParsedArgs a = parse_args("bench", kBenchOptions, args, true);
  if (a.help || a.positional.empty()) {
    fmt::print("{}{}", kBenchUsage, format_options(kBenchOptions));
    return a.help ? kExitOk : kExitUsage;
  }
  const std::string name = a.positional.size() == 1 ? a.positional[0] : "";
  if (name != "harness" && name != "ddp")
    throw UsageError(fmt::format("bench: unknown benchmark '{}' (available: harness, ddp)",
                                 fmt::join(a.positional, " ")));
  fs::path build = resolve_build_dir(a.get("build-dir"));
  fs::path out = fs::absolute(a.get("out").value_or(fmt::format("results/bench-{}.json", name)));
  std::optional<int> repeat;
  if (auto v = a.get("repeat")) repeat = parse_positive_int("bench", "repeat", *v);
  if (name == "harness" && !repeat) repeat = 20;

  int status = kExitOk;
  std::optional<json> j = run_benchmark(build, "tdc_bench_" + name, out, repeat, &status);
  if (!j) return status;
  return name == "harness" ? print_harness(*j, out) : print_ddp(*j, out);
}

}  // namespace tdc::cli
