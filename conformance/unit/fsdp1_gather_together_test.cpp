// Unit tests of [Note: FSDP1 gathers small flat parameters together] (impl/fsdp1/gather_together.cpp):
// summon_full_params (and the full state dict, which uses it) shows every unit's parameters bit for
// bit, writes them back, and issues one all-gather per run of small units on one group, dtype and
// device, where PyTorch issues one per unit.
#include <ATen/ATen.h>
#include <gmock/gmock.h>

#include "tdc/comm/debug_mode.h"
#include "tdc/conformance/checks.h"
#include "tdc/conformance/support.h"
#include "tdc/fsdp1/fully_sharded_data_parallel.h"
#include "tdc/harness/harness.h"
#include "tdc/nn/layers.h"

namespace {

using namespace tdc;
using conformance::assert_close;
using conformance::Tolerance;
using fsdp1::FullyShardedDataParallel;

// Every Linear its own unit, in the order the tree visits them: three small float32 ones (one
// run), one whose shard is over 64 KiB at worlds 2 and 3 (a gather of its own), a small float64
// one (its own: another dtype) and a small float32 one (a new run after the dtype changed).
constexpr int64_t kGathers = 4;
nn::ModulePtr make_units() {
  at::manual_seed(0);
  auto float64 = std::make_shared<nn::Linear>(9, 4);
  float64->to(at::kDouble);
  return std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(5, 7), std::make_shared<nn::Linear>(7, 3), std::make_shared<nn::Linear>(3, 9),
      std::make_shared<nn::Linear>(512, 128), float64, std::make_shared<nn::Linear>(4, 6)});
}

void expect_same_params(nn::Module& got, nn::Module& want, const char* when) {
  auto g = got.named_params();
  auto w = want.named_params();
  ASSERT_EQ(g.size(), w.size()) << when;
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_TRUE(assert_close(g[i].second, w[i].second, Tolerance{0, 0})) << when << ": " << g[i].first;
  }
}

void gathers_runs_of_small_units(bool use_orig_params) {
  conformance::world();
  auto model = make_units();
  auto original = conformance::reference_copy(*model);
  auto fsdp = FullyShardedDataParallel::make(
      model, {.auto_wrap_policy = fsdp1::always_wrap_policy(), .use_orig_params = use_orig_params});
  // The first summon runs the root's lazy init, whose plan exchange is two all-gathers more.
  { auto lazy_init = fsdp1::summon_full_params(*fsdp, {.writeback = false}); }
  {
    comm::CommDebugMode comms;
    auto guard = fsdp1::summon_full_params(*fsdp);
    EXPECT_EQ(comms.get_comm_counts()["c10d._allgather_base_"], kGathers);
    expect_same_params(*fsdp, *original, "inside summon_full_params");
    // Writeback: every parameter filled with a value of its own.
    at::NoGradGuard no_grad;
    double value = 1.0;
    for (auto& p : fsdp->params()) p.fill_(value++);
    value = 1.0;
    for (auto& p : original->params()) p.detach().fill_(value++);
  }
  {
    auto guard = fsdp1::summon_full_params(*fsdp, {.writeback = false});
    expect_same_params(*fsdp, *original, "after writeback");
  }
  // The full state dict holds the same values.
  auto full = fsdp->state_dict();
  for (auto& [name, p] : original->named_params()) {
    EXPECT_TRUE(assert_close(tensor::as_tensor(full, name), p, Tolerance{0, 0})) << name;
  }
}

TDC_DIST_TEST(FSDP1GatherTogetherTest, RunsOfSmallUnitsWorld2, .world_size = 2) {
  gathers_runs_of_small_units(false);
  gathers_runs_of_small_units(true);
}

TDC_DIST_TEST(FSDP1GatherTogetherTest, RunsOfSmallUnitsWorld3, .world_size = 3) { gathers_runs_of_small_units(false); }

}  // namespace
