// FSDP1 state dicts (FullyShardedDataParallel::state_dict / load_state_dict under state_dict_type).
#include "common.h"
#include "flat_param.h"
#include "tdc/checkpoint/errors.h"
#include "tdc/tensor/dtensor.h"
#include "unit_state.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <map>
#include <set>
#include <stdexcept>

namespace tdc::fsdp1 {

namespace {

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// The dtype a buffer had before mixed precision cast it (its current dtype otherwise).
at::ScalarType original_dtype(const UnitState& root, const at::Tensor& b) {
  for (const auto& [t, dtype] : root.cast_buffers) {
    if (t.unsafeGetTensorImpl() == b.unsafeGetTensorImpl()) return dtype;
  }
  return b.scalar_type();
}

// Persistent buffers of the tree: clean FQN -> tensor.
std::vector<std::pair<std::string, at::Tensor>> persistent_buffers(nn::Module& root) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [fqn, b] : root.named_bufs()) {
    auto [owner, name] = root.owner_of(fqn);
    if (owner->is_persistent_buf(name)) out.emplace_back(detail::clean_fqn(fqn), b);
  }
  return out;
}

// The mesh a SHARDED_STATE_DICT entry of `unit` lives on: the unit's device_mesh, else a 1-D mesh
// over the world (made once per unit), else an error.
DeviceMesh shard_mesh(FullyShardedDataParallel& unit) {
  if (unit.options().device_mesh)
    return unit.options().device_mesh->ndim() == 1 ? *unit.options().device_mesh
                                                   : (*unit.options().device_mesh).select_dims({0});
  static thread_local std::map<const comm::ProcessGroup*, DeviceMesh> meshes;
  const comm::GroupPtr& pg = unit.process_group();
  auto it = meshes.find(pg.get());
  if (it != meshes.end()) return it->second;
  if (pg->size() != comm::default_group()->size()) {
    throw std::invalid_argument(fmt::format(
        "SHARDED_STATE_DICT: FSDP unit {} shards over a group of {} of the {} ranks; pass FSDPOptions::device_mesh so "
        "that its entries can be DTensors",
        unit.unit().label(), pg->size(), comm::default_group()->size()));
  }
  DeviceMesh mesh = init_device_mesh(pg->device_type(), {pg->size()});
  meshes.emplace(pg.get(), mesh);
  return mesh;
}

checkpoint::StateDict full_state_dict(FullyShardedDataParallel& root) {
  checkpoint::StateDict sd;
  {
    SummonFullParams full(root, {.recurse = true, .writeback = false});
    at::NoGradGuard no_grad;
    for (auto& [fqn, p] : root.named_params()) sd.set(detail::clean_fqn(fqn), p.detach().clone());
  }
  for (auto& [fqn, b] : persistent_buffers(root)) sd.set(fqn, b.detach().to(original_dtype(root.unit(), b)).clone());
  return sd;
}

checkpoint::StateDict sharded_state_dict(FullyShardedDataParallel& root) {
  checkpoint::StateDict sd;
  auto units = FullyShardedDataParallel::fsdp_modules(root);
  std::map<const c10::TensorImpl*, FullyShardedDataParallel*> owner;
  {
    SummonFullParams full(root, {.recurse = true, .writeback = false});
    for (auto* u : units) {
      for (auto& [fqn, p] : u->module().named_params()) owner.emplace(p.unsafeGetTensorImpl(), u);
    }
    at::NoGradGuard no_grad;
    for (auto& [fqn, p] : root.named_params()) {
      auto it = owner.find(p.unsafeGetTensorImpl());
      if (it == owner.end()) {
        sd.set(detail::clean_fqn(fqn), p.detach().clone());  // not managed (ignored): as is
        continue;
      }
      DeviceMesh mesh = shard_mesh(*it->second);
      tensor::DTensor d = tensor::distribute_tensor(p.detach(), mesh, {tensor::Shard{0}});
      sd.set(detail::clean_fqn(fqn), tensor::DTensor(d.to_local().clone(), d.spec()));
    }
  }
  for (auto& [fqn, b] : persistent_buffers(root)) sd.set(fqn, b.detach().to(original_dtype(root.unit(), b)).clone());
  return sd;
}

std::vector<std::pair<std::string, FullyShardedDataParallel*>> named_units(nn::Module& root) {
  std::vector<std::pair<std::string, FullyShardedDataParallel*>> out;
  for (auto& [fqn, m] : root.named_modules_tdc()) {
    if (auto* u = dynamic_cast<FullyShardedDataParallel*>(m)) out.emplace_back(detail::clean_fqn(fqn), u);
  }
  return out;
}

checkpoint::StateDict local_state_dict(FullyShardedDataParallel& root) {
  checkpoint::StateDict sd;
  for (auto& [fqn, u] : named_units(root)) {
    if (!u->unit().handle()) continue;
    sd.set(join(fqn, detail::kFlatParamName), u->flat_param().detach().clone());
  }
  for (auto& [fqn, b] : persistent_buffers(root)) sd.set(fqn, b.detach().to(original_dtype(root.unit(), b)).clone());
  return sd;
}

// ------------------------------------------------------------------ load

[[noreturn]] void load_error(const std::string& what) {
  throw checkpoint::CheckpointError(fmt::format("FullyShardedDataParallel::load_state_dict: {}", what));
}

void check_keys(const std::vector<std::pair<std::string, at::Tensor>>& expected, const checkpoint::StateDict& sd,
                bool strict) {
  std::set<std::string> want;
  std::vector<std::string> missing, unexpected;
  for (const auto& [k, t] : expected) {
    want.insert(k);
    if (!sd.contains(k)) missing.push_back(k);
  }
  for (const auto& k : sd.keys()) {
    if (!want.count(k)) unexpected.push_back(k);
  }
  if (strict && (!missing.empty() || !unexpected.empty())) {
    load_error(
        fmt::format("missing keys [{}], unexpected keys [{}]", fmt::join(missing, ", "), fmt::join(unexpected, ", ")));
  }
}

// The value of `key` as a full tensor matching `target`'s shape (DTensors are gathered).
at::Tensor full_value(const checkpoint::StateDict& sd, const std::string& key, const at::Tensor& target) {
  const checkpoint::Value& v = sd.at(key);
  at::Tensor t;
  if (auto* d = std::get_if<tensor::DTensor>(&v)) {
    t = d->full_tensor();
  } else if (auto* x = std::get_if<at::Tensor>(&v)) {
    t = *x;
  } else {
    load_error(fmt::format("'{}' holds JSON, not a tensor", key));
  }
  if (t.sizes() != target.sizes()) {
    load_error(fmt::format("'{}' has shape {} but the model's is {}", key, fmt::format("{}", t.sizes()),
                           fmt::format("{}", target.sizes())));
  }
  if (!at::isFloatingType(t.scalar_type()) && t.scalar_type() != target.scalar_type()) {
    load_error(fmt::format("'{}' is {} but the model's is {}", key, c10::toString(t.scalar_type()),
                           c10::toString(target.scalar_type())));
  }
  return t;
}

void load_full_or_sharded(FullyShardedDataParallel& root, const checkpoint::StateDict& sd, bool strict) {
  SummonFullParams full(root, {.recurse = true, .writeback = true});
  std::vector<std::pair<std::string, at::Tensor>> targets;
  for (auto& [fqn, p] : root.named_params()) targets.emplace_back(detail::clean_fqn(fqn), p);
  for (auto& [fqn, b] : persistent_buffers(root)) targets.emplace_back(fqn, b);
  check_keys(targets, sd, strict);
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // all checked before the first write
  for (auto& [k, t] : targets) {
    if (sd.contains(k)) copies.emplace_back(t, full_value(sd, k, t));
  }
  at::NoGradGuard no_grad;
  for (auto& [dst, src] : copies) dst.detach().copy_(src);
}

void load_local(FullyShardedDataParallel& root, const checkpoint::StateDict& sd, bool strict) {
  std::vector<std::pair<std::string, at::Tensor>> targets;
  for (auto& [fqn, u] : named_units(root)) {
    if (u->unit().handle()) targets.emplace_back(join(fqn, detail::kFlatParamName), u->flat_param());
  }
  for (auto& [fqn, b] : persistent_buffers(root)) targets.emplace_back(fqn, b);
  check_keys(targets, sd, strict);
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  for (auto& [k, t] : targets) {
    if (sd.contains(k)) copies.emplace_back(t, full_value(sd, k, t));
  }
  at::NoGradGuard no_grad;
  for (auto& [dst, src] : copies) dst.detach().copy_(src);
}

}  // namespace

checkpoint::StateDict FullyShardedDataParallel::state_dict() {
  unit_->check_idle("state_dict");
  if (!unit_->is_root()) unit_->lazy_init();
  switch (unit_->state_dict_type) {
    case StateDictType::FULL_STATE_DICT:
      return full_state_dict(*this);
    case StateDictType::SHARDED_STATE_DICT:
      return sharded_state_dict(*this);
    case StateDictType::LOCAL_STATE_DICT:
      return local_state_dict(*this);
  }
  return {};
}

void FullyShardedDataParallel::load_state_dict(const checkpoint::StateDict& state_dict, bool strict) {
  unit_->check_idle("load_state_dict");
  if (!unit_->is_root()) unit_->lazy_init();
  if (unit_->state_dict_type == StateDictType::LOCAL_STATE_DICT) {
    load_local(*this, state_dict, strict);
  } else {
    load_full_or_sharded(*this, state_dict, strict);
  }
}

}  // namespace tdc::fsdp1
