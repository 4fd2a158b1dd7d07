// report.md: the same report as report.html in Markdown (for a pull request, an issue, a terminal).
// Loss curves are only in the HTML; here each scenario has its per-step table.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "report/report_model.h"

namespace tdc::cli {

namespace {

using harness::TestResult;

constexpr int kMarkdownMaxMessageLines = 60;

// A table cell: one line, pipes escaped.
std::string cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|')
      out += "\\|";
    else if (c == '\n')
      out += ' ';
    else if (c != '\r')
      out += c;
  }
  return out;
}

// A fenced block that the text cannot close: a fence longer than any backtick run in it.
std::string fenced(const std::string& text) {
  size_t longest = 0, run = 0;
  for (char c : text) {
    run = c == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  std::string fence(std::max<size_t>(3, longest + 1), '`');
  std::string body = text;
  if (body.empty() || body.back() != '\n') body += '\n';
  return fence + "text\n" + body + fence + "\n";
}

std::string first_lines(const std::string& text, int lines) {
  size_t cut = 0;
  for (int k = 0; k < lines; ++k) {
    cut = text.find('\n', cut);
    if (cut == std::string::npos) return text;
    ++cut;
  }
  return text.substr(0, cut) + "... (truncated; see report.html or results.json)\n";
}

std::string runs_table(const ReportInput& in) {
  std::string out =
      "## Runs\n\n| run | implementation | backend | device | launcher | world | host | started | revision | "
      "tests | statuses | file |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const ReportRun& run : in.runs) {
    const auto& i = run.results.run_info;
    std::string statuses;
    for (auto [status, n] : run.results.counts())
      if (n) statuses += fmt::format("{}{} {}", statuses.empty() ? "" : ", ", harness::to_string(status), n);
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | `{}` |\n", cell(run.label),
                       cell(i.implementation), cell(i.backend), cell(i.device), cell(run_launcher_label(run.results)),
                       i.world_size, cell(i.host), cell(i.started_at), cell(i.suite_revision), run.results.tests.size(),
                       cell(statuses), cell(run.results_path.string()));
  }
  return out + "\n";
}

std::string seed_summary(const ReportInput& in, const Matrix& m) {
  std::string out = fmt::format("## Seed tests\n\n**{}** seed tests (`{}`).\n\n", m.seed_total, in.seed.source());
  for (size_t r = 0; r < m.runs; ++r) {
    std::string rest;
    for (const auto& [status, n] : m.seed_status_counts[r])
      if (status != "PASS") rest += fmt::format(", {} {}", status_label(status), n);
    out += fmt::format("- {}: **{} / {}** pass{}\n", in.runs[r].label, m.seed_passes[r], m.seed_total, rest);
  }
  return out + "\n";
}

std::string diff_section(const ReportInput& in, const Matrix& m) {
  if (in.runs.size() < 2) return "## Diff\n\nOne run: nothing to compare.\n\n";
  size_t last = in.runs.size() - 1;
  std::vector<Change> changes = diff_runs(m, 0, last);
  std::string out = fmt::format("## Diff: {} → {}\n\n", in.runs[0].label, in.runs[last].label);
  auto list = [&](ChangeKind kind, const char* title) {
    std::string items;
    for (const Change& c : changes)
      if (c.kind == kind)
        items += fmt::format("- `{}`: {} → {}\n", c.id, status_label(c.before), status_label(c.after));
    return fmt::format("### {}\n\n{}\n", title, items.empty() ? "none\n" : items);
  };
  out += list(ChangeKind::Regression, "Regressions");
  out += list(ChangeKind::NewPass, "New passes");
  out += list(ChangeKind::StatusChange, "Other status changes");
  return out;
}

std::string flaky_section(const ReportInput& in) {
  std::string out = "## Flaky tests\n\n";
  std::vector<FlakyTest> flaky = flaky_tests(in.runs);
  if (flaky.empty()) return out + "none\n\n";
  out += "| run | test | statuses over the repeats |\n|---|---|---|\n";
  for (const FlakyTest& f : flaky) {
    std::string counts;
    for (const auto& [status, n] : f.statuses) counts += fmt::format("{}{} ×{}", counts.empty() ? "" : ", ", status, n);
    out += fmt::format("| {} | `{}` | {} |\n", cell(in.runs[f.run].label), f.id, counts);
  }
  return out + "\n";
}

std::string parity_section(const ReportInput& in) {
  std::string out = "## Parity with PyTorch\n\n";
  if (in.parity.empty()) return out + "No parity file.\n\n";
  for (const ParityRun& p : in.parity) {
    out +=
        fmt::format("From `{}`, created {}. Loss curves are drawn in report.html.\n\n", p.source.string(), p.created);
    out +=
        "| scenario | verdict | world | tolerance | max rel. diff (all steps) | max param rel. diff |\n"
        "|---|---|---|---|---|---|\n";
    for (const ParityScenario& s : p.scenarios) {
      double worst = 0;
      for (double v : s.max_rel_diff_per_step)
        if (std::isfinite(v)) worst = std::max(worst, v);
      out += fmt::format("| {} | **{}** | {} | rtol {} atol {} | {} | {} |\n", cell(s.name), s.verdict, s.world_size,
                         report_number(s.rtol), report_number(s.atol),
                         s.max_rel_diff_per_step.empty() ? "n/a" : report_number(worst),
                         s.has_max_param_rel_diff ? report_number(s.max_param_rel_diff) : "n/a");
    }
    out += "\n";
    for (const ParityScenario& s : p.scenarios) {
      out += fmt::format("### {}: {}\n\n{}\n\nTolerance: rtol {} atol {}: {}\n\n", s.name, s.verdict, s.description,
                         report_number(s.rtol), report_number(s.atol), s.tolerance_why);
      if (!s.message.empty()) out += fenced(s.message) + "\n";
      out += "| step | tdc loss | PyTorch loss | max relative difference |\n|---|---|---|---|\n";
      size_t steps = std::max({s.loss_tdc.size(), s.loss_pytorch.size(), s.max_rel_diff_per_step.size()});
      auto at = [](const std::vector<double>& v, size_t i) {
        return i < v.size() ? report_number(v[i]) : std::string("n/a");
      };
      for (size_t i = 0; i < steps; ++i)
        out += fmt::format("| {} | {} | {} | {} |\n", i, at(s.loss_tdc, i), at(s.loss_pytorch, i),
                           at(s.max_rel_diff_per_step, i));
      out += "\n";
    }
  }
  return out;
}

std::string matrix_section(const ReportInput& in, const Matrix& m) {
  std::string header = "| test |", rule = "|---|";
  for (const ReportRun& run : in.runs) {
    const auto& i = run.results.run_info;
    header += fmt::format(" {}: {} / {} / {} / {} |", cell(run.label), cell(i.implementation), cell(i.backend),
                          cell(i.device), cell(i.launcher));
    rule += "---|";
  }
  std::string out = "## Tests × runs\n\n";
  for (size_t g = 0; g < m.groups.size(); ++g) {
    const MatrixGroup& group = m.groups[g];
    if (g == 0 || m.groups[g - 1].file != group.file) {
      if (g) out += "\n";
      out += fmt::format("### {}\n\n{}\n{}\n", group.file.empty() ? "Tests outside the seed table" : group.file, header,
                         rule);
    }
    out += fmt::format("| **{}** |", group.cls);
    for (size_t r = 0; r < m.runs; ++r) out += fmt::format(" **{}/{}** |", group.passes[r], group.rows.size());
    out += "\n";
    for (const MatrixRow& row : group.rows) {
      out += fmt::format("| `{}` |", row.name);
      for (size_t r = 0; r < m.runs; ++r) out += fmt::format(" {} |", status_label(row.status(r)));
      out += "\n";
    }
  }
  return out + "\n";
}

std::string messages_section(const ReportInput& in) {
  std::string out = "## Messages\n\n";
  int n = 0;
  for (const ReportRun& run : in.runs)
    for (const TestResult& t : run.results.tests) {
      if (t.status == harness::Status::Pass) continue;
      ++n;
      out += fmt::format("### {} `{}` ({})\n\n", harness::to_string(t.status), t.id, run.label);
      out += fenced(first_lines(t.message.empty() ? "(no message)" : t.message, kMarkdownMaxMessageLines)) + "\n";
      if (!t.expectation.empty()) out += t.expectation + "\n\n";
    }
  if (n == 0) out += "Every result passed.\n";
  return out;
}

}  // namespace

// [Note: rank reports]: what each run's implementation reported, e.g. comm_ops (which collectives
// each backend ran natively and which tdc emulated).
std::string reports_section(const ReportInput& in) {
  std::string rows;
  for (const auto& run : in.runs)
    for (const auto& [name, report] : run.results.reports)
      for (const auto& [key, values] : report)
        rows += fmt::format("| {} | {} | {} | {} |\n", cell(run.label), cell(name), cell(key),
                            cell(fmt::format("{}", fmt::join(values, ", "))));
  if (rows.empty()) return "";
  return "## Reports\n\nWhat the implementation reported from its ranks (comm_ops: per backend, the collectives it "
         "ran natively and those tdc emulated).\n\n| run | report | key | values |\n|---|---|---|---|\n" +
         rows + "\n";
}

std::string render_markdown(const ReportInput& in) {
  Matrix m = build_matrix(in.runs, in.seed);
  std::string out = fmt::format(
      "# tdc conformance report\n\n{} run{}, generated {}. The same report with loss "
      "curves and log excerpts: report.html.\n\n",
      in.runs.size(), in.runs.size() == 1 ? "" : "s", in.generated_at);
  out += runs_table(in);
  out += seed_summary(in, m);
  out += diff_section(in, m);
  out += flaky_section(in);
  out += parity_section(in);
  out += reports_section(in);
  out += matrix_section(in, m);
  out += messages_section(in);
  return out;
}

}  // namespace tdc::cli
