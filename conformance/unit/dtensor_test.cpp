// Unit tests of tdc::tensor DTensor core: placements, specs (local shape/offset with torch.chunk
// semantics), distribute_tensor / from_local / full_tensor, redistribute between every pair of
// placements on 1-D (world 4 and 3) and 2-D (2x2) meshes, autograd through redistribute, and
// the bad-input messages. Ground truth is single-process: every rank builds the same global
// tensor, and the expected local piece is computed with at::chunk, independently of the
// implementation. Partial inputs are built from asymmetric rank-dependent splits.
#include <ATen/ATen.h>
#include <gmock/gmock.h>

#include <map>

#include "tdc/comm/collectives.h"
#include "tdc/conformance/checks.h"
#include "tdc/conformance/support.h"
#include "tdc/device_mesh.h"
#include "tdc/harness/harness.h"
#include "tdc/harness/subtests.h"
#include "tdc/tensor/dtensor.h"

namespace {

using tdc::conformance::assert_close;
using tdc::conformance::Tolerance;

using tdc::comm::ReduceOp;
using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace tdc::tensor;

// Deterministic, rank-independent global tensor (no RNG: thread-launched ranks share one).
at::Tensor global_tensor(const std::vector<int64_t>& shape, double salt = 0.0) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  return (at::arange(numel, at::kDouble) * 0.731 + salt).sin().mul(3.0).reshape(shape);
}

std::vector<int64_t> parse_shape(const std::string& s) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t x = s.find('x', pos);
    if (x == std::string::npos) x = s.size();
    out.push_back(std::stoll(s.substr(pos, x - pos)));
    pos = x + 1;
  }
  return out;
}

// The calling rank's piece of `global` under placements (Partial treated as Replicate), with
// at::chunk (which may return fewer chunks than asked: the missing ones are empty).
at::Tensor expected_local(const at::Tensor& global, const tdc::DeviceMesh& mesh, const Placements& ps) {
  at::Tensor t = global;
  const auto coord = mesh.get_coordinate();
  auto chunk_or_empty = [](const at::Tensor& x, int64_t n, int64_t d, int64_t m) {
    auto cs = x.chunk(n, d);
    return m < static_cast<int64_t>(cs.size()) ? cs[m] : x.narrow(d, x.size(d), 0);
  };
  for (size_t i = 0; i < ps.size(); ++i) {
    const int64_t n = mesh.size(static_cast<int64_t>(i)), m = coord[i];
    if (const auto* s = std::get_if<Shard>(&ps[i])) {
      const int64_t d = s->dim < 0 ? s->dim + t.dim() : s->dim;
      t = chunk_or_empty(t, n, d, m);
    } else if (const auto* s = std::get_if<StridedShard>(&ps[i])) {
      std::vector<at::Tensor> parts;
      for (int64_t j = 0; j < s->split_factor; ++j) {
        // PyTorch's _StridedShard: chunk split_factor ways, then each chunk n ways.
        parts.push_back(chunk_or_empty(chunk_or_empty(t, s->split_factor, s->dim, j), n, s->dim, m));
      }
      t = at::cat(parts, s->dim);
    }
  }
  return t.contiguous();
}

// Rank-dependent partial values along mesh dim i whose reduction by `op` is `x`.
at::Tensor split_partial(const at::Tensor& x, ReduceOp op, int64_t n, int64_t m) {
  switch (op) {
    case ReduceOp::SUM: {
      // weights 3, -1, 2, -1, ... and the last rank makes up the difference
      double w = (m % 2 == 0) ? 3.0 - m : -1.0, total = 0.0;
      for (int64_t k = 0; k < n - 1; ++k) total += (k % 2 == 0) ? 3.0 - k : -1.0;
      if (m == n - 1) w = 1.0 - total;
      return x * w + (m == n - 1 ? at::zeros_like(x) : at::ones_like(x) * 0.5) -
             (m == n - 1 ? at::ones_like(x) * 0.5 * (n - 1) : at::zeros_like(x));
    }
    case ReduceOp::AVG:
      return x + (static_cast<double>(m) - (n - 1) / 2.0) * 1.25;
    case ReduceOp::MAX:
    case ReduceOp::MIN: {
      // the rank holding the extreme value differs per element
      at::Tensor owner = at::arange(x.numel(), at::kLong).reshape(x.sizes()).remainder(n);
      at::Tensor off = at::full_like(x, 1.0 + m);
      if (op == ReduceOp::MAX) off = -off;
      return at::where(owner == m, x, x + off);
    }
  }
  return x;
}

// A DTensor of `global` with placements `ps`, Partial mesh dims built from asymmetric splits.
DTensor make_dtensor(const at::Tensor& global, const tdc::DeviceMesh& mesh, const Placements& ps) {
  at::Tensor local = expected_local(global, mesh, ps);
  const auto coord = mesh.get_coordinate();
  for (size_t i = 0; i < ps.size(); ++i) {
    if (const auto* p = std::get_if<Partial>(&ps[i])) {
      local = split_partial(local, p->op, mesh.size(static_cast<int64_t>(i)), coord[i]);
    }
  }
  FromLocalOptions opts;
  opts.shape = global.sizes().vec();
  return from_local(local, mesh, ps, opts);
}

// Partials with different ops on two mesh dims do not commute (the reduction order matters).
bool mixed_partials(const Placements& ps) {
  const Partial* first = nullptr;
  for (const auto& p : ps) {
    if (const auto* q = std::get_if<Partial>(&p)) {
      if (first && !(*first == *q)) return true;
      first = q;
    }
  }
  return false;
}

bool has_partial(const Placements& ps) {
  for (const auto& p : ps) {
    if (is_partial(p)) return true;
  }
  return false;
}

// Redistribution moves values without arithmetic (or sums a few small numbers): near exact.
constexpr double kTol = 1e-10;

// Redistribute src -> dst and check against the ground truth.
void check_transition(const at::Tensor& global, const tdc::DeviceMesh& mesh, const Placements& src,
                      const Placements& dst) {
  SCOPED_TRACE(to_string(src) + " -> " + to_string(dst) + " shape " + c10::str(global.sizes()));
  DTensor d = make_dtensor(global, mesh, src);
  DTensor r = d.redistribute(dst);
  EXPECT_EQ(r.shape(), global.sizes().vec());
  EXPECT_EQ(r.spec().local_shape(), r.to_local().sizes().vec());
  if (!has_partial(dst)) {
    EXPECT_TRUE(assert_close(r.to_local(), expected_local(global, mesh, dst), Tolerance{kTol, kTol}));
  } else {
    ASSERT_EQ(r.to_local().sizes().vec(), expected_local(global, mesh, dst).sizes().vec());
    EXPECT_TRUE(assert_close(r.full_tensor(), global, Tolerance{kTol, kTol}));
  }
}

const std::vector<Placement> k1d = {Shard{0},
                                    Shard{1},
                                    Shard{-1},
                                    Replicate{},
                                    Partial{ReduceOp::SUM},
                                    Partial{ReduceOp::AVG},
                                    Partial{ReduceOp::MAX},
                                    Partial{ReduceOp::MIN}};

void transitions_1d(int64_t world) {
  tdc::conformance::world();
  tdc::DeviceMesh mesh = tdc::init_device_mesh("cpu", {world});
  tdc::harness::subtests({{"shape", {std::string("5x7"), std::string("2x3"), std::string("8x4")}}},
                         [&](const tdc::harness::Params& p) {
                           at::Tensor global = global_tensor(parse_shape(p.get<std::string>("shape")));
                           for (const auto& s : k1d) {
                             for (const auto& t : k1d) check_transition(global, mesh, {s}, {t});
                           }
                         });
}

TDC_DIST_SUITE(DTensorTest, .world_size = 4);

TDC_DIST_TEST(DTensorTest, Transitions1DWorld4) { transitions_1d(4); }
TDC_DIST_TEST(DTensorTest, Transitions1DWorld3, .world_size = 3) { transitions_1d(3); }

TDC_DIST_TEST(DTensorTest, Transitions2D) {
  tdc::conformance::world();
  tdc::DeviceMesh mesh = tdc::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  const std::vector<Placement> k2d = {Shard{0}, Shard{1}, Replicate{}, Partial{ReduceOp::SUM}, Partial{ReduceOp::MAX}};
  tdc::harness::subtests({{"shape", {std::string("5x7"), std::string("3x1")}}}, [&](const tdc::harness::Params& p) {
    at::Tensor global = global_tensor(parse_shape(p.get<std::string>("shape")));
    for (const auto& a : k2d) {
      for (const auto& b : k2d) {
        for (const auto& c : k2d) {
          for (const auto& d : k2d) {
            if (mixed_partials({a, b}) || mixed_partials({c, d})) continue;
            check_transition(global, mesh, {a, b}, {c, d});
          }
        }
      }
    }
  });
}

TDC_DIST_TEST(DTensorTest, StridedShard) {
  tdc::conformance::world();
  tdc::DeviceMesh mesh = tdc::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  tdc::harness::subtests(
      {{"shape", {std::string("8x3"), std::string("7x2"), std::string("3x2")}}}, [&](const tdc::harness::Params& p) {
        at::Tensor global = global_tensor(parse_shape(p.get<std::string>("shape")));
        // FSDP over TP: (StridedShard(0, split_factor=2), Shard(0)) holds global chunk tp*2 + dp.
        const Placements fsdp_tp = {StridedShard{0, 2}, Shard{0}};
        DTensor d = make_dtensor(global, mesh, fsdp_tp);
        EXPECT_EQ(d.spec().local_shape(), d.to_local().sizes().vec());
        if (global.size(0) == 8) {
          const auto c = mesh.get_coordinate();
          EXPECT_TRUE(assert_close(d.to_local(), global.chunk(4, 0)[c[1] * 2 + c[0]], Tolerance{kTol, kTol}));
          EXPECT_EQ(d.spec().local_offset()[0], (c[1] * 2 + c[0]) * 2);
        }
        for (const Placements& dst : std::vector<Placements>{
                 {Replicate{}, Replicate{}}, {Replicate{}, Shard{0}}, {Shard{0}, Replicate{}}, {Shard{1}, Shard{0}}}) {
          check_transition(global, mesh, fsdp_tp, dst);
          check_transition(global, mesh, dst, fsdp_tp);
        }
        check_transition(global, mesh, {Partial{}, Replicate{}}, fsdp_tp);
        // 1-D: StridedShard alone on each mesh dim.
        check_transition(global, mesh, {StridedShard{0, 2}, Replicate{}}, {Replicate{}, Replicate{}});
        check_transition(global, mesh, {Replicate{}, Replicate{}}, {Replicate{}, StridedShard{0, 3}});
        // PyTorch 2.13's _StridedShard(0, split_factor=2)._split_tensor over 2 (checked in Python):
        // 7 -> [0, 1, 4, 5] | [2, 3, 6]; 3 -> [0, 2] | [1]; 2 -> [0, 1] | [].
        const int64_t rows = global.size(0), m = mesh.get_local_rank(0);
        const std::map<int64_t, std::vector<std::vector<int64_t>>> torch_rows = {
            {7, {{0, 1, 4, 5}, {2, 3, 6}}}, {3, {{0, 2}, {1}}}, {8, {{0, 1, 4, 5}, {2, 3, 6, 7}}}};
        DTensor s = make_dtensor(global, mesh, {StridedShard{0, 2}, Replicate{}});
        EXPECT_TRUE(assert_close(s.to_local(), global.index_select(0, at::tensor(torch_rows.at(rows)[m], at::kLong)),
                                 Tolerance{kTol, kTol}));
        DTensor two = make_dtensor(global_tensor({2, 3}), mesh, {StridedShard{0, 2}, Replicate{}});
        EXPECT_EQ(two.to_local().size(0), m == 0 ? 2 : 0);
      });
}

TDC_DIST_TEST(DTensorTest, SpecLocalShapeAndOffset) {
  tdc::conformance::world();
  const int64_t r = tdc::harness::ctx().rank;
  tdc::DeviceMesh mesh = tdc::init_device_mesh("cpu", {4});
  auto spec_of = [&](std::vector<int64_t> shape, Placements ps) {
    return DTensor(at::Tensor(), DTensorSpec{mesh, ps, shape, {}, at::kFloat}).spec();
  };
  // torch.chunk: 5 over 4 -> 2, 2, 1, 0; 2 over 4 -> 1, 1, 0, 0; 7 over 4 -> 2, 2, 2, 1.
  const int64_t five[] = {2, 2, 1, 0}, two[] = {1, 1, 0, 0}, five_off[] = {0, 2, 4, 5};
  EXPECT_EQ(spec_of({5, 3}, {Shard{0}}).local_shape(), (std::vector<int64_t>{five[r], 3}));
  EXPECT_EQ(spec_of({5, 3}, {Shard{0}}).local_offset(), (std::vector<int64_t>{five_off[r], 0}));
  EXPECT_EQ(spec_of({3, 2}, {Shard{-1}}).local_shape(), (std::vector<int64_t>{3, two[r]}));
  EXPECT_EQ(spec_of({3, 2}, {Shard{-1}}).placements[0], Placement(Shard{1}));
  EXPECT_EQ(spec_of({3, 2}, {Replicate{}}).local_shape(), (std::vector<int64_t>{3, 2}));
  DTensor undefined;  // default-constructible, e.g. for containers
  EXPECT_FALSE(undefined.defined());
  EXPECT_FALSE(undefined.grad().has_value());
  EXPECT_EQ(to_string(Placements{Shard{0}, Replicate{}, Partial{ReduceOp::AVG}}),
            "(Shard(0), Replicate(), Partial(avg))");
  // 2-D: two mesh dims sharding dim 0 nest in mesh-dim order: 7 -> (4, 3) -> (2, 2 | 2, 1).
  tdc::DeviceMesh mesh2 = tdc::init_device_mesh("cpu", {2, 2});
  DTensorSpec s2{mesh2, {Shard{0}, Shard{0}}, {7}, {1}, at::kFloat};
  const int64_t nested[] = {2, 2, 2, 1}, nested_off[] = {0, 2, 4, 6};
  EXPECT_EQ(s2.local_shape(), (std::vector<int64_t>{nested[r]}));
  EXPECT_EQ(s2.local_offset(), (std::vector<int64_t>{nested_off[r]}));
  // Shapes and offsets from PyTorch 2.13's _compute_local_shape_and_global_offset, per rank.
  struct Case {
    std::vector<int64_t> shape;
    Placements ps;
    std::vector<std::vector<int64_t>> local, offset;
  };
  const std::vector<Case> torch_cases = {
      {{7, 5}, {Shard{1}, Shard{0}}, {{4, 3}, {3, 3}, {4, 2}, {3, 2}}, {{0, 0}, {4, 0}, {0, 3}, {4, 3}}},
      {{3, 2}, {Shard{0}, Shard{0}}, {{1, 2}, {1, 2}, {1, 2}, {0, 2}}, {{0, 0}, {1, 0}, {2, 0}, {3, 0}}},
      {{7, 2}, {StridedShard{0, 2}, Shard{0}}, {{2, 2}, {2, 2}, {2, 2}, {1, 2}}, {{0, 0}, {4, 0}, {2, 0}, {6, 0}}},
  };
  for (const Case& c : torch_cases) {
    SCOPED_TRACE(to_string(c.ps));
    DTensorSpec spec{mesh2, c.ps, c.shape, {}, at::kFloat};
    EXPECT_EQ(spec.local_shape(), c.local[r]);
    EXPECT_EQ(spec.local_offset(), c.offset[r]);
  }
  DTensorSpec empty_shard{mesh, {Shard{0}}, {2, 3}, {}, at::kFloat};
  const int64_t two_off[] = {0, 1, 2, 2};
  EXPECT_EQ(empty_shard.local_offset(), (std::vector<int64_t>{two_off[r], 0}));
}

TDC_DIST_TEST(DTensorTest, ReplicateToPartialValues) {
  tdc::conformance::world();
  const int64_t r = tdc::harness::ctx().rank;
  tdc::DeviceMesh mesh = tdc::init_device_mesh("cpu", {4});
  at::Tensor global = global_tensor({3, 2});
  DTensor d = distribute_tensor(global, mesh, {Replicate{}});
  // SUM: value / n everywhere, as PyTorch 2.13's Partial._partition_value; integers: rank 0 keeps it.
  EXPECT_TRUE(assert_close(d.redistribute({Partial{ReduceOp::SUM}}).to_local(), global / 4.0, Tolerance{kTol, kTol}));
  at::Tensor ints = at::arange(6, at::kLong).reshape({3, 2});
  DTensor di = distribute_tensor(ints, mesh, {Replicate{}}).redistribute({Partial{ReduceOp::SUM}});
  EXPECT_TRUE(assert_close(di.to_local(), r == 0 ? ints : at::zeros_like(ints), Tolerance{0, 0}));
  EXPECT_TRUE(assert_close(di.full_tensor(), ints, Tolerance{0, 0}));
  for (ReduceOp op : {ReduceOp::AVG, ReduceOp::MAX, ReduceOp::MIN}) {
    EXPECT_TRUE(assert_close(d.redistribute({Partial{op}}).to_local(), global, Tolerance{kTol, kTol}));
  }
  // Partial(sum) -> Partial(avg) keeps the full value.
  DTensor p = make_dtensor(global, mesh, {Partial{ReduceOp::SUM}});
  EXPECT_TRUE(assert_close(p.redistribute({Partial{ReduceOp::AVG}}).full_tensor(), global, Tolerance{kTol, kTol}));
  EXPECT_TRUE(assert_close(p.redistribute({Partial{ReduceOp::MAX}}).full_tensor(), global, Tolerance{kTol, kTol}));
}

// Autograd: the local gradient of every source placement equals the single-process gradient
// laid out as the source's gradient placements (Partial -> Replicate).
TDC_DIST_TEST(DTensorTest, AutogradThroughRedistribute) {
  tdc::conformance::world();
  tdc::harness::subtests({{"mesh", {std::string("4"), std::string("2x2")}}}, [&](const tdc::harness::Params& p) {
    const bool two_d = p.get<std::string>("mesh") == "2x2";
    tdc::DeviceMesh mesh = two_d ? tdc::init_device_mesh("cpu", {2, 2}) : tdc::init_device_mesh("cpu", {4});
    std::vector<Placements> grid;
    const std::vector<Placement> ps = {Shard{0}, Shard{1}, Replicate{}, Partial{ReduceOp::SUM}};
    for (const auto& a : ps) {
      if (!two_d) {
        grid.push_back({a});
        continue;
      }
      for (const auto& b : ps) grid.push_back({a, b});
    }
    at::Tensor global = global_tensor({5, 3});
    at::Tensor weight = global_tensor({5, 3}, 0.4);
    // Single-process ground truth: d/dx sum(x * w) = w.
    at::Tensor x = global.clone().requires_grad_(true);
    (x * weight).sum().backward();
    const at::Tensor truth = x.grad();
    for (const auto& src : grid) {
      for (const auto& dst : grid) {
        if (has_partial(dst)) continue;
        SCOPED_TRACE(to_string(src) + " -> " + to_string(dst));
        DTensor leaf = make_dtensor(global, mesh, src);
        at::Tensor local = leaf.to_local().detach().requires_grad_(true);
        DTensor d = from_local(local, mesh, src, {.shape = global.sizes().vec()});
        DTensor r = d.redistribute(dst);
        // Each rank's loss covers its local piece; replicated mesh dims count once.
        (r.to_local() * expected_local(weight, mesh, dst)).sum().backward();
        ASSERT_TRUE(d.grad().has_value());
        Placements gp = src;
        for (auto& q : gp) {
          if (is_partial(q)) q = Replicate{};
        }
        EXPECT_TRUE(assert_close(local.grad(), expected_local(truth, mesh, gp), Tolerance{kTol, kTol}));
        EXPECT_EQ(d.grad()->placements(), gp);
      }
    }
  });
}

TDC_DIST_TEST(DTensorTest, FullTensorBackwardGivesOnes) {
  tdc::conformance::world();
  tdc::DeviceMesh mesh = tdc::init_device_mesh("cpu", {4});
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{5, 3}, std::vector<int64_t>{2, 3}}) {
    at::Tensor global = global_tensor(shape);
    at::Tensor local = expected_local(global, mesh, {Shard{0}}).requires_grad_(true);
    DTensor d = from_local(local, mesh, {Shard{0}}, {.shape = shape});
    at::Tensor full = d.full_tensor();
    EXPECT_TRUE(assert_close(full, global, Tolerance{kTol, kTol}));
    full.sum().backward();
    EXPECT_TRUE(assert_close(local.grad(), at::ones_like(local), Tolerance{kTol, kTol}));
  }
  // distribute_tensor is differentiable w.r.t. the replicated input: the shards' gradients are
  // gathered back.
  at::Tensor g = global_tensor({7, 2}).requires_grad_(true);
  at::Tensor w = global_tensor({7, 2}, 1.0);
  DTensor d = distribute_tensor(g, mesh, {Shard{0}});
  (d.to_local() * expected_local(w, mesh, {Shard{0}})).sum().backward();
  EXPECT_TRUE(assert_close(g.grad(), w, Tolerance{kTol, kTol}));
}

TDC_DIST_TEST(DTensorTest, DistributeTensorBroadcastFromSrc) {
  tdc::conformance::world();
  const int64_t r = tdc::harness::ctx().rank;
  tdc::DeviceMesh mesh = tdc::init_device_mesh("cpu", {2, 2});
  at::Tensor global = global_tensor({4, 4});
  at::Tensor mine = r == 3 ? global : at::full({4, 4}, static_cast<double>(r), at::kDouble);
  DTensor d = distribute_tensor(mine, mesh, {Shard{0}, Shard{1}}, /*broadcast_from_src=*/true, /*src_rank=*/3);
  EXPECT_TRUE(assert_close(d.to_local(), expected_local(global, mesh, {Shard{0}, Shard{1}}), Tolerance{kTol, kTol}));
}

TDC_DIST_TEST(DTensorTest, FromLocalRunCheck) {
  tdc::conformance::world();
  const int64_t r = tdc::harness::ctx().rank;
  tdc::DeviceMesh mesh = tdc::init_device_mesh("cpu", {4});
  // Consistent uneven shards: the global shape comes from the gathered local shapes.
  at::Tensor local = expected_local(global_tensor({5, 2}), mesh, {Shard{0}});
  DTensor ok = from_local(local, mesh, {Shard{0}}, {.run_check = true});
  EXPECT_EQ(ok.shape(), (std::vector<int64_t>{5, 2}));
  EXPECT_TRUE(assert_close(ok.full_tensor(), global_tensor({5, 2}), Tolerance{kTol, kTol}));
  // Without run_check the global shape assumes even shards (as PyTorch).
  EXPECT_EQ(from_local(at::zeros({2, 2}), mesh, {Shard{0}}).shape(), (std::vector<int64_t>{8, 2}));
  // Inconsistent: rank 1 holds 3 rows, the others 2.
  at::Tensor bad = at::zeros({r == 1 ? 3 : 2, 4});
  try {
    from_local(bad, mesh, {Shard{0}}, {.run_check = true});
    ADD_FAILURE() << "from_local accepted inconsistent local shapes";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 0: [2, 4]"));
    EXPECT_THAT(e.what(), HasSubstr("rank 1: [3, 4]"));
    EXPECT_THAT(e.what(), HasSubstr("rank 3: [2, 4] (expected [0, 4])"));
  }
  // Replicate with differing shapes.
  try {
    from_local(at::zeros({r == 2 ? 1 : 2}), mesh, {Replicate{}}, {.shape = std::vector<int64_t>{2}, .run_check = true});
    ADD_FAILURE() << "from_local accepted inconsistent replicated shapes";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 2: [1] (expected [2])"));
  }
}

TDC_DIST_TEST(DTensorTest, BadInput) {
  tdc::conformance::world();
  tdc::DeviceMesh mesh = tdc::init_device_mesh("cpu", {4});
  tdc::DeviceMesh mesh2 = tdc::init_device_mesh("cpu", {2, 2});
  at::Tensor t = at::zeros({4, 4});
  auto message = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_THAT(message([&] { distribute_tensor(t, mesh, {Shard{2}}); }),
              AllOf(HasSubstr("Shard(2)"), HasSubstr("rank 2")));
  EXPECT_THAT(message([&] { distribute_tensor(t, mesh, {Shard{-3}}); }), HasSubstr("Shard(-3)"));
  EXPECT_THAT(message([&] {
                distribute_tensor(t, mesh, {Shard{0}, Replicate{}});
              }),
              AllOf(HasSubstr("2 entries"), HasSubstr("1 dims")));
  EXPECT_THAT(message([&] { distribute_tensor(t, mesh2, {Shard{0}}); }),
              AllOf(HasSubstr("1 entries"), HasSubstr("2 dims")));
  EXPECT_THAT(message([&] { distribute_tensor(t, mesh, {Partial{}}); }),
              AllOf(HasSubstr("distribute_tensor"), HasSubstr("Partial(sum)")));
  DTensor d = distribute_tensor(t, mesh, {Replicate{}});
  EXPECT_THAT(message([&] { d.redistribute({Shard{5}}); }), AllOf(HasSubstr("redistribute"), HasSubstr("Shard(5)")));
  EXPECT_THAT(message([&] { d.redistribute({Replicate{}, Replicate{}}); }), HasSubstr("2 entries"));
  EXPECT_THAT(message([&] { from_local(t, mesh, {StridedShard{0, 0}}); }), HasSubstr("split_factor 0"));
}

// The example of docs/dtensor.md, verbatim.
TDC_DIST_TEST(DTensorTest, DocsExample) {
  // --- docs/dtensor.md example begin ---
  using namespace tdc::tensor;
  tdc::conformance::world();  // default process group (4 ranks)
  tdc::DeviceMesh mesh = tdc::init_device_mesh("cpu", {4});

  // Every rank holds the same 5x3 tensor; distribute it row-wise (2, 2, 1, 0 rows).
  at::Tensor weight = at::arange(15, at::kFloat).reshape({5, 3});
  DTensor w = distribute_tensor(weight, mesh, {Shard{0}});
  // w.to_local() is this rank's rows; w.spec().local_offset()[0] is where they start.

  // Column-wise instead: all-to-all semantics (gather rows, keep my columns).
  DTensor w_cols = w.redistribute({Shard{1}});

  // Partial values (e.g. the output of a row-parallel matmul) reduce on redistribute.
  at::Tensor partial = at::full({2, 2}, 1.0f * mesh.get_local_rank(0));
  DTensor p = from_local(partial, mesh, {Partial{tdc::comm::ReduceOp::SUM}});
  at::Tensor summed = p.full_tensor();  // 0 + 1 + 2 + 3 = 6 everywhere

  // Differentiable: grads of a Shard -> Replicate redistribute come back sharded.
  at::Tensor local = w.to_local().detach().requires_grad_(true);
  DTensor leaf = from_local(local, mesh, {Shard{0}}, {.shape = std::vector<int64_t>{5, 3}});
  leaf.full_tensor().sum().backward();  // local.grad() is all ones
  // --- docs/dtensor.md example end ---
  EXPECT_TRUE(assert_close(w_cols.full_tensor(), weight, Tolerance{0, 0}));
  EXPECT_TRUE(assert_close(summed, at::full({2, 2}, 6.0f), Tolerance{0, 0}));
  EXPECT_TRUE(assert_close(local.grad(), at::ones_like(local), Tolerance{0, 0}));
  EXPECT_EQ(leaf.grad()->placements(), (Placements{Shard{0}}));
}

}  // namespace
