// The self-tests' child harness: runs a test binary (by default the must-fail cases of
// mustfail_cases.cpp) in a child process with its own TMPDIR and a token in its environment, and
// checks what it reported (results.json), how promptly, and that it left no process and no file
// behind. Used by harness_selftest.cpp's neighbours must_fail_test.cpp and env_launcher_test.cpp.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tdc/harness/results.h"

namespace tdc_selftest {

using tdc::harness::RunResults;
using tdc::harness::Status;
using tdc::harness::TestResult;

struct ChildRun {
  int exit_code = -1;
  double wall_s = 0;
  std::string output;
  RunResults results;
  std::string tmpdir;  // TMPDIR given to the child: must be empty afterwards
  std::string token;
  std::shared_ptr<void> remove_work;  // removes the run's work directory (tmpdir's parent) with the last copy
};

struct ChildOptions {
  std::vector<std::string> args;
  std::vector<std::string> env;  // extra KEY=VALUE
  double interrupt_after_s = 0;  // send SIGTERM after this long (0: never)
  std::string binary = "tdc_harness_mustfail";
};

// The folder of the running binary (the build dir, where the child binaries are).
std::string self_dir();
// A new empty directory under the temp dir, named after `what`.
std::string fresh_dir(const std::string& what);
// Processes still alive that carry the token in their environment (= leaked ranks).
std::vector<int> processes_with_token(const std::string& token);
// Runs the child binary with --gtest_filter=`filter` and waits for it (SIGTERM after
// o.interrupt_after_s when set; SIGKILL after 600 s, the self-test's own safety net).
ChildRun run_child(const std::string& filter, const ChildOptions& o = {});
// The run's one test result; throws with the child's output if there is not exactly one.
const TestResult& only_test(const ChildRun& r);
bool contains(const std::string& s, const std::string& what);
// No rank process left behind and nothing left in the child's TMPDIR.
void expect_clean(const ChildRun& r);

// [Note: timing promises are relative to the deadline] The self-tests run while other suites
// (or a stress script) load the machine, so no bound may depend on how fast the machine is. Each
// bound is a fraction or multiple of the test's own deadline, read from what the harness measured
// (the test's duration in results.json, not the wall time that includes exec and loading):
//  * Prompt: a crash, failure or skip is reported long before the deadline (under half of it).
//  * AtDeadline: a hang is reported no earlier than the deadline, and no later than the deadline
//    plus the stack-capture budget plus one more deadline of slack.
enum class When { Prompt, AtDeadline };

struct Expected {
  Status status;
  std::vector<std::string> in_message;
  When when = When::Prompt;
  double deadline_s = 20;      // the test's deadline (MustFail suite default: 20 s)
  double stacks_budget_s = 2;  // the run's stack-capture budget (signal: 2 s)
};

// Runs `test` in a child harness and checks it against `e`; returns the run for further checks.
ChildRun expect_outcome(const std::string& test, const Expected& e, const ChildOptions& o = {});
void expect_status(const char* test, Status status, std::vector<std::string> in_message);
void expect_timeout(const char* test, std::vector<std::string> in_message, double deadline_s);
// The first line of a result's message.
std::string first_line(const std::string& s);
// The result names where the test failed (results.json's file and line): that source line holds
// `what` (the failed assertion, or the TDC_DIST_TEST line for what has no assertion behind it).
void expect_location(const TestResult& t, const std::string& what);
// "at tests/mustfail_cases.cpp:N", N the first line from the test's TDC_DIST_TEST line on (a
// result's `file` and `line`) that holds `text`: what a symbolized frame of that line reads
// ([Note: frames with file:line]).
std::string frame_location(const TestResult& t, const std::string& text);

}  // namespace tdc_selftest
