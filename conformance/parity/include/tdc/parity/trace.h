// Parity traces and their comparison. Both sides of a scenario (tdc's tdc_parity_runner and
// PyTorch's tools/parity/run_scenario.py) write one trace (schema "tdc-parity-trace/1",
// docs/results-schema.md): per step the loss and the gradient norm, and after the last step three
// checksums of every full (unsharded) parameter. compare_traces gives the scenario's verdict.
// Pure data (nlohmann-json only): tdc-cli uses it too.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tdc/parity/scenario.h"

namespace tdc::parity {

inline constexpr const char* kTraceSchema = "tdc-parity-trace/1";

struct StepRecord {
  int step = 0;
  double loss = 0, grad_norm = 0;
};

// Of the parameter's full float64 values: sum, sum of |x|, 2-norm.
struct Checksums {
  double sum = 0, abs_sum = 0, norm = 0;
};

struct Trace {
  std::string scenario, side, version;  // side: "tdc" or "pytorch"
  int world_size = 0;
  std::vector<StepRecord> steps;
  std::map<std::string, Checksums> params;  // FQN (PyTorch's, wrapper-free) -> checksums
};

nlohmann::ordered_json to_json(const Trace& trace);
// Throws std::runtime_error naming `where` (the file) and the field when the JSON is not a trace.
Trace trace_from_json(const nlohmann::json& j, const std::string& where);
Trace read_trace(const std::filesystem::path& file);
void write_trace(const std::filesystem::path& file, const Trace& trace);  // atomically

// [Note: parity verdict] A scenario passes when, with the scenario's tolerance,
//   - both traces have the same steps, and per step |loss_tdc - loss_pt| <= atol + rtol * |loss_pt|,
//     the same for the gradient norm;
//   - both have the same parameter FQNs, and per parameter abs_sum and norm pass the same test,
//     and the sum passes it with abs_sum as the scale (a sum near 0 by cancellation is judged
//     relative to the magnitude of the values, not to itself).
// The relative differences reported divide |diff| by the same scale (or by 1e-30 when it is 0).
struct Comparison {
  bool pass = false;
  std::string message;                        // the first failure, or the largest differences
  std::vector<double> max_rel_diff_per_step;  // max over loss and grad norm, per step
  double max_param_rel_diff = 0;              // max over every parameter and checksum
};
Comparison compare_traces(const Trace& tdc, const Trace& pytorch, const Tolerance& tolerance);

}  // namespace tdc::parity
