// FullyShardedDataParallel (fully_sharded_data_parallel.h): construction (plan, checks, wrapping),
// forward, device moves, the unit registry, no_sync and state_dict_type guards.
#include "tdc/fsdp1/fully_sharded_data_parallel.h"

#include "common.h"
#include "flat_param.h"
#include "unit_state.h"
#include "wrapping.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <stdexcept>

namespace tdc::fsdp1 {

FullyShardedDataParallel::FullyShardedDataParallel(nn::ModulePtr module, std::shared_ptr<UnitState> unit)
    : nn::Module("FullyShardedDataParallel"), unit_(std::move(unit)) {
  register_child(detail::kWrappedModuleName, std::move(module));
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  for (const auto& item : named_children()) detail::forget_wrapped(dynamic_cast<const nn::Module*>(item.value().get()));
}

std::shared_ptr<FullyShardedDataParallel> FullyShardedDataParallel::make(nn::ModulePtr module,
                                                                         const FSDPOptions& options) {
  return detail::wrap_module(std::move(module), options);
}

nn::Tensors FullyShardedDataParallel::forward(const nn::Tensors& inputs) {
  nn::Tensors in = unit_->pre_forward(inputs);
  nn::Tensors out;
  try {
    out = module()(std::move(in));
  } catch (...) {
    if (unit_->handle()) unit_->handle()->clear_substitutes();
    throw;
  }
  return unit_->post_forward(std::move(out));
}

nn::ModulePtr FullyShardedDataParallel::clone_empty() const {
  throw std::logic_error(fmt::format(
      "FullyShardedDataParallel around {} cannot be copied: copy the model before wrapping it", module().type_name()));
}

nn::Module& FullyShardedDataParallel::module() const { return child(detail::kWrappedModuleName); }
const FSDPOptions& FullyShardedDataParallel::options() const { return unit_->options(); }
bool FullyShardedDataParallel::is_root() const { return unit_->is_root(); }
TrainingState FullyShardedDataParallel::training_state() const { return unit_->training_state(); }
HandleTrainingState FullyShardedDataParallel::handle_training_state() const {
  return unit_->handle() ? unit_->handle()->state() : HandleTrainingState::IDLE;
}
const comm::GroupPtr& FullyShardedDataParallel::process_group() const { return unit_->shard_pg(); }

const at::Tensor& FullyShardedDataParallel::flat_param() const {
  static const at::Tensor kNone;
  return unit_->handle() ? unit_->handle()->flat_param() : kNone;
}

std::vector<std::string> FullyShardedDataParallel::flat_param_fqns() const {
  std::vector<std::string> out;
  if (unit_->handle()) {
    for (const auto& s : unit_->handle()->slots()) out.push_back(s.fqn);
  }
  return out;
}

std::vector<FullyShardedDataParallel*> FullyShardedDataParallel::fsdp_modules(nn::Module& module, bool root_only) {
  std::vector<FullyShardedDataParallel*> out;
  std::vector<std::string> root_prefixes;
  for (auto& [fqn, m] : module.named_modules_tdc()) {
    auto* unit = dynamic_cast<FullyShardedDataParallel*>(m);
    if (!unit) continue;
    if (root_only) {
      bool nested = false;
      for (const auto& p : root_prefixes) nested = nested || p.empty() || fqn.rfind(p + ".", 0) == 0;
      if (nested) continue;
      root_prefixes.push_back(fqn);
    }
    out.push_back(unit);
  }
  return out;
}

// Moves every defined parameter and buffer of the tree (LibTorch's Module::to would trip over the
// parameter names FSDP left empty) and re-derives the handles' views.
void FullyShardedDataParallel::to(torch::Device device, bool non_blocking) {
  for (auto* unit : fsdp_modules(*this)) {
    if (unit->unit().handle()) unit->unit().handle()->move_to(device, unit->module());
  }
  at::NoGradGuard no_grad;
  for (auto& [fqn, m] : named_modules_tdc()) {
    for (auto& item : m->named_parameters(/*recurse=*/false)) {
      const at::Tensor& t = item.value();
      if (t.defined() && t.device() != device) {
        m->replace_param(item.key(), t.detach().to(device, non_blocking).requires_grad_(t.requires_grad()));
      }
    }
    for (auto& item : m->named_buffers(/*recurse=*/false)) {
      at::Tensor t = item.value();
      if (t.defined() && t.device() != device) t.set_data(t.to(device, non_blocking));
    }
  }
}

void FullyShardedDataParallel::to(torch::Dtype dtype, bool) {
  throw std::invalid_argument(fmt::format(
      "FullyShardedDataParallel around {}: cannot convert a wrapped model to {}; use FSDPOptions::mixed_precision, "
      "or convert the model before wrapping it",
      module().type_name(), c10::toString(dtype)));
}

void FullyShardedDataParallel::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  to(dtype, non_blocking);
}

// ------------------------------------------------------------------ guards

FullyShardedDataParallel::NoSyncGuard FullyShardedDataParallel::no_sync() {
  unit_->check_idle("no_sync");
  return NoSyncGuard(fsdp_modules(*this));
}

FullyShardedDataParallel::NoSyncGuard::NoSyncGuard(std::vector<FullyShardedDataParallel*> units)
    : units_(std::move(units)) {
  for (auto* u : units_) {
    previous_.push_back(u->unit().sync_gradients);
    u->unit().sync_gradients = false;
  }
}

FullyShardedDataParallel::NoSyncGuard::NoSyncGuard(NoSyncGuard&& other) noexcept
    : units_(std::move(other.units_)), previous_(std::move(other.previous_)) {
  other.units_.clear();
}

FullyShardedDataParallel::NoSyncGuard::~NoSyncGuard() {
  for (size_t i = 0; i < units_.size(); ++i) units_[i]->unit().sync_gradients = previous_[i];
}

FullyShardedDataParallel::StateDictTypeGuard FullyShardedDataParallel::state_dict_type(nn::Module& module,
                                                                                       StateDictType type) {
  auto units = fsdp_modules(module);
  if (units.empty()) {
    throw std::invalid_argument(
        fmt::format("state_dict_type: {} contains no FullyShardedDataParallel unit", module.type_name()));
  }
  for (auto* u : units) detail::check_state_dict_type_supported(*u, type);
  return StateDictTypeGuard(std::move(units), type);
}

void FullyShardedDataParallel::set_state_dict_type(nn::Module& module, StateDictType type) {
  state_dict_type(module, type).release();  // checks every unit first
}

StateDictType FullyShardedDataParallel::current_state_dict_type() const { return unit_->state_dict_type; }

FullyShardedDataParallel::StateDictTypeGuard::StateDictTypeGuard(std::vector<FullyShardedDataParallel*> units,
                                                                 StateDictType type)
    : units_(std::move(units)) {
  for (auto* u : units_) {
    previous_.push_back(u->unit().state_dict_type);
    u->unit().state_dict_type = type;
  }
}

FullyShardedDataParallel::StateDictTypeGuard::StateDictTypeGuard(StateDictTypeGuard&& other) noexcept
    : units_(std::move(other.units_)), previous_(std::move(other.previous_)) {
  other.units_.clear();
}

void FullyShardedDataParallel::StateDictTypeGuard::release() {
  units_.clear();
  previous_.clear();
}

FullyShardedDataParallel::StateDictTypeGuard::~StateDictTypeGuard() {
  for (size_t i = 0; i < units_.size(); ++i) units_[i]->unit().state_dict_type = previous_[i];
}

}  // namespace tdc::fsdp1
