// tdc harness: one GoogleTest body, run on N ranks.
//
//   TDC_DIST_SUITE(CommTest, .world_size = 4);          // defaults for every test of a suite
//   TDC_DIST_TEST(CommTest, AllReduceSum) {             // runs on every rank
//     auto& c = tdc::harness::ctx();                    // rank, world_size, store, temp_dir, ...
//     EXPECT_EQ(...);                                   // failures reach the parent as "[rank r] ..."
//   }
//   TDC_DIST_TEST(CommTest, Big, .world_size = 2, .timeout_s = 120) { ... }
//
// Launchers (flag --tdc_launcher / env TDC_LAUNCHER): fork (default), thread, spawn, env.
// See docs/writing-a-distributed-test.md. This header depends on LibTorch's c10d Store and
// GoogleTest only; it never includes tdc's implementation headers.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace tdc::harness {

enum class Launcher { Fork, Thread, Spawn, Env };
const char* to_string(Launcher l);
Launcher launcher_from_string(const std::string& s);  // throws std::invalid_argument

// Options of one distributed test. Zero / unset fields take the suite default, then the
// run default. Use designated initializers: TDC_DIST_TEST(S, N, .world_size = 2).
struct TestOptions {
  int world_size = 0;                  // ranks; default 4
  double timeout_s = 0;                // per-test deadline; default --tdc_timeout (60 s)
  std::optional<Launcher> launcher{};  // force a launcher (else the run's launcher)
  int num_threads = 0;                 // at::set_num_threads per rank; default 1
  std::optional<uint64_t> seed{};      // identical on every rank; default 1234
  int min_gpus = 0;                    // skip_if_lt_x_gpu(min_gpus) before any rank starts
  bool process_per_rank = false;       // ranks need a process each: forked under the thread launcher
};

// [Note: tests whose ranks need a process each] Rank threads share their process's state, ATen's
// default generator above all. A test that seeds it per rank (torch.manual_seed(1 + rank), as
// PyTorch's FSDPTest helpers do in each rank's own process) and then draws from it cannot run as
// threads: the last rank to seed sets everyone's numbers, and the verdict depends on scheduling.
// Such a test (or its suite) says `.process_per_rank = true`, as PyTorch's MultiProcessTestCase
// says it by its class: under the thread launcher its ranks fork instead (spawn where fork cannot
// serve, [Note: the parent never initialises CUDA]); the results name the launcher each test used
// and the run says so once. Forcing `.launcher = Launcher::Thread` on such a test is an error.

// What a rank sees. Valid inside a rank body (any launcher), on the rank's own thread.
struct RankContext {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  Launcher launcher = Launcher::Fork;
  std::string test_id;                    // "Suite.Name"
  c10::intrusive_ptr<c10d::Store> store;  // fresh rendezvous store for this test (all ranks)
  std::filesystem::path temp_dir;         // private (0700) per-test dir, removed afterwards
  std::string backend;                    // requested c10d backend ("gloo", "nccl", plug-in name)
  std::string backend_lib;                // plug-in library to load, or empty
  std::string device_type;                // "cpu" or "cuda"
  c10::Device device{c10::kCPU};          // this rank's device (cuda: local_rank % count)
  uint64_t seed = 1234;
  at::Generator rank_generator;  // a CPU generator seeded with seed + rank
};

// The calling rank's context; throws std::logic_error outside a rank body.
const RankContext& ctx();
bool in_rank();

// Store-based barrier over every rank of the current test (does not need a process group).
void barrier();

// Number of accelerator devices visible to this process (0 on a CPU-only build or host).
int device_count();

// [Note: tests that need more GPUs than there are] PyTorch's skip (common_distributed's
// TEST_SKIPS["multi-gpu-n"]: "Need at least n CUDA devices") with the number found: a test asks
// for `min_gpus` (skip_if_lt_x_gpu), and NCCL needs one GPU per rank (it refuses two ranks on one
// GPU), so backend "nccl" needs `world_size`. Empty when `gpus` suffice. Decided inside the rank
// (asking CUDA in a fork-launcher parent would break fork()).
std::string gpu_skip_reason(const std::string& backend, int world_size, int min_gpus, int gpus);

// ------------------------------------------------------------------ capabilities
// The implementation under test declares the features it has (e.g. "fsdp2.cpu_offload",
// "dtensor.strided_shard"); a test that needs one it lacks reports NOT_SUPPORTED, never PASS.
// Until an implementation declares anything, every capability is assumed present.
void declare_capabilities(const std::string& implementation, const std::vector<std::string>& features);
bool has_capability(const std::string& feature);

// ------------------------------------------------------------------ rank reports
// [Note: rank reports] What the implementation under test did, beyond pass or fail, that a run's
// results should say: e.g. which collectives each backend ran natively and which tdc emulated
// ([Note: which ops ran natively], tdc/comm/op_paths.h). A reporter registered here (once per
// process, by the implementation's conformance glue) is reset in each rank's process before the
// test body runs (once for the threads of a thread launch) and collected on each rank when the
// body ends, pass or fail. The parent keeps per reporter the union over ranks: results.json's
// tests[].reports, and the union over the run's tests, reports. A report is key -> set of values;
// a reporter that throws is skipped, its message on the rank's stderr.
struct RankReporter {
  std::function<void()> reset;
  std::function<std::map<std::string, std::set<std::string>>()> collect;
};
// Throws std::invalid_argument when `name` is empty or already registered.
void add_rank_reporter(const std::string& name, RankReporter reporter);

// ------------------------------------------------------------------ preflight
// Checks of a run's settings that must hold before any test starts: is the backend known, does
// the plug-in load, is there a device of the requested type? The implementation under test (its
// conformance glue) registers them; `--tdc_preflight` runs the harness's own checks and then
// these in the parent process and exits 0, or 2 with the first failing check's message, before
// any test runs. `tdc run` calls it first, so a run that cannot work stops with one message.
struct PreflightSettings {
  std::string backend;      // --tdc_backend
  std::string backend_lib;  // --tdc_backend_lib, or empty
  std::string device_type;  // --tdc_device
};
// A check throws (std::exception) with a message naming the setting and its value.
using PreflightCheck = void (*)(const PreflightSettings&);
void register_preflight(PreflightCheck check);

// ------------------------------------------------------------------ registration machinery
// What the macros expand to; not for direct use (GoogleTest keeps the same in testing::internal).
namespace internal {
using Body = void (*)();
void register_suite_options(const char* suite, const TestOptions& options);
// Runs `body` on every rank and reports the outcome to GoogleTest (failure / skip).
void run_distributed(const char* suite, const char* name, const TestOptions& options, Body body);

struct SuiteRegistrar {
  SuiteRegistrar(const char* suite, const TestOptions& o) { register_suite_options(suite, o); }
};
}  // namespace internal

}  // namespace tdc::harness

#define TDC_DIST_SUITE(Suite, ...)                                             \
  static ::tdc::harness::internal::SuiteRegistrar tdc_suite_registrar_##Suite( \
      #Suite, ::tdc::harness::TestOptions{__VA_ARGS__})

#define TDC_DIST_TEST(Suite, Name, ...)                                                                \
  static void Suite##_##Name##_TdcBody();                                                              \
  TEST(Suite, Name) {                                                                                  \
    ::tdc::harness::internal::run_distributed(#Suite, #Name, ::tdc::harness::TestOptions{__VA_ARGS__}, \
                                              &Suite##_##Name##_TdcBody);                              \
  }                                                                                                    \
  static void Suite##_##Name##_TdcBody()

// ------------------------------------------------------------------ skips (inside a rank body)
// A skip on any rank skips the test with its reason; ranks that disagree are reported.
// Safe as the statement of an unbraced if/else: the switch keeps a following `else` from binding
// to the macro's own if (GoogleTest's GTEST_AMBIGUOUS_ELSE_BLOCKER_).
#define TDC_SKIP_IF(cond, reason) \
  switch (0)                      \
  case 0:                         \
  default:                        \
    if (!(cond)) {                \
    } else                        \
      GTEST_SKIP() << reason

#define TDC_SKIP_IF_LT_X_GPU(n)                                                                     \
  TDC_SKIP_IF(!::tdc::harness::gpu_skip_reason("", 0, (n), ::tdc::harness::device_count()).empty(), \
              ::tdc::harness::gpu_skip_reason("", 0, (n), ::tdc::harness::device_count()))

#define TDC_SKIP_UNLESS_BACKEND(name)                  \
  TDC_SKIP_IF(::tdc::harness::ctx().backend != (name), \
              "needs backend '" << (name) << "', run uses '" << ::tdc::harness::ctx().backend << "'")

#define TDC_SKIP_UNLESS_DEVICE(type)                       \
  TDC_SKIP_IF(::tdc::harness::ctx().device_type != (type), \
              "needs device '" << (type) << "', run uses '" << ::tdc::harness::ctx().device_type << "'")

// The implementation under test lacks a feature: reported as NOT_SUPPORTED, never PASS.
#define TDC_NOT_SUPPORTED(feature) GTEST_SKIP() << "[NOT_SUPPORTED] " << feature

#define TDC_REQUIRE_CAPABILITY(feature)            \
  switch (0)                                       \
  case 0:                                          \
  default:                                         \
    if (::tdc::harness::has_capability(feature)) { \
    } else                                         \
      TDC_NOT_SUPPORTED(feature)
