// tdc_bench: the tdc side of `tdc bench`, one binary for every benchmark.
//
//   tdc_bench harness|ddp|fsdp|checkpoint|pipelining|kernel --out FILE [options]   (--help: a benchmark's)
//
// [Note: one benchmark binary] The five benchmarks were five programs; each compile parsed
// LibTorch's and tdc's headers again (about 17 s of a 17-19 s TU). As one binary, their sources
// are one unity TU ([Note: unity builds]). Each benchmark keeps its file and its namespace
// (bench_NAME), so that their helpers do not meet in that TU. `tdc bench` starts one process per
// run, so a benchmark still forks its ranks from a process that ran nothing else.
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "benchmarks.h"

namespace {

struct Benchmark {
  const char* name;
  int (*run)(int, char**);
};
constexpr Benchmark kBenchmarks[] = {{"harness", bench_harness::run},
                                     {"ddp", bench_ddp::run},
                                     {"fsdp", bench_fsdp::run},
                                     {"checkpoint", bench_checkpoint::run},
                                     {"pipelining", bench_pipelining::run},
                                     {"kernel", bench_kernel::run}};

int usage(const char* why) {
  fmt::print(stderr,
             "tdc_bench: {}\nusage: tdc_bench harness|ddp|fsdp|checkpoint|pipelining|kernel --out FILE [options]\n",
             why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage("which benchmark?");
  for (const Benchmark& b : kBenchmarks) {
    if (std::strcmp(argv[1], b.name) != 0) continue;
    // The benchmark sees the binary as argv[0] and its own arguments after it.
    std::vector<char*> args{argv[0]};
    args.insert(args.end(), argv + 2, argv + argc);
    args.push_back(nullptr);
    return b.run(argc - 1, args.data());
  }
  return usage(fmt::format("unknown benchmark '{}'", argv[1]).c_str());
}
