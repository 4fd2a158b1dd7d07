// What `tdc bench`'s benchmarks share (bench/support.h): running a benchmark binary and the PyTorch
// side's python, reading and writing their JSON, medians, rounds.
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/support.h"
#include "cli.h"
#include "process.h"

namespace tdc::cli::bench {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

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
std::optional<json> run_benchmark(const fs::path& build, const std::string& benchmark, const fs::path& out,
                                  std::optional<int> repeat, int* exit_status,
                                  const std::vector<std::string>& extra_args) {
  fs::path exe = build / kBenchBinary;
  if (!fs::exists(exe))
    throw UsageError(fmt::format("benchmark binary '{}' does not exist: build it (ninja -C {} {})", exe.string(),
                                 build.string(), kBenchBinary));
  SpawnOptions so;
  so.argv = {exe.string(), benchmark, "--out", out.string()};
  if (repeat) so.argv.insert(so.argv.end(), {"--repeat", std::to_string(*repeat)});
  so.argv.insert(so.argv.end(), extra_args.begin(), extra_args.end());
  Child child = Child::spawn(so);
  int status = child.wait();
  if (interrupted()) {
    *exit_status = kExitInterrupted;
    return std::nullopt;
  }
  if (exit_code(status) != 0) {
    fmt::print(stderr, "tdc bench: {} {} failed: {}\n", exe.string(), benchmark, describe_exit(status));
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

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t k = v.size();
  return k == 0 ? 0.0 : k % 2 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2;
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

std::optional<std::string> worlds_option(const ParsedArgs& a) {
  std::optional<std::string> v = a.get("worlds");
  if (v && *v != "2" && *v != "4" && *v != "2,4")
    throw UsageError(fmt::format("bench: --worlds must be 2, 4 or 2,4, got '{}'", *v));
  return v;
}

void add_worlds(const ParsedArgs& a, std::vector<std::string>& tdc_args, std::vector<std::string>& python_args,
                const std::string& python_flag) {
  if (std::optional<std::string> w = worlds_option(a)) {
    tdc_args.insert(tdc_args.end(), {"--worlds", *w});
    python_args.insert(python_args.end(), {python_flag, *w});
  }
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
  const std::string benchmark = spec.program.empty() ? spec.name : spec.program;
  int status = kExitOk;
  std::vector<ojson> rounds;
  for (int r = 1; r <= spec.rounds; ++r) {
    std::optional<ojson> t, p;
    auto tdc_side = [&] {
      fmt::print(stderr, "tdc bench {}: round {}/{}, tdc side ({} {})\n", spec.name, r, spec.rounds,
                 (build / kBenchBinary).string(), benchmark);
      if (!run_benchmark(build, benchmark, tdc_file, spec.repeat, &status, spec.tdc_args)) return false;
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

}  // namespace tdc::cli::bench
