// `tdc run`'s test processes side by side ([Note: tests side by side]): one ShardRunner per
// process, run_shards() keeping up to --jobs of them alive, merge_shards() putting their records
// back in listed order.
#include "run_processes.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "cpu_groups.h"
#include "process.h"

namespace tdc::cli::run_detail {

using harness::RunResults;
using harness::Status;
using harness::TestResult;
using nlohmann::json;

namespace {

// A test as the event stream reported it (used when a binary leaves no results file).
struct EventEnd {
  std::string id;
  Status status = Status::Pass;
  double duration_s = 0;
  std::string message;
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

  // `cpus`: where the process may run ([Note: a test process on its own CPUs]); empty: anywhere.
  void start(const std::vector<int>& cpus) {
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
      if (!cpus.empty()) header << fmt::format("# on CPUs {}\n", fmt::join(cpus, ","));
    }
    ::lseek(log_fd, 0, SEEK_END);

    progress_.binary_started(label_, static_cast<int>(b_.tests.size()));
    SpawnOptions so;
    so.argv = argv;
    so.stdout_fd = so.stderr_fd = log_fd;
    so.extra_fds = {{ev[1], kChildEventsFd}};
    so.cpus = cpus;
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
    if (ending_ == Ending::kRunning) throw std::logic_error("ShardRunner::finish: " + label_ + " has not ended");
    const Exit exit = reap();
    BinaryOutcome out;
    out.interrupted = ending_ == Ending::kInterrupted;
    if (ending_ == Ending::kStopped) {
      add_event_records(out);
      if (running_) progress_.test_stopped(*running_);
      return out;
    }
    const std::string results_error = read_results_file(out);
    if (out.results) {
      out.tests = out.results->tests;
      if (!exit.clean || ending_ == Ending::kIdleKilled)
        add_with_log(out, make_record(b_.name, "(binary)", exit.crash_status, exit.duration,
                                      fmt::format("{} {} after writing its results; log {}:\n{}", b_.name, exit.how,
                                                  log().string(), exit.log_tail)));
      return out;
    }
    return without_results(std::move(out), exit, results_error);
  }

 private:
  // How the process ended, as the records put it.
  struct Exit {
    int status = 0;
    double duration = 0;
    bool clean = false;  // exited with 0 or 1 (GoogleTest's "some test failed")
    std::string how;     // "exited with 3", "was interrupted", ...
    Status crash_status = Status::Crash;
    std::string log_tail;
  };

  Exit reap() {
    ::close(ev_);
    ev_ = -1;
    Exit e;
    e.status = child_.wait();
    e.duration = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    if (child_.left_processes())
      progress_.note(
          fmt::format("warning: {} left processes running in its process group after "
                      "it exited; tdc killed them",
                      label_));
    const bool idle_killed = ending_ == Ending::kIdleKilled;
    e.clean = WIFEXITED(e.status) && (WEXITSTATUS(e.status) == 0 || WEXITSTATUS(e.status) == 1);
    e.how = idle_killed ? fmt::format("was killed after {:.0f} s without a test event", o_.idle_timeout_s)
            : ending_ == Ending::kInterrupted ? "was interrupted"
                                              : describe_exit(e.status);
    e.crash_status = idle_killed ? Status::Timeout : Status::Crash;
    e.log_tail = file_tail(log(), 30);
    return e;
  }

  // The binary's own results file into out.results; "" or why it is missing or unusable.
  std::string read_results_file(BinaryOutcome& out) const {
    if (!fs::exists(raw_)) return fmt::format("no results file '{}'", raw_.string());
    try {
      out.results = harness::read_results(raw_);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }

  void add_event_records(BinaryOutcome& out) const {
    for (const EventEnd& e : ended_) {
      auto [suite, name] = split_id(e.id);
      out.tests.push_back(make_record(suite, name, e.status, e.duration_s, e.message));
    }
  }

  static void add_with_log(BinaryOutcome& out, TestResult t) {
    out.with_log_tail.insert(t.id);
    out.tests.push_back(std::move(t));
  }

  // No usable results file: keep what the event stream reported, then say what happened.
  BinaryOutcome without_results(BinaryOutcome out, const Exit& exit, const std::string& results_error) {
    const bool was_interrupted = ending_ == Ending::kInterrupted, idle_killed = ending_ == Ending::kIdleKilled;
    add_event_records(out);
    size_t reported = ended_.size();
    if (running_) {
      auto [suite, name] = split_id(*running_);
      double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - running_since_).count();
      add_with_log(out, make_record(suite, name, exit.crash_status, t,
                                    fmt::format("{} {} while running this test ({}); log {}:\n{}", b_.name, exit.how,
                                                results_error, log().string(), exit.log_tail)));
      progress_.test_ended(*running_, exit.crash_status, t, out.tests.back().message);
      ++reported;
      out.died_in_test = !was_interrupted;
    }
    if (!running_ || (exit.clean && !idle_killed && !was_interrupted)) {
      add_with_log(out, make_record(b_.name, "(binary)",
                                    exit.clean && !was_interrupted ? Status::Fail : exit.crash_status, exit.duration,
                                    fmt::format("{} {} without usable results ({}); {} of {} listed tests reported; "
                                                "log {}:\n{}",
                                                b_.name, exit.how, results_error, reported, b_.tests.size(),
                                                log().string(), exit.log_tail)));
    }
    return out;
  }

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

}  // namespace

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

namespace {

// A shard in flight, and how to name its next process if it has to be started again.
struct Slot {
  std::unique_ptr<ShardRunner> runner;
  size_t binary = 0;
  int shard = 0, resume = 0;
  std::string base_label;
  int cpu_group = -1;  // CpuGroups' group while running; -1: not pinned
};

std::string join_filter(const std::vector<std::string>& tests) { return fmt::format("{}", fmt::join(tests, ":")); }

// The processes of one repeat: those waiting, those running, and the outcomes of those ended.
class ShardLoop {
 public:
  ShardLoop(const Options& o, Progress& progress, bool& was_interrupted)
      : o_(o), progress_(progress), was_interrupted_(was_interrupted), cpus_(allowed_cpus(), o.pin ? o.jobs : 1) {}

  void enqueue(const std::vector<Binary>& binaries, const std::vector<Shard>& plan, int rep) {
    for (const Shard& sh : plan) {
      const Binary& b = binaries[sh.binary];
      Binary part = b;
      if (sh.of > 1) {
        part.tests = sh.tests;
        part.filter = join_filter(sh.tests);
      }
      std::string label = b.name;
      if (sh.of > 1) label += fmt::format(".shard{}", sh.index + 1);
      if (o_.repeat > 1) label += fmt::format(".rep{}", rep + 1);
      queue_.push_back(
          Slot{std::make_unique<ShardRunner>(o_, progress_, std::move(part), label), sh.binary, sh.index, 0, label});
    }
  }

  std::vector<ShardOutcome> run() {
    while (!running_.empty() || (!queue_.empty() && !stop_ && !was_interrupted_)) {
      start_ready();
      wait_for_events();
      if (interrupted() != 0 && !was_interrupted_) {
        was_interrupted_ = true;
        for (Slot& s : running_) s.runner->interrupt();
      }
      for (size_t i = 0; i < running_.size();) {
        if (service(running_[i])) {
          ++i;
        } else {
          cpus_.release(running_[i].cpu_group);
          running_.erase(running_.begin() + static_cast<long>(i));
        }
      }
      progress_.tick();
    }
    return std::move(outcomes_);
  }

 private:
  void start_ready() {
    while (!stop_ && !was_interrupted_ && static_cast<int>(running_.size()) < o_.jobs && !queue_.empty()) {
      running_.push_back(std::move(queue_.front()));
      queue_.pop_front();
      Slot& s = running_.back();
      s.cpu_group = cpus_.acquire();
      s.runner->start(cpus_.cpus(s.cpu_group));
    }
  }

  void wait_for_events() const {
    std::vector<pollfd> fds;
    for (const Slot& s : running_)
      if (int fd = s.runner->event_fd(); fd >= 0) fds.push_back({fd, POLLIN, 0});
    if (fds.empty())
      ::usleep(100 * 1000);
    else
      ::poll(fds.data(), fds.size(), 200);
  }

  // --stop-on-failure: a test failed in `where`; no process starts, every running one stops.
  void stop_all(const std::string& where) {
    stop_ = true;
    fmt::print(stderr, "tdc run: a test failed in {}; stopping every test process (--stop-on-failure)\n", where);
    for (Slot& other : running_) other.runner->stop_early();
  }

  // Services one running process; false once it ended for good (its outcome recorded).
  bool service(Slot& s) {
    bool done = s.runner->service();
    if (o_.stop_on_failure && !stop_ && s.runner->saw_failure()) {
      stop_all(s.runner->label());
      done = true;
    }
    if (!done) return true;
    ShardOutcome finished{s.binary, s.shard, s.resume, s.runner->finish(), s.runner->log()};
    const Binary part = s.runner->part();
    // [Note: one death costs one test] A process that dies inside a test (a crash of the
    // process that runs the ranks: the thread launcher, or a bug in the harness itself) is
    // started again for the tests it had not reported, each time in its own log
    // (LABEL.resumeK.log), until every test of the shard has a record.
    const std::vector<std::string> left = tests_not_reported(part, finished.outcome);
    const bool go_on = finished.outcome.died_in_test && !finished.outcome.interrupted && !left.empty() &&
                       left.size() < part.tests.size();
    // A failure the event stream did not carry (the process died): stop the others too.
    if (o_.stop_on_failure && !stop_ &&
        std::any_of(finished.outcome.tests.begin(), finished.outcome.tests.end(),
                    [](const TestResult& t) { return harness::is_failure(t.status); }))
      stop_all(s.runner->label());
    outcomes_.push_back(std::move(finished));
    if (!go_on || was_interrupted_ || stop_) return false;
    progress_.note(
        fmt::format("{} died in a test; starting it again for its {} remaining tests", s.runner->label(), left.size()));
    Binary rest = part;
    rest.tests = left;
    rest.filter = join_filter(left);
    ++s.resume;
    s.runner = std::make_unique<ShardRunner>(o_, progress_, std::move(rest),
                                             fmt::format("{}.resume{}", s.base_label, s.resume));
    s.runner->start(cpus_.cpus(s.cpu_group));
    return true;
  }

  const Options& o_;
  Progress& progress_;
  bool& was_interrupted_;
  std::deque<Slot> queue_;
  std::vector<Slot> running_;
  std::vector<ShardOutcome> outcomes_;
  bool stop_ = false;
  CpuGroups cpus_;
};

}  // namespace

// Runs repeat `rep` of the plan, up to o.jobs processes at once; returns every process's outcome.
// With --stop-on-failure no further shard starts once one reported a failing test, and those
// running are stopped (their finished tests keep their records). An interruption stops them all
// and keeps what they reported.
std::vector<ShardOutcome> run_shards(const Options& o, Progress& progress, const std::vector<Binary>& binaries,
                                     const std::vector<Shard>& plan, int rep, bool& was_interrupted) {
  ShardLoop loop(o, progress, was_interrupted);
  loop.enqueue(binaries, plan, rep);
  return loop.run();
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

}  // namespace tdc::cli::run_detail
