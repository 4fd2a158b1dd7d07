// The launcher below the GoogleTest glue: run a body on N ranks and get an outcome back.
// run_distributed (harness.h) uses it; so do benchmarks and tools that run rank bodies
// outside a TEST.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tdc/harness/harness.h"
#include "tdc/harness/results.h"

namespace tdc::harness {

// Run-wide settings, from --tdc_* flags and TDC_* environment variables (flags win).
struct RunSettings {
  Launcher launcher = Launcher::Fork;
  std::string backend = "gloo";
  std::string backend_lib;
  std::string device_type = "cpu";
  double timeout_s = 60;
  bool keep_temp = false;
  bool show_output = false;       // echo every rank's output even when the test passes
  std::string stacks = "signal";  // stack capture on timeout / abort: signal | gdb | both
  double stacks_timeout_s = 0;    // budget per process for capturing stacks; 0: 2 s signal, 20 s gdb
  double stacks_budget_s() const {
    return stacks_timeout_s > 0 ? stacks_timeout_s : stacks == "signal" ? 2.0 : 20.0;
  }
  int default_world_size = 4;
  double abort_grace_s = 0.5;     // after a rank fails, how long the others may finish
  std::string results_path;
  std::string junit_path;
  std::string expectations_path;
  int events_fd = -1;             // progress stream (JSON lines) for `tdc run`
  std::string implementation = "tdc-reference";
  std::string implementation_version;
};
RunSettings& settings();

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
  std::string message;           // summary for people
  std::vector<Failure> failures; // individual rank failures (file:line)
  std::vector<RankDetail> ranks;
  double duration_s = 0;
};

// Runs body on spec.world_size ranks with the given launcher. Never throws for test failures;
// they are in the Outcome.
Outcome launch(const LaunchSpec& spec, const std::function<void()>& body);

// For main(): parse and strip --tdc_* flags; install signal handlers. Returns false on a bad flag.
bool init(int* argc, char** argv, std::string* error);
// The complete main() of a harness test binary.
int main(int argc, char** argv);

}  // namespace tdc::harness
