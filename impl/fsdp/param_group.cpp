// ParamGroup (param_group.h): the collectives of one fully_shard'ed module's parameters.
#include "param_group.h"

#include <algorithm>
#include <stdexcept>

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tdc::fsdp {

// ------------------------------------------------------------------ memory accounting

namespace {
thread_local MemoryStats g_mem;
void mem_add(int64_t bytes) {
  g_mem.unsharded_bytes += bytes;
  g_mem.peak_unsharded_bytes = std::max(g_mem.peak_unsharded_bytes, g_mem.unsharded_bytes);
}

// Frees / re-allocates a tensor's storage in place: every alias (the tensors handed to the
// module, the ones autograd saved) sees the new memory (FSDP2's storage resize).
void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() == 0) return;
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}
void alloc_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t need = static_cast<size_t>(t.numel()) * t.element_size();
  if (s->nbytes() >= need) return;
  s->set_data_ptr_noswap(s->allocator()->allocate(need));
  s->set_nbytes(need);
}
// [Note: FSDP's collectives skip the argument checks after the first] tdc::comm exchanges a
// fingerprint of every collective's arguments across ranks before it (a blocking round trip:
// the FSDP benchmark measured it at a third of a step). A group's all-gather and reduce-scatter
// buffers have the same layout at every step, so each group checks its first all-gather and its
// first reduce-scatter and runs the later ones without (as DDP's buckets do). Extension
// all-gathers, whose tensors user hooks make, are always checked.
class ChecksOff {
 public:
  explicit ChecksOff(bool off) : prev_(comm::argument_checks()) {
    if (off) comm::set_argument_checks(false);
  }
  ~ChecksOff() { comm::set_argument_checks(prev_); }
  ChecksOff(const ChecksOff&) = delete;
  ChecksOff& operator=(const ChecksOff&) = delete;

 private:
  bool prev_;
};

// Writes `src` into `dst` without bumping dst's version counter (autograd saved aliases of it).
void copy_quietly(const at::Tensor& dst, const at::Tensor& src) {
  at::AutoDispatchBelowADInplaceOrView guard;
  at::NoGradGuard no_grad;
  dst.copy_(src);
}

}  // namespace

MemoryStats memory_stats() { return g_mem; }
void reset_peak_memory_stats() { g_mem.peak_unsharded_bytes = g_mem.unsharded_bytes; }

// ------------------------------------------------------------------ ParamGroup

std::map<at::ScalarType, std::vector<size_t>> ParamGroup::buckets() const {
  std::map<at::ScalarType, std::vector<size_t>> b;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].ext) b[params[i].param_dtype].push_back(i);
  }
  return b;
}

bool ParamGroup::valid() const {
  if (!unsharded) return false;
  for (const auto& p : params) {
    if (p.shard._version() != p.gathered_version) return false;
  }
  return true;
}

void ParamGroup::gather_extension(FSDPParam& p) {
  std::vector<int64_t> stride(p.local_shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(p.local_shape.size()) - 2; d >= 0; --d) stride[d] = stride[d + 1] * p.local_shape[d + 1];
  at::Tensor local = p.shard.detach();
  PreAllGatherResult pre = p.ext->pre_all_gather
                               ? p.ext->pre_all_gather(local, shard_mesh, p.local_shape, stride, *p.uses[0].first, mp)
                               : p.ext->pre_all_gather_v1(local, shard_mesh);
  p.ext_meta = pre.metadata;
  p.gathered_version = p.shard._version();
  bool fresh = p.ext_outputs.size() != pre.tensors.size();
  for (size_t j = 0; !fresh && j < pre.tensors.size(); ++j) {
    fresh = p.ext_outputs[j].size(0) != pre.tensors[j].size(0) * shard_size ||
            p.ext_outputs[j].scalar_type() != pre.tensors[j].scalar_type();
  }
  if (fresh) {
    p.ext_outputs.clear();
    p.unsharded = at::Tensor();  // post_all_gather starts over (first call, no `out`)
  }
  for (size_t j = 0; j < pre.tensors.size(); ++j) {
    at::Tensor in = pre.tensors[j].contiguous();
    std::vector<int64_t> shape = in.sizes().vec();
    if (shape.empty()) {
      throw std::invalid_argument(fmt::format("fully_shard: pre_all_gather of '{}' returned a scalar", p.fqn));
    }
    shape[0] *= shard_size;
    if (fresh) p.ext_outputs.push_back(at::empty(shape, in.options()));
    alloc_storage(p.ext_outputs[j]);
    if (shard_size == 1) {
      copy_quietly(p.ext_outputs[j], in);
    } else {
      at::Tensor out = at::empty(shape, in.options());
      comm::all_gather_into_tensor(out, in, shard_pg);
      copy_quietly(p.ext_outputs[j], out);
    }
  }
}

void ParamGroup::finish_extension(FSDPParam& p) {
  const bool first = !p.unsharded.defined();
  if (!first) alloc_storage(p.unsharded);
  PostAllGatherResult r = p.ext->post_all_gather(p.ext_outputs, p.ext_meta, p.param_dtype, first ? nullptr : &p.unsharded);
  if (first) {
    at::Tensor u = r.unsharded;
    if (!u.defined()) {
      throw std::runtime_error(fmt::format("fully_shard: post_all_gather of '{}' returned no tensor", p.fqn));
    }
    if (u.dim() == static_cast<int64_t>(p.local_shape.size()) && u.size(0) > p.local_shape[0]) {
      u = u.narrow(0, 0, p.local_shape[0]);
    }
    if (u.sizes().vec() != p.local_shape || u.scalar_type() != p.param_dtype) {
      throw std::runtime_error(fmt::format(
          "fully_shard: post_all_gather of '{}' returned a {} tensor of shape [{}]; the parameter is {} [{}]", p.fqn,
          c10::toString(u.scalar_type()), fmt::join(u.sizes(), ", "), c10::toString(p.param_dtype),
          fmt::join(p.local_shape, ", ")));
    }
    p.unsharded = u;
    p.ext_to_free = r.to_free;
  }
  mem_add(p.unsharded.numel() * p.unsharded.element_size());
}

void ParamGroup::start_all_gather(bool async_op) {
  if (pending || params.empty()) return;
  for (auto& p : params) {
    if (p.ext) gather_extension(p);
  }
  Pending pend;
  for (auto& [dtype, idx] : buckets()) {
    int64_t total = 0;
    for (size_t i : idx) total += params[i].padded * params[i].row_numel;
    at::Tensor in = at::zeros({total}, at::TensorOptions().dtype(dtype).device(params[idx[0]].shard.device()));
    int64_t off = 0;
    for (size_t i : idx) {
      FSDPParam& p = params[i];
      at::Tensor local = p.shard.detach().movedim(p.dim, 0).reshape({p.my_rows * p.row_numel});
      in.narrow(0, off, p.my_rows * p.row_numel).copy_(local);
      off += p.padded * p.row_numel;
      p.gathered_version = p.shard._version();
    }
    at::Tensor out;
    if (shard_size == 1) {
      out = in;
    } else {
      out = at::empty({total * shard_size}, in.options());
      ChecksOff checks_off(gather_checked);
      gather_checked = true;
      comm::Work w = comm::all_gather_into_tensor(out, in, shard_pg, async_op);
      if (async_op) {
        // One pending Work per group: chain buckets' waits.
        auto prev = std::make_shared<comm::Work>(std::move(pend.work));
        auto cur = std::make_shared<comm::Work>(std::move(w));
        pend.work = comm::Work({}, [prev, cur] {
          prev->wait();
          cur->wait();
        });
      }
    }
    pend.outs.emplace_back(idx, out);
  }
  pending = std::move(pend);
}

void ParamGroup::finish_all_gather() {
  if (!pending) return;
  pending->work.wait();
  for (auto& p : params) {
    if (p.ext) finish_extension(p);
  }
  for (auto& [idx, out] : pending->outs) {
    int64_t total = 0;
    for (size_t i : idx) total += params[i].padded * params[i].row_numel;
    at::Tensor grid = out.view({shard_size, total});
    int64_t off = 0;
    for (size_t i : idx) {
      FSDPParam& p = params[i];
      std::vector<int64_t> moved = p.local_shape;
      std::swap(moved[0], moved[p.dim]);  // shape of movedim(dim, 0) up to the order of the rest
      std::vector<int64_t> rest;
      for (int64_t d = 0; d < static_cast<int64_t>(p.local_shape.size()); ++d) {
        if (d != p.dim) rest.push_back(p.local_shape[d]);
      }
      std::vector<int64_t> full_shape{shard_size * p.padded};
      full_shape.insert(full_shape.end(), rest.begin(), rest.end());
      at::Tensor piece = grid.narrow(1, off, p.padded * p.row_numel).reshape(full_shape).narrow(0, 0, p.rows);
      off += p.padded * p.row_numel;
      if (!p.unsharded.defined()) {
        p.unsharded = at::empty(p.local_shape, piece.options());
      }
      const bool was_freed = p.unsharded.storage().nbytes() == 0;
      alloc_storage(p.unsharded);
      if (was_freed || !unsharded) mem_add(p.unsharded.numel() * p.unsharded.element_size());
      copy_quietly(p.unsharded, piece.movedim(0, p.dim));
    }
  }
  pending.reset();
  unsharded = true;
}

void ParamGroup::unshard(bool async_op) {
  if (valid() && !pending) return;
  if (unsharded && !pending) {
    // Stale (a shard changed): gather again into the same storage.
    unsharded = false;
    for (auto& p : params) {
      if (p.unsharded.defined() && p.unsharded.storage().nbytes() > 0) {
        mem_add(-(p.unsharded.numel() * p.unsharded.element_size()));
      }
    }
  }
  start_all_gather(async_op);
  if (!async_op) finish_all_gather();
}

void ParamGroup::reshard() {
  if (pending) finish_all_gather();
  if (!unsharded) return;
  for (auto& p : params) {
    if (p.unsharded.defined() && p.unsharded.storage().nbytes() > 0) {
      mem_add(-(p.unsharded.numel() * p.unsharded.element_size()));
      free_storage(p.unsharded);
    }
    for (const auto& t : p.ext_to_free) {
      if (t.defined()) free_storage(t);
    }
    for (const auto& t : p.ext_outputs) free_storage(t);
    for (auto& [m, name] : p.uses) m->clear_param_substitute(name);
  }
  unsharded = false;
}

void ParamGroup::check_unmodified(const char* when) const {
  for (const auto& p : params) {
    if (p.gathered_version >= 0 && p.shard._version() != p.gathered_version) {
      throw std::runtime_error(fmt::format(
          "fully_shard: parameter '{}' was modified in place between forward and {} (an optimizer step "
          "before backward?); its gradient would not match the values the forward used",
          p.fqn, when));
    }
  }
}

std::vector<at::Tensor> ParamGroup::reduce(const std::vector<at::Tensor>& grads) {
  std::vector<at::Tensor> out(params.size());
  if (!requires_sync) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].defined()) continue;
      FSDPParam& p = params[i];
      p.grad_accum = p.grad_accum.defined() ? p.grad_accum + grads[i] : grads[i].detach().clone();
    }
    return out;
  }
  std::map<at::ScalarType, std::vector<size_t>> by_dtype;
  for (size_t i = 0; i < params.size(); ++i) {
    FSDPParam& p = params[i];
    if (!p.requires_grad) continue;
    if (!grads[i].defined() && !p.grad_accum.defined()) continue;
    by_dtype[mp.reduce_dtype.value_or(p.param_dtype)].push_back(i);
  }
  const double world = static_cast<double>(shard_size * replicate_size);
  for (auto& [dtype, idx] : by_dtype) {
    int64_t total = 0;
    for (size_t i : idx) total += params[i].padded * params[i].row_numel;
    at::Tensor in = at::zeros({shard_size, total}, at::TensorOptions().dtype(dtype).device(params[idx[0]].shard.device()));
    int64_t off = 0;
    for (size_t i : idx) {
      FSDPParam& p = params[i];
      at::Tensor g = grads[i].defined() ? grads[i].detach() : at::zeros(p.local_shape, in.options());
      if (p.grad_accum.defined()) g = g + p.grad_accum;
      p.grad_accum = at::Tensor();
      at::Tensor moved = g.to(dtype).movedim(p.dim, 0).reshape({p.rows, p.row_numel});
      for (int64_t r = 0; r < shard_size; ++r) {
        tensor::ChunkRange cr = tensor::chunk_range(p.rows, shard_size, r);
        if (cr.size == 0) continue;
        in[r].narrow(0, off, cr.size * p.row_numel).copy_(moved.narrow(0, cr.offset, cr.size).reshape({-1}));
      }
      off += p.padded * p.row_numel;
    }
    at::Tensor reduced;
    ChecksOff checks_off(reduce_checked);
    reduce_checked = true;
    if (shard_size == 1) {
      reduced = in.reshape({total});
    } else {
      reduced = at::empty({total}, in.options());
      comm::reduce_scatter_tensor(reduced, in.reshape({-1}), comm::ReduceOp::SUM, shard_pg);
    }
    if (replicate_size > 1) comm::all_reduce(reduced, comm::ReduceOp::SUM, replicate_pg);
    if (world > 1) reduced.div_(world);
    off = 0;
    for (size_t i : idx) {
      FSDPParam& p = params[i];
      std::vector<int64_t> shape{p.my_rows};
      for (int64_t d = 0; d < static_cast<int64_t>(p.local_shape.size()); ++d) {
        if (d != p.dim) shape.push_back(p.local_shape[d]);
      }
      out[i] = reduced.narrow(0, off, p.my_rows * p.row_numel).reshape(shape).movedim(0, p.dim).to(p.orig_dtype).contiguous();
      off += p.padded * p.row_numel;
    }
  }
  return out;
}

}  // namespace tdc::fsdp
