// FSDP benchmark (placeholder until the benchmark lands; see `tdc bench fsdp`).
#include <cstdio>
int main() {
  std::fprintf(stderr, "tdc_bench_fsdp: not implemented yet\n");
  return 1;
}
