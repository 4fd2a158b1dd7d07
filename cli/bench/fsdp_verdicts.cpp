// The FSDP benchmark's ratios and verdicts (fsdp_verdicts.h).
#include "bench/fsdp_verdicts.h"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace tdc::cli::bench {

using ojson = nlohmann::ordered_json;

namespace {

double ratio_of(const ojson& c, const char* num, const char* den) {
  const double d = c.value(den, 0.0);
  return d > 0 ? c.value(num, 0.0) / d : 0.0;
}

}  // namespace

std::optional<std::pair<double, double>> round_extent(const ojson& c, const char* per_round_key) {
  if (!c.contains(per_round_key) || !c[per_round_key].is_array() || c[per_round_key].empty()) return std::nullopt;
  const std::vector<double> v = c[per_round_key].get<std::vector<double>>();
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return std::make_pair(*lo, *hi);
}

bool rounds_straddle(const ojson& c, const char* per_round_key, double target) {
  const auto extent = round_extent(c, per_round_key);
  return extent && extent->first <= target && extent->second > target;
}

void set_ratios_and_verdicts(ojson& out) {
  bool met = true, ddp_met = true;
  double worst = 0, ddp_worst = 0;
  ojson straddled = ojson::array(), ddp_straddled = ojson::array();
  for (auto& [model, worlds] : out["cases"].items()) {
    for (auto& [world, c] : worlds.items()) {
      const double ratio = ratio_of(c, "tdc_fsdp_step_ms", "pytorch_fsdp_step_ms");
      c["ratio"] = ratio;
      if (c.contains("tdc_fsdp_nochecks_step_ms"))
        c["ratio_nochecks"] = ratio_of(c, "tdc_fsdp_nochecks_step_ms", "pytorch_fsdp_step_ms");
      const double over_ddp = ratio_of(c, "tdc_fsdp_step_ms", "ddp_step_ms");
      c["fsdp_over_ddp"] = over_ddp;
      met = met && ratio > 0 && ratio <= 1.0;
      ddp_met = ddp_met && over_ddp > 0 && over_ddp <= kFsdpOverDdpTarget;
      worst = std::max(worst, ratio);
      ddp_worst = std::max(ddp_worst, over_ddp);
      if (rounds_straddle(c, "ratio_per_round", 1.0)) straddled.push_back(model + "/" + world);
      if (rounds_straddle(c, "fsdp_over_ddp_per_round", kFsdpOverDdpTarget))
        ddp_straddled.push_back(model + "/" + world);
    }
  }
  out["target"] = "tdc_fsdp_step_ms <= pytorch_fsdp_step_ms in every case (ratio <= 1)";
  out["target_met"] = met;
  out["worst_ratio"] = worst;
  out["target_straddled"] = straddled;
  out["ddp_target"] = fmt::format("tdc_fsdp_step_ms <= {} * ddp_step_ms in every case (fsdp_over_ddp <= {})",
                                  kFsdpOverDdpTarget, kFsdpOverDdpTarget);
  out["ddp_target_met"] = ddp_met;
  out["worst_fsdp_over_ddp"] = ddp_worst;
  out["ddp_target_straddled"] = ddp_straddled;
}

}  // namespace tdc::cli::bench
