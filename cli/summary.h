// The end of `tdc run` on the console: summary table, failures with messages and log excerpts,
// and --check. (The report a person reads in a browser is report/report.h.)
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "tdc/harness/results.h"

namespace tdc::cli {

// Per suite: PASS FAIL SKIP NOT_SUPPORTED XFAIL XPASS TIMEOUT CRASH, total, time; then all.
void print_summary(const harness::RunResults& r, double elapsed_s);
// Every test with a failure status: message, expectation, and the part of its binary's log that
// the message does not already say (log_of: test id -> log file).
void print_failures(const harness::RunResults& r, const std::map<std::string, std::filesystem::path>& log_of);
// Re-reads results.json through the results reader and junit.xml through the XML checker, and
// checks that both hold the same number of tests. The error, or nullopt.
std::optional<std::string> check_outputs(const std::filesystem::path& json_path, const std::filesystem::path& xml_path);

}  // namespace tdc::cli
