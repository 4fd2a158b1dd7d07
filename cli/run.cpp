// `tdc run`: list the selected test binaries' tests, run each binary with the run's flags and a
// progress pipe, merge their results into one RunResults, write results.json + junit.xml, and
// print a summary. A binary that dies without results is reported, never dropped.
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "process.h"
#include "progress.h"
#include "implementation_library.h"
#include "report/report.h"
#include "summary.h"
#include "tdc/harness/results.h"

#ifndef TDC_VERSION
#define TDC_VERSION "unknown"
#endif

namespace tdc::cli {

namespace fs = std::filesystem;
using harness::RunResults;
using harness::Status;
using harness::TestResult;
using nlohmann::json;

namespace {

const std::vector<OptionSpec> kRunOptions = {
    {"filter", "GLOB", "GoogleTest filter of tests to run (default '*'; 'A.*:B.*', '*-Slow.*')"},
    {"backend", "NAME", "c10d backend (default gloo)"},
    {"device", "cpu|cuda", "device type (default cpu)"},
    {"launcher", "fork|thread|spawn|env", "how ranks start (default fork)"},
    {"backend-lib", "PATH", "shared library that registers the --backend"},
    {"impl", "LIB", "run against the implementation library LIB in place of libtdc.so (docs/plugging-in.md)"},
    {"implementation", "NAME", "name the implementation under test in the results (default: its descriptor's)"},
    {"timeout", "S", "per-test deadline in seconds (default: the harness's, 60)"},
    {"expectations", "FILE", "known failures: FAIL->XFAIL, PASS->XPASS (docs/results-schema.md)"},
    {"kind", "conformance|unit|mustfail",
     "which test binaries (default conformance; unit if none;\n"
     "                                   mustfail: the harness's must-fail cases)"},
    {"out", "DIR", "results directory (default results/ in the current directory)"},
    {"build-dir", "DIR", "build directory (default $TDC_BUILD)"},
    {"idle-timeout", "S", "kill a binary that reports no test event for S seconds (default 600)"},
    {"check", nullptr, "after writing, re-read results.json and junit.xml and validate both"},
    {"repeat", "N", "run every selected test N times; one whose status differs is FLAKY (a failure)"},
    {"suites", "A,B", "only these test binaries, in this order (names as in tdc_suites.json)"},
    {"stop-on-failure", nullptr, "run no further binary once one had a failing test (tdc mutate)"},
    {"no-report", nullptr, "do not write DIR/report.html and DIR/report.md (tdc report RUN --out DIR)"},
};

constexpr const char* kRunUsage =
    "usage: tdc run [options]\n\n"
    "Runs the conformance suite (test binaries of kind 'conformance' in tdc_suites.json; the\n"
    "unit suites when there are none yet) with live progress, then writes DIR/results.json,\n"
    "DIR/junit.xml and DIR/logs/<binary>.log and prints a per-suite summary; then the report a\n"
    "person reads, DIR/report.html and DIR/report.md (as `tdc report DIR --out DIR` writes it).\n"
    "Exit status: 0 when no test has a failure status (FAIL, XPASS, TIMEOUT, CRASH), 1 otherwise\n"
    "(also when no test matches the filter), 2 on a usage or setup error, 130 when interrupted.\n"
    "With --repeat N each test's record carries repeat_statuses (status -> count); a test seen\n"
    "with more than one status is FLAKY, and a FLAKY test fails the run.\n\n"
    "Options:\n";

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
  bool stop_on_failure = false;
  std::string backend = "gloo", device = "cpu", launcher = "fork";
};

// A test as the event stream reported it (used when a binary leaves no results file).
struct EventEnd {
  std::string id;
  Status status = Status::Pass;
  double duration_s = 0;
  std::string message;
};

std::pair<std::string, std::string> split_id(const std::string& id) {
  size_t dot = id.find('.');
  if (dot == std::string::npos) return {id, id};
  return {id.substr(0, dot), id.substr(dot + 1)};
}

TestResult make_record(const std::string& suite, const std::string& name, Status status, double duration_s,
                       std::string message) {
  TestResult t;
  t.id = suite + "." + name;
  t.suite = suite;
  t.name = name;
  t.status = status;
  t.duration_s = duration_s;
  t.message = std::move(message);
  return t;
}

Options parse_options(const ParsedArgs& a) {
  Options o;
  const std::string cmd = "run";
  if (auto v = a.get("filter")) o.filter = *v;
  if (auto v = a.get("launcher")) {
    static const std::set<std::string> kLaunchers = {"fork", "thread", "spawn", "env"};
    if (!kLaunchers.count(*v))
      throw UsageError(fmt::format("run: --launcher must be fork, thread, spawn or env, got '{}'", *v));
    o.launcher = *v;
    o.forwarded.push_back("--tdc_launcher=" + *v);
  }
  if (auto v = a.get("device")) {
    if (*v != "cpu" && *v != "cuda") throw UsageError(fmt::format("run: --device must be cpu or cuda, got '{}'", *v));
    o.device = *v;
    o.forwarded.push_back("--tdc_device=" + *v);
  }
  if (auto v = a.get("backend")) {
    if (v->empty()) throw UsageError("run: --backend needs a non-empty name");
    o.backend = *v;
    o.forwarded.push_back("--tdc_backend=" + *v);
  }
  if (auto v = a.get("backend-lib")) {
    if (!fs::is_regular_file(*v)) throw UsageError(fmt::format("run: --backend-lib '{}' is not a file", *v));
    o.forwarded.push_back("--tdc_backend_lib=" + fs::absolute(*v).string());
  }
  if (auto v = a.get("implementation")) o.forwarded.push_back("--tdc_implementation=" + *v);
  if (auto v = a.get("impl")) o.impl = fs::absolute(*v);
  if (auto v = a.get("suites")) {
    std::stringstream in(*v);
    for (std::string name; std::getline(in, name, ',');)
      if (!name.empty()) o.suites.push_back(name);
    if (o.suites.empty()) throw UsageError(fmt::format("run: --suites needs binary names, got '{}'", *v));
  }
  o.stop_on_failure = a.has("stop-on-failure");
  if (auto v = a.get("timeout")) {
    double t = parse_seconds(cmd, "timeout", *v);
    o.forwarded.push_back(fmt::format("--tdc_timeout={}", t));
    o.idle_timeout_s = std::max(o.idle_timeout_s, 2 * t + 60);
  }
  if (auto v = a.get("idle-timeout")) o.idle_timeout_s = parse_seconds(cmd, "idle-timeout", *v);
  if (auto v = a.get("expectations")) {
    o.expectations = fs::absolute(*v);
    harness::read_expectations(*o.expectations);  // fail now, naming the file and field
    o.forwarded.push_back("--tdc_expectations=" + o.expectations->string());
  }
  if (auto v = a.get("kind")) {
    if (*v != "conformance" && *v != "unit" && *v != "mustfail")
      throw UsageError(fmt::format("run: --kind must be conformance, unit or mustfail, got '{}'", *v));
    o.kind = *v;
  }
  o.out = fs::absolute(a.get("out").value_or("results"));
  o.build = resolve_build_dir(a.get("build-dir"));
  o.check = a.has("check");
  o.no_report = a.has("no-report");
  if (auto v = a.get("repeat")) o.repeat = parse_positive_int(cmd, "repeat", *v);
  return o;
}

json read_json_file(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw UsageError(fmt::format("cannot read '{}': {}", p.string(), std::strerror(errno)));
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    throw UsageError(fmt::format("'{}' is not valid JSON: {}", p.string(), e.what()));
  }
}

std::vector<Binary> select_binaries(const Options& o) {
  fs::path manifest = o.build / "tdc_suites.json";
  json j = read_json_file(manifest);
  if (!j.is_array()) throw UsageError(fmt::format("'{}': expected a JSON array", manifest.string()));
  std::vector<Binary> all;
  for (size_t i = 0; i < j.size(); ++i) {
    const json& e = j[i];
    if (!e.is_object() || !e.contains("kind") || !e["kind"].is_string() || !e.contains("binary") ||
        !e["binary"].is_string())
      throw UsageError(fmt::format("'{}': entry [{}] needs string fields 'kind' and 'binary', got {}",
                                   manifest.string(), i, e.dump()));
    Binary b;
    b.kind = e["kind"].get<std::string>();
    b.path = e["binary"].get<std::string>();
    b.name = b.path.filename().string();
    all.push_back(std::move(b));
  }
  auto of_kind = [&](const std::string& kind) {
    std::vector<Binary> out;
    for (const auto& b : all)
      if (b.kind == kind) out.push_back(b);
    return out;
  };
  if (!o.suites.empty()) {
    std::vector<Binary> out;
    for (const std::string& name : o.suites) {
      auto it = std::find_if(all.begin(), all.end(), [&](const Binary& b) { return b.name == name; });
      if (it == all.end()) {
        std::vector<std::string> known;
        for (const auto& b : all) known.push_back(b.name);
        throw UsageError(fmt::format("run: --suites: no test binary '{}' in {} (known: {})", name, manifest.string(),
                                     fmt::join(known, ", ")));
      }
      out.push_back(*it);
    }
    return out;
  }
  if (o.kind) return of_kind(*o.kind);
  auto conformance = of_kind("conformance");
  if (!conformance.empty()) return conformance;
  fmt::print(stderr,
             "tdc run: note: no conformance test binaries in {} yet; running the unit "
             "suites (--kind unit)\n",
             manifest.string());
  return of_kind("unit");
}

// Parses --gtest_list_tests output: "Suite.\n  Name\n  Name2  # GetParam() = 3\n".
std::vector<std::string> parse_test_list(const std::string& text) {
  std::vector<std::string> tests;
  std::string suite;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (auto hash = line.find("  #"); hash != std::string::npos) line = line.substr(0, hash);
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.pop_back();
    if (line[0] != ' ') {
      suite = (!line.empty() && line.back() == '.' && line.find(' ') == std::string::npos)
                  ? line.substr(0, line.size() - 1)
                  : "";
      continue;
    }
    std::string name = line.substr(line.find_first_not_of(' '));
    if (suite.empty() || name.empty() || name.find(' ') != std::string::npos) continue;
    if (suite.rfind("DISABLED_", 0) == 0 || name.rfind("DISABLED_", 0) == 0) continue;
    tests.push_back(suite + "." + name);
  }
  return tests;
}

// ------------------------------------------------------------------ running one binary

struct BinaryOutcome {
  std::vector<TestResult> tests;
  std::set<std::string> with_log_tail;  // records made here, whose message already has the log
  std::optional<RunResults> results;    // the binary's own results file, when it wrote one
  bool interrupted = false;
  bool died_in_test = false;  // crashed or was killed while running a test, without results
};

class BinaryRunner {
 public:
  BinaryRunner(const Options& o, Progress& progress) : o_(o), progress_(progress) {}

  // `label`: the binary's name, plus ".rep<k>" when tests are repeated (one log per repeat).
  BinaryOutcome run(const Binary& b, const std::string& label) {
    fs::path raw = o_.out / "raw" / (label + ".json");
    fs::path log = o_.out / "logs" / (label + ".log");
    std::error_code ec;
    fs::remove(raw, ec);

    int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log_fd < 0)
      throw std::runtime_error(fmt::format("cannot create log '{}': {}", log.string(), std::strerror(errno)));
    int ev[2];
    if (::pipe2(ev, O_CLOEXEC) != 0) {
      ::close(log_fd);
      throw std::runtime_error(fmt::format("pipe: {}", std::strerror(errno)));
    }
    constexpr int kChildEventsFd = 3;
    std::vector<std::string> argv = {b.path.string(), "--gtest_filter=" + (b.filter.empty() ? o_.filter : b.filter),
                                     "--tdc_results=" + raw.string(),
                                     fmt::format("--tdc_events_fd={}", kChildEventsFd)};
    argv.insert(argv.end(), o_.forwarded.begin(), o_.forwarded.end());
    {
      std::ofstream header(log, std::ios::app);
      header << "$ " << fmt::format("{}", fmt::join(argv, " ")) << "\n";
    }
    ::lseek(log_fd, 0, SEEK_END);

    progress_.binary_started(b.name);
    SpawnOptions so;
    so.argv = argv;
    so.stdout_fd = so.stderr_fd = log_fd;
    so.extra_fds = {{ev[1], kChildEventsFd}};
    Child child;
    try {
      child = Child::spawn(so);
    } catch (...) {
      ::close(log_fd);
      ::close(ev[0]);
      ::close(ev[1]);
      throw;
    }
    ::close(log_fd);
    ::close(ev[1]);
    ::fcntl(ev[0], F_SETFL, O_NONBLOCK);

    auto t0 = std::chrono::steady_clock::now();
    auto last_event = t0;
    bool pipe_open = true, idle_killed = false, was_interrupted = false;
    std::string buf;
    ended_.clear();
    running_.reset();
    for (;;) {
      if (pipe_open) {
        pollfd p{ev[0], POLLIN, 0};
        ::poll(&p, 1, 200);
        size_t before = buf.size();
        pipe_open = drain(ev[0], buf);
        if (consume_lines(buf) || buf.size() != before) last_event = std::chrono::steady_clock::now();
      } else {
        ::usleep(100 * 1000);
      }
      if (interrupted()) {
        was_interrupted = true;
        child.terminate(3);
        break;
      }
      if (child.poll()) {
        drain(ev[0], buf);
        consume_lines(buf);
        break;
      }
      double idle = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_event).count();
      if (idle > o_.idle_timeout_s) {
        idle_killed = true;
        progress_.note(fmt::format("{}: no test event for {:.0f} s; killing it", b.name, idle));
        child.terminate(5);
        break;
      }
      progress_.tick();
    }
    ::close(ev[0]);
    int status = child.wait();
    double duration = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (child.left_processes())
      progress_.note(
          fmt::format("warning: {} left processes running in its process group after "
                      "it exited; tdc killed them",
                      b.name));

    BinaryOutcome out;
    out.interrupted = was_interrupted;
    std::string results_error;
    if (fs::exists(raw)) {
      try {
        out.results = harness::read_results(raw);
      } catch (const std::exception& e) {
        results_error = e.what();
      }
    } else {
      results_error = fmt::format("no results file '{}'", raw.string());
    }
    std::string tail = file_tail(log, 30);
    bool clean_exit = WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 1);
    std::string how = idle_killed ? fmt::format("was killed after {:.0f} s without a test event", o_.idle_timeout_s)
                      : was_interrupted ? "was interrupted"
                                        : describe_exit(status);
    Status crash_status = idle_killed ? Status::Timeout : Status::Crash;
    auto add_with_log = [&](TestResult t) {
      out.with_log_tail.insert(t.id);
      out.tests.push_back(std::move(t));
    };

    if (out.results) {
      out.tests = out.results->tests;
      if (!clean_exit || idle_killed)
        add_with_log(
            make_record(b.name, "(binary)", crash_status, duration,
                        fmt::format("{} {} after writing its results; log {}:\n{}", b.name, how, log.string(), tail)));
      return out;
    }
    // No usable results file: keep what the event stream reported, then say what happened.
    for (const EventEnd& e : ended_) {
      auto [suite, name] = split_id(e.id);
      out.tests.push_back(make_record(suite, name, e.status, e.duration_s, e.message));
    }
    size_t reported = ended_.size();
    if (running_) {
      auto [suite, name] = split_id(*running_);
      double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - running_since_).count();
      add_with_log(make_record(suite, name, crash_status, t,
                               fmt::format("{} {} while running this test ({}); log {}:\n{}", b.name, how,
                                           results_error, log.string(), tail)));
      ++reported;
      out.died_in_test = !was_interrupted;
    }
    if (!running_ || (clean_exit && !idle_killed && !was_interrupted)) {
      add_with_log(make_record(b.name, "(binary)", clean_exit && !was_interrupted ? Status::Fail : crash_status,
                               duration,
                               fmt::format("{} {} without usable results ({}); {} of {} listed tests reported; log "
                                           "{}:\n{}",
                                           b.name, how, results_error, reported, b.tests.size(), log.string(), tail)));
    }
    return out;
  }

 private:
  // Handles complete JSON lines in buf; returns whether any line was consumed.
  bool consume_lines(std::string& buf) {
    bool any = false;
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      any = true;
      if (line.empty()) continue;
      try {
        json e = json::parse(line);
        std::string kind = e.at("event").get<std::string>();
        std::string id = e.at("test").get<std::string>();
        if (kind == "start") {
          running_ = id;
          running_since_ = std::chrono::steady_clock::now();
          progress_.test_started(id);
        } else if (kind == "end") {
          EventEnd end;
          end.id = id;
          end.status = harness::status_from_string(e.at("status").get<std::string>());
          end.duration_s = e.value("duration_s", 0.0);
          end.message = e.value("message", std::string());
          progress_.test_ended(id, end.status, end.duration_s, end.message);
          ended_.push_back(std::move(end));
          if (running_ == id) running_.reset();
        }
      } catch (const std::exception& ex) {
        if (!warned_)
          progress_.note(
              fmt::format("warning: ignoring a malformed progress event ({}): {}", ex.what(), line.substr(0, 200)));
        warned_ = true;
      }
    }
    return any;
  }

  const Options& o_;
  Progress& progress_;
  std::vector<EventEnd> ended_;
  std::optional<std::string> running_;
  std::chrono::steady_clock::time_point running_since_;
  bool warned_ = false;
};

// ------------------------------------------------------------------ merging

std::string git_revision(const fs::path& root) {
  if (root.empty()) return "unknown";
  try {
    Captured c = capture({"git", "-C", root.string(), "rev-parse", "--short", "HEAD"}, false, 10);
    std::string rev = c.output.substr(0, c.output.find('\n'));
    if (WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0 && !rev.empty()) return rev;
  } catch (const std::exception&) {
  }
  return "unknown";
}

// What the build says of its LibTorch (tdc_build_info.json, cmake/TdcTargets.cmake); empty
// fields when the file is missing or unreadable.
void fill_libtorch_info(const fs::path& build, harness::RunInfo& info) {
  std::ifstream in(build / "tdc_build_info.json");
  if (!in) return;
  try {
    json j = json::parse(in);
    if (auto v = j.value("torch_version", std::string()); !v.empty()) info.libtorch_version = v;
    info.libtorch_cuda = j.value("torch_cuda", info.libtorch_cuda);
    info.nccl_version = j.value("nccl_version", info.nccl_version);
    info.compiler = j.value("compiler", info.compiler);
  } catch (const std::exception&) {
  }
}

// Asks the first test binary whether this run can work at all (backend known, plug-in loads,
// device present) before any test starts: one clear message and exit 2 instead of every test
// failing the same way.
void preflight(const std::vector<Binary>& binaries, const Options& o) {
  for (const Binary& b : binaries) {
    if (!fs::exists(b.path)) continue;
    std::vector<std::string> argv = {b.path.string(), "--tdc_preflight"};
    argv.insert(argv.end(), o.forwarded.begin(), o.forwarded.end());
    Captured c = capture(argv, true, 120);
    if (c.timed_out) throw UsageError(fmt::format("preflight: '{}' did not answer within 120 s", b.path.string()));
    std::string out = c.output;
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    if (WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0) return;
    if (out.rfind("tdc: ", 0) == 0) out = out.substr(5);
    bool said_why = WIFEXITED(c.status) && WEXITSTATUS(c.status) == 2;  // the harness's own answer
    throw UsageError(fmt::format("this run cannot start: {}{}", out,
                                 said_why ? "" : fmt::format(" ({} {})", b.name, describe_exit(c.status))));
  }
}

// The run's report next to its results (`tdc report DIR --out DIR`). A report that cannot be
// written is a warning: the results are what the run is for.
void write_run_report(const Options& o, const fs::path& json_path) {
  try {
    ReportInput in;
    in.generated_at = harness::iso_now();
    in.seed = read_seed_table(seed_table_path(resolve_source_dir(o.build)));
    in.runs.push_back(load_run(json_path, "run 1"));
    if (fs::path p = o.out / "parity.json"; fs::is_regular_file(p)) in.parity.push_back(read_parity(p));
    ReportFiles files = write_report(in, o.out);
    fmt::print("report:  {}\n         {}\n", files.html.string(), files.markdown.string());
  } catch (const std::exception& e) {
    fmt::print(stderr, "tdc run: warning: report not written: {}\n", e.what());
  }
}

// [Note: one verdict per test over repeats] With --repeat N every test ran N times. A test that
// ended the same way each time keeps that status (and the record of its first repeat); one that
// did not is FLAKY, whatever the mix, with the record of its first repeat that failed (or else
// its first) so the message shows a failure. Counts per status go to repeat_statuses.
std::vector<TestResult> merge_repeats(const std::vector<std::vector<TestResult>>& reps) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::pair<int, const TestResult*>>> seen;
  for (size_t k = 0; k < reps.size(); ++k)
    for (const TestResult& t : reps[k]) {
      if (!seen.count(t.id)) order.push_back(t.id);
      seen[t.id].push_back({static_cast<int>(k) + 1, &t});
    }
  std::vector<TestResult> out;
  for (const std::string& id : order) {
    const auto& runs = seen[id];
    std::map<std::string, int> counts;
    const std::pair<int, const TestResult*>* shown = &runs.front();
    for (const auto& run : runs) {
      ++counts[harness::to_string(run.second->status)];
      if (harness::is_failure(run.second->status) && !harness::is_failure(shown->second->status)) shown = &run;
    }
    TestResult merged = *shown->second;
    merged.repeat_statuses = counts;
    if (counts.size() > 1) {
      std::vector<std::string> parts;
      for (const auto& [status, n] : counts) parts.push_back(fmt::format("{} x{}", status, n));
      merged.status = Status::Flaky;
      merged.message =
          fmt::format("statuses over {} repeats: {}; repeat {} ended {}:\n{}", runs.size(), fmt::join(parts, ", "),
                      shown->first, harness::to_string(shown->second->status), shown->second->message);
    }
    out.push_back(std::move(merged));
  }
  return out;
}

}  // namespace

// The binary's listed tests that have no record in `r`, in list order ([Note: one death costs
// one test]).
std::vector<std::string> tests_not_reported(const Binary& b, const BinaryOutcome& r) {
  std::set<std::string> seen;
  for (const auto& t : r.tests) seen.insert(t.id);
  std::vector<std::string> left;
  for (const auto& id : b.tests)
    if (!seen.count(id)) left.push_back(id);
  return left;
}

int run_command(const std::vector<std::string>& args) {
  ParsedArgs a = parse_args("run", kRunOptions, args, false);
  if (a.help) {
    fmt::print("{}{}", kRunUsage, format_options(kRunOptions));
    return kExitOk;
  }
  Options o = parse_options(a);
  std::string started_at = harness::iso_now();
  auto t0 = std::chrono::steady_clock::now();

  std::vector<Binary> binaries = select_binaries(o);
  if (o.impl) {
    ImplementationDescriptor d = use_implementation(*o.impl, o.out / "impl");
    fmt::print(stderr, "tdc run: implementation {} {} from {} ({} features)\n", d.name, d.version, o.impl->string(),
               d.features.size());
  }
  preflight(binaries, o);
  // The binaries put it in their own run_info too.
  std::string revision = git_revision(resolve_source_dir(o.build));
  ::setenv("TDC_SUITE_REVISION", revision.c_str(), 1);
  for (const char* sub : {"logs", "raw"}) {
    std::error_code ec;
    fs::create_directories(o.out / sub, ec);
    if (ec) throw UsageError(fmt::format("cannot create '{}': {}", (o.out / sub).string(), ec.message()));
  }

  // Count first, so progress can say done/total. A binary that cannot list is a failure.
  std::vector<TestResult> records;
  int total = 0;
  for (Binary& b : binaries) {
    if (!fs::exists(b.path)) {
      records.push_back(make_record(b.name, "(binary)", Status::Crash, 0,
                                    fmt::format("test binary '{}' (kind {}) from tdc_suites.json "
                                                "does not exist: build it (ninja -C {} {})",
                                                b.path.string(), b.kind, o.build.string(), b.name)));
      continue;
    }
    Captured c = capture({b.path.string(), "--gtest_list_tests", "--gtest_filter=" + o.filter}, true, 120);
    if (interrupted()) break;
    if (c.timed_out || !WIFEXITED(c.status) || WEXITSTATUS(c.status) != 0) {
      records.push_back(make_record(
          b.name, "(binary)", Status::Crash, 0,
          fmt::format("listing the tests of '{}' failed ({}):\n{}", b.path.string(),
                      c.timed_out ? "no answer within 120 s" : describe_exit(c.status),
                      c.output.size() > 4000 ? "..." + c.output.substr(c.output.size() - 4000) : c.output)));
      continue;
    }
    b.tests = parse_test_list(c.output);
    total += static_cast<int>(b.tests.size());
  }
  fmt::print(stderr,
             "tdc run: {} tests in {} binaries (filter '{}', backend {}, device {}, "
             "launcher {}) -> {}\n",
             total, binaries.size(), o.filter, o.backend, o.device, o.launcher, o.out.string());

  if (o.repeat > 1) fmt::print(stderr, "tdc run: every test {} times (--repeat)\n", o.repeat);
  Progress progress(total * o.repeat);
  RunResults merged;
  std::map<std::string, fs::path> log_of;  // test id -> log of its binary
  bool was_interrupted = interrupted() != 0;
  bool from_binaries = false;  // run_info came from at least one binary's results
  std::vector<std::vector<TestResult>> repeats(o.repeat);
  int rep = 0;
  // One run of a binary: its records, and what its results say about the run.
  auto absorb = [&](BinaryOutcome& r, const fs::path& log) {
    for (auto& t : r.tests) {
      if (!r.with_log_tail.count(t.id)) log_of[t.id] = log;
      repeats[rep].push_back(std::move(t));
    }
    if (r.results) {
      from_binaries = true;
      const auto& ri = r.results->run_info;
      auto& mi = merged.run_info;
      if (mi.implementation_version.empty()) {
        mi.implementation = ri.implementation;
        mi.implementation_version = ri.implementation_version;
        mi.implementation_library = ri.implementation_library;
      }
      if (mi.libtorch_version.empty()) mi.libtorch_version = ri.libtorch_version;
      if (mi.libtorch_cuda.empty()) mi.libtorch_cuda = ri.libtorch_cuda;
      if (mi.nccl_version.empty()) mi.nccl_version = ri.nccl_version;
      if (mi.compiler.empty()) mi.compiler = ri.compiler;
      mi.world_size = std::max(mi.world_size, ri.world_size);
      if (!ri.backend.empty()) mi.backend = ri.backend;
      if (!ri.device.empty()) mi.device = ri.device;
      if (!ri.launcher.empty()) mi.launcher = ri.launcher;
    }
    was_interrupted = r.interrupted || interrupted();
  };
  for (; rep < o.repeat && !was_interrupted; ++rep) {
    for (const Binary& b : binaries) {
      if (was_interrupted) break;
      if (b.tests.empty()) continue;
      BinaryRunner runner(o, progress);
      const std::string base_label = o.repeat > 1 ? fmt::format("{}.rep{}", b.name, rep + 1) : b.name;
      // [Note: one death costs one test] A binary that dies inside a test (a crash of the process
      // that runs the ranks: the thread launcher, or a bug in the harness itself) is started again
      // for the tests it had not reported, each time in its own log (NAME.resumeK.log), until
      // every listed test has a record.
      Binary part = b;
      for (int resume = 0;; ++resume) {
        const std::string label = resume ? fmt::format("{}.resume{}", base_label, resume) : base_label;
        BinaryOutcome r = runner.run(part, label);
        const std::vector<std::string> left = tests_not_reported(part, r);
        const bool go_on = r.died_in_test && !r.interrupted && !left.empty() && left.size() < part.tests.size();
        absorb(r, o.out / "logs" / (label + ".log"));
        if (was_interrupted || !go_on) break;
        progress.note(
            fmt::format("{} died in a test; starting it again for its {} remaining tests", b.name, left.size()));
        part.tests = left;
        part.filter = fmt::format("{}", fmt::join(left, ":"));
      }
      if (o.stop_on_failure && std::any_of(repeats[rep].begin(), repeats[rep].end(),
                                           [](const TestResult& t) { return harness::is_failure(t.status); })) {
        fmt::print(stderr, "tdc run: stopping after {} (--stop-on-failure)\n", b.name);
        break;
      }
    }
  }
  if (o.repeat == 1) {
    for (auto& t : repeats[0]) records.push_back(std::move(t));
  } else {
    for (auto& t : merge_repeats(repeats)) records.push_back(std::move(t));
  }
  progress.finish();
  if (was_interrupted) fmt::print(stderr, "tdc run: interrupted; writing the results so far\n");

  // run_info: what the binaries said, else what this run asked for.
  auto& info = merged.run_info;
  if (!from_binaries) {
    info.backend = o.backend;
    info.device = o.device;
    info.launcher = o.launcher;
  }
  if (auto v = a.get("implementation"); v && !from_binaries) info.implementation = *v;
  fill_libtorch_info(o.build, info);
  info.suite_revision = revision;
  info.tdc_version = TDC_VERSION;
  info.host = harness::hostname();
  info.started_at = started_at;
  info.duration_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  harness::Expectations expectations;
  if (o.expectations) expectations = harness::read_expectations(*o.expectations);
  for (auto& t : records) {
    harness::apply_expectations(t, expectations);  // idempotent: binaries applied them already
    info.world_size = std::max(info.world_size, t.world_size);
  }
  merged.tests = std::move(records);
  for (const TestResult& t : merged.tests) harness::merge_reports(merged.reports, t.reports);

  fs::path json_path = o.out / "results.json", xml_path = o.out / "junit.xml";
  harness::write_results_json(merged, json_path);
  harness::write_junit_xml(merged, xml_path);

  print_summary(merged, info.duration_s);
  print_failures(merged, log_of);
  fmt::print("\nresults: {}\njunit:   {}\nlogs:    {}\n", json_path.string(), xml_path.string(),
             (o.out / "logs").string());
  if (!o.no_report) write_run_report(o, json_path);

  int code = merged.ok() ? kExitOk : kExitFailed;
  if (merged.tests.empty()) {
    fmt::print(stderr, "tdc run: no tests matched --filter '{}' in the {} binaries\n", o.filter, binaries.size());
    code = kExitFailed;
  }
  if (o.check) {
    if (auto err = check_outputs(json_path, xml_path)) {
      fmt::print(stderr, "tdc run: check failed: {}\n", *err);
      code = kExitFailed;
    } else {
      fmt::print("check:   results.json ({} tests) and junit.xml re-read and valid\n", merged.tests.size());
    }
  }
  if (was_interrupted) return kExitInterrupted;
  return code;
}

}  // namespace tdc::cli
