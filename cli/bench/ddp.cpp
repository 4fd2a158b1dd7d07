// `tdc bench ddp`: `tdc_bench ddp` times DDP against single-process training on the same global batch.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/support.h"
#include "cli.h"

namespace tdc::cli::bench {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

int print_ddp(const json& j, const fs::path& out) {
  if (!j.contains("cases") || !j["cases"].is_object())
    throw std::runtime_error(fmt::format("benchmark output '{}': field 'cases' is missing", out.string()));
  fmt::print(
      "\nDDP benchmark: host {} ({} CPUs), LibTorch {}, {} timed steps per case, {} ATen "
      "thread(s) per rank\n",
      j.value("host", std::string("?")), j.value("cpus", 0), j.value("libtorch_version", std::string("?")),
      j.value("repeat", 0), j.value("threads_per_rank", 0));
  fmt::print("{:<12} {:>5} {:>12} {:>15} {:>7} {:>8}\n", "model", "world", "ddp_step_ms", "single_step_ms", "ratio",
             "buckets");
  for (const auto& [model, worlds] : j["cases"].items()) {
    for (const auto& [world, c] : worlds.items()) {
      fmt::print("{:<12} {:>5} {:>12.2f} {:>15.2f} {:>7.2f} {:>8}\n", model, world, number_at(c, out, "ddp_step_ms"),
                 number_at(c, out, "single_step_ms"), number_at(c, out, "ratio"), c.value("buckets", 0));
    }
  }
  fmt::print("\nratio = DDP step / single-process step on the same global batch\nwritten to {}\n", out.string());
  return kExitOk;
}

}  // namespace

int bench_ddp(const ParsedArgs& a, const fs::path& build, const fs::path& out, std::optional<int> repeat) {
  int status = kExitOk;
  std::vector<std::string> tdc_args, unused;
  add_worlds(a, tdc_args, unused);
  std::optional<json> j = run_benchmark(build, "ddp", out, repeat, &status, tdc_args);
  return j ? print_ddp(*j, out) : status;
}

}  // namespace tdc::cli::bench
