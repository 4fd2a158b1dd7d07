// Stacks of live ranks (on timeout) and backtraces on fatal signals.
//
// [Note: signal stacks] gdb is the classic tool, but attaching to a LibTorch process costs
// ~3 s per process on 2 cores (measured: 12 s for 4 ranks in parallel), which breaks the
// "TIMEOUT reported within deadline + 5 s" budget. So by default each rank process carries a
// SIGUSR2 handler: the thread that receives it forwards the signal to every other thread
// (tgkill), and each thread appends its own backtrace() to a per-process file. The parent
// demangles the text. --tdc_stacks=gdb (or both) adds gdb's view when line-level detail matters.
#include <cxxabi.h>
#include <dirent.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <fstream>
#include <regex>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "internal.h"

namespace tdc::harness::detail {

namespace {
char g_stacks_path[4096];
int g_rank_hint = -1;
thread_local int t_signal_rank = -1;
std::atomic<int> g_dump_initiator{0};
std::atomic<int> g_dump_pending{0};
std::atomic_flag g_write_lock = ATOMIC_FLAG_INIT;

void write_all(int fd, const char* s, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, s, n);
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      return;
    }
    s += w;
    n -= static_cast<size_t>(w);
  }
}
void write_str(int fd, const char* s) { write_all(fd, s, std::strlen(s)); }

// Async-signal-safe integer formatting.
void write_int(int fd, long v) {
  char buf[32];
  int i = 31;
  buf[i] = 0;
  bool neg = v < 0;
  unsigned long u = neg ? -static_cast<unsigned long>(v) : static_cast<unsigned long>(v);
  do {
    buf[--i] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u && i > 1);
  if (neg) buf[--i] = '-';
  write_str(fd, buf + i);
}

void dump_this_thread(int fd) {
  void* frames[64];
  int n = backtrace(frames, 64);
  pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  char name[64] = "?";
  {
    char path[64] = "/proc/self/task/";
    // build "/proc/self/task/<tid>/comm" without snprintf (not async-signal-safe)
    char num[24];
    int i = 23;
    num[i] = 0;
    long t = tid;
    do {
      num[--i] = static_cast<char>('0' + t % 10);
      t /= 10;
    } while (t);
    std::strcat(path, num + i);
    std::strcat(path, "/comm");
    int cfd = ::open(path, O_RDONLY);
    if (cfd >= 0) {
      ssize_t r = ::read(cfd, name, sizeof(name) - 1);
      if (r > 0) name[r - 1 >= 0 && name[r - 1] == '\n' ? r - 1 : r] = 0;
      ::close(cfd);
    }
  }
  while (g_write_lock.test_and_set(std::memory_order_acquire)) {
  }
  write_str(fd, "--- thread ");
  write_int(fd, tid);
  write_str(fd, " (");
  write_str(fd, name);
  write_str(fd, ")\n");
  backtrace_symbols_fd(frames + 2, n > 2 ? n - 2 : 0, fd);  // skip this function + handler
  g_write_lock.clear(std::memory_order_release);
}

void on_dump_signal(int, siginfo_t* info, void*) {
  int saved = errno;
  int fd = ::open(g_stacks_path, O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (fd < 0) {
    errno = saved;
    return;
  }
  int expected = 0;
  pid_t self = static_cast<pid_t>(syscall(SYS_gettid));
  // A kill() (SI_USER: from the parent, or from the env launcher's watchdog) lands on one thread;
  // it becomes the initiator and forwards the request to every other thread with tgkill
  // (SI_TKILL).
  if (info->si_code == SI_USER && g_dump_initiator.compare_exchange_strong(expected, self)) {
    int dfd = ::open("/proc/self/task", O_RDONLY | O_DIRECTORY);
    int sent = 0;
    if (dfd >= 0) {
      char buf[4096];
      for (;;) {
        long n = syscall(SYS_getdents64, dfd, buf, sizeof(buf));
        if (n <= 0) break;
        for (long off = 0; off < n;) {
          auto* d = reinterpret_cast<struct dirent64*>(buf + off);
          off += d->d_reclen;
          if (d->d_name[0] < '0' || d->d_name[0] > '9') continue;
          pid_t tid = static_cast<pid_t>(std::atol(d->d_name));
          if (tid == self) continue;
          g_dump_pending.fetch_add(1);
          if (syscall(SYS_tgkill, getpid(), tid, SIGUSR2) == 0) {
            ++sent;
          } else {
            g_dump_pending.fetch_sub(1);
          }
        }
      }
      ::close(dfd);
    }
    dump_this_thread(fd);
    // Wait (bounded) for the other threads, then mark the file complete.
    for (int i = 0; i < 2000 && g_dump_pending.load() > 0; ++i) usleep(500);
    write_str(fd, "--- end of stacks\n");
    g_dump_initiator.store(0);
  } else if (info->si_code == SI_TKILL) {  // forwarded by the initiator
    dump_this_thread(fd);
    g_dump_pending.fetch_sub(1);
  }  // else: a second request while one is in progress; the first answers it
  ::close(fd);
  errno = saved;
}

constexpr int kSupervisorHint = -2;  // g_rank_hint of the test binary's own process

void on_fatal_signal(int sig) {
  const int rank = t_signal_rank >= 0 ? t_signal_rank : g_rank_hint;
  if (rank == kSupervisorHint) {
    write_str(2, "\ntdc: the test binary's own process (the ranks' supervisor, not a rank) received fatal signal ");
  } else {
    write_str(2, "\ntdc: rank ");
    write_int(2, rank);
    write_str(2, " received fatal signal ");
  }
  write_int(2, sig);
  write_str(2, " (");
  write_str(2, sigabbrev_np(sig) ? sigabbrev_np(sig) : "?");
  write_str(2, "); backtrace:\n");
  void* frames[64];
  int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

void set_signal_rank(int rank) { t_signal_rank = rank; }

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  const char* desc = sigdescr_np(sig);
  return fmt::format("SIG{} ({})", abbrev ? abbrev : std::to_string(sig), desc ? desc : "?");
}

// [Note: a supervisor that crashes says where] A test binary's own process runs no test body,
// but LibTorch code runs in it (the TCPStore server, the GPU count), and a crash there ends every
// rank's test at once with no rank to blame: it prints its backtrace to stderr (the binary's log)
// before it dies, as a rank does. Ranks replace these handlers with their own.
void install_process_signal_handlers() {
  g_rank_hint = kSupervisorHint;
  void* f[2];
  backtrace(f, 2);  // loads libgcc now, outside any signal handler
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) signal(sig, on_fatal_signal);
}

void install_rank_signal_handlers(const std::string& stacks_path, int rank_hint) {
  std::strncpy(g_stacks_path, stacks_path.c_str(), sizeof(g_stacks_path) - 1);
  g_rank_hint = rank_hint;
  {  // backtrace() loads libgcc lazily; do it now, outside any signal handler.
    void* f[2];
    backtrace(f, 2);
  }
  struct sigaction sa {};
  sa.sa_sigaction = on_dump_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR2, &sa, nullptr);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) signal(sig, on_fatal_signal);
}

namespace {
// Where a process is: its frame lines, every address and number blanked (pids, thread ids and
// ASLR differ between ranks; the functions and their offsets do not).
std::string where_signature(const std::string& text) {
  static const std::regex numbers("0x[0-9a-fA-F]+|[0-9]+");
  std::istringstream in(text);
  std::string line, sig;
  while (std::getline(in, line)) {
    if (line.rfind("====", 0) == 0 || line.rfind("---", 0) == 0) continue;
    sig += std::regex_replace(line, numbers, "#") + "\n";
  }
  return sig;
}
}  // namespace

std::string stacks_odd_first(const std::vector<StackBlock>& blocks) {
  std::string in_order;
  for (const StackBlock& b : blocks) in_order += b.text;
  if (blocks.size() < 3) return in_order;  // with two, neither is "the others"
  std::map<std::string, std::vector<size_t>> groups;
  for (size_t i = 0; i < blocks.size(); ++i) groups[where_signature(blocks[i].text)].push_back(i);
  const std::vector<size_t>* largest = nullptr;
  bool tie = false;
  for (const auto& [sig, members] : groups) {
    if (largest == nullptr || members.size() > largest->size()) {
      largest = &members;
      tie = false;
    } else if (members.size() == largest->size()) {
      tie = true;
    }
  }
  if (groups.size() < 2 || tie || largest->size() < 2) return in_order;
  std::vector<std::string> odd_labels, waiting_labels;
  std::string odd, waiting;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const bool in_largest = std::find(largest->begin(), largest->end(), i) != largest->end();
    (in_largest ? waiting_labels : odd_labels).push_back(blocks[i].label);
    (in_largest ? waiting : odd) += blocks[i].text;
  }
  return fmt::format("not where the others are: {} ({} are all in one place); their stacks first\n{}{}",
                     fmt::join(odd_labels, ", "), fmt::join(waiting_labels, ", "), odd, waiting);
}

std::string demangle_text(const std::string& text) {
  // backtrace_symbols lines look like "bin(_ZN3foo3barEv+0x1a) [0x...]".
  static const std::regex sym(R"(\((_Z[A-Za-z0-9_]+)\+)");
  std::string out;
  out.reserve(text.size());
  auto begin = std::sregex_iterator(text.begin(), text.end(), sym);
  size_t last = 0;
  for (auto it = begin; it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    int status = 0;
    char* d = abi::__cxa_demangle(m[1].str().c_str(), nullptr, nullptr, &status);
    out.append(text, last, m.position(1) - last);
    out += (status == 0 && d) ? d : m[1].str();
    std::free(d);
    last = m.position(1) + m.length(1);
  }
  out.append(text, last, std::string::npos);
  return out;
}

namespace {
// Makes signal-handler stacks readable: library paths shortened to their file name, the frames
// of the signal trampoline and of the harness/GoogleTest below the rank body dropped.
std::string tidy_stacks(const std::string& text) {
  static const std::regex path(R"(^/[^(\s]*/([^/(\s]+)\()");
  std::istringstream in(text);
  std::string line, out;
  bool skipping = false;
  while (std::getline(in, line)) {
    if (line.rfind("--- ", 0) == 0) {
      skipping = false;
      out += line + "\n";
      continue;
    }
    if (skipping) continue;
    std::string l = std::regex_replace(line, path, "$1(");
    out += "  " + l + "\n";
    if (l.find("tdc::harness::detail::run_rank(") != std::string::npos) {
      out += "  ... (harness frames below the rank body omitted)\n";
      skipping = true;
    }
  }
  return out;
}

std::string read_file(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string gdb_stacks(pid_t pid, double budget_s) {
  ProgramOutput out =
      run_program({"gdb", "-nx", "-batch", "-p", std::to_string(pid), "-ex", "thread apply all bt"}, budget_s);
  if (!out.finished) out.text += fmt::format("(gdb did not finish within {:.1f} s)\n", budget_s);
  return out.text;
}
}  // namespace

std::string capture_stacks(pid_t pid, const std::string& stacks_path, double budget_s) {
  const std::string& mode = internal::settings().stacks;
  std::string text;
  if (mode == "signal" || mode == "both") {
    ::unlink(stacks_path.c_str());
    if (kill(pid, SIGUSR2) == 0) {
      auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(std::min(budget_s, 2.0));
      while (std::chrono::steady_clock::now() < deadline) {
        std::string s = read_file(stacks_path);
        if (s.find("--- end of stacks") != std::string::npos) break;
        usleep(10000);
      }
      text = tidy_stacks(demangle_text(symbolize_frames(read_file(stacks_path), std::min(budget_s, 3.0))));
      if (text.empty()) text = "(no stacks: the process did not answer SIGUSR2)\n";
    }
  }
  if (mode == "gdb" || mode == "both") text += gdb_stacks(pid, budget_s);
  return text;
}

}  // namespace tdc::harness::detail
