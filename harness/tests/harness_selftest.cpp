// Self-tests of the harness: passing behaviour in every launcher. The must-fail cases run in a
// child harness are in must_fail_test.cpp, the torchrun-style launcher in env_launcher_test.cpp.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest-spi.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "tdc/harness/external_launcher.h"
#include "tdc/harness/harness.h"
#include "tdc/harness/results.h"
#include "tdc/harness/subtests.h"

using namespace tdc::harness;

// ---------------------------------------------------------------- passing behaviour
namespace {

std::string get_str(c10d::Store& s, const std::string& k) {
  auto v = s.get(k);
  return std::string(v.begin(), v.end());
}
void set_str(c10d::Store& s, const std::string& k, const std::string& v) {
  s.set(k, std::vector<uint8_t>(v.begin(), v.end()));
}

// Checks every rank-context promise; run under each launcher.
void check_context(int expected_world, Launcher expected_launcher) {
  const auto& c = ctx();
  ASSERT_EQ(c.world_size, expected_world);
  EXPECT_EQ(c.launcher, expected_launcher);
  EXPECT_GE(c.rank, 0);
  EXPECT_LT(c.rank, c.world_size);
  EXPECT_EQ(c.local_rank, c.rank);
  EXPECT_EQ(c.device, c10::Device(c10::kCPU));
  EXPECT_EQ(at::get_num_threads(), 1);

  // Ranks are distinct and see one store.
  set_str(*c.store, "rank/" + std::to_string(c.rank), std::to_string(c.rank));
  barrier();
  for (int r = 0; r < c.world_size; ++r) EXPECT_EQ(get_str(*c.store, "rank/" + std::to_string(r)), std::to_string(r));

  // One private temp dir, shared by the ranks.
  struct stat st {};
  ASSERT_EQ(::stat(c.temp_dir.c_str(), &st), 0) << c.temp_dir;
  EXPECT_EQ(st.st_mode & 0777, 0700u) << c.temp_dir;
  std::ofstream(c.temp_dir / ("from_rank_" + std::to_string(c.rank))) << c.rank;
  barrier();
  for (int r = 0; r < c.world_size; ++r)
    EXPECT_TRUE(std::filesystem::exists(c.temp_dir / ("from_rank_" + std::to_string(r))));

  // Identical seed on every rank (thread ranks share one generator, as in PyTorch's threaded
  // tests, so only the per-rank generator is checked there).
  if (c.launcher != Launcher::Thread) {
    at::Tensor t = at::randn({8});
    std::string bytes(static_cast<const char*>(t.data_ptr()), t.nbytes());
    set_str(*c.store, "randn/" + std::to_string(c.rank), bytes);
    barrier();
    EXPECT_EQ(get_str(*c.store, "randn/0"), bytes) << "rank " << c.rank << " drew different numbers";
  }
  at::Tensor g = at::randn({8}, c.rank_generator);
  std::string gbytes(static_cast<const char*>(g.data_ptr()), g.nbytes());
  set_str(*c.store, "gen/" + std::to_string(c.rank), gbytes);
  barrier();
  for (int r = 0; r < c.world_size; ++r)
    if (r != c.rank) {
      EXPECT_NE(get_str(*c.store, "gen/" + std::to_string(r)), gbytes);
    }
  barrier();
}

}  // namespace

TDC_DIST_SUITE(HarnessBasics, .world_size = 4);

TDC_DIST_TEST(HarnessBasics, ContextFork, .launcher = Launcher::Fork) { check_context(4, Launcher::Fork); }
TDC_DIST_TEST(HarnessBasics, ContextThread, .launcher = Launcher::Thread) { check_context(4, Launcher::Thread); }
TDC_DIST_TEST(HarnessBasics, ContextSpawn, .launcher = Launcher::Spawn) { check_context(4, Launcher::Spawn); }
TDC_DIST_TEST(HarnessBasics, WorldSizeOne, .world_size = 1) {
  EXPECT_EQ(ctx().world_size, 1);
  barrier();
}
TDC_DIST_TEST(HarnessBasics, WorldSizeThree, .world_size = 3) {
  EXPECT_EQ(ctx().world_size, 3);
  barrier();
}

// Used by the env-launcher self-test (two processes started like torchrun would).
TDC_DIST_TEST(HarnessBasics, TwoRanks, .world_size = 2) {
  const auto& c = ctx();
  set_str(*c.store, "hello/" + std::to_string(c.rank), "hi");
  barrier();
  EXPECT_EQ(get_str(*c.store, "hello/" + std::to_string(1 - c.rank)), "hi");
}

TDC_DIST_TEST(HarnessBasics, SubtestsRunInOrderOnEveryRank, .world_size = 2) {
  std::vector<std::string> seen;
  subtests({{"a", {true, false}}, {"n", {1, 2, 3}}}, [&](const Params& p) { seen.push_back(p.str()); });
  ASSERT_EQ(seen.size(), 6u);
  EXPECT_EQ(seen.front(), "a=True, n=1");
  EXPECT_EQ(seen[1], "a=True, n=2");
  EXPECT_EQ(seen.back(), "a=False, n=3");
}

// The typed form inside ranks: the same order on every rank, values as typed, a barrier between.
TDC_DIST_TEST(HarnessBasics, TypedSubtestsRunInOrderOnEveryRank, .world_size = 2) {
  std::vector<std::pair<bool, int64_t>> seen;
  subtests(Axis<bool>("a", {true, false}), Axis<int64_t>("n", {1, 2, 3}), [&](bool a, int64_t n) {
    seen.emplace_back(a, n);
    set_str(*ctx().store, "typed/" + std::to_string(seen.size()) + "/" + std::to_string(ctx().rank), "x");
  });
  const std::vector<std::pair<bool, int64_t>> want = {{true, 1},  {true, 2},  {true, 3},
                                                      {false, 1}, {false, 2}, {false, 3}};
  EXPECT_EQ(seen, want);
  // Every rank ran every combination (the barrier after each one makes the keys visible).
  for (int r = 0; r < ctx().world_size; ++r) EXPECT_EQ(get_str(*ctx().store, "typed/6/" + std::to_string(r)), "x");
}

// The skip macros are single statements: an unbraced if/else around them keeps its meaning.
TDC_DIST_TEST(HarnessBasics, SkipMacrosAreSafeInUnbracedIfElse, .world_size = 1) {
  bool took_else = false;
  if (ctx().world_size == 2)
    TDC_SKIP_IF(true, "never: the if above is false");
  else
    took_else = true;
  EXPECT_TRUE(took_else) << "the else bound to TDC_SKIP_IF's own if";
  took_else = false;
  if (ctx().world_size == 2)
    TDC_REQUIRE_CAPABILITY("anything");
  else
    took_else = true;
  EXPECT_TRUE(took_else) << "the else bound to TDC_REQUIRE_CAPABILITY's own if";
}

// [Note: ranks from an external launcher]: torchrun's names first, SLURM's where they are absent,
// and a variable that is not an integer is named with its value.
TEST(HarnessUnit, ExternalRankReadsTorchrunThenSlurm) {
  const char* names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"};
  std::map<std::string, std::string> saved;
  for (const char* n : names)
    if (const char* v = std::getenv(n)) saved[n] = v;
  auto clear = [&] {
    for (const char* n : names) ::unsetenv(n);
  };
  clear();
  EXPECT_FALSE(tdc::harness::external_rank().has_value());
  ::setenv("SLURM_PROCID", "3", 1);
  ::setenv("SLURM_NTASKS", "4", 1);
  ::setenv("SLURM_LOCALID", "1", 1);
  auto r = tdc::harness::external_rank();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->rank, 3);
  EXPECT_EQ(r->world_size, 4);
  EXPECT_EQ(r->local_rank, 1);
  ::setenv("RANK", "0", 1);  // torchrun's names win
  ::setenv("WORLD_SIZE", "2", 1);
  r = tdc::harness::external_rank();
  EXPECT_EQ(r->rank, 0);
  EXPECT_EQ(r->world_size, 2);
  EXPECT_EQ(r->local_rank, 1);  // no LOCAL_RANK: SLURM_LOCALID
  ::setenv("RANK", "1x", 1);
  try {
    tdc::harness::external_rank();
    ADD_FAILURE() << "RANK=1x was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("RANK='1x'"), std::string::npos) << e.what();
  }
  clear();
  for (const auto& [n, v] : saved) ::setenv(n.c_str(), v.c_str(), 1);
}

TEST(HarnessUnit, ExpandGridIsCartesianLastKeyFastest) {
  auto g = expand_grid({{"x", {1, 2}}, {"s", {"a", "b"}}, {"f", {0.5}}});
  ASSERT_EQ(g.size(), 4u);
  EXPECT_EQ(g[0].str(), "x=1, s=a, f=0.5");
  EXPECT_EQ(g[1].str(), "x=1, s=b, f=0.5");
  EXPECT_EQ(g[3].str(), "x=2, s=b, f=0.5");
  EXPECT_EQ(g[2].get<int>("x"), 2);
  EXPECT_EQ(g[2].get<std::string>("s"), "a");
  EXPECT_THROW(g[0].get<int>("missing"), std::out_of_range);
  EXPECT_THROW(expand_grid({{"empty", {}}}), std::invalid_argument);
}

namespace {
// PyTorch's style: a typed test method as the body, one parameter per axis.
std::vector<std::string> g_typed_calls;
void typed_body(bool flag, int64_t big, double ratio, const std::string& name) {
  g_typed_calls.push_back(fmt::format("{}/{}/{}/{}", flag, big, ratio, name));
}
}  // namespace

TEST(HarnessUnit, TypedSubtestsDeliverTypedValuesInCartesianOrder) {
  g_typed_calls.clear();
  const int64_t big = int64_t{1} << 40;  // survives only as a 64-bit integer
  subtests(Axis<bool>("flag", {false, true}), Axis<int64_t>("big", {big, -1}), Axis<double>("ratio", {0.25}),
           Axis<std::string>("name", {"a b", "c"}), typed_body);
  const std::vector<std::string> want = {
      "false/1099511627776/0.25/a b", "false/1099511627776/0.25/c", "false/-1/0.25/a b", "false/-1/0.25/c",
      "true/1099511627776/0.25/a b",  "true/1099511627776/0.25/c",  "true/-1/0.25/a b",  "true/-1/0.25/c"};
  EXPECT_EQ(g_typed_calls, want);

  // A lambda works as well, and an axis can come from a vector built at run time.
  std::vector<int> sizes = {3, 1};
  std::vector<std::pair<int, float>> got;
  subtests(Axis<int>("size", sizes), Axis<float>("scale", {0.5f}),
           [&](int size, float scale) { got.emplace_back(size, scale); });
  EXPECT_EQ(got, (std::vector<std::pair<int, float>>{{3, 0.5f}, {1, 0.5f}}));
}

TEST(HarnessUnit, TypedSubtestsRejectAnEmptyAxisBeforeRunningAny) {
  int calls = 0;
  try {
    subtests(Axis<bool>("reshard", {true}), Axis<int64_t>("mlp_dim", std::vector<int64_t>{}),
             [&](bool, int64_t) { ++calls; });
    FAIL() << "an empty axis must throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'mlp_dim' has no values"), std::string::npos) << e.what();
  }
  EXPECT_EQ(calls, 0);
}

// A failure inside a subtest outside any rank is an ordinary GoogleTest failure, and the
// subtests after it still run.
TEST(HarnessUnit, TypedSubtestFailureDoesNotStopTheOthers) {
  std::vector<int64_t> ran;
  EXPECT_NONFATAL_FAILURE(subtests(Axis<int64_t>("n", {1, 2, 3}),
                                   [&](int64_t n) {
                                     ran.push_back(n);
                                     if (n == 2) throw std::runtime_error("n two");
                                   }),
                          "uncaught exception: n two");
  EXPECT_EQ(ran, (std::vector<int64_t>{1, 2, 3}));
}

TEST(HarnessUnit, CtxOutsideRankThrowsClearly) {
  EXPECT_FALSE(in_rank());
  try {
    ctx();
    FAIL() << "ctx() outside a rank must throw";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("outside a rank body"), std::string::npos);
  }
}

TEST(HarnessUnit, LauncherNames) {
  for (auto l : {Launcher::Fork, Launcher::Thread, Launcher::Spawn, Launcher::Env})
    EXPECT_EQ(launcher_from_string(to_string(l)), l);
  try {
    launcher_from_string("mpi");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'mpi'"), std::string::npos);
  }
}

// [Note: tests that need more GPUs than there are]: PyTorch's message, the count found, and why.
TEST(HarnessGpuSkip, PyTorchsMessageWithTheCountFound) {
  EXPECT_EQ(gpu_skip_reason("gloo", 4, 0, 0), "");  // CPU ranks need no GPU
  EXPECT_EQ(gpu_skip_reason("nccl", 1, 0, 1), "");  // one rank, one GPU
  EXPECT_EQ(gpu_skip_reason("nccl", 4, 0, 1),
            "Need at least 4 CUDA devices (backend nccl runs one rank per GPU, world size 4; this machine has 1)");
  EXPECT_EQ(gpu_skip_reason("gloo", 2, 1, 0), "Need at least 1 CUDA device (skip_if_lt_x_gpu(1); this machine has 0)");
  EXPECT_EQ(gpu_skip_reason("nccl", 2, 4, 2), "Need at least 4 CUDA devices (skip_if_lt_x_gpu(4); this machine has 2)");
  EXPECT_EQ(gpu_skip_reason("nccl", 8, 8, 8), "");
}
