// Tests that MUST fail, each in its own way. They are not run directly (not in ctest): the
// harness self-tests run this binary as a child harness and assert on what it reports
// (status, rank, timing, no orphan processes, no leftover temp dirs).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/rand.h>

#include "tdc/harness/harness.h"
#include "tdc/harness/subtests.h"

using tdc::harness::barrier;
using tdc::harness::ctx;
using tdc::harness::Launcher;

namespace tdc_mustfail {
// Named so that stacks printed on timeout can be checked for it (exported via -rdynamic).
[[gnu::noinline]] void sleep_forever() {
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}
}  // namespace tdc_mustfail

// Kills the test binary itself, not a rank (a bug in the harness, or in a LibTorch it runs on:
// PyTorch 2.11's std::filesystem killed binaries so): `tdc run` starts the binary again for the
// tests after it ([Note: one death costs one test] in cli/run.cpp). Defined before the MustFail
// suite, so it runs first of the selected tests.
TEST(MustFailBinary, CrashTheBinary) { raise(SIGSEGV); }

TDC_DIST_SUITE(MustFail, .world_size = 4, .timeout_s = 20);

TDC_DIST_TEST(MustFail, CrashOnOneRank) {
  barrier();
  if (ctx().rank == 1) raise(SIGSEGV);
  barrier();  // the others block here until the harness stops them
}

TDC_DIST_TEST(MustFail, HangOnOneRank, .timeout_s = 3) {
  barrier();
  if (ctx().rank == 2) tdc_mustfail::sleep_forever();
  barrier();
}

TDC_DIST_TEST(MustFail, ExceptionOnOneRank) {
  barrier();
  if (ctx().rank == 3) throw std::runtime_error("boom from rank 3");
  barrier();
}

TDC_DIST_TEST(MustFail, AssertInSubtest) {
  tdc::harness::subtests({{"x", {1, 2}}}, [](const tdc::harness::Params& p) {
    if (ctx().rank == 1) {
      EXPECT_EQ(p.get<int>("x"), 1) << "x must be 1";
    }
  });
}

// Only the last combination fails, on one rank.
TDC_DIST_TEST(MustFail, AssertInTypedSubtest) {
  using tdc::harness::Axis;
  tdc::harness::subtests(Axis<bool>("reshard_after_forward", {false, true}), Axis<int64_t>("mlp_dim", {2, 16}),
                         [](bool reshard, int64_t mlp_dim) {
                           if (ctx().rank == 1) {
                             EXPECT_FALSE(reshard && mlp_dim == 16) << "mlp_dim " << mlp_dim << " fails with reshard";
                           }
                         });
}

// ---- misaligned ranks: one rank fails (or returns) and never joins what the others wait in.
namespace tdc_mustfail {
// A stand-in for a collective (this binary links no process group): every rank must arrive.
// Unlike barrier(), it does not notice ranks that left: it waits as a real collective would.
void collective(const std::string& name) {
  const auto& c = ctx();
  if (c.store->add("collective/" + name, 1) == c.world_size)
    c.store->set("collective/" + name + "/done", std::string("1"));
  c.store->wait({"collective/" + name + "/done"});
}
}  // namespace tdc_mustfail

// The deadline is long on purpose: the self-tests assert the verdict comes far sooner.
TDC_DIST_TEST(MustFail, ExceptionInSubtestThenCollective, .timeout_s = 60) {
  tdc::harness::subtests({{"x", {1, 2}}}, [](const tdc::harness::Params& p) {
    if (ctx().rank == 1 && p.get<int>("x") == 1) throw std::runtime_error("boom in subtest on rank 1");
    tdc_mustfail::collective("step" + std::to_string(p.get<int>("x")));
  });
}

TDC_DIST_TEST(MustFail, FailedAssertInSubtestThenCollective, .timeout_s = 60) {
  tdc::harness::subtests({{"x", {1, 2}}}, [](const tdc::harness::Params& p) {
    if (ctx().rank == 2) {
      ASSERT_EQ(p.get<int>("x"), 2) << "rank 2 needs x == 2";  // returns before the collective
    }
    tdc_mustfail::collective("step" + std::to_string(p.get<int>("x")));
  });
}

TDC_DIST_TEST(MustFail, FailedExpectThenCollective, .timeout_s = 60) {
  if (ctx().rank == 0) {
    EXPECT_EQ(1 + 1, 3) << "rank 0 computed the wrong sum";
    tdc_mustfail::sleep_forever();  // and then never joins
  }
  tdc_mustfail::collective("after-check");
}

TDC_DIST_TEST(MustFail, ReturnEarlyWhileOthersEnterBarrier, .timeout_s = 60) {
  barrier();
  if (ctx().rank == 2) return;  // no failure of its own: it just does not come
  barrier();
}

TDC_DIST_TEST(MustFail, ThreadReturnEarlyWhileOthersEnterBarrier, .timeout_s = 60, .launcher = Launcher::Thread) {
  barrier();
  if (ctx().rank == 1) return;
  barrier();
}

TDC_DIST_TEST(MustFail, SkipDisagreement) {
  if (ctx().rank == 0) GTEST_SKIP() << "rank 0 wants to skip";
  barrier();  // the others wait for rank 0, which never comes
}

TDC_DIST_TEST(MustFail, SkipOnAllRanks) { TDC_SKIP_IF(true, "nothing to do on this host"); }

TDC_DIST_TEST(MustFail, SkipIfLtXGpu) { TDC_SKIP_IF_LT_X_GPU(64); }

TDC_DIST_TEST(MustFail, NotSupported) { TDC_NOT_SUPPORTED("fully_shard(offload_policy=CPUOffloadPolicy)"); }

TDC_DIST_TEST(MustFail, MissingCapability, .world_size = 2) {
  tdc::harness::declare_capabilities("mustfail-impl", {"fsdp2.basic"});
  TDC_REQUIRE_CAPABILITY("fsdp2.basic");  // present: no skip
  TDC_REQUIRE_CAPABILITY("fsdp2.cpu_offload");
  ADD_FAILURE() << "unreachable: the capability is missing";
}

TDC_DIST_TEST(MustFail, ExitEarly) {
  if (ctx().rank == 2) std::exit(3);
  barrier();
}

TDC_DIST_TEST(MustFail, ThreadExceptionOnOneRank, .launcher = Launcher::Thread) {
  barrier();
  if (ctx().rank == 3) throw std::runtime_error("boom from thread rank 3");
  barrier();
}

TDC_DIST_TEST(MustFail, ThreadHangOnOneRank, .timeout_s = 3, .launcher = Launcher::Thread) {
  barrier();
  if (ctx().rank == 2) tdc_mustfail::sleep_forever();
  barrier();
}

TDC_DIST_TEST(MustFail, ThreadCrashOnOneRank, .launcher = Launcher::Thread) {
  barrier();
  if (ctx().rank == 1) raise(SIGABRT);
  barrier();
}

TDC_DIST_TEST(MustFail, SpawnCrashOnOneRank, .launcher = Launcher::Spawn) {
  barrier();
  if (ctx().rank == 1) raise(SIGSEGV);
  barrier();
}

TDC_DIST_TEST(MustFail, SpawnHangOnOneRank, .timeout_s = 3, .launcher = Launcher::Spawn) {
  barrier();
  if (ctx().rank == 0) tdc_mustfail::sleep_forever();
  barrier();
}

// For the interrupt test: runs until the harness is killed from outside.
TDC_DIST_TEST(MustFail, LongHang, .timeout_s = 120) { tdc_mustfail::sleep_forever(); }

// For the interrupt self-test: a tree two directories deep in the test's temp dir, then a hang.
// The interrupt handler removes all of it ([Note: the interrupt handler allocates nothing]).
TDC_DIST_TEST(MustFail, LongHangWithFiles, .timeout_s = 120) {
  const std::filesystem::path deep = ctx().temp_dir / ("rank" + std::to_string(ctx().rank)) / "a" / "b";
  std::filesystem::create_directories(deep);  // <filesystem> comes with ctx().temp_dir (harness.h)
  if (FILE* f = std::fopen((deep / "file").c_str(), "w")) std::fclose(f);
  tdc_mustfail::sleep_forever();
}

// For the env launcher: rank 1 fails, rank 0 must report it.
TDC_DIST_TEST(MustFail, EnvFailOnRank1, .world_size = 2) { EXPECT_NE(ctx().rank, 1) << "rank 1 fails on purpose"; }

// Flaky on purpose, for `tdc run --repeat`: fails on every second run. The run count lives in the
// file $TDC_FLAKY_COUNTER (without it, the test passes).
TDC_DIST_TEST(MustFail, FailsEverySecondRun, .world_size = 1) {
  const char* path = std::getenv("TDC_FLAKY_COUNTER");
  if (!path) return;
  int runs = 0;
  if (std::FILE* f = std::fopen(path, "r")) {
    if (std::fscanf(f, "%d", &runs) != 1) runs = 0;
    std::fclose(f);
  }
  ++runs;
  if (std::FILE* f = std::fopen(path, "w")) {
    std::fprintf(f, "%d\n", runs);
    std::fclose(f);
  }
  EXPECT_NE(runs % 2, 0) << "run " << runs << " fails on purpose";
}

// Passes: used with an expectations file that says it fails (-> XPASS).
TDC_DIST_TEST(MustFail, PassesButExpectedToFail, .world_size = 2) { barrier(); }

// [Note: tests whose ranks need a process each] (harness.h): every rank seeds ATen's process-wide
// generator with a seed of its own, then draws from it, as PyTorch's FSDPTest helpers do. With a
// process per rank each rank draws its own numbers (passes, also under --tdc_launcher=thread,
// which gives way to fork here); as threads the last rank to seed sets everyone's, so the variant
// forced onto threads fails on at least one rank, whatever the order.
namespace {
void seed_per_rank_and_draw() {
  at::manual_seed(100 + ctx().rank);
  barrier();  // every rank has seeded before any rank draws
  const at::Tensor drawn = at::rand({64});
  const at::Tensor own = at::rand({64}, at::detail::createCPUGenerator(100 + ctx().rank));
  EXPECT_TRUE(at::equal(drawn, own)) << "rank " << ctx().rank << " drew another rank's numbers";
}
}  // namespace

TDC_DIST_TEST(MustFail, SeedsTheGlobalGeneratorPerRank, .world_size = 2, .process_per_rank = true) {
  seed_per_rank_and_draw();
  const std::string me = std::to_string(getpid());
  ctx().store->set("pid" + std::to_string(ctx().rank), std::vector<uint8_t>(me.begin(), me.end()));
  barrier();
  const auto peer = ctx().store->get("pid" + std::to_string(1 - ctx().rank));
  EXPECT_NE(std::string(peer.begin(), peer.end()), me) << "both ranks ran in one process";
}

TDC_DIST_TEST(MustFail, SeedsTheGlobalGeneratorPerRankAsThreads, .world_size = 2, .launcher = Launcher::Thread) {
  seed_per_rank_and_draw();
}

// Asks for threads and for a process per rank at once: refused, naming the test.
TDC_DIST_TEST(MustFail, ThreadsButProcessPerRank, .world_size = 2, .launcher = Launcher::Thread,
              .process_per_rank = true) {}

// No deadline of its own: takes --tdc_timeout.
TDC_DIST_TEST(MustFailDefaults, HangWithRunDeadline, .world_size = 2) {
  if (ctx().rank == 1) tdc_mustfail::sleep_forever();
  barrier();
}

// One rank, no deadline of its own (gdb stacks test).
TDC_DIST_TEST(MustFailDefaults, HangAloneWithRunDeadline, .world_size = 1) { tdc_mustfail::sleep_forever(); }
