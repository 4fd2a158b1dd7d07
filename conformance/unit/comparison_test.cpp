// tdc's comparisons (tdc/conformance/assert_close.h) against PyTorch's, case by case: every case of
// comparison_cases.json (fixtures/golden/comparison_cases.py, run by CTest with the venv's PyTorch
// before this suite) is built here from the same description, and tdc's assert_close /
// assert_equal / assert_not_equal must reach PyTorch's verdict with PyTorch's message (tdc's adds
// one line, the first mismatch, which is checked on its own). Pure functions, one process.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <nlohmann/json.hpp>

#include <ATen/ATen.h>
#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include "tdc/conformance/assert_close.h"
#include "tdc/conformance/pytorch_goldens.h"

namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using namespace tdc::conformance;

const json& goldens() { return pytorch_goldens("comparison_cases.json"); }

at::ScalarType dtype_of(const std::string& name) {
  static const std::map<std::string, at::ScalarType> table = {{"float32", at::kFloat},     {"float64", at::kDouble},
                                                              {"bfloat16", at::kBFloat16}, {"float16", at::kHalf},
                                                              {"int64", at::kLong},        {"bool", at::kBool}};
  auto it = table.find(name);
  if (it == table.end()) throw std::runtime_error("comparison_cases.json: unknown dtype '" + name + "'");
  return it->second;
}

double number(const json& v) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    throw std::runtime_error("comparison_cases.json: unknown value '" + s + "'");
  }
  if (v.is_boolean()) return v.get<bool>() ? 1.0 : 0.0;
  return v.get<double>();
}

// The tensor a case describes, built as comparison_cases.py's make() builds it.
at::Tensor make(const json& spec) {
  std::vector<double> values;
  for (const auto& v : spec.at("values")) values.push_back(number(v));
  at::Tensor x = at::tensor(values, at::kDouble).to(dtype_of(spec.at("dtype")));
  x = x.reshape(spec.at("shape").get<std::vector<int64_t>>());
  if (spec.value("layout", "strided") == "sparse") x = x.to_sparse();
  return x.to(at::Device(spec.value("device", "cpu")));
}

std::optional<Tolerance> tolerance_of(const json& kw) {
  if (!kw.contains("rtol")) return std::nullopt;
  return Tolerance{kw.at("rtol").get<double>(), kw.at("atol").get<double>()};
}

::testing::AssertionResult run_case(const json& c) {
  const at::Tensor a = make(c.at("actual")), e = make(c.at("expected"));
  const json& kw = c.at("kwargs");
  const std::string api = c.at("api");
  if (api == "close") {
    return assert_close(a, e,
                        Close{.tol = tolerance_of(kw),
                              .equal_nan = kw.value("equal_nan", false),
                              .check_device = kw.value("check_device", true),
                              .check_dtype = kw.value("check_dtype", true),
                              .check_layout = kw.value("check_layout", true)});
  }
  const Equal how{.tol = tolerance_of(kw),
                  .equal_nan = kw.value("equal_nan", true),
                  .exact_dtype = kw.value("exact_dtype", true),
                  .exact_device = kw.value("exact_device", false),
                  .exact_layout = kw.value("exact_layout", false)};
  return api == "equal" ? assert_equal(a, e, how) : assert_not_equal(a, e, how);
}

// tdc's message without its own last line ("First mismatch at index ..."), which PyTorch does not print.
std::string pytorch_part(const std::string& msg) {
  const auto at = msg.find("\nFirst mismatch at index ");
  return at == std::string::npos ? msg : msg.substr(0, at);
}

TEST(ComparisonGolden, EveryCaseAgreesWithPyTorch) {
  const json& cases = goldens().at("cases");
  ASSERT_GE(cases.size(), 40u);
  for (const auto& c : cases) {
    SCOPED_TRACE("case " + c.at("name").get<std::string>());
    const auto got = run_case(c);
    const bool want = c.at("passed");
    EXPECT_EQ(static_cast<bool>(got), want) << "tdc says: " << got.message();
    if (want) continue;
    const std::string theirs = c.at("message");
    if (theirs == "AssertionError not raised") {
      EXPECT_THAT(got.message(), HasSubstr(theirs));
    } else {
      EXPECT_EQ(pytorch_part(got.message()), theirs);
    }
  }
}

// The line tdc adds: the first mismatching index and both values, in row-major order.
TEST(Comparison, NamesTheFirstMismatchWithBothValues) {
  const at::Tensor a = at::tensor({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, at::kFloat).reshape({2, 3});
  at::Tensor e = a.clone();
  e[0][2] = 3.5;
  e[1][1] = 9.0;
  const auto r = assert_close(a, e);
  ASSERT_FALSE(r);
  EXPECT_THAT(r.message(), HasSubstr("First mismatch at index (0, 2): actual 3.0, expected 3.5"));
  EXPECT_THAT(r.message(), HasSubstr("Greatest absolute difference: 4.0 at index (1, 1)"));
}

// NaN anywhere in a gradient, as a bug would put it, fails both PyTorch comparisons.
TEST(Comparison, NanAgainstANumberFailsUnderBothDefaults) {
  const at::Tensor ref = at::arange(8, at::kFloat);
  const at::Tensor bad = ref.clone().fill_(std::numeric_limits<float>::quiet_NaN());
  EXPECT_FALSE(assert_close(bad, ref));
  EXPECT_FALSE(assert_equal(bad, ref));
  EXPECT_FALSE(assert_equal(ref, bad));
}

TEST(Comparison, UndefinedTensors) {
  EXPECT_TRUE(assert_close(at::Tensor(), at::Tensor()));  // None == None
  const auto r = assert_close(at::Tensor(), at::ones({1}));
  ASSERT_FALSE(r);
  EXPECT_THAT(r.message(), HasSubstr("actual is None"));
}

TEST(Comparison, DefaultTolerancesArePyTorchsTable) {
  EXPECT_EQ(default_tolerances(at::kFloat, at::kFloat).rtol, 1.3e-6);
  EXPECT_EQ(default_tolerances(at::kFloat, at::kFloat).atol, 1e-5);
  EXPECT_EQ(default_tolerances(at::kBFloat16, at::kFloat).rtol, 1.6e-2);  // the looser of the two
  EXPECT_EQ(default_tolerances(at::kDouble, at::kDouble).atol, 1e-7);
  EXPECT_EQ(default_tolerances(at::kLong, at::kBool).rtol, 0.0);
}

TEST(Comparison, TorchAllcloseRefusesTwoDtypes) {
  EXPECT_TRUE(torch_allclose(at::ones({2}), at::ones({2}) + 1e-6));
  EXPECT_FALSE(torch_allclose(at::ones({2}), at::ones({2}) + 1e-3));
  EXPECT_FALSE(torch_allclose(at::ones({2}), at::ones({2}, at::kDouble)));
}

}  // namespace
