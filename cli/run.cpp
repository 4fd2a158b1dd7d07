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
#include <deque>
#include <memory>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "process.h"
#include "progress.h"
#include "implementation_library.h"
#include "report/report.h"
#include "shards.h"
#include "summary.h"
#include "tdc/harness/external_launcher.h"
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
    {"stop-on-failure", nullptr, "stop every test process once one had a failing test (tdc mutate)"},
    {"durations", "FILE",
     "balance the shards by the test durations in FILE (a results.json; default: DIR/results.json\n"
     "                                   of the previous run, when there is one)"},
    {"jobs", "N",
     "test processes at once (default: 3 per CPU, at most 8; 1 on cuda and with --launcher env;\n"
     "                                   [Note: tests side by side] in cli/shards.h)"},
    {"no-report", nullptr, "do not write DIR/report.html and DIR/report.md (tdc report RUN --out DIR)"},
};

constexpr const char* kRunUsage =
    "usage: tdc run [options]\n\n"
    "Runs the conformance suite (test binaries of kind 'conformance' in tdc_suites.json; the\n"
    "unit suites when there are none yet) with live progress, then writes DIR/results.json,\n"
    "DIR/junit.xml and DIR/logs/<binary>[.shard<k>].log and prints a per-suite summary; then the report a\n"
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
  int jobs = 1;
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
  if (auto v = a.get("implementation")) {
    o.implementation = *v;
    o.forwarded.push_back("--tdc_implementation=" + *v);
  }
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
  if (auto v = a.get("durations")) {
    if (!fs::is_regular_file(*v)) throw UsageError(fmt::format("run: --durations '{}' is not a file", *v));
    o.durations = fs::absolute(*v);
  }
  if (o.launcher == "env") {
    try {
      if (auto r = harness::external_rank()) o.external_rank = std::max(r->rank, 0);
    } catch (const std::invalid_argument& e) {
      throw UsageError(fmt::format("run: --launcher env: {}", e.what()));
    }
    if (o.external_rank > 0) o.out = o.out / "ranks" / std::to_string(o.external_rank);
  }
  o.jobs = default_jobs(o.device, o.launcher, std::thread::hardware_concurrency());
  if (auto v = a.get("jobs")) {
    o.jobs = parse_positive_int(cmd, "jobs", *v);
    // Every rank's `tdc run` under an external launcher must start the same test at the same time.
    if (o.launcher == "env" && o.jobs > 1)
      throw UsageError(
          fmt::format("run: --jobs {} with --launcher env: ranks started by an external launcher "
                      "run one test at a time (--jobs 1)",
                      o.jobs));
  }
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

// One test process: a binary run over some of its tests (a shard, [Note: tests side by side]),
// driven without blocking so that several run at once: start(), then service() whenever its event
// pipe is readable or a poll times out, until it returns true; then finish().
class ShardRunner {
 public:
  // `label`: the binary's name, plus ".shard<k>" when split, ".rep<k>" when repeated and
  // ".resume<k>" when started again after a death (one log and one raw results file each).
  ShardRunner(const Options& o, Progress& progress, Binary part, std::string label)
      : o_(o), progress_(progress), b_(std::move(part)), label_(std::move(label)) {}
  ShardRunner(const ShardRunner&) = delete;
  ShardRunner& operator=(const ShardRunner&) = delete;
  ~ShardRunner() {
    if (ev_ >= 0) ::close(ev_);
  }

  const Binary& part() const { return b_; }
  // Whether the event stream reported a test with a failure status.
  bool saw_failure() const { return saw_failure_; }
  const std::string& label() const { return label_; }
  fs::path log() const { return o_.out / "logs" / (label_ + ".log"); }
  int event_fd() const { return pipe_open_ ? ev_ : -1; }

  void start() {
    raw_ = o_.out / "raw" / (label_ + ".json");
    std::error_code ec;
    fs::remove(raw_, ec);
    int log_fd = ::open(log().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log_fd < 0)
      throw std::runtime_error(fmt::format("cannot create log '{}': {}", log().string(), std::strerror(errno)));
    int ev[2];
    if (::pipe2(ev, O_CLOEXEC) != 0) {
      ::close(log_fd);
      throw std::runtime_error(fmt::format("pipe: {}", std::strerror(errno)));
    }
    constexpr int kChildEventsFd = 3;
    std::vector<std::string> argv = {b_.path.string(), "--gtest_filter=" + (b_.filter.empty() ? o_.filter : b_.filter),
                                     "--tdc_results=" + raw_.string(),
                                     fmt::format("--tdc_events_fd={}", kChildEventsFd)};
    argv.insert(argv.end(), o_.forwarded.begin(), o_.forwarded.end());
    {
      std::ofstream header(log(), std::ios::app);
      header << "$ " << fmt::format("{}", fmt::join(argv, " ")) << "\n";
    }
    ::lseek(log_fd, 0, SEEK_END);

    progress_.binary_started(label_, static_cast<int>(b_.tests.size()));
    SpawnOptions so;
    so.argv = argv;
    so.stdout_fd = so.stderr_fd = log_fd;
    so.extra_fds = {{ev[1], kChildEventsFd}};
    try {
      child_ = Child::spawn(so);
    } catch (...) {
      ::close(log_fd);
      ::close(ev[0]);
      ::close(ev[1]);
      throw;
    }
    ::close(log_fd);
    ::close(ev[1]);
    ev_ = ev[0];
    ::fcntl(ev_, F_SETFL, O_NONBLOCK);
    t0_ = last_event_ = std::chrono::steady_clock::now();
  }

  // [Note: how a test process ends] A process ends one way, set once (end_as): it exited by
  // itself, tdc killed it for going quiet (--idle-timeout), the run was interrupted, or
  // --stop-on-failure stopped it. finish() makes the records from that ending.
  enum class Ending { kRunning, kExited, kIdleKilled, kInterrupted, kStopped };

  // Reads what the child reported; true once it has ended.
  bool service() {
    if (ending_ != Ending::kRunning) return true;
    if (pipe_open_) {
      size_t before = buf_.size();
      pipe_open_ = drain(ev_, buf_);
      if (consume_lines(buf_) || buf_.size() != before) last_event_ = std::chrono::steady_clock::now();
    }
    if (child_.poll()) {
      drain(ev_, buf_);
      consume_lines(buf_);
      end_as(Ending::kExited);
      return true;
    }
    double idle = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_event_).count();
    if (idle > o_.idle_timeout_s) {
      end_as(Ending::kIdleKilled);
      progress_.note(fmt::format("{}: no test event for {:.0f} s; killing it", label_, idle));
      child_.terminate(5);
      return true;
    }
    return false;
  }

  // The run was interrupted: stop the child (its group), keep what it reported.
  void interrupt() {
    if (ending_ != Ending::kRunning) return;
    end_as(Ending::kInterrupted);
    child_.terminate(3);
  }

  // Another process had a failing test under --stop-on-failure: stop this one (its group). Its
  // finished tests keep their records; the test it was running gets none (it neither passed nor
  // failed), and neither does the process itself.
  void stop_early() {
    if (ending_ != Ending::kRunning) return;
    end_as(Ending::kStopped);
    child_.terminate(3);
  }

  BinaryOutcome finish() {
    const Binary& b = b_;
    const fs::path raw = raw_, log = this->log();
    if (ending_ == Ending::kRunning) throw std::logic_error("ShardRunner::finish: " + label_ + " has not ended");
    const bool idle_killed = ending_ == Ending::kIdleKilled, was_interrupted = ending_ == Ending::kInterrupted;
    ::close(ev_);
    ev_ = -1;
    int status = child_.wait();
    double duration = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    if (child_.left_processes())
      progress_.note(
          fmt::format("warning: {} left processes running in its process group after "
                      "it exited; tdc killed them",
                      label_));
    BinaryOutcome out;
    out.interrupted = was_interrupted;
    if (ending_ == Ending::kStopped) {
      for (const EventEnd& e : ended_) {
        auto [suite, name] = split_id(e.id);
        out.tests.push_back(make_record(suite, name, e.status, e.duration_s, e.message));
      }
      if (running_) progress_.test_stopped(*running_);
      return out;
    }
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
      progress_.test_ended(*running_, crash_status, t, out.tests.back().message);
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
  void end_as(Ending e) {
    if (ending_ != Ending::kRunning)
      throw std::logic_error(fmt::format("ShardRunner {}: ending {} after ending {}", label_, static_cast<int>(e),
                                         static_cast<int>(ending_)));
    ending_ = e;
  }

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
          saw_failure_ = saw_failure_ || harness::is_failure(end.status);
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
  Binary b_;
  std::string label_;
  fs::path raw_;
  Child child_;
  int ev_ = -1;
  bool pipe_open_ = true, saw_failure_ = false;
  Ending ending_ = Ending::kRunning;
  std::string buf_;
  std::chrono::steady_clock::time_point t0_, last_event_;
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

namespace {

// Test id -> duration in an earlier results.json (none when there is no readable one): how
// shards are balanced ([Note: tests side by side]).
std::map<std::string, double> previous_durations(const fs::path& results_json) {
  std::map<std::string, double> out;
  std::error_code ec;
  if (!fs::is_regular_file(results_json, ec)) return out;
  try {
    for (const TestResult& t : harness::read_results(results_json).tests)
      if (t.duration_s > 0) out[t.id] = t.duration_s;
  } catch (const std::exception&) {
    // An unreadable earlier run only costs the balance, never the run.
  }
  return out;
}

struct ShardOutcome {
  size_t binary = 0;
  int shard = 0, resume = 0;  // for a deterministic merge order
  BinaryOutcome outcome;
  fs::path log;
};

// A shard in flight, and how to name its next process if it has to be started again.
struct Slot {
  std::unique_ptr<ShardRunner> runner;
  size_t binary = 0;
  int shard = 0, resume = 0;
  std::string base_label;
};

std::string join_filter(const std::vector<std::string>& tests) { return fmt::format("{}", fmt::join(tests, ":")); }

// Runs repeat `rep` of the plan, up to o.jobs processes at once; returns every process's outcome.
// With --stop-on-failure no further shard starts once one reported a failing test, and those
// running are stopped (their finished tests keep their records). An interruption stops them all
// and keeps what they reported.
std::vector<ShardOutcome> run_shards(const Options& o, Progress& progress, const std::vector<Binary>& binaries,
                                     const std::vector<Shard>& plan, int rep, bool& was_interrupted) {
  std::deque<Slot> queue;
  for (const Shard& sh : plan) {
    const Binary& b = binaries[sh.binary];
    Binary part = b;
    if (sh.of > 1) {
      part.tests = sh.tests;
      part.filter = join_filter(sh.tests);
    }
    std::string label = b.name;
    if (sh.of > 1) label += fmt::format(".shard{}", sh.index + 1);
    if (o.repeat > 1) label += fmt::format(".rep{}", rep + 1);
    queue.push_back(
        Slot{std::make_unique<ShardRunner>(o, progress, std::move(part), label), sh.binary, sh.index, 0, label});
  }
  std::vector<ShardOutcome> outcomes;
  std::vector<Slot> running;
  bool stop = false;
  // --stop-on-failure: a test failed in `where`; no process starts, every running one stops.
  auto stop_all = [&](const std::string& where) {
    stop = true;
    fmt::print(stderr, "tdc run: a test failed in {}; stopping every test process (--stop-on-failure)\n", where);
    for (Slot& other : running) other.runner->stop_early();
  };
  while (!running.empty() || (!queue.empty() && !stop && !was_interrupted)) {
    while (!stop && !was_interrupted && static_cast<int>(running.size()) < o.jobs && !queue.empty()) {
      running.push_back(std::move(queue.front()));
      queue.pop_front();
      running.back().runner->start();
    }
    std::vector<pollfd> fds;
    for (const Slot& s : running)
      if (int fd = s.runner->event_fd(); fd >= 0) fds.push_back({fd, POLLIN, 0});
    if (fds.empty())
      ::usleep(100 * 1000);
    else
      ::poll(fds.data(), fds.size(), 200);
    const bool interrupt_now = interrupted() != 0 && !was_interrupted;
    if (interrupt_now) {
      was_interrupted = true;
      for (Slot& s : running) s.runner->interrupt();
    }
    for (size_t i = 0; i < running.size();) {
      Slot& s = running[i];
      bool done = s.runner->service();
      if (o.stop_on_failure && !stop && s.runner->saw_failure()) {
        stop_all(s.runner->label());
        done = true;
      }
      if (!done) {
        ++i;
        continue;
      }
      ShardOutcome finished{s.binary, s.shard, s.resume, s.runner->finish(), s.runner->log()};
      const Binary& part = s.runner->part();
      // [Note: one death costs one test] A process that dies inside a test (a crash of the
      // process that runs the ranks: the thread launcher, or a bug in the harness itself) is
      // started again for the tests it had not reported, each time in its own log
      // (LABEL.resumeK.log), until every test of the shard has a record.
      const std::vector<std::string> left = tests_not_reported(part, finished.outcome);
      const bool go_on = finished.outcome.died_in_test && !finished.outcome.interrupted && !left.empty() &&
                         left.size() < part.tests.size();
      // A failure the event stream did not carry (the process died): stop the others too.
      if (o.stop_on_failure && !stop &&
          std::any_of(finished.outcome.tests.begin(), finished.outcome.tests.end(),
                      [](const TestResult& t) { return harness::is_failure(t.status); }))
        stop_all(s.runner->label());
      outcomes.push_back(std::move(finished));
      if (go_on && !was_interrupted && !stop) {
        progress.note(fmt::format("{} died in a test; starting it again for its {} remaining tests", s.runner->label(),
                                  left.size()));
        Binary rest = part;
        rest.tests = left;
        rest.filter = join_filter(left);
        ++s.resume;
        s.runner = std::make_unique<ShardRunner>(o, progress, std::move(rest),
                                                 fmt::format("{}.resume{}", s.base_label, s.resume));
        s.runner->start();
        ++i;
        continue;
      }
      running.erase(running.begin() + static_cast<long>(i));
    }
    progress.tick();
  }
  return outcomes;
}

// The records of one repeat in the binaries' order, each binary's tests in listed order, then
// the records a binary made of itself ("(binary)"), shard by shard: the same results.json
// whatever --jobs was and whichever shard ended first.
std::vector<TestResult> merge_shards(const std::vector<Binary>& binaries, std::vector<ShardOutcome>& outcomes,
                                     std::map<std::string, fs::path>& log_of) {
  std::stable_sort(outcomes.begin(), outcomes.end(), [](const ShardOutcome& a, const ShardOutcome& b) {
    return std::tie(a.binary, a.shard, a.resume) < std::tie(b.binary, b.shard, b.resume);
  });
  std::vector<TestResult> out;
  for (size_t bi = 0; bi < binaries.size(); ++bi) {
    std::map<std::string, TestResult> listed;
    std::vector<TestResult> other;
    for (ShardOutcome& r : outcomes) {
      if (r.binary != bi) continue;
      const std::set<std::string> wanted(binaries[bi].tests.begin(), binaries[bi].tests.end());
      for (TestResult& t : r.outcome.tests) {
        if (!r.outcome.with_log_tail.count(t.id)) log_of[t.id] = r.log;
        if (wanted.count(t.id) && !listed.count(t.id))
          listed.emplace(t.id, std::move(t));
        else
          other.push_back(std::move(t));
      }
    }
    for (const std::string& id : binaries[bi].tests)
      if (auto it = listed.find(id); it != listed.end()) out.push_back(std::move(it->second));
    for (TestResult& t : other) out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

namespace {

// [Note: a run's steps] `tdc run` is a pipeline: select -> preflight -> prepare -> list -> run ->
// assemble -> write -> verdict. Each step below is one function; what flows between them is the
// Options, the binaries (with their listed tests), the records, and what the tests reported.

// What running the tests produced (step "run").
struct TestsRun {
  std::vector<TestResult> records;
  std::map<std::string, fs::path> log_of;  // test id -> the log that holds it
  std::vector<harness::RunInfo> reported;  // run_info of every binary results file
  bool interrupted = false;
};

// step "prepare": the output folders, without an earlier run's logs and raw results (they would
// be read as this run's: the report indexes every log there, and another --jobs names its shards
// differently).
void prepare_out_dir(const Options& o) {
  for (const char* sub : {"logs", "raw"}) {
    std::error_code ec;
    fs::create_directories(o.out / sub, ec);
    if (ec) throw UsageError(fmt::format("cannot create '{}': {}", (o.out / sub).string(), ec.message()));
    const std::string ext = std::string(sub) == "logs" ? ".log" : ".json";
    for (fs::directory_iterator it(o.out / sub, ec), end; !ec && it != end; it.increment(ec))
      if (it->is_regular_file() && it->path().extension() == ext) fs::remove(it->path(), ec);
  }
}

// step "list": each binary's tests (into b.tests). A binary that does not exist or cannot list
// its tests becomes a CRASH record, returned.
std::vector<TestResult> list_tests(std::vector<Binary>& binaries, const Options& o) {
  std::vector<TestResult> records;
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
  }
  return records;
}

// step "run": every repeat of the listed tests, as shards side by side ([Note: tests side by
// side]), merged back in listed order (and over repeats).
TestsRun run_tests(const Options& o, const std::vector<Binary>& binaries) {
  int total = 0;
  std::vector<std::vector<std::string>> lists;
  for (const Binary& b : binaries) {
    lists.push_back(b.tests);
    total += static_cast<int>(b.tests.size());
  }
  fmt::print(stderr, "tdc run: {} tests in {} binaries (filter '{}', backend {}, device {}, launcher {}) -> {}\n",
             total, binaries.size(), o.filter, o.backend, o.device, o.launcher, o.out.string());
  if (o.repeat > 1) fmt::print(stderr, "tdc run: every test {} times (--repeat)\n", o.repeat);
  const std::vector<Shard> plan =
      plan_shards(lists, o.jobs, previous_durations(o.durations.value_or(o.out / "results.json")), !o.suites.empty());
  if (o.jobs > 1)
    fmt::print(stderr, "tdc run: {} test processes, up to {} at once (--jobs {})\n", plan.size(), o.jobs, o.jobs);

  TestsRun run;
  run.interrupted = interrupted() != 0;
  Progress progress(total * o.repeat);
  std::vector<std::vector<TestResult>> repeats(static_cast<size_t>(o.repeat));
  for (int rep = 0; rep < o.repeat && !run.interrupted; ++rep) {
    std::vector<ShardOutcome> outcomes = run_shards(o, progress, binaries, plan, rep, run.interrupted);
    for (const ShardOutcome& r : outcomes)
      if (r.outcome.results) run.reported.push_back(r.outcome.results->run_info);
    repeats[static_cast<size_t>(rep)] = merge_shards(binaries, outcomes, run.log_of);
  }
  run.records = o.repeat == 1 ? std::move(repeats[0]) : merge_repeats(repeats);
  progress.finish();
  if (run.interrupted) fmt::print(stderr, "tdc run: interrupted; writing the results so far\n");
  return run;
}

// [Note: run_info from the CLI] The run's backend, device and launcher are what the CLI asked
// for; a binary that reports others is named in a warning (it ignored a flag), not believed.
// What only the binaries know (the implementation they loaded, LibTorch as they saw it, the
// largest world) comes from their results, the first that says.
harness::RunInfo run_info_of(const Options& o, const std::vector<harness::RunInfo>& reported,
                             const std::string& revision) {
  harness::RunInfo info;
  info.backend = o.backend;
  info.device = o.device;
  info.launcher = o.launcher;
  if (o.implementation) info.implementation = *o.implementation;
  bool named = false;
  for (const harness::RunInfo& ri : reported) {
    for (auto [field, ours, theirs] :
         {std::tuple{"backend", info.backend, ri.backend}, std::tuple{"device", info.device, ri.device},
          std::tuple{"launcher", info.launcher, ri.launcher}})
      if (!theirs.empty() && theirs != ours)
        fmt::print(stderr, "tdc run: warning: a test binary reports {} '{}' where this run asked for '{}'\n", field,
                   theirs, ours);
    if (!named && !ri.implementation_version.empty()) {
      info.implementation = ri.implementation;
      info.implementation_version = ri.implementation_version;
      info.implementation_library = ri.implementation_library;
      named = true;
    }
    if (info.libtorch_version.empty()) info.libtorch_version = ri.libtorch_version;
    if (info.libtorch_cuda.empty()) info.libtorch_cuda = ri.libtorch_cuda;
    if (info.nccl_version.empty()) info.nccl_version = ri.nccl_version;
    if (info.compiler.empty()) info.compiler = ri.compiler;
    info.world_size = std::max(info.world_size, ri.world_size);
  }
  fill_libtorch_info(o.build, info);
  info.suite_revision = revision;
  info.tdc_version = TDC_VERSION;
  info.host = harness::hostname();
  return info;
}

// step "assemble": the records under the run's expectations, with the run_info and the union of
// the tests' reports.
RunResults assemble(const Options& o, std::vector<TestResult> records, const TestsRun& run,
                    const std::string& revision) {
  RunResults merged;
  merged.run_info = run_info_of(o, run.reported, revision);
  harness::Expectations expectations;
  if (o.expectations) expectations = harness::read_expectations(*o.expectations);
  for (auto& t : records) {
    harness::apply_expectations(t, expectations);  // idempotent: binaries applied them already
    merged.run_info.world_size = std::max(merged.run_info.world_size, t.world_size);
  }
  merged.tests = std::move(records);
  for (const TestResult& t : merged.tests) harness::merge_reports(merged.reports, t.reports);
  return merged;
}

// step "write": results.json, junit.xml, the summary and failures on the console, the report
// (on rank 0 only under an external launcher: [Note: rank 0 writes the run]).
void write_outputs(const Options& o, const RunResults& merged, const TestsRun& run) {
  if (o.external_rank > 0) {
    fmt::print(
        "tdc run: rank {} of an external launcher: rank 0 writes every rank's results to {}; this rank's "
        "logs are in {}\n",
        o.external_rank, o.out.parent_path().parent_path().string(), (o.out / "logs").string());
    return;
  }
  const fs::path json_path = o.out / "results.json", xml_path = o.out / "junit.xml";
  harness::write_results_json(merged, json_path);
  harness::write_junit_xml(merged, xml_path);
  print_summary(merged, merged.run_info.duration_s);
  print_failures(merged, run.log_of);
  fmt::print("\nresults: {}\njunit:   {}\nlogs:    {}\n", json_path.string(), xml_path.string(),
             (o.out / "logs").string());
  if (!o.no_report) write_run_report(o, json_path);
}

// step "verdict": the exit status (kExit* in cli.h), after --check re-read the files.
int verdict(const Options& o, const RunResults& merged, const TestsRun& run, size_t binaries) {
  int code = merged.ok() ? kExitOk : kExitFailed;
  if (merged.tests.empty()) {
    fmt::print(stderr, "tdc run: no tests matched --filter '{}' in the {} binaries\n", o.filter, binaries);
    code = kExitFailed;
  }
  if (o.check && o.external_rank == 0) {
    if (auto err = check_outputs(o.out / "results.json", o.out / "junit.xml")) {
      fmt::print(stderr, "tdc run: check failed: {}\n", *err);
      code = kExitFailed;
    } else {
      fmt::print("check:   results.json ({} tests) and junit.xml re-read and valid\n", merged.tests.size());
    }
  }
  return run.interrupted ? kExitInterrupted : code;
}

}  // namespace

// [Note: a run's steps]
int run_command(const std::vector<std::string>& args) {
  ParsedArgs a = parse_args("run", kRunOptions, args, false);
  if (a.help) {
    fmt::print("{}{}", kRunUsage, format_options(kRunOptions));
    return kExitOk;
  }
  const Options o = parse_options(a);
  const std::string started_at = harness::iso_now();
  const auto t0 = std::chrono::steady_clock::now();

  std::vector<Binary> binaries = select_binaries(o);
  if (o.impl) {
    ImplementationDescriptor d = use_implementation(*o.impl, o.out / "impl");
    fmt::print(stderr, "tdc run: implementation {} {} from {} ({} features)\n", d.name, d.version, o.impl->string(),
               d.features.size());
  }
  preflight(binaries, o);
  const std::string revision = git_revision(resolve_source_dir(o.build));
  ::setenv("TDC_SUITE_REVISION", revision.c_str(), 1);  // the binaries put it in their run_info too
  prepare_out_dir(o);
  std::vector<TestResult> records = list_tests(binaries, o);
  TestsRun run = run_tests(o, binaries);
  for (TestResult& t : run.records) records.push_back(std::move(t));
  RunResults merged = assemble(o, std::move(records), run, revision);
  merged.run_info.started_at = started_at;
  merged.run_info.duration_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write_outputs(o, merged, run);
  return verdict(o, merged, run, binaries.size());
}

}  // namespace tdc::cli
