// FSDPParam (param.h): one parameter's shard, unsharded tensor and gradient.
#include "param.h"

#include <algorithm>
#include <stdexcept>

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <fmt/format.h>

#include "tdc/comm/collectives.h"
#include "tdc/core/cpu_block_cache.h"
#include "tdc/fsdp/testing.h"
#include "tdc/tensor/module_params.h"

namespace tdc::fsdp {

// ------------------------------------------------------------------ storage and memory accounting

namespace {
thread_local MemoryStats g_mem;
void mem_add(int64_t bytes) {
  g_mem.unsharded_bytes += bytes;
  g_mem.peak_unsharded_bytes = std::max(g_mem.peak_unsharded_bytes, g_mem.unsharded_bytes);
}
}  // namespace

MemoryStats memory_stats() { return g_mem; }
void reset_peak_memory_stats() { g_mem.peak_unsharded_bytes = g_mem.unsharded_bytes; }

void FSDPParam::count_unsharded_bytes(bool on) {
  if (on == unsharded_counted_) return;
  const int64_t bytes = unsharded_.numel() * unsharded_.element_size();
  mem_add(on ? bytes : -bytes);
  unsharded_counted_ = on;
}

// ------------------------------------------------------------------ init

FSDPParam::FSDPParam(ParamPlan plan, const MeshInfo& mesh_info, const FullyShardOptions& options)
    : fqn_(plan.fqn),
      uses_(plan.uses),
      local_shape_(plan.tensor.sizes().vec()),
      orig_dtype_(plan.tensor.scalar_type()),
      param_dtype_(options.mp_policy.param_dtype.value_or(plan.tensor.scalar_type())),
      dim_(plan.dim),
      requires_grad_(plan.tensor.requires_grad()) {
  const int64_t n = mesh_info.shard_size;
  rows_ = local_shape_[dim_];
  padded_ = (rows_ + n - 1) / n;
  const tensor::ChunkRange mine = tensor::chunk_range(rows_, n, mesh_info.shard_rank);
  my_rows_ = mine.size;
  row_numel_ = rows_ == 0 ? 0 : plan.tensor.numel() / rows_;
  at::Tensor src = plan.tensor.detach();
  // Ranks must agree on the values: the shard of rank 0's tensor (as PyTorch's init broadcast).
  if (!plan.tp_spec && !src.is_meta()) {
    src = src.clone();
    if (mesh_info.mesh.size() > 1) {
      for (int64_t d = 0; d < mesh_info.mesh.ndim(); ++d) comm::broadcast(src, 0, mesh_info.mesh.get_group(d));
    }
  }
  sharded_ = src.narrow(dim_, mine.offset, mine.size).clone(at::MemoryFormat::Contiguous);
  if (options.offload_policy.cpu_offload && !sharded_.is_meta()) sharded_ = sharded_.to(at::kCPU);
  sharded_.requires_grad_(requires_grad_);
  init_spec(plan, mesh_info);
}

// The shard's DTensor layout. Under tensor parallel the FSDP dim is laid out on the root (dp, tp)
// mesh: StridedShard when both shard the same dim (dp's piece is a strided slice of the TP
// shards), else (Shard(d), tp's placement).
void FSDPParam::init_spec(const ParamPlan& plan, const MeshInfo& mesh_info) {
  if (plan.tp_spec) {
    spec_.mesh = mesh_info.mesh.root_mesh();
    const tensor::Placement& tp = plan.tp_spec->placements[0];
    tensor::Placement dp = tensor::Shard{dim_};
    if (const auto* s = std::get_if<tensor::Shard>(&tp); s && s->dim == dim_) {
      dp = tensor::StridedShard{dim_, plan.tp_spec->mesh.size()};
    }
    spec_.placements = {dp, tp};
    spec_.shape = plan.tp_spec->shape;
    spec_.stride = plan.tp_spec->stride;
  } else {
    spec_.mesh = mesh_info.mesh;
    spec_.placements = mesh_info.mesh.ndim() == 2 ? tensor::Placements{tensor::Replicate{}, tensor::Shard{dim_}}
                                                  : tensor::Placements{tensor::Shard{dim_}};
    spec_.shape = local_shape_;
  }
  spec_.dtype = orig_dtype_;
}

void FSDPParam::register_sharded() {
  for (auto& [m, name] : uses_) {
    m->replace_param(name, sharded_);
    tensor::set_param_spec(*m, name, spec_);
  }
}

const at::Tensor& FSDPParam::registered() const {
  const at::Tensor* t = uses_[0].first->find_param(uses_[0].second);
  return t ? *t : sharded_;
}

void FSDPParam::reset_sharded_param(const OffloadPolicy& offload) {
  if (!registration_changed()) return;
  at::Tensor fresh = registered();
  if (offload.cpu_offload && !fresh.is_meta() && !fresh.is_cpu()) {
    at::Tensor(fresh).set_data(fresh.detach().to(at::kCPU));  // keeps the tensor the optimizer holds
  }
  sharded_ = fresh;
  for (auto& [m, name] : uses_) {
    if (const at::Tensor* t = m->find_param(name); t == nullptr || !t->is_same(fresh)) m->replace_param(name, fresh);
  }
  free_unsharded();
  unsharded_ = at::Tensor();
  ext_outputs_.clear();
  ext_to_free_.clear();
  gathered_version_ = -1;
}

// ------------------------------------------------------------------ all-gather layout

at::Tensor FSDPParam::all_gather_input() const {
  return sharded_.detach().movedim(dim_, 0).reshape({my_rows_ * row_numel_});
}

void FSDPParam::check_unmodified(const char* when) const {
  if (gathered_version_ >= 0 && sharded_._version() != gathered_version_) {
    throw std::runtime_error(
        fmt::format("fully_shard: parameter '{}' was modified in place between forward and {} (an optimizer step "
                    "before backward?); its gradient would not match the values the forward used",
                    fqn_, when));
  }
}

// ------------------------------------------------------------------ sharded <-> unsharded

// [Note: one copy out of the all-gather] Row r of the output holds rank r's padded rows of every
// parameter of the group, so this parameter's columns are strided across the rows. Each rank's
// rows are copied straight into their place in the unsharded tensor (a reshape of the strided
// columns into one tensor would copy them once more first).
void FSDPParam::to_unsharded(const at::Tensor& gathered_columns, int64_t shard_size) {
  std::vector<int64_t> rank_rows{padded_};  // one rank's padded rows, the other dims after
  for (int64_t d = 0; d < static_cast<int64_t>(local_shape_.size()); ++d) {
    if (d != dim_) rank_rows.push_back(local_shape_[d]);
  }
  if (!unsharded_.defined()) unsharded_ = core::empty_reusing(local_shape_, gathered_columns.options());
  alloc_storage(unsharded_);
  count_unsharded_bytes(true);
  const at::Tensor rows = unsharded_.detach().movedim(dim_, 0);  // [rows_, other dims]: a view
  for (int64_t r = 0; r < shard_size; ++r) {
    const tensor::ChunkRange cr = tensor::chunk_range(rows_, shard_size, r);
    if (cr.size == 0) continue;
    copy_quietly(rows.narrow(0, cr.offset, cr.size), gathered_columns[r].view(rank_rows).narrow(0, 0, cr.size));
  }
}

void FSDPParam::free_unsharded() {
  if (unsharded_.defined() && has_storage_allocated(unsharded_)) {
    count_unsharded_bytes(false);
    free_storage(unsharded_);
  }
  for (const auto& t : ext_to_free_) {
    if (t.defined()) free_storage(t);
  }
  for (const auto& t : ext_outputs_) free_storage(t);
  for (auto& [m, name] : uses_) m->clear_param_substitute(name);
}

void FSDPParam::set_substitutes(const at::Tensor& unsharded) const {
  for (auto& [m, name] : uses_) m->set_param_substitute(name, unsharded);
}

// ------------------------------------------------------------------ gradients

void FSDPParam::accumulate_unsynced_grad(const at::Tensor& grad, std::optional<at::ScalarType> reduce_dtype) {
  if (!grad.defined()) return;
  at::Tensor g = grad.detach();
  if (reduce_dtype && g.scalar_type() != *reduce_dtype) g = g.to(*reduce_dtype);
  grad_accum_ = grad_accum_.defined() ? grad_accum_ + g : g.clone();
}

at::Tensor FSDPParam::take_grad_to_reduce(const at::Tensor& grad) {
  at::Tensor g = grad.defined() ? grad.detach() : at::Tensor();
  if (grad_accum_.defined()) g = g.defined() ? g + grad_accum_ : grad_accum_;
  grad_accum_ = at::Tensor();
  return g;
}

at::Tensor FSDPParam::rows_of(const at::Tensor& unsharded_grad, at::ScalarType dtype) const {
  return unsharded_grad.to(dtype).movedim(dim_, 0).reshape({rows_, row_numel_});
}

at::Tensor FSDPParam::sharded_grad(const at::Tensor& reduced_rows) const {
  std::vector<int64_t> shape{my_rows_};
  for (int64_t d = 0; d < static_cast<int64_t>(local_shape_.size()); ++d) {
    if (d != dim_) shape.push_back(local_shape_[d]);
  }
  return reduced_rows.reshape(shape).movedim(0, dim_).to(orig_dtype_).contiguous();
}

}  // namespace tdc::fsdp
