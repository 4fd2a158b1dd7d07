// FSDP2 fully_shard for tdc::nn modules (tdc/fsdp/fully_shard.h).
//
// Pieces: FSDPParam (one parameter: its shard, its unsharded tensor, every (module, name) that
// registers it), ParamGroup (the parameters of one fully_shard call: all-gather, reduce-scatter,
// reshard), UnshardFunction (the autograd node of a group: forward hands out the unsharded
// tensors, backward reduces their gradients to the shards), FSDPState (hooks, lazy init, root).
#include "tdc/fsdp/fully_shard.h"

#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include "tdc/comm/collectives.h"
#include "tdc/tensor/dtensor.h"
#include "tdc/tensor/module_params.h"

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

// ------------------------------------------------------------------ parameters and groups

struct FSDPParam {
  std::string fqn;                                        // relative to the fully_shard'ed module
  std::vector<std::pair<nn::Module*, std::string>> uses;  // every registration (tied params)
  std::vector<int64_t> local_shape;  // what the module computes with (TP-local when TP'd)
  at::ScalarType orig_dtype = at::kFloat;
  at::ScalarType param_dtype = at::kFloat;  // unsharded dtype (mp_policy.param_dtype or orig)
  int64_t dim = 0;                          // FSDP shard dim of the local tensor
  int64_t rows = 0, padded = 0, my_rows = 0, row_numel = 1;
  bool requires_grad = true;
  at::Tensor shard;      // the registered leaf
  at::Tensor unsharded;  // local_shape, param_dtype; storage freed while resharded
  int64_t gathered_version = -1;  // shard version the unsharded data was gathered from
  at::Tensor grad_accum;          // unsharded gradient accumulated without sync
  tensor::DTensorSpec spec;
  // All-gather extension (set_all_gather_extension): the gathered buffers are kept (same
  // storage every time: post_all_gather refills `unsharded` from them).
  std::shared_ptr<AllGatherExtension> ext;
  std::vector<at::Tensor> ext_outputs, ext_to_free;
  std::shared_ptr<void> ext_meta;
};

struct ParamGroup {
  std::vector<FSDPParam> params;
  DeviceMesh mesh{std::shared_ptr<const DeviceMesh::State>()};
  DeviceMesh shard_mesh{std::shared_ptr<const DeviceMesh::State>()};  // the 1-D shard dim of `mesh`
  comm::GroupPtr shard_pg, replicate_pg;
  int64_t shard_size = 1, shard_rank = 0, replicate_size = 1;
  MixedPrecisionPolicy mp;
  OffloadPolicy offload;
  bool unsharded = false;
  // Autograd nodes of this group whose backward has not run yet (one per forward call with grad):
  // a module called twice before backward reshards only after its last node ran, since the other
  // call's saved tensors alias the same unsharded storage.
  int pending_nodes = 0;
  bool gather_checked = false, reduce_checked = false;  // [Note: FSDP's collectives skip ...]
  bool reshard_after_backward = true;
  bool requires_sync = true;
  // A pending async all-gather: finish() copies out.
  struct Pending {
    comm::Work work;
    std::vector<std::pair<std::vector<size_t>, at::Tensor>> outs;  // param indices per dtype bucket
  };
  std::optional<Pending> pending;

  // dtype buckets: params with the same unsharded dtype share one collective.
  std::map<at::ScalarType, std::vector<size_t>> buckets() const {
    std::map<at::ScalarType, std::vector<size_t>> b;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].ext) b[params[i].param_dtype].push_back(i);
    }
    return b;
  }

  bool valid() const {
    if (!unsharded) return false;
    for (const auto& p : params) {
      if (p.shard._version() != p.gathered_version) return false;
    }
    return true;
  }

  // An extension parameter: pre_all_gather, then one all-gather per returned tensor into the
  // kept buffers (synchronous; copied in without a version bump: autograd saved aliases).
  void gather_extension(FSDPParam& p) {
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

  void finish_extension(FSDPParam& p) {
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

  void start_all_gather(bool async_op) {
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

  void finish_all_gather() {
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

  void unshard(bool async_op = false) {
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

  void reshard() {
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

  void check_unmodified(const char* when) const {
    for (const auto& p : params) {
      if (p.gathered_version >= 0 && p.shard._version() != p.gathered_version) {
        throw std::runtime_error(fmt::format(
            "fully_shard: parameter '{}' was modified in place between forward and {} (an optimizer step "
            "before backward?); its gradient would not match the values the forward used",
            p.fqn, when));
      }
    }
  }

  // Unsharded gradients (param_dtype, undefined = none) -> shard gradients (orig dtype).
  std::vector<at::Tensor> reduce(const std::vector<at::Tensor>& grads) {
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
};

// ------------------------------------------------------------------ the autograd node of a group

namespace {
struct GroupRef : torch::CustomClassHolder {
  explicit GroupRef(std::shared_ptr<FSDPState> s) : state(std::move(s)) {}
  std::shared_ptr<FSDPState> state;
};
}  // namespace

class FSDPState : public std::enable_shared_from_this<FSDPState> {
 public:
  nn::Module* module = nullptr;
  ParamGroup group;
  bool reshard_after_forward = true;
  bool is_root = false, lazy_inited = false;
  std::vector<std::weak_ptr<FSDPState>> tree;  // root only: every state in its subtree (incl. itself)
  std::vector<nn::Module*> forward_prefetch, backward_prefetch;
  bool backward_callback_queued = false;
  bool is_last_backward = true;

  void lazy_init();
  nn::Tensors pre_forward(nn::Tensors inputs);
  nn::Tensors post_forward(nn::Tensors outputs);
  void pre_backward();
  std::vector<at::Tensor> post_backward(const std::vector<at::Tensor>& grads);
  void end_of_backward();
};

namespace {

struct UnshardFunction : torch::autograd::Function<UnshardFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, c10::intrusive_ptr<GroupRef> ref,
                                                at::TensorList shards) {
    (void)shards;
    ctx->saved_data["state"] = c10::IValue::make_capsule(ref);
    torch::autograd::variable_list out;
    for (auto& p : ref->state->group.params) out.push_back(p.unsharded.detach());
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto capsule = ctx->saved_data["state"].toCapsule();
    auto* ref = static_cast<GroupRef*>(capsule.get());
    std::vector<at::Tensor> shard_grads = ref->state->post_backward(grads);
    torch::autograd::variable_list out{at::Tensor()};
    out.insert(out.end(), shard_grads.begin(), shard_grads.end());
    return out;
  }
};

std::mutex g_registry_mu;
std::unordered_map<const nn::Module*, std::weak_ptr<FSDPState>>& registry() {
  static std::unordered_map<const nn::Module*, std::weak_ptr<FSDPState>> r;
  return r;
}
std::shared_ptr<FSDPState> state_of(const nn::Module& m) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto it = registry().find(&m);
  if (it == registry().end()) return nullptr;
  return it->second.lock();
}

nn::Tensors cast_floating(nn::Tensors xs, at::ScalarType dtype) {
  for (auto& x : xs) {
    if (x.defined() && at::isFloatingType(x.scalar_type()) && x.scalar_type() != dtype) x = x.to(dtype);
  }
  return xs;
}

}  // namespace

void FSDPState::lazy_init() {
  if (lazy_inited) return;
  // The first fully_shard'ed module to run forward is the root of everything below it.
  is_root = true;
  lazy_inited = true;
  reshard_after_forward = false;  // its parameters would be gathered again at once for backward
  for (auto& [name, m] : module->named_modules_tdc()) {
    auto s = state_of(*m);
    if (!s) continue;
    tree.push_back(s);
    if (s.get() != this) {
      s->lazy_inited = true;
      s->is_root = false;
    }
  }
}

nn::Tensors FSDPState::pre_forward(nn::Tensors inputs) {
  lazy_init();
  if (group.mp.param_dtype && group.mp.cast_forward_inputs) inputs = cast_floating(std::move(inputs), *group.mp.param_dtype);
  group.unshard();
  for (nn::Module* m : forward_prefetch) {
    if (auto s = state_of(*m)) s->group.unshard(/*async_op=*/true);
  }
  if (!group.params.empty()) {
    torch::autograd::variable_list shards;
    for (auto& p : group.params) shards.push_back(p.shard);
    torch::autograd::variable_list unsharded =
        UnshardFunction::apply(c10::make_intrusive<GroupRef>(shared_from_this()), at::TensorList(shards));
    if (!unsharded.empty() && unsharded[0].requires_grad()) ++group.pending_nodes;
    for (size_t i = 0; i < group.params.size(); ++i) {
      for (auto& [m, name] : group.params[i].uses) m->set_param_substitute(name, unsharded[i]);
    }
  }
  return inputs;
}

nn::Tensors FSDPState::post_forward(nn::Tensors outputs) {
  if (reshard_after_forward && !is_root) group.reshard();
  if (is_root && group.mp.output_dtype) outputs = cast_floating(std::move(outputs), *group.mp.output_dtype);
  if (at::GradMode::is_enabled()) {
    std::weak_ptr<FSDPState> weak = weak_from_this();
    for (auto& y : outputs) {
      if (!y.defined() || !y.requires_grad()) continue;
      y.register_hook([weak](const at::Tensor& g) {
        if (auto s = weak.lock()) s->pre_backward();
        return g;
      });
    }
  }
  return outputs;
}

void FSDPState::pre_backward() {
  if (is_root && !backward_callback_queued) {
    backward_callback_queued = true;
    std::weak_ptr<FSDPState> weak = weak_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([weak] {
      if (auto s = weak.lock()) s->end_of_backward();
    });
  }
  if (group.params.empty()) return;
  group.check_unmodified("backward");
  group.unshard();
  for (nn::Module* m : backward_prefetch) {
    if (auto s = state_of(*m)) s->group.unshard(/*async_op=*/true);
  }
}

std::vector<at::Tensor> FSDPState::post_backward(const std::vector<at::Tensor>& grads) {
  group.check_unmodified("backward");
  std::vector<at::Tensor> out = group.reduce(grads);
  group.pending_nodes = std::max(0, group.pending_nodes - 1);
  if (group.reshard_after_backward && group.pending_nodes == 0) group.reshard();
  return out;
}

void FSDPState::end_of_backward() {
  backward_callback_queued = false;
  for (auto& w : tree) {
    auto s = w.lock();
    if (!s) continue;
    s->group.pending_nodes = 0;  // nodes of unused outputs never run
    if (s->group.reshard_after_backward) s->group.reshard();
  }
}

// ------------------------------------------------------------------ fully_shard

namespace {

// The 1-D mesh over the default group, made once per default group (a mesh makes groups).
DeviceMesh default_mesh() {
  thread_local std::weak_ptr<comm::ProcessGroup> made_for;
  thread_local std::optional<DeviceMesh> mesh;
  comm::GroupPtr world = comm::default_group();
  if (!mesh || made_for.lock() != world) {
    mesh = init_device_mesh(world->device_type(), {world->size()});
    made_for = world;
  }
  return *mesh;
}

struct Planned {
  std::string fqn;
  at::Tensor tensor;
  std::vector<std::pair<nn::Module*, std::string>> uses;
  const tensor::DTensorSpec* tp_spec = nullptr;
  int64_t dim = 0;
};

}  // namespace

FSDPModule fully_shard(nn::Module& module, const FullyShardOptions& options) {
  if (state_of(module)) {
    throw std::invalid_argument(fmt::format("fully_shard: module of type '{}' is already fully_shard'ed",
                                            module.type_name()));
  }
  DeviceMesh mesh = options.mesh ? *options.mesh : default_mesh();
  if (mesh.ndim() > 2) {
    throw std::invalid_argument(fmt::format(
        "fully_shard on '{}': the mesh has {} dims ({}); it must be 1-D (shard) or 2-D (replicate, shard)",
        module.type_name(), mesh.ndim(), mesh.to_string()));
  }
  for (auto dt : {options.mp_policy.param_dtype, options.mp_policy.reduce_dtype, options.mp_policy.output_dtype}) {
    if (dt && !at::isFloatingType(*dt)) {
      throw std::invalid_argument(fmt::format("fully_shard on '{}': mp_policy dtype {} is not a floating type",
                                              module.type_name(), c10::toString(*dt)));
    }
  }
  const int64_t shard_dim_of_mesh = mesh.ndim() - 1;
  const int64_t n = mesh.size(shard_dim_of_mesh), me = mesh.get_local_rank(shard_dim_of_mesh);
  if (const auto* k = std::get_if<int64_t>(&options.reshard_after_forward)) {
    if (*k < 1 || n % *k != 0) {
      throw std::invalid_argument(fmt::format(
          "fully_shard on '{}': reshard_after_forward={} must be a positive divisor of the shard world size {}",
          module.type_name(), *k, n));
    }
  }

  // Parameters already owned by nested fully_shard'ed modules, and ignored ones.
  std::unordered_set<const c10::TensorImpl*> owned;
  for (auto& [name, m] : module.named_modules_tdc()) {
    if (m == &module) continue;
    if (auto s = state_of(*m)) {
      for (auto& p : s->group.params) owned.insert(p.shard.unsafeGetTensorImpl());
    }
  }
  std::set<std::string> ignored(options.ignored_params.begin(), options.ignored_params.end());

  // Every registration of every parameter (tied parameters have several).
  std::unordered_map<const c10::TensorImpl*, std::vector<std::pair<nn::Module*, std::string>>> uses;
  for (auto& [prefix, m] : module.named_modules_tdc()) {
    for (const auto& item : m->named_parameters(/*recurse=*/false)) {
      if (item.value().defined()) uses[item.value().unsafeGetTensorImpl()].emplace_back(m, item.key());
    }
  }

  // Plan and validate everything before changing anything.
  std::vector<Planned> plan;
  for (auto& [fqn, t] : module.named_params()) {
    if (owned.count(t.unsafeGetTensorImpl()) || ignored.count(fqn)) continue;
    Planned pl{fqn, t, uses[t.unsafeGetTensorImpl()], nullptr, 0};
    auto [owner, name] = module.owner_of(fqn);
    pl.tp_spec = tensor::param_spec(*owner, name);
    if (!at::isFloatingType(t.scalar_type())) {
      throw std::invalid_argument(fmt::format("fully_shard on '{}': parameter '{}' has dtype {}; only floating-point "
                                              "parameters can be sharded (list it in ignored_params)",
                                              module.type_name(), fqn, c10::toString(t.scalar_type())));
    }
    if (t.device().type() != c10::Device(mesh.device_type()).type() && !t.is_meta() &&
        !options.offload_policy.cpu_offload) {
      throw std::invalid_argument(fmt::format("fully_shard on '{}': parameter '{}' is on {} but the mesh is on {}",
                                              module.type_name(), fqn, t.device().str(), mesh.device_type()));
    }
    if (t.dim() == 0) {
      throw std::invalid_argument(fmt::format("fully_shard on '{}': parameter '{}' is a scalar; it cannot be sharded",
                                              module.type_name(), fqn));
    }
    if (pl.tp_spec) {
      if (mesh.ndim() != 1 || pl.tp_spec->mesh.ndim() != 1) {
        throw std::invalid_argument(fmt::format(
            "fully_shard on '{}': parameter '{}' is distributed on {} and the FSDP mesh is {}; FSDP over tensor "
            "parallel needs a 1-D FSDP mesh and a 1-D TP mesh sliced from one 2-D (dp, tp) mesh",
            module.type_name(), fqn, pl.tp_spec->mesh.to_string(), mesh.to_string()));
      }
      DeviceMesh root = mesh.root_mesh();
      if (!(root == pl.tp_spec->mesh.root_mesh()) || root.ndim() != 2 || mesh.dims_in_root() != std::vector<int64_t>{0} ||
          pl.tp_spec->mesh.dims_in_root() != std::vector<int64_t>{1}) {
        throw std::invalid_argument(fmt::format(
            "fully_shard on '{}': parameter '{}' is distributed on {} which is not the second dim of the FSDP mesh "
            "{}'s parent; slice both from one (dp, tp) mesh", module.type_name(), fqn, pl.tp_spec->mesh.to_string(),
            mesh.to_string()));
      }
    }
    if (options.shard_placement_fn) {
      if (auto s = options.shard_placement_fn(t, pl.tp_spec, fqn)) {
        const int64_t d = s->dim < 0 ? s->dim + t.dim() : s->dim;
        if (d < 0 || d >= t.dim()) {
          throw std::invalid_argument(fmt::format("fully_shard on '{}': shard_placement_fn gave Shard({}) for '{}' "
                                                  "with {} dims", module.type_name(), s->dim, fqn, t.dim()));
        }
        pl.dim = d;
      }
    }
    plan.push_back(std::move(pl));
  }

  auto state = std::make_shared<FSDPState>();
  state->module = &module;
  // An int k reshards to a world of k after forward: k == 1 keeps the whole parameter (False);
  // any other divisor is resharded fully here (same values, at most the memory of True).
  state->reshard_after_forward = std::holds_alternative<bool>(options.reshard_after_forward)
                                     ? std::get<bool>(options.reshard_after_forward)
                                     : std::get<int64_t>(options.reshard_after_forward) != 1;
  ParamGroup& g = state->group;
  g.mesh = mesh;
  g.mp = options.mp_policy;
  g.offload = options.offload_policy;
  g.shard_pg = mesh.get_group(shard_dim_of_mesh);
  g.shard_mesh = mesh.ndim() == 2 ? mesh.select_dims({1}) : mesh;
  g.shard_size = n;
  g.shard_rank = me;
  if (mesh.ndim() == 2) {
    g.replicate_pg = mesh.get_group(0);
    g.replicate_size = mesh.size(0);
  }
  for (auto& pl : plan) {
    FSDPParam p;
    p.fqn = pl.fqn;
    p.uses = pl.uses;
    p.local_shape = pl.tensor.sizes().vec();
    p.orig_dtype = pl.tensor.scalar_type();
    p.param_dtype = options.mp_policy.param_dtype.value_or(p.orig_dtype);
    p.dim = pl.dim;
    p.rows = p.local_shape[p.dim];
    p.padded = (p.rows + n - 1) / n;
    tensor::ChunkRange cr = tensor::chunk_range(p.rows, n, me);
    p.my_rows = cr.size;
    p.row_numel = p.rows == 0 ? 0 : pl.tensor.numel() / p.rows;
    p.requires_grad = pl.tensor.requires_grad();
    at::Tensor src = pl.tensor.detach();
    // Ranks must agree on the values: the shard of rank 0's tensor (as PyTorch's init broadcast).
    if (!pl.tp_spec && !src.is_meta()) {
      src = src.clone();
      if (mesh.size() > 1) {
        for (int64_t d = 0; d < mesh.ndim(); ++d) comm::broadcast(src, 0, mesh.get_group(d));
      }
    }
    p.shard = src.narrow(p.dim, cr.offset, cr.size).clone(at::MemoryFormat::Contiguous);
    if (options.offload_policy.cpu_offload && !p.shard.is_meta()) p.shard = p.shard.to(at::kCPU);
    p.shard.requires_grad_(p.requires_grad);
    // The spec.
    tensor::DTensorSpec spec;
    if (pl.tp_spec) {
      spec.mesh = mesh.root_mesh();
      const tensor::Placement& tp = pl.tp_spec->placements[0];
      tensor::Placement dp = tensor::Shard{p.dim};
      if (const auto* s = std::get_if<tensor::Shard>(&tp); s && s->dim == p.dim) {
        dp = tensor::StridedShard{p.dim, pl.tp_spec->mesh.size()};
      }
      spec.placements = {dp, tp};
      spec.shape = pl.tp_spec->shape;
      spec.stride = pl.tp_spec->stride;
    } else {
      spec.mesh = mesh;
      spec.placements = mesh.ndim() == 2 ? tensor::Placements{tensor::Replicate{}, tensor::Shard{p.dim}}
                                         : tensor::Placements{tensor::Shard{p.dim}};
      spec.shape = p.local_shape;
    }
    spec.dtype = p.orig_dtype;
    p.spec = spec;
    g.params.push_back(std::move(p));
  }
  // Apply: the shards become the registered parameters.
  for (auto& p : g.params) {
    for (auto& [m, name] : p.uses) {
      m->replace_param(name, p.shard);
      tensor::set_param_spec(*m, name, p.spec);
    }
  }
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    registry()[&module] = state;
  }
  std::weak_ptr<FSDPState> weak = state;
  module.register_forward_pre_hook([state](nn::Module&, const nn::Tensors& in) -> std::optional<nn::Tensors> {
    return state->pre_forward(in);
  });
  module.register_forward_hook([weak](nn::Module&, const nn::Tensors&, const nn::Tensors& out) -> std::optional<nn::Tensors> {
    if (auto s = weak.lock()) return s->post_forward(out);
    return std::nullopt;
  });
  return FSDPModule(state);
}

// ------------------------------------------------------------------ FSDPModule

bool is_fully_sharded(const nn::Module& module) { return state_of(module) != nullptr; }

FSDPModule as_fsdp(nn::Module& module) {
  auto s = state_of(module);
  if (!s) {
    throw std::invalid_argument(fmt::format("module of type '{}' was never fully_shard'ed: it has no FSDPModule "
                                            "methods (call fully_shard on it first)", module.type_name()));
  }
  return FSDPModule(s);
}

nn::Module& FSDPModule::module() const { return *state_->module; }

UnshardHandle FSDPModule::unshard(bool async_op) {
  state_->group.unshard(async_op);
  if (!async_op) return UnshardHandle();
  std::weak_ptr<FSDPState> weak = state_;
  return UnshardHandle([weak] {
    if (auto s = weak.lock()) s->group.finish_all_gather();
  });
}

void FSDPModule::reshard() { state_->group.reshard(); }

namespace {
template <class F>
void for_subtree(FSDPState& st, bool recurse, F&& f) {
  if (!recurse) {
    f(st);
    return;
  }
  for (auto& [name, m] : st.module->named_modules_tdc()) {
    if (auto s = state_of(*m)) f(*s);
  }
}
}  // namespace

void FSDPModule::set_requires_gradient_sync(bool sync, bool recurse) {
  for_subtree(*state_, recurse, [sync](FSDPState& s) { s.group.requires_sync = sync; });
}
void FSDPModule::set_reshard_after_backward(bool on, bool recurse) {
  for_subtree(*state_, recurse, [on](FSDPState& s) { s.group.reshard_after_backward = on; });
}
void FSDPModule::set_reshard_after_forward(bool on, bool recurse) {
  for_subtree(*state_, recurse, [on](FSDPState& s) {
    if (!s.is_root) s.reshard_after_forward = on;
  });
}
void FSDPModule::set_modules_to_forward_prefetch(const std::vector<nn::Module*>& modules) {
  for (nn::Module* m : modules) as_fsdp(*m);  // each must be fully_shard'ed (throws naming it)
  state_->forward_prefetch = modules;
}
void FSDPModule::set_modules_to_backward_prefetch(const std::vector<nn::Module*>& modules) {
  for (nn::Module* m : modules) as_fsdp(*m);
  state_->backward_prefetch = modules;
}
void set_all_gather_extension(nn::Module& module, const std::string& fqn, AllGatherExtension extension) {
  if (!extension.post_all_gather || (!extension.pre_all_gather && !extension.pre_all_gather_v1)) {
    throw std::invalid_argument(fmt::format(
        "set_all_gather_extension('{}'): an extension needs post_all_gather and pre_all_gather (or pre_all_gather_v1)", fqn));
  }
  auto [owner, name] = module.owner_of(fqn);  // throws naming the FQN
  for (auto& [prefix, m] : module.named_modules_tdc()) {
    auto s = state_of(*m);
    if (!s) continue;
    for (auto& p : s->group.params) {
      for (auto& [um, un] : p.uses) {
        if (um == owner && un == name) {
          p.ext = std::make_shared<AllGatherExtension>(std::move(extension));
          p.ext_outputs.clear();
          p.ext_to_free.clear();
          s->group.reshard();
          p.unsharded = at::Tensor();
          return;
        }
      }
    }
  }
  throw std::invalid_argument(fmt::format(
      "set_all_gather_extension: parameter '{}' of {} is not sharded by a fully_shard'ed module", fqn, module.type_name()));
}

void to_empty(nn::Module& module, c10::Device device) {
  // FSDP shards first (they are registered parameters too), then every other parameter and
  // buffer; a tensor registered twice (tied) gets one new tensor.
  std::unordered_map<const c10::TensorImpl*, at::Tensor> replaced;
  for (auto& [prefix, m] : module.named_modules_tdc()) {
    auto s = state_of(*m);
    if (!s) continue;
    s->group.reshard();
    for (auto& p : s->group.params) {
      const c10::Device d = s->group.offload.cpu_offload ? c10::Device(c10::kCPU) : device;
      at::Tensor fresh = at::empty(p.shard.sizes(), p.shard.options().device(d)).requires_grad_(p.requires_grad);
      replaced[p.shard.unsafeGetTensorImpl()] = fresh;
      replaced[fresh.unsafeGetTensorImpl()] = fresh;  // already done: the loop below keeps it
      p.shard = fresh;
      for (auto& [um, un] : p.uses) um->replace_param(un, fresh);
      p.unsharded = at::Tensor();
      p.ext_outputs.clear();
      p.ext_to_free.clear();
      p.gathered_version = -1;
    }
  }
  for (auto& [prefix, m] : module.named_modules_tdc()) {
    for (const auto& item : m->named_parameters(/*recurse=*/false)) {
      const at::Tensor& t = item.value();
      if (!t.defined()) continue;
      auto it = replaced.find(t.unsafeGetTensorImpl());
      if (it == replaced.end()) {
        at::Tensor fresh = at::empty(t.sizes(), t.options().device(device)).requires_grad_(t.requires_grad());
        it = replaced.emplace(t.unsafeGetTensorImpl(), fresh).first;
      }
      if (!it->second.is_same(t)) m->replace_param(item.key(), it->second);
    }
    for (const auto& [name, b] : m->named_bufs(/*recurse=*/false)) {
      // Buffers keep their identity (LibTorch's registry holds them too): set_data, which LibTorch
      // allows between dense devices but not from meta.
      if (b.is_meta()) {
        throw std::invalid_argument(fmt::format(
            "to_empty: buffer '{}' is on the meta device; tdc can materialise meta parameters but not meta buffers "
            "(build buffers on a real device)", prefix.empty() ? name : prefix + "." + name));
      }
      at::Tensor(b).set_data(at::empty(b.sizes(), b.options().device(device)));
    }
  }
}

void FSDPModule::set_is_last_backward(bool on) { state_->is_last_backward = on; }
bool FSDPModule::is_last_backward() const { return state_->is_last_backward; }

}  // namespace tdc::fsdp
