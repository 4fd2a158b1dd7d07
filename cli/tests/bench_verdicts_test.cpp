// The FSDP benchmark's ratios and verdicts ([Note: the FSDP benchmark's two targets],
// cli/bench/fsdp_verdicts.h): from step times to both verdicts, on made-up files.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "bench/fsdp_verdicts.h"

namespace tdc::cli::bench {
namespace {

using ojson = nlohmann::ordered_json;

// One case: step times in ms (0: not measured), and per-round FSDP / DDP when given.
ojson a_case(double ddp, double fsdp, double pytorch, std::vector<double> over_ddp_per_round = {}) {
  ojson c = {{"ddp_step_ms", ddp}, {"tdc_fsdp_step_ms", fsdp}, {"pytorch_fsdp_step_ms", pytorch}};
  if (!over_ddp_per_round.empty()) c["fsdp_over_ddp_per_round"] = over_ddp_per_round;
  return c;
}

ojson a_file(ojson mlp2, ojson tf2) {
  ojson out;
  out["cases"]["MLPStack"]["2"] = std::move(mlp2);
  out["cases"]["Transformer"]["2"] = std::move(tf2);
  return out;
}

TEST(BenchFsdpVerdicts, BothRatiosComeFromTheStepTimesTheFileShows) {
  ojson out = a_file(a_case(10, 14, 40), a_case(30, 33, 60));
  set_ratios_and_verdicts(out);
  EXPECT_DOUBLE_EQ(out["cases"]["MLPStack"]["2"]["fsdp_over_ddp"].get<double>(), 1.4);
  EXPECT_DOUBLE_EQ(out["cases"]["MLPStack"]["2"]["ratio"].get<double>(), 0.35);
  EXPECT_DOUBLE_EQ(out["cases"]["Transformer"]["2"]["fsdp_over_ddp"].get<double>(), 1.1);
  EXPECT_TRUE(out["target_met"].get<bool>());
  EXPECT_TRUE(out["ddp_target_met"].get<bool>());
  EXPECT_DOUBLE_EQ(out["worst_fsdp_over_ddp"].get<double>(), 1.4);
  EXPECT_DOUBLE_EQ(out["worst_ratio"].get<double>(), 0.55);
  EXPECT_FALSE(out["cases"]["MLPStack"]["2"].contains("ratio_nochecks"));  // not timed, not made up
}

TEST(BenchFsdpVerdicts, OneCaseOverATargetFailsThatTargetOnly) {
  ojson out = a_file(a_case(10, 16, 40), a_case(30, 33, 60));  // FSDP / DDP 1.6 on MLPStack
  set_ratios_and_verdicts(out);
  EXPECT_TRUE(out["target_met"].get<bool>());
  EXPECT_FALSE(out["ddp_target_met"].get<bool>());
  EXPECT_DOUBLE_EQ(out["worst_fsdp_over_ddp"].get<double>(), 1.6);

  out = a_file(a_case(10, 14, 40), a_case(30, 33, 30));  // tdc slower than PyTorch on the Transformer
  set_ratios_and_verdicts(out);
  EXPECT_FALSE(out["target_met"].get<bool>());
  EXPECT_TRUE(out["ddp_target_met"].get<bool>());
}

TEST(BenchFsdpVerdicts, TheTargetItselfMeetsIt) {
  ojson out = a_file(a_case(10, 15, 15), a_case(30, 45, 45));
  set_ratios_and_verdicts(out);
  EXPECT_TRUE(out["target_met"].get<bool>());
  EXPECT_TRUE(out["ddp_target_met"].get<bool>());
}

TEST(BenchFsdpVerdicts, ACaseWithoutAMeasurementMeetsNoTarget) {
  ojson out = a_file(a_case(0, 14, 40), a_case(30, 33, 0));  // no DDP step; no PyTorch step
  set_ratios_and_verdicts(out);
  EXPECT_FALSE(out["ddp_target_met"].get<bool>());
  EXPECT_FALSE(out["target_met"].get<bool>());
  EXPECT_DOUBLE_EQ(out["cases"]["MLPStack"]["2"]["fsdp_over_ddp"].get<double>(), 0.0);
}

TEST(BenchFsdpVerdicts, RoundsOnBothSidesOfATargetAreNamed) {
  ojson out = a_file(a_case(10, 14, 40, {1.26, 1.96, 1.47}), a_case(30, 33, 60, {1.2, 1.1}));
  set_ratios_and_verdicts(out);
  EXPECT_TRUE(out["ddp_target_met"].get<bool>());  // the medians' ratio, 1.4
  EXPECT_EQ(out["ddp_target_straddled"], ojson::array({"MLPStack/2"}));
  EXPECT_EQ(out["target_straddled"], ojson::array());
}

TEST(BenchFsdpVerdicts, StraddlingNeedsRoundsOnBothSides) {
  EXPECT_FALSE(rounds_straddle(ojson{{"r", {1.2, 1.5}}}, "r", 1.5));  // at the target meets it
  EXPECT_TRUE(rounds_straddle(ojson{{"r", {1.5, 1.51}}}, "r", 1.5));
  EXPECT_FALSE(rounds_straddle(ojson{{"r", {1.6, 1.7}}}, "r", 1.5));
  EXPECT_FALSE(rounds_straddle(ojson{{"r", ojson::array()}}, "r", 1.5));
  EXPECT_FALSE(rounds_straddle(ojson::object(), "r", 1.5));
}

}  // namespace
}  // namespace tdc::cli::bench
