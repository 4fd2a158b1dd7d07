// Line charts as inline SVG (no script, no external resource): the report's loss curves.
#pragma once

#include <string>
#include <vector>

namespace tdc::cli {

struct Series {
  std::string name;            // legend text
  std::string css_class;       // class of its <polyline> ("tdc", "pytorch"): colours come from the page
  std::vector<double> values;  // y per step (x = 0, 1, ...); non-finite values are left out
};

// An <svg class="chart {css_class}"> of width x height px with axes, ticks, a legend and one
// <polyline class="series {series.css_class}" data-points="N"> per series (points drawn as
// circles when there are few). `attributes` is added to the <svg> element verbatim (escaped by
// the caller).
std::string line_chart_svg(const std::string& title, const std::string& y_label, const std::vector<Series>& series,
                           const std::string& css_class, const std::string& attributes, int width = 520,
                           int height = 260);

}  // namespace tdc::cli
