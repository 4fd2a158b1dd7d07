// fully_shard's init steps (init.h).
#include "init.h"

#include <set>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "state.h"
#include "tdc/tensor/module_params.h"

namespace tdc::fsdp {

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

void check_not_fully_sharded(const nn::Module& module) {
  if (state_of(module)) {
    throw std::invalid_argument(
        fmt::format("fully_shard: module of type '{}' is already fully_shard'ed", module.type_name()));
  }
}

void check_options(const nn::Module& module, const DeviceMesh& mesh, const FullyShardOptions& options) {
  if (mesh.ndim() > 2) {
    throw std::invalid_argument(
        fmt::format("fully_shard on '{}': the mesh has {} dims ({}); it must be 1-D (shard) or 2-D (replicate, shard)",
                    module.type_name(), mesh.ndim(), mesh.to_string()));
  }
  for (auto dt : {options.mp_policy.param_dtype, options.mp_policy.reduce_dtype, options.mp_policy.output_dtype}) {
    if (dt && !at::isFloatingType(*dt)) {
      throw std::invalid_argument(fmt::format("fully_shard on '{}': mp_policy dtype {} is not a floating type",
                                              module.type_name(), c10::toString(*dt)));
    }
  }
  const int64_t n = mesh.size(mesh.ndim() - 1);
  if (const auto* k = std::get_if<int64_t>(&options.reshard_after_forward)) {
    if (*k < 1 || n % *k != 0) {
      throw std::invalid_argument(fmt::format(
          "fully_shard on '{}': reshard_after_forward={} must be a positive divisor of the shard world size {}",
          module.type_name(), *k, n));
    }
  }
}

namespace {

using ParamKey = const c10::TensorImpl*;

// Parameters already owned by nested fully_shard'ed modules.
std::unordered_set<ParamKey> owned_by_nested(const nn::Module& module) {
  std::unordered_set<ParamKey> owned;
  for (const auto& s : states_in(module)) {
    if (&s->module() == &module) continue;
    for (const auto& p : s->group().params()) owned.insert(p.registered().unsafeGetTensorImpl());
  }
  return owned;
}

// Every registration of every parameter (tied parameters have several).
std::unordered_map<ParamKey, ParamUses> uses_of_params(const nn::Module& module) {
  std::unordered_map<ParamKey, ParamUses> uses;
  for (auto& [prefix, m] : module.named_modules_tdc()) {
    for (const auto& item : m->named_parameters(/*recurse=*/false)) {
      if (item.value().defined()) uses[item.value().unsafeGetTensorImpl()].emplace_back(m, item.key());
    }
  }
  return uses;
}

// FSDP over tensor parallel: a 1-D FSDP mesh and a 1-D TP mesh, the two dims of one (dp, tp) mesh.
void check_tp_layout(const nn::Module& module, const std::string& fqn, const tensor::DTensorSpec& tp_spec,
                     const DeviceMesh& mesh) {
  if (mesh.ndim() != 1 || tp_spec.mesh.ndim() != 1) {
    throw std::invalid_argument(fmt::format(
        "fully_shard on '{}': parameter '{}' is distributed on {} and the FSDP mesh is {}; FSDP over tensor "
        "parallel needs a 1-D FSDP mesh and a 1-D TP mesh sliced from one 2-D (dp, tp) mesh",
        module.type_name(), fqn, tp_spec.mesh.to_string(), mesh.to_string()));
  }
  DeviceMesh root = mesh.root_mesh();
  if (!(root == tp_spec.mesh.root_mesh()) || root.ndim() != 2 || mesh.dims_in_root() != std::vector<int64_t>{0} ||
      tp_spec.mesh.dims_in_root() != std::vector<int64_t>{1}) {
    throw std::invalid_argument(fmt::format(
        "fully_shard on '{}': parameter '{}' is distributed on {} which is not the second dim of the FSDP mesh "
        "{}'s parent; slice both from one (dp, tp) mesh",
        module.type_name(), fqn, tp_spec.mesh.to_string(), mesh.to_string()));
  }
}

void check_param(const nn::Module& module, const ParamPlan& pl, const DeviceMesh& mesh,
                 const FullyShardOptions& options) {
  const at::Tensor& t = pl.tensor;
  if (!at::isFloatingType(t.scalar_type())) {
    throw std::invalid_argument(
        fmt::format("fully_shard on '{}': parameter '{}' has dtype {}; only floating-point "
                    "parameters can be sharded (list it in ignored_params)",
                    module.type_name(), pl.fqn, c10::toString(t.scalar_type())));
  }
  if (t.device().type() != c10::Device(mesh.device_type()).type() && !t.is_meta() &&
      !options.offload_policy.cpu_offload) {
    throw std::invalid_argument(fmt::format("fully_shard on '{}': parameter '{}' is on {} but the mesh is on {}",
                                            module.type_name(), pl.fqn, t.device().str(), mesh.device_type()));
  }
  if (t.dim() == 0) {
    throw std::invalid_argument(fmt::format("fully_shard on '{}': parameter '{}' is a scalar; it cannot be sharded",
                                            module.type_name(), pl.fqn));
  }
  if (pl.tp_spec) check_tp_layout(module, pl.fqn, *pl.tp_spec, mesh);
}

// Shard(d) from shard_placement_fn, normalised; 0 without one.
int64_t shard_dim_of(const nn::Module& module, const ParamPlan& pl, const FullyShardOptions& options) {
  if (!options.shard_placement_fn) return 0;
  auto s = options.shard_placement_fn(pl.tensor, pl.tp_spec, pl.fqn);
  if (!s) return 0;
  const int64_t d = s->dim < 0 ? s->dim + pl.tensor.dim() : s->dim;
  if (d < 0 || d >= pl.tensor.dim()) {
    throw std::invalid_argument(
        fmt::format("fully_shard on '{}': shard_placement_fn gave Shard({}) for '{}' "
                    "with {} dims",
                    module.type_name(), s->dim, pl.fqn, pl.tensor.dim()));
  }
  return d;
}

}  // namespace

std::vector<ParamPlan> plan_params(nn::Module& module, const DeviceMesh& mesh, const FullyShardOptions& options) {
  const std::unordered_set<ParamKey> owned = owned_by_nested(module);
  const std::set<std::string> ignored(options.ignored_params.begin(), options.ignored_params.end());
  std::unordered_map<ParamKey, ParamUses> uses = uses_of_params(module);
  std::vector<ParamPlan> plan;
  for (auto& [fqn, t] : module.named_params()) {
    if (owned.count(t.unsafeGetTensorImpl()) || ignored.count(fqn)) continue;
    ParamPlan pl{fqn, t, uses[t.unsafeGetTensorImpl()], nullptr, 0};
    auto [owner, name] = module.owner_of(fqn);
    pl.tp_spec = tensor::param_spec(*owner, name);
    check_param(module, pl, mesh, options);
    pl.dim = shard_dim_of(module, pl, options);
    plan.push_back(std::move(pl));
  }
  return plan;
}

}  // namespace tdc::fsdp
