// Unit tests of tdc::comm::detail::all_gather_coalesced, the all-gather FSDP2 unshards with:
// [Note: all-gathers into their destinations] (tdc/comm/backend_registry.h). Rank r's inputs[i]
// must land in outputs[r][i] (strided outputs too) on each of its two ways (Gloo's own
// allgather_coalesced, and the flat all-gather plus copy-out every other backend gets), counted
// and patched as the one all_gather_into_tensor it stands for, with bad outputs named.
#include <ATen/ATen.h>
#include <gmock/gmock.h>

#include "tdc/comm/collectives.h"
#include "tdc/comm/debug_mode.h"
#include "tdc/comm/detail/collectives.h"
#include "tdc/comm/process_group.h"
#include "tdc/comm/testing.h"
#include "tdc/conformance/checks.h"
#include "tdc/conformance/support.h"
#include "tdc/harness/harness.h"
#include "tdc/harness/subtests.h"

namespace gather_into_test {

using tdc::comm::GroupPtr;
using ::testing::HasSubstr;

// Rank k's two inputs: a [2, 3] matrix and a [4] vector, distinct per rank and element.
std::vector<at::Tensor> inputs_of(int k, at::ScalarType dt) {
  return {(at::arange(6, at::kDouble).view({2, 3}) + 10 * k).to(dt), (at::arange(4, at::kDouble) - 100 * k).to(dt)};
}

// Destinations as FSDP2's are for a parameter sharded on dim 1: rank r's [2, 3] is a strided
// slice of one [3, 2n] matrix (transposed); the vectors are the rows of one [n, 4] matrix.
struct Destinations {
  at::Tensor matrices, vectors;
  std::vector<std::vector<at::Tensor>> outputs;
  Destinations(int n, at::ScalarType dt)
      : matrices(at::zeros({3, 2 * n}, at::TensorOptions().dtype(dt))),
        vectors(at::zeros({n, 4}, at::TensorOptions().dtype(dt))) {
    for (int r = 0; r < n; ++r) outputs.push_back({matrices.narrow(1, 2 * r, 2).t(), vectors[r]});
  }
  // Every rank's inputs where they belong.
  void expect_gathered(int n, at::ScalarType dt) const {
    for (int r = 0; r < n; ++r) {
      const std::vector<at::Tensor> want = inputs_of(r, dt);
      EXPECT_TRUE(at::equal(matrices.narrow(1, 2 * r, 2).t(), want[0])) << "rank " << r << "'s matrix";
      EXPECT_TRUE(at::equal(vectors[r], want[1])) << "rank " << r << "'s vector";
    }
  }
};

TDC_DIST_SUITE(AllGatherCoalescedTest, .world_size = 3);

TDC_DIST_TEST(AllGatherCoalescedTest, EachRanksInputsLandInItsOutputs, .world_size = 3) {
  GroupPtr world = tdc::conformance::world();
  const int n = world->size();
  std::vector<int> everyone{0, 1, 2};
  GroupPtr flat = tdc::comm::new_group(everyone);
  flat->use_emulations();
  EXPECT_EQ(world->all_gather_coalesced_into_outputs(), world->backend_name() == "gloo");
  EXPECT_FALSE(flat->all_gather_coalesced_into_outputs());
  tdc::harness::subtests(
      {{"way", {std::string("backend"), std::string("flat")}},
       {"dtype", {std::string("float32"), std::string("bfloat16"), std::string("int64")}},
       {"async_op", {false, true}}},
      [&](const tdc::harness::Params& p) {
        const std::string dtype = p.get<std::string>("dtype");
        const at::ScalarType dt = dtype == "float32" ? at::kFloat : dtype == "bfloat16" ? at::kBFloat16 : at::kLong;
        const GroupPtr& g = p.get<std::string>("way") == "backend" ? world : flat;
        Destinations d(n, dt);
        const int64_t before = d.matrices._version();
        tdc::comm::CommDebugMode mode;
        tdc::comm::Work w =
            tdc::comm::detail::all_gather_coalesced(d.outputs, inputs_of(g->rank(), dt), g, p.get<bool>("async_op"));
        w.wait();
        d.expect_gathered(n, dt);
        EXPECT_EQ(mode.get_comm_counts(), (std::map<std::string, int64_t>{{"c10d._allgather_base_", 1}}));
        EXPECT_EQ(mode.get_comm_bytes().at("c10d._allgather_base_"), 10 * at::elementSize(dt));
        EXPECT_EQ(d.matrices._version(), before + n) << "each output's version bumped once";
      });
}

// A test that patches all_gather_into_tensor (PyTorch's patch_all_gather) sees this all-gather as
// the one flat all_gather_into_tensor it stands for; the outputs are still filled.
TDC_DIST_TEST(AllGatherCoalescedTest, PatchSeesOneFlatAllGather, .world_size = 3) {
  GroupPtr g = tdc::conformance::world();
  const int n = g->size();
  std::vector<int64_t> seen;
  tdc::comm::PatchAllGather patch([&](at::Tensor& output, const at::Tensor& input, const GroupPtr&, bool,
                                      const std::function<tdc::comm::Work()>& original) {
    seen = {output.numel(), input.numel()};
    return original();
  });
  Destinations d(n, at::kFloat);
  tdc::comm::detail::all_gather_coalesced(d.outputs, inputs_of(g->rank(), at::kFloat), g, false);
  EXPECT_EQ(seen, (std::vector<int64_t>{10 * n, 10}));
  d.expect_gathered(n, at::kFloat);
}

// Outputs that do not match the inputs are named, on every rank, before anything is exchanged.
TDC_DIST_TEST(AllGatherCoalescedTest, BadOutputsAreNamed, .world_size = 3) {
  GroupPtr g = tdc::conformance::world();
  const int n = g->size();
  Destinations d(n, at::kFloat);
  d.outputs[1][0] = d.matrices.narrow(1, 2, 2);  // [3, 2], where the input is [2, 3]
  EXPECT_THAT(tdc::conformance::error_of([&] {
                tdc::comm::detail::all_gather_coalesced(d.outputs, inputs_of(g->rank(), at::kFloat), g, false);
              }),
              HasSubstr("output [1][0] is float32[3, 2], expected float32[2, 3] (input 0)"));
  d.outputs.pop_back();
  EXPECT_THAT(tdc::conformance::error_of([&] {
                tdc::comm::detail::all_gather_coalesced(d.outputs, inputs_of(g->rank(), at::kFloat), g, false);
              }),
              HasSubstr("2 output lists, expected one per rank (3)"));
  EXPECT_TRUE(at::equal(d.vectors, at::zeros({n, 4}))) << "nothing was written";
}

}  // namespace gather_into_test
