// FSDP1 state dicts (FullyShardedDataParallel::state_dict / load_state_dict under state_dict_type).
#include "common.h"
#include "flat_param.h"
#include "sharded_layout.h"
#include "tdc/core/checkpoint_error.h"
#include "tdc/tensor/dtensor.h"
#include "unit_state.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <map>
#include <set>
#include <stdexcept>
#include <fmt/ranges.h>

namespace tdc::fsdp1 {

namespace {

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

// A managed parameter as the tree shows it inside summon_full_params: its unit and flat-parameter slot.
struct SlotRef {
  FullyShardedDataParallel* unit = nullptr;
  const detail::ParamSlot* slot = nullptr;
};

// Inside summon_full_params: every registered full view -> its slot (tied parameters: the primary's).
std::map<const c10::TensorImpl*, SlotRef> summoned_slots(FullyShardedDataParallel& root) {
  std::map<const c10::TensorImpl*, SlotRef> out;
  for (auto* u : FullyShardedDataParallel::fsdp_modules(root)) {
    const detail::FlatParamHandle* h = u->unit().handle();
    if (!h) continue;
    for (const auto& slot : h->slots()) {
      if (const at::Tensor* t = slot.module->find_param(slot.name); t && t->defined()) {
        out.emplace(t->unsafeGetTensorImpl(), SlotRef{u, &slot});
      }
    }
  }
  return out;
}

// Every parameter of the tree in named_params() order with its slot (none: not managed), inside
// summon_full_params (full values, no writeback).
template <class F>
void for_each_full_param(FullyShardedDataParallel& root, F&& f) {
  SummonFullParams full(root, {.recurse = true, .writeback = false});
  const auto slots = summoned_slots(root);
  at::NoGradGuard no_grad;
  for (auto& [fqn, p] : root.named_params()) {
    auto it = slots.find(p.unsafeGetTensorImpl());
    f(detail::clean_fqn(fqn), p, it == slots.end() ? SlotRef{} : it->second);
  }
}

void add_buffers(FullyShardedDataParallel& root, tensor::StateDict& sd) {
  for (auto& [fqn, b] : persistent_buffers(root)) sd.set(fqn, b.detach().to(original_dtype(root.unit(), b)).clone());
}

tensor::StateDict full_state_dict(FullyShardedDataParallel& root) {
  tensor::StateDict sd;
  for_each_full_param(root, [&](const std::string& key, const at::Tensor& p, const SlotRef& ref) {
    sd.set(key, ref.slot ? detail::full_entry(*ref.slot, p) : tensor::StateDictValue(p.detach().clone()));
  });
  add_buffers(root, sd);
  return sd;
}

tensor::StateDict sharded_state_dict(FullyShardedDataParallel& root) {
  tensor::StateDict sd;
  for_each_full_param(root, [&](const std::string& key, const at::Tensor& p, const SlotRef& ref) {
    if (!ref.slot) {
      sd.set(key, p.detach().clone());  // not managed (ignored): as is
      return;
    }
    sd.set(key, detail::sharded_entry(*ref.unit, *ref.slot, p));
  });
  add_buffers(root, sd);
  return sd;
}

tensor::StateDict local_state_dict(FullyShardedDataParallel& root) {
  tensor::StateDict sd;
  for (auto& [fqn, u] : detail::named_units(root)) {
    if (!u->unit().handle()) continue;
    sd.set(detail::join_fqn(fqn, detail::kFlatParamName), u->flat_param().detach().clone());
  }
  add_buffers(root, sd);
  return sd;
}

// ------------------------------------------------------------------ load

[[noreturn]] void load_error(const std::string& what) {
  throw core::CheckpointError(fmt::format("FullyShardedDataParallel::load_state_dict: {}", what));
}

void check_keys(const std::vector<std::pair<std::string, at::Tensor>>& expected, const tensor::StateDict& sd,
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

// The value of an unmanaged tensor (a buffer, an ignored parameter): full, same shape.
at::Tensor plain_value(const tensor::StateDict& sd, const std::string& key, const at::Tensor& target) {
  const at::Tensor t = detail::global_tensor(sd.at(key), key, "FullyShardedDataParallel::load_state_dict");
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

void load_full_or_sharded(FullyShardedDataParallel& root, const tensor::StateDict& sd, bool strict) {
  SummonFullParams full(root, {.recurse = true, .writeback = true});
  const auto slots = summoned_slots(root);
  std::vector<std::pair<std::string, at::Tensor>> targets;
  for (auto& [fqn, p] : root.named_params()) targets.emplace_back(detail::clean_fqn(fqn), p);
  for (auto& [fqn, b] : persistent_buffers(root)) targets.emplace_back(fqn, b);
  check_keys(targets, sd, strict);
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // all checked before the first write
  for (auto& [k, t] : targets) {
    if (!sd.contains(k)) continue;
    auto it = slots.find(t.unsafeGetTensorImpl());
    copies.emplace_back(t, it == slots.end() ? plain_value(sd, k, t)
                                             : detail::slot_value(sd.at(k), *it->second.slot, k,
                                                                  "FullyShardedDataParallel::load_state_dict"));
  }
  at::NoGradGuard no_grad;
  for (auto& [dst, src] : copies) dst.detach().copy_(src);
}

void load_local(FullyShardedDataParallel& root, const tensor::StateDict& sd, bool strict) {
  std::vector<std::pair<std::string, at::Tensor>> targets;
  for (auto& [fqn, u] : detail::named_units(root)) {
    if (u->unit().handle()) targets.emplace_back(detail::join_fqn(fqn, detail::kFlatParamName), u->flat_param());
  }
  for (auto& [fqn, b] : persistent_buffers(root)) targets.emplace_back(fqn, b);
  check_keys(targets, sd, strict);
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  for (auto& [k, t] : targets) {
    if (sd.contains(k)) copies.emplace_back(t, plain_value(sd, k, t));
  }
  at::NoGradGuard no_grad;
  for (auto& [dst, src] : copies) dst.detach().copy_(src);
}

}  // namespace

tensor::StateDict FullyShardedDataParallel::state_dict() {
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

void FullyShardedDataParallel::load_state_dict(const tensor::StateDict& state_dict, bool strict) {
  unit_->check_idle("load_state_dict");
  if (!unit_->is_root()) unit_->lazy_init();
  if (unit_->state_dict_type == StateDictType::LOCAL_STATE_DICT) {
    load_local(*this, state_dict, strict);
  } else {
    load_full_or_sharded(*this, state_dict, strict);
  }
}

}  // namespace tdc::fsdp1
