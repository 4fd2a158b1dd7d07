#include "tdc/conformance/checks.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>

#include "tdc/comm/collectives.h"
#include "tdc/conformance/support.h"
#include "tdc/tensor/module_params.h"

namespace tdc::conformance {

nn::ModulePtr reference_copy(const nn::Module& model) {
  auto group = world();
  nn::ModulePtr ref = model.deep_copy();
  for (auto p : ref->params()) comm::broadcast(p, 0, group);
  for (auto& [name, b] : ref->named_bufs()) comm::broadcast(b, 0, group);
  return ref;
}

void average_reference_grads(nn::Module& reference) {
  auto group = world();
  for (auto& p : reference.params()) {
    if (!p.grad().defined()) continue;
    comm::all_reduce(p.mutable_grad(), comm::ReduceOp::SUM, group);
    p.mutable_grad().div_(group->size());
  }
}

// [Note: one broadcast per dtype in sync_from_rank0] The parameters and buffers of one dtype and
// device go side by side into one flat tensor and are broadcast together: a broadcast moves bytes
// only, so every tensor gets rank 0's values bit for bit as with one broadcast each, and a
// model's sync costs one collective per kind of tensor instead of one per tensor (the seed
// suite's 4-rank tests ran 6,000 of them, each with its argument check; docs/bench/suite_time.md).
// Kinds are visited in a fixed order (dtype, then device), the same on every rank.
void sync_from_rank0(nn::Module& model) {
  auto group = world();
  at::NoGradGuard no_grad;
  std::map<std::pair<at::ScalarType, std::string>, std::vector<at::Tensor>> by_kind;
  auto add = [&](const at::Tensor& t) { by_kind[{t.scalar_type(), t.device().str()}].push_back(t); };
  for (const auto& p : model.params()) add(p);
  for (const auto& [name, b] : model.named_bufs()) add(b);
  for (auto& [kind, tensors] : by_kind) {
    std::vector<at::Tensor> flat_parts;
    for (const auto& t : tensors) flat_parts.push_back(t.detach().reshape({-1}));
    at::Tensor flat = at::cat(flat_parts);
    comm::broadcast(flat, 0, group);
    int64_t offset = 0;
    for (auto& t : tensors) {
      t.detach().copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

::testing::AssertionResult sharded_parity(nn::Module& reference, nn::Module& sharded) {
  auto got = tensor::named_params_with_specs(sharded);
  auto want = reference.named_params();
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " parameters but the reference has " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    const std::string& fqn = got[i].fqn;
    if (fqn != want[i].first)
      return ::testing::AssertionFailure()
             << "parameter " << i << " is '" << fqn << "' but the reference's is '" << want[i].first << "'";
    if (!got[i].dtensor) return ::testing::AssertionFailure() << "'" << fqn << "' is not a DTensor";
    const tensor::DTensorSpec& spec = got[i].dtensor->spec();
    auto chunk = [&](const at::Tensor& full) {
      return tensor::distribute_tensor(full.detach(), spec.mesh, spec.placements).to_local();
    };
    if (auto r = assert_equal(got[i].tensor, chunk(want[i].second)); !r)
      return ::testing::AssertionFailure() << "shard of '" << fqn << "': " << r.message();
    const at::Tensor& rg = want[i].second.grad();
    if (got[i].tensor.grad().defined() != rg.defined())
      return ::testing::AssertionFailure() << "'" << fqn << "' has " << (rg.defined() ? "no " : "a ")
                                           << "gradient but the reference has " << (rg.defined() ? "one" : "none");
    if (rg.defined()) {
      if (auto r = assert_equal(got[i].tensor.grad(), chunk(rg)); !r)
        return ::testing::AssertionFailure() << "shard gradient of '" << fqn << "': " << r.message();
    }
  }
  return ::testing::AssertionSuccess();
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace tdc::conformance
