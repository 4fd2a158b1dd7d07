// FSDP2 fully_shard for tdc::nn modules (tdc/fsdp/fully_shard.h).
//
// Pieces here: UnshardFunction (the autograd node of a group: forward hands out the unsharded
// tensors, backward reduces their gradients to the shards), FSDPState (hooks, lazy init, root),
// fully_shard itself and the FSDPModule methods. The parameters and their collectives
// (FSDPParam, ParamGroup) are in param_group.h / param_group.cpp.
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
#include "param_group.h"

namespace tdc::fsdp {

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

