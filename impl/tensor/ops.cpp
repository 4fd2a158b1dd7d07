// DTensor ops with sharding rules. Each op decides, mesh dim by mesh dim, the output placement
// from its inputs' placements (the rule tables below), redistributes an input where the rule
// asks for it, runs the ATen op on the local tensors and wraps the result.
//
// [Note: Partial(max/min)] Only SUM and AVG partials are linear; every op here rejects a
// Partial(max) / Partial(min) input with "no sharding rule" instead of silently all-reducing.
//
// [Note: gradients of replicated inputs] An input that is Replicate on mesh dim i while the output
// is sharded or partial on i contributes, on each rank, only to that rank's piece of the output:
// its locally computed gradient is a partial sum over dim i. Such inputs are routed through
// `reduce_grad_over` (forward identity, backward all-reduce SUM over dim i's group), the
// Megatron "f" function. Every rank therefore has to reach that backward: ops keep every input in
// the graph even where its local contribution is zero (masked embedding rows, an empty shard).
//
// [Note: Replicate -> Partial] add/sub of a Partial(SUM) and a Replicate keeps the output Partial:
// the replicated operand is added on coordinate 0 of the partial mesh dims only (multiplied by
// zero elsewhere, which keeps it in the graph), as PyTorch's Replicate -> Partial partition.
#include "tdc/tensor/ops.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>

#include "tdc/comm/collectives.h"
#include "tdc/tensor/detail/layout.h"

namespace tdc::tensor::ops {
namespace {

using Shape = std::vector<int64_t>;

using detail::contiguous_stride;
using detail::shape_str;

DTensor make(at::Tensor local, const DeviceMesh& mesh, Placements placements, Shape shape) {
  DTensorSpec spec{mesh, std::move(placements), shape, contiguous_stride(shape), local.scalar_type()};
  return DTensor(std::move(local), std::move(spec));
}

std::optional<int64_t> shard_dim(const Placement& p) {
  if (const auto* s = std::get_if<Shard>(&p)) return s->dim;
  return std::nullopt;
}
const Partial* partial_of(const Placement& p) { return std::get_if<Partial>(&p); }
bool linear_partial(const Partial& p) { return p.op == comm::ReduceOp::SUM || p.op == comm::ReduceOp::AVG; }

std::string describe(std::initializer_list<const DTensor*> xs) {
  std::string s;
  for (const DTensor* x : xs) {
    if (!s.empty()) s += " x ";
    s += to_string(x->placements());
  }
  return s;
}

[[noreturn]] void no_rule(const std::string& op, std::initializer_list<const DTensor*> xs,
                          const std::string& why = "") {
  throw std::invalid_argument(op + ": no sharding rule for placements " + describe(xs) +
                              (why.empty() ? "" : " (" + why + ")"));
}

void require_defined(const std::string& op, const DTensor& x, const char* what) {
  if (!x.defined()) throw std::invalid_argument(op + ": " + what + " is an undefined DTensor");
}

void check_same_mesh(const std::string& op, const DTensor& a, const DTensor& b) {
  if (!(a.device_mesh() == b.device_mesh()))
    throw std::invalid_argument(op + ": DTensors on different meshes: " + a.device_mesh().to_string() + " and " +
                                b.device_mesh().to_string());
}

// Placements with Shard dims normalised; StridedShard and non-linear partials have no rule.
Placements normalized(const std::string& op, const DTensor& x, std::initializer_list<const DTensor*> all) {
  Placements out = x.placements();
  for (auto& p : out) {
    if (std::holds_alternative<StridedShard>(p)) no_rule(op, all, "StridedShard is not supported by ops");
    if (const auto* pp = partial_of(p); pp && !linear_partial(*pp)) no_rule(op, all);
    if (auto d = shard_dim(p); d && *d < 0) p = Shard{*d + x.dim()};
  }
  return out;
}

DTensor redistributed(const DTensor& x, const Placements& target) {
  if (x.placements() == target) return x;
  return x.redistribute(target);
}

// See [Note: gradients of replicated inputs].
at::Tensor reduce_grad_over(const at::Tensor& local, const DeviceMesh& mesh, const Placements& in,
                            const Placements& out) {
  if (!local.requires_grad()) return local;
  at::Tensor t = local;
  for (int64_t i = 0; i < mesh.ndim(); ++i) {
    if (!is_replicate(in[i]) || is_replicate(out[i]) || mesh.size(i) == 1) continue;
    comm::GroupPtr group = mesh.get_group(i);
    t = t.view_as(t);
    t.register_hook([group](const at::Tensor& grad) {
      at::Tensor g = grad.contiguous().clone();
      comm::all_reduce(g, comm::ReduceOp::SUM, group);
      return g;
    });
  }
  return t;
}

// See [Note: Replicate -> Partial]: keeps a replicated operand on coordinate 0 of every mesh dim
// where the output is Partial(SUM) and the operand is Replicate.
at::Tensor partition_for_partial(const at::Tensor& local, const DeviceMesh& mesh, const Placements& in,
                                 const Placements& out) {
  bool keep = true, any = false;
  for (int64_t i = 0; i < mesh.ndim(); ++i) {
    const auto* p = partial_of(out[i]);
    if (!p || p->op != comm::ReduceOp::SUM || !is_replicate(in[i])) continue;
    any = true;
    if (mesh.get_local_rank(i) != 0) keep = false;
  }
  if (!any || keep) return local;
  return local.mul(0);
}

// ------------------------------------------------------------------------------- elementwise
//
// Rule table, per mesh dim (S(e) = Shard of output dim e after broadcasting):
//   R    , R     -> R
//   S(e) , S(e)  -> S(e)
//   S(e) , R     -> S(e)   (R sliced locally to S(e) unless it broadcasts along e)
//   S(e) , S(f)  -> S(e)   (b redistributed to follow a)
//   P    , P     -> P      add/sub;            mul/div: both -> R
//   P    , R     -> P      add/sub (partition, SUM) / mul / div
//   R    , P     -> P      add/sub / mul;      div: b -> R
//   P    , S(e)  -> S(e)   (P reduce-scattered to S(e); -> R if it broadcasts along e)
// A Shard on a dim that broadcasts (size 1 against a larger size) is first gathered to R.

enum class Linearity { Additive, Mul, Div };

Shape broadcast_shape(const std::string& op, const DTensor& a, const DTensor& b) {
  size_t n = std::max(a.shape().size(), b.shape().size());
  Shape out(n, 1);
  for (size_t k = 0; k < n; ++k) {
    int64_t da = k < n - a.shape().size() ? 1 : a.shape()[k - (n - a.shape().size())];
    int64_t db = k < n - b.shape().size() ? 1 : b.shape()[k - (n - b.shape().size())];
    if (da != db && da != 1 && db != 1)
      throw std::invalid_argument(op + ": shapes " + shape_str(a.shape()) + " and " + shape_str(b.shape()) +
                                  " do not broadcast");
    out[k] = da == 1 ? db : da;
  }
  return out;
}

DTensor binary(const std::string& op, Linearity lin, const DTensor& a, const DTensor& b,
               at::Tensor (*fn)(const at::Tensor&, const at::Tensor&)) {
  require_defined(op, a, "first operand");
  require_defined(op, b, "second operand");
  check_same_mesh(op, a, b);
  Shape out_shape = broadcast_shape(op, a, b);
  const auto no = static_cast<int64_t>(out_shape.size());
  const DeviceMesh& mesh = a.device_mesh();
  Placements ta = normalized(op, a, {&a, &b}), tb = normalized(op, b, {&a, &b});
  Placements to(mesh.ndim(), Replicate{});

  // Output dim of input dim d, and back (nullopt where x broadcasts along e).
  auto to_out = [&](const DTensor& x, int64_t d) { return d + no - x.dim(); };
  auto to_in = [&](const DTensor& x, int64_t e) -> std::optional<int64_t> {
    int64_t d = e - (no - x.dim());
    if (d < 0 || (x.shape()[d] == 1 && out_shape[e] != 1)) return std::nullopt;
    return d;
  };
  auto follow = [&](const DTensor& x, int64_t e) -> Placement {
    if (auto d = to_in(x, e)) return Shard{*d};
    return Replicate{};
  };

  for (int64_t i = 0; i < mesh.ndim(); ++i) {
    for (auto* pair : {&ta, &tb}) {  // shards along broadcast dims gather first
      const DTensor& x = pair == &ta ? a : b;
      if (auto d = shard_dim((*pair)[i]); d && !to_in(x, to_out(x, *d))) (*pair)[i] = Replicate{};
    }
    Placement& pa = ta[i];
    Placement& pb = tb[i];
    auto sa = shard_dim(pa), sb = shard_dim(pb);
    const Partial *qa = partial_of(pa), *qb = partial_of(pb);
    if (is_replicate(pa) && is_replicate(pb)) {
      to[i] = Replicate{};
    } else if (sa) {
      int64_t e = to_out(a, *sa);
      pb = follow(b, e);
      to[i] = Shard{e};
    } else if (sb) {
      int64_t e = to_out(b, *sb);
      pa = follow(a, e);
      to[i] = Shard{e};
    } else if (qa && qb) {
      if (lin == Linearity::Additive && qa->op == qb->op) {
        to[i] = *qa;
      } else {
        pa = Replicate{};
        pb = Replicate{};
      }
    } else if (qa) {  // P, R
      to[i] = *qa;
    } else {  // R, P
      if (lin == Linearity::Div) {
        pb = Replicate{};
      } else {
        to[i] = *qb;
      }
    }
  }
  DTensor ra = redistributed(a, ta), rb = redistributed(b, tb);
  at::Tensor la = ra.to_local(), lb = rb.to_local();
  // The all-reduce of the gradient sits before the partition (it sums the kept and the zeroed
  // copies' gradients).
  la = reduce_grad_over(la, mesh, ta, to);
  lb = reduce_grad_over(lb, mesh, tb, to);
  if (lin == Linearity::Additive) {
    la = partition_for_partial(la, mesh, ta, to);
    lb = partition_for_partial(lb, mesh, tb, to);
  }
  return make(fn(la, lb), mesh, to, out_shape);
}

// Unary: placements pass through; a Partial passes only through a linear op (neg), else -> R.
DTensor unary(const std::string& op, bool linear, const DTensor& a, at::Tensor (*fn)(const at::Tensor&)) {
  require_defined(op, a, "operand");
  Placements t = normalized(op, a, {&a});
  if (!linear)
    for (auto& p : t)
      if (is_partial(p)) p = Replicate{};
  DTensor r = redistributed(a, t);
  return make(fn(r.to_local()), a.device_mesh(), t, a.shape());
}

// --------------------------------------------------------------------------------- reductions
//
// Per mesh dim: Shard(d), d reduced -> Partial(SUM); Shard(d), d kept -> Shard(d'), d' = d less
// the reduced dims before it (keepdim: d); Partial(SUM/AVG) -> same Partial; R -> R.
// mean is computed as local sum / global count, so uneven shards stay exact.

DTensor reduce(const std::string& op, bool is_mean, const DTensor& a, std::vector<int64_t> dims, bool keepdim) {
  require_defined(op, a, "operand");
  const int64_t n = a.dim();
  if (dims.empty())
    for (int64_t d = 0; d < n; ++d) dims.push_back(d);
  std::vector<bool> reduced(n, false);
  for (int64_t& d : dims) {
    if (d < -n || d >= std::max<int64_t>(n, 1))
      throw std::invalid_argument(op + ": dim " + std::to_string(d) + " out of range for a tensor of " +
                                  std::to_string(n) + " dims");
    if (d < 0) d += n;
    if (n > 0) reduced[d] = true;
  }
  Placements in = normalized(op, a, {&a});
  Placements out = in;
  for (auto& p : out) {
    if (auto d = shard_dim(p)) {
      if (reduced[*d]) {
        p = Partial{comm::ReduceOp::SUM};
      } else if (!keepdim) {
        int64_t before = 0;
        for (int64_t k = 0; k < *d; ++k) before += reduced[k] ? 1 : 0;
        p = Shard{*d - before};
      }
    }
  }
  Shape out_shape;
  int64_t count = 1;
  for (int64_t d = 0; d < n; ++d) {
    if (reduced[d]) {
      count *= a.shape()[d];
      if (keepdim) out_shape.push_back(1);
    } else {
      out_shape.push_back(a.shape()[d]);
    }
  }
  at::Tensor local = a.to_local();
  at::Tensor r = n == 0 ? local.clone() : at::sum(local, dims, keepdim);
  if (is_mean) r = r / static_cast<double>(std::max<int64_t>(count, 1));
  return make(r, a.device_mesh(), out, out_shape);
}

// ----------------------------------------------------------------------------------- matmul
//
// a [..rows.., k] x b (k on dim b_k, columns on dim b_n) -> out [..rows.., n]. Per mesh dim
// (Sr = Shard of a row dim, Sk = Shard of the contracted dim, Sn = Shard of b's column dim):
//   R , R  -> R           Sr, R  -> Sr          R , Sn -> Shard(last)
//   Sk, Sk -> Partial(SUM)
//   P , R  -> P           R , P  -> P
// and, redistributing first (as PyTorch's cost model would pick the cheap side):
//   Sk, R  -> b sliced to Sk (local)      R , Sk -> a sliced to Sk (local)
//   Sr, Sk / Sr, Sn -> b gathered to R    Sk, Sn -> a gathered to R
//   Sn on both / P with a Shard / P, P -> the partial (or a) to R, then the table again

struct MatmulDims {
  int64_t b_k, b_n;
};

DTensor matmul_like(const std::string& op, const DTensor& a, const DTensor& b, MatmulDims md,
                    at::Tensor (*fn)(const at::Tensor&, const at::Tensor&)) {
  require_defined(op, a, "first operand");
  require_defined(op, b, "second operand");
  check_same_mesh(op, a, b);
  if (a.dim() < 1 || b.dim() != 2)
    throw std::invalid_argument(op + ": expected a [.., k] and a 2-D second operand, got shapes " +
                                shape_str(a.shape()) + " and " + shape_str(b.shape()));
  const int64_t a_k = a.dim() - 1;
  if (a.shape()[a_k] != b.shape()[md.b_k])
    throw std::invalid_argument(op + ": contracted sizes differ: shapes " + shape_str(a.shape()) + " and " +
                                shape_str(b.shape()));
  const DeviceMesh& mesh = a.device_mesh();
  Placements ta = normalized(op, a, {&a, &b}), tb = normalized(op, b, {&a, &b});
  Placements to(mesh.ndim(), Replicate{});
  Shape out_shape(a.shape().begin(), a.shape().end() - 1);
  out_shape.push_back(b.shape()[md.b_n]);
  const int64_t out_n = static_cast<int64_t>(out_shape.size()) - 1;

  for (int64_t i = 0; i < mesh.ndim(); ++i) {
    Placement& pa = ta[i];
    Placement& pb = tb[i];
    for (int round = 0; round < 4; ++round) {
      auto sa = shard_dim(pa), sb = shard_dim(pb);
      const Partial *qa = partial_of(pa), *qb = partial_of(pb);
      bool a_row = sa && *sa != a_k, a_k_ = sa && *sa == a_k;
      bool b_k = sb && *sb == md.b_k, b_n = sb && *sb == md.b_n;
      bool ra = is_replicate(pa), rb = is_replicate(pb);
      if (ra && rb) {
        to[i] = Replicate{};
        break;
      }
      if (a_row && rb) {
        to[i] = Shard{*sa};
        break;
      }
      if (ra && b_n) {
        to[i] = Shard{out_n};
        break;
      }
      if (a_k_ && b_k) {
        to[i] = Partial{comm::ReduceOp::SUM};
        break;
      }
      if (qa && rb) {
        to[i] = *qa;
        break;
      }
      if (ra && qb) {
        to[i] = *qb;
        break;
      }
      // Redistribute one side and look again.
      if (a_k_ && rb) {
        pb = Shard{md.b_k};
        continue;
      }
      if (ra && b_k) {
        pa = Shard{a_k};
        continue;
      }
      if (a_row && sb) {
        pb = Replicate{};
        continue;
      }
      if (a_k_ && b_n) {
        pa = Replicate{};
        continue;
      }
      if (qa) {
        pa = Replicate{};
        continue;
      }
      if (qb) {
        pb = Replicate{};
        continue;
      }
      pa = Replicate{};  // Sn on a's side cannot happen; anything left gathers a
    }
  }
  DTensor ra = redistributed(a, ta), rb = redistributed(b, tb);
  at::Tensor la = reduce_grad_over(ra.to_local(), mesh, ta, to);
  at::Tensor lb = reduce_grad_over(rb.to_local(), mesh, tb, to);
  return make(fn(la, lb), mesh, to, out_shape);
}

at::Tensor local_mm(const at::Tensor& a, const at::Tensor& b) { return at::matmul(a, b); }
at::Tensor local_linear(const at::Tensor& x, const at::Tensor& w) { return at::linear(x, w); }

// ------------------------------------------------------------------------------------- views

// Groups of input and output dims (size-1 dims left out) whose products agree.
struct DimGroup {
  std::vector<int64_t> in, out;
};
std::vector<DimGroup> dim_groups(const Shape& in, const Shape& out) {
  std::vector<int64_t> ia, oa;
  for (int64_t d = 0; d < static_cast<int64_t>(in.size()); ++d)
    if (in[d] != 1) ia.push_back(d);
  for (int64_t d = 0; d < static_cast<int64_t>(out.size()); ++d)
    if (out[d] != 1) oa.push_back(d);
  std::vector<DimGroup> groups;
  size_t i = 0, j = 0;
  while (i < ia.size() && j < oa.size()) {
    DimGroup g;
    int64_t pi = in[ia[i]], pj = out[oa[j]];
    g.in.push_back(ia[i++]);
    g.out.push_back(oa[j++]);
    while (pi != pj) {
      if (pi < pj && i < ia.size()) {
        pi *= in[ia[i]];
        g.in.push_back(ia[i++]);
      } else if (pj < pi && j < oa.size()) {
        pj *= out[oa[j]];
        g.out.push_back(oa[j++]);
      } else {
        return {};
      }
    }
    groups.push_back(std::move(g));
  }
  return groups;
}

Shape infer_shape(const std::string& op, const DTensor& a, Shape shape) {
  int64_t numel = 1, known = 1, infer = -1;
  for (int64_t s : a.shape()) numel *= s;
  for (int64_t k = 0; k < static_cast<int64_t>(shape.size()); ++k) {
    if (shape[k] == -1) {
      if (infer >= 0) throw std::invalid_argument(op + ": only one dim may be -1 in " + shape_str(shape));
      infer = k;
    } else {
      known *= shape[k];
    }
  }
  if (infer >= 0 && known != 0) shape[infer] = numel / known;
  int64_t prod = 1;
  for (int64_t s : shape) prod *= s;
  if (prod != numel)
    throw std::invalid_argument(op + ": shape " + shape_str(shape) + " is invalid for a tensor of shape " +
                                shape_str(a.shape()));
  return shape;
}

// A Shard(d) survives a view when d opens its dim group and both d and the group's first output
// dim divide evenly by the mesh dims sharding d (then every local block is a contiguous slab).
DTensor view_like(const std::string& op, bool may_redistribute, const DTensor& a, const Shape& req) {
  require_defined(op, a, "operand");
  Shape shape = infer_shape(op, a, req);
  const DeviceMesh& mesh = a.device_mesh();
  Placements in = normalized(op, a, {&a});
  auto groups = dim_groups(a.shape(), shape);
  Placements target = in, out = in;
  for (int64_t i = 0; i < mesh.ndim(); ++i) {
    auto d = shard_dim(in[i]);
    if (!d) continue;
    int64_t ways = 1;
    for (int64_t k = 0; k < mesh.ndim(); ++k)
      if (shard_dim(in[k]) == d) ways *= mesh.size(k);
    std::optional<int64_t> e;
    for (const auto& g : groups)
      if (g.in.front() == *d && a.shape()[*d] % ways == 0 && shape[g.out.front()] % ways == 0) e = g.out.front();
    if (e) {
      out[i] = Shard{*e};
    } else if (may_redistribute) {
      target[i] = out[i] = Replicate{};
    } else {
      throw std::invalid_argument(op + ": no sharding rule for placements " + to_string(a.placements()) + " viewing " +
                                  shape_str(a.shape()) + " as " + shape_str(shape) +
                                  " (use reshape, which redistributes)");
    }
  }
  DTensor r = redistributed(a, target);
  // The local shape under the output placements (the same element count by the rule above).
  DTensorSpec probe{mesh, out, shape, contiguous_stride(shape), a.spec().dtype};
  at::Tensor local = r.to_local().reshape(probe.local_shape());
  return make(local, mesh, out, shape);
}

}  // namespace

DTensor add(const DTensor& a, const DTensor& b) {
  return binary("add", Linearity::Additive, a, b, [](const at::Tensor& x, const at::Tensor& y) { return x + y; });
}
DTensor sub(const DTensor& a, const DTensor& b) {
  return binary("sub", Linearity::Additive, a, b, [](const at::Tensor& x, const at::Tensor& y) { return x - y; });
}
DTensor mul(const DTensor& a, const DTensor& b) {
  return binary("mul", Linearity::Mul, a, b, [](const at::Tensor& x, const at::Tensor& y) { return x * y; });
}
DTensor div(const DTensor& a, const DTensor& b) {
  return binary("div", Linearity::Div, a, b, [](const at::Tensor& x, const at::Tensor& y) { return x / y; });
}
DTensor neg(const DTensor& a) {
  return unary("neg", true, a, [](const at::Tensor& x) { return at::neg(x); });
}
DTensor relu(const DTensor& a) {
  return unary("relu", false, a, [](const at::Tensor& x) { return at::relu(x); });
}
DTensor gelu(const DTensor& a) {
  return unary("gelu", false, a, [](const at::Tensor& x) { return at::gelu(x); });
}
DTensor tanh(const DTensor& a) {
  return unary("tanh", false, a, [](const at::Tensor& x) { return at::tanh(x); });
}

DTensor sum(const DTensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce("sum", false, a, dims, keepdim);
}
DTensor mean(const DTensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce("mean", true, a, dims, keepdim);
}

DTensor mm(const DTensor& a, const DTensor& b) {
  if (a.defined() && a.dim() != 2)
    throw std::invalid_argument("mm: expected a 2-D first operand, got " + shape_str(a.shape()));
  return matmul_like("mm", a, b, {0, 1}, local_mm);
}

DTensor addmm(const DTensor& bias, const DTensor& a, const DTensor& b) {
  require_defined("addmm", bias, "bias");
  if (a.defined()) check_same_mesh("addmm", bias, a);
  if (a.defined() && a.dim() != 2)
    throw std::invalid_argument("addmm: expected a 2-D first operand, got " + shape_str(a.shape()));
  return binary("addmm", Linearity::Additive, matmul_like("addmm", a, b, {0, 1}, local_mm), bias,
                [](const at::Tensor& x, const at::Tensor& y) { return x + y; });
}

DTensor linear(const DTensor& input, const DTensor& weight, const std::optional<DTensor>& bias) {
  DTensor y = matmul_like("linear", input, weight, {1, 0}, local_linear);
  if (!bias) return y;
  check_same_mesh("linear", weight, *bias);
  return binary("linear", Linearity::Additive, y, *bias,
                [](const at::Tensor& x, const at::Tensor& b) { return x + b; });
}

// Per mesh dim (weight [V, D], indices any shape):
//   R , R    -> R                 R , S(d) -> S(d)
//   S0, R    -> Partial(SUM)      (rows outside the local vocabulary masked to zero: MaskPartial)
//   S1, R    -> Shard(last)       P , R    -> P
//   S0 or S1, S(d) -> indices gathered to R first;   P, S(d) -> weight to R first
// Partial indices have no rule.
DTensor embedding(const DTensor& weight, const DTensor& indices) {
  const std::string op = "embedding";
  require_defined(op, weight, "weight");
  require_defined(op, indices, "indices");
  check_same_mesh(op, weight, indices);
  if (weight.dim() != 2) throw std::invalid_argument(op + ": weight must be 2-D, got " + shape_str(weight.shape()));
  const DeviceMesh& mesh = weight.device_mesh();
  Placements tw = normalized(op, weight, {&weight, &indices}), ti = normalized(op, indices, {&weight, &indices});
  Placements to(mesh.ndim(), Replicate{});
  const int64_t last = indices.dim();
  bool masked = false;
  for (int64_t i = 0; i < mesh.ndim(); ++i) {
    if (is_partial(ti[i])) no_rule(op, {&weight, &indices}, "indices cannot be Partial");
    auto sw = shard_dim(tw[i]), si = shard_dim(ti[i]);
    if (si && (sw || is_partial(tw[i]))) {
      if (sw)
        ti[i] = Replicate{};
      else
        tw[i] = Replicate{};
      si = shard_dim(ti[i]);
    }
    if (sw && *sw == 0) {
      to[i] = Partial{comm::ReduceOp::SUM};
      masked = true;
    } else if (sw)
      to[i] = Shard{last};
    else if (const auto* q = partial_of(tw[i]))
      to[i] = *q;
    else if (si)
      to[i] = Shard{*si};
  }
  DTensor rw = redistributed(weight, tw), ri = redistributed(indices, ti);
  at::Tensor lw = reduce_grad_over(rw.to_local(), mesh, tw, to);
  at::Tensor li = ri.to_local();
  Shape out_shape = indices.shape();
  out_shape.push_back(weight.shape()[1]);
  at::Tensor out;
  if (!masked) {
    out = at::embedding(lw, li);
  } else {
    int64_t offset = rw.spec().local_offset()[0], rows = lw.size(0);
    at::Tensor outside = (li < offset).logical_or(li >= offset + rows);
    if (rows == 0) {
      // No vocabulary here: zeros, with the (empty) weight kept in the graph.
      Shape s(li.sizes().begin(), li.sizes().end());
      s.push_back(lw.size(1));
      out = at::zeros(s, lw.options()) + lw.sum() * 0;
    } else {
      at::Tensor local_idx = (li - offset).masked_fill(outside, 0);
      out = at::embedding(lw, local_idx).masked_fill(outside.unsqueeze(-1), 0);
    }
  }
  return make(out, mesh, to, out_shape);
}

// Shard(d) follows the swap; Replicate and Partial pass through.
DTensor transpose(const DTensor& a, int64_t dim0, int64_t dim1) {
  const std::string op = "transpose";
  require_defined(op, a, "operand");
  const int64_t n = a.dim();
  auto norm = [&](int64_t d) {
    if (d < -n || d >= n)
      throw std::invalid_argument(op + ": dim " + std::to_string(d) + " out of range for shape " +
                                  shape_str(a.shape()));
    return d < 0 ? d + n : d;
  };
  dim0 = norm(dim0);
  dim1 = norm(dim1);
  Placements out = normalized(op, a, {&a});
  for (auto& p : out)
    if (auto d = shard_dim(p)) p = Shard{*d == dim0 ? dim1 : *d == dim1 ? dim0 : *d};
  Shape shape = a.shape();
  std::swap(shape[dim0], shape[dim1]);
  return make(a.to_local().transpose(dim0, dim1), a.device_mesh(), out, shape);
}

DTensor view(const DTensor& a, const std::vector<int64_t>& shape) { return view_like("view", false, a, shape); }
DTensor reshape(const DTensor& a, const std::vector<int64_t>& shape) { return view_like("reshape", true, a, shape); }

}  // namespace tdc::tensor::ops
