#include "tdc/conformance/checks.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

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

void sync_from_rank0(nn::Module& model) {
  auto group = world();
  at::NoGradGuard no_grad;
  for (auto p : model.params()) comm::broadcast(p, 0, group);
  for (auto& [name, b] : model.named_bufs()) comm::broadcast(b, 0, group);
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
