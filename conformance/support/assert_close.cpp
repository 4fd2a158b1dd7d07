// PyTorch's tensor comparisons ([Note: PyTorch's comparison semantics] in assert_close.h).
#include "tdc/conformance/assert_close.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tdc/core/wrapper_tensor.h"

namespace tdc::conformance {

namespace {

// Python's repr of a float: fmt's shortest round-trip form, which is Python's but for the ".0" a
// Python float always shows ("1.0", not "1").
std::string py_float(double v) {
  if (std::isnan(v)) return "nan";  // Python prints no sign on a NaN
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".ein") == std::string::npos) s += ".0";
  return s;
}

// A value as Python prints the result of .item() on a tensor of `dtype`.
std::string py_value(const at::Tensor& zero_dim, at::ScalarType dtype) {
  if (dtype == at::kBool) return zero_dim.item<bool>() ? "True" : "False";
  if (at::isIntegralType(dtype, /*includeBool=*/false)) return std::to_string(zero_dim.item<int64_t>());
  if (at::isComplexType(dtype)) {
    auto c = zero_dim.item<c10::complex<double>>();
    return fmt::format("({}{}{}j)", py_float(c.real()), c.imag() < 0 ? "" : "+", py_float(c.imag()));
  }
  return py_float(zero_dim.item<double>());
}

// torch.dtype's str: "torch.float32", "torch.bfloat16", ...
std::string py_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "torch.float32";
    case at::kDouble:
      return "torch.float64";
    case at::kHalf:
      return "torch.float16";
    case at::kBFloat16:
      return "torch.bfloat16";
    case at::kComplexFloat:
      return "torch.complex64";
    case at::kComplexDouble:
      return "torch.complex128";
    case at::kLong:
      return "torch.int64";
    case at::kInt:
      return "torch.int32";
    case at::kShort:
      return "torch.int16";
    case at::kChar:
      return "torch.int8";
    case at::kByte:
      return "torch.uint8";
    case at::kBool:
      return "torch.bool";
    default:
      return std::string("torch.") + c10::toString(t);
  }
}

std::string py_layout(at::Layout l) {
  switch (l) {
    case at::kStrided:
      return "torch.strided";
    case at::kSparse:
      return "torch.sparse_coo";
    case at::kSparseCsr:
      return "torch.sparse_csr";
    default:
      return fmt::format("torch.{}", c10::str(l));
  }
}

std::string py_shape(at::IntArrayRef sizes) { return fmt::format("torch.Size([{}])", fmt::join(sizes, ", ")); }

// A flat index as PyTorch's message shows it: a tuple, "(3,)" or "(0, 2)".
std::string py_index(int64_t flat, at::IntArrayRef sizes) {
  std::vector<int64_t> idx(sizes.size());
  for (size_t d = sizes.size(); d-- > 0;) {
    idx[d] = flat % sizes[d];
    flat /= sizes[d];
  }
  if (idx.size() == 1) return fmt::format("({},)", idx[0]);
  return fmt::format("({})", fmt::join(idx, ", "));
}

::testing::AssertionResult attribute_mismatch(const char* name, const std::string& a, const std::string& e) {
  return ::testing::AssertionFailure() << "The values for attribute '" << name << "' do not match: " << a << " != " << e
                                       << ".";
}

// Shape always; layout, device and dtype when asked, in PyTorch's order (_compare_attributes).
std::optional<::testing::AssertionResult> compare_attributes(const at::Tensor& a, const at::Tensor& e,
                                                             const Close& how) {
  if (a.sizes() != e.sizes()) return attribute_mismatch("shape", py_shape(a.sizes()), py_shape(e.sizes()));
  if (how.check_layout && a.layout() != e.layout())
    return attribute_mismatch("layout", py_layout(a.layout()), py_layout(e.layout()));
  if (how.check_device && a.device() != e.device())
    return attribute_mismatch("device", a.device().str(), e.device().str());
  if (how.check_dtype && a.scalar_type() != e.scalar_type())
    return attribute_mismatch("dtype", py_dtype(a.scalar_type()), py_dtype(e.scalar_type()));
  return std::nullopt;
}

// _equalize_attributes: one device (CPU), one dtype (promote_types), one layout (dense).
std::pair<at::Tensor, at::Tensor> equalize(at::Tensor a, at::Tensor e) {
  if (a.device() != e.device()) {
    a = a.cpu();
    e = e.cpu();
  }
  if (a.scalar_type() != e.scalar_type()) {
    const auto wide = [](at::ScalarType t) {
      return t == at::kUInt16 || t == at::kUInt32 || t == at::kUInt64 ? at::kLong : t;
    };
    const at::ScalarType common = at::promote_types(wide(a.scalar_type()), wide(e.scalar_type()));
    a = a.to(common);
    e = e.to(common);
  }
  if (a.layout() != e.layout() || a.layout() != at::kStrided) {
    if (a.layout() != at::kStrided) a = a.to_dense();
    if (e.layout() != at::kStrided) e = e.to_dense();
  }
  return {a, e};
}

// make_scalar_mismatch_msg / make_tensor_mismatch_msg, plus the first mismatch.
::testing::AssertionResult mismatch_message(const at::Tensor& a, const at::Tensor& e, const at::Tensor& matches,
                                            Tolerance tol) {
  const bool equality = tol.rtol == 0 && tol.atol == 0;
  const at::ScalarType dtype = a.scalar_type();
  const bool is_float = at::isFloatingType(dtype) || at::isComplexType(dtype);
  auto diff_line = [&](const char* type, const std::string& diff, const std::string& idx, double allowed) {
    std::string line = idx.empty() ? fmt::format("{} difference: {}", type, diff)
                                   : fmt::format("Greatest {} difference: {} at index {}", type, diff, idx);
    if (!equality) line += fmt::format(" (up to {} allowed)", py_float(allowed));
    return line;
  };
  auto result = ::testing::AssertionFailure();
  if (a.dim() == 0) {  // make_scalar_mismatch_msg: Python arithmetic on the two .item() values
    std::string abs_diff;
    double abs_d = 0, expected_abs = 0;
    if (at::isComplexType(dtype)) {
      const auto av = a.to(at::kComplexDouble).item<c10::complex<double>>();
      const auto ev = e.to(at::kComplexDouble).item<c10::complex<double>>();
      abs_d = std::abs(av - ev);
      expected_abs = std::abs(ev);
      abs_diff = py_float(abs_d);
    } else if (is_float) {
      const double av = a.to(at::kDouble).item<double>(), ev = e.to(at::kDouble).item<double>();
      abs_d = std::abs(av - ev);
      expected_abs = std::abs(ev);
      abs_diff = py_float(abs_d);
    } else {  // int, bool: Python ints
      const int64_t av = a.to(at::kLong).item<int64_t>(), ev = e.to(at::kLong).item<int64_t>();
      abs_d = static_cast<double>(std::abs(av - ev));
      expected_abs = static_cast<double>(std::abs(ev));
      abs_diff = std::to_string(std::abs(av - ev));
    }
    const double rel = expected_abs == 0 ? std::numeric_limits<double>::infinity() : abs_d / expected_abs;
    result << (equality ? "Scalars are not equal!" : "Scalars are not close!") << "\n\n"
           << "Expected " << py_value(e, dtype) << " but got " << py_value(a, dtype) << ".\n"
           << diff_line("Absolute", abs_diff, "", tol.atol) << "\n"
           << diff_line("Relative", py_float(rel), "", tol.rtol);
    return result;
  }
  const int64_t n = matches.numel();
  const at::Tensor mismatch_flat = matches.logical_not().flatten();
  const int64_t bad = mismatch_flat.sum().item<int64_t>();
  at::Tensor af = a.flatten(), ef = e.flatten();
  if (!is_float) {
    af = af.to(at::kLong);
    ef = ef.to(at::kLong);
  }
  at::Tensor abs_diff = (af - ef).abs();
  abs_diff.masked_fill_(mismatch_flat.logical_not(), 0);
  auto [max_abs, abs_at] = abs_diff.max(0);
  at::Tensor rel_diff = abs_diff / ef.abs();
  rel_diff.masked_fill_(mismatch_flat.logical_not(), 0);
  auto [max_rel, rel_at] = rel_diff.max(0);
  const int64_t first = mismatch_flat.nonzero().select(1, 0)[0].item<int64_t>();
  result << (equality ? "Tensor-likes are not equal!" : "Tensor-likes are not close!") << "\n\n"
         << fmt::format("Mismatched elements: {} / {} ({:.1f}%)", bad, n, 100.0 * static_cast<double>(bad) / n) << "\n"
         << diff_line("absolute", py_value(max_abs, max_abs.scalar_type()), py_index(abs_at.item<int64_t>(), a.sizes()),
                      tol.atol)
         << "\n"
         << diff_line("relative", py_value(max_rel, max_rel.scalar_type()), py_index(rel_at.item<int64_t>(), a.sizes()),
                      tol.rtol)
         << "\n"
         << "First mismatch at index " << py_index(first, a.sizes()) << ": actual "
         << py_value(af[first], af.scalar_type()) << ", expected " << py_value(ef[first], ef.scalar_type());
  return result;
}

}  // namespace

Tolerance default_tolerances(at::ScalarType a, at::ScalarType b) {
  const auto row = [](at::ScalarType t) -> Tolerance {
    switch (t) {
      case at::kHalf:
        return {1e-3, 1e-5};
      case at::kBFloat16:
        return {1.6e-2, 1e-5};
      case at::kFloat:
        return {1.3e-6, 1e-5};
      case at::kDouble:
        return {1e-7, 1e-7};
      case at::kComplexHalf:
        return {1e-3, 1e-5};
      case at::kComplexFloat:
        return {1.3e-6, 1e-5};
      case at::kComplexDouble:
        return {1e-7, 1e-7};
      default:
        return {0.0, 0.0};  // integers, bool (and float8: compared bitwise by PyTorch)
    }
  };
  const Tolerance ra = row(a), rb = row(b);
  return {std::max(ra.rtol, rb.rtol), std::max(ra.atol, rb.atol)};
}

// Wrapper tensors ([Note: wrapper tensors], tdc/core/wrapper_tensor.h) compare part by part: a TwoTensor
// is close to another when its a and its b are, and a plain tensor is close to a TwoTensor when it
// is close to both parts (FSDP2's gradient of a TwoTensor parameter is plain, its reference's is a
// TwoTensor). PyTorch compares through the wrapper's ops, whose truth value is a's alone; this is
// stricter.
static ::testing::AssertionResult compare_parts(const at::Tensor& actual, const at::Tensor& expected,
                                                const Close& how) {
  std::vector<at::Tensor> pa = core::parts_of(actual), pe = core::parts_of(expected);
  if (pa.size() == 1) pa.resize(pe.size(), pa[0]);
  if (pe.size() == 1) pe.resize(pa.size(), pe[0]);
  if (pa.size() != pe.size()) {
    return ::testing::AssertionFailure() << "actual is made of " << pa.size() << " tensors but expected of "
                                         << pe.size();
  }
  for (size_t i = 0; i < pa.size(); ++i) {
    if (auto r = assert_close(pa[i], pe[i], how); !r) {
      return ::testing::AssertionFailure() << "part " << i << " of " << pa.size() << ": " << r.message();
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult assert_close(const at::Tensor& actual, const at::Tensor& expected, const Close& how) {
  if (!actual.defined() || !expected.defined()) {
    if (!actual.defined() && !expected.defined()) return ::testing::AssertionSuccess();  // None == None
    return ::testing::AssertionFailure() << (actual.defined() ? "expected" : "actual")
                                         << " is None (an undefined tensor) but the other is a tensor";
  }
  if (auto failed = compare_attributes(actual, expected, how)) return *failed;
  if (core::is_wrapper(actual) || core::is_wrapper(expected)) return compare_parts(actual, expected, how);
  const Tolerance tol = how.tol.value_or(default_tolerances(actual.scalar_type(), expected.scalar_type()));
  if (actual.is_meta() || expected.is_meta()) return ::testing::AssertionSuccess();  // no values to compare
  auto [a, e] = equalize(actual.detach(), expected.detach());
  const at::Tensor matches = at::isclose(a, e, tol.rtol, tol.atol, how.equal_nan);
  if (matches.all().item<bool>()) return ::testing::AssertionSuccess();
  return mismatch_message(a, e, matches, tol);
}

::testing::AssertionResult assert_close(const at::Tensor& actual, const at::Tensor& expected, Tolerance tol) {
  return assert_close(actual, expected, Close{.tol = tol});
}

::testing::AssertionResult assert_equal(const at::Tensor& actual, const at::Tensor& expected, const Equal& how) {
  return assert_close(actual, expected,
                      Close{.tol = how.tol,
                            .equal_nan = how.equal_nan,
                            .check_device = how.exact_device,
                            .check_dtype = how.exact_dtype,
                            .check_layout = how.exact_layout});
}

::testing::AssertionResult assert_equal(const at::Tensor& actual, const at::Tensor& expected, Tolerance tol) {
  return assert_equal(actual, expected, Equal{.tol = tol});
}

::testing::AssertionResult assert_not_equal(const at::Tensor& actual, const at::Tensor& expected, const Equal& how) {
  if (!assert_equal(actual, expected, how)) return ::testing::AssertionSuccess();
  const Tolerance tol = how.tol.value_or(default_tolerances(actual.defined() ? actual.scalar_type() : at::kFloat,
                                                            expected.defined() ? expected.scalar_type() : at::kFloat));
  return ::testing::AssertionFailure() << "AssertionError not raised: the tensors are equal under assertEqual's rules "
                                       << fmt::format("(rtol {}, atol {})", py_float(tol.rtol), py_float(tol.atol));
}

::testing::AssertionResult torch_allclose(const at::Tensor& actual, const at::Tensor& expected) {
  return assert_close(actual, expected, Close{.tol = Tolerance{1e-5, 1e-8}, .check_device = false});
}

}  // namespace tdc::conformance
