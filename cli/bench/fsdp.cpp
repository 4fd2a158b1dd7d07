// `tdc bench fsdp` / `tdc bench fsdp1`: R rounds of `tdc_bench fsdp` (tdc's FSDP2, or FSDP1 with
// --fsdp1) and bench/pytorch/fsdp_pytorch.py (PyTorch's), merged (medians over rounds) and plotted.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "bench/fsdp_verdicts.h"
#include "bench/support.h"
#include "cli.h"

namespace tdc::cli::bench {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

// tdc's JSON (`tdc_bench fsdp`) + PyTorch's (fsdp_pytorch.py) -> the merged result. Both name the
// FSDP they timed ("fsdp": "FSDP2" or "FSDP1"); they must agree.
ojson merge_fsdp(const ojson& t, const fs::path& tdc_file, const ojson& py, const fs::path& py_file) {
  const std::string version = t.value("fsdp", std::string("FSDP2"));
  if (py.value("fsdp", std::string("FSDP2")) != version)
    throw std::runtime_error(fmt::format("'{}' timed {}, '{}' timed {}: not the same benchmark", tdc_file.string(),
                                         version, py_file.string(), py.value("fsdp", std::string("FSDP2"))));
  ojson out = ojson::object();
  ojson cases = ojson::object();
  for (const auto& [model, worlds] : t.at("cases").items()) {
    for (const auto& [world, c] : worlds.items()) {
      const std::string where = fmt::format("cases.{}.{}", model, world);
      if (!py.contains("cases") || !py["cases"].contains(model) || !py["cases"][model].contains(world))
        throw std::runtime_error(fmt::format("PyTorch output '{}' has no case {}", py_file.string(), where));
      const ojson& p = py["cases"][model][world];
      number_in(c, tdc_file, where, "tdc_fsdp_step_ms");  // present and a number, or a clear error
      number_in(c, tdc_file, where, "ddp_step_ms");
      double py_ms = number_in(p, py_file, where, "fsdp_step_ms");
      if (p.value("local_batch", -1) != c.value("local_batch", -2))
        throw std::runtime_error(fmt::format("{}: tdc and PyTorch ran different per-rank batches", where));
      ojson m = c;
      m["pytorch_fsdp_step_ms"] = py_ms;
      m["pytorch_fsdp_p90_ms"] = p.value("fsdp_p90_ms", 0.0);
      cases[model][world] = m;
    }
  }
  out["cases"] = cases;
  set_ratios_and_verdicts(out);
  ojson models = t.at("models");
  for (auto& [model, m] : models.items()) {
    if (!py.contains("models") || !py["models"].contains(model)) continue;
    const ojson& p = py["models"][model];
    m["pytorch_single_step_ms"] = p.value("single_step_ms", 0.0);
    m["pytorch_params"] = p.value("params", 0);
    if (p.value("params", -1) != m.value("params", -2))
      throw std::runtime_error(fmt::format("model {}: tdc has {} parameters, PyTorch {}: not the same model", model,
                                           m.value("params", 0), p.value("params", 0)));
    if (p.value("global_batch", -1) != m.value("global_batch", -2))
      throw std::runtime_error(fmt::format("model {}: tdc and PyTorch ran different global batches", model));
  }
  out["models"] = models;
  add_run_info(out, t, py, {"cases", "models"}, {"cases", "models"});
  return out;
}

// " [lowest-highest]" of a case's per-round values of `key`, or "" with fewer than two rounds: the
// spread a reader needs to judge a verdict near its target.
std::string round_range(const ojson& c, const char* key) {
  if (!c.contains(key) || !c[key].is_array() || c[key].size() < 2) return "";
  const auto extent = round_extent(c, key);
  return fmt::format(" [{:.2f}-{:.2f}]", extent->first, extent->second);
}

// One target's verdict line, naming the cases whose rounds fall on both sides of it.
void print_verdict(const std::string& target, bool met, double worst, const ojson& straddled) {
  fmt::print("target: {} in every case: {} (worst {:.2f})", target, met ? "met" : "NOT met", worst);
  if (straddled.is_array() && !straddled.empty())
    fmt::print("; rounds on both sides of it in {}: the verdict depends on the run",
               fmt::join(straddled.get<std::vector<std::string>>(), ", "));
  fmt::print("\n");
}

int print_fsdp(const ojson& j, const fs::path& out, const fs::path& png) {
  const std::string version = j.value("fsdp", std::string("FSDP2"));
  const bool v1 = version == "FSDP1";
  fmt::print(
      "\n{} benchmark: host {} ({} CPUs), LibTorch {} vs torch {}, {} timed steps per case "
      "(median of rank 0; median over {} round(s)), {} ATen thread(s) per rank\n",
      version, j.value("host", std::string("?")), j.value("cpus", 0), j.value("libtorch_version", std::string("?")),
      j.value("torch_version", std::string("?")), j.value("repeat", 0), j.value("rounds", 1),
      j.value("threads_per_rank", 0));
  fmt::print("{:<12} {:>5} {:>10} {:>10} {:>13} {:>13} {:>7}   {:>17} {:>7}   {:>10}\n", "model", "world", "single_ms",
             "ddp_ms", "tdc_fsdp_ms", "torch_fsdp_ms", "ratio", "tdc_nochecks_ms", "ratio", "fsdp/ddp");
  for (const auto& [model, worlds] : j["cases"].items()) {
    for (const auto& [world, c] : worlds.items()) {
      const double r = c.value("ratio", 0.0), d = c.value("fsdp_over_ddp", 0.0);
      fmt::print("{:<12} {:>5} {:>10.2f} {:>10.2f} {:>13.2f} {:>13.2f} {:>7.2f}{} {:>17.2f} {:>7.2f}   {:>10.2f}{}{}\n",
                 model, world, c.value("single_step_ms", 0.0), c.value("ddp_step_ms", 0.0),
                 c.value("tdc_fsdp_step_ms", 0.0), c.value("pytorch_fsdp_step_ms", 0.0), r, r <= 1.0 ? "  " : " >",
                 c.value("tdc_fsdp_nochecks_step_ms", 0.0), c.value("ratio_nochecks", 0.0), d,
                 d <= kFsdpOverDdpTarget ? "  " : " >", round_range(c, "fsdp_over_ddp_per_round"));
    }
  }
  const int cpus = j.value("cpus", 0);
  fmt::print(
      "\nratio = tdc {0} step / PyTorch {1} step (same model, batch, step, world size);\n"
      "tdc_nochecks: tdc {0} with its cross-rank collective argument checks off (TDC_COMM_CHECKS=0)\n"
      "fsdp/ddp = tdc {0} step / tdc DDP step (same model, batch, world size, round; in brackets the lowest and\n"
      "highest of the rounds)\n",
      version, v1 ? "FullyShardedDataParallel" : "fully_shard");
  print_verdict("ratio <= 1", j.value("target_met", false), j.value("worst_ratio", 0.0),
                j.value("target_straddled", ojson::array()));
  print_verdict(fmt::format("fsdp/ddp <= {}", kFsdpOverDdpTarget), j.value("ddp_target_met", false),
                j.value("worst_fsdp_over_ddp", 0.0), j.value("ddp_target_straddled", ojson::array()));
  int largest_world = 0;
  for (const auto& [model, worlds] : j["cases"].items())
    for (const auto& [world, c] : worlds.items()) largest_world = std::max(largest_world, std::stoi(world));
  if (cpus > 0 && cpus < largest_world)
    fmt::print("note: {} CPUs here, so world size {} oversubscribes the cores\n", cpus, largest_world);
  fmt::print("written to {}\n           {}\n", out.string(), png.string());
  return kExitOk;
}

constexpr int kFsdpWarmup = 3;  // `tdc_bench fsdp`'s kWarmup; the PyTorch runner gets the same

// Several merged rounds -> one: every step time is the median over rounds, the ratios are taken
// between those medians, and each case keeps its per-round ratios.
ojson combine_rounds(const std::vector<ojson>& rounds) {
  ojson out = rounds.front();
  const char* case_keys[] = {
      "single_step_ms",       "ddp_step_ms",        "tdc_fsdp_step_ms", "tdc_fsdp_p90_ms", "tdc_fsdp_nochecks_step_ms",
      "pytorch_fsdp_step_ms", "pytorch_fsdp_p90_ms"};
  const char* model_keys[] = {"single_step_ms", "pytorch_single_step_ms"};
  auto med = [&](const char* section, const std::string& a, const std::string& b, const char* key) {
    std::vector<double> v;
    for (const auto& r : rounds) {
      const ojson& c = b.empty() ? r[section][a] : r[section][a][b];
      if (c.contains(key) && c[key].is_number()) v.push_back(c[key].get<double>());
    }
    return v;
  };
  for (auto& [model, worlds] : out["cases"].items()) {
    for (auto& [world, c] : worlds.items()) {
      for (const char* key : case_keys) {
        auto v = med("cases", model, world, key);
        if (!v.empty()) c[key] = median_of(v);
      }
      ojson per_round = ojson::array(), over_ddp_per_round = ojson::array();
      for (const auto& r : rounds) {
        per_round.push_back(r["cases"][model][world].value("ratio", 0.0));
        over_ddp_per_round.push_back(r["cases"][model][world].value("fsdp_over_ddp", 0.0));
      }
      c["ratio_per_round"] = per_round;
      c["fsdp_over_ddp_per_round"] = over_ddp_per_round;
    }
  }
  set_ratios_and_verdicts(out);
  for (auto& [model, m] : out["models"].items()) {
    for (const char* key : model_keys) {
      auto v = med("models", model, "", key);
      if (!v.empty()) m[key] = median_of(v);
    }
  }
  double total = 0;
  for (const auto& r : rounds) total += r.value("duration_s", 0.0) + r["pytorch"].value("duration_s", 0.0);
  out["rounds"] = rounds.size();
  out["total_duration_s"] = total;
  return out;
}

}  // namespace

// `tdc bench fsdp` (FSDP2) and `tdc bench fsdp1` (FSDP1): the same binary, script, merge and plot;
// fsdp1 passes --fsdp1 to both sides.
int bench_fsdp(const ParsedArgs& a, const fs::path& build, const fs::path& out, std::optional<int> repeat, bool fsdp1) {
  const std::string name = fsdp1 ? "fsdp1" : "fsdp";
  const PythonSide py = python_side(a, build, name, "fsdp");
  std::vector<std::string> tdc_args, python_args{"--warmup", std::to_string(kFsdpWarmup)};
  if (fsdp1) {
    tdc_args.push_back("--fsdp1");
    python_args.push_back("--fsdp1");
  }
  add_worlds(a, tdc_args, python_args);
  const Rounds spec{
      .name = name,
      .program = "fsdp",
      .repeat = repeat.value_or(10),
      .rounds = a.get("rounds") ? parse_positive_int("bench", "rounds", *a.get("rounds")) : 3,
      .tdc_args = tdc_args,
      .python_args = python_args,
      .merge =
          [](const ojson& t, const fs::path& tf, const ojson& p, const fs::path& pf) {
            if (t.value("warmup", -1) != kFsdpWarmup)
              throw std::runtime_error(fmt::format("tdc_bench fsdp ran {} warm-up steps, the CLI expects {}",
                                                   t.value("warmup", -1), kFsdpWarmup));
            return merge_fsdp(t, tf, p, pf);
          },
      .combine = combine_rounds,
      .print = print_fsdp};
  return run_rounds(spec, build, py, out);
}

}  // namespace tdc::cli::bench
