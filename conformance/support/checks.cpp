#include "tdc/conformance/checks.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tdc/comm/collectives.h"
#include "tdc/conformance/support.h"
#include "tdc/tensor/module_params.h"

namespace tdc::conformance {

namespace {
// ASSERT_* needs a void function; expect_close reports through it.
void compare(const at::Tensor& actual, const at::Tensor& expected, const std::string& what, double rtol, double atol) {
  ASSERT_TRUE(actual.defined()) << what << ": undefined";
  ASSERT_TRUE(expected.defined()) << what << ": reference undefined";
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  at::Tensor a = actual.detach().to(at::kDouble), e = expected.detach().to(at::kDouble);
  at::Tensor bad = (a - e).abs() > (atol + rtol * e.abs());
  EXPECT_FALSE(bad.any().item<bool>()) << what << ": " << bad.sum().item<int64_t>() << " of " << a.numel()
                                       << " elements differ; max |diff| " << (a - e).abs().max().item<double>();
}
}  // namespace

void expect_close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what, double rtol,
                  double atol) {
  compare(actual, expected, what, rtol, atol);
}

nn::ModulePtr reference_copy(const nn::Module& model) {
  auto group = world();
  nn::ModulePtr ref = model.deep_copy();
  for (auto p : ref->params()) comm::broadcast(p, 0, group);
  for (auto& [name, b] : ref->named_bufs()) comm::broadcast(b, 0, group);
  return ref;
}

void sync_from_rank0(nn::Module& model) {
  auto group = world();
  at::NoGradGuard no_grad;
  for (auto p : model.params()) comm::broadcast(p, 0, group);
  for (auto& [name, b] : model.named_bufs()) comm::broadcast(b, 0, group);
}

void check_sharded_parity(nn::Module& reference, nn::Module& sharded, const std::string& what) {
  auto got = tensor::named_params_with_specs(sharded);
  auto want = reference.named_params();
  ASSERT_EQ(got.size(), want.size()) << what << ": parameter counts differ";
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].fqn, want[i].first) << what;
    ASSERT_TRUE(got[i].dtensor.has_value()) << what << ": '" << got[i].fqn << "' is not a DTensor";
    const tensor::DTensorSpec& spec = got[i].dtensor->spec();
    auto chunk = [&](const at::Tensor& full) {
      return tensor::distribute_tensor(full.detach(), spec.mesh, spec.placements).to_local();
    };
    compare(got[i].tensor, chunk(want[i].second), what + " shard of '" + got[i].fqn + "'", kFloat32Rtol, kFloat32Atol);
    const at::Tensor& rg = want[i].second.grad();
    ASSERT_EQ(got[i].tensor.grad().defined(), rg.defined()) << what << " gradient presence of '" << got[i].fqn << "'";
    if (rg.defined()) {
      compare(got[i].tensor.grad(), chunk(rg), what + " shard gradient of '" + got[i].fqn + "'", kFloat32Rtol,
              kFloat32Atol);
    }
  }
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
