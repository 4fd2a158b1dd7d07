// What `tdc run` prints at the end, and its --check of the files it wrote.
#include "summary.h"

#include <algorithm>
#include <cstring>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli.h"
#include "report/log_excerpt.h"
#include "tdc/harness/xml_check.h"

namespace tdc::cli {

namespace fs = std::filesystem;
using harness::RunResults;
using harness::Status;

namespace {
// "; CPU 30.8 s user + 10.7 s system; kernel time 44 % of wall" (issue 28's kernel
// share, as `time tdc run` would give it); empty where the run did not measure it.
std::string cpu_text(const harness::RunInfo& i, double wall) {
  if (i.user_s <= 0 && i.system_s <= 0) return "";
  return fmt::format("; CPU {:.1f} s user + {:.1f} s system; kernel time {:.0f} % of wall", i.user_s, i.system_s,
                     wall > 0 ? 100 * i.system_s / wall : 0.0);
}
}  // namespace

void print_summary(const RunResults& r, double elapsed) {
  std::vector<Status> columns = {Status::Pass,  Status::Fail,  Status::Skip,    Status::NotSupported,
                                 Status::XFail, Status::XPass, Status::Timeout, Status::Crash};
  if (r.counts().at(Status::Flaky) > 0) columns.push_back(Status::Flaky);  // only --repeat makes it
  std::vector<std::string> order;
  std::map<std::string, std::map<Status, int>> counts;
  std::map<std::string, double> time;
  for (const auto& t : r.tests) {
    if (!counts.count(t.suite)) order.push_back(t.suite);
    ++counts[t.suite][t.status];
    time[t.suite] += t.duration_s;
  }
  size_t w = 5;
  for (const auto& s : order) w = std::max(w, std::min<size_t>(s.size(), 48));
  std::string header = fmt::format("{:<{}}", "suite", w);
  for (Status s : columns)
    header += fmt::format(" {:>{}}", harness::to_string(s), std::max<size_t>(4, std::strlen(harness::to_string(s))));
  header += fmt::format(" {:>6} {:>9}", "total", "time");
  fmt::print("\n{}\n{}\n", header, std::string(header.size(), '-'));
  auto row = [&](const std::string& name, std::map<Status, int>& c, double t) {
    std::string line = fmt::format("{:<{}}", name.size() > w ? name.substr(0, w - 3) + "..." : name, w);
    int total = 0;
    for (Status s : columns) {
      int n = c[s];
      total += n;
      size_t cw = std::max<size_t>(4, std::strlen(harness::to_string(s)));
      line += n ? fmt::format(" {:>{}}", n, cw) : fmt::format(" {:>{}}", ".", cw);
    }
    line += fmt::format(" {:>6} {:>9}", total, format_duration(t));
    fmt::print("{}\n", line);
  };
  std::map<Status, int> all;
  double all_time = 0;
  for (const auto& s : order) {
    row(s, counts[s], time[s]);
    for (auto [k, v] : counts[s]) all[k] += v;
    all_time += time[s];
  }
  fmt::print("{}\n", std::string(header.size(), '-'));
  row("all", all, all_time);
  fmt::print("wall time {}{}\n", format_duration(elapsed), cpu_text(r.run_info, elapsed));
  // [Note: rank reports]: e.g. comm_ops, which collectives each backend ran natively.
  for (const auto& [name, report] : r.reports)
    for (const auto& [key, values] : report) fmt::print("{} {}: {}\n", name, key, fmt::join(values, ", "));
}

void print_failures(const RunResults& r, const std::map<std::string, fs::path>& log_of) {
  int n = 0;
  for (const auto& t : r.tests) {
    if (!harness::is_failure(t.status)) continue;
    if (n++ == 0) fmt::print("\nFailures:\n");
    fmt::print("\n{} {} ({}){}\n", harness::to_string(t.status), t.id, format_duration(t.duration_s),
               t.file.empty() ? "" : fmt::format(" at {}:{}", t.file, t.line));
    std::string msg = t.message;
    if (std::count(msg.begin(), msg.end(), '\n') > 60) {
      size_t cut = 0;
      for (int k = 0; k < 60; ++k) cut = msg.find('\n', cut) + 1;
      msg = msg.substr(0, cut) + "... (message truncated; see results.json)\n";
    }
    fmt::print("{}", indent(msg.empty() ? "(no message)" : msg, "    "));
    if (!t.expectation.empty() && msg.find(t.expectation) == std::string::npos) fmt::print("    {}\n", t.expectation);
    if (auto it = log_of.find(t.id); it != log_of.end()) {
      std::string excerpt = log_excerpt(it->second, t.id, 40);
      if (!excerpt.empty()) {
        if (adds_to(excerpt, t.message)) fmt::print("  log ({}):\n{}", it->second.string(), indent(excerpt, "    | "));
      } else
        fmt::print("  log tail ({}):\n{}", it->second.string(), indent(file_tail(it->second, 20), "    | "));
    }
  }
}

// Re-reads what was written: results.json through the results reader, junit.xml through the
// XML checker, and checks that both describe the same tests.
std::optional<std::string> check_outputs(const fs::path& json_path, const fs::path& xml_path) {
  RunResults back;
  try {
    back = harness::read_results(json_path);
  } catch (const std::exception& e) {
    return std::string(e.what());
  }
  std::ifstream in(xml_path, std::ios::binary);
  if (!in) return fmt::format("cannot read '{}'", xml_path.string());
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  harness::XmlSummary s;
  if (auto err = harness::xml_wellformed_error(text, &s)) return fmt::format("'{}': {}", xml_path.string(), *err);
  if (s.root != "testsuites")
    return fmt::format("'{}': root element is <{}>, expected <testsuites>", xml_path.string(), s.root);
  if (s.count("testcase") != static_cast<int>(back.tests.size()))
    return fmt::format("'{}' has {} <testcase> elements but '{}' has {} tests", xml_path.string(), s.count("testcase"),
                       json_path.string(), back.tests.size());
  return std::nullopt;
}

}  // namespace tdc::cli
