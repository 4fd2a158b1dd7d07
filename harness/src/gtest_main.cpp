// main() for harness test binaries: the tdc_harness_main library, kept apart from tdc_harness as
// GoogleTest keeps gtest_main apart from gtest, so a program with its own main() (benchmarks,
// tools) links the harness without it.
#include "tdc/harness/internal/runtime.h"

int main(int argc, char** argv) { return tdc::harness::internal::main(argc, argv); }
