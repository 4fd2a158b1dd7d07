// Unit tests of [Note: gathers by all-to-all] (tdc/comm/backend_registry.h): on Gloo, every
// all-gather that does not go by sends and receives, and every small SUM or AVG all-reduce of a
// floating-point or integer tensor, runs as one all-to-all of the input repeated n times. The
// all-gather must return Gloo's bytes; the all-reduce Gloo's own sum bit for bit (the order of its
// ring), signed zeros, infinities and NaN included, at every world size, dtype and size.
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

#include "comm_bits.h"

// A named namespace: the comm unit tests share one unity TU, where helpers in anonymous
// namespaces of two files would collide.
namespace gather_by_alltoall_test {

using namespace tdc::comm;
using namespace tdc_comm_bits;

TDC_DIST_SUITE(GatherByAllToAllTest, .world_size = 3);

constexpr int64_t kSmall = ProcessGroup::kSmallInputBytes;

// Gloo's own all-reduce of `in` with `op` (SUM, MAX, ...).
at::Tensor gloo_all_reduce(const GroupPtr& g, const at::Tensor& in, c10d::ReduceOp::RedOpType op) {
  std::vector<at::Tensor> buf{in.clone()};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp(op);
  g->backend().allreduce(buf, opts)->wait();
  return buf[0];
}

bool ran(const std::string& key, const char* op) { return op_paths()[key].count(op) == 1; }

// ------------------------------------------------------------------------------ all-gather

void gathers_what_gloo_gathers() {
  GroupPtr g = tdc::conformance::world();
  const int n = g->size();
  for (at::ScalarType dt : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong, at::kByte, at::kBool}) {
    // One element, an odd count, just under the large-input threshold, and (by sends and
    // receives over three or more ranks, by all-to-all over two) at it.
    for (int64_t numel : {int64_t{1}, int64_t{7}, numel_in(kSmall, dt) - 1, numel_in(kSmall, dt)}) {
      SCOPED_TRACE(fmt::format("world {}, {}, {} elements per rank", n, c10::toString(dt), numel));
      const at::Tensor in = random_bits(numel, dt, 500 + 7 * g->rank() + numel);
      const bool by_alltoall = n == 2 || static_cast<int64_t>(in.nbytes()) < kSmall;
      EXPECT_EQ(g->all_gather_by_alltoall(static_cast<int64_t>(in.nbytes())), by_alltoall);
      reset_op_paths();
      at::Tensor mine = at::empty({n * numel}, in.options());
      all_gather_into_tensor(mine, in, g);
      EXPECT_TRUE(ran("gloo.emulated", "all_gather_into_tensor")) << "results.json's comm_ops: tdc's, not Gloo's";
      EXPECT_FALSE(ran("gloo.native", "all_gather_into_tensor"));
      EXPECT_TRUE(same_bytes(mine, gloo_all_gather(g, in)));
    }
  }
  // A stacked [n, rows, cols] output of a 2-D input, not contiguous: staged and copied back.
  const at::Tensor in = random_bits(6 * 5, at::kFloat, 5 + g->rank()).view({6, 5});
  at::Tensor big = at::empty({n, 5, 12});
  at::Tensor out = big.narrow(2, 0, 6).transpose(1, 2);  // [n, 6, 5], strided
  all_gather_into_tensor(out, in, g);
  EXPECT_TRUE(same_bytes(out.reshape({-1}), gloo_all_gather(g, in)));
  // In place: the input is the rank's own block of the output, as FSDP1 gathers its flat
  // parameter and FSDP2 its shards (the gathers then skip the own-block copy: copy_own_block).
  for (int64_t numel : {int64_t{5}, numel_in(kSmall, at::kFloat)}) {
    at::Tensor flat = at::empty({n * numel});
    at::Tensor own = flat.narrow(0, g->rank() * numel, numel);
    own.copy_(random_bits(numel, at::kFloat, 77 + g->rank()));
    const at::Tensor expected = gloo_all_gather(g, own.clone());
    all_gather_into_tensor(flat, own, g);
    EXPECT_TRUE(same_bytes(flat, expected)) << "in place, " << numel << " elements per rank";
  }
}

TDC_DIST_TEST(GatherByAllToAllTest, AllGatherWorldSize2, .world_size = 2) { gathers_what_gloo_gathers(); }
TDC_DIST_TEST(GatherByAllToAllTest, AllGatherWorldSize3) { gathers_what_gloo_gathers(); }
TDC_DIST_TEST(GatherByAllToAllTest, AllGatherWorldSize5, .world_size = 5) { gathers_what_gloo_gathers(); }

// An empty input has nothing to exchange: Gloo's own op, which returns at once.
TDC_DIST_TEST(GatherByAllToAllTest, EmptyInputKeepsGloosOp, .world_size = 2) {
  GroupPtr g = tdc::conformance::world();
  EXPECT_FALSE(g->all_gather_by_alltoall(0));
  at::Tensor out = at::empty({0});
  all_gather_into_tensor(out, at::empty({0}), g);
  EXPECT_EQ(out.numel(), 0);
}

// ------------------------------------------------------------------------------ all-reduce

void sums_what_gloo_sums(const std::vector<int64_t>& sizes) {
  GroupPtr g = tdc::conformance::world();
  const int n = g->size(), r = g->rank();
  for (int64_t numel : sizes) {
    const at::Tensor x = summands(numel, n, r, 31 + 1000 * r + numel);
    for (at::ScalarType dt : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
      const at::Tensor in = x.to(dt);
      const at::Tensor gloo_sum = gloo_all_reduce(g, in, c10d::ReduceOp::SUM);
      for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG}) {
        SCOPED_TRACE(fmt::format("world {}, {} elements, {} {}", n, numel, c10::toString(dt), to_string(op)));
        const bool small = static_cast<int64_t>(in.nbytes()) < kSmall;
        EXPECT_EQ(g->all_reduce_by_alltoall(op, in), small);
        reset_op_paths();
        at::Tensor mine = in.clone();
        all_reduce(mine, op, g);
        EXPECT_EQ(ran("gloo.emulated", "all_reduce"), small) << "results.json's comm_ops: tdc's, or Gloo's";
        EXPECT_EQ(ran("gloo.native", "all_reduce"), !small);
        expect_same_bits(mine, op == ReduceOp::AVG ? gloo_sum / n : gloo_sum, "Gloo's all-reduce");
      }
    }
    // Integers: any order gives the same sum; the bytes must still be Gloo's (wrapping included).
    const at::Tensor ints = (x * 1e-10).to(at::kLong) * (int64_t{1} << 40);
    at::Tensor mine = ints.clone();
    all_reduce(mine, ReduceOp::SUM, g);
    EXPECT_TRUE(same_bytes(mine, gloo_all_reduce(g, ints, c10d::ReduceOp::SUM))) << numel << " int64";
  }
}

// Sizes: fewer elements than ranks (empty ring blocks), a few, odd counts, and the largest small
// float32 input (the ring then has more than one element per block).
TDC_DIST_TEST(GatherByAllToAllTest, AllReduceSumsWhatGlooSumsWorldSize2, .world_size = 2) {
  sums_what_gloo_sums({1, 3, 1001, numel_in(kSmall, at::kFloat) - 1});
}
TDC_DIST_TEST(GatherByAllToAllTest, AllReduceSumsWhatGlooSumsWorldSize3) {
  sums_what_gloo_sums({1, 2, 7, 1001, numel_in(kSmall, at::kFloat) - 1});
}
TDC_DIST_TEST(GatherByAllToAllTest, AllReduceSumsWhatGlooSumsWorldSize4, .world_size = 4) {
  sums_what_gloo_sums({1, 3, 9, 1000});
}
TDC_DIST_TEST(GatherByAllToAllTest, AllReduceSumsWhatGlooSumsWorldSize5, .world_size = 5) {
  sums_what_gloo_sums({2, 777});
}

// What keeps Gloo's own all-reduce: a large input, MAX and MIN (no order to keep), bool and
// complex tensors (not summed by tdc); the results are Gloo's.
TDC_DIST_TEST(GatherByAllToAllTest, OthersKeepGloosAllReduce) {
  GroupPtr g = tdc::conformance::world();
  const int n = g->size(), r = g->rank();
  const at::Tensor large = summands(numel_in(kSmall, at::kFloat), n, r, 31 + 1000 * r).to(at::kFloat);
  EXPECT_FALSE(g->all_reduce_by_alltoall(ReduceOp::SUM, large)) << "at the threshold: large";
  EXPECT_FALSE(g->all_reduce_by_alltoall(ReduceOp::MAX, large.narrow(0, 0, 4)));
  EXPECT_FALSE(g->all_reduce_by_alltoall(ReduceOp::MIN, large.narrow(0, 0, 4)));
  EXPECT_FALSE(g->all_reduce_by_alltoall(ReduceOp::SUM, at::ones({4}, at::kBool)));
  EXPECT_FALSE(g->all_reduce_by_alltoall(ReduceOp::SUM, at::ones({4}, at::kComplexFloat)));
  EXPECT_FALSE(g->all_reduce_by_alltoall(ReduceOp::SUM, at::empty({0})));
  reset_op_paths();
  at::Tensor mine = large.clone();
  all_reduce(mine, ReduceOp::SUM, g);
  EXPECT_TRUE(ran("gloo.native", "all_reduce"));
  EXPECT_FALSE(ran("gloo.emulated", "all_reduce"));
  expect_same_bits(mine, gloo_all_reduce(g, large, c10d::ReduceOp::SUM), "Gloo's all-reduce");
  at::Tensor small_max = large.narrow(0, 0, 100).clone();
  all_reduce(small_max, ReduceOp::MAX, g);
  expect_same_bits(small_max, gloo_all_reduce(g, large.narrow(0, 0, 100), c10d::ReduceOp::MAX), "Gloo's MAX");
}

// The inputs tell orders apart: over three ranks, a sum in rank order has other float32 bits than
// Gloo's in many elements (so the checks above could fail on a wrong order).
TDC_DIST_TEST(GatherByAllToAllTest, RankOrderWouldDiffer) {
  GroupPtr g = tdc::conformance::world();
  const int n = g->size();
  const int64_t numel = 3001;
  at::Tensor rank_order = at::zeros({numel});
  for (int k = 0; k < n; ++k) rank_order.add_(summands(numel, n, k, 31 + 1000 * k + numel).to(at::kFloat));
  const at::Tensor gloo = gloo_all_reduce(
      g, summands(numel, n, g->rank(), 31 + 1000 * g->rank() + numel).to(at::kFloat), c10d::ReduceOp::SUM);
  EXPECT_GT((at::ne(rank_order, gloo) & ~at::isnan(gloo)).sum().item<int64_t>(), 30);
}

// Several all-reduces in flight at once, waited for in reverse order: each gets its own sum.
TDC_DIST_TEST(GatherByAllToAllTest, AllReducesInFlightKeepApart, .world_size = 4) {
  GroupPtr g = tdc::conformance::world();
  const int n = g->size(), r = g->rank();
  std::vector<at::Tensor> ts;
  std::vector<Work> works;
  for (int k = 0; k < 4; ++k) {
    ts.push_back(at::full({5 + k}, static_cast<double>(10 * k + r), at::kDouble));
    works.push_back(all_reduce(ts.back(), k % 2 == 0 ? ReduceOp::SUM : ReduceOp::AVG, g, /*async_op=*/true));
  }
  for (int k = 3; k >= 0; --k) {
    works[k].wait();
    const double sum = 10.0 * k * n + n * (n - 1) / 2.0;
    EXPECT_TRUE(at::equal(ts[k], at::full({5 + k}, k % 2 == 0 ? sum : sum / n, at::kDouble))) << "all-reduce " << k;
  }
}

}  // namespace gather_by_alltoall_test
