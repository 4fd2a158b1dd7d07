// The launcher below the GoogleTest glue: run a body on N ranks and get an outcome back.
// run_distributed (harness.h) uses it; so do benchmarks and tools that run rank bodies
// outside a TEST.
//
//   int main(int argc, char** argv) {
//     std::string error;
//     if (!tdc::harness::init(&argc, argv, &error)) return 2;  // --tdc_* flags, signal handlers
//     tdc::harness::LaunchSpec spec{.suite = "Bench", .name = "all_reduce", .world_size = 4};
//     tdc::harness::Outcome o = tdc::harness::launch(spec, [] { ... });  // body runs on each rank
//   }
//
// The run-wide settings behind the flags and the test binaries' main() are process plumbing:
// tdc/harness/internal/runtime.h.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tdc/harness/harness.h"
#include "tdc/harness/results.h"

namespace tdc::harness {

struct LaunchSpec {
  std::string suite;
  std::string name;
  int world_size = 4;
  double timeout_s = 60;
  Launcher launcher = Launcher::Fork;
  int num_threads = 1;
  uint64_t seed = 1234;
};

struct Failure {
  int rank = -1;
  std::string file;
  int line = 0;
  std::string message;  // already carries "[rank r]" and the subtest
};

struct Outcome {
  Status status = Status::Pass;
  std::string message;            // summary for people
  std::vector<Failure> failures;  // individual rank failures (file:line)
  std::vector<RankDetail> ranks;
  double duration_s = 0;
  Reports reports;  // the union of the ranks' reports ([Note: rank reports])
};

// Runs body on spec.world_size ranks with the given launcher. Never throws for test failures;
// they are in the Outcome. Throws std::runtime_error, naming the cause, when the ranks cannot be
// started (a fork or a pipe that fails), after reaping those started and removing the temp dir.
Outcome launch(const LaunchSpec& spec, const std::function<void()>& body);

// testing::InitGoogleTest's counterpart, for a program with its own main() that calls launch():
// applies TDC_* variables, then parses and strips --tdc_* flags (flags win), and installs the
// parent's signal handlers (SIGINT/SIGTERM kill the ranks and remove the temp dir). Returns
// false, with the message naming the flag and value, on a bad flag. Harness test binaries get it
// from their main() (tdc_harness_main).
bool init(int* argc, char** argv, std::string* error);

}  // namespace tdc::harness
