// Internals shared by the harness's translation units. Not installed, not for tests.
#pragma once

#include <sys/types.h>

#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tdc/harness/harness.h"
#include "tdc/harness/internal/runtime.h"
#include "tdc/harness/launch.h"

namespace tdc::harness::detail {

// ---------------------------------------------------------------- rank -> parent event stream
// One JSON object per line on a pipe. Lines are written whole under a process-wide mutex, so
// thread ranks sharing one pipe never interleave.
//   {"e":"fail","rank":r,"file":f,"line":n,"msg":m}   a failed assertion or an exception
//   {"e":"skip","rank":r,"msg":m}                      GTEST_SKIP / TDC_SKIP_IF
//   {"e":"report","rank":r,"name":n,"data":{k:[v]}}    [Note: rank reports], before "done"
//   {"e":"done","rank":r,"dur":s}                      the body returned
class EventSink {
 public:
  explicit EventSink(int fd) : fd_(fd) {}
  void write(const nlohmann::json& j);
  int fd() const { return fd_; }

 private:
  int fd_;
};

// Thrown by barrier() when a peer that failed or skipped has left the body: ends this rank's
// body without a failure of its own (the peer's event already explains the outcome).
struct PeerLeft : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Runs `body` as rank ctx.rank on the calling thread: installs the context, seeds, intercepts
// GoogleTest results and exceptions, and streams events. Never throws.
void run_rank(const RankContext& ctx, const std::function<void()>& body, EventSink& sink, int num_threads);

// Installs (and clears) the calling thread's context.
struct ContextScope {
  explicit ContextScope(const RankContext& c);
  ~ContextScope();
};

// The current subtest label of the calling thread ("" outside subtests).
std::string& subtest_label();

// A skip message from TDC_NOT_SUPPORTED (harness.h writes the mark "[NOT_SUPPORTED]"): the one
// test of it, for the per-rank outcome (process.cpp) and the results listener (main.cpp).
inline bool is_not_supported_message(const std::string& message) {
  return message.find("[NOT_SUPPORTED]") != std::string::npos;
}

// ---------------------------------------------------------------- stacks
// In a rank process: SIGUSR2 makes every thread write its stack to `path`, and fatal signals print
// a backtrace to stderr before the process dies with the same signal.
void install_rank_signal_handlers(const std::string& stacks_path, int rank_hint);
// The test binary's own process: a fatal signal prints its backtrace ([Note: a supervisor that crashes says where]).
void install_process_signal_handlers();
// The rank a fatal-signal backtrace names for the calling thread (thread launcher).
void set_signal_rank(int rank);
// In the parent: ask `pid` for its stacks (signal or gdb per internal::settings().stacks), at most
// `budget_s` seconds. Returns readable, demangled text.
std::string capture_stacks(pid_t pid, const std::string& stacks_path, double budget_s);
std::string demangle_text(const std::string& text);
// `text` with each unnamed frame "bin(+0x...) [0x...]" followed by its function and file:line,
// as far as addr2line can tell within `budget_s` ([Note: frames with file:line], symbolize.cpp).
std::string symbolize_frames(const std::string& text, double budget_s);

// A helper program's output (stdout and stderr), run with at most `budget_s` seconds (then killed).
struct ProgramOutput {
  std::string text;
  bool finished = false;  // exited within the budget; `status` is its wait status
  int status = 0;
};
ProgramOutput run_program(const std::vector<std::string>& argv, double budget_s);

// [Note: the odd rank first] In a hang most ranks usually wait in one place (a collective, a
// barrier) for the one or few that are elsewhere, and a long report cut after 60 lines would hide
// exactly those. stacks_odd_first() groups the processes' stack blocks by where they are (their
// frames with every number and address blanked) and, when one group is larger than every other,
// puts the processes outside it first, after a line naming them. Otherwise (one process, all in
// one place, or no single largest group) the blocks stay in rank order.
struct StackBlock {
  std::string label;  // "rank 2", "ranks 0,1,2,3 (threads)"
  std::string text;   // "==== stacks of ... ====\n..." as capture_stacks() reads it
};
std::string stacks_odd_first(const std::vector<StackBlock>& blocks);

// ---------------------------------------------------------------- parent-side bookkeeping
// Live rank processes and the current temp dir, for the SIGINT/SIGTERM handler.
void track_child(pid_t pid);
void untrack_child(pid_t pid);
void track_temp_dir(const std::string& path);
void install_parent_signal_handlers();
void reset_signal_handlers_in_child();
bool interrupted();
// Set when a spawn-launched process is a rank (--tdc_child).
struct ChildSpec {
  bool active = false;
  int rank = 0, world_size = 0, events_fd = -1;
  std::string temp_dir;
  uint64_t seed = 1234;
  int num_threads = 1;
};
ChildSpec& child_spec();

// [Note: rank reports]: every registered reporter's reset, in this process; its collect on
// `rank`, as {"e":"report","rank":r,"name":n,"data":{key:[values]}} events.
void reset_rank_reports();
void write_rank_reports(EventSink& sink, int rank);

// Outcome of the test that run_distributed ran last, for the results listener.
struct LastOutcome {
  std::string test_id;
  Outcome outcome;
  int world_size = 0;
  std::string launcher;
};
LastOutcome& last_outcome();

// Resolved options for a test: test > suite > run defaults.
LaunchSpec resolve(const char* suite, const char* name, const TestOptions& o);

std::string signal_name(int sig);

}  // namespace tdc::harness::detail
