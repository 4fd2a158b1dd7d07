// DTensor's layout machinery for the rest of libtdc (tensor parallel, FSDP): where each rank's
// shard lies, and the redistribute engine. Not for users: DTensor's API is placement.h and
// dtensor.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdc/tensor/dtensor.h"

namespace tdc::tensor::detail {

// Strides of a contiguous tensor of `shape` (PyTorch's: a size-0 dim counts as 1).
std::vector<int64_t> contiguous_stride(const std::vector<int64_t>& shape);
// "[2, 3]"
std::string shape_str(const std::vector<int64_t>& shape);

// Checks `placements` against the mesh (one per mesh dim) and a tensor of rank `ndim`;
// returns them with negative Shard dims normalised. `who` prefixes the error messages.
Placements normalize_placements(const Placements& placements, const DeviceMesh& mesh, int64_t ndim, const char* who);

// The global indices, along the placement's dim, of member `m` of `n` when a piece of
// `parent_size` elements is split by `p` (a Shard or a StridedShard).
std::vector<int64_t> member_indices(const Placement& p, int64_t parent_size, int64_t n, int64_t m);
int64_t member_size(const Placement& p, int64_t parent_size, int64_t n, int64_t m);

// Local shape / offset of the rank at mesh coordinate `coord`; with `upto` only mesh dims
// [0, upto) are applied.
std::vector<int64_t> local_shape_at(const DTensorSpec& spec, const std::vector<int64_t>& coord, int64_t upto = -1);
std::vector<int64_t> local_offset_at(const DTensorSpec& spec, const std::vector<int64_t>& coord);

// Runs of global indices [start, start + len) that the rank at `coord` holds along each tensor
// dim, in local order: a Shard gives one run per dim, a StridedShard may give several. An empty
// shard keeps one zero-length run at the position where it would begin. With `upto` only mesh
// dims [0, upto) are applied.
struct IndexRun {
  int64_t start, len;
};
std::vector<std::vector<IndexRun>> local_runs_at(const DTensorSpec& spec, const std::vector<int64_t>& coord,
                                                 int64_t upto = -1);

// The placements a gradient has when the forward value had `placements`: Shard stays Shard,
// Replicate stays Replicate, Partial becomes Replicate (every partial's gradient is the full one).
Placements grad_placements(const Placements& placements);

// Not differentiable: the local tensor of `from` re-laid out as `to` (same mesh, same shape).
at::Tensor redistribute_local(const at::Tensor& local, const DTensorSpec& from, const Placements& to);
// Differentiable: backward redistributes the gradient from grad_placements(to) to
// grad_placements(from.placements).
at::Tensor redistribute_autograd(const at::Tensor& local, const DTensorSpec& from, const Placements& to);
// Differentiable with a stated backward: the gradient, laid out as `grad_from` (same mesh and
// global shape), is redistributed to `grad_to`. Tensor parallel uses it where the local compute
// after the conversion leaves partial gradients (ColwiseParallel's input: grad_from Partial).
at::Tensor redistribute_autograd(const at::Tensor& local, const DTensorSpec& from, const Placements& to,
                                 const Placements& grad_from, const Placements& grad_to);

}  // namespace tdc::tensor::detail
