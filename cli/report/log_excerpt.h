// The part of a test binary's log that belongs to one test: used by `tdc run`'s failure list and
// by the report's message blocks (one copy of the logic for both).
#pragma once

#include <filesystem>
#include <map>
#include <string>

namespace tdc::cli {

// The lines from GoogleTest's "[ RUN      ] id" to its "[  FAILED  ]/[       OK ]/[  SKIPPED ] id"
// (the last run of it in the file), at most max_lines of them (the last ones, with a marker
// saying how many came before). "" when the log never ran the test.
std::string log_excerpt(const std::filesystem::path& log, const std::string& id, int max_lines);

// Whether an excerpt says more than the message (the harness often logs the message itself).
bool adds_to(const std::string& excerpt, const std::string& message);

// The logs of a `tdc run` directory (DIR/logs/*.log): test id -> the log that ran it. When several
// logs ran a test (--repeat writes one per repeat), the first (by name) in which it failed wins,
// else the first by name.
std::map<std::string, std::filesystem::path> index_logs(const std::filesystem::path& logs_dir);

}  // namespace tdc::cli
