// `tdc parity`: numeric parity with real PyTorch. Every scenario of fixtures/scenarios/*.json runs
// on both sides from the same initial weights and data: PyTorch 2.13's side first
// (tools/parity/run_scenario.py with the venv's python, once for all scenarios: it also writes
// each scenario's inputs), then tdc's (build/tdc_parity_runner, once per scenario). Each side
// writes a trace; the verdict compares them with the scenario's tolerance ([Note: parity
// verdict] in conformance/parity/include/tdc/parity/trace.h). Writes OUT/traces/<name>.<side>.json
// and OUT/parity.json (docs/results-schema.md, "Parity"), prints a table, exits 1 unless every
// scenario passes (or is NOT_SUPPORTED on this release: [Note: scenario requires a release]).
#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include "cli.h"
#include "process.h"
#include "tdc/harness/results.h"
#include "tdc/parity/scenario.h"
#include "tdc/parity/trace.h"

#ifndef TDC_VERSION
#define TDC_VERSION "unknown"
#endif

namespace tdc::cli {

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// Time limits: a hung side costs minutes, not forever. Each scenario takes ~1-3 s per side on a
// loaded 2-core machine; the PyTorch side also imports torch once (~5 s).
const std::string kLibTorchVersion =
    fmt::format("{}.{}.{}", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH);

constexpr double kRunnerLimitS = 300;  // one scenario on tdc's side
constexpr double kPythonBaseLimitS = 120, kPythonPerScenarioLimitS = 120;

const std::vector<OptionSpec> kParityOptions = {
    {"out", "DIR", "where traces/ and parity.json go (default results/parity)"},
    {"filter", "GLOB", "only scenarios whose name matches (fnmatch; default every one)"},
    {"scenarios", "DIR", "the scenario files (default SOURCE/fixtures/scenarios)"},
    {"build-dir", "DIR", "build directory with tdc_parity_runner (default $TDC_BUILD)"},
    {"python", "PY",
     "the oracle python, with torch and safetensors (default $TDC_PYTHON, else the build's python, else "
     "SOURCE/.venv/bin/python)"},
};

constexpr const char* kParityUsage =
    "usage: tdc parity [--out DIR] [--filter GLOB] [--scenarios DIR] [--python PY]\n\n"
    "Numeric parity with real PyTorch: each scenario (model, seeds, world size 1-4, mesh, recipe:\n"
    "DDP, TP, FSDP2 1-D / HSDP / TP x FSDP2, FSDP1 (FULL_SHARD / SHARD_GRAD_OP, use_orig_params),\n"
    "mixed precision, gradient accumulation, activation checkpointing, pipelining,\n"
    "checkpoint-resume; optimizer, steps) trains in PyTorch 2.13 (the\n"
    "venv's torch, tools/parity/run_scenario.py) and in tdc (tdc_parity_runner) from the same\n"
    "initial weights and data. Each side writes a trace (per-step loss and gradient norm, checksums\n"
    "of every full parameter after the last step); a scenario passes when every number agrees\n"
    "within the scenario's tolerance. Writes OUT/traces/<name>.<tdc|pytorch>.json and\n"
    "OUT/parity.json (docs/results-schema.md, 'Parity'), prints a table; exit 1 unless all pass.\n\n"
    "Options:\n";

struct Paths {
  fs::path build, source, python, runner_py, runner_tdc, scenarios, out;
};

Paths resolve_paths(const ParsedArgs& a) {
  Paths p;
  p.build = resolve_build_dir(a.get("build-dir"));
  p.source = resolve_source_dir(p.build);
  if (p.source.empty()) throw UsageError("parity: cannot find the source directory: set TDC_ROOT");
  p.python = resolve_oracle_python(a.get("python"), p.build, p.source);
  if (::access(p.python.c_str(), X_OK) != 0)
    throw UsageError(
        fmt::format("parity: no python for the PyTorch side ('{}' is not an executable): run ./tdc "
                    "setup or pass --python PY",
                    p.python.string()));
  p.runner_py = p.source / "tools" / "parity" / "run_scenario.py";
  p.runner_tdc = p.build / "tdc_parity_runner";
  if (!fs::is_regular_file(p.runner_py))
    throw UsageError(
        fmt::format("parity: '{}' does not exist (TDC_ROOT points at the wrong tree?)", p.runner_py.string()));
  if (!fs::is_regular_file(p.runner_tdc))
    throw UsageError(fmt::format("parity: '{}' does not exist: build it (ninja -C {} tdc_parity_runner)",
                                 p.runner_tdc.string(), p.build.string()));
  p.scenarios = a.get("scenarios") ? fs::path(*a.get("scenarios")) : p.source / "fixtures" / "scenarios";
  if (!fs::is_directory(p.scenarios))
    throw UsageError(fmt::format("parity: scenario directory '{}' does not exist", p.scenarios.string()));
  p.out = a.get("out").value_or("results/parity");
  return p;
}

// Every *.json in the directory (sorted by file name), checked; those whose name matches.
std::vector<parity::Scenario> select_scenarios(const fs::path& dir, const std::optional<std::string>& filter) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::vector<parity::Scenario> out;
  std::map<std::string, fs::path> names;
  for (const auto& f : files) {
    parity::Scenario s;
    try {
      s = parity::load_scenario(f);
    } catch (const parity::ScenarioError& e) {
      throw UsageError(fmt::format("parity: {}", e.what()));
    }
    if (auto [it, fresh] = names.emplace(s.name, f); !fresh)
      throw UsageError(fmt::format("parity: scenarios '{}' and '{}' have the same name '{}'", it->second.string(),
                                   f.string(), s.name));
    if (!filter || fnmatch(filter->c_str(), s.name.c_str(), 0) == 0) out.push_back(std::move(s));
  }
  if (out.empty())
    throw UsageError(fmt::format("parity: no scenario in '{}'{}", dir.string(),
                                 filter ? fmt::format(" matches --filter '{}'", *filter) : ""));
  return out;
}

fs::path trace_path(const Paths& p, const std::string& name, const std::string& side) {
  return p.out / "traces" / fmt::format("{}.{}.json", name, side);
}

// One python process for `scenarios`; its progress shows on stderr. True when it exited 0; false
// when it failed, ran past its limit or was interrupted (`finished` false for the last two).
bool run_pytorch_process(const Paths& p, const std::vector<parity::Scenario>& scenarios, bool& finished) {
  SpawnOptions so;
  so.argv = {p.python.string(),           p.runner_py.string(), "--inputs",
             (p.out / "inputs").string(), "--traces",           (p.out / "traces").string()};
  for (const auto& s : scenarios) so.argv.push_back(s.file.string());
  Child child = Child::spawn(so);
  const double limit_s = kPythonBaseLimitS + kPythonPerScenarioLimitS * static_cast<double>(scenarios.size());
  const auto t0 = Clock::now();
  std::optional<int> status;
  finished = false;
  while (!(status = child.poll()) && !interrupted()) {
    if (std::chrono::duration<double>(Clock::now() - t0).count() > limit_s) {
      fmt::print(stderr, "\ntdc parity: the PyTorch side ran past {:.0f} s; stopped\n", limit_s);
      child.terminate();
      return false;
    }
    ::usleep(100 * 1000);
  }
  if (interrupted()) {
    child.terminate();
    return false;
  }
  finished = true;
  if (exit_code(*status) == 0) return true;
  fmt::print(stderr, "tdc parity: the PyTorch side failed for some scenarios ({})\n", describe_exit(*status));
  return false;
}

// PyTorch's side of every scenario. [Note: the oracle's own failures] The PyTorch side is the
// reference, not what is tested: a scenario whose PyTorch process failed (seen once in ~40 runs:
// glibc's "malloc(): unaligned tcache chunk detected" inside torch 2.13 on
// fsdp_ac_transformer_ws2) runs once more, alone, and says so; if it fails again its result is
// ERROR, never PASS.
void run_pytorch_side(const Paths& p, const std::vector<parity::Scenario>& scenarios) {
  bool finished = false;
  if (run_pytorch_process(p, scenarios, finished) || !finished) return;
  std::vector<parity::Scenario> again;
  for (const auto& s : scenarios)
    if (!fs::is_regular_file(trace_path(p, s.name, "pytorch"))) again.push_back(s);
  if (again.empty()) return;
  for (const auto& s : again) {
    fmt::print(stderr, "tdc parity: {}: the PyTorch side wrote no trace; running it once more\n", s.name);
    run_pytorch_process(p, {s}, finished);
    if (!finished) return;
  }
}

// tdc's side of one scenario; "" on success, else why not.
std::string run_tdc_side(const Paths& p, const parity::Scenario& s, int index, int total) {
  fmt::print(stderr, "[tdc {}/{}] {} ... ", index, total, s.name);
  const auto t0 = Clock::now();
  const fs::path inputs = p.out / "inputs" / (s.name + ".safetensors");
  if (!fs::is_regular_file(inputs)) {
    fmt::print(stderr, "skipped (no inputs: the PyTorch side failed)\n");
    return "the PyTorch side wrote no inputs (see its output above)";
  }
  const Captured c = capture({p.runner_tdc.string(), "--scenario", s.file.string(), "--inputs", inputs.string(),
                              "--trace", trace_path(p, s.name, "tdc").string()},
                             /*merge_stderr=*/true, kRunnerLimitS);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (c.timed_out || exit_code(c.status) != 0) {
    fmt::print(stderr, "FAILED ({:.1f} s)\n{}", secs, indent(c.output, "    "));
    return c.timed_out ? fmt::format("tdc side exceeded {} s", kRunnerLimitS)
                       : fmt::format("tdc side failed ({}): {}", describe_exit(c.status), c.output);
  }
  fmt::print(stderr, "done ({:.1f} s)\n", secs);
  return "";
}

// The fields every scenario's result has, whatever its verdict.
ojson result_head(const parity::Scenario& s) {
  return {{"name", s.name},
          {"description", s.description},
          {"world_size", s.world_size},
          {"recipe", parity::describe_recipe(s)},
          {"tolerance", {{"rtol", s.tolerance.rtol}, {"atol", s.tolerance.atol}, {"why", s.tolerance.why}}}};
}

ojson not_supported_result(const parity::Scenario& s, const std::string& why) {
  ojson r = result_head(s);
  r["verdict"] = "NOT_SUPPORTED";
  r["message"] = why;
  r["loss"] = {{"tdc", ojson::array()}, {"pytorch", ojson::array()}};
  r["grad_norm"] = {{"tdc", ojson::array()}, {"pytorch", ojson::array()}};
  r["max_rel_diff_per_step"] = ojson::array();
  r["max_param_rel_diff"] = nullptr;
  return r;
}

ojson scenario_result(const Paths& p, const parity::Scenario& s, const std::string& tdc_error) {
  ojson r = result_head(s);
  auto series = [](const parity::Trace* t, bool loss) {
    ojson a = ojson::array();
    if (t)
      for (const auto& st : t->steps) a.push_back(loss ? st.loss : st.grad_norm);
    return a;
  };
  std::optional<parity::Trace> tdc, pt;
  std::string error = tdc_error;
  if (error.empty()) {
    try {
      pt = parity::read_trace(trace_path(p, s.name, "pytorch"));
      tdc = parity::read_trace(trace_path(p, s.name, "tdc"));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  r["verdict"] = "ERROR";
  r["message"] = error;
  r["loss"] = {{"tdc", series(tdc ? &*tdc : nullptr, true)}, {"pytorch", series(pt ? &*pt : nullptr, true)}};
  r["grad_norm"] = {{"tdc", series(tdc ? &*tdc : nullptr, false)}, {"pytorch", series(pt ? &*pt : nullptr, false)}};
  r["max_rel_diff_per_step"] = ojson::array();
  r["max_param_rel_diff"] = nullptr;
  if (tdc && pt) {
    const parity::Comparison c = parity::compare_traces(*tdc, *pt, s.tolerance);
    r["verdict"] = c.pass ? "PASS" : "FAIL";
    r["message"] = c.message;
    r["max_rel_diff_per_step"] = c.max_rel_diff_per_step;
    r["max_param_rel_diff"] = c.max_param_rel_diff;
  }
  return r;
}

std::string pytorch_version(const ojson& results, const Paths& p) {
  for (const auto& r : results) {
    try {
      return parity::read_trace(trace_path(p, r["name"].get<std::string>(), "pytorch")).version;
    } catch (const std::exception&) {
    }
  }
  return "unknown";
}

void write_atomic(const fs::path& file, const std::string& text) {
  const fs::path tmp = file.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out) throw std::runtime_error(fmt::format("cannot write '{}'", tmp.string()));
  }
  fs::rename(tmp, file);
}

int print_table(const ojson& results, const fs::path& out_file) {
  size_t width = 26;  // the longest scenario name
  for (const auto& r : results) width = std::max(width, r["name"].get<std::string>().size());
  fmt::print("\n{:<{}} {:>2} {:<44} {:<13} {:>10} {:>10} {:>9}\n", "scenario", width, "ws", "recipe", "result",
             "steps rel", "param rel", "rtol");
  int passed = 0, not_supported = 0;
  for (const auto& r : results) {
    double step_max = 0;
    for (const auto& d : r["max_rel_diff_per_step"]) step_max = std::max(step_max, d.get<double>());
    const bool has = !r["max_param_rel_diff"].is_null();
    fmt::print("{:<{}} {:>2} {:<44} {:<13} {:>10} {:>10} {:>9.1e}\n", r["name"].get<std::string>(), width,
               r["world_size"].get<int>(), r["recipe"].get<std::string>(), r["verdict"].get<std::string>(),
               has ? fmt::format("{:.2e}", step_max) : "-",
               has ? fmt::format("{:.2e}", r["max_param_rel_diff"].get<double>()) : "-",
               r["tolerance"]["rtol"].get<double>());
    if (r["verdict"] == "PASS") {
      ++passed;
    } else if (r["verdict"] == "NOT_SUPPORTED") {
      ++not_supported;
      fmt::print("    {}\n", r["message"].get<std::string>().substr(0, 400));
    } else {
      fmt::print("    {}\n", r["message"].get<std::string>().substr(0, 400));
    }
  }
  fmt::print("\n{} of {} scenarios match PyTorch within tolerance{}; written to {}\n", passed, results.size(),
             not_supported ? fmt::format(" ({} NOT_SUPPORTED on this release)", not_supported) : "", out_file.string());
  return passed + not_supported == static_cast<int>(results.size()) ? kExitOk : kExitFailed;
}

}  // namespace

int parity_command(const std::vector<std::string>& args) {
  const ParsedArgs a = parse_args("parity", kParityOptions, args, false);
  if (a.help) {
    fmt::print("{}{}", kParityUsage, format_options(kParityOptions));
    return kExitOk;
  }
  const Paths p = resolve_paths(a);
  const std::vector<parity::Scenario> scenarios = select_scenarios(p.scenarios, a.get("filter"));
  fs::create_directories(p.out / "traces");
  fs::create_directories(p.out / "inputs");
  for (const auto& s : scenarios) {  // no stale trace may stand in for this run's
    for (const char* side : {"tdc", "pytorch"}) fs::remove(trace_path(p, s.name, side));
    fs::remove(p.out / "inputs" / (s.name + ".safetensors"));
  }
  const std::string created = harness::iso_now();
  const auto t0 = Clock::now();
  fmt::print(stderr, "tdc parity: {} scenarios from {} -> {}\n", scenarios.size(), p.scenarios.string(),
             p.out.string());
  // [Note: scenario requires a release]: what this LibTorch cannot run is reported, not run.
  std::vector<parity::Scenario> runnable;
  std::map<std::string, std::string> unsupported;  // name -> why
  for (const auto& s : scenarios) {
    if (auto why = parity::unmet_requirement(s, kLibTorchVersion)) {
      fmt::print(stderr, "[skip] {}: NOT_SUPPORTED: {}\n", s.name, *why);
      unsupported.emplace(s.name, *why);
    } else {
      runnable.push_back(s);
    }
  }
  if (!runnable.empty()) run_pytorch_side(p, runnable);
  if (interrupted()) return kExitInterrupted;
  ojson results = ojson::array();
  int index = 0;
  for (const auto& s : scenarios) {
    if (auto it = unsupported.find(s.name); it != unsupported.end()) {
      results.push_back(not_supported_result(s, it->second));
      continue;
    }
    const std::string error = run_tdc_side(p, s, ++index, static_cast<int>(runnable.size()));
    if (interrupted()) return kExitInterrupted;
    results.push_back(scenario_result(p, s, error));
  }
  const char* cap = std::getenv("ATEN_CPU_CAPABILITY");
  ojson out = {
      {"schema", "tdc-parity/1"},
      {"created", created},
      {"machine",
       {{"host", harness::hostname()},
        {"cpus", static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN))},
        {"aten_cpu_capability", cap ? cap : ""},
        {"tdc_version", TDC_VERSION},
        {"libtorch_version", kLibTorchVersion},
        {"pytorch_version", pytorch_version(results, p)},
        {"duration_s", std::chrono::duration<double>(Clock::now() - t0).count()}}},
      {"scenarios", results},
  };
  const fs::path out_file = p.out / "parity.json";
  write_atomic(out_file, out.dump(2) + "\n");
  return print_table(results, out_file);
}

}  // namespace tdc::cli
