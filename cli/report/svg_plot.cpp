// Inline SVG line charts.
#include "report/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "report/html.h"

namespace tdc::cli {

namespace {

// Tick label: short and exact enough to tell curves apart (losses differ in late digits).
std::string tick(double v) { return fmt::format("{:.4g}", v); }

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (!std::isfinite(v)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return lo > hi; }
  // A flat curve still gets a visible band around it.
  void pad() {
    double span = hi - lo;
    double margin = span > 0 ? span * 0.08 : (std::abs(lo) > 0 ? std::abs(lo) * 0.05 : 1.0);
    lo -= margin;
    hi += margin;
  }
};

}  // namespace

std::string line_chart_svg(const std::string& title, const std::string& y_label, const std::vector<Series>& series,
                           const std::string& css_class, const std::string& attributes, int width, int height) {
  const double left = 70, right = 16, top = 30, bottom = 40;
  const double pw = width - left - right, ph = height - top - bottom;
  Range y;
  size_t steps = 0;
  for (const auto& s : series) {
    for (double v : s.values) y.add(v);
    steps = std::max(steps, s.values.size());
  }
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart {}\" {} width=\"{}\" height=\"{}\" "
      "viewBox=\"0 0 {} {}\" role=\"img\" aria-label=\"{}\">\n<title>{}</title>\n",
      css_class, attributes, width, height, width, height, html_escape(title), html_escape(title));
  out += fmt::format("<text class=\"chart-title\" x=\"{}\" y=\"18\">{}</text>\n", left, html_escape(title));
  out += fmt::format("<rect class=\"plot-area\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>\n", left, top, pw, ph);
  if (y.empty() || steps == 0) {
    out += fmt::format("<text class=\"no-data\" x=\"{}\" y=\"{}\">no data</text>\n</svg>\n", left + pw / 2 - 25,
                       top + ph / 2);
    return out;
  }
  y.pad();
  auto px = [&](size_t i) { return left + (steps > 1 ? pw * static_cast<double>(i) / (steps - 1) : pw / 2); };
  auto py = [&](double v) { return top + ph * (y.hi - v) / (y.hi - y.lo); };
  // Axes: 5 y ticks, x ticks at every step up to 12 steps, else about 8.
  for (int k = 0; k <= 4; ++k) {
    double v = y.lo + (y.hi - y.lo) * k / 4;
    out += fmt::format(
        "<line class=\"grid\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"/>"
        "<text class=\"tick y-tick\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n",
        left, py(v), left + pw, py(v), left - 6, py(v) + 4, tick(v));
  }
  size_t every = steps <= 12 ? 1 : (steps + 7) / 8;
  for (size_t i = 0; i < steps; i += every)
    out += fmt::format("<text class=\"tick x-tick\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                       px(i), top + ph + 16, i);
  out += fmt::format("<text class=\"axis-label\" x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">step</text>\n",
                     left + pw / 2, height - 4);
  out += fmt::format(
      "<text class=\"axis-label\" transform=\"translate(14 {:.1f}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
      top + ph / 2, html_escape(y_label));
  // Series, then the legend.
  for (size_t s = 0; s < series.size(); ++s) {
    std::string points;
    int n = 0;
    for (size_t i = 0; i < series[s].values.size(); ++i) {
      double v = series[s].values[i];
      if (!std::isfinite(v)) continue;
      points += fmt::format("{}{:.2f},{:.2f}", n++ ? " " : "", px(i), py(v));
    }
    std::string cls = html_escape(series[s].css_class);
    out += fmt::format("<polyline class=\"series {}\" data-points=\"{}\" points=\"{}\"/>\n", cls, n, points);
    if (steps <= 40)
      for (size_t i = 0; i < series[s].values.size(); ++i)
        if (std::isfinite(series[s].values[i]))
          out += fmt::format("<circle class=\"point {}\" cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"{}\"/>\n", cls, px(i),
                             py(series[s].values[i]), s == 0 ? 4 : 2.5);
    double lx = left + pw - 150, ly = top + 14 + 16 * static_cast<double>(s);
    out += fmt::format(
        "<line class=\"legend-line series {}\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"/>"
        "<text class=\"legend\" x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n",
        cls, lx, ly, lx + 24, ly, lx + 30, ly + 4, html_escape(series[s].name));
  }
  out += "</svg>\n";
  return out;
}

}  // namespace tdc::cli
