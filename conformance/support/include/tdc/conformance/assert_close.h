// PyTorch's tensor comparisons, one implementation for every numeric check of the unit and seed
// suites: torch.testing.assert_close, TestCase.assertEqual and TestCase.assertNotEqual.
//
//   ASSERT_TRUE(assert_equal(loss, ref_loss)) << "loss at iteration " << i;   // self.assertEqual
//   EXPECT_TRUE(assert_close(grad, ref_grad, Tolerance{1e-4, 1e-5}));          // assert_close(rtol=, atol=)
//   EXPECT_TRUE(assert_close(out, ref, {.check_dtype = false}));               // assert_close(check_dtype=False)
//
// [Note: PyTorch's comparison semantics] (torch/testing/_comparison.py, PyTorch 2.11-2.14 alike):
//  * Attributes first, in PyTorch's order: shape (always), layout, device, dtype (each unless its
//    check is off). A failure reads "The values for attribute 'dtype' do not match: torch.float32
//    != torch.bfloat16." as PyTorch's does.
//  * Then the values, after equalizing what was not checked: different devices -> both on CPU,
//    different dtypes -> torch.promote_types of the two, different layouts -> both dense. Meta
//    tensors have no values: attributes only.
//  * Elementwise close = isclose(actual, expected, rtol, atol, equal_nan): equal, or both NaN when
//    equal_nan, or |actual - expected| finite and <= atol + rtol * |expected|. So NaN matches
//    nothing unless equal_nan, an infinity matches only the same infinity, and a finite value
//    never matches an infinity.
//  * Tolerances: both given or neither (PyTorch refuses one alone). Neither: the dtype's row of
//    PyTorch's table (default_tolerances), the looser of the two dtypes' rows; integers and bool 0/0.
//  * The message is PyTorch's ("Tensor-likes are not close!", mismatched elements, greatest
//    absolute and relative difference with their index and the tolerance), plus one line PyTorch
//    does not print: the first mismatching index with both values.
//  * assert_equal is assertEqual: the same comparison with its defaults (equal_nan=True,
//    exact_dtype=True, exact_device=False, exact_layout=False). assert_not_equal passes exactly
//    when assert_equal fails, as assertNotEqual (assertRaises around assertEqual).
// comparison_test checks verdicts and messages case by case against the venv's PyTorch.
#pragma once

#include <optional>
#include <utility>

#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>

namespace tdc::conformance {

// rtol and atol together (torch.testing takes both or neither).
struct Tolerance {
  double rtol;
  double atol;
};

// torch.testing.assert_close's keyword arguments, with its defaults.
struct Close {
  std::optional<Tolerance> tol{};  // none: default_tolerances(actual, expected)
  bool equal_nan = false;
  bool check_device = true;
  bool check_dtype = true;
  bool check_layout = true;
};

// TestCase.assertEqual's keyword arguments, with its defaults.
struct Equal {
  std::optional<Tolerance> tol{};
  bool equal_nan = true;
  bool exact_dtype = true;
  bool exact_device = false;
  bool exact_layout = false;
};

[[nodiscard]] ::testing::AssertionResult assert_close(const at::Tensor& actual, const at::Tensor& expected,
                                                      const Close& how = {});
[[nodiscard]] ::testing::AssertionResult assert_close(const at::Tensor& actual, const at::Tensor& expected,
                                                      Tolerance tol);
[[nodiscard]] ::testing::AssertionResult assert_equal(const at::Tensor& actual, const at::Tensor& expected,
                                                      const Equal& how = {});
[[nodiscard]] ::testing::AssertionResult assert_equal(const at::Tensor& actual, const at::Tensor& expected,
                                                      Tolerance tol);
[[nodiscard]] ::testing::AssertionResult assert_not_equal(const at::Tensor& actual, const at::Tensor& expected,
                                                          const Equal& how = {});

// torch.allclose(actual, expected): isclose with rtol 1e-5, atol 1e-8, NaN unequal, one dtype.
[[nodiscard]] ::testing::AssertionResult torch_allclose(const at::Tensor& actual, const at::Tensor& expected);

// PyTorch's default (rtol, atol) for comparing a tensor of dtype `a` with one of dtype `b`.
Tolerance default_tolerances(at::ScalarType a, at::ScalarType b);

}  // namespace tdc::conformance
