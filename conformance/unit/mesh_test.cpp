// Unit tests of tdc::DeviceMesh at world size 4: 1-D, 2x2 and 2x1x2 meshes. For every dim the
// group's members are checked by an all-gather of global ranks, local ranks and coordinates
// against the row-major layout, a sum over each dim group against the members' ranks, and
// slicing and flattening; then the bad-input messages.
#include <ATen/ATen.h>
#include <gmock/gmock.h>

#include "tdc/conformance/checks.h"
#include "tdc/comm/collectives.h"
#include "tdc/conformance/support.h"
#include "tdc/device_mesh.h"
#include "tdc/harness/harness.h"
#include "tdc/harness/subtests.h"

namespace {

using tdc::conformance::assert_close;
using tdc::conformance::Tolerance;

using ::testing::HasSubstr;

struct MeshCase {
  std::vector<int64_t> shape;
  std::vector<std::string> names;
};
MeshCase mesh_case(const std::string& name) {
  if (name == "4") return {{4}, {"dp"}};
  if (name == "2x2") return {{2, 2}, {"dp", "tp"}};
  return {{2, 1, 2}, {"pp", "dp", "tp"}};
}

// Row-major coordinate of `rank` in `shape`, computed independently of the implementation.
std::vector<int64_t> coordinate_of(int64_t rank, const std::vector<int64_t>& shape) {
  std::vector<int64_t> c(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    c[d] = rank % shape[d];
    rank /= shape[d];
  }
  return c;
}

// Global ranks that share every coordinate of `rank` except dim `d`, in order along d.
std::vector<int64_t> slice_members(int64_t rank, const std::vector<int64_t>& shape, size_t d) {
  std::vector<int64_t> out;
  for (int64_t other = 0; other < 4; ++other) {
    auto a = coordinate_of(rank, shape), b = coordinate_of(other, shape);
    a[d] = b[d] = 0;
    if (a == b) out.push_back(other);
  }
  return out;
}

std::vector<int64_t> gather_global_ranks(const tdc::comm::GroupPtr& g, int64_t rank) {
  at::Tensor out = at::empty({g->size()}, at::kLong);
  tdc::comm::all_gather_into_tensor(out, at::full({1}, rank, at::kLong), g);
  return std::vector<int64_t>(out.data_ptr<int64_t>(), out.data_ptr<int64_t>() + out.numel());
}

void check_mesh(const MeshCase& mc) {
  const int64_t r = tdc::harness::ctx().rank;
  tdc::DeviceMesh mesh = tdc::init_device_mesh("cpu", mc.shape, mc.names);
  EXPECT_EQ(mesh.ndim(), static_cast<int64_t>(mc.shape.size()));
  EXPECT_EQ(mesh.shape(), mc.shape);
  EXPECT_EQ(mesh.size(), 4);
  EXPECT_EQ(mesh.mesh_dim_names(), mc.names);
  EXPECT_TRUE(assert_close(mesh.mesh(), at::arange(4, at::kLong).view(mc.shape), Tolerance{0, 0}));
  EXPECT_EQ(mesh.get_rank(), r);
  EXPECT_EQ(mesh.get_coordinate(), coordinate_of(r, mc.shape));
  for (size_t d = 0; d < mc.shape.size(); ++d) {
    SCOPED_TRACE("dim " + mc.names[d]);
    const auto members = slice_members(r, mc.shape, d);
    auto g = mesh.get_group(static_cast<int64_t>(d));
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(mesh.get_group(mc.names[d]), g);
    EXPECT_EQ(mesh.size(d), mc.shape[d]);
    EXPECT_EQ(g->size(), mc.shape[d]);
    EXPECT_EQ(gather_global_ranks(g, r), members);
    EXPECT_EQ(mesh.get_local_rank(static_cast<int64_t>(d)), coordinate_of(r, mc.shape)[d]);
    EXPECT_EQ(mesh.get_local_rank(mc.names[d]), g->rank());
    // A collective on the dim group sums only its members.
    at::Tensor t = at::full({2}, static_cast<double>(r), at::kDouble);
    tdc::comm::all_reduce(t, tdc::comm::ReduceOp::SUM, g);
    int64_t expected = 0;
    for (int64_t m : members) expected += m;
    EXPECT_EQ(t[0].item<double>(), static_cast<double>(expected));
    // Slicing one dim: a 1-D mesh of the caller's slice that reuses the parent's group.
    tdc::DeviceMesh sub = mesh[mc.names[d]];
    EXPECT_EQ(sub.ndim(), 1);
    EXPECT_EQ(sub.get_group(), g);
    EXPECT_EQ(sub.get_local_rank(), mesh.get_local_rank(static_cast<int64_t>(d)));
    EXPECT_TRUE(assert_close(sub.mesh(), at::tensor(members, at::kLong), Tolerance{0, 0}));
  }
  // Flatten: one group of all ranks.
  tdc::DeviceMesh flat = mesh.flatten();
  EXPECT_EQ(flat.ndim(), 1);
  std::string joined;
  for (const auto& n : mc.names) joined += (joined.empty() ? "" : "_") + n;
  EXPECT_EQ(flat.mesh_dim_names(), std::vector<std::string>{joined});
  EXPECT_EQ(flat.get_group()->size(), 4);
  EXPECT_EQ(flat.get_local_rank(), r);
  EXPECT_EQ(gather_global_ranks(flat.get_group(), r), (std::vector<int64_t>{0, 1, 2, 3}));
}

TDC_DIST_SUITE(MeshTest, .world_size = 4);

TDC_DIST_TEST(MeshTest, MeshesOfFourRanks) {
  tdc::conformance::world();
  tdc::harness::subtests({{"mesh", {std::string("4"), std::string("2x2"), std::string("2x1x2")}}},
                         [](const tdc::harness::Params& p) { check_mesh(mesh_case(p.get<std::string>("mesh"))); });
}

TDC_DIST_TEST(MeshTest, SlicingSeveralDimsAndFlattenOfASlice) {
  tdc::conformance::world();
  const int64_t r = tdc::harness::ctx().rank;
  tdc::DeviceMesh mesh = tdc::init_device_mesh("cpu", {2, 1, 2}, {"pp", "dp", "tp"});
  EXPECT_EQ(mesh.to_string(), "DeviceMesh('cpu', [[[0, 1]], [[2, 3]]], mesh_dim_names=('pp', 'dp', 'tp'))");
  tdc::DeviceMesh dp_tp = mesh[{"dp", "tp"}];
  EXPECT_EQ(dp_tp.shape(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(dp_tp.mesh_dim_names(), (std::vector<std::string>{"dp", "tp"}));
  EXPECT_TRUE(
      assert_close(dp_tp.mesh(), at::tensor({r / 2 * 2, r / 2 * 2 + 1}, at::kLong).view({1, 2}), Tolerance{0, 0}));
  EXPECT_EQ(dp_tp.get_group("tp"), mesh.get_group("tp"));
  EXPECT_EQ(dp_tp.get_coordinate(), (std::vector<int64_t>{0, r % 2}));
  EXPECT_EQ(dp_tp.to_string(), r < 2 ? "DeviceMesh('cpu', [[0, 1]], mesh_dim_names=('dp', 'tp'))"
                                     : "DeviceMesh('cpu', [[2, 3]], mesh_dim_names=('dp', 'tp'))");
  tdc::DeviceMesh pp_tp = mesh[{"pp", "tp"}];
  EXPECT_TRUE(assert_close(pp_tp.mesh(), at::arange(4, at::kLong).view({2, 2}), Tolerance{0, 0}));
  EXPECT_TRUE((pp_tp == mesh[{"pp", "tp"}]));
  EXPECT_FALSE(pp_tp == dp_tp);
  // Flattening a slice: a group over the slice's ranks only.
  tdc::DeviceMesh flat = dp_tp.flatten("dp_tp");
  EXPECT_EQ(flat.to_string(), r < 2 ? "DeviceMesh('cpu', [0, 1], mesh_dim_names=('dp_tp',))"
                                    : "DeviceMesh('cpu', [2, 3], mesh_dim_names=('dp_tp',))");
  std::vector<int64_t> expected{r / 2 * 2, r / 2 * 2 + 1};
  EXPECT_EQ(gather_global_ranks(flat.get_group(), r), expected);
  EXPECT_EQ(flat.get_local_rank(), r % 2);
}

template <class Fn>
void expect_invalid(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no exception; expected one containing '" << parts.front() << "'";
  } catch (const std::exception& e) {
    for (const auto& part : parts) EXPECT_THAT(e.what(), HasSubstr(part));
  }
}

TDC_DIST_TEST(MeshTest, BadInput) {
  tdc::conformance::world();
  expect_invalid(
      [] {
        tdc::init_device_mesh("cpu", {2, 3}, {"dp", "tp"});
      },
      {"mesh shape [2, 3] holds 6 ranks, but the world size is 4"});
  expect_invalid(
      [] {
        tdc::init_device_mesh("cpu", {2, 2}, {"dp", "dp"});
      },
      {"mesh dim name 'dp' appears twice in ('dp', 'dp')"});
  expect_invalid(
      [] {
        tdc::init_device_mesh("cpu", {2, 2}, {"dp"});
      },
      {"1 mesh_dim_names ('dp') for a 2-d mesh shape [2, 2]"});
  tdc::DeviceMesh mesh = tdc::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  expect_invalid([&] { mesh["pp"]; }, {"no dim named 'pp'; this mesh's dims are ('dp', 'tp')"});
  expect_invalid([&] { mesh.get_group("cp"); }, {"no dim named 'cp'"});
  expect_invalid([&] { mesh[{"tp", "dp"}]; }, {"must name distinct dims in mesh order ('dp', 'tp')"});
  expect_invalid([&] { mesh.get_group(); }, {"needs a 1-D mesh"});
  expect_invalid([&] { mesh.get_group(2); }, {"dim 2 is out of range"});
}

}  // namespace
