// launch(): one body on N ranks, for every launcher; run_distributed(): the GoogleTest glue.
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <numeric>
#include <utility>

#include <fmt/format.h>
#include <ATen/Parallel.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "process.h"
#include "tdc/harness/external_launcher.h"
#include "tdc/harness/phases.h"

namespace tdc::harness {

namespace detail {
namespace {

RankContext make_context(const LaunchSpec& spec, int rank, int local_rank, c10::intrusive_ptr<c10d::Store> store,
                         const std::string& temp_dir) {
  const internal::RunSettings& s = internal::settings();
  RankContext c;
  c.rank = rank;
  c.world_size = spec.world_size;
  c.local_rank = local_rank;
  c.launcher = spec.launcher;
  c.test_id = spec.suite + "." + spec.name;
  c.store = std::move(store);
  c.store->setTimeout(std::chrono::milliseconds(static_cast<int64_t>(spec.timeout_s * 1000) + 5000));
  c.temp_dir = temp_dir;
  c.backend = s.backend;
  c.backend_lib = s.backend_lib;
  c.device_type = s.device_type;
  c.seed = spec.seed;
  if (s.device_type == "cuda") {
    int n = device_count();
    c.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(n > 0 ? local_rank % n : 0));
  }
  c.rank_generator = at::detail::createCPUGenerator(spec.seed + static_cast<uint64_t>(rank));
  return c;
}

struct Pipes {
  int events[2] = {-1, -1};
  int output[2] = {-1, -1};
  Pipes() {
    if (pipe2(events, O_CLOEXEC) != 0 || pipe2(output, O_CLOEXEC) != 0)
      throw std::runtime_error(fmt::format("pipe2 failed: {}", std::strerror(errno)));
  }
};

// Child side right after fork(): own process group, die with the parent, output to the pipe.
void become_rank_process(pid_t parent, const Pipes& p, const std::vector<int>& close_fds) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);  // the parent died between fork and prctl
  reset_signal_handlers_in_child();
  dup2(p.output[1], 1);
  dup2(p.output[1], 2);
  for (int fd : close_fds) ::close(fd);
  ::close(p.output[0]);
  ::close(p.events[0]);
}

ChildProc parent_side(pid_t pid, Pipes& p, std::vector<int> ranks, const std::string& stacks) {
  setpgid(pid, pid);  // also here, so a kill(-pid) right after fork cannot miss
  track_child(pid);
  ::close(p.events[1]);
  ::close(p.output[1]);
  ChildProc c;
  c.pid = pid;
  c.events_fd = p.events[0];
  c.output_fd = p.output[0];
  c.ranks = std::move(ranks);
  c.stacks_path = stacks;
  return c;
}

pid_t checked_fork() {
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(fmt::format("fork failed: {}", std::strerror(errno)));
  return pid;
}

std::string stacks_file(const std::string& dir, int idx) { return fmt::format("{}/stacks.{}", dir, idx); }

void run_rank_in_child(const LaunchSpec& spec, int rank, const std::string& temp_dir, int events_fd,
                       const std::function<void()>& body) {
  install_rank_signal_handlers(stacks_file(temp_dir, rank), rank);
  int rc = 0;
  try {
    auto store = c10::make_intrusive<c10d::FileStore>(temp_dir + "/store", spec.world_size);
    RankContext c = make_context(spec, rank, rank, store, temp_dir);
    EventSink sink(events_fd);
    run_rank(c, body, sink, spec.num_threads);
  } catch (const std::exception& e) {  // store construction etc.; run_rank itself never throws
    std::fprintf(stderr, "tdc: rank %d could not start: %s\n", rank, e.what());
    rc = 3;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(rc);
}

// ---------------------------------------------------------------- fork / spawn / thread
// The thread launcher's host process: every rank a thread of it, on one HashStore.
[[noreturn]] void run_thread_host(const LaunchSpec& spec, const std::string& temp_dir, int events_fd,
                                  const std::function<void()>& body) {
  install_rank_signal_handlers(stacks_file(temp_dir, 0), -1);
  if (spec.num_threads > 0) at::set_num_threads(spec.num_threads);
  at::manual_seed(spec.seed);
  reset_rank_reports();
  auto store = c10::make_intrusive<c10d::HashStore>();
  EventSink sink(events_fd);
  std::vector<RankContext> contexts;
  for (int r = 0; r < spec.world_size; ++r) contexts.push_back(make_context(spec, r, r, store, temp_dir));
  // [Note: parked rank threads] The host process is thrown away after the test, so a
  // finished rank thread parks instead of exiting: its thread_local state (process
  // groups, whose Gloo teardown costs 20-40 ms) is never destroyed, exactly as a forked
  // rank's is not. The host _exit()s once every rank is done.
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  for (int r = 0; r < spec.world_size; ++r) {
    std::thread([&, r] {
      pthread_setname_np(pthread_self(), fmt::format("tdc-rank{}", r).c_str());
      set_signal_rank(r);
      run_rank(contexts[r], body, sink, 0);
      {
        std::lock_guard<std::mutex> lock(mu);
        ++finished;
      }
      cv.notify_all();
      for (;;) pause();
    }).detach();
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return finished == spec.world_size; });
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(0);
}

// The spawn launcher's rank: fork+exec of this test binary, filtered to this test; the rank
// reads its settings from --tdc_child (see main.cpp).
[[noreturn]] void exec_spawned_rank(const LaunchSpec& spec, int r, const std::string& temp_dir, int events_fd) {
  constexpr int kEventsFd = 100;
  dup2(events_fd, kEventsFd);  // dup2 clears O_CLOEXEC on the new fd
  const internal::RunSettings& s = internal::settings();
  std::vector<std::string> args = {
      "/proc/self/exe",
      fmt::format("--gtest_filter={}.{}", spec.suite, spec.name),
      fmt::format("--tdc_child={},{},{},{},{},{}", r, spec.world_size, kEventsFd, spec.seed, spec.num_threads,
                  temp_dir),
      fmt::format("--tdc_timeout={}", spec.timeout_s),
      "--tdc_backend=" + s.backend,
      "--tdc_device=" + s.device_type,
      "--tdc_stacks=" + s.stacks,
  };
  if (!s.backend_lib.empty()) args.push_back("--tdc_backend_lib=" + s.backend_lib);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv("/proc/self/exe", argv.data());
  std::fprintf(stderr, "tdc: exec of /proc/self/exe failed: %s\n", std::strerror(errno));
  _exit(127);
}

// Forks the test's processes (one host for the thread launcher, else one per rank) and hands
// each to the supervisor.
void start_local_ranks(const LaunchSpec& spec, const std::string& temp_dir, Supervisor& sup,
                       const std::function<void()>& body) {
  const pid_t parent = getpid();
  std::vector<int> parent_fds;  // read ends held by the parent: children close them
  if (spec.launcher == Launcher::Thread) {
    Pipes p;
    std::vector<int> all(spec.world_size);
    std::iota(all.begin(), all.end(), 0);
    HoldTermination hold;  // until the host is tracked: [Note: nothing untracked when the interrupt comes]
    pid_t pid = checked_fork();
    if (pid == 0) {
      become_rank_process(parent, p, parent_fds);
      run_thread_host(spec, temp_dir, p.events[1], body);
    }
    sup.add(parent_side(pid, p, all, stacks_file(temp_dir, 0)));
    return;
  }
  for (int r = 0; r < spec.world_size; ++r) {
    Pipes p;
    HoldTermination hold;  // until the rank is tracked: [Note: nothing untracked when the interrupt comes]
    pid_t pid = checked_fork();
    if (pid == 0) {
      become_rank_process(parent, p, parent_fds);
      if (spec.launcher == Launcher::Spawn) exec_spawned_rank(spec, r, temp_dir, p.events[1]);
      run_rank_in_child(spec, r, temp_dir, p.events[1], body);
    }
    parent_fds.push_back(p.events[0]);
    parent_fds.push_back(p.output[0]);
    sup.add(parent_side(pid, p, {r}, stacks_file(temp_dir, r)));
  }
}

// What the ranks printed, for a failed or hung test (or every test with --tdc_show_output).
std::vector<std::string> rank_outputs(const Supervisor& sup, const Outcome& outcome) {
  std::vector<std::string> outputs;
  const bool show =
      internal::settings().show_output || outcome.status == Status::Fail || outcome.status == Status::Timeout;
  if (!show) return outputs;
  for (auto& c : sup.children()) {
    if (c.output.empty()) continue;
    std::string label = c.ranks.size() == 1 ? fmt::format("rank {}", c.ranks[0]) : std::string("thread ranks");
    outputs.push_back(fmt::format("---- output of {} ----\n{}", label, demangle_text(c.output)));
  }
  return outputs;
}

// A launch that throws before its ranks ran (a fork or a pipe that failed: the ranks started so
// far are reaped by the Supervisor) leaves no temp dir behind either.
struct RemoveTempDirOnThrow {
  const std::string& dir;
  bool armed = true;
  ~RemoveTempDirOnThrow() {
    if (armed) remove_temp_dir(dir);
  }
};

Outcome launch_local(const LaunchSpec& spec, const std::function<void()>& body) {
  const std::string id = spec.suite + "." + spec.name;
  const std::string temp_dir = make_temp_dir(id);
  RemoveTempDirOnThrow on_throw{temp_dir};
  Outcome outcome;
  std::vector<std::string> outputs;
  mark_phase(id, -1, "launch");
  {
    Supervisor sup(spec, temp_dir);
    start_local_ranks(spec, temp_dir, sup, body);
    outcome = sup.run();
    outputs = rank_outputs(sup, outcome);
  }  // Supervisor: everything reaped
  on_throw.armed = false;
  mark_phase(id, -1, "ranks_done");
  for (auto& o : outputs) std::fputs(o.c_str(), stdout);
  if (internal::settings().keep_temp) {
    std::printf("tdc: kept temp dir %s\n", temp_dir.c_str());
    track_temp_dir("");
  } else {
    remove_temp_dir(temp_dir);
  }
  mark_phase(id, -1, "cleaned");
  return outcome;
}

// ---------------------------------------------------------------- env (torchrun / SLURM)
void store_barrier(c10d::Store& store, int world, const std::string& key) {
  if (store.add(key, 1) == world) store.set(key + "/done", std::vector<uint8_t>{1});
  store.wait({key + "/done"});
}

// [Note: the store's server leaves last] Rank 0 hosts the TCPStore. If it returned from the last
// test and exited while another rank's final request (the end barrier's wait) was still in flight,
// that rank would fail with "Connection closed" (seen under load). So every other rank reports
// that it is done with the store, the last one with a key rank 0 waits for: after that no rank
// needs the server for this test.
void leave_store(c10d::Store& store, int rank, int world) {
  if (world == 1) return;
  if (rank != 0) {
    if (store.add("tdc/end/left", 1) == world - 1) store.set("tdc/end/left/done", std::vector<uint8_t>{1});
  } else {
    store.wait({"tdc/end/left/done"});
  }
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  try {
    return std::stoi(v);
  } catch (...) {
    throw std::invalid_argument(fmt::format("environment variable {}='{}' is not an integer", name, v));
  }
}

// [Note: ranks from an external launcher] (tdc/harness/external_launcher.h)
ExternalRank env_rank() {
  const ExternalRank r = external_rank().value_or(ExternalRank{});
  const char* addr = std::getenv("MASTER_ADDR");
  const int port = env_int("MASTER_PORT", -1);
  if (!addr || port < 0 || r.rank < 0 || r.world_size < 1)
    throw std::invalid_argument(
        fmt::format("the env launcher needs RANK, WORLD_SIZE (or SLURM_PROCID, SLURM_NTASKS), MASTER_ADDR and "
                    "MASTER_PORT (got rank {}, world size {}, MASTER_ADDR={}, MASTER_PORT={})",
                    r.rank, r.world_size, addr ? addr : "(unset)", port));
  return r;
}

c10::intrusive_ptr<c10d::Store> env_store() {
  static c10::intrusive_ptr<c10d::Store> store;
  if (store) return store;
  const ExternalRank r = env_rank();
  const char* addr = std::getenv("MASTER_ADDR");
  const int port = env_int("MASTER_PORT", -1);
  const int rank = r.rank, world = r.world_size;
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(port);
  o.isServer = rank == 0;
  o.numWorkers = world;
  o.waitWorkers = false;
  o.timeout = std::chrono::seconds(300);
  store = c10::make_intrusive<c10d::TCPStore>(addr, o);
  return store;
}

// One temp dir per host, made by the host's local rank 0... ranks on other hosts see a path
// that does not exist there and make their own (tests that need a shared dir document it).
// Returns the dir and whether this rank made it (and removes it).
std::pair<std::string, bool> env_temp_dir(const LaunchSpec& spec, int rank, c10d::Store& store) {
  if (rank == 0) {
    std::string dir = make_temp_dir(spec.suite + "." + spec.name);
    store.set("tdc/temp_dir", std::vector<uint8_t>(dir.begin(), dir.end()));
    return {dir, true};
  }
  auto v = store.get("tdc/temp_dir");
  std::string dir(v.begin(), v.end());
  if (std::filesystem::exists(dir)) return {dir, false};
  return {make_temp_dir(spec.suite + "." + spec.name), true};
}

// A failure event for `rank`, then (done) its end, as a rank's event stream carries them.
std::string env_fail_event(int rank, const std::string& msg, bool done) {
  std::string out =
      nlohmann::json({{"e", "fail"}, {"rank", rank}, {"file", ""}, {"line", 0}, {"msg", msg}}).dump() + "\n";
  if (done) out += nlohmann::json({{"e", "done"}, {"rank", rank}, {"dur", 0}}).dump() + "\n";
  return out;
}

// Runs the body on this rank under a watchdog and returns its event stream. A rank that runs
// past the deadline cannot be recovered in place, so the watchdog prints its stacks, publishes
// TIMEOUT and ends the process (the external launcher tears down the rest).
std::string run_env_rank(const LaunchSpec& spec, RankContext& c, c10d::Store& store, const std::string& temp_dir,
                         const std::function<void()>& body) {
  const int rank = c.rank;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  std::atomic<bool> finished{false};
  std::thread watchdog([&] {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(spec.timeout_s);
    while (!finished && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (finished) return;
    std::fprintf(stderr, "tdc: [rank %d] %s.%s timed out after %.1f s; stacks:\n", rank, spec.suite.c_str(),
                 spec.name.c_str(), spec.timeout_s);
    install_rank_signal_handlers(temp_dir + fmt::format("/stacks.env.{}", rank), rank);
    std::string st = capture_stacks(getpid(), temp_dir + fmt::format("/stacks.env.{}", rank), 2.0);
    std::fputs(st.c_str(), stderr);
    try {
      std::string d =
          env_fail_event(rank, fmt::format("[rank {}] TIMEOUT after {:.1f} s", rank, spec.timeout_s), false);
      store.set(fmt::format("tdc/result/{}", rank), std::vector<uint8_t>(d.begin(), d.end()));
    } catch (...) {
    }
    std::fflush(nullptr);
    _exit(124);
  });
  {
    EventSink sink(fds[1]);
    run_rank(c, body, sink, spec.num_threads);
  }
  finished = true;
  watchdog.join();
  std::string text;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  ::close(fds[1]);
  return text;
}

// Rank 0: every rank's published events merged into the test's outcome.
Outcome merge_env_results(const LaunchSpec& spec, c10d::Store& store, const std::string& temp_dir,
                          std::chrono::steady_clock::time_point t0) {
  Supervisor sup(spec, temp_dir);
  for (int r = 0; r < spec.world_size; ++r) {
    std::string key = fmt::format("tdc/result/{}", r);
    try {
      store.wait({key}, std::chrono::milliseconds(static_cast<int64_t>(spec.timeout_s * 1000)));
      auto v = store.get(key);
      sup.ingest(std::string(v.begin(), v.end()));
    } catch (const std::exception& e) {
      sup.ingest(env_fail_event(r, fmt::format("[rank {}] no result within the deadline: {}", r, e.what()), true));
    }
  }
  return sup.outcome_from_events(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

Outcome launch_env(const LaunchSpec& spec0, const std::function<void()>& body) {
  LaunchSpec spec = spec0;
  const ExternalRank er = env_rank();
  const int rank = er.rank;
  spec.world_size = er.world_size;
  if (spec.world_size != spec0.world_size) {
    Outcome o;
    o.status = Status::Skip;
    o.message = fmt::format("{}.{} needs world size {}, but the external launcher started {} ranks", spec.suite,
                            spec.name, spec0.world_size, spec.world_size);
    return o;
  }
  auto base = env_store();
  static int test_counter = 0;
  auto store =
      c10::make_intrusive<c10d::PrefixStore>(fmt::format("tdc/{}/{}.{}", test_counter++, spec.suite, spec.name), base);
  const auto t0 = std::chrono::steady_clock::now();
  const auto [temp_dir, own_dir] = env_temp_dir(spec, rank, *store);
  RankContext c = make_context(spec, rank, er.local_rank, store, temp_dir);
  c.launcher = Launcher::Env;
  const std::string text = run_env_rank(spec, c, *store, temp_dir, body);
  // Every rank publishes its events; rank 0 merges all of them.
  store->set(fmt::format("tdc/result/{}", rank), std::vector<uint8_t>(text.begin(), text.end()));
  Outcome o;
  if (rank == 0) {
    o = merge_env_results(spec, *store, temp_dir, t0);
  } else {
    o.status = Status::Pass;  // rank 0 reports this rank's failures
  }
  store_barrier(*store, spec.world_size, "tdc/end");
  leave_store(*store, rank, spec.world_size);
  if (own_dir && !internal::settings().keep_temp) remove_temp_dir(temp_dir);
  return o;
}

}  // namespace
}  // namespace detail

namespace {
// Whether this process has loaded the CUDA driver (a CUDA call was made here): RTLD_NOLOAD only
// finds a library already loaded, it never loads one.
bool cuda_driver_loaded() {
  void* h = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (h != nullptr) ::dlclose(h);  // NOLOAD took a reference
  return h != nullptr;
}
}  // namespace

Outcome launch(const LaunchSpec& spec, const std::function<void()>& body) {
  if (spec.world_size < 1) throw std::invalid_argument(fmt::format("world size must be >= 1, got {}", spec.world_size));
  if (spec.launcher == Launcher::Env) return detail::launch_env(spec, body);
  return detail::launch_local(spec, body);
}

namespace {

// [Note: the parent never initialises CUDA] A child forked after CUDA was initialised cannot use
// CUDA. The harness itself never initialises it in the parent; if something else did (a test's
// static initialiser, a plug-in), ranks start by fork+exec instead (the results say spawn), and
// the run says so once.
void avoid_fork_after_cuda(LaunchSpec& spec) {
  if (spec.launcher != Launcher::Fork || detail::child_spec().active || !cuda_driver_loaded()) return;
  static bool said = false;
  if (!std::exchange(said, true))
    std::fprintf(stderr,
                 "tdc: the CUDA driver is loaded in the parent process, so forked ranks could not use CUDA: "
                 "ranks start with the spawn launcher (fork+exec) instead\n");
  spec.launcher = Launcher::Spawn;
}

// The launch's outcome as GoogleTest's verdict on the test (a skip, failures at their file:line).
// What has no assertion behind it (an exception, a TIMEOUT, a CRASH) is attributed to the test's
// definition, not to this file.
void report_to_gtest(const Outcome& o) {
  const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
  const char* def_file = info && info->file() ? info->file() : __FILE__;
  const int def_line = info ? info->line() : __LINE__;
  switch (o.status) {
    case Status::Pass:
    case Status::XFail:
    case Status::XPass:
      return;
    case Status::Skip:
    case Status::NotSupported:
      GTEST_SKIP() << o.message;
    case Status::Fail:
      for (auto& f : o.failures) {
        if (f.file.empty())
          ADD_FAILURE_AT(def_file, def_line) << f.message;
        else
          ADD_FAILURE_AT(f.file.c_str(), f.line) << f.message;
      }
      if (o.failures.empty()) ADD_FAILURE_AT(def_file, def_line) << o.message;
      return;
    case Status::Timeout:
      ADD_FAILURE_AT(def_file, def_line) << "TIMEOUT: " << o.message;
      return;
    case Status::Crash:
      ADD_FAILURE_AT(def_file, def_line) << "CRASH: " << o.message;
      return;
    case Status::Flaky:  // only `tdc run --repeat` makes this verdict, never one launch
      ADD_FAILURE_AT(def_file, def_line) << "FLAKY: " << o.message;
      return;
  }
}

}  // namespace

void internal::run_distributed(const char* suite, const char* name, const TestOptions& options, Body body) {
  LaunchSpec spec = detail::resolve(suite, name, options);
  avoid_fork_after_cuda(spec);
  const int min_gpus = options.min_gpus;
  const int world_size = spec.world_size;
  auto wrapped = [body, min_gpus, world_size] {
    // [Note: tests that need more GPUs than there are]: decided inside the rank.
    const std::string& backend = internal::settings().backend;
    if (min_gpus > 0 || backend == "nccl") {
      if (std::string why = gpu_skip_reason(backend, world_size, min_gpus, device_count()); !why.empty())
        GTEST_SKIP() << why;
    }
    body();
  };

  auto& child = detail::child_spec();
  if (child.active) {  // this process is one rank of a spawn launch
    spec.world_size = child.world_size;
    spec.seed = child.seed;
    spec.num_threads = child.num_threads;
    spec.launcher = Launcher::Spawn;
    detail::run_rank_in_child(spec, child.rank, child.temp_dir, child.events_fd, wrapped);
  }

  Outcome o = launch(spec, wrapped);
  auto& last = detail::last_outcome();
  last.test_id = spec.suite + "." + spec.name;
  last.outcome = o;
  last.world_size = spec.world_size;
  last.launcher = to_string(spec.launcher);
  report_to_gtest(o);
}

}  // namespace tdc::harness
