// Building FSDP1 units (wrapping.h).
#include "wrapping.h"

#include "common.h"
#include "flat_param.h"
#include "sharded_layout.h"
#include "tdc/comm/collectives.h"
#include "tdc/tensor/module_params.h"
#include "unit_state.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <mutex>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace tdc::fsdp1::detail {

namespace {

// ------------------------------------------------------------------ registry of wrapped modules

std::mutex g_mu;
std::unordered_set<const nn::Module*>& wrapped_modules() {
  static std::unordered_set<const nn::Module*> s;
  return s;
}

bool is_hybrid(ShardingStrategy s) {
  return s == ShardingStrategy::HYBRID_SHARD || s == ShardingStrategy::_HYBRID_SHARD_ZERO2;
}

// ------------------------------------------------------------------ groups

struct Groups {
  comm::GroupPtr shard, replicate;
};

Groups resolve_groups(const nn::Module& module, const FSDPOptions& o) {
  if (o.process_group && o.device_mesh) {
    throw std::invalid_argument(
        fmt::format("FullyShardedDataParallel({}): pass process_group or device_mesh, not both", module.type_name()));
  }
  if (o.device_mesh) {
    const DeviceMesh& mesh = *o.device_mesh;
    if (mesh.ndim() > 2) {
      throw std::invalid_argument(
          fmt::format("FullyShardedDataParallel({}): device_mesh {} has {} dims; FSDP1 takes "
                      "1 or 2",
                      module.type_name(), mesh.to_string(), mesh.ndim()));
    }
    if (is_hybrid(o.sharding_strategy)) {
      if (mesh.ndim() != 2) {
        throw std::invalid_argument(
            fmt::format("FullyShardedDataParallel({}): {} needs a 2-D device_mesh (replicate, shard); got {}",
                        module.type_name(), to_string(o.sharding_strategy), mesh.to_string()));
      }
      return {mesh.get_group(1), mesh.get_group(0)};
    }
    return {mesh.get_group(0), nullptr};  // a 2-D mesh without a hybrid strategy: dim 0, as PyTorch
  }
  if (is_hybrid(o.sharding_strategy)) {
    throw std::invalid_argument(fmt::format(
        "FullyShardedDataParallel({}): {} needs a 2-D device_mesh (replicate, shard); tdc does not derive intra- and "
        "inter-node groups from a process group",
        module.type_name(), to_string(o.sharding_strategy)));
  }
  return {comm::resolve(o.process_group), nullptr};
}

// ------------------------------------------------------------------ the plan

struct Plan {
  // Submodules to wrap, bottom-up (a child before its parent), with where they hang.
  struct Unit {
    nn::Module* parent;
    std::string name;
    nn::ModulePtr module;
  };
  std::vector<Unit> children;
  std::unordered_set<const nn::Module*> roots;  // modules that are (or will be) units of their own
};

std::unordered_set<const nn::Module*> ignored_set(nn::Module& root, const FSDPOptions& o) {
  std::unordered_set<const nn::Module*> out;
  for (nn::Module* m : o.ignored_modules) {
    if (!m)
      throw std::invalid_argument(fmt::format("FullyShardedDataParallel({}): a null ignored module", root.type_name()));
    for (auto& [fqn, sub] : m->named_modules_tdc()) out.insert(sub);
  }
  return out;
}

int64_t numel_of(nn::Module& m, const std::unordered_set<const nn::Module*>& ignored) {
  int64_t n = 0;
  for (auto& [fqn, sub] : m.named_modules_tdc()) {
    if (ignored.count(sub)) continue;
    for (auto& item : sub->named_parameters(/*recurse=*/false)) {
      if (item.value().defined()) n += item.value().numel();
    }
  }
  return n;
}

// PyTorch's _recursive_wrap: returns the numel wrapped under `m`.
int64_t plan_recursive(nn::Module& m, const WrapPolicy& policy, const std::unordered_set<const nn::Module*>& ignored,
                       bool only_children, Plan& plan, nn::Module* parent, const std::string& name,
                       const nn::ModulePtr& self) {
  const int64_t nonwrapped = numel_of(m, ignored);
  if (!policy(m, /*recurse=*/true, nonwrapped)) return 0;
  int64_t wrapped = 0;
  for (auto& [child_name, child] : m.named_children_tdc()) {
    if (ignored.count(child.get())) continue;
    wrapped += plan_recursive(*child, policy, ignored, false, plan, &m, child_name, child);
  }
  if (!only_children && policy(m, /*recurse=*/false, nonwrapped - wrapped)) {
    plan.children.push_back({parent, name, self});
    plan.roots.insert(&m);
    return nonwrapped;
  }
  return wrapped;
}

void check_policy_targets(nn::Module& root, const WrapPolicy& policy,
                          const std::unordered_set<const nn::Module*>& ignored) {
  if (policy.module_types().empty()) return;
  std::set<std::string> present;
  for (auto& [fqn, m] : root.named_modules_tdc()) {
    if (!ignored.count(m)) present.insert(m->type_name());
  }
  for (const auto& t : policy.module_types()) {
    if (!present.count(t)) {
      throw std::invalid_argument(fmt::format(
          "FullyShardedDataParallel({}): auto_wrap_policy {} names module type '{}', which no module of the tree has "
          "(types present: {})",
          root.type_name(), policy.name(), t, fmt::join(present, ", ")));
    }
  }
}

// ------------------------------------------------------------------ a unit's parameters

struct Collected {
  std::vector<ParamSlot> slots;
  std::vector<SharedSlot> shared;
  std::vector<at::Tensor> values;
};

void collect_rec(nn::Module& m, const std::string& prefix, const std::unordered_set<const nn::Module*>& stop,
                 const std::unordered_set<const nn::Module*>& ignored,
                 std::unordered_map<const c10::TensorImpl*, size_t>& seen, Collected& out, bool is_top) {
  if (!is_top && (stop.count(&m) || dynamic_cast<FullyShardedDataParallel*>(&m))) return;
  if (ignored.count(&m)) return;
  for (auto& item : m.named_parameters(/*recurse=*/false)) {
    const at::Tensor& t = item.value();
    if (!t.defined()) continue;
    const std::string fqn = clean_fqn(join_fqn(prefix, item.key()));
    auto it = seen.find(t.unsafeGetTensorImpl());
    if (it != seen.end()) {
      out.shared.push_back({&m, item.key(), fqn, it->second});
      continue;
    }
    seen.emplace(t.unsafeGetTensorImpl(), out.slots.size());
    ParamSlot s;
    s.module = &m;
    s.name = item.key();
    s.fqn = fqn;
    s.shape = t.sizes().vec();
    s.numel = t.numel();
    s.offset = out.slots.empty() ? 0 : out.slots.back().offset + out.slots.back().numel;
    s.requires_grad = t.requires_grad();
    if (const tensor::DTensorSpec* spec = tensor::param_spec(m, item.key())) s.tp_spec = *spec;
    out.slots.push_back(std::move(s));
    out.values.push_back(t);
  }
  for (auto& [name, child] : m.named_children_tdc()) {
    collect_rec(*child, join_fqn(prefix, name), stop, ignored, seen, out, false);
  }
}

Collected collect(nn::Module& unit_root, const std::unordered_set<const nn::Module*>& stop,
                  const std::unordered_set<const nn::Module*>& ignored) {
  Collected out;
  std::unordered_map<const c10::TensorImpl*, size_t> seen;
  collect_rec(unit_root, "", stop, ignored, seen, out, true);
  return out;
}

void check_flattenable(const nn::Module& unit_root, const Collected& c, const FSDPOptions& o) {
  for (size_t i = 1; i < c.values.size(); ++i) {
    if (c.values[i].scalar_type() != c.values[0].scalar_type()) {
      throw std::invalid_argument(fmt::format(
          "FullyShardedDataParallel({}): one flat parameter cannot hold parameters of different dtypes: '{}' is {} "
          "but '{}' is {} (wrap them in separate units, or ignore one)",
          unit_root.type_name(), c.slots[0].fqn, c10::toString(c.values[0].scalar_type()), c.slots[i].fqn,
          c10::toString(c.values[i].scalar_type())));
    }
    if (!o.use_orig_params && c.slots[i].requires_grad != c.slots[0].requires_grad) {
      throw std::invalid_argument(fmt::format(
          "FullyShardedDataParallel({}): with use_orig_params=false a flat parameter needs uniform requires_grad: "
          "'{}' has requires_grad={} but '{}' has requires_grad={} (use use_orig_params=true, or wrap them apart)",
          unit_root.type_name(), c.slots[0].fqn, c.slots[0].requires_grad, c.slots[i].fqn, c.slots[i].requires_grad));
    }
  }
  check_tp_slots(o, c.slots, fmt::format("FullyShardedDataParallel({})", unit_root.type_name()));
  for (size_t i = 0; i < c.values.size(); ++i) {
    if (!at::isFloatingType(c.values[i].scalar_type())) {
      throw std::invalid_argument(
          fmt::format("FullyShardedDataParallel({}): parameter '{}' is {}; FSDP flattens "
                      "floating-point parameters only",
                      unit_root.type_name(), c.slots[i].fqn, c10::toString(c.values[i].scalar_type())));
    }
  }
}

void check_not_wrapped(const nn::Module& m, const char* what) {
  if (dynamic_cast<const FullyShardedDataParallel*>(&m)) {
    throw std::invalid_argument(
        fmt::format("FullyShardedDataParallel: {} is already a FullyShardedDataParallel unit (around {})", what,
                    static_cast<const FullyShardedDataParallel&>(m).module().type_name()));
  }
  if (is_wrapped(m)) {
    throw std::invalid_argument(
        fmt::format("FullyShardedDataParallel: {} ({}) is already wrapped by a FullyShardedDataParallel unit", what,
                    m.type_name()));
  }
}

// ------------------------------------------------------------------ building one unit

double predivide_factor(int64_t world) {
  int64_t f = 1;
  while (world % f == 0 && world / f > f) f *= 2;
  return static_cast<double>(f);
}

void sync_module_states(nn::Module& module, const Collected& c, const std::unordered_set<const nn::Module*>& ignored,
                        const comm::GroupPtr& pg) {
  at::NoGradGuard no_grad;
  for (const auto& v : c.values) {
    at::Tensor t = v.detach();
    comm::broadcast(t, 0, pg);
  }
  for (auto& [fqn, m] : module.named_modules_tdc()) {
    if (ignored.count(m)) continue;
    for (auto& item : m->named_buffers(/*recurse=*/false)) {
      at::Tensor t = item.value();
      if (t.defined()) comm::broadcast(t, 0, pg);
    }
  }
}

FSDPPtr build_unit(nn::ModulePtr module, const FSDPOptions& options, const Groups& groups,
                   const std::unordered_set<const nn::Module*>& ignored) {
  Collected c = collect(*module, {}, ignored);
  if (options.sync_module_states) sync_module_states(*module, c, ignored, groups.shard);
  std::unique_ptr<FlatParamHandle> handle;
  if (!c.slots.empty()) {
    HandleConfig cfg;
    cfg.shard_pg = groups.shard;
    cfg.replicate_pg = groups.replicate;
    cfg.sharded = options.sharding_strategy != ShardingStrategy::NO_SHARD && groups.shard->size() > 1;
    cfg.use_orig_params = options.use_orig_params;
    cfg.mp = options.mixed_precision;
    const int64_t dp_world = groups.shard->size() * (groups.replicate ? groups.replicate->size() : 1);
    cfg.predivide = predivide_factor(dp_world);
    cfg.postdivide = static_cast<double>(dp_world) / cfg.predivide;
    cfg.compute_device = options.device_id.value_or(c.values.front().device());
    std::vector<at::Tensor> values = c.values;
    if (!options.cpu_offload.offload_params && values.front().device() != cfg.compute_device) {
      for (auto& v : values) v = v.to(cfg.compute_device);
    }
    handle = std::make_unique<FlatParamHandle>(std::move(c.slots), std::move(c.shared), values, cfg);
  }
  std::vector<nn::Module*> ignored_list(options.ignored_modules.begin(), options.ignored_modules.end());
  auto unit = std::make_shared<UnitState>(options, groups.shard, groups.replicate, std::move(handle), ignored_list);
  nn::Module& wrapped = *module;
  auto wrapper = std::make_shared<FullyShardedDataParallel>(std::move(module), unit);
  unit->attach(wrapper.get());
  if (unit->handle()) unit->handle()->register_sharded(wrapped);
  std::lock_guard<std::mutex> lock(g_mu);
  wrapped_modules().insert(&wrapped);
  return wrapper;
}

}  // namespace

bool is_wrapped(const nn::Module& module) {
  std::lock_guard<std::mutex> lock(g_mu);
  return wrapped_modules().count(&module) > 0;
}

void forget_wrapped(const nn::Module* module) {
  std::lock_guard<std::mutex> lock(g_mu);
  wrapped_modules().erase(module);
}

FSDPPtr wrap_module(nn::ModulePtr module, const FSDPOptions& options) {
  if (!module) throw std::invalid_argument("FullyShardedDataParallel: the module is null");
  check_not_wrapped(*module, "the module");
  const Groups groups = resolve_groups(*module, options);
  const auto ignored = ignored_set(*module, options);
  // 1. The plan: which submodules become units.
  Plan plan;
  if (options.auto_wrap_policy) {
    for (auto& [fqn, m] : module->named_modules_tdc()) {
      if (fqn.empty()) continue;
      if (dynamic_cast<FullyShardedDataParallel*>(m) || is_wrapped(*m)) {
        throw std::invalid_argument(fmt::format(
            "FullyShardedDataParallel({}): auto wrapping needs a tree without FSDP units, but '{}' already is one "
            "(wrap manually or by policy, not both)",
            module->type_name(), clean_fqn(fqn)));
      }
    }
    check_policy_targets(*module, options.auto_wrap_policy, ignored);
    plan_recursive(*module, options.auto_wrap_policy, ignored, /*only_children=*/true, plan, nullptr, "", module);
  }
  // 2. The checks of every unit to be, before anything changes.
  std::unordered_set<const nn::Module*> stop = plan.roots;
  for (const auto& u : plan.children) check_flattenable(*u.module, collect(*u.module, stop, ignored), options);
  check_flattenable(*module, collect(*module, stop, ignored), options);
  // 3. Wrap bottom-up, then the module itself.
  FSDPOptions child_options = options;
  child_options.auto_wrap_policy = WrapPolicy();
  for (const auto& u : plan.children) {
    FSDPPtr w = build_unit(u.module, child_options, groups, ignored);
    u.parent->replace_module(u.name, w);
  }
  return build_unit(std::move(module), options, groups, ignored);
}

void check_state_dict_type_supported(const FullyShardedDataParallel& unit, StateDictType type) {
  if (type == StateDictType::FULL_STATE_DICT) return;
  if (unit.options().sharding_strategy == ShardingStrategy::NO_SHARD) {
    throw std::invalid_argument(
        fmt::format("state_dict_type {}: FSDP unit around {} uses NO_SHARD, whose parameters are not sharded; use "
                    "FULL_STATE_DICT (PyTorch warns and returns the full state dict instead)",
                    to_string(type), unit.module().type_name()));
  }
}

}  // namespace tdc::fsdp1::detail
