#include "process.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

extern char** environ;

namespace tdc::cli {

namespace {

volatile std::sig_atomic_t g_signal = 0;

void on_signal(int sig) { g_signal = sig; }

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// posix_spawn has no affinity attribute; the child inherits the spawning thread's mask. So the
// spawning thread takes the child's CPUs for the call and its own back after it ([Note: a test
// process on its own CPUs], cpu_groups.h). Best effort: a mask the system refuses (CPUs outside
// our cpuset) leaves the child on ours.
class AffinityForSpawn {
 public:
  explicit AffinityForSpawn(const std::vector<int>& cpus) {
    if (cpus.empty() || sched_getaffinity(0, sizeof old_, &old_) != 0) return;
    cpu_set_t want;
    CPU_ZERO(&want);
    for (int c : cpus)
      if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &want);
    changed_ = sched_setaffinity(0, sizeof want, &want) == 0;
  }
  ~AffinityForSpawn() {
    if (changed_) sched_setaffinity(0, sizeof old_, &old_);
  }
  AffinityForSpawn(const AffinityForSpawn&) = delete;
  AffinityForSpawn& operator=(const AffinityForSpawn&) = delete;

 private:
  cpu_set_t old_{};
  bool changed_ = false;
};

}  // namespace

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: poll() and waitpid() return EINTR so loops see the flag
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
}

int interrupted() { return g_signal; }

Child Child::spawn(const SpawnOptions& o) {
  if (o.argv.empty()) throw std::invalid_argument("Child::spawn: empty argv");
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  if (o.stdout_fd >= 0) posix_spawn_file_actions_adddup2(&fa, o.stdout_fd, STDOUT_FILENO);
  if (o.stderr_fd >= 0) posix_spawn_file_actions_adddup2(&fa, o.stderr_fd, STDERR_FILENO);
  // dup2 onto a different number clears close-on-exec, so the child inherits exactly these.
  for (auto [from, to] : o.extra_fds) posix_spawn_file_actions_adddup2(&fa, from, to);
  // Own process group: terminate() reaches the child and everything it forked. Default signal
  // dispositions and an empty mask, whatever the CLI set for itself.
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);

  std::vector<char*> argv;
  for (const auto& a : o.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  int rc = 0;
  {
    AffinityForSpawn pinned(o.cpus);
    rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv.data(), environ);
  }
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) throw std::runtime_error(fmt::format("cannot start '{}': {}", o.argv[0], std::strerror(rc)));
  Child c;
  c.pid_ = pid;
  return c;
}

Child& Child::operator=(Child&& o) noexcept {
  if (this != &o) {
    if (running()) terminate();
    pid_ = std::exchange(o.pid_, -1);
    status_ = o.status_;
    left_processes_ = o.left_processes_;
  }
  return *this;
}

Child::~Child() {
  if (running()) terminate();
}

void Child::signal_group(int sig) const {
  if (pid_ > 0 && ::kill(-pid_, sig) != 0) ::kill(pid_, sig);
}

std::optional<int> Child::poll() {
  if (status_ || pid_ <= 0) return status_;
  int st = 0;
  pid_t r = ::waitpid(pid_, &st, WNOHANG);
  if (r == pid_) status_ = st;
  return status_;
}

int Child::wait(double grace_s) {
  bool forwarded = false;
  Clock::time_point since;
  while (!poll()) {
    if (int sig = interrupted(); sig && !forwarded) {
      signal_group(sig == SIGINT ? SIGINT : SIGTERM);
      forwarded = true;
      since = Clock::now();
    }
    if (forwarded && seconds_since(since) > grace_s) {
      signal_group(SIGKILL);
      int st = 0;
      while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
      status_ = st;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // The leader is gone; anything it left in its group goes with it.
  if (::kill(-pid_, 0) == 0) {
    left_processes_ = true;
    ::kill(-pid_, SIGKILL);
  }
  return *status_;
}

void Child::terminate(double grace_s) {
  if (!running()) return;
  signal_group(SIGTERM);
  auto t0 = Clock::now();
  while (!poll() && seconds_since(t0) < grace_s) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  signal_group(SIGKILL);
  if (!status_) {
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    status_ = st;
  }
}

std::string describe_exit(int st) {
  if (WIFEXITED(st)) return fmt::format("exit status {}", WEXITSTATUS(st));
  if (WIFSIGNALED(st)) {
    int sig = WTERMSIG(st);
    const char* name = strsignal(sig);
    return fmt::format("killed by signal {} ({}){}", sig, name ? name : "?", WCOREDUMP(st) ? ", core dumped" : "");
  }
  return fmt::format("wait status {:#x}", st);
}

int exit_code(int st) {
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return 1;
}

bool drain(int fd, std::string& buf) {
  char chunk[65536];
  for (;;) {
    ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n > 0) {
      buf.append(chunk, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

Captured capture(const std::vector<std::string>& argv, bool merge_stderr, double timeout_s) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error(fmt::format("pipe: {}", std::strerror(errno)));
  int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  SpawnOptions o;
  o.argv = argv;
  o.stdout_fd = fds[1];
  o.stderr_fd = merge_stderr ? fds[1] : devnull;
  Captured c;
  Child child;
  try {
    child = Child::spawn(o);
  } catch (...) {
    ::close(fds[0]);
    ::close(fds[1]);
    ::close(devnull);
    throw;
  }
  ::close(fds[1]);
  ::close(devnull);
  ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
  auto t0 = Clock::now();
  bool open = true;
  // Read until EOF and exit; a grandchild holding the pipe open does not keep us past exit.
  while (open && !interrupted()) {
    if (seconds_since(t0) > timeout_s) {
      c.timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    ::poll(&p, 1, 100);
    open = drain(fds[0], c.output);
    if (open && child.poll()) {
      drain(fds[0], c.output);
      break;
    }
  }
  ::close(fds[0]);
  if (c.timed_out || interrupted()) child.terminate(1);
  c.status = child.wait(1);
  return c;
}

}  // namespace tdc::cli
