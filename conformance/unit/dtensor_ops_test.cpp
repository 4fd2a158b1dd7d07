// Strategy checker for tdc::tensor::ops. For every op and every placement combination of its
// inputs on a 1-D mesh (world 4) and a 2-D mesh (2x2) — Shard on each tensor dim, Replicate, and
// Partial(SUM) built from asymmetric, rank-dependent parts that sum to the value — it runs the
// op, compares full_tensor() with the single-process result, then backpropagates a fixed weighted
// sum of the full output through the local tensors and the redistributions and compares every
// input's gradient on every rank with its piece of autograd's on the plain tensors.
//
// A combination that throws "no sharding rule" is a missing rule: listed in the summary each test
// prints from rank 0 (shown with --tdc_show_output), not a failure. A wrong value or gradient is
// a failure naming the op, the mesh and the placements. The combinations tensor parallelism needs
// (kTpRequired: ColwiseParallel / RowwiseParallel linear and embedding layouts, sequence-parallel
// elementwise) must be supported and correct. addmm is swept on the 1-D mesh only (its rules are
// linear's, swept on both).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>

#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "tdc/comm/argument_checks.h"
#include "tdc/comm/collectives.h"
#include "tdc/conformance/checks.h"
#include "tdc/conformance/support.h"
#include "tdc/device_mesh.h"
#include "tdc/harness/harness.h"
#include "tdc/tensor/dtensor.h"
#include "tdc/tensor/ops.h"

namespace {

using tdc::DeviceMesh;
using tdc::tensor::DTensor;
using tdc::tensor::DTensorSpec;
using tdc::tensor::Partial;
using tdc::tensor::Placement;
using tdc::tensor::Placements;
using tdc::tensor::Replicate;
using tdc::tensor::Shard;
namespace ops = tdc::tensor::ops;
using ::testing::HasSubstr;

// The layouts tensor parallelism uses (torch.distributed.tensor.parallel styles); the checker
// asserts each is supported and gives the right value and gradients.
//   linear [x (B, in), W (out, in), b (out)] / embedding [W (V, D), indices]
struct Required {
  const char* op;
  const char* mesh;  // "1d" or "2d"
  const char* placements;
};
const std::vector<Required> kTpRequired = {
    // ColwiseParallel linear: replicated input, weight and bias sharded on the output features.
    {"linear", "1d", "(Replicate()) x (Shard(0)) x (Shard(0))"},
    {"linear_nobias", "1d", "(Replicate()) x (Shard(0))"},
    // RowwiseParallel linear: input sharded on its last dim, weight on the input features.
    {"linear", "1d", "(Shard(1)) x (Shard(1)) x (Replicate())"},
    {"linear_nobias", "1d", "(Shard(1)) x (Shard(1))"},
    // ColwiseParallel / RowwiseParallel embedding.
    {"embedding", "1d", "(Shard(1)) x (Replicate())"},
    {"embedding", "1d", "(Shard(0)) x (Replicate())"},
    // Sequence parallel / activations between TP modules.
    {"add", "1d", "(Shard(0)) x (Shard(0))"},
    {"gelu", "1d", "(Shard(1))"},
    {"add", "1d", "(Partial(sum)) x (Partial(sum))"},
    // 2-D (dp, tp): batch sharded on dp, the TP layouts on tp.
    {"linear", "2d", "(Shard(0), Replicate()) x (Replicate(), Shard(0)) x (Replicate(), Shard(0))"},
    {"linear", "2d", "(Shard(0), Shard(1)) x (Replicate(), Shard(1)) x (Replicate(), Replicate())"},
    {"linear_nobias", "2d", "(Shard(0), Replicate()) x (Replicate(), Shard(0))"},
    {"linear_nobias", "2d", "(Shard(0), Shard(1)) x (Replicate(), Shard(1))"},
    {"embedding", "2d", "(Replicate(), Shard(0)) x (Shard(0), Replicate())"},
    {"embedding", "2d", "(Replicate(), Shard(1)) x (Shard(0), Replicate())"},
};

at::Tensor randn(const std::vector<int64_t>& shape, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kDouble));
}

struct InputSpec {
  at::Tensor value;    // the global value (same on every rank)
  bool index = false;  // integer input: no Partial, no gradient
  bool few = false;    // biases: Shard(0), Replicate, Partial on a 1-D mesh; on a 2-D mesh
                       // only (R, R), (R, S(0)) (the TP layouts) and (P, P)
};

struct OpCase {
  std::string name;
  std::vector<InputSpec> inputs;
  std::function<DTensor(const std::vector<DTensor>&)> run;
  std::function<at::Tensor(const std::vector<at::Tensor>&)> ref;
  bool only_1d = false;  // addmm: the same rule code as linear, whose 2-D sweep covers it
};

std::string key(const std::vector<Placements>& ps) {
  std::string s;
  for (const auto& p : ps) s += (s.empty() ? "" : " x ") + tdc::tensor::to_string(p);
  return s;
}

// Per-mesh-dim options for a tensor of `rank` dims, then their Cartesian product over the mesh.
std::vector<Placements> placement_options(const InputSpec& in, int64_t mesh_ndim) {
  std::vector<Placement> per_dim;
  for (int64_t d = 0; d < in.value.dim(); ++d) {
    if (in.few && d > 0) break;
    per_dim.push_back(Shard{d});
  }
  per_dim.push_back(Replicate{});
  if (!in.index && !in.few) per_dim.push_back(Partial{});
  std::vector<Placements> out = {{}};
  for (int64_t i = 0; i < mesh_ndim; ++i) {
    std::vector<Placements> next;
    for (const auto& prefix : out)
      for (const auto& p : per_dim) {
        auto q = prefix;
        q.push_back(p);
        next.push_back(q);
      }
    out = std::move(next);
  }
  if (in.few && mesh_ndim > 1) {
    out = {Placements(mesh_ndim, Replicate{}), Placements(mesh_ndim, Replicate{}), Placements(mesh_ndim, Partial{})};
    out[1].back() = Shard{0};
  } else if (in.few && !in.index) {
    out.push_back(Placements(mesh_ndim, Partial{}));
  }
  return out;
}

std::vector<int64_t> contiguous_stride(const std::vector<int64_t>& shape) {
  std::vector<int64_t> stride(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) stride[d] = stride[d + 1] * shape[d + 1];
  return stride;
}

// `full` cut to this rank's piece under `pl` (Shard slices; Replicate and Partial keep it whole).
at::Tensor local_piece(const at::Tensor& full, const DeviceMesh& mesh, const Placements& pl) {
  std::vector<int64_t> shape = full.sizes().vec();
  DTensorSpec spec{mesh, pl, shape, contiguous_stride(shape), full.scalar_type()};
  const auto off = spec.local_offset();
  const auto ls = spec.local_shape();
  at::Tensor local = full;
  for (size_t d = 0; d < shape.size(); ++d) local = local.narrow(d, off[d], ls[d]);
  return local;
}

// The rank's piece: Partial dims split the value into asymmetric parts (value / n plus a
// rank-dependent noise that cancels over the dim), then Shard dims slice it.
DTensor make_input(const at::Tensor& value, const DeviceMesh& mesh, const Placements& pl, uint64_t salt,
                   at::Tensor* leaf) {
  at::Tensor full = value.clone();
  auto coord = mesh.get_coordinate();
  for (int64_t i = 0; i < mesh.ndim(); ++i) {
    if (!tdc::tensor::is_partial(pl[i])) continue;
    double n = static_cast<double>(mesh.size(i));
    full = full / n + randn(value.sizes().vec(), 7919 * salt + 31 * i + 1) * (coord[i] - (n - 1) / 2);
  }
  std::vector<int64_t> shape = value.sizes().vec();
  at::Tensor local = local_piece(full, mesh, pl).contiguous().detach();
  if (at::isFloatingType(local.scalar_type())) local.requires_grad_(true);
  *leaf = local;
  tdc::tensor::FromLocalOptions o;
  o.shape = shape;
  o.stride = contiguous_stride(shape);
  return tdc::tensor::from_local(local, mesh, pl, o);
}

struct Report {
  int tested = 0, passed = 0;
  std::vector<std::string> missing;
  std::set<std::string> supported;  // "op|mesh|placements" that ran and matched
};

bool close(const at::Tensor& a, const at::Tensor& b) {
  return static_cast<bool>(tdc::conformance::assert_close(a, b, tdc::conformance::Tolerance{1e-6, 1e-8}));
}

void check_case(const OpCase& c, const DeviceMesh& mesh, const std::string& mesh_name, Report& report) {
  const size_t n = c.inputs.size();
  std::vector<std::vector<Placements>> options;
  for (const auto& in : c.inputs) options.push_back(placement_options(in, mesh.ndim()));
  // Ground truth and its gradients.
  at::Tensor weight_out;
  std::vector<at::Tensor> ref_in, ref_grad;
  for (const auto& in : c.inputs) {
    at::Tensor t = in.value.clone();
    if (!in.index) t.requires_grad_(true);
    ref_in.push_back(t);
  }
  at::Tensor ref_out = c.ref(ref_in);
  weight_out = randn(ref_out.sizes().vec(), 4242);
  (ref_out * weight_out).sum().backward();
  for (auto& t : ref_in) ref_grad.push_back(t.requires_grad() ? t.grad() : at::Tensor());
  ref_out = ref_out.detach();

  std::vector<size_t> idx(n, 0);
  while (true) {
    std::vector<Placements> pls;
    for (size_t k = 0; k < n; ++k) pls.push_back(options[k][idx[k]]);
    const std::string where = c.name + " on " + mesh_name + " mesh with " + key(pls);
    ++report.tested;
    std::vector<DTensor> args;
    std::vector<at::Tensor> leaves(n);
    for (size_t k = 0; k < n; ++k) args.push_back(make_input(c.inputs[k].value, mesh, pls[k], k + 1, &leaves[k]));
    bool ok = true;
    try {
      DTensor out = c.run(args);
      at::Tensor full = out.full_tensor();
      if (!close(full, ref_out)) {
        ok = false;
        ADD_FAILURE() << "wrong value: " << where << " -> " << tdc::tensor::to_string(out.placements()) << "\nexpected "
                      << ref_out << "\ngot " << full;
      }
      (full * weight_out).sum().backward();
      for (size_t k = 0; k < n; ++k) {
        if (!ref_grad[k].defined()) continue;
        at::Tensor g = leaves[k].grad();
        if (!g.defined()) g = at::zeros_like(leaves[k]);
        Placements gp = pls[k];
        for (auto& p : gp)
          if (tdc::tensor::is_partial(p)) p = Replicate{};  // d loss / d part = d loss / d value
        // Each rank's gradient against its own piece of the reference's, cut as make_input cut
        // the input: no collective, so the sweep waits on the ops' own communication only.
        const at::Tensor expected = local_piece(ref_grad[k], mesh, gp);
        if (!close(g.detach(), expected)) {
          ok = false;
          ADD_FAILURE() << "wrong gradient of input " << k << " on rank " << mesh.get_rank() << ": " << where << " -> "
                        << tdc::tensor::to_string(out.placements()) << "\nexpected " << expected << "\ngot " << g;
        }
      }
      if (ok) {
        ++report.passed;
        report.supported.insert(c.name + "|" + mesh_name + "|" + key(pls));
      }
    } catch (const std::invalid_argument& e) {
      if (std::string(e.what()).find("no sharding rule") != std::string::npos) {
        report.missing.push_back(where + ": " + e.what());
      } else {
        ADD_FAILURE() << where << ": unexpected error: " << e.what();
      }
    }
    size_t k = n;
    while (k > 0) {
      --k;
      if (++idx[k] < options[k].size()) break;
      idx[k] = 0;
      if (k == 0) goto done;
    }
    if (n == 0) break;
  }
done:
  return;
}

std::vector<OpCase> cases() {
  std::vector<OpCase> cs;
  auto a48 = randn({4, 8}, 1), b48 = randn({4, 8}, 2), b8 = randn({8}, 3);
  auto pos48 = randn({4, 8}, 4).abs() + 0.5;
  using V = std::vector<DTensor>;
  using T = std::vector<at::Tensor>;
  cs.push_back(
      {"add", {{a48}, {b48}}, [](const V& v) { return ops::add(v[0], v[1]); }, [](const T& t) { return t[0] + t[1]; }});
  cs.push_back({"add_broadcast",
                {{a48}, {b8}},
                [](const V& v) { return ops::add(v[0], v[1]); },
                [](const T& t) { return t[0] + t[1]; }});
  cs.push_back(
      {"sub", {{a48}, {b48}}, [](const V& v) { return ops::sub(v[0], v[1]); }, [](const T& t) { return t[0] - t[1]; }});
  cs.push_back(
      {"mul", {{a48}, {b48}}, [](const V& v) { return ops::mul(v[0], v[1]); }, [](const T& t) { return t[0] * t[1]; }});
  cs.push_back({"mul_broadcast",
                {{a48}, {b8}},
                [](const V& v) { return ops::mul(v[0], v[1]); },
                [](const T& t) { return t[0] * t[1]; }});
  cs.push_back({"div",
                {{a48}, {pos48}},
                [](const V& v) { return ops::div(v[0], v[1]); },
                [](const T& t) { return t[0] / t[1]; }});
  cs.push_back({"neg", {{a48}}, [](const V& v) { return ops::neg(v[0]); }, [](const T& t) { return -t[0]; }});
  cs.push_back(
      {"relu", {{a48}}, [](const V& v) { return ops::relu(v[0]); }, [](const T& t) { return at::relu(t[0]); }});
  cs.push_back(
      {"gelu", {{a48}}, [](const V& v) { return ops::gelu(v[0]); }, [](const T& t) { return at::gelu(t[0]); }});
  cs.push_back(
      {"tanh", {{a48}}, [](const V& v) { return ops::tanh(v[0]); }, [](const T& t) { return at::tanh(t[0]); }});
  cs.push_back({"sum_all", {{a48}}, [](const V& v) { return ops::sum(v[0]); }, [](const T& t) { return t[0].sum(); }});
  cs.push_back(
      {"sum_dim1", {{a48}}, [](const V& v) { return ops::sum(v[0], {1}); }, [](const T& t) { return t[0].sum({1}); }});
  cs.push_back({"sum_dim0_keepdim",
                {{a48}},
                [](const V& v) { return ops::sum(v[0], {0}, true); },
                [](const T& t) { return t[0].sum({0}, true); }});
  cs.push_back({"mean_dim1",
                {{a48}},
                [](const V& v) { return ops::mean(v[0], {-1}); },
                [](const T& t) { return t[0].mean({-1}); }});
  cs.push_back(
      {"mean_all", {{a48}}, [](const V& v) { return ops::mean(v[0]); }, [](const T& t) { return t[0].mean(); }});
  auto m84 = randn({8, 4}, 5), w48 = randn({4, 8}, 6), bias4 = randn({4}, 7);
  cs.push_back({"mm",
                {{a48}, {m84}},
                [](const V& v) { return ops::mm(v[0], v[1]); },
                [](const T& t) { return at::mm(t[0], t[1]); }});
  cs.push_back({"addmm",
                {{bias4, false, true}, {a48}, {m84}},
                [](const V& v) { return ops::addmm(v[0], v[1], v[2]); },
                [](const T& t) { return at::addmm(t[0], t[1], t[2]); },
                true});
  cs.push_back({"linear",
                {{a48}, {w48}, {bias4, false, true}},
                [](const V& v) { return ops::linear(v[0], v[1], v[2]); },
                [](const T& t) { return at::linear(t[0], t[1], t[2]); }});
  cs.push_back({"linear_nobias",
                {{a48}, {w48}},
                [](const V& v) { return ops::linear(v[0], v[1]); },
                [](const T& t) { return at::linear(t[0], t[1]); }});
  auto vocab = randn({8, 4}, 8);
  auto indices = at::tensor({0, 7, 3, 3, 6, 1, 2, 5}, at::kLong).view({2, 4});
  cs.push_back({"embedding",
                {{vocab}, {indices, true}},
                [](const V& v) { return ops::embedding(v[0], v[1]); },
                [](const T& t) { return at::embedding(t[0], t[1]); }});
  cs.push_back({"transpose",
                {{a48}},
                [](const V& v) { return ops::transpose(v[0], 0, 1); },
                [](const T& t) { return t[0].transpose(0, 1); }});
  cs.push_back({"view_flatten",
                {{a48}},
                [](const V& v) { return ops::view(v[0], {32}); },
                [](const T& t) { return t[0].reshape({32}); }});
  cs.push_back({"view_split",
                {{a48}},
                [](const V& v) {
                  return ops::view(v[0], {4, 2, 4});
                },
                [](const T& t) {
                  return t[0].reshape({4, 2, 4});
                }});
  cs.push_back({"reshape",
                {{a48}},
                [](const V& v) {
                  return ops::reshape(v[0], {2, 16});
                },
                [](const T& t) {
                  return t[0].reshape({2, 16});
                }});
  return cs;
}

void print_summary(const std::string& mesh_name, const std::map<std::string, Report>& reports) {
  if (tdc::harness::ctx().rank != 0) return;
  std::printf("== DTensor ops strategy check, %s mesh ==\n", mesh_name.c_str());
  for (const auto& [op, r] : reports) {
    std::printf("  %-18s %4d combinations, %4d correct, %4zu without a rule\n", op.c_str(), r.tested, r.passed,
                r.missing.size());
    for (const auto& m : r.missing) std::printf("      missing: %s\n", m.c_str());
  }
  std::fflush(stdout);
}

void run_checker(const DeviceMesh& mesh, const std::string& mesh_name) {
  tdc::comm::set_argument_checks(false);  // thousands of small collectives; shapes are known equal
  std::map<std::string, Report> reports;
  for (const auto& c : cases())
    if (mesh.ndim() == 1 || !c.only_1d) check_case(c, mesh, mesh_name, reports[c.name]);
  print_summary(mesh_name, reports);
  for (const auto& req : kTpRequired) {
    if (req.mesh != mesh_name) continue;
    const auto& r = reports[req.op];
    EXPECT_TRUE(r.supported.count(std::string(req.op) + "|" + mesh_name + "|" + req.placements))
        << "TP needs " << req.op << " with " << req.placements << " on a " << mesh_name
        << " mesh: not supported or wrong";
  }
}

TDC_DIST_SUITE(DTensorOpsTest, .world_size = 4, .timeout_s = 600);

TDC_DIST_TEST(DTensorOpsTest, StrategyChecker1D) {
  tdc::conformance::world();
  run_checker(tdc::init_device_mesh("cpu", {4}), "1d");
}

TDC_DIST_TEST(DTensorOpsTest, StrategyChecker2D) {
  tdc::conformance::world();
  run_checker(tdc::init_device_mesh("cpu", {2, 2}, {"dp", "tp"}), "2d");
}

// Outputs' placements for the rules TP relies on (the checker proves values; this pins layouts).
TDC_DIST_TEST(DTensorOpsTest, RuleOutputs) {
  tdc::conformance::world();
  auto mesh = tdc::init_device_mesh("cpu", {4});
  at::Tensor leaf;
  auto x = make_input(randn({4, 8}, 1), mesh, {Replicate{}}, 1, &leaf);
  auto xs = make_input(randn({4, 8}, 1), mesh, {Shard{1}}, 1, &leaf);
  auto w0 = make_input(randn({4, 8}, 2), mesh, {Shard{0}}, 2, &leaf);
  auto w1 = make_input(randn({4, 8}, 2), mesh, {Shard{1}}, 2, &leaf);
  auto idx = make_input(at::zeros({2, 3}, at::kLong), mesh, {Replicate{}}, 3, &leaf);
  auto v0 = make_input(randn({8, 4}, 4), mesh, {Shard{0}}, 4, &leaf);
  auto v1 = make_input(randn({8, 4}, 4), mesh, {Shard{1}}, 4, &leaf);
  EXPECT_EQ(tdc::tensor::to_string(ops::linear(x, w0).placements()), "(Shard(1))");
  EXPECT_EQ(tdc::tensor::to_string(ops::linear(xs, w1).placements()), "(Partial(sum))");
  EXPECT_EQ(tdc::tensor::to_string(ops::embedding(v0, idx).placements()), "(Partial(sum))");
  EXPECT_EQ(tdc::tensor::to_string(ops::embedding(v1, idx).placements()), "(Shard(2))");
  EXPECT_EQ(tdc::tensor::to_string(ops::mm(xs, make_input(randn({8, 4}, 5), mesh, {Shard{0}}, 5, &leaf)).placements()),
            "(Partial(sum))");
  EXPECT_EQ(tdc::tensor::to_string(ops::sum(w0, {0}).placements()), "(Partial(sum))");
  EXPECT_EQ(tdc::tensor::to_string(ops::transpose(w0, 0, 1).placements()), "(Shard(1))");
}

TDC_DIST_TEST(DTensorOpsTest, ErrorsNameOpAndPlacements) {
  tdc::conformance::world();
  auto mesh = tdc::init_device_mesh("cpu", {4});
  at::Tensor leaf;
  auto pmax = tdc::tensor::from_local(randn({4, 8}, 1), mesh, {Partial{tdc::comm::ReduceOp::MAX}});
  auto s0 = make_input(randn({8, 4}, 2), mesh, {Shard{0}}, 2, &leaf);
  try {
    ops::mm(pmax, s0);
    ADD_FAILURE() << "mm with Partial(max) did not throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("mm: no sharding rule for placements (Partial(max)) x (Shard(0))"));
  }
  EXPECT_THROW(ops::relu(pmax), std::invalid_argument);
  auto v = make_input(randn({4, 8}, 1), mesh, {Shard{1}}, 1, &leaf);
  try {
    ops::view(v, {32});
    ADD_FAILURE() << "view of a Shard(1) tensor into 1-D did not throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("view: no sharding rule"));
  }
  // Different meshes.
  auto mesh2 = tdc::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  auto other = make_input(randn({4, 8}, 1), mesh2, {Replicate{}, Replicate{}}, 1, &leaf);
  try {
    ops::add(v, other);
    ADD_FAILURE() << "add across meshes did not throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("different meshes"));
    EXPECT_THAT(e.what(), HasSubstr(mesh.to_string()));
    EXPECT_THAT(e.what(), HasSubstr(mesh2.to_string()));
  }
}

}  // namespace
