// What the report shows, computed once for both renderers: the tests x runs matrix, the diff of
// two runs and the flaky tests. Pure functions of the loaded runs and the seed table.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "report/report.h"

namespace tdc::cli {

// One run's result for one matrix row: nullptr when the run has no result for it.
struct Cell {
  const harness::TestResult* result = nullptr;
  int index = -1;  // position in the run's tests (names its message block)
};

// Statuses of cells without a result: a seed row no run implemented / a test this run lacks.
constexpr const char* kNotImplemented = "NOT_IMPLEMENTED";
constexpr const char* kNotRun = "NOT_RUN";

struct MatrixRow {
  std::string id;    // the seed row's PyTorch id, or the result id of a test outside the seed table
  std::string name;  // the test name shown (method)
  bool seed = false;
  std::vector<Cell> cells;               // one per run
  std::string status(size_t run) const;  // "PASS", ..., kNotImplemented (seed) or kNotRun (other)
};

struct MatrixGroup {
  std::string file;  // seed file ("test_fsdp_core.py"); "" for tests outside the seed table
  std::string cls;   // class (seed) or GoogleTest suite (other)
  std::vector<MatrixRow> rows;
  std::vector<int> passes;  // per run: rows with PASS
};

struct Matrix {
  std::vector<MatrixGroup> groups;  // seed files in table order, classes in table order; then others
  size_t runs = 0;
  size_t seed_total = 0;                                       // rows of the seed table (102)
  std::vector<int> seed_passes;                                // per run: seed rows that PASS
  std::vector<int> seed_with_result;                           // per run: seed rows with any result
  std::vector<std::map<std::string, int>> seed_status_counts;  // per run: status -> seed rows
};

Matrix build_matrix(const std::vector<ReportRun>& runs, const SeedTable& seed);

// [Note: what the diff calls a regression] Comparing run `first` with run `last`, row by row:
// - regression: the row had a result in `first` whose status was not a failure (PASS, SKIP,
//   NOT_SUPPORTED, XFAIL) and its status in `last` is a failure (FAIL, XPASS, TIMEOUT, CRASH, FLAKY);
// - new pass: PASS in `last`, anything else (no result included) in `first`;
// - status change: any other difference, a result appearing or disappearing included.
enum class ChangeKind { Regression, NewPass, StatusChange };
struct Change {
  ChangeKind kind;
  std::string id;
  std::string before, after;  // statuses, kNotImplemented / kNotRun for no result
};
std::vector<Change> diff_runs(const Matrix& m, size_t first, size_t last);

// A test seen with more than one status over `tdc run --repeat N`: FLAKY, or repeat_statuses with
// two or more statuses.
struct FlakyTest {
  size_t run = 0;
  std::string id;
  std::map<std::string, int> statuses;
  int index = -1;  // in the run's tests
};
std::vector<FlakyTest> flaky_tests(const std::vector<ReportRun>& runs);

// The run's launcher as the Runs table says it: "fork", or "thread (61 of 102 tests with fork)"
// when some tests ran with another one ([Note: tests whose ranks need a process each], harness.h).
std::string run_launcher_label(const harness::RunResults& results);

// The id of the HTML element that holds a result's message ("msg-r<run>-t<index>").
std::string message_anchor(size_t run, int index);
// Human spelling of a cell status ("not implemented" for kNotImplemented).
std::string status_label(const std::string& status);
bool is_failure_status(const std::string& status);
// A tolerance or a difference in a report: 6 significant digits, "n/a" when not finite.
std::string report_number(double v);

}  // namespace tdc::cli
