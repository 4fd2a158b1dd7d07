// `tdc report RUN... --out DIR`: the report a person reads. DIR/report.html is one self-contained
// page (inline CSS and SVG, no network, readable without JavaScript); DIR/report.md says the same
// in Markdown. Both hold: the runs, the tests x runs matrix grouped by seed file and class, the
// diff of the first and last run, flaky tests, parity with PyTorch, and every non-PASS result's
// message and log excerpt. docs/reports.md describes how to read them.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "report/parity.h"
#include "report/seed_table.h"
#include "tdc/harness/results.h"

namespace tdc::cli {

struct ReportRun {
  std::string label;                   // "run 1", ...
  std::filesystem::path results_path;  // the results.json read
  harness::RunResults results;
  std::map<std::string, std::filesystem::path> log_of;  // test id -> the log of its binary
};

struct ReportInput {
  std::vector<ReportRun> runs;  // as given; the diff compares the first with the last
  SeedTable seed;
  std::vector<ParityRun> parity;
  std::string generated_at;  // ISO-8601 UTC
};

// A results.json written by `tdc run`, or the directory holding one; its logs from the logs/
// directory next to it. Throws std::runtime_error naming the path.
ReportRun load_run(const std::filesystem::path& file_or_dir, const std::string& label);

std::string render_html(const ReportInput& in);
std::string render_markdown(const ReportInput& in);

struct ReportFiles {
  std::filesystem::path html, markdown;
};
// Writes DIR/report.html and DIR/report.md (creating DIR; each file atomically).
ReportFiles write_report(const ReportInput& in, const std::filesystem::path& dir);

// The seed table of a checkout: SOURCE/docs/conformance-status.md.
std::filesystem::path seed_table_path(const std::filesystem::path& source_dir);

}  // namespace tdc::cli
