// `tdc run`'s test processes: what a run selected (Binary), how it was asked to run (Options),
// and the shards that run side by side (run_processes.cpp, [Note: tests side by side]).
// run.cpp holds the run's steps ([Note: a run's steps]); this part starts, watches, stops and
// merges the processes.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "progress.h"
#include "shards.h"
#include "tdc/harness/results.h"

namespace tdc::cli::run_detail {

namespace fs = std::filesystem;

struct Binary {
  std::string kind;
  fs::path path;
  std::string name;                // file name, used for logs and crash records
  std::vector<std::string> tests;  // "Suite.Name", from --gtest_list_tests
  std::string filter;              // --gtest_filter when not the run's: the tests left after a death
};

struct Options {
  std::string filter = "*";
  std::vector<std::string> forwarded;  // --tdc_* flags for every binary
  fs::path out;
  fs::path build;
  std::optional<std::string> kind;
  std::optional<fs::path> expectations;
  double idle_timeout_s = 600;
  bool check = false;
  bool no_report = false;
  int repeat = 1;
  std::optional<fs::path> impl;     // --impl
  std::vector<std::string> suites;  // --suites, in order
  std::vector<fs::path> binaries;   // --binary, in order (instead of tdc_suites.json's)
  bool stop_on_failure = false;
  int jobs = 1;
  bool pin = true;                            // [Note: a test process on its own CPUs]; --no-pin: false
  std::optional<fs::path> durations;          // --durations
  std::optional<std::string> implementation;  // --implementation
  // [Note: rank 0 writes the run] Under an external launcher (--launcher env) every rank runs
  // this command with the same --out, and the harness reports every rank's results through rank
  // 0 (the others record PASS for what rank 0 reports). So rank 0 writes results.json, junit.xml
  // and the report; rank r > 0 keeps its logs and raw files in OUT/ranks/r/ and writes nothing
  // else. external_rank is that r (0 when no external launcher set one).
  int external_rank = 0;
  std::string backend = "gloo", device = "cpu", launcher = "fork";
};

struct BinaryOutcome {
  std::vector<harness::TestResult> tests;
  std::set<std::string> with_log_tail;         // records made here, whose message already has the log
  std::optional<harness::RunResults> results;  // the binary's own results file, when it wrote one
  bool interrupted = false;
  bool died_in_test = false;  // crashed or was killed while running a test, without results
};

struct ShardOutcome {
  size_t binary = 0;
  int shard = 0, resume = 0;  // for a deterministic merge order
  BinaryOutcome outcome;
  fs::path log;
};

// "Suite.Name" -> {"Suite", "Name"}; a record tdc run makes itself.
std::pair<std::string, std::string> split_id(const std::string& id);
harness::TestResult make_record(const std::string& suite, const std::string& name, harness::Status status,
                                double duration_s, std::string message);

// The binary's listed tests that have no record in `r`, in list order.
std::vector<std::string> tests_not_reported(const Binary& b, const BinaryOutcome& r);
// Test id -> duration in an earlier results.json (empty when there is no readable one).
std::map<std::string, double> previous_durations(const fs::path& results_json);
// Runs repeat `rep` of the plan, up to o.jobs processes at once; every process's outcome.
std::vector<ShardOutcome> run_shards(const Options& o, Progress& progress, const std::vector<Binary>& binaries,
                                     const std::vector<Shard>& plan, int rep, bool& was_interrupted);
// The records of one repeat, in the binaries' and their tests' listed order.
std::vector<harness::TestResult> merge_shards(const std::vector<Binary>& binaries, std::vector<ShardOutcome>& outcomes,
                                              std::map<std::string, fs::path>& log_of);

}  // namespace tdc::cli::run_detail
