// tdc's side of a parity scenario, one rank at a time: build the model from the inputs file
// (initial weights + data written by tools/parity/run_scenario.py), parallelize it as the recipe
// says, train, and record what the trace needs. Mirrors run_scenario.py function for function
// (build, train_step, grad_squares, param_checksums, resume, merge), so that both sides do the
// same arithmetic in the same order.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tdc/parity/scenario.h"
#include "tdc/parity/trace.h"

namespace tdc::parity {

// What one rank saw: its local loss per step (none on pipeline ranks without the last stage),
// per step the squared norm of each full gradient it holds, and its parameters' checksums.
struct RankResult {
  std::vector<std::optional<double>> losses;
  std::vector<std::map<std::string, double>> grad_sq;
  std::map<std::string, Checksums> params;
};
nlohmann::json to_json(const RankResult& r);
RankResult rank_result_from_json(const nlohmann::json& j);

// Runs on every rank (tdc::conformance::world() is the default group). `work_dir` is shared by
// the ranks (the checkpoint of checkpoint_resume_at goes there).
RankResult train_rank(const Scenario& scenario, const std::filesystem::path& inputs_file,
                      const std::filesystem::path& work_dir);

// The trace from every rank's result ([Note: parity trace merge] in train.cpp).
Trace merge_ranks(const Scenario& scenario, const std::vector<RankResult>& ranks, const std::string& version);

}  // namespace tdc::parity
