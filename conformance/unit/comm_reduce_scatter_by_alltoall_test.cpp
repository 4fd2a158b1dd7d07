// Unit tests of [Note: a reduce-scatter by all-to-all, in the ring's order]
// (tdc/comm/backend_registry.h): on Gloo, a SUM or AVG reduce-scatter runs as one all-to-all plus a
// local sum in the order of Gloo's ring all-reduce. It must return Gloo's own bits at every world
// size, dtype and size, signed zeros, infinities and NaN included.
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tdc/comm/collectives.h"
#include "tdc/comm/op_paths.h"
#include "tdc/comm/process_group.h"
#include "tdc/conformance/support.h"
#include "tdc/harness/harness.h"
#include "tdc/libtorch_compat.h"

#include "comm_bits.h"

namespace {

using namespace tdc::comm;
using tdc_comm_bits::expect_same_bits;
using tdc_comm_bits::summands;

TDC_DIST_SUITE(ReduceScatterByAllToAllTest, .world_size = 3);

// Rank `rank`'s input of a reduce-scatter of n chunks of `chunk` elements.
at::Tensor contribution(int64_t chunk, int n, int rank) {
  return summands(n * chunk, n, rank, 77 + 1000 * rank + chunk);
}

// Gloo's all-reduce of `in` (SUM), rank `rank`'s chunk of it: what Gloo's reduce-scatter returns.
at::Tensor gloo_all_reduce_chunk(const GroupPtr& g, const at::Tensor& in) {
  std::vector<at::Tensor> buf{in.clone()};
  g->backend().allreduce(buf)->wait();
  return buf[0].view({g->size(), -1})[g->rank()];
}

at::Tensor gloo_reduce_scatter(const GroupPtr& g, const at::Tensor& in) {
  at::Tensor out = at::empty({in.numel() / g->size()}, in.options()), in_copy = in.clone();
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = c10d::ReduceOp(c10d::ReduceOp::SUM);
  g->backend()._reduce_scatter_base(out, in_copy, opts)->wait();
  return out;
}

void sums_what_gloo_sums(std::vector<int64_t> chunks) {
  GroupPtr g = tdc::conformance::world();
  const int n = g->size(), r = g->rank();
  ASSERT_TRUE(g->reduce_scatter_by_alltoall(ReduceOp::SUM));
  ASSERT_TRUE(g->reduce_scatter_by_alltoall(ReduceOp::AVG));
  ASSERT_FALSE(g->reduce_scatter_by_alltoall(ReduceOp::MAX)) << "MAX and MIN keep Gloo's op: no order to keep";
  for (int64_t chunk : chunks) {
    const at::Tensor x = contribution(chunk, n, r);
    for (at::ScalarType dt : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
      const at::Tensor in = x.to(dt);
      const at::Tensor by_all_reduce = gloo_all_reduce_chunk(g, in);
      const at::Tensor native = tdc::compat::kGlooReduceScatterHonoursOp ? gloo_reduce_scatter(g, in) : at::Tensor();
      for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG}) {
        SCOPED_TRACE(fmt::format("world {}, {} elements per rank, {} {}", n, chunk, c10::toString(dt), to_string(op)));
        reset_op_paths();
        at::Tensor mine = at::empty({chunk}, in.options());
        reduce_scatter_tensor(mine, in, op, g);
        EXPECT_EQ(op_paths()["gloo.emulated"].count("reduce_scatter_tensor"), 1u)
            << "results.json's comm_ops lists it as tdc's";
        const int64_t divisor = op == ReduceOp::AVG ? n : 1;
        expect_same_bits(mine, by_all_reduce / divisor, "Gloo's all-reduce");
        if (native.defined()) expect_same_bits(mine, native / divisor, "Gloo's reduce-scatter");
      }
      // In place: the output is the rank's own chunk of the input.
      at::Tensor whole = in.clone();
      at::Tensor own = whole.view({n, -1})[r];
      reduce_scatter_tensor(own, whole, ReduceOp::SUM, g);
      expect_same_bits(own, by_all_reduce, "Gloo's all-reduce, in place");
    }
  }
}

// Sizes: fewer elements than ranks (empty ring blocks), a few, an odd count around 64 KiB, and
// one above Gloo's 1 MiB segment times 2n (more than two segments per rank, float32).
TDC_DIST_TEST(ReduceScatterByAllToAllTest, SumsWhatGlooSumsWorldSize2, .world_size = 2) {
  sums_what_gloo_sums({1, 3, 1000, 16391});
}
TDC_DIST_TEST(ReduceScatterByAllToAllTest, SumsWhatGlooSumsWorldSize3) { sums_what_gloo_sums({1, 2, 1001, 16391}); }
TDC_DIST_TEST(ReduceScatterByAllToAllTest, SumsWhatGlooSumsWorldSize4, .world_size = 4) {
  sums_what_gloo_sums({1, 5, 1000, 16391});
}
TDC_DIST_TEST(ReduceScatterByAllToAllTest, SumsWhatGlooSumsWorldSize5, .world_size = 5) {
  sums_what_gloo_sums({3, 777});
}

// Large enough for several of Gloo's 1 MiB segments per rank (the ring's blocks are then whole
// segments, not the reduce-scatter's chunks): float32 only, to keep the test short.
TDC_DIST_TEST(ReduceScatterByAllToAllTest, ManySegmentsPerRank) {
  GroupPtr g = tdc::conformance::world();
  const int64_t chunk = 600001;  // 3 x 2.4 MB: 9 segments of Gloo's ring, 3 per rank
  const at::Tensor in = contribution(chunk, g->size(), g->rank()).to(at::kFloat);
  at::Tensor mine = at::empty({chunk});
  reduce_scatter_tensor(mine, in, ReduceOp::SUM, g);
  expect_same_bits(mine, gloo_all_reduce_chunk(g, in), "Gloo's all-reduce");
}

// The inputs tell orders apart: over three ranks, summing in rank order gives other bits than
// Gloo in float32 on ranks 0 and 1 (so the checks above could fail on a wrong order). On the last
// rank the ring's order for its block is rank order, (x1 + x0) + x2.
TDC_DIST_TEST(ReduceScatterByAllToAllTest, RankOrderWouldDiffer) {
  GroupPtr g = tdc::conformance::world();
  const int n = g->size(), r = g->rank();
  const int64_t chunk = 1001;
  const at::Tensor in = contribution(chunk, n, r).to(at::kFloat);
  at::Tensor rank_order = at::zeros({chunk});
  for (int k = 0; k < n; ++k) rank_order.add_(contribution(chunk, n, k).to(at::kFloat).view({n, -1})[r]);
  const at::Tensor gloo = gloo_all_reduce_chunk(g, in);
  const at::Tensor differ = at::ne(rank_order, gloo) & ~at::isnan(gloo);
  if (r < n - 1) {
    EXPECT_GT(differ.sum().item<int64_t>(), 10) << "rank " << r;
  }
}

}  // namespace
