// The benchmarks of `tdc_bench NAME ...` (bench/cpp/main.cpp), one per file of this folder
// (bench_NAME.cpp). Each takes the arguments after NAME (argv[0]: the binary) and returns the exit
// status.
#pragma once

namespace bench_harness {
int run(int argc, char** argv);
}
namespace bench_ddp {
int run(int argc, char** argv);
}
namespace bench_fsdp {
int run(int argc, char** argv);
}
namespace bench_checkpoint {
int run(int argc, char** argv);
}
namespace bench_pipelining {
int run(int argc, char** argv);
}
namespace bench_kernel {
int run(int argc, char** argv);
}
