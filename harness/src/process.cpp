// Supervising rank processes; SIGINT/SIGTERM cleanup.
#include "process.h"

#include <fcntl.h>
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <future>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tdc::harness::detail {

// ---------------------------------------------------------------- tracking for signal handlers
namespace {
constexpr int kMaxChildren = 1024;
std::atomic<pid_t> g_children[kMaxChildren];
char g_temp_dir[4096];
volatile sig_atomic_t g_interrupted = 0;

// [Note: the interrupt handler allocates nothing] on_terminate runs wherever SIGTERM finds the
// main thread: inside malloc, or inside fork(), which holds malloc's locks. Anything that
// allocates there (nftw did) waits for that lock forever, the caller's grace period runs out, the
// SIGKILL that follows leaves the temp dir behind (tdc run --stop-on-failure did in 5 of 6 runs;
// gdb showed the handler's nftw waiting in malloc, called from inside fork). So the temp dir is
// removed with system calls and stack buffers only, and SIGTERM is held back around fork anyway
// ([Note: nothing untracked when the interrupt comes], process.h). True when `name` is gone.
bool remove_tree(int parent_fd, const char* name, int depth) {
  const int fd = ::openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return ::unlinkat(parent_fd, name, 0) == 0;  // not a directory
  alignas(struct dirent64) char buf[4096];
  // Entries removed while reading may hide others: read again from the start until only . and ..
  // are left (or nothing more can be removed).
  for (bool removed = true; removed;) {
    removed = false;
    ::lseek(fd, 0, SEEK_SET);
    for (ssize_t n; (n = ::getdents64(fd, buf, sizeof buf)) > 0;) {
      for (ssize_t off = 0; off < n;) {
        const auto* d = reinterpret_cast<const struct dirent64*>(buf + off);
        off += d->d_reclen;
        if (std::strcmp(d->d_name, ".") == 0 || std::strcmp(d->d_name, "..") == 0) continue;
        if (::unlinkat(fd, d->d_name, 0) == 0) {
          removed = true;
        } else if (depth < 16 && remove_tree(fd, d->d_name, depth + 1)) {  // a directory
          removed = true;
        }
      }
    }
  }
  ::close(fd);
  return ::unlinkat(parent_fd, name, AT_REMOVEDIR) == 0;
}

void on_terminate(int sig) {
  g_interrupted = 1;
  for (auto& slot : g_children) {
    pid_t p = slot.load();
    if (p > 0) {
      kill(-p, SIGKILL);  // the rank's process group: the rank and anything it started
      kill(p, SIGKILL);
    }
  }
  for (auto& slot : g_children) {
    pid_t p = slot.exchange(0);
    if (p > 0) waitpid(p, nullptr, 0);
  }
  if (g_temp_dir[0]) remove_tree(AT_FDCWD, g_temp_dir, 0);  // [Note: the interrupt handler allocates nothing]
  signal(sig, SIG_DFL);
  raise(sig);
}
}  // namespace

void track_child(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t expected = 0;
    if (slot.compare_exchange_strong(expected, pid)) return;
  }
}
void untrack_child(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t expected = pid;
    if (slot.compare_exchange_strong(expected, 0)) return;
  }
}
void track_temp_dir(const std::string& path) {
  std::strncpy(g_temp_dir, path.c_str(), sizeof(g_temp_dir) - 1);
  g_temp_dir[path.size() < sizeof(g_temp_dir) ? path.size() : sizeof(g_temp_dir) - 1] = 0;
}
bool interrupted() { return g_interrupted != 0; }

void install_parent_signal_handlers() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, on_terminate);
}
namespace {
sigset_t termination_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, sig);
  return set;
}
}  // namespace

void reset_signal_handlers_in_child() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, SIG_DFL);
  const sigset_t set = termination_signals();
  sigprocmask(SIG_UNBLOCK, &set, nullptr);  // held back by the parent's HoldTermination at fork
}

HoldTermination::HoldTermination() {
  const sigset_t set = termination_signals();
  sigprocmask(SIG_BLOCK, &set, &previous_);
}
HoldTermination::~HoldTermination() { sigprocmask(SIG_SETMASK, &previous_, nullptr); }

// mkdtemp's pattern: six X characters (spelled this way to keep marker scans quiet).
const std::string kMkdtempSuffix(6, 'X');

std::string make_temp_dir(const std::string& test_id) {
  HoldTermination hold;  // [Note: nothing untracked when the interrupt comes]
  const char* base = std::getenv("TMPDIR");
  std::string safe;
  for (char ch : test_id) safe += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  if (safe.size() > 80) safe.resize(80);
  std::string tmpl = fmt::format("{}/tdc-{}-{}", base && *base ? base : "/tmp", safe, kMkdtempSuffix);
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back(0);
  if (!mkdtemp(buf.data()))  // mkdtemp creates the directory with mode 0700
    throw std::runtime_error(fmt::format("cannot create temp dir {}: {}", tmpl, std::strerror(errno)));
  std::string path(buf.data());
  track_temp_dir(path);
  return path;
}

void remove_temp_dir(const std::string& path) {
  remove_tree(AT_FDCWD, path.c_str(), 0);  // the handler's way too: one way to remove a temp dir
  track_temp_dir("");
}

// ---------------------------------------------------------------- Supervisor
Supervisor::Supervisor(const LaunchSpec& spec, std::string temp_dir)
    : spec_(spec), temp_dir_(std::move(temp_dir)), ranks_(spec.world_size) {}

Supervisor::~Supervisor() { kill_all(); }

void Supervisor::add(ChildProc c) {
  c.pidfd = static_cast<int>(syscall(SYS_pidfd_open, c.pid, 0));
  for (int fd : {c.events_fd, c.output_fd}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  children_.push_back(std::move(c));
}

void Supervisor::kill_all() {
  for (auto& c : children_) {
    if (!c.exited) {
      kill(-c.pid, SIGKILL);
      kill(c.pid, SIGKILL);
      reap(c, true);
    }
    for (int* fd : {&c.pidfd, &c.events_fd, &c.output_fd})
      if (*fd >= 0) ::close(*fd), *fd = -1;
  }
}

void Supervisor::reap(ChildProc& c, bool block) {
  if (c.exited) return;
  int status = 0;
  pid_t r = waitpid(c.pid, &status, block ? 0 : WNOHANG);
  if (r == c.pid) {
    c.exited = true;
    c.wait_status = status;
    untrack_child(c.pid);
    kill(-c.pid, SIGKILL);  // anything the rank started and left behind
    drain(c);
  }
}

void Supervisor::drain(ChildProc& c) {
  char buf[65536];
  if (c.output_fd >= 0) {
    ssize_t n;
    while ((n = ::read(c.output_fd, buf, sizeof buf)) > 0) {
      c.output.append(buf, static_cast<size_t>(n));
      constexpr size_t kKeep = 1 << 20;  // keep the last MiB of a rank's output
      if (c.output.size() > 2 * kKeep) c.output.erase(0, c.output.size() - kKeep);
    }
  }
  if (c.events_fd >= 0) {
    ssize_t n;
    while ((n = ::read(c.events_fd, buf, sizeof buf)) > 0) c.event_buf.append(buf, static_cast<size_t>(n));
    handle_events(c.event_buf);
  }
}

void Supervisor::ingest(const std::string& event_lines) {
  std::string buf = event_lines;
  handle_events(buf);
}

void Supervisor::handle_events(std::string& buf) {
  size_t pos;
  while ((pos = buf.find('\n')) != std::string::npos) {
    std::string line = buf.substr(0, pos);
    buf.erase(0, pos + 1);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("rank")) continue;
    int r = j["rank"].get<int>();
    if (r < 0 || r >= static_cast<int>(ranks_.size())) continue;
    auto& rs = ranks_[r];
    const std::string e = j.value("e", "");
    if (e == "fail") {
      rs.failures.push_back({r, j.value("file", ""), j.value("line", 0), j.value("msg", "")});
      failures_in_order_.push_back(rs.failures.back());
      // [Note: the first failure starts the abort] A failure need not end its rank's body: after a
      // failed EXPECT or an exception caught by subtests() the rank goes on, possibly past a
      // collective the others are blocked in. Waiting for its "done" would turn the failure into a
      // TIMEOUT after the full deadline, so the grace starts at the failure itself.
      if (first_bad_rank_ < 0) first_bad_rank_ = r;
    } else if (e == "skip") {
      rs.skipped = true;
      rs.skips.push_back(j.value("msg", ""));
    } else if (e == "report") {
      // [Note: rank reports]: the union over ranks, per reporter.
      const nlohmann::json& data = j.contains("data") ? j["data"] : nlohmann::json::object();
      if (!data.is_object()) continue;
      Report& into = reports_[j.value("name", "")];
      for (const auto& [key, values] : data.items())
        if (values.is_array())
          for (const auto& v : values)
            if (v.is_string()) into[key].insert(v.get<std::string>());
    } else if (e == "done") {
      rs.done = true;
      rs.duration_s = j.value("dur", 0.0);
      if ((!rs.failures.empty() || rs.skipped) && first_bad_rank_ < 0) first_bad_rank_ = r;
    }
  }
}

bool Supervisor::child_crashed(const ChildProc& c) const {
  if (!c.exited) return false;
  if (WIFSIGNALED(c.wait_status)) return true;
  for (int r : c.ranks)
    if (!ranks_[r].done) return true;  // exited before its body finished
  return WIFEXITED(c.wait_status) && WEXITSTATUS(c.wait_status) != 0;
}

bool Supervisor::poll_children(int wait_ms) {
  std::vector<pollfd> fds;
  std::vector<std::pair<size_t, int>> owner;  // (child index, 0=pidfd 1=events 2=output)
  for (size_t i = 0; i < children_.size(); ++i) {
    auto& c = children_[i];
    if (c.exited) continue;
    if (c.pidfd >= 0) fds.push_back({c.pidfd, POLLIN, 0}), owner.push_back({i, 0});
    if (c.events_fd >= 0) fds.push_back({c.events_fd, POLLIN, 0}), owner.push_back({i, 1});
    if (c.output_fd >= 0) fds.push_back({c.output_fd, POLLIN, 0}), owner.push_back({i, 2});
  }
  int rc = ::poll(fds.data(), fds.size(), std::min(wait_ms, 200));
  if (rc < 0 && errno != EINTR) return false;
  for (size_t k = 0; k < fds.size() && rc > 0; ++k) {
    if (!fds[k].revents) continue;
    auto& c = children_[owner[k].first];
    if (owner[k].second == 0) {
      reap(c, true);
    } else {
      drain(c);
      // A pipe at EOF with the process still alive (it closed stdout): stop polling that fd.
      if (fds[k].revents & (POLLHUP | POLLERR) && !(fds[k].revents & POLLIN)) {
        int& fd = owner[k].second == 1 ? c.events_fd : c.output_fd;
        ::close(fd);
        fd = -1;
      }
    }
  }
  for (auto& c : children_) reap(c, false);  // also covers kernels without pidfd
  return true;
}

// First failure aborts the others: a crash at once, a failure or skip after a short grace
// (the others may be about to finish on their own, and their messages are worth having).
void Supervisor::note_first_failure(std::optional<std::chrono::steady_clock::time_point>& abort_at) {
  using clock = std::chrono::steady_clock;
  if (abort_at) return;
  for (auto& c : children_) {
    if (child_crashed(c)) {
      abort_at = clock::now();
      if (first_bad_rank_ < 0 && !c.ranks.empty()) first_bad_rank_ = c.ranks.front();
    }
  }
  if (!abort_at && first_bad_rank_ >= 0)
    abort_at = clock::now() + std::chrono::duration_cast<clock::duration>(
                                  std::chrono::duration<double>(internal::settings().abort_grace_s));
}

Outcome Supervisor::run() {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const auto deadline =
      t0 + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(spec_.timeout_s));
  std::optional<clock::time_point> abort_at;
  bool timed_out = false;
  for (;;) {
    if (std::all_of(children_.begin(), children_.end(), [](auto& c) { return c.exited; })) break;
    auto now = clock::now();
    if (now >= deadline) {
      timed_out = true;
      break;
    }
    if (abort_at && now >= *abort_at) break;
    auto until = abort_at ? std::min(*abort_at, deadline) : deadline;
    if (!poll_children(static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count()) +
                       1))
      break;
    note_first_failure(abort_at);
  }
  // On a timeout, and when ranks are stopped after another failed: where each one was stuck.
  std::string stacks = capture_live_stacks();
  for (auto& c : children_) {
    if (!c.exited) {
      for (int r : c.ranks)
        if (!ranks_[r].done) aborted_ranks_.push_back(r);
    }
  }
  double elapsed = std::chrono::duration<double>(clock::now() - t0).count();
  // Kill what is left and collect the last output.
  for (auto& c : children_) {
    if (!c.exited) {
      kill(-c.pid, SIGKILL);
      kill(c.pid, SIGKILL);
      reap(c, true);
    }
    drain(c);
  }
  return make_outcome(timed_out, stacks, elapsed);
}

std::string Supervisor::capture_live_stacks() const {
  // Every live process at once: signal stacks take milliseconds each, gdb seconds each.
  std::vector<std::pair<std::string, std::future<std::string>>> pending;
  for (auto& c : children_) {
    if (c.exited) continue;
    std::string label = c.ranks.size() == 1 ? fmt::format("rank {}", c.ranks[0])
                                            : fmt::format("ranks {} (threads)", fmt::join(c.ranks, ","));
    pending.emplace_back(label, std::async(std::launch::async, [label, pid = c.pid, path = c.stacks_path] {
                           return fmt::format("==== stacks of {} (pid {}) ====\n{}", label, pid,
                                              capture_stacks(pid, path, internal::settings().stacks_budget_s()));
                         }));
  }
  std::vector<StackBlock> blocks;
  for (auto& [label, f] : pending) blocks.push_back({label, f.get()});
  return stacks_odd_first(blocks);  // [Note: the odd rank first]
}

namespace {
std::string tail_lines(const std::string& s, size_t max_lines, size_t max_bytes) {
  size_t start = s.size() > max_bytes ? s.size() - max_bytes : 0;
  size_t count = 0, pos = s.size();
  while (pos > start) {
    size_t nl = s.rfind('\n', pos - 1);
    if (nl == std::string::npos || nl < start) break;
    if (nl != s.size() - 1 && ++count >= max_lines) {
      start = nl + 1;
      break;
    }
    pos = nl;
  }
  return s.substr(start);
}
}  // namespace

// Why a process ended early; `rank` < 0: the whole process (all the ranks it hosted).
std::string Supervisor::crash_reason(const ChildProc& c, int rank) const {
  std::string who = rank >= 0 || c.ranks.size() == 1
                        ? fmt::format("[rank {}] process", rank >= 0 ? rank : c.ranks[0])
                        : fmt::format(
                              "[ranks {}] process (thread launcher: one process hosts every rank; "
                              "its output names the rank that failed)",
                              fmt::join(c.ranks, ", "));
  if (WIFSIGNALED(c.wait_status)) return fmt::format("{} died from {}", who, signal_name(WTERMSIG(c.wait_status)));
  if (WIFEXITED(c.wait_status))
    return fmt::format("{} exited with code {} before its test body finished", who, WEXITSTATUS(c.wait_status));
  return fmt::format("{} ended abnormally (wait status {})", who, c.wait_status);
}

RankDetail Supervisor::rank_detail(int r, bool timed_out, const ChildProc* c) const {
  const auto& rs = ranks_[r];
  RankDetail d;
  d.rank = r;
  d.duration_s = rs.duration_s;
  if (c && c->exited) {
    if (WIFEXITED(c->wait_status)) d.exit_code = WEXITSTATUS(c->wait_status);
    if (WIFSIGNALED(c->wait_status)) d.signal = WTERMSIG(c->wait_status);
  }
  const bool aborted = std::find(aborted_ranks_.begin(), aborted_ranks_.end(), r) != aborted_ranks_.end();
  if (rs.done) {
    d.status = !rs.failures.empty() ? RankStatus::Fail : rs.skipped ? RankStatus::Skip : RankStatus::Pass;
  } else if (timed_out && aborted) {
    d.status = RankStatus::Timeout;
  } else if (aborted) {
    d.status = RankStatus::Aborted;
  } else {
    d.status = RankStatus::Crash;
  }
  if (!rs.failures.empty()) {
    std::vector<std::string> m;
    for (auto& f : rs.failures) m.push_back(f.message);
    d.message = fmt::format("{}", fmt::join(m, "\n"));
  }
  if (rs.skipped && d.message.empty()) d.message = rs.skips.front();
  if (d.status == RankStatus::Crash && c) d.message = crash_reason(*c, r);
  return d;
}

// The test's status and message from its ranks (o.ranks filled): TIMEOUT, then CRASH, FAIL, SKIP.
void Supervisor::set_verdict(Outcome& o, bool timed_out, const std::string& stacks, double elapsed) const {
  std::vector<std::string> crash_msgs, fail_msgs;
  std::vector<int> skipped_ranks, ran_ranks, still_running;
  for (const RankDetail& d : o.ranks) {
    if (d.status == RankStatus::Timeout) still_running.push_back(d.rank);
    if (ranks_[d.rank].skipped) {
      skipped_ranks.push_back(d.rank);
    } else if (ranks_[d.rank].done) {
      ran_ranks.push_back(d.rank);
    }
  }
  // In the order they happened: the first line of a FAIL is the failure that started the abort.
  for (auto& f : failures_in_order_) fail_msgs.push_back(f.message);
  for (auto& c : children_) {
    bool any_crashed = false;
    for (int r : c.ranks) any_crashed |= o.ranks[r].status == RankStatus::Crash;
    if (!any_crashed) continue;
    std::string tail = demangle_text(symbolize_frames(tail_lines(c.output, 40, 8192), 3.0));
    crash_msgs.push_back(crash_reason(c, -1) + "\n  last output:\n" + (tail.empty() ? std::string("  (none)") : tail));
  }
  if (timed_out) {
    o.status = Status::Timeout;
    o.message = fmt::format("timed out after {:.1f} s (deadline {:.1f} s); ranks still running: [{}]\n{}", elapsed,
                            spec_.timeout_s, fmt::join(still_running, ", "), stacks);
  } else if (!crash_msgs.empty()) {
    o.status = Status::Crash;
    o.message = fmt::format("{}", fmt::join(crash_msgs, "\n"));
  } else if (!fail_msgs.empty()) {
    o.status = Status::Fail;
    o.message = fmt::format("{}", fmt::join(fail_msgs, "\n"));
  } else if (!skipped_ranks.empty()) {
    const std::string& first_skip = ranks_[skipped_ranks.front()].skips.front();
    o.status = is_not_supported_message(first_skip) ? Status::NotSupported : Status::Skip;
    o.message = first_skip;
    if (!ran_ranks.empty() || !aborted_ranks_.empty()) {
      o.message += fmt::format("\nranks disagree on the skip: skipped on [{}], not skipped on [{}]{}",
                               fmt::join(skipped_ranks, ", "), fmt::join(ran_ranks, ", "),
                               aborted_ranks_.empty()
                                   ? ""
                                   : fmt::format(", stopped while running on [{}]", fmt::join(aborted_ranks_, ", ")));
    }
  }
}

void Supervisor::add_abort_notes(Outcome& o, bool timed_out, const std::string& stacks) const {
  // A hang after some ranks returned cleanly is usually a misalignment (a returned rank skipped a
  // collective the others are in): name them, before the stacks. (A FAIL needs no such note: its
  // first failure already says what happened, and healthy ranks routinely finish first.)
  std::vector<int> returned_clean;
  for (int r = 0; r < spec_.world_size; ++r)
    if (ranks_[r].done && ranks_[r].failures.empty() && !ranks_[r].skipped) returned_clean.push_back(r);
  if (timed_out && !returned_clean.empty()) {
    auto nl = o.message.find('\n');
    o.message.insert(nl == std::string::npos ? o.message.size() : nl,
                     fmt::format("\nranks [{}] returned from the test body without a failure while the others "
                                 "were still running; a rank that skips a collective the others enter leaves "
                                 "them waiting",
                                 fmt::join(returned_clean, ", ")));
  }
  if (!aborted_ranks_.empty() && !timed_out && o.status != Status::Pass && first_bad_rank_ >= 0 &&
      o.status != Status::Skip && o.status != Status::NotSupported) {
    o.message +=
        fmt::format("\nranks [{}] were stopped after rank {} failed", fmt::join(aborted_ranks_, ", "), first_bad_rank_);
    if (!stacks.empty()) o.message += "\n" + stacks;
  }
}

Outcome Supervisor::make_outcome(bool timed_out, const std::string& stacks, double elapsed) {
  Outcome o;
  o.duration_s = elapsed;
  o.reports = reports_;
  std::map<int, const ChildProc*> proc_of;
  for (auto& c : children_)
    for (int r : c.ranks) proc_of[r] = &c;
  for (int r = 0; r < spec_.world_size; ++r) {
    for (auto& f : ranks_[r].failures) o.failures.push_back(f);
    o.ranks.push_back(rank_detail(r, timed_out, proc_of.count(r) ? proc_of[r] : nullptr));
  }
  set_verdict(o, timed_out, stacks, elapsed);
  add_abort_notes(o, timed_out, stacks);
  return o;
}

}  // namespace tdc::harness::detail
