// Live progress of `tdc run` on stderr. On a terminal: one line redrawn with \r (done/total,
// elapsed, pass/fail/skip, current test), with failures printed above it as they happen.
// Otherwise (CI logs): one line per finished test, plus a heartbeat while a test runs long.
// Several tests may run at once ([Note: tests side by side]): the line shows the one running
// longest and how many others run beside it.
#pragma once

#include <chrono>
#include <map>
#include <string>

#include "tdc/harness/results.h"

namespace tdc::cli {

class Progress {
 public:
  explicit Progress(int total);
  // A test process started: `label` names the binary (and its shard), `tests` how many it runs.
  void binary_started(const std::string& label, int tests);
  void test_started(const std::string& id);
  void test_ended(const std::string& id, harness::Status status, double duration_s, const std::string& message);
  // A test whose process tdc stopped (--stop-on-failure): no longer running, counted nowhere.
  void test_stopped(const std::string& id);
  // A line for the log / terminal, printed above the progress line.
  void note(const std::string& line);
  void tick();    // call a few times a second: redraws the elapsed time / heartbeat
  void finish();  // clears the progress line

  int done() const { return done_; }
  double elapsed_s() const;

 private:
  void redraw();
  void clear_line();
  std::string counters() const;

  using Clock = std::chrono::steady_clock;
  bool tty_;
  int width_ = 100;
  int total_;
  int done_ = 0, pass_ = 0, fail_ = 0, skip_ = 0, xfail_ = 0;
  // The test running longest: running_'s earliest start ("" when none runs).
  std::pair<std::string, Clock::time_point> longest_running() const;

  std::map<std::string, Clock::time_point> running_;  // test id -> when it started
  Clock::time_point start_ = Clock::now(), last_heartbeat_ = Clock::now();
  bool line_shown_ = false;
};

}  // namespace tdc::cli
