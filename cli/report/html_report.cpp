// report.html: one self-contained page. [Note: the report's DOM contract] Tests (the CTest
// tdc_report_browser_test, docs/reports.md) read the page through these stable hooks, so keep
// them when restyling:
//   table#runs-table tr.run[data-run]                one row per run
//   #seed-total[data-count]                          rows of the seed table (102)
//   .seed-pass[data-run][data-count]                 seed rows that PASS in a run
//   table#matrix th.run[data-run][data-implementation][data-backend][data-device][data-launcher]
//   tr.file-row[data-file] / tr.class-row[data-file][data-class]
//       td.count[data-run][data-pass][data-total]    per-file / per-class passes
//   tr.test-row[data-test][data-seed] td.cell[data-run][data-status]
//       a[href="#msg-r<run>-t<index>"]               every non-PASS result links to its message
//   #msg-r<run>-t<index>.message-block pre.message, pre.log-excerpt
//   #diff ul#regressions / ul#new-passes li[data-test], table#status-changes tr[data-test]
//   table#flaky-table tr.flaky[data-run][data-test]
//   #parity .scenario[data-scenario][data-verdict] svg.loss-chart polyline.series
// Everything is in the DOM without JavaScript; the one script only adds a "failures only" filter.
#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "report/html.h"
#include "report/log_excerpt.h"
#include "report/report_model.h"
#include "report/svg_plot.h"

namespace tdc::cli {

namespace {

using harness::TestResult;

constexpr int kHtmlMaxMessageLines = 400;
constexpr int kLogExcerptLines = 40;

constexpr const char* kStyle = R"(
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 24px 40px; color: #1d2330; }
h1 { font-size: 22px; margin: 18px 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #d5d9e0; }
h3 { font-size: 15px; margin: 16px 0 6px; }
.meta, .note { color: #5a6270; } nav a { margin-right: 14px; }
table { border-collapse: collapse; } th, td { padding: 2px 8px; text-align: left; vertical-align: top; }
table.grid td, table.grid th { border: 1px solid #dde1e7; }
#runs-table td.file code { word-break: break-all; font-size: 11px; }
#matrix thead th { position: sticky; top: 0; background: #f4f6f9; z-index: 1; }
#matrix th.run { font-weight: normal; font-size: 12px; min-width: 120px; }
#matrix th.run b { font-size: 14px; }
tr.file-row th, tr.file-row td { background: #e4e8ef; font-weight: bold; }
tr.class-row th, tr.class-row td { background: #f1f3f7; }
tr.test-row th { font-weight: normal; padding-left: 24px; font-family: ui-monospace, monospace; font-size: 12px; }
td.cell { text-align: center; font-size: 12px; font-weight: 600; }
td.cell a { color: inherit; }
td[data-status=PASS] { background: #c8e6c9; color: #1b5e20; }
td[data-status=FAIL], td[data-status=XPASS] { background: #ffcdd2; color: #b71c1c; }
td[data-status=TIMEOUT], td[data-status=CRASH] { background: #ef9a9a; color: #7f0000; }
td[data-status=FLAKY] { background: #e1bee7; color: #4a148c; }
td[data-status=SKIP] { background: #eceff1; color: #455a64; }
td[data-status=NOT_SUPPORTED] { background: #fff9c4; color: #6d5d00; }
td[data-status=XFAIL] { background: #ffe0b2; color: #8a4b00; }
td[data-status=NOT_IMPLEMENTED], td[data-status=NOT_RUN] { color: #9aa1ad; font-weight: normal; }
.badge { display: inline-block; padding: 0 6px; border-radius: 3px; font-weight: 600; font-size: 12px; }
.badge.PASS { background: #c8e6c9; color: #1b5e20; } .badge.FAIL, .badge.ERROR { background: #ffcdd2; color: #b71c1c; }
.badge.NOT_SUPPORTED { background: #fff9c4; color: #6d5d00; }
.big { font-size: 20px; font-weight: bold; }
.cards { display: flex; gap: 16px; flex-wrap: wrap; } .card { border: 1px solid #d5d9e0; border-radius: 6px; padding: 8px 12px; }
li.regression { color: #b71c1c; } li.new-pass { color: #1b5e20; }
.scenario { border: 1px solid #d5d9e0; border-radius: 6px; padding: 8px 12px; margin: 10px 0; }
.charts { display: flex; gap: 12px; flex-wrap: wrap; }
svg.chart { background: #fff; } svg .plot-area { fill: #fafbfc; stroke: #c9ced6; }
svg .grid { stroke: #e6e9ee; } svg .tick, svg .legend, svg .axis-label { font-size: 11px; fill: #5a6270; }
svg .chart-title { font-size: 13px; font-weight: 600; fill: #1d2330; }
svg polyline.series { fill: none; stroke-width: 2; } svg line.legend-line { stroke-width: 2; }
svg .tdc { stroke: #1565c0; fill: #1565c0; } svg polyline.tdc { fill: none; }
svg .pytorch { stroke: #ef6c00; fill: #ef6c00; } svg polyline.pytorch { fill: none; stroke-dasharray: 6 4; }
.message-block { border-left: 4px solid #e57373; padding: 2px 12px; margin: 12px 0; }
.message-block:target { background: #fff8e1; }
pre { background: #f6f8fa; padding: 8px; overflow-x: auto; white-space: pre-wrap; font-size: 12px; margin: 4px 0; }
)";

// Hides rows whose runs all passed or had nothing, when the box is ticked.
constexpr const char* kScript = R"(
document.body.dataset.js = "ready";
document.getElementById("failures-only").addEventListener("change", function (e) {
  document.querySelectorAll("#matrix tr.test-row").forEach(function (tr) {
    tr.hidden = e.target.checked && tr.dataset.attention !== "1";
  });
});
)";

std::string attr(const std::string& name, const std::string& value) {
  return fmt::format(" {}=\"{}\"", name, html_escape(value));
}

std::string run_title(const ReportRun& run) {
  const auto& i = run.results.run_info;
  return fmt::format("{} {} / {} / {} / {}", run.label, i.implementation, i.backend, i.device, i.launcher);
}

// "2.14.1 (CUDA 13.0, NCCL 2.30.7; GNU 12.2.0)": the LibTorch a run was built against.
std::string libtorch_label(const harness::RunInfo& i) {
  std::vector<std::string> parts;
  if (!i.libtorch_cuda.empty()) parts.push_back("CUDA " + i.libtorch_cuda);
  if (!i.nccl_version.empty()) parts.push_back("NCCL " + i.nccl_version);
  std::string label = i.libtorch_version;
  if (!parts.empty()) label += " (" + fmt::format("{}", fmt::join(parts, ", ")) + ")";
  if (!i.compiler.empty()) label += "; " + i.compiler;
  return label;
}

std::string section_runs(const ReportInput& in) {
  std::string out =
      "<section id=\"runs\"><h2>Runs</h2>\n<table id=\"runs-table\" class=\"grid\"><thead><tr><th>run</th>"
      "<th>implementation</th><th>backend</th><th>device</th><th>launcher</th><th>world</th><th>host</th>"
      "<th>started</th><th>revision</th><th>libtorch</th><th>tests</th><th>statuses</th><th>file</th></tr></thead>"
      "<tbody>\n";
  for (size_t r = 0; r < in.runs.size(); ++r) {
    const auto& run = in.runs[r];
    const auto& i = run.results.run_info;
    std::string statuses;
    for (auto [status, n] : run.results.counts())
      if (n) statuses += fmt::format("{}{} {}", statuses.empty() ? "" : ", ", harness::to_string(status), n);
    std::string impl = i.implementation + (i.implementation_version.empty() ? "" : " " + i.implementation_version);
    out += fmt::format(
        "<tr class=\"run\" data-run=\"{}\"><th>{}</th><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td "
        "class=\"file\"><code>{}</code></td></tr>\n",
        r, html_escape(run.label), html_escape(impl), html_escape(i.backend), html_escape(i.device),
        html_escape(run_launcher_label(run.results)), i.world_size, html_escape(i.host), html_escape(i.started_at),
        html_escape(i.suite_revision), html_escape(libtorch_label(i)), run.results.tests.size(), html_escape(statuses),
        html_escape(run.results_path.string()));
  }
  return out + "</tbody></table></section>\n";
}

std::string section_summary(const ReportInput& in, const Matrix& m) {
  std::string out = fmt::format(
      "<section id=\"summary\"><h2>Seed tests</h2>\n<p>The seed: every test of the five PyTorch seed files, as "
      "listed in <code>{}</code>: <span id=\"seed-total\" class=\"big\" data-count=\"{}\">{}</span> tests.</p>\n"
      "<div class=\"cards\">\n",
      html_escape(in.seed.source()), m.seed_total, m.seed_total);
  for (size_t r = 0; r < m.runs; ++r) {
    std::string rest;
    for (const auto& [status, n] : m.seed_status_counts[r])
      if (status != "PASS") rest += fmt::format("{}{} {}", rest.empty() ? "" : ", ", status_label(status), n);
    out += fmt::format(
        "<div class=\"card\"><b>{}</b><br><span class=\"seed-pass big\" data-run=\"{}\" data-count=\"{}\">{}</span>"
        " / {} pass<br><span class=\"note\">{}</span></div>\n",
        html_escape(in.runs[r].label), r, m.seed_passes[r], m.seed_passes[r], m.seed_total, html_escape(rest));
  }
  return out + "</div></section>\n";
}

std::string count_cells(const std::vector<int>& passes, size_t total) {
  std::string out;
  for (size_t r = 0; r < passes.size(); ++r)
    out += fmt::format("<td class=\"count\" data-run=\"{}\" data-pass=\"{}\" data-total=\"{}\">{}/{}</td>", r,
                       passes[r], total, passes[r], total);
  return out;
}

std::string matrix_cell(const MatrixRow& row, size_t r) {
  std::string status = row.status(r);
  const TestResult* t = row.cells[r].result;
  std::string label = html_escape(status_label(status));
  if (t && t->status != harness::Status::Pass)
    label = fmt::format("<a href=\"#{}\">{}</a>", message_anchor(r, row.cells[r].index), label);
  std::string title = t ? t->id + (t->repeat_statuses.size() > 1 ? " (repeats differ)" : "") : "";
  return fmt::format("<td class=\"cell\" data-run=\"{}\" data-status=\"{}\"{}>{}</td>", r, status,
                     title.empty() ? "" : attr("title", title), label);
}

std::string section_matrix(const ReportInput& in, const Matrix& m) {
  std::string out =
      "<section id=\"matrix-section\"><h2>Tests &#215; runs</h2>\n<p class=\"note\">Rows: the seed tests grouped by "
      "PyTorch file and class (PyTorch's names; a run on another device, e.g. <code>…CPU.…_cpu</code>, fills the "
      "<code>…CUDA.…_cuda</code> row), then tests outside the seed. Each non-PASS cell links to its message. "
      "<label><input type=\"checkbox\" id=\"failures-only\"> rows with a non-PASS result only</label></p>\n"
      "<table id=\"matrix\" class=\"grid\"><thead><tr><th>test</th>";
  for (size_t r = 0; r < in.runs.size(); ++r) {
    const auto& i = in.runs[r].results.run_info;
    out += fmt::format("<th class=\"run\" data-run=\"{}\"{}{}{}{}><b>{}</b><br>{}<br>{} / {} / {}</th>", r,
                       attr("data-implementation", i.implementation), attr("data-backend", i.backend),
                       attr("data-device", i.device), attr("data-launcher", i.launcher), html_escape(in.runs[r].label),
                       html_escape(i.implementation), html_escape(i.backend), html_escape(i.device),
                       html_escape(i.launcher));
  }
  out += "</tr></thead>\n";
  for (size_t g = 0; g < m.groups.size(); ++g) {
    const MatrixGroup& group = m.groups[g];
    bool new_file = g == 0 || m.groups[g - 1].file != group.file;
    if (new_file) {  // the file's own row: passes over all its classes
      std::vector<int> passes(m.runs, 0);
      size_t total = 0;
      for (size_t h = g; h < m.groups.size() && m.groups[h].file == group.file; ++h) {
        total += m.groups[h].rows.size();
        for (size_t r = 0; r < m.runs; ++r) passes[r] += m.groups[h].passes[r];
      }
      std::string name = group.file.empty() ? "tests outside the seed table" : group.file;
      out += fmt::format("<tbody class=\"file\"{}><tr class=\"file-row\"{}><th>{}</th>{}</tr></tbody>\n",
                         attr("data-file", group.file), attr("data-file", group.file), html_escape(name),
                         count_cells(passes, total));
    }
    out += fmt::format("<tbody class=\"class\"{}{}><tr class=\"class-row\"{}{}><th>{}</th>{}</tr>\n",
                       attr("data-file", group.file), attr("data-class", group.cls), attr("data-file", group.file),
                       attr("data-class", group.cls), html_escape(group.cls),
                       count_cells(group.passes, group.rows.size()));
    for (const MatrixRow& row : group.rows) {
      bool attention = false;
      for (size_t r = 0; r < m.runs; ++r)
        attention |= row.cells[r].result && row.cells[r].result->status != harness::Status::Pass;
      out += fmt::format("<tr class=\"test-row\"{} data-seed=\"{}\" data-attention=\"{}\"><th>{}</th>",
                         attr("data-test", row.id), row.seed ? 1 : 0, attention ? 1 : 0, html_escape(row.name));
      for (size_t r = 0; r < m.runs; ++r) out += matrix_cell(row, r);
      out += "</tr>\n";
    }
    out += "</tbody>\n";
  }
  return out + "</table></section>\n";
}

std::string section_diff(const ReportInput& in, const Matrix& m) {
  if (in.runs.size() < 2)
    return "<section id=\"diff\" data-runs=\"1\"><h2>Diff</h2><p class=\"note\">One run: nothing to compare. "
           "Give two or more runs to see regressions, new passes and status changes (first against last)."
           "</p></section>\n";
  size_t first = 0, last = in.runs.size() - 1;
  std::vector<Change> changes = diff_runs(m, first, last);
  auto list = [&](ChangeKind kind, const char* id, const char* cls) {
    std::string items;
    for (const Change& c : changes)
      if (c.kind == kind)
        items +=
            fmt::format("<li class=\"{}\"{}><code>{}</code>: {} &#8594; {}</li>\n", cls, attr("data-test", c.id),
                        html_escape(c.id), html_escape(status_label(c.before)), html_escape(status_label(c.after)));
    if (items.empty()) items = "<li class=\"none\">none</li>\n";
    return fmt::format("<ul id=\"{}\">\n{}</ul>\n", id, items);
  };
  std::string out = fmt::format(
      "<section id=\"diff\" data-first=\"{}\" data-last=\"{}\"><h2>Diff: {} &#8594; {}</h2>\n<p class=\"note\">"
      "Regression: a result that was not a failure became one. New pass: PASS now, anything else before. "
      "Everything else that differs is a status change.</p>\n",
      first, last, html_escape(run_title(in.runs[first])), html_escape(run_title(in.runs[last])));
  out += "<h3>Regressions</h3>\n" + list(ChangeKind::Regression, "regressions", "regression");
  out += "<h3>New passes</h3>\n" + list(ChangeKind::NewPass, "new-passes", "new-pass");
  out += "<h3>Other status changes</h3>\n<table id=\"status-changes\" class=\"grid\"><thead><tr><th>test</th><th>" +
         html_escape(in.runs[first].label) + "</th><th>" + html_escape(in.runs[last].label) + "</th></tr></thead>\n";
  int n = 0;
  for (const Change& c : changes)
    if (c.kind == ChangeKind::StatusChange) {
      ++n;
      out += fmt::format("<tr{}><td><code>{}</code></td><td>{}</td><td>{}</td></tr>\n", attr("data-test", c.id),
                         html_escape(c.id), html_escape(status_label(c.before)), html_escape(status_label(c.after)));
    }
  if (n == 0) out += "<tr class=\"none\"><td colspan=\"3\">none</td></tr>\n";
  return out + "</table></section>\n";
}

std::string repeat_text(const std::map<std::string, int>& statuses) {
  std::string out;
  for (const auto& [status, n] : statuses) out += fmt::format("{}{} &#215;{}", out.empty() ? "" : ", ", status, n);
  return out.empty() ? "(no repeat counts)" : out;
}

std::string section_flaky(const ReportInput& in) {
  std::vector<FlakyTest> flaky = flaky_tests(in.runs);
  std::string out =
      "<section id=\"flaky\"><h2>Flaky tests</h2>\n<p class=\"note\">Tests that ended with more than one status "
      "over <code>tdc run --repeat N</code>.</p>\n<table id=\"flaky-table\" class=\"grid\"><thead><tr><th>run</th>"
      "<th>test</th><th>statuses over the repeats</th></tr></thead>\n";
  for (const FlakyTest& f : flaky)
    out += fmt::format(
        "<tr class=\"flaky\" data-run=\"{}\"{}><td>{}</td><td><a "
        "href=\"#{}\"><code>{}</code></a></td><td>{}</td></tr>\n",
        f.run, attr("data-test", f.id), html_escape(in.runs[f.run].label), message_anchor(f.run, f.index),
        html_escape(f.id), repeat_text(f.statuses));
  if (flaky.empty()) out += "<tr class=\"none\"><td colspan=\"3\">none</td></tr>\n";
  return out + "</table></section>\n";
}

std::string parity_scenario(const ParityScenario& s) {
  std::string attrs = attr("data-scenario", s.name);
  std::string out = fmt::format(
      "<div class=\"scenario\"{}{}><h3>{} <span class=\"badge {}\">{}</span></h3>\n<p>{}</p>\n"
      "<p class=\"note\">world size {}; recipe: {}; tolerance rtol {} atol {}: {}</p>\n",
      attrs, attr("data-verdict", s.verdict), html_escape(s.name), html_escape(s.verdict), html_escape(s.verdict),
      html_escape(s.description), s.world_size, html_escape(s.recipe), report_number(s.rtol), report_number(s.atol),
      html_escape(s.tolerance_why));
  if (!s.message.empty()) out += "<pre class=\"parity-message\">" + html_escape(s.message) + "</pre>\n";
  if (s.verdict == "NOT_SUPPORTED") return out + "</div>\n";  // neither side ran: nothing to chart
  out += "<div class=\"charts\">\n";
  out += line_chart_svg("loss: " + s.name, "loss", {{"tdc", "tdc", s.loss_tdc}, {"PyTorch", "pytorch", s.loss_pytorch}},
                        "loss-chart", attrs);
  if (!s.grad_norm_tdc.empty() || !s.grad_norm_pytorch.empty())
    out += line_chart_svg("gradient norm: " + s.name, "grad norm",
                          {{"tdc", "tdc", s.grad_norm_tdc}, {"PyTorch", "pytorch", s.grad_norm_pytorch}},
                          "grad-norm-chart", attrs);
  out +=
      "</div>\n<table class=\"grid per-step\"><thead><tr><th>step</th><th>tdc loss</th><th>PyTorch loss</th>"
      "<th>max relative difference</th></tr></thead>\n";
  size_t steps = std::max({s.loss_tdc.size(), s.loss_pytorch.size(), s.max_rel_diff_per_step.size()});
  auto at = [](const std::vector<double>& v, size_t i) {
    return i < v.size() ? report_number(v[i]) : std::string("n/a");
  };
  for (size_t i = 0; i < steps; ++i)
    out += fmt::format("<tr data-step=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td class=\"rel-diff\">{}</td></tr>\n", i,
                       i, at(s.loss_tdc, i), at(s.loss_pytorch, i), at(s.max_rel_diff_per_step, i));
  out += "</table>\n";
  if (s.has_max_param_rel_diff)
    out += fmt::format("<p>largest relative parameter difference after training: <b>{}</b></p>\n",
                       report_number(s.max_param_rel_diff));
  return out + "</div>\n";
}

std::string section_parity(const ReportInput& in) {
  std::string out = "<section id=\"parity\"><h2>Parity with PyTorch</h2>\n";
  if (in.parity.empty())
    return out +
           "<p class=\"note\">No parity file (<code>--parity FILE</code>, or <code>parity.json</code> next to "
           "a run's results.json).</p></section>\n";
  for (const ParityRun& p : in.parity) {
    std::string machine;
    for (const auto& [k, v] : p.machine) machine += fmt::format("{}{}: {}", machine.empty() ? "" : ", ", k, v);
    out += fmt::format("<p class=\"meta\"><code>{}</code>, created {}{}{}</p>\n", html_escape(p.source.string()),
                       html_escape(p.created), machine.empty() ? "" : "; ", html_escape(machine));
    for (const ParityScenario& s : p.scenarios) out += parity_scenario(s);
  }
  return out + "</section>\n";
}

std::string truncated(const std::string& message) {
  size_t cut = 0;
  for (int k = 0; k < kHtmlMaxMessageLines; ++k) {
    cut = message.find('\n', cut);
    if (cut == std::string::npos) return message;
    ++cut;
  }
  return message.substr(0, cut) + "... (message truncated; the whole message is in results.json)\n";
}

std::string section_messages(const ReportInput& in) {
  std::string out =
      "<section id=\"messages\"><h2>Messages</h2>\n<p class=\"note\">Every result that is not PASS: its message and "
      "the part of its binary's log that belongs to it.</p>\n";
  int n = 0;
  for (size_t r = 0; r < in.runs.size(); ++r) {
    const ReportRun& run = in.runs[r];
    for (size_t k = 0; k < run.results.tests.size(); ++k) {
      const TestResult& t = run.results.tests[k];
      if (t.status == harness::Status::Pass) continue;
      ++n;
      std::string status = harness::to_string(t.status);
      out += fmt::format(
          "<div class=\"message-block\" id=\"{}\" data-run=\"{}\"{} data-status=\"{}\"><h3><span class=\"badge\">{}"
          "</span> <code>{}</code> <span class=\"note\">{}, {:.2f} s</span></h3>\n",
          message_anchor(r, static_cast<int>(k)), r, attr("data-test", t.id), status, status, html_escape(t.id),
          html_escape(run.label), t.duration_s);
      out += "<pre class=\"message\">" + html_escape(t.message.empty() ? "(no message)" : truncated(t.message)) +
             "</pre>\n";
      if (!t.expectation.empty()) out += "<p class=\"expectation\">" + html_escape(t.expectation) + "</p>\n";
      if (auto it = run.log_of.find(t.id); it != run.log_of.end()) {
        std::string excerpt = log_excerpt(it->second, t.id, kLogExcerptLines);
        if (!excerpt.empty())
          out += fmt::format(
              "<details class=\"log\" open><summary>log excerpt ({})</summary>"
              "<pre class=\"log-excerpt\">{}</pre></details>\n",
              html_escape(it->second.string()), html_escape(excerpt));
      }
      out += "</div>\n";
    }
  }
  if (n == 0) out += "<p class=\"none\">Every result passed.</p>\n";
  return out + "</section>\n";
}

}  // namespace

// [Note: rank reports]: what each run's implementation reported (e.g. comm_ops).
std::string section_reports(const ReportInput& in) {
  std::string rows;
  for (const auto& run : in.runs)
    for (const auto& [name, report] : run.results.reports)
      for (const auto& [key, values] : report)
        rows +=
            fmt::format("<tr><th>{}</th><td>{}</td><td>{}</td><td>{}</td></tr>\n", html_escape(run.label),
                        html_escape(name), html_escape(key), html_escape(fmt::format("{}", fmt::join(values, ", "))));
  if (rows.empty())
    return "<section id=\"reports\"><h2>Reports</h2>\n<p>The implementation reported nothing from its ranks.</p>"
           "</section>\n";
  return "<section id=\"reports\"><h2>Reports</h2>\n<p>What the implementation reported from its ranks (comm_ops: "
         "per backend, the collectives it ran natively and those tdc emulated).</p>\n<table class=\"grid\"><thead>"
         "<tr><th>run</th><th>report</th><th>key</th><th>values</th></tr></thead><tbody>\n" +
         rows + "</tbody></table></section>\n";
}

std::string render_html(const ReportInput& in) {
  Matrix m = build_matrix(in.runs, in.seed);
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>tdc report</title>\n";
  out += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  out += std::string("<style>") + kStyle + "</style>\n</head>\n<body>\n";
  out += fmt::format("<h1>tdc conformance report</h1>\n<p class=\"meta\">{} run{}, generated {}</p>\n", in.runs.size(),
                     in.runs.size() == 1 ? "" : "s", html_escape(in.generated_at));
  out +=
      "<nav><a href=\"#runs\">runs</a><a href=\"#summary\">seed tests</a><a href=\"#matrix-section\">matrix</a>"
      "<a href=\"#diff\">diff</a><a href=\"#flaky\">flaky</a><a href=\"#parity\">parity</a>"
      "<a href=\"#reports\">reports</a><a href=\"#messages\">messages</a></nav>\n";
  out += section_runs(in);
  out += section_summary(in, m);
  out += section_diff(in, m);
  out += section_flaky(in);
  out += section_matrix(in, m);
  out += section_parity(in);
  out += section_reports(in);
  out += section_messages(in);
  out += std::string("<script>") + kScript + "</script>\n</body></html>\n";
  return out;
}

}  // namespace tdc::cli
