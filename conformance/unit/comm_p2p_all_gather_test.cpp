// Unit tests of [Note: a large all-gather by sends and receives] (tdc/comm/backend_registry.h):
// over three or more Gloo ranks, an all-gather of at least kSmallInputBytes per rank runs
// as sends and receives. It must return the native all-gather's bytes, keep its messages apart
// from the user's and from other all-gathers in flight, and leave the user's tags alone.
#include <cstdint>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gmock/gmock.h>

#include "tdc/comm/collectives.h"
#include "tdc/comm/op_paths.h"
#include "tdc/comm/process_group.h"
#include "tdc/conformance/support.h"
#include "tdc/harness/harness.h"

#include "comm_bits.h"

namespace {

using namespace tdc::comm;
using tdc_comm_bits::gloo_all_gather;
using tdc_comm_bits::numel_in;
using tdc_comm_bits::random_bits;
using tdc_comm_bits::same_bytes;

TDC_DIST_SUITE(AllGatherBySendRecvTest, .world_size = 4);

bool ran(const std::string& key) { return op_paths()[key].count("all_gather_into_tensor") == 1; }

void gathers_what_gloo_gathers() {
  GroupPtr g = tdc::conformance::world();
  const int n = g->size();
  const int64_t min = ProcessGroup::kSmallInputBytes;
  for (at::ScalarType dt : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong, at::kByte}) {
    // Just below the threshold (by all-to-all), at it, and well above it with an odd element count.
    for (int64_t bytes : {min - 64, min, 5 * min + 24}) {
      const int64_t numel = numel_in(bytes, dt);
      SCOPED_TRACE(fmt::format("{}, {} elements per rank", c10::toString(dt), numel));
      const at::Tensor in = random_bits(numel, dt, 1000 + 7 * g->rank() + numel);
      reset_op_paths();
      at::Tensor mine = at::empty({n * numel}, in.options());
      all_gather_into_tensor(mine, in, g);
      const bool by_p2p = n >= 3 && in.nbytes() >= static_cast<size_t>(min);
      EXPECT_EQ(g->all_gather_by_p2p(static_cast<int64_t>(in.nbytes())), by_p2p);
      // The others go by all-to-all ([Note: gathers by all-to-all]): tdc's too.
      EXPECT_EQ(g->all_gather_by_alltoall(static_cast<int64_t>(in.nbytes())), !by_p2p);
      EXPECT_TRUE(ran("gloo.emulated")) << "results.json's comm_ops says which path ran";
      EXPECT_FALSE(ran("gloo.native"));
      EXPECT_TRUE(same_bytes(mine, gloo_all_gather(g, in)));
    }
  }
  // A stacked [n, rows, cols] output of a 2-D input, not contiguous: staged and copied back.
  const at::Tensor in = random_bits(numel_in(2 * min, at::kFloat), at::kFloat, 5 + g->rank()).view({64, -1});
  at::Tensor big = at::empty({n, in.size(1), 2 * in.size(0)});
  at::Tensor out = big.narrow(2, 0, in.size(0)).transpose(1, 2);  // [n, 64, cols], strided
  all_gather_into_tensor(out, in, g);
  EXPECT_TRUE(same_bytes(out.reshape({-1}), gloo_all_gather(g, in)));
}

TDC_DIST_TEST(AllGatherBySendRecvTest, GathersWhatGlooGathersWorldSize3, .world_size = 3) {
  gathers_what_gloo_gathers();
}
TDC_DIST_TEST(AllGatherBySendRecvTest, GathersWhatGlooGathersWorldSize4) { gathers_what_gloo_gathers(); }
// Two ranks never send and receive: all-gathers of every size go by all-to-all (checked inside).
TDC_DIST_TEST(AllGatherBySendRecvTest, TwoRanksGatherByAllToAll, .world_size = 2) { gathers_what_gloo_gathers(); }

// Three all-gathers in flight at once, waited for in reverse order, with the user's own sends and
// receives (tag 0, and the largest tag a user may take) in flight around them: every message
// reaches the buffer it was meant for.
TDC_DIST_TEST(AllGatherBySendRecvTest, MessagesInFlightKeepApart) {
  GroupPtr g = tdc::conformance::world();
  const int n = g->size(), r = g->rank();
  const int64_t numel = numel_in(ProcessGroup::kSmallInputBytes, at::kFloat);
  const int last_user_tag = static_cast<int>(ProcessGroup::kCollectiveTagBase - 1);
  auto value = [&](int k, int rank) { return at::full({numel}, static_cast<float>(100 * k + rank)); };

  // The user's receives are posted before the all-gathers' and their sends after: an all-gather
  // on a user's tag would take the user's message (same size) or hand its own to the user.
  at::Tensor user_in = at::empty({numel}), user_last_in = at::empty({numel});
  Work user_recv = recv(user_in, (r + n - 1) % n, g, 0);
  Work user_last_recv = recv(user_last_in, (r + 1) % n, g, last_user_tag);
  std::vector<at::Tensor> outs;
  std::vector<Work> works;
  for (int k = 0; k < 3; ++k) {
    outs.push_back(at::empty({n * numel}));
    works.push_back(all_gather_into_tensor(outs.back(), value(k, r), g, /*async_op=*/true));
  }
  Work user_send = send(value(9, r), (r + 1) % n, g, 0);
  Work user_last_send = send(value(8, r), (r + n - 1) % n, g, last_user_tag);
  for (int k = 2; k >= 0; --k) {
    works[k].wait();
    for (int from = 0; from < n; ++from) {
      EXPECT_TRUE(at::equal(outs[k].narrow(0, from * numel, numel), value(k, from)))
          << "all-gather " << k << ", chunk of rank " << from;
    }
  }
  user_recv.wait();
  user_last_recv.wait();
  user_send.wait();
  user_last_send.wait();
  EXPECT_TRUE(at::equal(user_in, value(9, (r + n - 1) % n)));
  EXPECT_TRUE(at::equal(user_last_in, value(8, (r + 1) % n)));
}

// Tags from kCollectiveTagBase up are tdc::comm's: a user's send or recv with one (or a negative
// one) is refused before anything is posted, naming the tag and the allowed range.
TDC_DIST_TEST(AllGatherBySendRecvTest, ReservedTagsAreRefused, .world_size = 2) {
  GroupPtr g = tdc::conformance::world();
  const int peer = 1 - g->rank();
  const int reserved = static_cast<int>(ProcessGroup::kCollectiveTagBase);
  at::Tensor t = at::zeros({4});
  const std::string range = fmt::format("is not in [0, {})", ProcessGroup::kCollectiveTagBase);
  EXPECT_THAT([&] { send(t, peer, g, reserved); },
              testing::ThrowsMessage<std::invalid_argument>(
                  testing::AllOf(testing::HasSubstr(fmt::format("send on group 'world' (size 2): tag {}", reserved)),
                                 testing::HasSubstr(range))));
  EXPECT_THAT([&] { recv(t, peer, g, -1); },
              testing::ThrowsMessage<std::invalid_argument>(testing::HasSubstr("tag -1 " + range)));
  // The group still works: nothing was posted.
  at::Tensor got = at::empty({4});
  Work w = recv(got, peer, g, 3);
  send(at::full({4}, static_cast<float>(g->rank())), peer, g, 3);
  w.wait();
  EXPECT_TRUE(at::equal(got, at::full({4}, static_cast<float>(peer))));
}

}  // namespace
