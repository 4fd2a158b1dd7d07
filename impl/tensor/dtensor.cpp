// DTensorSpec (where the calling rank's shard lies), DTensor, distribute_tensor and from_local.
#include "tdc/tensor/dtensor.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tdc/tensor/detail/layout.h"
#include "tdc/comm/collectives.h"

namespace tdc::tensor {
namespace detail {

Placements normalize_placements(const Placements& placements, const DeviceMesh& mesh, int64_t ndim, const char* who) {
  if (static_cast<int64_t>(placements.size()) != mesh.ndim()) {
    throw std::invalid_argument(
        fmt::format("{}: placements {} have {} entries but the mesh {} has {} dims (one placement per mesh dim)", who,
                    to_string(placements), placements.size(), mesh.to_string(), mesh.ndim()));
  }
  Placements out = placements;
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t* dim = nullptr;
    if (auto* s = std::get_if<Shard>(&out[i])) dim = &s->dim;
    if (auto* s = std::get_if<StridedShard>(&out[i])) {
      dim = &s->dim;
      if (s->split_factor < 1) {
        throw std::invalid_argument(fmt::format("{}: {} on mesh dim {} has split_factor {}; it must be >= 1", who,
                                                to_string(out[i]), i, s->split_factor));
      }
    }
    if (!dim) continue;
    if (*dim < -ndim || *dim >= ndim) {
      throw std::invalid_argument(
          fmt::format("{}: {} on mesh dim {} is out of range for a tensor of rank {} (valid dims: [{}, {}))", who,
                      to_string(placements[i]), i, ndim, -ndim, ndim));
    }
    if (*dim < 0) *dim += ndim;
  }
  return out;
}

// StridedShard (PyTorch 2.13's _StridedShard): the piece is chunked `split_factor` ways (the
// inner split, e.g. TP), and each of those chunks `n` ways; member m holds chunk m of each.
static std::vector<ChunkRange> strided_ranges(int64_t parent_size, int64_t n, int64_t split_factor, int64_t m) {
  std::vector<ChunkRange> out;
  for (int64_t j = 0; j < split_factor; ++j) {
    ChunkRange inner = chunk_range(parent_size, split_factor, j);
    ChunkRange c = chunk_range(inner.size, n, m);
    out.push_back({inner.offset + c.offset, c.size});
  }
  return out;
}

std::vector<int64_t> member_indices(const Placement& p, int64_t parent_size, int64_t n, int64_t m) {
  std::vector<int64_t> idx;
  auto add = [&](ChunkRange r) {
    for (int64_t k = 0; k < r.size; ++k) idx.push_back(r.offset + k);
  };
  if (const auto* s = std::get_if<StridedShard>(&p)) {
    for (ChunkRange r : strided_ranges(parent_size, n, s->split_factor, m)) add(r);
  } else {
    add(chunk_range(parent_size, n, m));
  }
  return idx;
}

int64_t member_size(const Placement& p, int64_t parent_size, int64_t n, int64_t m) {
  if (const auto* s = std::get_if<StridedShard>(&p)) {
    int64_t total = 0;
    for (ChunkRange r : strided_ranges(parent_size, n, s->split_factor, m)) total += r.size;
    return total;
  }
  return chunk_range(parent_size, n, m).size;
}

namespace {
int64_t shard_dim(const Placement& p) {
  if (const auto* s = std::get_if<Shard>(&p)) return s->dim;
  if (const auto* s = std::get_if<StridedShard>(&p)) return s->dim;
  return -1;
}

using Run = IndexRun;
std::vector<Run> select_positions(const std::vector<Run>& runs, int64_t begin, int64_t len) {
  std::vector<Run> out;
  int64_t pos = 0;
  int64_t where = runs.empty() ? 0 : runs.back().start + runs.back().len;  // for empty selections
  bool where_set = false;
  for (const Run& r : runs) {
    const int64_t lo = std::max(begin, pos), hi = std::min(begin + len, pos + r.len);
    if (!where_set && begin < pos + r.len && begin >= pos) {
      where = r.start + (begin - pos);
      where_set = true;
    }
    if (lo < hi) out.push_back({r.start + (lo - pos), hi - lo});
    pos += r.len;
  }
  if (out.empty()) out.push_back({where, 0});
  return out;
}
}  // namespace

std::vector<std::vector<IndexRun>> local_runs_at(const DTensorSpec& spec, const std::vector<int64_t>& coord,
                                                 int64_t upto) {
  const int64_t nd = static_cast<int64_t>(spec.shape.size());
  std::vector<std::vector<Run>> runs(nd);
  for (int64_t d = 0; d < nd; ++d) runs[d] = {{0, spec.shape[d]}};
  const int64_t mesh_dims = upto < 0 ? static_cast<int64_t>(spec.placements.size()) : upto;
  for (int64_t i = 0; i < mesh_dims; ++i) {
    const Placement& p = spec.placements[i];
    const int64_t d = shard_dim(p);
    if (d < 0) continue;
    const int64_t n = spec.mesh.size(i), m = coord[i];
    int64_t parent = 0;
    for (const Run& r : runs[d]) parent += r.len;
    std::vector<Run> next;
    if (const auto* s = std::get_if<StridedShard>(&p)) {
      for (ChunkRange c : strided_ranges(parent, n, s->split_factor, m)) {
        for (const Run& r : select_positions(runs[d], c.offset, c.size)) {
          if (r.len > 0 || next.empty()) next.push_back(r);
        }
      }
      if (next.size() > 1 && next.front().len == 0) next.erase(next.begin());
    } else {
      ChunkRange c = chunk_range(parent, n, m);
      next = select_positions(runs[d], c.offset, c.size);
    }
    runs[d] = std::move(next);
  }
  return runs;
}

std::vector<int64_t> local_shape_at(const DTensorSpec& spec, const std::vector<int64_t>& coord, int64_t upto) {
  auto runs = local_runs_at(spec, coord, upto);
  std::vector<int64_t> shape;
  for (const auto& rs : runs) {
    int64_t n = 0;
    for (const Run& r : rs) n += r.len;
    shape.push_back(n);
  }
  return shape;
}

std::vector<int64_t> local_offset_at(const DTensorSpec& spec, const std::vector<int64_t>& coord) {
  auto runs = local_runs_at(spec, coord, -1);
  std::vector<int64_t> offset;
  for (const auto& rs : runs) offset.push_back(rs.front().start);
  return offset;
}

Placements grad_placements(const Placements& placements) {
  Placements out = placements;
  for (auto& p : out) {
    if (is_partial(p)) p = Replicate{};
  }
  return out;
}

std::vector<int64_t> contiguous_stride(const std::vector<int64_t>& shape) {
  std::vector<int64_t> stride(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) {
    stride[d] = stride[d + 1] * std::max<int64_t>(shape[d + 1], 1);
  }
  return stride;
}

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

}  // namespace detail

using detail::contiguous_stride;
using detail::shape_str;

std::vector<int64_t> DTensorSpec::local_shape() const { return detail::local_shape_at(*this, mesh.get_coordinate()); }
std::vector<int64_t> DTensorSpec::local_offset() const { return detail::local_offset_at(*this, mesh.get_coordinate()); }
std::string DTensorSpec::to_string() const {
  return fmt::format("DTensorSpec(mesh={}, placements={}, shape={}, dtype={})", mesh.to_string(),
                     tdc::tensor::to_string(placements), shape_str(shape), c10::toString(dtype));
}

DTensor::DTensor(at::Tensor local, DTensorSpec spec) : local_(std::move(local)), spec_(std::move(spec)) {
  spec_.placements =
      detail::normalize_placements(spec_.placements, spec_.mesh, static_cast<int64_t>(spec_.shape.size()), "DTensor");
  if (spec_.stride.empty()) spec_.stride = contiguous_stride(spec_.shape);
  if (local_.defined()) spec_.dtype = local_.scalar_type();
}

DTensor DTensor::redistribute(const Placements& placements) const {
  Placements to = detail::normalize_placements(placements, spec_.mesh, dim(), "DTensor::redistribute");
  if (to == spec_.placements) return *this;
  DTensorSpec out = spec_;
  out.placements = to;
  return DTensor(detail::redistribute_autograd(local_, spec_, to), std::move(out));
}

at::Tensor DTensor::full_tensor() const {
  return redistribute(Placements(spec_.placements.size(), Replicate{})).to_local();
}

std::optional<DTensor> DTensor::grad() const {
  if (!local_.defined() || !local_.grad().defined()) return std::nullopt;
  DTensorSpec g = spec_;
  g.placements = detail::grad_placements(spec_.placements);
  return DTensor(local_.grad(), std::move(g));
}

DTensor distribute_tensor(const at::Tensor& tensor, const DeviceMesh& mesh, const Placements& placements,
                          bool broadcast_from_src, int src_rank) {
  Placements ps = detail::normalize_placements(placements, mesh, tensor.dim(), "distribute_tensor");
  for (size_t i = 0; i < ps.size(); ++i) {
    if (is_partial(ps[i])) {
      throw std::invalid_argument(
          fmt::format("distribute_tensor: {} on mesh dim {} is not allowed (placements {}); distribute as Replicate "
                      "and redistribute, or build the partial values with from_local",
                      to_string(ps[i]), i, to_string(ps)));
    }
  }
  at::Tensor source = tensor;
  if (broadcast_from_src) {
    // Find src's coordinate, then broadcast along each mesh dim in order (after dim k, every
    // rank that matches src on dims > k holds src's value).
    at::Tensor where = (mesh.mesh() == src_rank).nonzero();
    if (where.size(0) != 1) {
      throw std::invalid_argument(
          fmt::format("distribute_tensor: src_rank {} is not in the mesh {}", src_rank, mesh.to_string()));
    }
    source = tensor.detach().clone(at::MemoryFormat::Contiguous);
    for (int64_t i = 0; i < mesh.ndim(); ++i) {
      comm::broadcast(source, static_cast<int>(where[0][i].item<int64_t>()), mesh.get_group(i));
    }
    if (tensor.requires_grad()) source = tensor + (source - tensor).detach();  // grads flow to `tensor`
  }
  DTensorSpec from{mesh, Placements(ps.size(), Replicate{}), tensor.sizes().vec(), tensor.strides().vec(),
                   tensor.scalar_type()};
  if (!tensor.is_contiguous()) from.stride = contiguous_stride(from.shape);
  DTensorSpec to = from;
  to.placements = ps;
  at::Tensor local = ps == from.placements ? source : detail::redistribute_autograd(source, from, ps);
  return DTensor(std::move(local), std::move(to));
}

DTensor from_local(const at::Tensor& local, const DeviceMesh& mesh, const Placements& placements,
                   const FromLocalOptions& options) {
  Placements ps = detail::normalize_placements(placements, mesh, local.dim(), "from_local");
  const int64_t nd = local.dim();
  std::vector<int64_t> shape = local.sizes().vec();
  if (options.shape) {
    if (static_cast<int64_t>(options.shape->size()) != nd) {
      throw std::invalid_argument(fmt::format("from_local: shape {} has rank {} but the local tensor has rank {}",
                                              shape_str(*options.shape), options.shape->size(), nd));
    }
    shape = *options.shape;
  } else {
    for (int64_t i = 0; i < mesh.ndim(); ++i) {
      if (const auto* s = std::get_if<Shard>(&ps[i])) shape[s->dim] *= mesh.size(i);
      if (const auto* s = std::get_if<StridedShard>(&ps[i])) shape[s->dim] *= mesh.size(i);
    }
  }
  if (options.run_check) {
    // Gather every rank's local shape (last mesh dim first: the result is in row-major mesh order).
    at::Tensor t = at::tensor(local.sizes().vec(), at::kLong).reshape({1, nd});
    for (int64_t i = mesh.ndim() - 1; i >= 0; --i) {
      at::Tensor out = at::empty({t.size(0) * mesh.size(i), nd}, at::kLong);
      comm::all_gather_into_tensor(out, t.contiguous(), mesh.get_group(i));
      t = out;
    }
    const std::vector<int64_t> mshape = mesh.shape();
    std::vector<std::vector<int64_t>> coords, shapes;
    for (int64_t r = 0; r < t.size(0); ++r) {
      std::vector<int64_t> c(mshape.size());
      for (int64_t i = static_cast<int64_t>(mshape.size()) - 1, rem = r; i >= 0; --i) {
        c[i] = rem % mshape[i];
        rem /= mshape[i];
      }
      coords.push_back(c);
      shapes.emplace_back(t[r].data_ptr<int64_t>(), t[r].data_ptr<int64_t>() + nd);
    }
    if (!options.shape) {
      // Uneven-aware global shape: along a sharded dim, the ranks at coordinate 0 on every mesh
      // dim that does not shard it hold disjoint pieces covering it.
      for (int64_t d = 0; d < nd; ++d) {
        bool sharded = false;
        for (const auto& p : ps) sharded = sharded || is_shard(p, d);
        if (!sharded) continue;
        int64_t total = 0;
        for (size_t r = 0; r < coords.size(); ++r) {
          bool keep = true;
          for (int64_t i = 0; i < mesh.ndim(); ++i) keep = keep && (is_shard(ps[i], d) || coords[r][i] == 0);
          if (keep) total += shapes[r][d];
        }
        shape[d] = total;
      }
    }
    DTensorSpec spec{mesh, ps, shape, contiguous_stride(shape), local.scalar_type()};
    bool ok = true;
    std::string detail_msg;
    at::Tensor flat_ranks = mesh.mesh().flatten();
    for (size_t r = 0; r < coords.size(); ++r) {
      auto expect = detail::local_shape_at(spec, coords[r]);
      if (expect != shapes[r]) ok = false;
      detail_msg += fmt::format("{}rank {}: {}{}", r ? ", " : "", flat_ranks[r].item<int64_t>(), shape_str(shapes[r]),
                                expect != shapes[r] ? fmt::format(" (expected {})", shape_str(expect)) : "");
    }
    if (!ok) {
      throw std::invalid_argument(
          fmt::format("from_local: local shapes are inconsistent with placements {} and global shape {} on mesh {}: {}",
                      to_string(ps), shape_str(shape), mesh.to_string(), detail_msg));
    }
  }
  std::vector<int64_t> stride = options.stride ? *options.stride : contiguous_stride(shape);
  return DTensor(local, DTensorSpec{mesh, ps, shape, stride, local.scalar_type()});
}

}  // namespace tdc::tensor
