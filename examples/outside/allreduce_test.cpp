// A distributed test in a project of its own, built against an installed tdc (find_package(tdc))
// and run by `tdc run --binary` (docs/writing-a-distributed-test.md, "Where a test goes").
#include <ATen/ATen.h>

#include "tdc/comm/collectives.h"
#include "tdc/conformance/support.h"
#include "tdc/harness/harness.h"

TDC_DIST_SUITE(OutsideTest, .world_size = 2);

TDC_DIST_TEST(OutsideTest, AllReduceSums) {
  at::Tensor t = at::full({4}, tdc::harness::ctx().rank + 1.0);
  tdc::comm::all_reduce(t, tdc::comm::ReduceOp::SUM, tdc::conformance::world());
  EXPECT_TRUE(t.equal(at::full({4}, 3.0))) << t;
}

TDC_DIST_TEST(OutsideTest, AllGatherInRankOrder, .world_size = 3) {
  const int rank = tdc::harness::ctx().rank;
  at::Tensor mine = at::full({2}, static_cast<double>(rank));
  at::Tensor all = at::empty({6}, mine.options());
  tdc::comm::all_gather_into_tensor(all, mine, tdc::conformance::world());
  EXPECT_TRUE(all.equal(at::tensor({0.0, 0.0, 1.0, 1.0, 2.0, 2.0}, mine.options()))) << all;
}
