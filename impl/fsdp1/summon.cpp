// summon_full_params (fully_sharded_data_parallel.h): every unit shows its full parameters.
#include "common.h"
#include "flat_param.h"
#include "unit_state.h"

#include <fmt/format.h>

#include <stdexcept>

namespace tdc::fsdp1 {

namespace {

// The full vectors registered by the live guards of this thread, per handle (writeback reads them).
thread_local std::vector<std::pair<detail::FlatParamHandle*, at::Tensor>> t_full;

}  // namespace

SummonFullParams::SummonFullParams(nn::Module& module, const SummonOptions& options) : options_(options) {
  units_ = FullyShardedDataParallel::fsdp_modules(module, /*root_only=*/!options.recurse);
  if (units_.empty()) {
    throw std::invalid_argument(
        fmt::format("summon_full_params: {} contains no FullyShardedDataParallel unit", module.type_name()));
  }
  if (options.writeback && options.rank0_only) {
    throw std::invalid_argument(
        "summon_full_params: writeback=true with rank0_only=true is not supported (as in "
        "PyTorch): pass writeback=false");
  }
  for (auto* u : units_) {
    if (options.with_grads && !u->options().use_orig_params) {
      throw std::invalid_argument(fmt::format(
          "summon_full_params: with_grads=true needs use_orig_params=true; FSDP unit {} has use_orig_params=false",
          u->unit().label()));
    }
    u->unit().check_idle("summon_full_params");
  }
  if (auto* root = FullyShardedDataParallel::fsdp_modules(module, true).front(); !root->unit().is_root()) {
    root->unit().lazy_init();
  }
  std::vector<detail::FlatParamHandle*> handles;
  for (auto* u : units_) {
    if (auto* h = u->unit().handle()) handles.push_back(h);
  }
  // Gathered before any state changes, so a failed collective leaves every unit IDLE.
  std::vector<at::Tensor> fulls = detail::FlatParamHandle::gather_full_precision_together(handles);
  auto next_full = fulls.begin();
  for (auto* u : units_) {
    UnitState& s = u->unit();
    s.set_training_state(TrainingState::SUMMON_FULL_PARAMS, "summon_full_params", {TrainingState::IDLE});
    detail::FlatParamHandle* h = s.handle();
    if (!h) continue;
    h->set_state(HandleTrainingState::SUMMON_FULL_PARAMS, "summon_full_params", {HandleTrainingState::IDLE});
    at::Tensor full = std::move(*next_full++);
    const bool shown = !options.rank0_only || s.shard_pg()->rank() == 0;
    if (!shown) continue;
    if (options.offload_to_cpu && full.device().type() != c10::kCPU) full = full.to(c10::kCPU);
    h->register_full(u->module(), full, options.with_grads);
    t_full.emplace_back(h, full);
  }
}

SummonFullParams::~SummonFullParams() {
  for (auto* u : units_) {
    UnitState& s = u->unit();
    detail::FlatParamHandle* h = s.handle();
    if (h) {
      for (auto it = t_full.begin(); it != t_full.end(); ++it) {
        if (it->first != h) continue;
        if (options_.writeback) h->write_back(it->second);
        t_full.erase(it);
        break;
      }
      h->register_sharded(u->module());
      h->set_state(HandleTrainingState::IDLE, "end of summon_full_params", {HandleTrainingState::SUMMON_FULL_PARAMS});
    }
    s.set_training_state(TrainingState::IDLE, "end of summon_full_params", {TrainingState::SUMMON_FULL_PARAMS});
  }
}

}  // namespace tdc::fsdp1
