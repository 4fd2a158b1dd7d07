// FlatParamHandle (flat_param.h): [Note: FSDP1 flat parameter].
#include "flat_param.h"

#include "tdc/core/cpu_block_cache.h"
#include "tdc/core/storage.h"
#include "common.h"
#include "tdc/comm/argument_checks.h"
#include "tdc/comm/collectives.h"
#include "tdc/fsdp1/testing.h"

#include <ATen/ATen.h>
#include <c10/util/strides.h>
#include <fmt/format.h>

namespace tdc::fsdp1::detail {

namespace {

// A view sharing `base`'s storage and version counter but not an autograd view of it: the base is
// written in place (all-gathers, optimizer steps) while the views live, which autograd forbids for
// differentiable views of one base handed out together.
at::Tensor detached_view(const at::Tensor& base, int64_t offset, int64_t numel, const std::vector<int64_t>& shape) {
  return base.detach().narrow(0, offset, numel).view(shape).detach();
}

void scale_if_needed(at::Tensor& t, double factor) {
  if (factor > 1.0) t.div_(factor);
}

// A tensor over `base`'s storage with its own version counter: forward hands these out, autograd
// saves them, and backward's all-gather refills the storage under them ([Note: FSDP1 flat
// parameter]) without tripping autograd's check of saved tensors.
at::Tensor storage_view(const at::Tensor& base, int64_t offset, const std::vector<int64_t>& shape) {
  at::NoGradGuard no_grad;
  at::Tensor v = at::empty({0}, base.options().requires_grad(false));
  v.set_(base.storage(), base.storage_offset() + offset, shape, c10::contiguous_strides(shape));
  return v;
}

}  // namespace

FlatParamHandle::FlatParamHandle(std::vector<ParamSlot> slots, std::vector<SharedSlot> shared,
                                 const std::vector<at::Tensor>& values, HandleConfig config)
    : slots_(std::move(slots)), shared_(std::move(shared)), config_(std::move(config)) {
  for (const auto& s : slots_) numel_ += s.numel;
  const int64_t world = config_.sharded ? config_.shard_pg->size() : 1;
  padded_numel_ = (numel_ + world - 1) / world * world;
  const int64_t shard_numel = padded_numel_ / world;
  shard_offset_ = config_.sharded ? config_.shard_pg->rank() * shard_numel : 0;
  at::NoGradGuard no_grad;
  at::Tensor full = at::zeros({padded_numel_}, values.front().options().requires_grad(false));
  for (size_t i = 0; i < slots_.size(); ++i) {
    full.narrow(0, slots_[i].offset, slots_[i].numel).copy_(values[i].detach().reshape({-1}));
  }
  at::Tensor shard = config_.sharded ? full.narrow(0, shard_offset_, shard_numel).clone() : full.narrow(0, 0, numel_);
  bool any_grad = false;
  for (const auto& s : slots_) any_grad = any_grad || s.requires_grad;
  flat_param_ = shard.detach().requires_grad_(any_grad);
  if (config_.use_orig_params) make_orig_views();
}

// This rank's part of each slot within the shard (possibly empty); NO_SHARD: the whole slot.
void FlatParamHandle::make_orig_views() {
  orig_.clear();
  for (size_t i = 0; i < slots_.size(); ++i) {
    const ParamSlot& s = slots_[i];
    at::Tensor v;
    if (!config_.sharded) {
      v = detached_view(flat_param_, s.offset, s.numel, s.shape);
    } else {
      const auto [lo, hi] = slot_range_in_shard(i);
      v = flat_param_.detach().narrow(0, lo, hi - lo).detach();
    }
    orig_.push_back(v.requires_grad_(s.requires_grad));
  }
}

at::ScalarType FlatParamHandle::compute_dtype() const {
  return config_.mp && config_.mp->param_dtype ? *config_.mp->param_dtype : param_dtype();
}

at::ScalarType FlatParamHandle::reduce_dtype() const {
  if (config_.mp && config_.mp->reduce_dtype) return *config_.mp->reduce_dtype;
  return compute_dtype();
}

void FlatParamHandle::set_state(HandleTrainingState next, const char* action,
                                std::initializer_list<HandleTrainingState> allowed) {
  check_state(config_.label, action, state_, allowed);
  state_ = next;
}

// ------------------------------------------------------------------ registration

void FlatParamHandle::move_to(c10::Device device, nn::Module& wrapped) {
  if (flat_param_.device() == device) return;
  at::NoGradGuard no_grad;
  reshard();
  unsharded_ = at::Tensor();
  // A new leaf (set_data cannot change the tensor type, e.g. CPU -> meta); optimizers made before
  // the move keep the old one, as in PyTorch.
  flat_param_ = flat_param_.detach().to(device).requires_grad_(flat_param_.requires_grad());
  if (config_.use_orig_params) {
    make_orig_views();
  }
  register_sharded(wrapped);
}

void FlatParamHandle::register_sharded(nn::Module& wrapped) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    slots_[i].module->replace_param(slots_[i].name, config_.use_orig_params ? orig_[i] : at::Tensor());
  }
  for (const auto& s : shared_) {
    s.module->replace_param(s.name, config_.use_orig_params ? orig_[s.primary] : at::Tensor());
  }
  if (!config_.use_orig_params) {
    if (wrapped.find_param(kFlatParamName)) {
      wrapped.replace_param(kFlatParamName, flat_param_);
    } else {
      wrapped.register_param(kFlatParamName, flat_param_, flat_param_.requires_grad());
    }
  }
}

void FlatParamHandle::register_full(nn::Module& wrapped, const at::Tensor& full, bool with_grads) {
  std::vector<at::Tensor> views = views_of(full);
  at::Tensor full_grad = with_grads ? gather_full_grad() : at::Tensor();
  std::vector<at::Tensor> grad_views = full_grad.defined() ? views_of(full_grad) : std::vector<at::Tensor>{};
  for (size_t i = 0; i < slots_.size(); ++i) {
    views[i].requires_grad_(slots_[i].requires_grad);
    if (!grad_views.empty()) views[i].mutable_grad() = grad_views[i];
    slots_[i].module->replace_param(slots_[i].name, views[i]);
  }
  for (const auto& s : shared_) s.module->replace_param(s.name, views[s.primary]);
  if (!config_.use_orig_params && wrapped.find_param(kFlatParamName)) wrapped.replace_param(kFlatParamName, {});
  testing::detail::notify_unsharded_views(/*as_params=*/true);
}

// ------------------------------------------------------------------ unshard / reshard

const char* to_string(UnshardState state) {
  switch (state) {
    case UnshardState::SHARDED:
      return "SHARDED";
    case UnshardState::UNSHARDING:
      return "UNSHARDING";
    case UnshardState::UNSHARDED:
      return "UNSHARDED";
  }
  return "?";
}

void FlatParamHandle::set_unshard_state(UnshardState next, const char* action,
                                        std::initializer_list<UnshardState> allowed) {
  check_state(config_.label, action, unshard_state_, allowed);
  unshard_state_ = next;
}

void FlatParamHandle::unshard(bool async_op) {
  if (unshard_state_ == UnshardState::UNSHARDING) {
    if (async_op) return;
    wait_for_unshard();
    notify_unsharded_views_by_state();
    return;
  }
  if (unshard_state_ == UnshardState::UNSHARDED && gathered_version_ == flat_param_._version()) {
    notify_unsharded_views_by_state();  // PyTorch switches views on an unshard that gathers nothing too
    return;
  }
  const at::ScalarType dtype = compute_dtype();
  at::NoGradGuard no_grad;
  gathered_version_ = flat_param_._version();
  if (!config_.sharded && dtype == param_dtype()) {
    unsharded_ = flat_param_.detach();  // NO_SHARD, full precision: the parameter itself
    unshard_state_ = UnshardState::UNSHARDED;
  } else {
    at::Tensor shard = flat_param_.detach();
    if (shard.device() != config_.compute_device) shard = shard.to(config_.compute_device);
    if (shard.scalar_type() != dtype) shard = shard.to(dtype);  // the low-precision shard
    if (!config_.sharded) {
      unsharded_ = shard;
      unshard_state_ = UnshardState::UNSHARDED;
    } else {
      if (!unsharded_.defined()) {
        unsharded_ = core::empty_reusing({padded_numel_}, shard.options());
      } else {
        core::alloc_storage(unsharded_);  // a no-op for a stale UNSHARDED vector, gathered again in place
      }
      const bool first = gathers_checked_.insert(dtype).second;
      comm::ScopedArgumentChecks checks(first && comm::argument_checks());
      pending_gather_ = comm::all_gather_into_tensor(unsharded_, shard, config_.shard_pg, /*async_op=*/true);
      pending_gather_input_ = shard;
      set_unshard_state(UnshardState::UNSHARDING, "unshard", {UnshardState::SHARDED, UnshardState::UNSHARDED});
    }
  }
  notify_unsharded_views_by_state();
  if (!async_op) wait_for_unshard();
}

void FlatParamHandle::wait_for_unshard() {
  if (unshard_state_ != UnshardState::UNSHARDING) return;
  pending_gather_.wait();
  pending_gather_input_ = at::Tensor();
  set_unshard_state(UnshardState::UNSHARDED, "finish unshard", {UnshardState::UNSHARDING});
}

// [Note: which views an unshard exposes] PyTorch's _use_unpadded_unsharded_flat_param: with
// use_orig_params, Tensor views in forward and pre-backward, Parameter views in every other state
// (so a prefetch that unshards a handle whose state was not moved to FORWARD / BACKWARD_PRE first
// exposes Parameters, which TestAutograd catches); without, Tensor views in forward only. tdc
// installs its views elsewhere (install_substitutes); this reports what PyTorch would have used.
void FlatParamHandle::notify_unsharded_views_by_state() const {
  const bool in_forward = state_ == HandleTrainingState::FORWARD;
  const bool in_pre_backward = state_ == HandleTrainingState::BACKWARD_PRE;
  if (config_.use_orig_params) {
    testing::detail::notify_unsharded_views(/*as_params=*/!in_forward && !in_pre_backward);
  } else if (in_forward) {
    testing::detail::notify_unsharded_views(/*as_params=*/false);
  }
}

void FlatParamHandle::reshard() {
  wait_for_unshard();  // never free storage a gather is still writing
  if (unshard_state_ == UnshardState::SHARDED) return;
  set_unshard_state(UnshardState::SHARDED, "reshard", {UnshardState::UNSHARDED});
  if (config_.sharded) {
    core::free_storage(unsharded_);
  } else {
    unsharded_ = at::Tensor();  // NO_SHARD: drop the alias / low-precision copy
  }
}

at::Tensor FlatParamHandle::gather_full_precision() { return gather_shard_shaped(flat_param_); }

at::Tensor FlatParamHandle::gather_shard_shaped(const at::Tensor& shard) const {
  at::NoGradGuard no_grad;
  at::Tensor local = shard.detach();
  if (!config_.sharded) return local;  // NO_SHARD: already whole (the parameter's views write through)
  at::Tensor full = at::empty({padded_numel_}, local.options());
  // [Note: FSDP's collectives skip the argument checks after the first]: the layout is the
  // handle's; only the dtype can differ between calls (parameters, gradients, optimizer state).
  const bool first = gathers_checked_.insert(local.scalar_type()).second;
  comm::ScopedArgumentChecks checks(first && comm::argument_checks());
  comm::all_gather_into_tensor(full, local.contiguous(), config_.shard_pg);
  return full;
}

std::pair<int64_t, int64_t> FlatParamHandle::slot_range_in_shard(size_t i) const {
  const ParamSlot& s = slots_.at(i);
  if (!config_.sharded) return {s.offset, s.offset + s.numel};
  const int64_t shard_numel = flat_param_.numel();
  return {std::clamp(s.offset - shard_offset_, int64_t{0}, shard_numel),
          std::clamp(s.offset + s.numel - shard_offset_, int64_t{0}, shard_numel)};
}

void FlatParamHandle::write_back(const at::Tensor& full) {
  wait_for_unshard();  // a gather in flight reads the shard
  if (!config_.sharded) {
    // The full views were the parameter itself; a low-precision copy made before is stale now.
    if (compute_dtype() != param_dtype()) reshard();
    return;
  }
  at::NoGradGuard no_grad;
  flat_param_.detach().copy_(full.narrow(0, shard_offset_, shard_numel()));
}

at::Tensor FlatParamHandle::gather_full_grad() {
  at::Tensor g = sharded_grad();
  // Collective: every rank takes part even when its own gradient is missing (zeros then).
  return gather_shard_shaped(g.defined() ? g : at::zeros_like(flat_param_));
}

std::vector<at::Tensor> FlatParamHandle::views_of(const at::Tensor& flat) const {
  std::vector<at::Tensor> out;
  out.reserve(slots_.size());
  for (const auto& s : slots_) out.push_back(detached_view(flat, s.offset, s.numel, s.shape));
  return out;
}

std::vector<at::Tensor> FlatParamHandle::unsharded_views() const {
  std::vector<at::Tensor> out;
  out.reserve(slots_.size());
  for (const auto& s : slots_) out.push_back(storage_view(unsharded_, s.offset, s.shape));
  return out;
}

void FlatParamHandle::install_substitutes(const std::vector<at::Tensor>& views) {
  for (size_t i = 0; i < slots_.size(); ++i) slots_[i].module->set_param_substitute(slots_[i].name, views[i]);
  for (const auto& s : shared_) s.module->set_param_substitute(s.name, views[s.primary]);
}

void FlatParamHandle::clear_substitutes() {
  for (const auto& s : slots_) s.module->clear_param_substitute(s.name);
  for (const auto& s : shared_) s.module->clear_param_substitute(s.name);
}

// ------------------------------------------------------------------ gradients

at::Tensor FlatParamHandle::flatten_grads(const std::vector<at::Tensor>& grads) const {
  at::NoGradGuard no_grad;
  // The slots tile [0, numel_) (wrapping.cpp), so each byte is written once: a gradient, zeros for
  // a parameter without one, zeros for the padding.
  at::Tensor flat = core::empty_reusing({padded_numel_}, flat_param_.options().dtype(compute_dtype()));
  for (size_t i = 0; i < slots_.size(); ++i) {
    at::Tensor slot = flat.narrow(0, slots_[i].offset, slots_[i].numel);
    if (i < grads.size() && grads[i].defined()) {
      slot.copy_(grads[i].reshape({-1}));
    } else {
      slot.zero_();
    }
  }
  flat.narrow(0, numel_, padded_numel_ - numel_).zero_();
  return flat;
}

void FlatParamHandle::accumulate_unsharded(const at::Tensor& flat_grad) {
  if (grad_accum_.defined()) {
    grad_accum_.add_(flat_grad);
  } else {
    grad_accum_ = flat_grad;
  }
}

void FlatParamHandle::reduce_and_accumulate(at::Tensor flat_grad, bool async_op) {
  finish_reduce();
  at::NoGradGuard no_grad;
  if (grad_accum_.defined()) {
    flat_grad.add_(grad_accum_);
    grad_accum_ = at::Tensor();
  }
  if (flat_grad.scalar_type() != reduce_dtype()) flat_grad = flat_grad.to(reduce_dtype());
  scale_if_needed(flat_grad, config_.predivide);
  comm::ScopedArgumentChecks checks(!reduce_checked_ && comm::argument_checks());
  reduce_checked_ = true;
  PendingReduce p;
  p.input = flat_grad;
  if (config_.sharded) {
    p.reduced = core::empty_reusing({shard_numel()}, flat_grad.options());
    p.work =
        comm::reduce_scatter_tensor(p.reduced, flat_grad, comm::ReduceOp::SUM, config_.shard_pg, /*async_op=*/true);
  } else {
    p.reduced = flat_grad.narrow(0, 0, numel_);
    if (config_.shard_pg->size() > 1) {
      p.work = comm::all_reduce(p.reduced, comm::ReduceOp::SUM, config_.shard_pg, /*async_op=*/true);
    }
  }
  pending_reduce_ = std::move(p);
  if (!async_op) finish_reduce();
}

void FlatParamHandle::finish_reduce() {
  if (!pending_reduce_) return;
  PendingReduce p = std::move(*pending_reduce_);
  pending_reduce_.reset();
  at::NoGradGuard no_grad;
  p.work.wait();
  at::Tensor reduced = p.reduced;
  if (reduces_over_replicas()) {
    comm::ScopedArgumentChecks checks(!replicate_checked_ && comm::argument_checks());
    replicate_checked_ = true;
    comm::all_reduce(reduced, comm::ReduceOp::SUM, config_.replicate_pg);
  }
  scale_if_needed(reduced, config_.postdivide);
  const bool keep_low = config_.mp && config_.mp->keep_low_precision_grads;
  if (!keep_low && reduced.scalar_type() != param_dtype()) reduced = reduced.to(param_dtype());
  if (reduced.device() != flat_param_.device()) reduced = reduced.to(flat_param_.device());
  accumulate_sharded(reduced);
}

bool FlatParamHandle::reduces_over_replicas() const { return config_.replicate_pg && config_.replicate_pg->size() > 1; }

std::vector<std::pair<comm::GroupPtr, std::string>> FlatParamHandle::collective_plan() const {
  std::vector<std::pair<comm::GroupPtr, std::string>> plan;
  const std::string reduce = c10::toString(reduce_dtype());
  if (config_.sharded) {
    for (at::ScalarType d : {compute_dtype(), param_dtype()}) {
      plan.emplace_back(config_.shard_pg,
                        fmt::format("all_gather {}[{}] -> [{}]", c10::toString(d), shard_numel(), padded_numel_));
      if (compute_dtype() == param_dtype()) break;
    }
    plan.emplace_back(config_.shard_pg,
                      fmt::format("reduce_scatter {}[{}] -> [{}]", reduce, padded_numel_, shard_numel()));
  } else if (config_.shard_pg->size() > 1) {
    plan.emplace_back(config_.shard_pg, fmt::format("all_reduce {}[{}]", reduce, numel_));
  }
  if (reduces_over_replicas()) {
    plan.emplace_back(config_.replicate_pg,
                      fmt::format("all_reduce {}[{}]", reduce, config_.sharded ? shard_numel() : numel_));
  }
  return plan;
}

void FlatParamHandle::mark_collectives_checked() {
  if (config_.sharded) gathers_checked_.insert({compute_dtype(), param_dtype()});
  reduce_checked_ = true;
  replicate_checked_ = true;
}

// use_orig_params = false: into flat_param_.grad. true: the original parameters' grads are what
// the optimizer reads (and zero_grad clears), so the existing ones are added slot by slot and the
// new sharded gradient's views become their .grad.
void FlatParamHandle::accumulate_sharded(const at::Tensor& new_grad) {
  if (!config_.use_orig_params) {
    at::Tensor& g = flat_param_.mutable_grad();
    if (g.defined()) {
      g.add_(new_grad);
    } else {
      g = new_grad.detach().clone();
    }
    return;
  }
  at::Tensor flat = new_grad.detach().clone();
  for (size_t i = 0; i < slots_.size(); ++i) {
    const at::Tensor& old = orig_[i].grad();
    const at::Tensor& base = orig_[i];
    const int64_t begin = config_.sharded ? base.storage_offset() - flat_param_.storage_offset() : slots_[i].offset;
    // Not an autograd view: optimizers detach_() gradients in zero_grad.
    at::Tensor part = storage_view(flat, begin, base.sizes().vec());
    if (old.defined()) part.add_(old);
    orig_[i].mutable_grad() = part;
  }
  flat_param_.mutable_grad() = flat;
}

at::Tensor FlatParamHandle::sharded_grad() const {
  if (!config_.use_orig_params) return flat_param_.grad();
  // The flat gradient counts only while the original parameters still hold its views.
  bool any = false;
  for (const auto& p : orig_) any = any || p.grad().defined();
  if (!any) return at::Tensor();
  at::Tensor flat = at::zeros_like(flat_param_);
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!orig_[i].grad().defined()) continue;
    const int64_t begin = config_.sharded ? orig_[i].storage_offset() - flat_param_.storage_offset() : slots_[i].offset;
    flat.narrow(0, begin, orig_[i].numel()).copy_(orig_[i].grad().reshape({-1}));
  }
  return flat;
}

std::vector<at::Tensor> FlatParamHandle::optimizer_params() const {
  if (!config_.use_orig_params) return {flat_param_};
  return orig_;
}

}  // namespace tdc::fsdp1::detail
