// Kernel benchmark: what this machine's kernel charges for the events a Gloo collective is made
// of, each timed alone.
//
//   tdc_bench kernel --out FILE [--repeat N]     (or: ./tdc bench kernel --out FILE)
//
// [Note: the kernel's price of a collective] A collective on Gloo's TCP transport is a chain of
// events, each a system call or a wake-up: the caller hands the op to the process group's worker
// thread and waits for it (two thread hand-offs), and every message is up to three TCP writes on
// loopback (the receiver's "ready to receive", the sender's "ready to send", then the data: Gloo's
// tcp::Pair rendezvous), each waking the peer's event-loop thread, which reads it. The seed
// suite's kernel time is mostly these events (docs/bench/suite_time.md), so their price on a
// machine sets how low its kernel share can go: a test's collectives are what the test issues.
// This benchmark times each kind alone, as a ping-pong, so that a reader can multiply: a null
// system call; a hand-off between two threads of one process through a mutex and a condition
// variable (as ProcessGroupGloo's caller and worker); a 64-byte message between two processes
// over loopback TCP with TCP_NODELAY (as Gloo's pairs), with both ends on one CPU (as `tdc run`
// places a test's ranks) and on two. Per event it reports the wall time and the system CPU time,
// from getrusage of both ends; each figure is the median of N rounds.
// Output schema: docs/results-schema.md, "Kernel benchmark".
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_common.h"
#include "tdc/harness/results.h"

#include "benchmarks.h"

namespace bench_kernel {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

constexpr int kSyscalls = 1'000'000;
constexpr int kHandOffs = 100'000;  // round trips: twice as many hand-offs
constexpr int kMessages = 20'000;   // round trips: twice as many messages
constexpr size_t kMessageBytes = 64;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// System CPU seconds of this process (every thread) and of its waited-for children.
double system_seconds() {
  auto sys = [](int who) {
    rusage r{};
    ::getrusage(who, &r);
    return static_cast<double>(r.ru_stime.tv_sec) + static_cast<double>(r.ru_stime.tv_usec) * 1e-6;
  };
  return sys(RUSAGE_SELF) + sys(RUSAGE_CHILDREN);
}

// One event's price: wall and system CPU time per event, in microseconds.
struct Price {
  double wall_us = 0, system_us = 0;
};

void pin_to_cpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (::sched_setaffinity(0, sizeof(set), &set) != 0)
    throw std::runtime_error(fmt::format("sched_setaffinity(CPU {}): {}", cpu, std::strerror(errno)));
}

// The CPUs this process may run on, in order.
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

double null_syscall_ns() {
  auto t0 = Clock::now();
  for (int i = 0; i < kSyscalls; ++i) ::syscall(SYS_getppid);
  return seconds_since(t0) / kSyscalls * 1e9;
}

// Two threads on one CPU pass a turn back and forth under a mutex and a condition variable.
Price thread_hand_off() {
  std::mutex mu;
  std::condition_variable cv;
  int turn = 0;  // 0: the main thread's, 1: the peer's
  const double sys0 = system_seconds();
  auto t0 = Clock::now();
  std::thread peer([&] {
    for (int i = 0; i < kHandOffs; ++i) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return turn == 1; });
      turn = 0;
      cv.notify_one();
    }
  });
  for (int i = 0; i < kHandOffs; ++i) {
    std::unique_lock<std::mutex> lock(mu);
    turn = 1;
    cv.notify_one();
    cv.wait(lock, [&] { return turn == 0; });
  }
  peer.join();
  const double n = 2.0 * kHandOffs;
  return {seconds_since(t0) / n * 1e6, (system_seconds() - sys0) / n * 1e6};
}

void send_all(int fd, char* buf) {
  for (size_t done = 0; done < kMessageBytes;) {
    ssize_t k = ::send(fd, buf + done, kMessageBytes - done, 0);
    if (k <= 0) throw std::runtime_error(fmt::format("send on loopback: {}", std::strerror(errno)));
    done += static_cast<size_t>(k);
  }
}
void recv_all(int fd, char* buf) {
  for (size_t done = 0; done < kMessageBytes;) {
    ssize_t k = ::recv(fd, buf + done, kMessageBytes - done, 0);
    if (k <= 0)
      throw std::runtime_error(fmt::format("recv on loopback: {}", k == 0 ? "peer closed" : std::strerror(errno)));
    done += static_cast<size_t>(k);
  }
}

// A listening loopback socket on a free port; `addr` gets its address.
int listen_on_loopback(sockaddr_in* addr) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(fmt::format("socket: {}", std::strerror(errno)));
  *addr = {};
  addr->sin_family = AF_INET;
  addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(*addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(addr), len) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(addr), &len) != 0 || ::listen(fd, 1) != 0)
    throw std::runtime_error(fmt::format("loopback listen: {}", std::strerror(errno)));
  return fd;
}

void no_delay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// The echoing end, in a forked child: answers every message, then exits.
[[noreturn]] void echo_peer(const sockaddr_in& addr, std::optional<int> cpu) {
  try {
    if (cpu) pin_to_cpu(*cpu);
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) ::_exit(3);
    no_delay(fd);
    char buf[kMessageBytes] = {};
    for (int i = 0; i < kMessages; ++i) {
      recv_all(fd, buf);
      send_all(fd, buf);
    }
    ::_exit(0);
  } catch (...) {
    ::_exit(4);
  }
}

// 64-byte messages back and forth between this process (on CPU `here`) and a forked child (on
// `there`); the child's system time counts once it is reaped.
Price tcp_message(int here, int there) {
  pin_to_cpu(here);
  sockaddr_in addr{};
  int listener = listen_on_loopback(&addr);
  const double sys0 = system_seconds();
  auto t0 = Clock::now();
  pid_t child = ::fork();
  if (child < 0) throw std::runtime_error(fmt::format("fork: {}", std::strerror(errno)));
  if (child == 0) echo_peer(addr, there);
  int fd = ::accept(listener, nullptr, nullptr);
  ::close(listener);
  try {
    if (fd < 0) throw std::runtime_error(fmt::format("accept: {}", std::strerror(errno)));
    no_delay(fd);
    char buf[kMessageBytes] = {};
    for (int i = 0; i < kMessages; ++i) {
      send_all(fd, buf);
      recv_all(fd, buf);
    }
  } catch (...) {  // no echoing process outlives the benchmark
    if (fd >= 0) ::close(fd);
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    throw;
  }
  ::close(fd);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error(fmt::format("the echoing process ended with status {}", status));
  const double n = 2.0 * kMessages;
  return {seconds_since(t0) / n * 1e6, (system_seconds() - sys0) / n * 1e6};
}

json price_json(const std::vector<Price>& rounds) {
  std::vector<double> wall, sys;
  for (const Price& p : rounds) {
    wall.push_back(p.wall_us);
    sys.push_back(p.system_us);
  }
  return {{"wall_us", tdc::bench::median(wall)}, {"system_us", tdc::bench::median(sys)}};
}

// The kernel's mitigations of CPU flaws change the price of every system call; say which.
json cpu_and_kernel() {
  utsname u{};
  ::uname(&u);
  std::string model = "?";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  json mitigations = json::object();
  for (const char* flaw : {"spectre_v2", "spec_rstack_overflow", "retbleed", "meltdown"}) {
    std::ifstream f(fmt::format("/sys/devices/system/cpu/vulnerabilities/{}", flaw));
    std::string text;
    if (std::getline(f, text)) mitigations[flaw] = text;
  }
  return {{"cpu_model", model}, {"kernel", u.release}, {"mitigations", mitigations}};
}

// `tdc_bench kernel` (bench/cpp/main.cpp).
int run(int argc, char** argv) {
  const tdc::bench::Args args =
      tdc::bench::parse_args(argc, argv, "tdc_bench kernel", 5, "rounds of every measurement");
  auto bench_start = Clock::now();
  const std::string started_at = tdc::harness::iso_now();
  const std::vector<int> cpus = allowed_cpus();
  if (cpus.empty()) {
    fmt::print(stderr, "tdc_bench kernel: sched_getaffinity: {}\n", std::strerror(errno));
    return 1;
  }
  std::vector<double> syscall_ns;
  std::vector<Price> hand_off, one_cpu, two_cpus;
  try {
    for (int r = 0; r < args.repeat; ++r) {
      fmt::print(stderr, "round {}/{} ...\n", r + 1, args.repeat);
      pin_to_cpu(cpus[0]);
      syscall_ns.push_back(null_syscall_ns());
      hand_off.push_back(thread_hand_off());
      one_cpu.push_back(tcp_message(cpus[0], cpus[0]));
      if (cpus.size() > 1) two_cpus.push_back(tcp_message(cpus[0], cpus[1]));
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "tdc_bench kernel: {}\n", e.what());
    return 1;
  }
  json out = {
      {"null_syscall_ns", tdc::bench::median(syscall_ns)},
      {"thread_hand_off", price_json(hand_off)},
      {"tcp_message_one_cpu", price_json(one_cpu)},
      {"tcp_message_two_cpus", two_cpus.empty() ? json(nullptr) : price_json(two_cpus)},
      {"message_bytes", kMessageBytes},
      {"rounds", args.repeat},
  };
  out.update(cpu_and_kernel());
  out.update(tdc::bench::run_info(started_at, bench_start));
  if (!tdc::bench::write_result("tdc_bench kernel", args.out, out)) return 1;
  fmt::print(stderr, "-> {}\n", args.out);
  return 0;
}

}  // namespace bench_kernel
