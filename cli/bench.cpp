// `tdc bench harness` / `tdc bench ddp` / `tdc bench fsdp` / `tdc bench fsdp1` / `tdc bench
// checkpoint` / `tdc bench pipelining`: runs a benchmark binary (tdc_bench_harness, tdc_bench_ddp,
// tdc_bench_fsdp (fsdp1: the same with --fsdp1), tdc_bench_checkpoint, tdc_bench_pipelining:
// separate binaries so that their forks start from a clean process) and prints its numbers (the
// harness's against their targets). fsdp, fsdp1, checkpoint and pipelining also run the PyTorch
// side (bench/pytorch/<name>_pytorch.py, the venv's python; fsdp1: fsdp's with --fsdp1), merge
// both into one JSON and plot it (bench/pytorch/<name>_plot.py -> the JSON's name with .png).
// The helpers they share are declared in bench_support.h; pipelining's merge is bench_pipelining.cpp.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_support.h"
#include "cli.h"
#include "process.h"

namespace tdc::cli {

namespace fs = std::filesystem;
using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace bench {

const std::vector<OptionSpec> kBenchOptions = {
    {"out", "FILE", "where the benchmark writes its JSON (default results/bench-NAME.json)"},
    {"repeat", "N",
     "harness: timed launches per case and launcher (default 20; the smoke test "
     "uses 3); ddp, fsdp, fsdp1, pipelining: timed steps per case (default 10); checkpoint: "
     "timed save/load calls per case, the best counts (default 3)"},
    {"build-dir", "DIR", "build directory (default $TDC_BUILD)"},
    {"rounds", "N",
     "fsdp, fsdp1, checkpoint, pipelining: rounds of (tdc side, PyTorch side), order alternating; "
     "fsdp's, fsdp1's and pipelining's figures are medians over rounds (default 3), checkpoint's the best "
     "(default 2)"},
    {"python", "PY",
     "fsdp, fsdp1, checkpoint, pipelining: the oracle python, with torch and matplotlib (checkpoint: and "
     "safetensors) (default $TDC_PYTHON, else the build's python, else SOURCE/.venv/bin/python)"},
    {"mb", "MB", "checkpoint: MB (10^6 bytes) of float32 tensor data in the state dict (default 256)"},
    {"dir", "DIR",
     "checkpoint: where the checkpoints and dd's files go (temp dirs under DIR; default: the "
     "build directory)"},
};

constexpr const char* kBenchUsage =
    "usage: tdc bench harness [--out FILE] [--repeat N]\n"
    "       tdc bench ddp [--out FILE] [--repeat N]\n"
    "       tdc bench fsdp [--out FILE] [--repeat N] [--rounds R] [--python PY]\n"
    "       tdc bench fsdp1 [--out FILE] [--repeat N] [--rounds R] [--python PY]\n"
    "       tdc bench checkpoint [--out FILE] [--repeat N] [--rounds R] [--mb MB] [--dir DIR] [--python PY]\n"
    "       tdc bench pipelining [--out FILE] [--repeat N] [--rounds R] [--python PY]\n\n"
    "harness: times tdc::harness::launch() for 4-rank tests (cases 'empty' and 'all_reduce',\n"
    "launchers fork and thread): wall time per test including process/thread start, rendezvous,\n"
    "body and teardown. JSON: docs/results-schema.md, 'Harness benchmark'.\n"
    "ddp: DistributedDataParallel step time against single-process training on the same global\n"
    "batch (models MLPStack and Transformer, world sizes 2 and 4, fork launcher). JSON:\n"
    "docs/results-schema.md, 'DDP benchmark'.\n"
    "fsdp: step time of tdc's FSDP2 (fully_shard per block + root) against PyTorch 2.13's own\n"
    "fully_shard (run with the venv's python on the same models, batches, step and world size),\n"
    "tdc DDP and single-process training (MLPStack and Transformer, world sizes 2 and 4). Writes\n"
    "the JSON and a PNG plot next to it (same name, .png). JSON: docs/results-schema.md, 'FSDP\n"
    "benchmark'.\n"
    "fsdp1: the same for FSDP1: tdc's fsdp1::FullyShardedDataParallel against PyTorch 2.13's\n"
    "FullyShardedDataParallel (both around the model, ModuleWrapPolicy on the blocks, FULL_SHARD).\n"
    "checkpoint: save and load throughput (MB/s) of tdc::checkpoint against PyTorch 2.13's DCP\n"
    "HuggingFace writer/reader (dcp.save with HuggingFaceStorageWriter(save_distributed=True),\n"
    "dcp.load with HuggingFaceStorageReader) on the same FSDP-sharded float32 state dict (DTensors\n"
    "Shard(0), uneven rows) at world sizes 2 and 4, and the disk's sequential write and read\n"
    "bandwidth (dd) in the same directory; loads read files dropped from the page cache. Writes\n"
    "the JSON and a PNG plot next to it. JSON: docs/results-schema.md, 'Checkpoint benchmark'.\n"
    "pipelining: step time of tdc's pipeline schedules against PyTorch 2.13's torch.distributed.\n"
    "pipelining (same 8-layer MLP, batch, placement and step) for GPipe, 1F1B, Interleaved1F1B,\n"
    "LoopedBFS and InterleavedZeroBubble at pp 2 and 4 (plain stages, world = pp; multi-stage\n"
    "schedules 2 stages per rank), with each schedule's bubble fraction. Writes the JSON and a PNG\n"
    "plot next to it. JSON: docs/results-schema.md, 'Pipelining benchmark'.\n"
    "All show progress, write JSON and print a table.\n\n"
    "Options:\n";

double number_at(const json& j, const fs::path& file, const std::string& key) {
  if (!j.contains(key) || !j[key].is_number())
    throw std::runtime_error(
        fmt::format("benchmark output '{}': field '{}' is missing or not a "
                    "number",
                    file.string(), key));
  return j[key].get<double>();
}

// Runs `exe` with --out/--repeat (and `extra_args`) and returns its parsed JSON output (throws naming what
// failed).
std::optional<json> run_benchmark(const fs::path& build, const std::string& binary, const fs::path& out,
                                  std::optional<int> repeat, int* exit_status,
                                  const std::vector<std::string>& extra_args) {
  fs::path exe = build / binary;
  if (!fs::exists(exe))
    throw UsageError(fmt::format("benchmark binary '{}' does not exist: build it (ninja -C {} {})", exe.string(),
                                 build.string(), binary));
  SpawnOptions so;
  so.argv = {exe.string(), "--out", out.string()};
  if (repeat) so.argv.insert(so.argv.end(), {"--repeat", std::to_string(*repeat)});
  so.argv.insert(so.argv.end(), extra_args.begin(), extra_args.end());
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

// ------------------------------------------------------------------ fsdp: tdc + PyTorch, merged

// Runs a python script to completion (stderr/stdout inherited: its progress shows); returns the
// CLI exit status (kExitOk on success).
int run_python(const std::vector<std::string>& argv) {
  SpawnOptions so;
  so.argv = argv;
  Child child = Child::spawn(so);
  int status = child.wait();
  if (interrupted()) return kExitInterrupted;
  if (exit_code(status) != 0) {
    fmt::print(stderr, "tdc bench: '{} {}' failed: {}\n", argv[0], argv.size() > 1 ? argv[1] : "",
               describe_exit(status));
    return kExitFailed;
  }
  return kExitOk;
}

ojson read_json(const fs::path& file) {
  std::ifstream in(file);
  if (!in) throw std::runtime_error(fmt::format("benchmark output '{}' was not written", file.string()));
  try {
    return ojson::parse(in);
  } catch (const ojson::parse_error& e) {
    throw std::runtime_error(fmt::format("benchmark output '{}' is not valid JSON: {}", file.string(), e.what()));
  }
}

double number_in(const ojson& j, const fs::path& file, const std::string& where, const std::string& key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number())
    throw std::runtime_error(
        fmt::format("benchmark output '{}': field '{}.{}' is missing or not a number", file.string(), where, key));
  return j[key].get<double>();
}

// tdc's JSON (tdc_bench_fsdp) + PyTorch's (fsdp_pytorch.py) -> the merged result. Both name the
// FSDP they timed ("fsdp": "FSDP2" or "FSDP1"); they must agree.
ojson merge_fsdp(const ojson& t, const fs::path& tdc_file, const ojson& py, const fs::path& py_file) {
  const std::string version = t.value("fsdp", std::string("FSDP2"));
  if (py.value("fsdp", std::string("FSDP2")) != version)
    throw std::runtime_error(fmt::format("'{}' timed {}, '{}' timed {}: not the same benchmark", tdc_file.string(),
                                         version, py_file.string(), py.value("fsdp", std::string("FSDP2"))));
  ojson out = ojson::object();
  out["target"] = "tdc_fsdp_step_ms <= pytorch_fsdp_step_ms in every case (ratio <= 1)";
  ojson cases = ojson::object();
  bool met = true;
  double worst = 0;
  for (const auto& [model, worlds] : t.at("cases").items()) {
    for (const auto& [world, c] : worlds.items()) {
      const std::string where = fmt::format("cases.{}.{}", model, world);
      if (!py.contains("cases") || !py["cases"].contains(model) || !py["cases"][model].contains(world))
        throw std::runtime_error(fmt::format("PyTorch output '{}' has no case {}", py_file.string(), where));
      const ojson& p = py["cases"][model][world];
      double tdc_ms = number_in(c, tdc_file, where, "tdc_fsdp_step_ms");
      double py_ms = number_in(p, py_file, where, "fsdp_step_ms");
      if (p.value("local_batch", -1) != c.value("local_batch", -2))
        throw std::runtime_error(fmt::format("{}: tdc and PyTorch ran different per-rank batches", where));
      ojson m = c;
      m["pytorch_fsdp_step_ms"] = py_ms;
      m["pytorch_fsdp_p90_ms"] = p.value("fsdp_p90_ms", 0.0);
      double ratio = py_ms > 0 ? tdc_ms / py_ms : 0.0;
      m["ratio"] = ratio;
      if (c.contains("tdc_fsdp_nochecks_step_ms") && c["tdc_fsdp_nochecks_step_ms"].is_number() && py_ms > 0)
        m["ratio_nochecks"] = c["tdc_fsdp_nochecks_step_ms"].get<double>() / py_ms;
      met = met && ratio <= 1.0;
      worst = std::max(worst, ratio);
      cases[model][world] = m;
    }
  }
  out["target_met"] = met;
  out["worst_ratio"] = worst;
  out["cases"] = cases;
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

int print_fsdp(const ojson& j, const fs::path& out, const fs::path& png) {
  const std::string version = j.value("fsdp", std::string("FSDP2"));
  const bool v1 = version == "FSDP1";
  fmt::print(
      "\n{} benchmark: host {} ({} CPUs), LibTorch {} vs torch {}, {} timed steps per case "
      "(median of rank 0; median over {} round(s)), {} ATen thread(s) per rank\n",
      version, j.value("host", std::string("?")), j.value("cpus", 0), j.value("libtorch_version", std::string("?")),
      j.value("torch_version", std::string("?")), j.value("repeat", 0), j.value("rounds", 1),
      j.value("threads_per_rank", 0));
  fmt::print("{:<12} {:>5} {:>10} {:>10} {:>13} {:>13} {:>7}   {:>17} {:>7}\n", "model", "world", "single_ms", "ddp_ms",
             "tdc_fsdp_ms", "torch_fsdp_ms", "ratio", "tdc_nochecks_ms", "ratio");
  for (const auto& [model, worlds] : j["cases"].items()) {
    for (const auto& [world, c] : worlds.items()) {
      double r = c.value("ratio", 0.0);
      fmt::print("{:<12} {:>5} {:>10.2f} {:>10.2f} {:>13.2f} {:>13.2f} {:>7.2f}{} {:>17.2f} {:>7.2f}\n", model, world,
                 c.value("single_step_ms", 0.0), c.value("ddp_step_ms", 0.0), c.value("tdc_fsdp_step_ms", 0.0),
                 c.value("pytorch_fsdp_step_ms", 0.0), r, r <= 1.0 ? "  " : " >",
                 c.value("tdc_fsdp_nochecks_step_ms", 0.0), c.value("ratio_nochecks", 0.0));
    }
  }
  const int cpus = j.value("cpus", 0);
  fmt::print(
      "\nratio = tdc {0} step / PyTorch {1} step (same model, batch, step, world size);\n"
      "tdc_nochecks: tdc {0} with its cross-rank collective argument checks off (TDC_COMM_CHECKS=0)\n"
      "target: ratio <= 1 in every case: {2} (worst {3:.2f})\n",
      version, v1 ? "FullyShardedDataParallel" : "fully_shard", j.value("target_met", false) ? "met" : "NOT met",
      j.value("worst_ratio", 0.0));
  if (cpus > 0 && cpus < 4) fmt::print("note: {} CPUs here, so world size 4 oversubscribes the cores\n", cpus);
  fmt::print("written to {}\n           {}\n", out.string(), png.string());
  return kExitOk;
}

constexpr int kFsdpWarmup = 3;  // tdc_bench_fsdp's kWarmup; the PyTorch runner gets the same

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t k = v.size();
  return k == 0 ? 0.0 : k % 2 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2;
}

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
  bool met = true;
  double worst = 0;
  for (auto& [model, worlds] : out["cases"].items()) {
    for (auto& [world, c] : worlds.items()) {
      for (const char* key : case_keys) {
        auto v = med("cases", model, world, key);
        if (!v.empty()) c[key] = median_of(v);
      }
      ojson per_round = ojson::array();
      for (const auto& r : rounds) per_round.push_back(r["cases"][model][world].value("ratio", 0.0));
      const double py_ms = c.value("pytorch_fsdp_step_ms", 0.0);
      const double ratio = py_ms > 0 ? c.value("tdc_fsdp_step_ms", 0.0) / py_ms : 0.0;
      c["ratio"] = ratio;
      if (c.contains("ratio_nochecks") && py_ms > 0)
        c["ratio_nochecks"] = c.value("tdc_fsdp_nochecks_step_ms", 0.0) / py_ms;
      c["ratio_per_round"] = per_round;
      met = met && ratio <= 1.0;
      worst = std::max(worst, ratio);
    }
  }
  for (auto& [model, m] : out["models"].items()) {
    for (const char* key : model_keys) {
      auto v = med("models", model, "", key);
      if (!v.empty()) m[key] = median_of(v);
    }
  }
  out["target_met"] = met;
  out["worst_ratio"] = worst;
  double total = 0;
  for (const auto& r : rounds) total += r.value("duration_s", 0.0) + r["pytorch"].value("duration_s", 0.0);
  out["rounds"] = rounds.size();
  out["total_duration_s"] = total;
  return out;
}

PythonSide python_side(const ParsedArgs& a, const fs::path& build, const std::string& name,
                       const std::string& program) {
  fs::path source = resolve_source_dir(build);
  fs::path python = resolve_oracle_python(a.get("python"), build, source);
  if (python.empty() || ::access(python.c_str(), X_OK) != 0)
    throw UsageError(
        fmt::format("bench {}: no python for the PyTorch side{}: run ./tdc setup (it creates .venv with torch "
                    "2.13 and matplotlib) or pass --python PY",
                    name, python.empty() ? "" : fmt::format(" ('{}' is not an executable)", python.string())));
  if (source.empty())
    throw UsageError(fmt::format("bench {}: cannot find the source directory (bench/pytorch/): set TDC_ROOT", name));
  const std::string base = program.empty() ? name : program;
  PythonSide side{python, source / "bench" / "pytorch" / (base + "_pytorch.py"),
                  source / "bench" / "pytorch" / (base + "_plot.py")};
  for (const fs::path& f : {side.runner, side.plotter})
    if (!fs::is_regular_file(f))
      throw UsageError(
          fmt::format("bench {}: '{}' does not exist (TDC_ROOT / --build-dir point at "
                      "the wrong tree?)",
                      name, f.string()));
  return side;
}

// The merged JSON, atomically (temp name, then rename).
void write_merged(const fs::path& out, const ojson& merged) {
  const fs::path tmp = out.string() + ".tmp";
  std::ofstream o(tmp, std::ios::trunc);
  o << merged.dump(2) << "\n";
  o.close();
  if (!o) throw std::runtime_error(fmt::format("cannot write '{}'", tmp.string()));
  fs::rename(tmp, out);
}

int run_rounds(const Rounds& spec, const fs::path& build, const PythonSide& py, const fs::path& out) {
  fs::create_directories(out.parent_path());
  const fs::path tdc_file = out.string() + ".tdc.tmp";
  const fs::path py_file = out.string() + ".pytorch.tmp";
  fs::path png = out;
  png.replace_extension(".png");
  Cleanup cleanup{{tdc_file, py_file}};
  const std::string binary = "tdc_bench_" + (spec.program.empty() ? spec.name : spec.program);
  int status = kExitOk;
  std::vector<ojson> rounds;
  for (int r = 1; r <= spec.rounds; ++r) {
    std::optional<ojson> t, p;
    auto tdc_side = [&] {
      fmt::print(stderr, "tdc bench {}: round {}/{}, tdc side ({})\n", spec.name, r, spec.rounds,
                 (build / binary).string());
      if (!run_benchmark(build, binary, tdc_file, spec.repeat, &status, spec.tdc_args)) return false;
      t = read_json(tdc_file);
      return true;
    };
    auto py_side = [&] {
      fmt::print(stderr, "tdc bench {}: round {}/{}, PyTorch side ({} {})\n", spec.name, r, spec.rounds,
                 py.python.string(), py.runner.string());
      std::vector<std::string> argv{py.python.string(), py.runner.string(), "--out",
                                    py_file.string(),   "--repeat",         std::to_string(spec.repeat)};
      argv.insert(argv.end(), spec.python_args.begin(), spec.python_args.end());
      status = run_python(argv);
      if (status != kExitOk) return false;
      p = read_json(py_file);
      return true;
    };
    const bool ok = r % 2 ? (tdc_side() && py_side()) : (py_side() && tdc_side());
    if (!ok) return status;
    rounds.push_back(spec.merge(*t, tdc_file, *p, py_file));
  }
  const ojson merged = spec.combine(rounds);
  write_merged(out, merged);
  status = run_python({py.python.string(), py.plotter.string(), "--json", out.string(), "--png", png.string()});
  if (status != kExitOk) {
    fmt::print(stderr, "tdc bench {}: the JSON is written ({}), the plot is not\n", spec.name, out.string());
    return status;
  }
  return spec.print(merged, out, png);
}

void add_run_info(ojson& out, const ojson& t, const ojson& py, const std::vector<std::string>& tdc_skip,
                  const std::vector<std::string>& pytorch_skip) {
  auto skipped = [](const std::vector<std::string>& skip, const std::string& key) {
    return std::find(skip.begin(), skip.end(), key) != skip.end();
  };
  for (const auto& [key, v] : t.items())
    if (!skipped(tdc_skip, key)) out[key] = v;
  ojson pyinfo = ojson::object();
  for (const auto& [key, v] : py.items())
    if (!skipped(pytorch_skip, key)) pyinfo[key] = v;
  out["pytorch"] = pyinfo;
  out["torch_version"] = py.value("torch_version", std::string("?"));
}

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
              throw std::runtime_error(fmt::format("tdc_bench_fsdp ran {} warm-up steps, the CLI expects {}",
                                                   t.value("warmup", -1), kFsdpWarmup));
            return merge_fsdp(t, tf, p, pf);
          },
      .combine = combine_rounds,
      .print = print_fsdp};
  return run_rounds(spec, build, py, out);
}

// ------------------------------------------------------------ checkpoint: tdc + PyTorch + dd, merged

// Throughputs (MB/s) of one world size, and the ratios between them: "X_vs_Y" = X's MB/s / Y's
// (higher is better for X). Targets: tdc >= PyTorch (save_vs_pytorch, load_vs_pytorch >= 1) and
// within 2x of dd (save_vs_dd, load_vs_dd >= 0.5); loads are the cold ones (files dropped from the
// page cache, as dd's read).
constexpr const char* kCkptThroughputs[] = {"tdc_save_mb_s",     "tdc_load_mb_s",     "tdc_load_warm_mb_s",
                                            "pytorch_save_mb_s", "pytorch_load_mb_s", "pytorch_load_warm_mb_s",
                                            "dd_write_mb_s",     "dd_read_mb_s"};
struct CkptRatio {
  const char* name;
  const char* num;
  const char* den;
  double target;  // 0: reported, no target
};
constexpr CkptRatio kCkptRatios[] = {
    {"save_vs_pytorch", "tdc_save_mb_s", "pytorch_save_mb_s", 1.0},
    {"load_vs_pytorch", "tdc_load_mb_s", "pytorch_load_mb_s", 1.0},
    {"save_vs_dd", "tdc_save_mb_s", "dd_write_mb_s", 0.5},
    {"load_vs_dd", "tdc_load_mb_s", "dd_read_mb_s", 0.5},
    {"load_warm_vs_pytorch", "tdc_load_warm_mb_s", "pytorch_load_warm_mb_s", 0.0},
    {"pytorch_save_vs_dd", "pytorch_save_mb_s", "dd_write_mb_s", 0.0},
    {"pytorch_load_vs_dd", "pytorch_load_mb_s", "dd_read_mb_s", 0.0},
};

// Sets the ratios of a case from its throughputs and the target verdicts over all cases.
void checkpoint_verdicts(ojson& j) {
  bool vs_pytorch = true, vs_dd = true;
  double worst_pytorch = 0, worst_dd = 0;
  bool first = true;
  for (auto& [world, c] : j["cases"].items()) {
    for (const CkptRatio& r : kCkptRatios) {
      const double den = c.value(r.den, 0.0);
      c[r.name] = den > 0 ? c.value(r.num, 0.0) / den : 0.0;
    }
    const double p = std::min(c["save_vs_pytorch"].get<double>(), c["load_vs_pytorch"].get<double>());
    const double d = std::min(c["save_vs_dd"].get<double>(), c["load_vs_dd"].get<double>());
    worst_pytorch = first ? p : std::min(worst_pytorch, p);
    worst_dd = first ? d : std::min(worst_dd, d);
    first = false;
    vs_pytorch = vs_pytorch && p >= 1.0;
    vs_dd = vs_dd && d >= 0.5;
  }
  j["target"] =
      "in every case: tdc's save and (cold) load MB/s >= PyTorch's (save_vs_pytorch, load_vs_pytorch >= 1), and "
      ">= half of dd's sequential write / read (save_vs_dd, load_vs_dd >= 0.5)";
  j["target_met"] = vs_pytorch && vs_dd;
  j["target_vs_pytorch_met"] = vs_pytorch;
  j["target_vs_dd_met"] = vs_dd;
  j["worst_vs_pytorch"] = worst_pytorch;
  j["worst_vs_dd"] = worst_dd;
}

// tdc's JSON (tdc_bench_checkpoint, with dd) + PyTorch's (checkpoint_pytorch.py) -> one round.
ojson merge_checkpoint(const ojson& t, const fs::path& tdc_file, const ojson& py, const fs::path& py_file) {
  const ojson& tsd = t.at("state_dict");
  if (!py.contains("state_dict") || py["state_dict"].value("tensors", ojson()) != tsd.at("tensors") ||
      py["state_dict"].value("total_bytes", -1) != tsd.value("total_bytes", -2))
    throw std::runtime_error(fmt::format("'{}' and '{}' describe different state dicts: not the same benchmark",
                                         tdc_file.string(), py_file.string()));
  const ojson& dd = t.at("dd");
  ojson cases = ojson::object();
  for (const auto& [world, c] : t.at("cases").items()) {
    const std::string where = fmt::format("cases.{}", world);
    if (!py.contains("cases") || !py["cases"].contains(world))
      throw std::runtime_error(fmt::format("PyTorch output '{}' has no case {}", py_file.string(), where));
    const ojson& p = py["cases"][world];
    ojson m = ojson::object();
    for (const char* k : {"save", "load", "load_warm"}) {
      m[fmt::format("tdc_{}_mb_s", k)] = number_in(c, tdc_file, where, fmt::format("{}_mb_s", k));
      m[fmt::format("pytorch_{}_mb_s", k)] = number_in(p, py_file, where, fmt::format("{}_mb_s", k));
    }
    m["dd_write_mb_s"] = number_in(dd, tdc_file, "dd", "write_mb_s");
    m["dd_read_mb_s"] = number_in(dd, tdc_file, "dd", "read_mb_s");
    m["tdc_files"] = c.value("files", 0);
    m["pytorch_files"] = p.value("files", 0);
    m["tdc_checkpoint_bytes"] = c.value("checkpoint_bytes", 0);
    m["pytorch_checkpoint_bytes"] = p.value("checkpoint_bytes", 0);
    m["resident_before_cold_load"] =
        std::max(c.value("resident_before_cold_load", 0.0), p.value("resident_before_cold_load", 0.0));
    ojson ts = ojson::object(), ps = ojson::object();
    for (const char* k : {"save_s_all", "load_s_all", "load_warm_s_all"}) {
      ts[k] = c.value(k, ojson::array());
      ps[k] = p.value(k, ojson::array());
    }
    m["tdc_seconds"] = ts;
    m["pytorch_seconds"] = ps;
    cases[world] = m;
  }
  ojson out = ojson::object();
  out["cases"] = cases;
  checkpoint_verdicts(out);
  add_run_info(out, t, py, {"cases"}, {"cases", "state_dict"});
  return out;
}

// Several rounds -> one: every throughput is the best over rounds (as each round's is the best over
// repeats), the ratios are taken between those; each case keeps its rounds under "per_round" and
// dd its rounds under "dd.per_round".
ojson combine_checkpoint_rounds(const std::vector<ojson>& rounds) {
  ojson out = rounds.front();
  for (auto& [world, c] : out["cases"].items()) {
    ojson per_round = ojson::array();
    for (const auto& r : rounds) {
      const ojson& rc = r["cases"][world];
      per_round.push_back(rc);
      for (const char* k : kCkptThroughputs) c[k] = std::max(c.value(k, 0.0), rc.value(k, 0.0));
      c["resident_before_cold_load"] =
          std::max(c.value("resident_before_cold_load", 0.0), rc.value("resident_before_cold_load", 0.0));
    }
    c.erase("tdc_seconds");
    c.erase("pytorch_seconds");
    c["per_round"] = per_round;
  }
  checkpoint_verdicts(out);
  ojson dd_rounds = ojson::array();
  for (const auto& r : rounds) {
    dd_rounds.push_back(r["dd"]);
    for (const char* k : {"write_mb_s", "read_mb_s"})
      out["dd"][k] = std::max(out["dd"].value(k, 0.0), r["dd"].value(k, 0.0));
  }
  out["dd"]["per_round"] = dd_rounds;
  for (const char* k : {"write_s", "read_s", "write_s_all", "read_s_all", "write_wall_s_all", "read_wall_s_all"})
    out["dd"].erase(k);
  ojson loads = ojson::array();
  double total = 0;
  for (const auto& r : rounds) {
    loads.push_back(r.value("load_average", ojson()));
    loads.push_back(r["pytorch"].value("load_average", ojson()));
    total += r.value("duration_s", 0.0) + r["pytorch"].value("duration_s", 0.0);
  }
  out["load_average"] = loads;
  out["rounds"] = rounds.size();
  out["total_duration_s"] = total;
  return out;
}

int print_checkpoint(const ojson& j, const fs::path& out, const fs::path& png) {
  const ojson& sd = j["state_dict"];
  const ojson& disk = j["disk"];
  fmt::print(
      "\nCheckpoint benchmark: host {} ({} CPUs), LibTorch {} vs torch {}; {:.1f} MB of float32 in {} tensors "
      "(DTensor Shard(0)); best of {} call(s) x {} round(s); directory {} ({} on {})\n",
      j.value("host", std::string("?")), j.value("cpus", 0), j.value("libtorch_version", std::string("?")),
      j.value("torch_version", std::string("?")), sd.value("total_bytes", 0) / 1e6, sd["tensors"].size(),
      j.value("repeat", 0), j.value("rounds", 1), disk.value("dir", std::string("?")),
      disk.value("fstype", std::string("?")), disk.value("device", std::string("?")));
  fmt::print("{:>5}  {:<11} {:>10} {:>12} {:>9} {:>11} {:>8} {:>10}\n", "world", "", "tdc MB/s", "PyTorch MB/s",
             "dd MB/s", "tdc/PyTorch", "tdc/dd", "PyTorch/dd");
  for (const auto& [world, c] : j["cases"].items()) {
    auto mark = [](double r, double target) { return r >= target ? " " : "<"; };
    const double sp = c.value("save_vs_pytorch", 0.0), sdd = c.value("save_vs_dd", 0.0);
    const double lp = c.value("load_vs_pytorch", 0.0), ldd = c.value("load_vs_dd", 0.0);
    fmt::print("{:>5}  {:<11} {:>10.0f} {:>12.0f} {:>9.0f} {:>10.2f}{} {:>7.2f}{} {:>10.2f}\n", world, "save",
               c.value("tdc_save_mb_s", 0.0), c.value("pytorch_save_mb_s", 0.0), c.value("dd_write_mb_s", 0.0), sp,
               mark(sp, 1.0), sdd, mark(sdd, 0.5), c.value("pytorch_save_vs_dd", 0.0));
    fmt::print("{:>5}  {:<11} {:>10.0f} {:>12.0f} {:>9.0f} {:>10.2f}{} {:>7.2f}{} {:>10.2f}\n", world, "load (cold)",
               c.value("tdc_load_mb_s", 0.0), c.value("pytorch_load_mb_s", 0.0), c.value("dd_read_mb_s", 0.0), lp,
               mark(lp, 1.0), ldd, mark(ldd, 0.5), c.value("pytorch_load_vs_dd", 0.0));
    fmt::print("{:>5}  {:<11} {:>10.0f} {:>12.0f} {:>9} {:>10.2f}\n", world, "load (warm)",
               c.value("tdc_load_warm_mb_s", 0.0), c.value("pytorch_load_warm_mb_s", 0.0), "-",
               c.value("load_warm_vs_pytorch", 0.0));
  }
  const ojson& dd = j["dd"];
  fmt::print(
      "\nMB = 10^6 bytes of tensor data; each figure is the best call (slowest rank's time) over repeats and rounds.\n"
      "load (cold): the checkpoint's files dropped from the page cache first (posix_fadvise DONTNEED; at most "
      "{:.0f}% of their pages stayed resident); dd read likewise ({:.0f}%).\n"
      "dd: write = {}, read = {}.\n"
      "target: tdc/PyTorch >= 1: {} (worst {:.2f}); tdc/dd >= 0.5: {} (worst {:.2f}); '<' marks a miss\n",
      100 * j["cases"].begin()->value("resident_before_cold_load", 0.0), 100 * dd.value("resident_before_read", 0.0),
      dd.value("write_command", std::string("?")), dd.value("read_command", std::string("?")),
      j.value("target_vs_pytorch_met", false) ? "met" : "NOT met", j.value("worst_vs_pytorch", 0.0),
      j.value("target_vs_dd_met", false) ? "met" : "NOT met", j.value("worst_vs_dd", 0.0));
  const int cpus = j.value("cpus", 0);
  if (cpus > 0 && cpus < 4) fmt::print("note: {} CPUs here, so world size 4 oversubscribes the cores\n", cpus);
  fmt::print("written to {}\n           {}\n", out.string(), png.string());
  return kExitOk;
}

int bench_checkpoint(const ParsedArgs& a, const fs::path& build, const fs::path& out, std::optional<int> repeat) {
  const PythonSide py = python_side(a, build, "checkpoint");
  const int mb = a.get("mb") ? parse_positive_int("bench", "mb", *a.get("mb")) : 256;
  // One directory for dd, tdc and PyTorch: the disk under test (default: the build directory's).
  const fs::path dir = fs::absolute(a.get("dir").value_or(build.string()));
  if (!fs::is_directory(dir))
    throw UsageError(fmt::format("bench checkpoint: --dir '{}' is not a directory", dir.string()));
  const std::vector<std::string> args{"--mb", std::to_string(mb), "--dir", dir.string()};
  const Rounds spec{.name = "checkpoint",
                    .repeat = repeat.value_or(3),
                    .rounds = a.get("rounds") ? parse_positive_int("bench", "rounds", *a.get("rounds")) : 2,
                    .tdc_args = args,
                    .python_args = args,
                    .merge = merge_checkpoint,
                    .combine = combine_checkpoint_rounds,
                    .print = print_checkpoint};
  return run_rounds(spec, build, py, out);
}

}  // namespace bench

int bench_command(const std::vector<std::string>& args) {
  using namespace bench;
  ParsedArgs a = parse_args("bench", kBenchOptions, args, true);
  if (a.help || a.positional.empty()) {
    fmt::print("{}{}", kBenchUsage, format_options(kBenchOptions));
    return a.help ? kExitOk : kExitUsage;
  }
  const std::string name = a.positional.size() == 1 ? a.positional[0] : "";
  if (name != "harness" && name != "ddp" && name != "fsdp" && name != "fsdp1" && name != "checkpoint" &&
      name != "pipelining")
    throw UsageError(
        fmt::format("bench: unknown benchmark '{}' (available: harness, ddp, fsdp, fsdp1, checkpoint, pipelining)",
                    fmt::join(a.positional, " ")));
  fs::path build = resolve_build_dir(a.get("build-dir"));
  fs::path out = fs::absolute(a.get("out").value_or(fmt::format("results/bench-{}.json", name)));
  std::optional<int> repeat;
  if (auto v = a.get("repeat")) repeat = parse_positive_int("bench", "repeat", *v);
  if (name == "harness" && !repeat) repeat = 20;

  if (name != "fsdp" && name != "fsdp1" && name != "checkpoint" && name != "pipelining" &&
      (a.get("python") || a.get("rounds")))
    throw UsageError(
        "bench: --python and --rounds are options of 'tdc bench fsdp', 'fsdp1', 'checkpoint' and 'pipelining' only");
  if (name != "checkpoint" && (a.get("mb") || a.get("dir")))
    throw UsageError("bench: --mb and --dir are options of 'tdc bench checkpoint' only");
  if (name == "fsdp" || name == "fsdp1") return bench_fsdp(a, build, out, repeat, name == "fsdp1");
  if (name == "checkpoint") return bench_checkpoint(a, build, out, repeat);
  if (name == "pipelining") return bench_pipelining(a, build, out, repeat);

  int status = kExitOk;
  std::optional<json> j = run_benchmark(build, "tdc_bench_" + name, out, repeat, &status);
  if (!j) return status;
  return name == "harness" ? print_harness(*j, out) : print_ddp(*j, out);
}

}  // namespace tdc::cli
