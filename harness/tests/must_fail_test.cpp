// Self-tests of the harness: the must-fail cases of mustfail_cases.cpp, each run in a child
// harness (child_harness.h): the status and message reported, how promptly, no orphans, no temp
// dirs left.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tdc/harness/results.h"

#include "child_harness.h"

using namespace tdc::harness;
using namespace tdc_selftest;

TEST(HarnessMustFail, CrashOnOneRank) {
  // [Note: frames with file:line]: the crashing test body's frame names its function and line.
  ChildRun r = expect_outcome("MustFail.CrashOnOneRank", {Status::Crash, {"[rank 1]", "SIGSEGV", "last output"}});
  const TestResult& t = only_test(r);
  const std::string frame =
      "MustFail_CrashOnOneRank_TdcBody() " + frame_location(t, "if (ctx().rank == 1) raise(SIGSEGV);");
  EXPECT_TRUE(contains(t.message, frame)) << frame << " not in:\n" << t.message;
  ASSERT_EQ(t.ranks.size(), 4u) << r.output;
  EXPECT_EQ(t.ranks[1].status, RankStatus::Crash) << to_string(t.ranks[1].status);
  EXPECT_EQ(t.ranks[1].signal, SIGSEGV);
}
TEST(HarnessMustFail, HangOnOneRankTimesOutWithStacks) {
  ChildRun r =
      expect_outcome("MustFail.HangOnOneRank",
                     {Status::Timeout,
                      {"ranks still running: [0, 1, 2, 3]", "stacks of rank 2", "tdc_mustfail::sleep_forever()"},
                      When::AtDeadline,
                      3});
  // [Note: the odd rank first]: ranks 0, 1 and 3 wait in the same barrier; rank 2, which never
  // reached it, is named and its stacks come before theirs (a report cut short still shows it).
  const std::string& m = only_test(r).message;
  EXPECT_TRUE(contains(m, "not where the others are: rank 2 (rank 0, rank 1, rank 3 are all in one place)")) << m;
  EXPECT_LT(m.find("stacks of rank 2"), m.find("stacks of rank 0")) << m;
  // [Note: frames with file:line]: the test body's frame, unnamed by backtrace_symbols, has its line.
  const std::string frame = "MustFail_HangOnOneRank_TdcBody() " +
                            frame_location(only_test(r), "if (ctx().rank == 2) tdc_mustfail::sleep_forever();");
  EXPECT_TRUE(contains(m, frame)) << frame << " not in:\n" << m;
  expect_location(only_test(r), "TDC_DIST_TEST(MustFail, HangOnOneRank");
}
TEST(HarnessMustFail, ExceptionOnOneRank) {
  ChildRun r = expect_outcome("MustFail.ExceptionOnOneRank",
                              {Status::Fail, {"[rank 3]", "boom from rank 3", "stopped after rank 3 failed"}});
  expect_location(only_test(r), "TDC_DIST_TEST(MustFail, ExceptionOnOneRank)");
}
TEST(HarnessMustFail, AssertInSubtestNamesRankAndParameters) {
  ChildRun r = expect_outcome("MustFail.AssertInSubtest", {Status::Fail, {"[rank 1] [subtest x=2]", "x must be 1"}});
  expect_location(only_test(r), "EXPECT_EQ(p.get<int>(\"x\"), 1)");
}
// The typed form names its parameters exactly as the string-keyed one: only the last
// combination fails, and only its label appears.
TEST(HarnessMustFail, AssertInTypedSubtestNamesRankAndParameters) {
  ChildRun r = expect_outcome(
      "MustFail.AssertInTypedSubtest",
      {Status::Fail, {"[rank 1] [subtest reshard_after_forward=True, mlp_dim=16]", "mlp_dim 16 fails with reshard"}});
  const TestResult& t = only_test(r);
  EXPECT_FALSE(contains(t.message, "reshard_after_forward=False")) << t.message;
  EXPECT_FALSE(contains(t.message, "mlp_dim=2]")) << t.message;
}
TEST(HarnessMustFail, SkipDisagreementIsReported) {
  expect_status("SkipDisagreement", Status::Skip, {"rank 0 wants to skip", "ranks disagree", "skipped on [0]"});
}
TEST(HarnessMustFail, SkipOnAllRanks) { expect_status("SkipOnAllRanks", Status::Skip, {"nothing to do on this host"}); }
TEST(HarnessMustFail, SkipIfLtXGpu) {
  expect_status("SkipIfLtXGpu", Status::Skip,
                {"Need at least 64 CUDA devices", "skip_if_lt_x_gpu(64)", "this machine has 0"});
}
TEST(HarnessMustFail, NotSupported) { expect_status("NotSupported", Status::NotSupported, {"CPUOffloadPolicy"}); }
TEST(HarnessMustFail, MissingCapabilityIsNotSupported) {
  expect_status("MissingCapability", Status::NotSupported, {"fsdp2.cpu_offload"});
}
TEST(HarnessMustFail, ExitEarlyIsACrash) {
  expect_status("ExitEarly", Status::Crash, {"[rank 2]", "exited with code 3"});
}
TEST(HarnessMustFail, ThreadLauncherException) {
  expect_status("ThreadExceptionOnOneRank", Status::Fail, {"[rank 3]", "boom from thread rank 3"});
}
TEST(HarnessMustFail, ThreadLauncherHang) {
  expect_timeout("ThreadHangOnOneRank",
                 {"ranks still running: [0, 1, 2, 3]", "(tdc-rank2)", "tdc_mustfail::sleep_forever()"}, 3);
}
TEST(HarnessMustFail, ThreadLauncherCrash) {
  expect_status("ThreadCrashOnOneRank", Status::Crash, {"SIGABRT", "tdc: rank 1 received fatal signal"});
}
TEST(HarnessMustFail, SpawnLauncherCrash) {
  expect_status("SpawnCrashOnOneRank", Status::Crash, {"[rank 1]", "SIGSEGV"});
}
TEST(HarnessMustFail, SpawnLauncherHang) {
  expect_timeout("SpawnHangOnOneRank",
                 {"ranks still running: [0, 1, 2, 3]", "stacks of rank 0", "tdc_mustfail::sleep_forever()"}, 3);
}
TEST(HarnessMustFail, DeadlineComesFromTheFlagWhenTheTestSetsNone) {
  ChildOptions o;
  o.args = {"--tdc_timeout=2"};
  expect_outcome("MustFailDefaults.HangWithRunDeadline",
                 {Status::Timeout, {"deadline 2.0 s", "sleep_forever"}, When::AtDeadline, 2}, o);
}

TEST(HarnessMustFail, GdbStacksOnRequest) {
  // gdb attaches to each live rank and loads LibTorch's symbols: seconds per process idle, many
  // times that on a loaded machine. Its budget is a run setting; this test grants a generous one
  // (a budget gdb does not need costs nothing) and holds the harness to deadline + budget.
  ChildOptions o;
  o.args = {"--tdc_timeout=2", "--tdc_stacks=both", "--tdc_stacks_timeout=240"};
  expect_outcome(
      "MustFailDefaults.HangAloneWithRunDeadline",
      {Status::Timeout, {"Thread 1 (", "tdc_mustfail::sleep_forever", "--- end of stacks"}, When::AtDeadline, 2, 240},
      o);
}

// ---- misaligned ranks: reported as the failure that caused them, promptly, with stacks
TEST(HarnessMustFail, ExceptionInSubtestThenCollectiveIsAPromptFail) {
  Expected e{
      Status::Fail,
      {"ranks [0, 1, 2, 3] were stopped after rank 1 failed", "==== stacks of rank 0", "tdc_mustfail::collective"},
      When::Prompt,
      60};
  ChildRun r = expect_outcome("MustFail.ExceptionInSubtestThenCollective", e);
  const TestResult& t = only_test(r);
  EXPECT_EQ(first_line(t.message), "[rank 1] [subtest x=1] uncaught exception: boom in subtest on rank 1") << t.message;
}
TEST(HarnessMustFail, FailedAssertInSubtestThenCollectiveIsAPromptFail) {
  ChildRun r = expect_outcome("MustFail.FailedAssertInSubtestThenCollective",
                              {Status::Fail, {"rank 2 needs x == 2", "stopped after rank 2 failed"}, When::Prompt, 60});
  const TestResult& t = only_test(r);
  EXPECT_TRUE(contains(first_line(t.message), "[rank 2] [subtest x=1]")) << t.message;
}
TEST(HarnessMustFail, FailedExpectThenCollectiveIsAPromptFail) {
  expect_outcome("MustFail.FailedExpectThenCollective", {Status::Fail,
                                                         {"[rank 0] ", "rank 0 computed the wrong sum",
                                                          "stopped after rank 0 failed", "==== stacks of rank 1"},
                                                         When::Prompt,
                                                         60});
}
TEST(HarnessMustFail, ReturnEarlyWhileOthersEnterBarrierIsAPromptFail) {
  expect_outcome("MustFail.ReturnEarlyWhileOthersEnterBarrier",
                 {Status::Fail,
                  {"barrier #1: rank 2 (pass) returned from the test body without entering this barrier"},
                  When::Prompt,
                  60});
}
TEST(HarnessMustFail, ThreadReturnEarlyWhileOthersEnterBarrierIsAPromptFail) {
  expect_outcome("MustFail.ThreadReturnEarlyWhileOthersEnterBarrier",
                 {Status::Fail, {"barrier #1: rank 1 (pass) returned from the test body"}, When::Prompt, 60});
}

TEST(HarnessMustFail, SeveralTestsInOneRun) {
  ChildRun r = run_child("MustFail.EnvFailOnRank1:MustFail.PassesButExpectedToFail");
  ASSERT_EQ(r.results.tests.size(), 2u) << r.output;
  EXPECT_EQ(r.results.tests[0].status, Status::Fail);
  EXPECT_TRUE(contains(r.results.tests[0].message, "[rank 1] ")) << r.results.tests[0].message;
  EXPECT_EQ(r.results.tests[1].status, Status::Pass);
  EXPECT_EQ(r.results.run_info.world_size, 2);
  expect_clean(r);
}

// [Note: a supervisor that crashes says where]: the binary's own process prints its backtrace.
TEST(HarnessMustFail, CrashOfTheBinaryItselfPrintsItsBacktrace) {
  ChildRun r = run_child("MustFailBinary.CrashTheBinary");
  EXPECT_EQ(r.exit_code, 128 + SIGSEGV) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "tdc: the test binary's own process (the ranks' supervisor, not a rank) received "
                       "fatal signal 11 (SEGV); backtrace:"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "tdc_harness_mustfail(")) << "a frame of the binary:\n" << r.output;
}

TEST(HarnessMustFail, InterruptKillsRanksAndRemovesTempDir) {
  // Relative to the test's 120 s deadline: SIGTERM ends the run long before it would.
  ChildOptions o;
  o.interrupt_after_s = 1.5;
  ChildRun r = run_child("MustFail.LongHang", o);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.output;
  EXPECT_LT(r.wall_s, o.interrupt_after_s + 120 / 4);
  expect_clean(r);
}

// [Note: the interrupt handler allocates nothing]: files and directories a rank left in the temp
// dir go too.
TEST(HarnessMustFail, InterruptRemovesWhatRanksWroteInTheTempDir) {
  ChildOptions o;
  o.interrupt_after_s = 1.5;
  ChildRun r = run_child("MustFail.LongHangWithFiles", o);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.output;
  expect_clean(r);
}

TEST(HarnessMustFail, ExpectationsTurnFailIntoXfailAndPassIntoXpass) {
  std::string dir = fresh_dir("expect");
  std::ofstream(dir + "/exp.json") << R"({"tests": {
      "MustFail.ExceptionOnOneRank": {"status": "FAIL", "reason": "known bug #1"},
      "MustFail.PassesButExpectedToFail": {"status": "FAIL", "reason": "was broken"}}})";
  ChildOptions o;
  o.args = {"--tdc_expectations=" + dir + "/exp.json"};
  ChildRun r = run_child("MustFail.ExceptionOnOneRank", o);
  EXPECT_EQ(only_test(r).status, Status::XFail) << r.output;
  EXPECT_EQ(r.exit_code, 0) << "an expected failure must not fail the run";
  expect_clean(r);
  ChildRun r2 = run_child("MustFail.PassesButExpectedToFail", o);
  EXPECT_EQ(only_test(r2).status, Status::XPass) << r2.output;
  EXPECT_EQ(r2.exit_code, 1) << "an unexpected pass fails the run (update the expectations)";
  expect_clean(r2);
  std::filesystem::remove_all(dir);
}

// [Note: the parent never initialises CUDA]: a fork-launcher parent in which the CUDA driver is
// loaded (here a stand-in with its soname, preloaded) starts ranks by fork+exec, says so once,
// and the results name the launcher that ran; without it, the same test forks.
TEST(HarnessMustFail, ForkAfterCudaLoadedUsesSpawn) {
  ChildRun plain = run_child("MustFail.PassesButExpectedToFail");
  EXPECT_EQ(only_test(plain).launcher, "fork") << plain.output;
  EXPECT_FALSE(contains(plain.output, "CUDA driver is loaded")) << plain.output;
  ChildOptions o;
  o.env = {"LD_PRELOAD=" + self_dir() + "/fake-cuda/libcuda.so.1"};
  ChildRun r = run_child("MustFail.PassesButExpectedToFail", o);
  EXPECT_EQ(to_string(only_test(r).status), std::string("PASS")) << r.output;
  EXPECT_EQ(only_test(r).launcher, "spawn") << r.output;
  EXPECT_TRUE(contains(r.output, "the CUDA driver is loaded in the parent process")) << r.output;
  expect_clean(r);
}

// [Note: tests whose ranks need a process each] (harness.h): under --tdc_launcher=thread such a
// test forks its ranks, says so once, and the results name fork; the same body as threads fails;
// a test that forces threads and asks for a process per rank fails naming both options.
TEST(HarnessMustFail, ProcessPerRankForksUnderTheThreadLauncher) {
  ChildOptions o;
  o.args = {"--tdc_launcher=thread"};
  ChildRun r = run_child("MustFail.SeedsTheGlobalGeneratorPerRank", o);
  EXPECT_EQ(to_string(only_test(r).status), std::string("PASS")) << r.output;
  EXPECT_EQ(only_test(r).launcher, "fork") << r.output;
  EXPECT_TRUE(contains(r.output, "need a process each")) << r.output;
  expect_clean(r);
  ChildRun t = expect_outcome("MustFail.SeedsTheGlobalGeneratorPerRankAsThreads",
                              {Status::Fail, {"drew another rank's numbers"}});
  EXPECT_EQ(only_test(t).launcher, "thread") << t.output;
  expect_outcome("MustFail.ThreadsButProcessPerRank",
                 {Status::Fail, {"MustFail.ThreadsButProcessPerRank", ".process_per_rank = true"}});
}

TEST(HarnessMustFail, UnknownFlagIsRejectedWithItsName) {
  ChildOptions o;
  o.args = {"--tdc_lancher=fork"};
  ChildRun r = run_child("MustFail.SkipOnAllRanks", o);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.output, "--tdc_lancher")) << r.output;
  ChildOptions o2;
  o2.args = {"--tdc_launcher=mpi"};
  ChildRun r2 = run_child("MustFail.SkipOnAllRanks", o2);
  EXPECT_EQ(r2.exit_code, 2);
  EXPECT_TRUE(contains(r2.output, "'mpi'")) << r2.output;
  // [Note: the harness's settings]: the unknown flag's message lists the table's public names
  // (not the spawn launcher's internal --tdc_child); the environment goes through the same table.
  EXPECT_TRUE(contains(r.output, "--tdc_stacks_timeout") && contains(r.output, "--tdc_preflight")) << r.output;
  EXPECT_FALSE(contains(r.output, "--tdc_child")) << r.output;
  ChildOptions o3;
  o3.env = {"TDC_TIMEOUT=soon"};
  ChildRun r3 = run_child("MustFail.SkipOnAllRanks", o3);
  EXPECT_EQ(r3.exit_code, 2);
  EXPECT_TRUE(contains(r3.output, "--tdc_timeout expects a positive number of seconds, got 'soon'")) << r3.output;
  ChildOptions o4;
  o4.args = {"--tdc_backend"};
  ChildRun r4 = run_child("MustFail.SkipOnAllRanks", o4);
  EXPECT_EQ(r4.exit_code, 2);
  EXPECT_TRUE(contains(r4.output, "--tdc_backend needs a value")) << r4.output;
}
