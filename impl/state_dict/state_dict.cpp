// The model state dict (state_dict.h).
#include "tdc/state_dict/state_dict.h"

#include <algorithm>
#include <stdexcept>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "assign.h"
#include "common.h"
#include "fqn.h"
#include "tdc/checkpoint/errors.h"
#include "tdc/fsdp1/fully_sharded_data_parallel.h"
#include "tdc/tensor/module_params.h"

namespace tdc::checkpoint {

// ------------------------------------------------------------------ model state dict

namespace detail {

Value full_value(const Value& v, const StateDictOptions& options) {
  at::Tensor full;
  if (const auto* d = std::get_if<tensor::DTensor>(&v)) {
    full = tensor::DTensor(d->to_local().detach(), d->spec()).full_tensor();
  } else {
    full = std::get<at::Tensor>(v).detach();
  }
  if (options.cpu_offload) full = full.cpu();
  return full;
}

StateDict to_full(const StateDict& sharded, const StateDictOptions& options) {
  StateDict out;
  for (const auto& [k, v] : sharded) {
    out.set(k, std::holds_alternative<nlohmann::json>(v) ? v : full_value(v, options));
  }
  // With cpu_offload only rank 0 keeps the full dict (every rank took part in the gathers).
  if (options.cpu_offload && group_rank(resolve_group(nullptr)) != 0) return {};
  return out;
}

}  // namespace detail

namespace {

StateDict model_entries(nn::Module& model, bool pytorch_fqns, bool ignore_frozen) {
  StateDict out;
  for (const auto& p : tensor::named_params_with_specs(model)) {
    if (ignore_frozen && !p.tensor.requires_grad()) continue;
    const std::string key = pytorch_fqns ? detail::clean_fqn(model, p.fqn) : p.fqn;
    if (p.dtensor) {
      out.set(key, tensor::DTensor(p.tensor.detach(), p.dtensor->spec()));
    } else {
      out.set(key, p.tensor.detach());
    }
  }
  for (const auto& [fqn, buf] : model.named_bufs()) {
    auto [owner, name] = model.owner_of(fqn);
    if (!owner->is_persistent_buf(name)) continue;
    out.set(pytorch_fqns ? detail::clean_fqn(model, fqn) : fqn, buf.detach());
  }
  return out;
}

}  // namespace

StateDict module_state_dict(nn::Module& model) {
  if (auto* root = detail::fsdp1_root(model)) return root->state_dict();  // under its state_dict_type
  return model_entries(model, false, false);
}

namespace {

// The model's entries in the sharded form, as the live tensors (FSDP1: copies, see model_writeback).
StateDict sharded_model_entries(nn::Module& model, bool ignore_frozen) {
  auto* root = detail::fsdp1_root(model);
  if (!root) return model_entries(model, true, ignore_frozen);
  auto guard = fsdp1::FullyShardedDataParallel::state_dict_type(*root, fsdp1::StateDictType::SHARDED_STATE_DICT);
  StateDict sd = root->state_dict();
  if (ignore_frozen) {
    for (const auto& [fqn, p] : model.named_params()) {  // FSDP1 keeps requires_grad on the originals
      if (!p.requires_grad()) sd.erase(detail::clean_fqn(model, fqn));
    }
  }
  return sd;
}

// After commit: FSDP1's entries were copies, loaded now (collective). Others were written in place.
void model_writeback(nn::Module& model, const StateDict& targets) {
  auto* root = detail::fsdp1_root(model);
  if (!root) return;
  auto guard = fsdp1::FullyShardedDataParallel::state_dict_type(*root, fsdp1::StateDictType::SHARDED_STATE_DICT);
  root->load_state_dict(targets, /*strict=*/false);
}

}  // namespace

StateDict get_model_state_dict(nn::Module& model, const StateDictOptions& options) {
  StateDict sharded = sharded_model_entries(model, options.ignore_frozen_params);
  return options.full_state_dict ? detail::to_full(sharded, options) : sharded;
}

void set_model_state_dict(nn::Module& model, const StateDict& state_dict, const StateDictOptions& options) {
  StateDict targets = sharded_model_entries(model, options.ignore_frozen_params);
  detail::commit(detail::stage("set_model_state_dict", targets, state_dict, options));
  model_writeback(model, targets);
}

std::pair<StateDict, StateDict> get_state_dict(nn::Module& model, torch::optim::Optimizer& optim,
                                               const StateDictOptions& options) {
  return {get_model_state_dict(model, options), get_optimizer_state_dict(model, optim, options)};
}

void set_state_dict(nn::Module& model, torch::optim::Optimizer& optim, const StateDict& model_state_dict,
                    const StateDict& optim_state_dict, const StateDictOptions& options) {
  StateDict targets = sharded_model_entries(model, options.ignore_frozen_params);
  auto model_assignments = detail::stage("set_state_dict", targets, model_state_dict, options);
  auto commit_optim = detail::stage_optimizer(model, optim, optim_state_dict, options);
  detail::commit(model_assignments);
  model_writeback(model, targets);
  commit_optim();
}

}  // namespace tdc::checkpoint
