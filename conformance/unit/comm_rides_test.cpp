// Unit tests of [Note: a small collective rides with its check] (impl/comm/checks.cpp): on a
// group of CPU tensors, a small all-reduce, all-gather, reduce-scatter or broadcast travels inside
// its argument check's exchange. It must return the bits the same op returns without checks (its
// own exchange), take no second exchange, and a disagreement must still fail on every rank, never
// hang, also when one rank's data fits in the check's frame and another's does not.
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tdc/comm/argument_checks.h"
#include "tdc/comm/collectives.h"
#include "tdc/comm/op_paths.h"
#include "tdc/comm/process_group.h"
#include "tdc/conformance/support.h"
#include "tdc/harness/harness.h"

#include "comm_bits.h"

// A named namespace: the comm unit tests share one unity TU.
namespace rides_test {

using namespace tdc::comm;
using namespace tdc_comm_bits;
using ::testing::HasSubstr;

TDC_DIST_SUITE(RidesTest, .world_size = 3);

// The kRideBytes of impl/comm/checks.h: what fits in a check's frame per destination.
constexpr int64_t kRide = 4096;

// Runs `op` with checks on and returns how many exchanges and rides it took on this thread.
template <class Fn>
ArgumentCheckCounts counted(Fn op) {
  const ArgumentCheckCounts before = argument_check_counts();
  op();
  const ArgumentCheckCounts after = argument_check_counts();
  return {after.checks - before.checks, after.rides - before.rides};
}

// One collective, run twice on copies of the same inputs: with checks on (where it rides when
// small) and off (its own exchange). Returns the results of both.
struct Both {
  at::Tensor checked, unchecked;
  ArgumentCheckCounts counts;
};
template <class Fn>
Both both_ways(Fn op) {
  Both b;
  b.counts = counted([&] { b.checked = op(); });
  ScopedArgumentChecks off(false);
  b.unchecked = op();
  return b;
}

void expect_ride(const Both& b, bool rides, const std::string& what) {
  EXPECT_EQ(b.counts.checks, 1) << what << ": one check";
  EXPECT_EQ(b.counts.rides, rides ? 1 : 0) << what << (rides ? ": rode with its check" : ": too large to ride");
  expect_same_bits(b.checked, b.unchecked, what + ", checked against unchecked");
}

void rides_return_the_same_bits() {
  GroupPtr g = tdc::conformance::world();
  const int n = g->size(), me = g->rank();
  ASSERT_TRUE(argument_checks());
  // Just fits, and one element more than fits (per destination: a reduce-scatter sends each rank
  // its chunk only, so its input may be n times larger).
  for (int64_t bytes : {int64_t{8}, kRide, kRide + 8}) {
    const bool fits = bytes <= kRide;
    const int64_t k = bytes / 8;
    SCOPED_TRACE(fmt::format("world {}, {} bytes per destination", n, bytes));
    expect_ride(both_ways([&] {
                  at::Tensor t = summands(k, n, me, 40 + bytes);
                  all_reduce(t, ReduceOp::SUM, g);
                  return t;
                }),
                fits, "all_reduce SUM");
    expect_ride(both_ways([&] {
                  at::Tensor t = summands(k, n, me, 50 + bytes);
                  all_reduce(t, ReduceOp::AVG, g);
                  return t;
                }),
                fits, "all_reduce AVG");
    expect_ride(both_ways([&] {
                  const at::Tensor in = random_bits(k, at::kDouble, 60 + me);
                  at::Tensor out = at::empty({n * k}, at::kDouble);
                  all_gather_into_tensor(out, in, g);
                  return out;
                }),
                fits, "all_gather_into_tensor");
    expect_ride(both_ways([&] {
                  const at::Tensor in = summands(n * k, n, me, 70 + bytes);
                  at::Tensor out = at::empty({k}, at::kDouble);
                  reduce_scatter_tensor(out, in, ReduceOp::SUM, g);
                  return out;
                }),
                fits, "reduce_scatter_tensor SUM");
    expect_ride(both_ways([&] {
                  at::Tensor t = random_bits(k, at::kDouble, 80 + me);
                  broadcast(t, n - 1, g);
                  return t;
                }),
                fits, "broadcast from the last rank");
  }
  // A non-contiguous output (staged and copied back) and an in-place all-gather.
  expect_ride(both_ways([&] {
                const at::Tensor in = random_bits(6, at::kFloat, 90 + me).view({2, 3});
                at::Tensor out = at::zeros({3, n * 2}).t();  // [2n, 3], strided
                all_gather_into_tensor(out, in, g);
                return out.contiguous();
              }),
              true, "all_gather_into_tensor, strided output");
  expect_ride(both_ways([&] {
                at::Tensor flat = at::zeros({n * 5});
                at::Tensor own = flat.narrow(0, me * 5, 5);
                own.copy_(random_bits(5, at::kFloat, 95 + me));
                all_gather_into_tensor(flat, own, g);
                return flat;
              }),
              true, "all_gather_into_tensor in place");
  // Ops that do not go by all-to-all are checked but keep their own exchange.
  expect_ride(both_ways([&] {
                at::Tensor t = summands(4, n, me, 99);
                all_reduce(t, ReduceOp::MAX, g);
                return t;
              }),
              false, "all_reduce MAX");
}

TDC_DIST_TEST(RidesTest, ReturnTheSameBitsWorldSize2, .world_size = 2) { rides_return_the_same_bits(); }
TDC_DIST_TEST(RidesTest, ReturnTheSameBitsWorldSize3) { rides_return_the_same_bits(); }

// A broadcast that rode ran as tdc's exchange, not Gloo's broadcast: results.json's comm_ops say so.
TDC_DIST_TEST(RidesTest, ABroadcastThatRodeIsTdcs, .world_size = 2) {
  GroupPtr g = tdc::conformance::world();
  auto ran = [](const std::string& key) { return op_paths()[key].count("broadcast") == 1; };
  reset_op_paths();
  at::Tensor small = at::full({4}, static_cast<float>(g->rank()));
  broadcast(small, 0, g);
  EXPECT_TRUE(at::equal(small, at::zeros({4})));
  EXPECT_TRUE(ran("gloo.emulated"));
  EXPECT_FALSE(ran("gloo.native"));
  reset_op_paths();
  at::Tensor large = at::full({kRide / 4 + 1}, static_cast<float>(g->rank()));
  broadcast(large, 1, g);
  EXPECT_TRUE(at::equal(large, at::ones({kRide / 4 + 1})));
  EXPECT_TRUE(ran("gloo.native"));
  EXPECT_FALSE(ran("gloo.emulated"));
}

// With checks off nothing is exchanged for them, and nothing rides.
TDC_DIST_TEST(RidesTest, NoneWithChecksOff, .world_size = 2) {
  GroupPtr g = tdc::conformance::world();
  ScopedArgumentChecks off(false);
  const ArgumentCheckCounts c = counted([&] {
    at::Tensor t = at::ones({4});
    all_reduce(t, ReduceOp::SUM, g);
    EXPECT_TRUE(at::equal(t, at::full({4}, 2.0f)));
  });
  EXPECT_EQ(c.checks, 0);
  EXPECT_EQ(c.rides, 0);
}

// Ranks that disagree fail alike, whether their data would ride or not; the group stays usable.
void disagreements_fail_on_every_rank() {
  GroupPtr g = tdc::conformance::world();
  const int me = g->rank();
  auto expect_error = [](auto fn, const std::string& part) {
    try {
      fn();
      ADD_FAILURE() << "no exception; expected one containing '" << part << "'";
    } catch (const std::exception& e) {
      EXPECT_THAT(e.what(), HasSubstr(part));
    }
  };
  // Rank 0's tensor fits in the frame, the others' do not.
  const int64_t big = kRide / 4 * 2;
  expect_error(
      [&] {
        at::Tensor t = at::zeros({me == 0 ? 8 : big});
        all_reduce(t, ReduceOp::SUM, g);
      },
      fmt::format("ranks disagree on the tensor: rank 0 float32[8], rank 1 float32[{}]", big));
  // Rank 0's op would ride, rank 1's (MAX) would not.
  expect_error(
      [&] {
        at::Tensor t = at::zeros({2});
        all_reduce(t, me == 1 ? ReduceOp::MAX : ReduceOp::SUM, g);
      },
      "ranks disagree on the reduce op: rank 0 SUM, rank 1 MAX");
  // A root whose tensor would ride, and a rank that broadcasts from elsewhere.
  expect_error(
      [&] {
        at::Tensor t = at::zeros({2});
        broadcast(t, me == 1 ? 1 : 0, g);
      },
      "ranks disagree on the source rank: rank 0 0, rank 1 1");
  at::Tensor t = at::ones({3});
  all_reduce(t, ReduceOp::SUM, g);
  EXPECT_TRUE(at::equal(t, at::full({3}, static_cast<float>(g->size())))) << "the group after the errors";
}

TDC_DIST_TEST(RidesTest, DisagreementsFailOnEveryRankWorldSize2, .world_size = 2) {
  disagreements_fail_on_every_rank();
}
TDC_DIST_TEST(RidesTest, DisagreementsFailOnEveryRankWorldSize3) { disagreements_fail_on_every_rank(); }

}  // namespace rides_test
