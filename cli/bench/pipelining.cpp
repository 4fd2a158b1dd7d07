// `tdc bench pipelining`: R rounds of `tdc_bench pipelining` (tdc's schedules) and
// bench/pytorch/pipelining_pytorch.py (PyTorch's), alternating which goes first, merged into one
// JSON (medians over rounds) and plotted by bench/pytorch/pipelining_plot.py. Schema:
// docs/results-schema.md, "Pipelining benchmark".
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <fmt/ranges.h>

#include "bench/support.h"
#include "cli.h"

namespace tdc::cli::bench {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

constexpr int kPipeliningWarmup = 3;  // `tdc_bench pipelining`'s kWarmup; the PyTorch runner gets the same
constexpr const char* kTarget = "tdc_step_ms <= pytorch_step_ms for every schedule and pp size (ratio <= 1)";

// Sets target_met / worst_ratio from the cases' ratios.
void verdict(ojson& j) {
  bool met = true;
  double worst = 0;
  for (const auto& [pp, schedules] : j["cases"].items()) {
    // The JSON's keys are sorted; "schedules" keeps the order the benchmark ran them in.
    for (const auto& s : j.value("schedules", ojson::array())) {
      const std::string name = s.get<std::string>();
      if (!schedules.contains(name)) continue;
      const ojson& c = schedules[name];
      const double r = c.value("ratio", 0.0);
      met = met && r <= 1.0;
      worst = std::max(worst, r);
    }
  }
  j["target"] = kTarget;
  j["target_met"] = met;
  j["worst_ratio"] = worst;
}

// tdc's JSON (`tdc_bench pipelining`) + PyTorch's (pipelining_pytorch.py) -> one round.
ojson merge_pipelining(const ojson& t, const fs::path& tdc_file, const ojson& py, const fs::path& py_file) {
  const ojson& tm = t.at("model");
  const ojson pm = py.value("model", ojson::object());
  for (const char* k : {"layers", "hidden", "params", "global_batch", "n_microbatches"}) {
    if (pm.value(k, ojson()) != tm.value(k, ojson()))
      throw std::runtime_error(fmt::format("'{}' and '{}' differ in model.{} ({} vs {}): not the same benchmark",
                                           tdc_file.string(), py_file.string(), k, tm.value(k, ojson()).dump(),
                                           pm.value(k, ojson()).dump()));
  }
  ojson cases = ojson::object();
  for (const auto& [pp, schedules] : t.at("cases").items()) {
    for (const auto& [name, c] : schedules.items()) {
      const std::string where = fmt::format("cases.{}.{}", pp, name);
      if (!py.contains("cases") || !py["cases"].contains(pp) || !py["cases"][pp].contains(name))
        throw std::runtime_error(fmt::format("PyTorch output '{}' has no case {}", py_file.string(), where));
      const ojson& p = py["cases"][pp][name];
      if (p.value("stages_per_rank", -1) != c.value("stages_per_rank", -2))
        throw std::runtime_error(fmt::format("{}: tdc and PyTorch placed different numbers of stages per rank", where));
      ojson m = c;
      const double tdc_ms = number_in(c, tdc_file, where, "tdc_step_ms");
      const double py_ms = number_in(p, py_file, where, "step_ms");
      m["pytorch_step_ms"] = py_ms;
      m["pytorch_p90_ms"] = p.value("p90_ms", 0.0);
      m["ratio"] = py_ms > 0 ? tdc_ms / py_ms : 0.0;
      cases[pp][name] = m;
    }
  }
  ojson out = ojson::object();
  out["cases"] = cases;
  verdict(out);
  add_run_info(out, t, py, {"cases"}, {"cases", "model"});
  return out;
}

// Several rounds -> one: every step time is the median over rounds, the ratios are taken between
// those medians, and each case keeps its per-round ratios.
ojson combine_pipelining_rounds(const std::vector<ojson>& rounds) {
  ojson out = rounds.front();
  for (auto& [pp, schedules] : out["cases"].items()) {
    for (auto& [name, c] : schedules.items()) {
      for (const char* key : {"tdc_step_ms", "tdc_p90_ms", "pytorch_step_ms", "pytorch_p90_ms"}) {
        std::vector<double> v;
        for (const auto& r : rounds) v.push_back(r["cases"][pp][name].value(key, 0.0));
        c[key] = median_of(v);
      }
      ojson per_round = ojson::array();
      for (const auto& r : rounds) per_round.push_back(r["cases"][pp][name].value("ratio", 0.0));
      const double py_ms = c.value("pytorch_step_ms", 0.0);
      c["ratio"] = py_ms > 0 ? c.value("tdc_step_ms", 0.0) / py_ms : 0.0;
      c["ratio_per_round"] = per_round;
    }
  }
  verdict(out);
  double total = 0;
  for (const auto& r : rounds) total += r.value("duration_s", 0.0) + r["pytorch"].value("duration_s", 0.0);
  out["rounds"] = rounds.size();
  out["total_duration_s"] = total;
  return out;
}

int print_pipelining(const ojson& j, const fs::path& out, const fs::path& png) {
  const ojson& m = j["model"];
  fmt::print(
      "\nPipelining benchmark: host {} ({} CPUs), LibTorch {} vs torch {}; 8-layer MLP hidden {}, batch {}, {} "
      "microbatches; {} timed steps per case (median of rank 0; median over {} round(s)), {} ATen thread(s) per "
      "rank\n",
      j.value("host", std::string("?")), j.value("cpus", 0), j.value("libtorch_version", std::string("?")),
      j.value("torch_version", std::string("?")), m.value("hidden", 0), m.value("global_batch", 0),
      m.value("n_microbatches", 0), j.value("repeat", 0), j.value("rounds", 1), j.value("threads_per_rank", 0));
  fmt::print("{:>3} {:<30} {:>7} {:>7} {:>12} {:>12} {:>7}   {}\n", "pp", "schedule", "stages", "bubble", "tdc_ms",
             "pytorch_ms", "ratio", "ratio per round");
  for (const auto& [pp, schedules] : j["cases"].items()) {
    // The JSON's keys are sorted; "schedules" keeps the order the benchmark ran them in.
    for (const auto& s : j.value("schedules", ojson::array())) {
      const std::string name = s.get<std::string>();
      if (!schedules.contains(name)) continue;
      const ojson& c = schedules[name];
      const double r = c.value("ratio", 0.0);
      std::vector<std::string> per_round;
      for (const auto& x : c.value("ratio_per_round", ojson::array()))
        per_round.push_back(fmt::format("{:.2f}", x.get<double>()));
      fmt::print("{:>3} {:<30} {:>7} {:>7.3f} {:>12.2f} {:>12.2f} {:>7.2f}{} {}\n", pp, name, c.value("num_stages", 0),
                 c.value("bubble_fraction", 0.0), c.value("tdc_step_ms", 0.0), c.value("pytorch_step_ms", 0.0), r,
                 r <= 1.0 ? "  " : " >", fmt::join(per_round, " "));
    }
  }
  fmt::print(
      "\nratio = tdc step / PyTorch step (same model, batch, placement, schedule, pp size); stages = stages in the "
      "pipeline;\nbubble = {}\ntarget: ratio <= 1 in every case: {} (worst {:.2f})\n",
      j.value("bubble_definition", std::string("?")), j.value("target_met", false) ? "met" : "NOT met",
      j.value("worst_ratio", 0.0));
  const int cpus = j.value("cpus", 0);
  if (cpus > 0 && cpus < 4) fmt::print("note: {} CPUs here, so pp 4 oversubscribes the cores\n", cpus);
  fmt::print("written to {}\n           {}\n", out.string(), png.string());
  return kExitOk;
}

}  // namespace

int bench_pipelining(const ParsedArgs& a, const fs::path& build, const fs::path& out, std::optional<int> repeat) {
  const PythonSide py = python_side(a, build, "pipelining");
  std::vector<std::string> tdc_args, python_args{"--warmup", std::to_string(kPipeliningWarmup)};
  add_worlds(a, tdc_args, python_args, "--pp-sizes");
  const Rounds spec{
      .name = "pipelining",
      .repeat = repeat.value_or(10),
      .rounds = a.get("rounds") ? parse_positive_int("bench", "rounds", *a.get("rounds")) : 3,
      .tdc_args = tdc_args,
      .python_args = python_args,
      .merge =
          [](const ojson& t, const fs::path& tf, const ojson& p, const fs::path& pf) {
            if (t.value("warmup", -1) != kPipeliningWarmup)
              throw std::runtime_error(fmt::format("tdc_bench pipelining ran {} warm-up steps, the CLI expects {}",
                                                   t.value("warmup", -1), kPipeliningWarmup));
            return merge_pipelining(t, tf, p, pf);
          },
      .combine = combine_pipelining_rounds,
      .print = print_pipelining};
  return run_rounds(spec, build, py, out);
}

}  // namespace tdc::cli::bench
