// Process plumbing of a harness test binary: the run-wide settings its --tdc_* flags fill, and
// the main() that runs GoogleTest with the harness's listener. Not for tests: GoogleTest keeps the
// same in testing::internal. Included by the harness's own sources and by tdc_harness_main.
#pragma once

#include <string>

#include "tdc/harness/harness.h"

namespace tdc::harness::internal {

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
  double stacks_budget_s() const { return stacks_timeout_s > 0 ? stacks_timeout_s : stacks == "signal" ? 2.0 : 20.0; }
  int default_world_size = 4;
  double abort_grace_s = 0.5;  // after a rank fails, how long the others may finish
  std::string results_path;
  std::string junit_path;
  std::string expectations_path;
  int events_fd = -1;          // progress stream (JSON lines) for `tdc run`
  std::string implementation;  // --tdc_implementation; empty: the declared one
  std::string implementation_version;
};
RunSettings& settings();

// The complete main() of a harness test binary: init(), --tdc_preflight, then RUN_ALL_TESTS with
// the results listener (results JSON, JUnit XML, expectations, progress events).
int main(int argc, char** argv);

}  // namespace tdc::harness::internal
