// The matrix, the diff and the flaky tests.
#include "report/report_model.h"

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tdc::cli {

using harness::Status;
using harness::TestResult;

std::string MatrixRow::status(size_t run) const {
  const TestResult* r = cells.at(run).result;
  if (r) return harness::to_string(r->status);
  return seed ? kNotImplemented : kNotRun;
}

std::string message_anchor(size_t run, int index) { return fmt::format("msg-r{}-t{}", run, index); }

std::string status_label(const std::string& status) {
  if (status == kNotImplemented) return "not implemented";
  if (status == kNotRun) return "not run";
  return status;
}

std::string report_number(double v) { return std::isfinite(v) ? fmt::format("{:.6g}", v) : "n/a"; }

bool is_failure_status(const std::string& status) {
  try {
    return harness::is_failure(harness::status_from_string(status));
  } catch (const std::invalid_argument&) {
    return false;  // kNotImplemented, kNotRun
  }
}

namespace {

// Rows of tests outside the seed table, grouped by suite in order of first appearance.
struct OtherRows {
  std::vector<MatrixGroup> groups;
  std::map<std::string, std::pair<size_t, size_t>> where;  // id -> (group, row)

  MatrixRow& row(const std::string& id, const std::string& suite, const std::string& name, size_t runs) {
    if (auto it = where.find(id); it != where.end()) return groups[it->second.first].rows[it->second.second];
    size_t g = 0;
    while (g < groups.size() && groups[g].cls != suite) ++g;
    if (g == groups.size()) groups.push_back({"", suite, {}, std::vector<int>(runs, 0)});
    groups[g].rows.push_back({id, name, false, std::vector<Cell>(runs)});
    where[id] = {g, groups[g].rows.size() - 1};
    return groups[g].rows.back();
  }
};

}  // namespace

Matrix build_matrix(const std::vector<ReportRun>& runs, const SeedTable& seed) {
  Matrix m;
  m.runs = runs.size();
  m.seed_total = seed.tests().size();
  // Seed groups, in the table's order.
  std::vector<std::pair<size_t, size_t>> seed_pos;  // seed index -> (group, row)
  for (const SeedTest& t : seed.tests()) {
    if (m.groups.empty() || m.groups.back().file != t.file || m.groups.back().cls != t.cls)
      m.groups.push_back({t.file, t.cls, {}, std::vector<int>(runs.size(), 0)});
    m.groups.back().rows.push_back({t.id(), t.method, true, std::vector<Cell>(runs.size())});
    seed_pos.push_back({m.groups.size() - 1, m.groups.back().rows.size() - 1});
  }
  OtherRows others;
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto& tests = runs[r].results.tests;
    for (size_t k = 0; k < tests.size(); ++k) {
      Cell cell{&tests[k], static_cast<int>(k)};
      if (auto s = seed.find(tests[k].id)) {
        auto [g, row] = seed_pos[*s];
        Cell& c = m.groups[g].rows[row].cells[r];
        if (!c.result) {
          c = cell;
          continue;
        }  // a second result for the same row (two device instantiations in one run): keep it too
      }
      others.row(tests[k].id, tests[k].suite, tests[k].name, runs.size()).cells[r] = cell;
    }
  }
  for (auto& g : others.groups) m.groups.push_back(std::move(g));

  m.seed_passes.assign(runs.size(), 0);
  m.seed_with_result.assign(runs.size(), 0);
  m.seed_status_counts.assign(runs.size(), {});
  for (auto& g : m.groups)
    for (const auto& row : g.rows)
      for (size_t r = 0; r < runs.size(); ++r) {
        std::string st = row.status(r);
        if (st == "PASS") ++g.passes[r];
        if (!row.seed) continue;
        ++m.seed_status_counts[r][st];
        if (st == "PASS") ++m.seed_passes[r];
        if (row.cells[r].result) ++m.seed_with_result[r];
      }
  return m;
}

std::vector<Change> diff_runs(const Matrix& m, size_t first, size_t last) {
  std::vector<Change> out;
  for (const auto& g : m.groups)
    for (const auto& row : g.rows) {
      std::string before = row.status(first), after = row.status(last);
      if (before == after) continue;
      ChangeKind kind = ChangeKind::StatusChange;
      if (row.cells[first].result && !is_failure_status(before) && is_failure_status(after))
        kind = ChangeKind::Regression;
      else if (after == "PASS")
        kind = ChangeKind::NewPass;
      out.push_back({kind, row.id, before, after});
    }
  return out;
}

std::string run_launcher_label(const harness::RunResults& results) {
  const std::string& run = results.run_info.launcher;
  std::map<std::string, int> others;  // launcher -> tests that used it instead of the run's
  int distributed = 0;                // tests that used a launcher at all (not a plain TEST)
  for (const auto& t : results.tests) {
    if (t.launcher == "none" || t.launcher.empty()) continue;
    ++distributed;
    if (t.launcher != run) ++others[t.launcher];
  }
  if (others.empty()) return run;
  std::vector<std::string> parts;
  for (const auto& [launcher, n] : others)
    parts.push_back(fmt::format("{} of {} tests with {}", n, distributed, launcher));
  return fmt::format("{} ({})", run, fmt::join(parts, ", "));
}

std::vector<FlakyTest> flaky_tests(const std::vector<ReportRun>& runs) {
  std::vector<FlakyTest> out;
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto& tests = runs[r].results.tests;
    for (size_t k = 0; k < tests.size(); ++k)
      if (tests[k].status == Status::Flaky || tests[k].repeat_statuses.size() > 1)
        out.push_back({r, tests[k].id, tests[k].repeat_statuses, static_cast<int>(k)});
  }
  return out;
}

}  // namespace tdc::cli
