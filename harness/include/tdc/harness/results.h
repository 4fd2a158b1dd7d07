// The results model: one run = run_info + one record per test. Written as JSON
// (docs/results-schema.md) and JUnit XML. One writer for both, used by test binaries and `tdc run`.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tdc::harness {

// FLAKY: `tdc run --repeat N` saw this test end with different statuses across its repeats.
enum class Status { Pass, Fail, Skip, NotSupported, XFail, XPass, Timeout, Crash, Flaky };
const char* to_string(Status s);
Status status_from_string(const std::string& s);  // throws std::invalid_argument
// A status that makes a run fail (FAIL, XPASS, TIMEOUT, CRASH, FLAKY).
bool is_failure(Status s);

// What one rank did in a test. The lower-case spellings are results.json's (docs/results-schema.md).
enum class RankStatus {
  Pass,     // "pass": the body returned without a failure
  Fail,     // "fail": the body returned after a failed assertion or an exception
  Skip,     // "skip": the body skipped (GTEST_SKIP, TDC_SKIP_IF, TDC_NOT_SUPPORTED)
  Crash,    // "crash": the rank's process died or exited before the body returned
  Timeout,  // "timeout": still running at the deadline
  Aborted,  // "aborted": stopped by the harness after another rank failed, skipped or crashed
  Unknown,  // "unknown": not known (a reader of results written by another tool)
};
const char* to_string(RankStatus s);
RankStatus rank_status_from_string(const std::string& s);  // throws std::invalid_argument

// [Note: rank reports] (harness.h): per reporter, key -> values; the union over ranks, tests and
// binaries (merge_reports).
using Report = std::map<std::string, std::set<std::string>>;
using Reports = std::map<std::string, Report>;
void merge_reports(Reports& into, const Reports& from);

struct RankDetail {
  int rank = 0;
  RankStatus status = RankStatus::Unknown;
  std::string message;  // this rank's failures / skip reason / signal
  double duration_s = 0;
  std::optional<int> exit_code;
  std::optional<int> signal;
};

struct TestResult {
  std::string id;  // "Suite.Name"
  std::string suite;
  std::string name;
  Status status = Status::Pass;
  double duration_s = 0;
  std::string message;  // empty on PASS
  // Where a failing test failed: the first failed assertion's file:line; for an exception, a
  // TIMEOUT or a CRASH (no assertion), the test's definition (TDC_DIST_TEST / TEST). Empty when
  // the test did not fail.
  std::string file;
  int line = 0;
  int world_size = 0;
  std::string launcher;
  std::vector<RankDetail> ranks;
  std::string expectation;  // reason from the expectations file, if one applied
  // With --repeat N: how often each status was seen ("PASS" -> 19, "FAIL" -> 1); empty otherwise.
  std::map<std::string, int> repeat_statuses;
  Reports reports;  // what the implementation reported from the ranks ([Note: rank reports])
};

struct RunInfo {
  std::string implementation = "tdc-reference";
  std::string implementation_version;
  std::string implementation_library;  // path of the library under test, when it declared one
  std::string backend = "gloo";
  std::string device = "cpu";
  int world_size = 0;  // the largest world size used by the run's tests
  std::string launcher = "fork";
  std::string suite_revision;
  std::string tdc_version;
  std::string libtorch_version;
  std::string libtorch_cuda;  // the CUDA LibTorch was built with ("13.0"); empty for a CPU build
  std::string nccl_version;   // the NCCL beside a CUDA LibTorch ("2.28.9"); empty without one
  std::string compiler;       // that compiled tdc ("GNU 12.2.0")
  std::string host;
  std::string started_at;  // ISO-8601 UTC
  double duration_s = 0;
  // CPU seconds of the run and of every process it started and reaped (`tdc run`: what `time`
  // reports for it); 0 where not measured (a test binary's own results), and then not written.
  double user_s = 0, system_s = 0;
};

struct RunResults {
  int schema_version = 1;
  RunInfo run_info;
  std::vector<TestResult> tests;
  Reports reports;  // the union of the tests' reports

  std::map<Status, int> counts() const;
  bool ok() const;  // no failure status
};

nlohmann::json to_json(const RunResults& r);
// Throws std::runtime_error naming `document` and the field ([Note: one JSON reader]).
RunResults results_from_json(const nlohmann::json& j, const std::string& document = "results.json");
RunResults read_results(const std::filesystem::path& p);
// Atomic: written to a temp name, then renamed.
void write_results_json(const RunResults& r, const std::filesystem::path& p);
void write_junit_xml(const RunResults& r, const std::filesystem::path& p);
// s as XML (and HTML) text: markup characters escaped; control characters and invalid UTF-8,
// which XML 1.0 cannot carry, replaced visibly. In an attribute value (attribute = true)
// newlines and tabs are escaped too, so a parser keeps them.
std::string xml_escape(const std::string& s, bool attribute = true);

// Expectations: {"tests": {"Suite.Name": {"status": "FAIL|SKIP|...", "reason": "..."}}}
// A test expected to fail that fails becomes XFAIL; one that passes becomes XPASS.
struct Expectation {
  Status status;
  std::string reason;
};
using Expectations = std::map<std::string, Expectation>;
Expectations read_expectations(const std::filesystem::path& p);
void apply_expectations(TestResult& t, const Expectations& e);

std::string iso_now();
std::string hostname();

}  // namespace tdc::harness
