// Parity files (`tdc parity`'s output, schema "tdc-parity/1"): per scenario, tdc's and PyTorch's
// loss curves, the tolerance and the verdict. The report reads them; it never judges parity itself.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace tdc::cli {

struct ParityScenario {
  std::string name, description, recipe;
  int world_size = 0;
  double rtol = 0, atol = 0;
  std::string tolerance_why;
  std::string verdict;  // PASS, FAIL, ERROR or NOT_SUPPORTED (on this release)
  std::string message;
  // Per step; NaN where the file has null (a value JSON cannot carry).
  std::vector<double> loss_tdc, loss_pytorch, grad_norm_tdc, grad_norm_pytorch, max_rel_diff_per_step;
  double max_param_rel_diff = 0;
  bool has_max_param_rel_diff = false;
};

struct ParityRun {
  std::filesystem::path source;
  std::string created;
  std::vector<std::pair<std::string, std::string>> machine;  // its fields, values as text
  std::vector<ParityScenario> scenarios;
};

constexpr const char* kParitySchema = "tdc-parity/1";

// Throws std::runtime_error naming the file and the field ("scenarios[1].verdict: ...").
ParityRun read_parity(const std::filesystem::path& file);

}  // namespace tdc::cli
