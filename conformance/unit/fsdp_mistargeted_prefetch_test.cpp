// A prefetch whose module does not run (a "mistargeted" unshard, as PyTorch's FSDP2 calls it) ends
// with backward: the next forward of that module sees the shards as they are then, not as they
// were when the prefetch was issued. PyTorch's FSDPParamGroup.finalize_backward waits for such an
// all-gather; tdc's root post-backward does the same ([Note: a mistargeted prefetch ends with
// backward], impl/fsdp/state.cpp).
#include <memory>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "tdc/conformance/checks.h"
#include "tdc/conformance/support.h"
#include "tdc/fsdp/fully_shard.h"
#include "tdc/harness/harness.h"
#include "tdc/nn/layers.h"

namespace {

using namespace tdc;

// Block "a", then block "b" only when use_b: a forward that leaves b out.
class AThenMaybeB : public nn::Module {
 public:
  bool use_b = true;
  AThenMaybeB() : Module("AThenMaybeB") {
    register_child("a", std::make_shared<nn::Linear>(8, 8));
    register_child("b", std::make_shared<nn::Linear>(8, 8));
  }
  nn::Tensors forward(const nn::Tensors& in) override {
    at::Tensor x = child("a")(in[0]);
    return {use_b ? child("b")(x) : x};
  }
  nn::ModulePtr clone_empty() const override { return std::make_shared<AThenMaybeB>(); }
};

// With parameters kept after backward (the prefetched group stays as it is) and an explicit
// prefetch of b from a's forward, a forward without b leaves b's all-gather issued; the shards
// then change in place (an optimizer step); the next forward with b must compute with the new ones.
TDC_DIST_TEST(FSDPMistargetedPrefetch, EndsWithBackward, .world_size = 2) {
  conformance::world();
  at::manual_seed(7);
  auto model = std::make_shared<AThenMaybeB>();
  nn::ModulePtr ref = conformance::reference_copy(*model);
  fsdp::fully_shard(model->child("a"));
  fsdp::fully_shard(model->child("b"));
  fsdp::fully_shard(*model);
  fsdp::as_fsdp(*model).set_reshard_after_backward(false);
  fsdp::as_fsdp(model->child("a")).set_modules_to_forward_prefetch({&model->child("b")});
  const at::Tensor x = at::randn({4, 8}, at::make_generator<at::CPUGeneratorImpl>(3));

  model->use_b = false;
  (*model)(x).sum().backward();  // b's all-gather was issued from a's forward; b did not run
  {
    at::NoGradGuard no_grad;  // the "step": every shard of b, and the reference's b, plus one
    for (const at::Tensor& p : model->child("b").params()) at::Tensor(p).add_(1.0);
    for (const at::Tensor& p : ref->child("b").params()) at::Tensor(p).add_(1.0);
  }
  model->use_b = true;
  dynamic_cast<AThenMaybeB&>(*ref).use_b = true;
  const at::Tensor got = (*model)(x);
  const at::Tensor want = (*ref)(x);
  EXPECT_TRUE(conformance::assert_close(got, want)) << "b computed with the shards of before the step";
}

}  // namespace
