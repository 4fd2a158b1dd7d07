// What `tdc bench`'s benchmarks share (support.cpp): running a benchmark binary and the PyTorch
// side's python, reading and writing their JSON, medians, rounds; and the drivers, one per file of
// this folder, that bench_command.cpp picks from.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.h"

namespace tdc::cli::bench {

// j[key] of a benchmark's JSON as a number; throws naming the file and the key.
double number_at(const nlohmann::json& j, const std::filesystem::path& file, const std::string& key);

// The tdc side of every benchmark: `tdc_bench NAME` ([Note: one benchmark binary], bench/cpp/main.cpp).
inline constexpr const char* kBenchBinary = "tdc_bench";
// Runs `build/tdc_bench benchmark` with --out/--repeat (and `extra_args`) and returns its parsed JSON
// output; nullopt with *exit_status set when it failed or was interrupted (throws naming what is
// missing).
std::optional<nlohmann::json> run_benchmark(const std::filesystem::path& build, const std::string& benchmark,
                                            const std::filesystem::path& out, std::optional<int> repeat,
                                            int* exit_status, const std::vector<std::string>& extra_args = {});

// Runs a python script to completion (its progress shows); returns the CLI exit status.
int run_python(const std::vector<std::string>& argv);

// A benchmark's JSON output, keys in file order (throws naming the file when missing or invalid).
nlohmann::ordered_json read_json(const std::filesystem::path& file);

// j[key] as a number; throws naming the file and `where`.key when missing or not a number.
double number_in(const nlohmann::ordered_json& j, const std::filesystem::path& file, const std::string& where,
                 const std::string& key);

double median_of(std::vector<double> v);

// --worlds of ddp, fsdp, fsdp1, checkpoint and pipelining: the world (pp) sizes to run, "2", "4" or
// "2,4" (the sizes their models and batches are laid out for); nullopt when not given. Throws
// UsageError naming the value otherwise. The tdc binary takes it as --worlds, the PyTorch runner
// as --world-sizes (pipelining: --pp-sizes).
std::optional<std::string> worlds_option(const ParsedArgs& a);
// Appends --worlds to both sides' arguments when it was given (`python_flag`: the runner's name
// for it).
void add_worlds(const ParsedArgs& a, std::vector<std::string>& tdc_args, std::vector<std::string>& python_args,
                const std::string& python_flag = "--world-sizes");

// What a benchmark with a PyTorch side needs, checked before the (long) tdc run: the venv's python
// (resolve_oracle_python: --python, else $TDC_PYTHON, else the build's) and the two scripts
// bench/pytorch/<name>_pytorch.py and <name>_plot.py. Throws UsageError naming what is missing.
struct PythonSide {
  std::filesystem::path python, runner, plotter;
};
// `program`: the scripts' base name when it is not `name` (fsdp1 runs fsdp's scripts with --fsdp1).
PythonSide python_side(const ParsedArgs& a, const std::filesystem::path& build, const std::string& name,
                       const std::string& program = "");

// The merged JSON, atomically (temp name, then rename).
void write_merged(const std::filesystem::path& out, const nlohmann::ordered_json& merged);

// Removes the per-side temp files of a merged benchmark, whatever happens.
struct Cleanup {
  std::vector<std::filesystem::path> files;
  ~Cleanup() {
    std::error_code ec;
    for (const auto& f : files) std::filesystem::remove(f, ec);
  }
};

// A benchmark with a PyTorch side, start to end: `rounds` rounds, each running
// `build/tdc_bench <name>` and the PyTorch runner (odd rounds tdc first, even rounds PyTorch first,
// so that a change in the host's load does not always hit the same side) and merging their
// outputs; then the rounds combined into OUT (atomically), the plot OUT with .png, and the
// printed summary. The per-side temp files OUT.tdc.tmp / OUT.pytorch.tmp are removed whatever
// happens. Returns the CLI exit status.
using MergeSides = std::function<nlohmann::ordered_json(
    const nlohmann::ordered_json& tdc, const std::filesystem::path& tdc_file, const nlohmann::ordered_json& pytorch,
    const std::filesystem::path& pytorch_file)>;
struct Rounds {
  std::string name;                      // "fsdp": messages, and the benchmark `tdc_bench <name>`
  std::string program;                   // tdc_bench's benchmark when it is not `name` ("fsdp" for fsdp1)
  int repeat = 10, rounds = 3;           // timed steps per case; rounds
  std::vector<std::string> tdc_args;     // extra arguments of the tdc binary
  std::vector<std::string> python_args;  // extra arguments of the PyTorch runner
  MergeSides merge;                      // one round's two outputs -> one
  std::function<nlohmann::ordered_json(const std::vector<nlohmann::ordered_json>&)> combine;  // rounds -> one
  std::function<int(const nlohmann::ordered_json&, const std::filesystem::path& out, const std::filesystem::path& png)>
      print;
};
int run_rounds(const Rounds& spec, const std::filesystem::path& build, const PythonSide& py,
               const std::filesystem::path& out);

// The end of every merge: the tdc side's keys other than `tdc_skip`, the PyTorch side's other
// than `pytorch_skip` under "pytorch", and PyTorch's torch_version.
void add_run_info(nlohmann::ordered_json& out, const nlohmann::ordered_json& tdc, const nlohmann::ordered_json& pytorch,
                  const std::vector<std::string>& tdc_skip, const std::vector<std::string>& pytorch_skip);

// The drivers: `tdc bench NAME` (NAME.cpp). Each returns the CLI exit status.
int bench_harness(const ParsedArgs& a, const std::filesystem::path& build, const std::filesystem::path& out,
                  std::optional<int> repeat);
int bench_ddp(const ParsedArgs& a, const std::filesystem::path& build, const std::filesystem::path& out,
              std::optional<int> repeat);
// fsdp1: FSDP1 on both sides (the same binary and scripts with --fsdp1).
int bench_fsdp(const ParsedArgs& a, const std::filesystem::path& build, const std::filesystem::path& out,
               std::optional<int> repeat, bool fsdp1);
int bench_checkpoint(const ParsedArgs& a, const std::filesystem::path& build, const std::filesystem::path& out,
                     std::optional<int> repeat);
int bench_pipelining(const ParsedArgs& a, const std::filesystem::path& build, const std::filesystem::path& out,
                     std::optional<int> repeat);
int bench_kernel(const ParsedArgs& a, const std::filesystem::path& build, const std::filesystem::path& out,
                 std::optional<int> repeat);

}  // namespace tdc::cli::bench
