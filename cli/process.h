// Child processes for the tdc CLI: spawn (posix_spawn, own process group), wait, kill the whole
// group, capture output. SIGINT/SIGTERM only set a flag (interrupted()); every wait loop here
// polls it, so no child outlives the CLI.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tdc::cli {

struct SpawnOptions {
  std::vector<std::string> argv;               // argv[0] is looked up on PATH if it has no '/'
  int stdout_fd = -1;                          // -1: inherit
  int stderr_fd = -1;                          // -1: inherit
  std::vector<std::pair<int, int>> extra_fds;  // (fd in this process, fd number in the child)
  std::vector<int> cpus;                       // the child's CPU affinity; empty: inherit ours
};

class Child {
 public:
  // Throws std::runtime_error naming the program and the error.
  static Child spawn(const SpawnOptions& o);

  Child() = default;
  Child(Child&& o) noexcept : pid_(std::exchange(o.pid_, -1)), status_(o.status_), left_processes_(o.left_processes_) {}
  Child& operator=(Child&& o) noexcept;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child();  // a child still running is killed (whole process group)

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !status_; }
  // Non-blocking: the wait status once the child has exited.
  std::optional<int> poll();
  // Blocks until exit. If the CLI is interrupted meanwhile, the signal is forwarded to the
  // child's group, which gets `grace_s` to exit before SIGKILL.
  int wait(double grace_s = 5);
  // SIGTERM to the group, up to grace_s for the leader to exit, then SIGKILL to the group.
  void terminate(double grace_s = 3);
  // After wait(): whether processes the child started were still in its group (and were killed).
  bool left_processes() const { return left_processes_; }

 private:
  void signal_group(int sig) const;
  pid_t pid_ = -1;
  std::optional<int> status_;
  bool left_processes_ = false;
};

// "exit status 3", "killed by signal 11 (Segmentation fault)".
std::string describe_exit(int wait_status);
// The code a shell would report: exit status, or 128 + signal.
int exit_code(int wait_status);

struct Captured {
  int status = 0;  // wait status
  std::string output;
  bool timed_out = false;
};
// Runs argv to completion with stdout (and stderr when merge_stderr; else /dev/null) captured.
Captured capture(const std::vector<std::string>& argv, bool merge_stderr, double timeout_s);

void install_signal_handlers();  // SIGINT, SIGTERM, SIGHUP -> flag; SIGPIPE ignored
int interrupted();               // the signal received, or 0

// Reads everything available from a non-blocking fd into buf. Returns false at EOF.
bool drain(int fd, std::string& buf);

}  // namespace tdc::cli
