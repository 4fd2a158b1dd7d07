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

// The plot area of a chart and the maps from (step, value) to pixels.
struct Frame {
  double left = 70, right = 16, top = 30, bottom = 40, pw = 0, ph = 0;
  int height = 0;
  Range y;
  size_t steps = 0;
  double px(size_t i) const { return left + (steps > 1 ? pw * static_cast<double>(i) / (steps - 1) : pw / 2); }
  double py(double v) const { return top + ph * (y.hi - v) / (y.hi - y.lo); }
};

// Axes: 5 y ticks, x ticks at every step up to 12 steps, else about 8; both axis labels.
void append_axes(std::string& out, const Frame& f, const std::string& y_label) {
  for (int k = 0; k <= 4; ++k) {
    double v = f.y.lo + (f.y.hi - f.y.lo) * k / 4;
    out += fmt::format(
        "<line class=\"grid\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"/>"
        "<text class=\"tick y-tick\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n",
        f.left, f.py(v), f.left + f.pw, f.py(v), f.left - 6, f.py(v) + 4, tick(v));
  }
  size_t every = f.steps <= 12 ? 1 : (f.steps + 7) / 8;
  for (size_t i = 0; i < f.steps; i += every)
    out += fmt::format("<text class=\"tick x-tick\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                       f.px(i), f.top + f.ph + 16, i);
  out += fmt::format("<text class=\"axis-label\" x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">step</text>\n",
                     f.left + f.pw / 2, f.height - 4);
  out += fmt::format(
      "<text class=\"axis-label\" transform=\"translate(14 {:.1f}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
      f.top + f.ph / 2, html_escape(y_label));
}

// Series `s`: its polyline (non-finite values left out), its points (up to 40 steps), its legend.
void append_series(std::string& out, const Frame& f, const Series& series, size_t s) {
  std::string points;
  int n = 0;
  for (size_t i = 0; i < series.values.size(); ++i) {
    double v = series.values[i];
    if (!std::isfinite(v)) continue;
    points += fmt::format("{}{:.2f},{:.2f}", n++ ? " " : "", f.px(i), f.py(v));
  }
  std::string cls = html_escape(series.css_class);
  out += fmt::format("<polyline class=\"series {}\" data-points=\"{}\" points=\"{}\"/>\n", cls, n, points);
  if (f.steps <= 40)
    for (size_t i = 0; i < series.values.size(); ++i)
      if (std::isfinite(series.values[i]))
        out += fmt::format("<circle class=\"point {}\" cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"{}\"/>\n", cls, f.px(i),
                           f.py(series.values[i]), s == 0 ? 4 : 2.5);
  double lx = f.left + f.pw - 150, ly = f.top + 14 + 16 * static_cast<double>(s);
  out += fmt::format(
      "<line class=\"legend-line series {}\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"/>"
      "<text class=\"legend\" x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n",
      cls, lx, ly, lx + 24, ly, lx + 30, ly + 4, html_escape(series.name));
}

}  // namespace

std::string line_chart_svg(const std::string& title, const std::string& y_label, const std::vector<Series>& series,
                           const std::string& css_class, const std::string& attributes, int width, int height) {
  Frame f;
  f.pw = width - f.left - f.right;
  f.ph = height - f.top - f.bottom;
  f.height = height;
  for (const auto& s : series) {
    for (double v : s.values) f.y.add(v);
    f.steps = std::max(f.steps, s.values.size());
  }
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart {}\" {} width=\"{}\" height=\"{}\" "
      "viewBox=\"0 0 {} {}\" role=\"img\" aria-label=\"{}\">\n<title>{}</title>\n",
      css_class, attributes, width, height, width, height, html_escape(title), html_escape(title));
  out += fmt::format("<text class=\"chart-title\" x=\"{}\" y=\"18\">{}</text>\n", f.left, html_escape(title));
  out += fmt::format("<rect class=\"plot-area\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>\n", f.left, f.top, f.pw,
                     f.ph);
  if (f.y.empty() || f.steps == 0) {
    out += fmt::format("<text class=\"no-data\" x=\"{}\" y=\"{}\">no data</text>\n</svg>\n", f.left + f.pw / 2 - 25,
                       f.top + f.ph / 2);
    return out;
  }
  f.y.pad();
  append_axes(out, f, y_label);
  for (size_t s = 0; s < series.size(); ++s) append_series(out, f, series[s], s);  // then the legend, per series
  out += "</svg>\n";
  return out;
}

}  // namespace tdc::cli
