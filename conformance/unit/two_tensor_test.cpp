// TwoTensor (tdc/conformance/two_tensor.h), PyTorch's two-part test tensor in C++, and how tdc's
// components treat wrapper tensors ([Note: wrapper tensors], tdc/core/wrapper_tensor.h).
#include <gmock/gmock.h>

#include <ATen/ATen.h>

#include "tdc/comm/collectives.h"
#include "tdc/conformance/assert_close.h"
#include "tdc/conformance/checks.h"
#include "tdc/conformance/support.h"
#include "tdc/conformance/two_tensor.h"
#include "tdc/harness/harness.h"
#include "tdc/core/wrapper_tensor.h"

namespace {

using namespace tdc::conformance;
using ::testing::HasSubstr;

constexpr Tolerance kExact{0, 0};

// Both parts of `t` against what the op gives on the plain tensors.
::testing::AssertionResult parts_are(const at::Tensor& t, const at::Tensor& want_a, const at::Tensor& want_b) {
  if (!is_two_tensor(t)) return ::testing::AssertionFailure() << "not a TwoTensor";
  TwoParts p = two_parts(t, "parts_are");
  if (auto r = assert_close(p.a, want_a, kExact); !r) return ::testing::AssertionFailure() << "a: " << r.message();
  if (auto r = assert_close(p.b, want_b, kExact); !r) return ::testing::AssertionFailure() << "b: " << r.message();
  return ::testing::AssertionSuccess();
}

TEST(TwoTensor, OuterMetadataIsAs) {
  at::Tensor a = at::randn({3, 4}), b = at::randn({3, 4});
  at::Tensor t = two_tensor(a, b);
  EXPECT_TRUE(tdc::core::is_wrapper(t));
  EXPECT_EQ(t.sizes(), a.sizes());
  EXPECT_EQ(t.strides(), a.strides());
  EXPECT_EQ(t.scalar_type(), at::kFloat);
  EXPECT_TRUE(t.is_cpu());
  EXPECT_EQ(tdc::core::parts_of(t).size(), 2u);
  EXPECT_EQ(tdc::core::parts_of(a).size(), 1u);
  EXPECT_THROW(t.data_ptr(), c10::Error) << "a wrapper has no storage of its own";
}

TEST(TwoTensor, EveryOpRunsOnBothParts) {
  at::Tensor a = at::randn({3, 4}), b = at::randn({3, 4}), x = at::randn({2, 4});
  at::Tensor t = two_tensor(a, b);
  EXPECT_TRUE(parts_are((t * 2 + 1).sum(0), (a * 2 + 1).sum(0), (b * 2 + 1).sum(0)));
  EXPECT_TRUE(parts_are(at::linear(x, t), at::linear(x, a), at::linear(x, b))) << "a decomposed op (linear)";
  EXPECT_TRUE(parts_are(t.clone(), a, b));
  EXPECT_TRUE(parts_are(at::zeros_like(t), at::zeros_like(a), at::zeros_like(b))) << "factories *_like stay TwoTensor";
  EXPECT_TRUE(parts_are(t.to(at::kBFloat16), a.to(at::kBFloat16), b.to(at::kBFloat16)));
  EXPECT_TRUE(parts_are(t.new_zeros({2}), at::zeros({2}), at::zeros({2})));
  EXPECT_FLOAT_EQ(t.sum().item<float>(), a.sum().item<float>()) << "non-tensor results are a's";
}

TEST(TwoTensor, InPlaceOpsAndViewsWriteBothParts) {
  at::Tensor a = at::ones({4, 2}), b = at::full({4, 2}, 2.f);
  at::Tensor t = two_tensor(a.clone(), b.clone());
  at::Tensor v = t.narrow(0, 1, 2);
  EXPECT_TRUE(is_two_tensor(v));
  at::Tensor& r = v.mul_(3);
  EXPECT_TRUE(r.is_same(v)) << "an in-place op returns its argument";
  at::Tensor want_a = a.clone(), want_b = b.clone();
  want_a.narrow(0, 1, 2).mul_(3);
  want_b.narrow(0, 1, 2).mul_(3);
  EXPECT_TRUE(parts_are(t, want_a, want_b)) << "a view's parts are views of the parts";
  t.detach().add_(1);
  EXPECT_TRUE(parts_are(t, want_a + 1, want_b + 1)) << "detach() shares the parts";
  EXPECT_GT(t._version(), 0);
}

// As in PyTorch: an op writing a plain `out` from TwoTensor inputs runs once per part, so b's
// result is what stays (FSDP's reduce-scatter copy-in relies on exactly this).
TEST(TwoTensor, APlainOutputWrittenFromATwoTensorHoldsB) {
  at::Tensor a = at::ones({3}), b = at::full({3}, 5.f);
  at::Tensor plain = at::zeros({3});
  plain.copy_(two_tensor(a, b));
  EXPECT_FALSE(is_two_tensor(plain));
  EXPECT_TRUE(assert_close(plain, b, kExact));
  at::Tensor out = at::empty({3});
  at::add_out(out, two_tensor(a, b), at::ones({3}));
  EXPECT_TRUE(assert_close(out, b + 1, kExact));
}

TEST(TwoTensor, AutogradDifferentiatesBothParts) {
  at::Tensor a = at::randn({3, 4}), b = at::randn({3, 4}), x = at::randn({2, 4});
  at::Tensor w = two_tensor(a, b).requires_grad_(true);
  at::Tensor loss = at::relu(at::linear(x, w)).sum();
  EXPECT_TRUE(is_two_tensor(loss));
  loss.backward();
  ASSERT_TRUE(w.grad().defined());
  auto grad_of = [&](const at::Tensor& p) {
    at::Tensor leaf = p.clone().requires_grad_(true);
    at::relu(at::linear(x, leaf)).sum().backward();
    return leaf.grad();
  };
  EXPECT_TRUE(parts_are(w.grad(), grad_of(a), grad_of(b)));
  at::Tensor first = w.grad().clone();
  at::relu(at::linear(x, w)).sum().backward();
  EXPECT_TRUE(assert_close(w.grad(), first * 2, kExact)) << "a second backward accumulates into both parts";
}

TEST(TwoTensor, ConstructorNamesTheMismatch) {
  auto error = [](const at::Tensor& a, const at::Tensor& b) { return error_of([&] { two_tensor(a, b); }); };
  EXPECT_THAT(error(at::ones({2, 3}), at::ones({3, 2})), HasSubstr("same shape, got [2, 3] and [3, 2]"));
  EXPECT_THAT(error(at::ones({2}), at::ones({2}, at::kDouble)), HasSubstr("same dtype, got Float and Double"));
  EXPECT_THAT(error(at::ones({2, 2}), at::ones({2, 2}).t().contiguous().t()), HasSubstr("same strides"));
  EXPECT_THAT(error_of([] { two_parts(at::ones({1}), "caller"); }), HasSubstr("caller: expected a TwoTensor"));
}

TEST(TwoTensor, ComparisonsLookAtBothParts) {
  at::Tensor a = at::ones({2}), b = at::zeros({2});
  EXPECT_TRUE(assert_equal(two_tensor(a, b), two_tensor(a.clone(), b.clone())));
  auto r = assert_equal(two_tensor(a, b), two_tensor(a.clone(), b + 1));
  ASSERT_FALSE(r) << "b differs; a's equality must not hide it";
  EXPECT_THAT(r.message(), HasSubstr("part 1 of 2"));
  EXPECT_TRUE(assert_equal(a, two_tensor(a, a.clone()))) << "a plain tensor equal to both parts";
  EXPECT_FALSE(assert_equal(two_tensor(a, b), a)) << "a plain tensor must match every part, not a alone";
  EXPECT_FALSE(assert_equal(b, two_tensor(a, b))) << "... and not b alone";
}

// c10d runs an op on a tensor subclass once per part (through the subclass's dispatch); tdc's
// in-place collectives do the same, the others refuse a wrapper by name.
TDC_DIST_TEST(TwoTensor, InPlaceCollectivesRunOnEachPart, .world_size = 2) {
  world();
  const int rank = tdc::harness::ctx().rank;
  at::Tensor t = two_tensor(at::full({3}, 1.f + rank), at::full({3}, 10.f * (rank + 1)));
  const int64_t version = t._version();
  tdc::comm::all_reduce(t);
  EXPECT_TRUE(parts_are(t, at::full({3}, 3.f), at::full({3}, 30.f)));
  EXPECT_GT(t._version(), version) << "the wrapper's own version counter moves";
  at::Tensor s = two_tensor(at::full({2}, 1.f * rank), at::full({2}, 2.f * rank + 5));
  tdc::comm::broadcast(s, 1);
  EXPECT_TRUE(parts_are(s, at::full({2}, 1.f), at::full({2}, 7.f)));
  at::Tensor out = at::empty({6});
  EXPECT_THAT(error_of([&] { tdc::comm::all_gather_into_tensor(out, t); }),
              HasSubstr("all_gather_into_tensor: the input is a wrapper tensor of 2 parts"));
}

}  // namespace
