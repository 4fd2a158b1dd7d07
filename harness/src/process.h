// Parent side of a launch: watches rank processes (pidfd + pipes), enforces the deadline and
// the first-failure abort, and turns what it saw into an Outcome.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "internal.h"

namespace tdc::harness::detail {

struct ChildProc {
  pid_t pid = -1;
  int pidfd = -1;
  int events_fd = -1;      // read end of the rank -> parent event pipe
  int output_fd = -1;      // read end of the child's stdout+stderr
  std::vector<int> ranks;  // ranks this process hosts (one, or all for the thread launcher)
  std::string stacks_path;
  // filled by the supervisor
  std::string event_buf, output;
  bool exited = false;
  int wait_status = 0;
};

class Supervisor {
 public:
  Supervisor(const LaunchSpec& spec, std::string temp_dir);
  ~Supervisor();  // kills and reaps anything still alive
  void add(ChildProc child);
  Outcome run();
  const std::vector<ChildProc>& children() const { return children_; }
  // Without processes (the env launcher): feed every rank's event lines, then get the outcome.
  void ingest(const std::string& event_lines);
  Outcome outcome_from_events(double elapsed) { return make_outcome(false, "", elapsed); }

 private:
  struct RankState {
    bool done = false;
    bool skipped = false;
    std::vector<Failure> failures;
    std::vector<std::string> skips;
    double duration_s = 0;
  };
  void handle_events(std::string& buf);
  void drain(ChildProc& c);
  void reap(ChildProc& c, bool block);
  void kill_all();
  Outcome make_outcome(bool timed_out, const std::string& stacks, double elapsed);
  // Pieces of run() and make_outcome(): one poll of every live child's fds (at most wait_ms);
  // the first failure's abort time; one rank's detail; the status and message of the test; the
  // notes a TIMEOUT or a stopped run adds. poll_children is false when poll itself failed.
  bool poll_children(int wait_ms);
  void note_first_failure(std::optional<std::chrono::steady_clock::time_point>& abort_at);
  RankDetail rank_detail(int rank, bool timed_out, const ChildProc* proc) const;
  void set_verdict(Outcome& o, bool timed_out, const std::string& stacks, double elapsed) const;
  void add_abort_notes(Outcome& o, bool timed_out, const std::string& stacks) const;
  bool child_crashed(const ChildProc& c) const;
  std::string crash_reason(const ChildProc& c, int rank) const;
  std::string capture_live_stacks() const;  // "" when every process has exited

  LaunchSpec spec_;
  std::string temp_dir_;
  std::vector<ChildProc> children_;
  std::vector<RankState> ranks_;
  std::vector<int> aborted_ranks_;
  std::vector<Failure> failures_in_order_;
  Reports reports_;          // [Note: rank reports]: the union over ranks  // every rank's failures, as they arrived
  int first_bad_rank_ = -1;  // the rank whose failure, skip or crash came first
};

// [Note: nothing untracked when the interrupt comes] on_terminate kills the tracked rank
// processes and removes the tracked temp dir. A rank forked but not yet tracked, or a temp dir
// made but not yet tracked, would outlive it: SIGINT, SIGTERM and SIGHUP are held back while one
// is made and tracked, and arrive when this guard ends (a forked rank lets them through once its
// handlers are the defaults again: reset_signal_handlers_in_child).
class HoldTermination {
 public:
  HoldTermination();
  ~HoldTermination();
  HoldTermination(const HoldTermination&) = delete;
  HoldTermination& operator=(const HoldTermination&) = delete;

 private:
  sigset_t previous_;
};

// A fresh private temp dir for one test ($TMPDIR or /tmp); removed by remove_temp_dir.
std::string make_temp_dir(const std::string& test_id);
void remove_temp_dir(const std::string& path);

}  // namespace tdc::harness::detail
