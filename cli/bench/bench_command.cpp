// `tdc bench harness` / `tdc bench ddp` / `tdc bench fsdp` / `tdc bench fsdp1` / `tdc bench
// checkpoint` / `tdc bench pipelining` / `tdc bench kernel`: runs the tdc side, `tdc_bench NAME` (fsdp1: `tdc_bench fsdp
// --fsdp1`; one process per run, so that its forks start from a clean process; [Note: one benchmark
// binary]) and prints its numbers (the harness's against their targets). fsdp, fsdp1, checkpoint
// and pipelining also run the PyTorch side (bench/pytorch/<name>_pytorch.py, the venv's python;
// fsdp1: fsdp's with --fsdp1), merge both into one JSON and plot it (bench/pytorch/<name>_plot.py
// -> the JSON's name with .png). One driver per benchmark in this folder (harness.cpp, ddp.cpp,
// fsdp.cpp, checkpoint.cpp, pipelining.cpp, kernel.cpp), the helpers they share in support.{h,cpp}; this file
// picks the driver.
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "bench/support.h"
#include "cli.h"

namespace tdc::cli {

namespace fs = std::filesystem;

namespace {

const std::vector<OptionSpec> kBenchOptions = {
    {"out", "FILE", "where the benchmark writes its JSON (default results/bench-NAME.json)"},
    {"repeat", "N",
     "harness: timed launches per case and launcher (default 20; the smoke test "
     "uses 3); ddp, fsdp, fsdp1, pipelining: timed steps per case (default 10); checkpoint: "
     "timed save/load calls per case, the best counts (default 3); kernel: rounds of every measurement (default 5)"},
    {"worlds", "LIST",
     "ddp, fsdp, fsdp1, checkpoint: the world sizes; pipelining: the pp sizes; 2, 4 or 2,4 (default 2,4; "
     "the smoke tests use 2)"},
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
    "       tdc bench ddp [--out FILE] [--repeat N] [--worlds LIST]\n"
    "       tdc bench fsdp [--out FILE] [--repeat N] [--worlds LIST] [--rounds R] [--python PY]\n"
    "       tdc bench fsdp1 [--out FILE] [--repeat N] [--worlds LIST] [--rounds R] [--python PY]\n"
    "       tdc bench checkpoint [--out FILE] [--repeat N] [--worlds LIST] [--rounds R] [--mb MB] [--dir DIR]\n"
    "                            [--python PY]\n"
    "       tdc bench pipelining [--out FILE] [--repeat N] [--worlds LIST] [--rounds R] [--python PY]\n"
    "       tdc bench kernel [--out FILE] [--repeat N]\n\n"
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
    "kernel: what this machine's kernel charges for the events a Gloo collective is made of, each\n"
    "timed alone as a ping-pong: a null system call, a hand-off between two threads on one CPU, a\n"
    "64-byte loopback TCP message with both ends on one CPU and on two (wall and system time per\n"
    "event; --repeat: rounds, default 5). JSON: docs/results-schema.md, 'Kernel benchmark'.\n"
    "All show progress, write JSON and print a table.\n\n"
    "Options:\n";

// The benchmarks: name -> driver, and whether it takes the PyTorch-side options (--python,
// --rounds) and the checkpoint ones (--mb, --dir).
struct Benchmark {
  const char* name;
  int (*run)(const ParsedArgs&, const fs::path& build, const fs::path& out, std::optional<int> repeat);
  bool pytorch_side, checkpoint_options;
};
const Benchmark kBenchmarks[] = {
    {"harness", bench::bench_harness, false, false},
    {"ddp", bench::bench_ddp, false, false},
    {"fsdp",
     [](const ParsedArgs& a, const fs::path& b, const fs::path& o, std::optional<int> r) {
       return bench::bench_fsdp(a, b, o, r, false);
     },
     true, false},
    {"fsdp1",
     [](const ParsedArgs& a, const fs::path& b, const fs::path& o, std::optional<int> r) {
       return bench::bench_fsdp(a, b, o, r, true);
     },
     true, false},
    {"checkpoint", bench::bench_checkpoint, true, true},
    {"pipelining", bench::bench_pipelining, true, false},
    {"kernel", bench::bench_kernel, false, false},
};

}  // namespace

int bench_command(const std::vector<std::string>& args) {
  ParsedArgs a = parse_args("bench", kBenchOptions, args, true);
  if (a.help || a.positional.empty()) {
    fmt::print("{}{}", kBenchUsage, format_options(kBenchOptions));
    return a.help ? kExitOk : kExitUsage;
  }
  const std::string name = a.positional.size() == 1 ? a.positional[0] : "";
  const Benchmark* bench = nullptr;
  std::vector<std::string> names;
  for (const Benchmark& b : kBenchmarks) {
    names.push_back(b.name);
    if (name == b.name) bench = &b;
  }
  if (bench == nullptr)
    throw UsageError(fmt::format("bench: unknown benchmark '{}' (available: {})", fmt::join(a.positional, " "),
                                 fmt::join(names, ", ")));
  if (!bench->pytorch_side && (a.get("python") || a.get("rounds")))
    throw UsageError(
        "bench: --python and --rounds are options of 'tdc bench fsdp', 'fsdp1', 'checkpoint' and 'pipelining' only");
  if (!bench->checkpoint_options && (a.get("mb") || a.get("dir")))
    throw UsageError("bench: --mb and --dir are options of 'tdc bench checkpoint' only");
  if (name == "harness" && a.get("worlds"))
    throw UsageError("bench: --worlds is not an option of 'tdc bench harness' (its tests have 4 ranks)");
  if (name == "kernel" && a.get("worlds"))
    throw UsageError("bench: --worlds is not an option of 'tdc bench kernel' (it times single events, not worlds)");
  bench::worlds_option(a);  // refuses a bad value before anything runs
  const fs::path build = resolve_build_dir(a.get("build-dir"));
  const fs::path out = fs::absolute(a.get("out").value_or(fmt::format("results/bench-{}.json", name)));
  std::optional<int> repeat;
  if (auto v = a.get("repeat")) repeat = parse_positive_int("bench", "repeat", *v);
  return bench->run(a, build, out, repeat);
}

}  // namespace tdc::cli
