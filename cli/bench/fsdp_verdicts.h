// The verdicts of `tdc bench fsdp` and `tdc bench fsdp1`, from a merged JSON's step times: plain
// C++ on JSON, so that a unit test can check them (cli/tests/bench_verdicts_test.cpp).
//
// [Note: the FSDP benchmark's two targets] Each is a ratio of step times measured in the same run:
//   - `ratio` = tdc's FSDP step / PyTorch's (target <= 1: tdc is no slower than PyTorch);
//   - `fsdp_over_ddp` = tdc's FSDP step / tdc's DDP step on the same model, batch and world
//     (target <= 1.5, issue 28: FSDP that overlaps its communication as PyTorch's does on its
//     streams).
// A case with no measurement (a step time of 0) meets neither. A case whose rounds fall on both
// sides of a target is named with that target's verdict: the verdict depends on the run.
#pragma once

#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

namespace tdc::cli::bench {

inline constexpr double kFsdpOverDdpTarget = 1.5;

// The lowest and highest of the numbers in c[per_round_key]; nullopt when there are none.
std::optional<std::pair<double, double>> round_extent(const nlohmann::ordered_json& c, const char* per_round_key);

// Whether the numbers in c[per_round_key] fall on both sides of `target` (some <= it, some above).
bool rounds_straddle(const nlohmann::ordered_json& c, const char* per_round_key, double target);

// Sets every case's `ratio`, `ratio_nochecks` (when timed) and `fsdp_over_ddp` from its step times
// (a round's, or the medians over rounds: the ratios are always taken between the step times the
// file shows), and the file's `target*`, `worst_ratio`, `ddp_target*`, `worst_fsdp_over_ddp` and
// `*_straddled` (the cases, "model/world", whose `ratio_per_round` / `fsdp_over_ddp_per_round`
// straddle their target).
void set_ratios_and_verdicts(nlohmann::ordered_json& out);

}  // namespace tdc::cli::bench
