// The redistribute engine: one transition per mesh dim, each on that dim's process group.
//   Shard/StridedShard -> Replicate   all-gather (uneven: pad to the largest piece, gather, unpad)
//   Replicate -> Shard/StridedShard   take the local piece, no communication
//   Partial -> Replicate              all-reduce
//   Partial -> Shard/StridedShard     reduce-scatter (uneven: padded pieces)
//   Shard(i) -> Shard(j)              all-gather along i, then take the piece along j
//   Replicate -> Partial              SUM: value / n on every rank (PyTorch; integers: local
//                                     rank 0 keeps it, the others zeros); AVG/MAX/MIN: the value
//   Partial(a) -> Partial(b)          SUM<->AVG by scaling; others through Replicate
// Mesh dims whose placement changes are undone last-to-first and redone first-to-last, so that
// several mesh dims sharding one tensor dim nest in mesh-dim order (as PyTorch). A mesh dim that
// keeps its placement is redone too when an earlier changing dim shards the same tensor dim.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include "tdc/tensor/detail/layout.h"
#include "tdc/comm/collectives.h"
#include "tdc/comm/detail/collectives.h"

namespace tdc::tensor::detail {
namespace {

int64_t shard_dim_of(const Placement& p) {
  if (const auto* s = std::get_if<Shard>(&p)) return s->dim;
  if (const auto* s = std::get_if<StridedShard>(&p)) return s->dim;
  return -1;
}

// The size along tensor dim d of the piece that mesh dim i splits (placements before i applied).
int64_t parent_size(const DTensorSpec& spec, int64_t i, int64_t d) {
  return local_shape_at(spec, spec.mesh.get_coordinate(), i)[d];
}

at::Tensor index_tensor(const std::vector<int64_t>& idx) { return at::tensor(idx, at::kLong); }

// The member's piece of `x` (a tensor moved so that the split dim is dim 0).
at::Tensor take_piece(const at::Tensor& x, const Placement& p, int64_t n, int64_t m) {
  const int64_t parent = x.size(0);
  if (std::holds_alternative<Shard>(p)) {
    ChunkRange c = chunk_range(parent, n, m);
    return x.narrow(0, c.offset, c.size);
  }
  return x.index_select(0, index_tensor(member_indices(p, parent, n, m)));
}

int64_t numel_rest(const at::Tensor& x) {
  int64_t n = 1;
  for (int64_t k = 1; k < x.dim(); ++k) n *= x.size(k);
  return n;
}

at::Tensor pad_rows(const at::Tensor& x, int64_t rows) {
  if (x.size(0) == rows) return x.contiguous();
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = rows - x.size(0);
  return at::cat({x, at::zeros(shape, x.options())}, 0);
}

// Shard -> Replicate on mesh dim i.
at::Tensor gather(const at::Tensor& local, const DTensorSpec& cur, int64_t i) {
  const Placement& p = cur.placements[i];
  const int64_t d = shard_dim_of(p), n = cur.mesh.size(i);
  const int64_t parent = parent_size(cur, i, d);
  if (n == 1) return local;
  std::vector<int64_t> sizes(n);
  int64_t max_len = 0;
  for (int64_t m = 0; m < n; ++m) max_len = std::max(max_len, sizes[m] = member_size(p, parent, n, m));
  at::Tensor x = local.movedim(d, 0);
  std::vector<int64_t> out_shape = x.sizes().vec();
  // Members of one mesh-dim group share every other coordinate, hence the other dims' sizes:
  // they all skip the collective together.
  if (max_len == 0 || numel_rest(x) == 0) {
    out_shape[0] = parent;
    return at::empty(out_shape, x.options()).movedim(0, d).contiguous();
  }
  at::Tensor in = pad_rows(x, max_len);
  out_shape[0] = max_len * n;
  at::Tensor gathered = at::empty(out_shape, x.options());
  // DTensor's collectives are functional ones in PyTorch (funcol): counted as such.
  comm::detail::all_gather_into_tensor(gathered, in, cur.mesh.get_group(i), false, comm::OpKind::FunctionalAllGather);
  at::Tensor full;
  if (std::holds_alternative<Shard>(p)) {
    std::vector<at::Tensor> pieces;
    for (int64_t m = 0; m < n; ++m) pieces.push_back(gathered.narrow(0, m * max_len, sizes[m]));
    full = at::cat(pieces, 0);
  } else {
    out_shape[0] = parent;
    full = at::empty(out_shape, x.options());
    for (int64_t m = 0; m < n; ++m) {
      full.index_copy_(0, index_tensor(member_indices(p, parent, n, m)), gathered.narrow(0, m * max_len, sizes[m]));
    }
  }
  return full.movedim(0, d).contiguous();
}

// Replicate -> Shard on mesh dim i (target placement p): the local piece.
at::Tensor scatter(const at::Tensor& local, const Placement& p, const DeviceMesh& mesh, int64_t i) {
  const int64_t d = shard_dim_of(p);
  return take_piece(local.movedim(d, 0), p, mesh.size(i), mesh.get_local_rank(i)).movedim(0, d).contiguous();
}

// Partial -> Shard on mesh dim i.
at::Tensor reduce_scatter(const at::Tensor& local, comm::ReduceOp op, const Placement& p, const DeviceMesh& mesh,
                          int64_t i) {
  const int64_t d = shard_dim_of(p), n = mesh.size(i), me = mesh.get_local_rank(i);
  at::Tensor x = local.movedim(d, 0);
  const int64_t parent = x.size(0);
  if (n == 1) return local.clone();
  int64_t max_len = 0;
  for (int64_t m = 0; m < n; ++m) max_len = std::max(max_len, member_size(p, parent, n, m));
  std::vector<int64_t> shape = x.sizes().vec();
  if (max_len == 0 || numel_rest(x) == 0) {
    shape[0] = member_size(p, parent, n, me);
    return at::zeros(shape, x.options()).movedim(0, d).contiguous();
  }
  std::vector<at::Tensor> pieces;
  for (int64_t m = 0; m < n; ++m) pieces.push_back(pad_rows(take_piece(x, p, n, m), max_len));
  at::Tensor in = at::cat(pieces, 0);
  shape[0] = max_len;
  at::Tensor out = at::empty(shape, x.options());
  comm::detail::reduce_scatter_tensor(out, in, op, mesh.get_group(i), false, comm::OpKind::FunctionalReduceScatter);
  return out.narrow(0, 0, member_size(p, parent, n, me)).movedim(0, d).contiguous();
}

at::Tensor all_reduce(const at::Tensor& local, comm::ReduceOp op, const DeviceMesh& mesh, int64_t i) {
  at::Tensor out = local.clone(at::MemoryFormat::Contiguous);
  if (mesh.size(i) > 1 && out.numel() > 0) {
    comm::detail::all_reduce(out, op, mesh.get_group(i), false, comm::OpKind::FunctionalAllReduce);
  }
  return out;
}

at::Tensor replicate_to_partial(const at::Tensor& local, comm::ReduceOp op, const DeviceMesh& mesh, int64_t i) {
  if (op != comm::ReduceOp::SUM) return local.clone();
  // PyTorch 2.13 (Partial._partition_value): v / n on every rank. Integer tensors cannot be
  // divided exactly: there local rank 0 keeps the value and the others hold zeros.
  if (at::isFloatingType(local.scalar_type()) || at::isComplexType(local.scalar_type())) {
    return local / static_cast<double>(mesh.size(i));
  }
  return mesh.get_local_rank(i) == 0 ? local.clone() : at::zeros_like(local);
}

}  // namespace

at::Tensor redistribute_local(const at::Tensor& local, const DTensorSpec& from, const Placements& to) {
  const int64_t mesh_dims = from.mesh.ndim();
  DTensorSpec cur = from;
  if (to.size() != from.placements.size()) {
    throw std::invalid_argument(
        fmt::format("redistribute: target placements {} do not match the mesh's {} dims", to_string(to), mesh_dims));
  }
  // Which mesh dims must be undone and redone.
  std::vector<bool> dirty(mesh_dims);
  for (int64_t i = 0; i < mesh_dims; ++i) dirty[i] = !(cur.placements[i] == to[i]);
  for (bool changed = true; changed;) {
    changed = false;
    for (int64_t i = 0; i < mesh_dims; ++i) {
      if (!dirty[i]) continue;
      for (int64_t d : {shard_dim_of(cur.placements[i]), shard_dim_of(to[i])}) {
        if (d < 0) continue;
        for (int64_t k = i + 1; k < mesh_dims; ++k) {
          if (!dirty[k] && (shard_dim_of(cur.placements[k]) == d || shard_dim_of(to[k]) == d)) {
            dirty[k] = changed = true;
          }
        }
      }
    }
  }
  at::Tensor x = local;
  // Undo, last mesh dim first: shards are gathered; partials that end as Replicate or as another
  // Partial are resolved now, partials that end as a shard wait for the reduce-scatter below.
  for (int64_t i = mesh_dims - 1; i >= 0; --i) {
    if (!dirty[i]) continue;
    const Placement& p = cur.placements[i];
    if (is_shard(p)) {
      x = gather(x, cur, i);
      cur.placements[i] = Replicate{};
    } else if (const auto* part = std::get_if<Partial>(&p)) {
      if (is_replicate(to[i])) {
        x = all_reduce(x, part->op, cur.mesh, i);
        cur.placements[i] = Replicate{};
      } else if (const auto* target = std::get_if<Partial>(&to[i])) {
        const double n = static_cast<double>(cur.mesh.size(i));
        using comm::ReduceOp;
        if (part->op == ReduceOp::SUM && target->op == ReduceOp::AVG) {
          x = x * n;
        } else if (part->op == ReduceOp::AVG && target->op == ReduceOp::SUM) {
          x = x / n;
        } else if (part->op != target->op) {
          x = replicate_to_partial(all_reduce(x, part->op, cur.mesh, i), target->op, cur.mesh, i);
        }
        cur.placements[i] = to[i];
      }
    }
  }
  // Redo, first mesh dim first.
  for (int64_t i = 0; i < mesh_dims; ++i) {
    if (!dirty[i] || cur.placements[i] == to[i]) continue;
    const Placement& p = cur.placements[i];
    if (is_shard(to[i])) {
      if (const auto* part = std::get_if<Partial>(&p)) {
        x = reduce_scatter(x, part->op, to[i], cur.mesh, i);
      } else {
        x = scatter(x, to[i], cur.mesh, i);
      }
    } else if (const auto* target = std::get_if<Partial>(&to[i])) {
      x = replicate_to_partial(x, target->op, cur.mesh, i);
    }
    cur.placements[i] = to[i];
  }
  return x;
}

namespace {

struct SpecCapsule : torch::CustomClassHolder {
  SpecCapsule(DTensorSpec f, Placements t, Placements gf, Placements gt)
      : from(std::move(f)), to(std::move(t)), grad_from(std::move(gf)), grad_to(std::move(gt)) {}
  DTensorSpec from;
  Placements to, grad_from, grad_to;
};

// Forward: the transition table above. Backward: the gradient, laid out as grad_from (by default
// grad_placements(to)), is redistributed to grad_to (by default grad_placements(from)): so
// Shard->Replicate has a chunk as backward, Replicate->Shard an all-gather, Partial->Replicate
// the identity, Partial->Shard an all-gather.
struct RedistributeFunction : torch::autograd::Function<RedistributeFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& local,
                            c10::intrusive_ptr<SpecCapsule> specs) {
    at::Tensor out = redistribute_local(local.detach(), specs->from, specs->to);
    ctx->saved_data["specs"] = c10::IValue::make_capsule(specs);
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto capsule = ctx->saved_data["specs"].toCapsule();
    const auto* specs = static_cast<SpecCapsule*>(capsule.get());
    DTensorSpec grad_spec = specs->from;
    grad_spec.placements = specs->grad_from;
    at::Tensor g = grads[0].defined() ? grads[0]
                                      : at::zeros(local_shape_at(grad_spec, grad_spec.mesh.get_coordinate()),
                                                  at::TensorOptions().dtype(specs->from.dtype));
    return {redistribute_local(g, grad_spec, specs->grad_to), at::Tensor()};
  }
};

}  // namespace

at::Tensor redistribute_autograd(const at::Tensor& local, const DTensorSpec& from, const Placements& to) {
  if (!local.requires_grad()) return redistribute_local(local, from, to);
  return RedistributeFunction::apply(
      local, c10::make_intrusive<SpecCapsule>(from, to, grad_placements(to), grad_placements(from.placements)));
}

at::Tensor redistribute_autograd(const at::Tensor& local, const DTensorSpec& from, const Placements& to,
                                 const Placements& grad_from, const Placements& grad_to) {
  if (!local.requires_grad()) return redistribute_local(local, from, to);
  return RedistributeFunction::apply(local, c10::make_intrusive<SpecCapsule>(from, to, grad_from, grad_to));
}

}  // namespace tdc::tensor::detail
