// main() for harness test binaries. Its own object file in the static library, so a binary with
// its own main() (benchmarks, tools) does not pull it in.
#include "tdc/harness/launch.h"

int main(int argc, char** argv) { return tdc::harness::main(argc, argv); }
