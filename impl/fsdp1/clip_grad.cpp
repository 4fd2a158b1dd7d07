// FullyShardedDataParallel::clip_grad_norm_: the total norm over sharded and replicated gradients.
#include "common.h"
#include "flat_param.h"
#include "tdc/comm/collectives.h"
#include "unit_state.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <unordered_set>

namespace tdc::fsdp1 {

// [Note: FSDP1 gradient norm] Sharded gradients (flat shards, or use_orig_params views of them)
// hold disjoint pieces: their |g|^p sums (or maxima) are all-reduced over the process group.
// Replicated ones (NO_SHARD units, parameters FSDP does not manage) are the same on every rank
// and count once. The padding of a flat shard has zero gradient and adds nothing.
at::Tensor FullyShardedDataParallel::clip_grad_norm_(double max_norm, double norm_type) {
  if (!unit_->is_root()) {
    throw std::logic_error(
        fmt::format("clip_grad_norm_: FSDP unit {} is not the root; call it on the root", unit_->label()));
  }
  unit_->check_idle("clip_grad_norm_");
  if (!(norm_type > 0)) throw std::invalid_argument(fmt::format("clip_grad_norm_: norm_type {} <= 0", norm_type));
  std::unordered_set<const c10::TensorImpl*> sharded;
  for (auto* u : fsdp_modules(*this)) {
    auto* h = u->unit().handle();
    if (!h || !h->sharded()) continue;
    for (const auto& p : h->optimizer_params()) sharded.insert(p.unsafeGetTensorImpl());
  }
  const bool inf = std::isinf(norm_type);
  at::NoGradGuard no_grad;
  auto accumulate = [&](const at::Tensor& acc, const at::Tensor& g) {
    at::Tensor n = at::linalg_vector_norm(g.detach().to(at::kFloat), norm_type);
    return inf ? at::maximum(acc, n) : acc + n.pow(norm_type);
  };
  at::Tensor local_sharded = at::zeros({}, at::kFloat), replicated = at::zeros({}, at::kFloat);
  std::vector<at::Tensor> grads;
  for (const auto& p : params()) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    if (sharded.count(p.unsafeGetTensorImpl())) {
      local_sharded = accumulate(local_sharded, g);
    } else {
      replicated = accumulate(replicated, g);
    }
  }
  comm::all_reduce(local_sharded, inf ? comm::ReduceOp::MAX : comm::ReduceOp::SUM, process_group());
  at::Tensor total = inf ? at::maximum(local_sharded, replicated) : (local_sharded + replicated).pow(1.0 / norm_type);
  const at::Tensor coef = at::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);
  for (auto& g : grads) g.mul_(coef.to(g.scalar_type()));
  return total;
}

}  // namespace tdc::fsdp1
