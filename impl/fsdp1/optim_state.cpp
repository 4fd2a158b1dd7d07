// FSDP1 optimizer state in state-dict form (tdc/fsdp1/optim_state.h).
#include "tdc/fsdp1/optim_state.h"

#include <map>
#include <optional>
#include <set>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "tdc/core/optimizer_access.h"
#include "common.h"
#include "flat_param.h"
#include "sharded_layout.h"
#include "unit_state.h"

namespace tdc::fsdp1 {
namespace detail {

namespace {

using core::ParamState;

// One unit's optimizer parameters and their state (nullopt: none yet on this rank).
struct UnitOptimState {
  FullyShardedDataParallel* unit = nullptr;
  std::string prefix;  // the unit's FQN
  FlatParamHandle* handle = nullptr;
  std::vector<at::Tensor> params;
  std::vector<std::optional<ParamState>> states;
  std::vector<std::string> names;  // state tensor names, in order (from the first parameter with state)
};

std::vector<UnitOptimState> unit_states(FullyShardedDataParallel& root, torch::optim::Optimizer& optim) {
  std::vector<UnitOptimState> out;
  for (auto& [prefix, u] : named_units(root)) {
    FlatParamHandle* h = u->unit().handle();
    if (!h) continue;
    UnitOptimState us{u, prefix, h, h->optimizer_params(), {}, {}};
    for (const auto& p : us.params) {
      us.states.push_back(core::optimizer_param_state(optim, p));
      if (us.names.empty() && us.states.back()) {
        for (const auto& [name, t] : us.states.back()->tensors) {
          if (t.defined()) us.names.push_back(name);
        }
      }
    }
    out.push_back(std::move(us));
  }
  return out;
}

const at::Tensor* state_tensor(const std::optional<ParamState>& st, const std::string& name) {
  if (!st) return nullptr;
  for (const auto& [n, t] : st->tensors) {
    if (n == name && t.defined()) return &t;
  }
  return nullptr;
}

// The state `name` laid out as the handle's shard (use_orig_params: the views' states placed at
// their ranges; missing ones zero).
at::Tensor shard_shaped_state(const UnitOptimState& us, const std::string& name) {
  const FlatParamHandle& h = *us.handle;
  if (!us.unit->options().use_orig_params) {
    const at::Tensor* t = state_tensor(us.states.front(), name);
    return t ? t->detach() : at::zeros_like(h.flat_param());
  }
  at::Tensor shard = at::zeros_like(h.flat_param().detach());
  for (size_t i = 0; i < us.params.size(); ++i) {
    const at::Tensor* t = state_tensor(us.states[i], name);
    if (!t) continue;
    const auto [lo, hi] = h.slot_range_in_shard(i);
    shard.narrow(0, lo, hi - lo).copy_(t->detach().reshape({-1}));
  }
  return shard;
}

// Writes the shard-shaped `shard` back into the optimizer's tensors for state `name`.
void write_shard_shaped_state(const UnitOptimState& us, const std::string& name, const at::Tensor& shard) {
  at::NoGradGuard no_grad;
  if (!us.unit->options().use_orig_params) {
    if (const at::Tensor* t = state_tensor(us.states.front(), name)) t->detach().copy_(shard);
    return;
  }
  for (size_t i = 0; i < us.params.size(); ++i) {
    const at::Tensor* t = state_tensor(us.states[i], name);
    if (!t) continue;
    const auto [lo, hi] = us.handle->slot_range_in_shard(i);
    t->detach().copy_(shard.narrow(0, lo, hi - lo).view(t->sizes()));
  }
}

}  // namespace

std::vector<OptimizerParam> optimizer_params(FullyShardedDataParallel& root) {
  std::vector<OptimizerParam> out;
  std::set<const c10::TensorImpl*> seen;
  for (auto& [prefix, u] : named_units(root)) {
    const FlatParamHandle* h = u->unit().handle();
    if (!h) continue;
    const auto params = h->optimizer_params();
    std::vector<std::string> fqns;
    for (const auto& s : h->slots()) fqns.push_back(join_fqn(prefix, s.fqn));
    for (size_t i = 0; i < params.size(); ++i) {
      seen.insert(params[i].unsafeGetTensorImpl());
      out.push_back({params[i], u->options().use_orig_params ? std::vector<std::string>{fqns[i]} : fqns});
    }
  }
  for (auto& [fqn, p] : root.named_params()) {  // parameters FSDP does not manage (ignored modules)
    if (!seen.count(p.unsafeGetTensorImpl())) out.push_back({p, {clean_fqn(fqn)}});
  }
  return out;
}

std::vector<ParamEntries> optimizer_state_entries(FullyShardedDataParallel& root, torch::optim::Optimizer& optim) {
  std::vector<ParamEntries> out;
  at::NoGradGuard no_grad;
  for (const auto& us : unit_states(root, optim)) {
    const auto& slots = us.handle->slots();
    std::vector<ParamEntries> unit_entries(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) unit_entries[i].fqn = join_fqn(us.prefix, slots[i].fqn);
    for (const auto& name : us.names) {
      const auto views = us.handle->views_of(us.handle->gather_shard_shaped(shard_shaped_state(us, name)));
      for (size_t i = 0; i < slots.size(); ++i) {
        unit_entries[i].tensors.emplace_back(name, sharded_entry(*us.unit, slots[i], views[i]));
      }
    }
    for (auto& e : unit_entries) out.push_back(std::move(e));
  }
  return out;
}

void write_optimizer_state_entries(FullyShardedDataParallel& root, torch::optim::Optimizer& optim,
                                   const tensor::StateDict& entries) {
  const std::string who = "FSDP1 optimizer state";
  std::vector<std::function<void()>> writes;  // every value checked and converted first
  for (const auto& us : unit_states(root, optim)) {
    const auto& slots = us.handle->slots();
    for (const auto& name : us.names) {
      at::Tensor full = us.handle->gather_shard_shaped(shard_shaped_state(us, name)).clone();
      const auto views = us.handle->views_of(full);
      for (size_t i = 0; i < slots.size(); ++i) {
        const std::string key = "state." + join_fqn(us.prefix, slots[i].fqn) + "." + name;
        if (!entries.contains(key)) continue;
        views[i].copy_(slot_value(entries.at(key), slots[i], key, who).reshape(views[i].sizes()));
      }
      const FlatParamHandle& h = *us.handle;
      at::Tensor shard = h.sharded() ? full.narrow(0, h.shard_offset(), h.shard_numel()) : full;
      writes.push_back([us, name, shard] { write_shard_shaped_state(us, name, shard); });
    }
  }
  for (auto& w : writes) w();
}

}  // namespace detail

}  // namespace tdc::fsdp1
