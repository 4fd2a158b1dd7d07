// The rank context, run settings, suite options, and running one rank's body.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include <optional>
#include <set>
#include <stdexcept>
#include <utility>

#include <ATen/Parallel.h>
#include <ATen/Context.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <gtest/gtest-spi.h>

#include "internal.h"
#include "tdc/harness/implementation.h"
#include "tdc/harness/phases.h"

namespace tdc::harness {

namespace {
thread_local const RankContext* t_ctx = nullptr;
thread_local int t_barrier_count = 0;
thread_local std::string t_subtest;
std::mutex g_event_mu;

std::map<std::string, TestOptions>& suite_options() {
  static std::map<std::string, TestOptions> m;
  return m;
}
}  // namespace

const char* to_string(Launcher l) {
  switch (l) {
    case Launcher::Fork:
      return "fork";
    case Launcher::Thread:
      return "thread";
    case Launcher::Spawn:
      return "spawn";
    case Launcher::Env:
      return "env";
  }
  return "?";
}

Launcher launcher_from_string(const std::string& s) {
  if (s == "fork") return Launcher::Fork;
  if (s == "thread") return Launcher::Thread;
  if (s == "spawn") return Launcher::Spawn;
  if (s == "env") return Launcher::Env;
  throw std::invalid_argument("unknown launcher '" + s + "' (known: fork, thread, spawn, env)");
}

namespace internal {
RunSettings& settings() {
  static RunSettings s;
  return s;
}
}  // namespace internal

const RankContext& ctx() {
  if (!t_ctx)
    throw std::logic_error(
        "tdc::harness::ctx() called outside a rank body (only TDC_DIST_TEST bodies and the "
        "functions they call have a rank context)");
  return *t_ctx;
}

bool in_rank() { return t_ctx != nullptr; }

namespace {
// [Note: a rank that left cannot enter a barrier] Every rank records in the store how its body
// ended ("pass", "fail", "skip", or "followed a peer" that had left) and bumps tdc/left. A barrier that waits for a rank that has
// left would block until the deadline; it checks tdc/left while it waits and, if a rank left
// without entering it, ends now. A rank that left after passing this barrier set the barrier's
// done key first, so done is checked again after a departure is seen (no false alarm).
const std::string kLeftCount = "tdc/left";
std::string left_key(int rank) { return fmt::format("tdc/left/{}", rank); }

std::string store_str(c10d::Store& s, const std::string& key) {
  auto v = s.get(key);
  return std::string(v.begin(), v.end());
}

[[noreturn]] void peer_left_barrier(const RankContext& c, int barrier_index) {
  std::vector<std::string> quiet, loud;
  for (int r = 0; r < c.world_size; ++r) {
    if (r == c.rank || !c.store->check({left_key(r)})) continue;
    std::string how = store_str(*c.store, left_key(r));
    (how == "pass" ? loud : quiet).push_back(fmt::format("rank {} ({})", r, how));
  }
  // A peer that failed or skipped already explains the test's outcome: end this rank quietly.
  if (loud.empty()) throw detail::PeerLeft(fmt::format("{} left", fmt::join(quiet, ", ")));
  throw std::runtime_error(
      fmt::format("barrier #{}: {} returned from the test body without entering this barrier; the ranks are "
                  "misaligned (a rank skipped a collective or barrier the others entered)",
                  barrier_index, fmt::join(loud, ", ")));
}
}  // namespace

void barrier() {
  const auto& c = ctx();
  if (c.world_size == 1) return;
  // Keys are unique per test (fresh store) and per barrier (counter), so no reset is needed.
  const int index = t_barrier_count++;
  const std::string key = fmt::format("tdc/barrier/{}", index), done = key + "/done";
  if (c.store->add(key, 1) == c.world_size) c.store->set(done, std::vector<uint8_t>{1});
  for (;;) {
    try {
      c.store->wait({done}, std::chrono::milliseconds(100));
      return;
    } catch (const c10::Error&) {  // timed out ("Wait timeout"): has a rank left instead of coming?
    }
    if (c.store->add(kLeftCount, 0) > 0 && !c.store->check({done})) peer_left_barrier(c, index);
  }
}

namespace {
int cuda_device_count_here() {
  if (!at::detail::getCUDAHooks().hasCUDA()) return 0;
  return static_cast<int>(at::detail::getCUDAHooks().deviceCount());
}

// [Note: the parent never initialises CUDA]
// Asking CUDA how many devices there are initialises its driver in the asking process, and a
// process forked after that cannot use CUDA (ranks die or hang at their first CUDA call). The
// parent of forked ranks therefore asks in a short-lived child of its own, once, and caches the
// answer; rank processes and thread ranks ask directly. The fork launcher stays safe to use with
// --tdc_device=cuda as long as nothing else in the parent touches CUDA (fixtures do not: they take
// the device from the run, fixtures/models.h).
int cuda_device_count_from_child() {
  const pid_t pid = ::fork();
  if (pid < 0) return cuda_device_count_here();  // cannot fork: ask here (no forks would follow either)
  if (pid == 0) {
    int n = 0;
    try {
      n = cuda_device_count_here();
    } catch (...) {
    }
    ::_exit(n < 0 ? 0 : n > 200 ? 200 : n);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}
}  // namespace

std::string gpu_skip_reason(const std::string& backend, int world_size, int min_gpus, int gpus) {
  const int for_backend = backend == "nccl" ? world_size : 0;
  const int need = std::max(min_gpus, for_backend);
  if (gpus >= need) return "";
  const std::string why = for_backend >= min_gpus
                              ? fmt::format("backend nccl runs one rank per GPU, world size {}", world_size)
                              : fmt::format("skip_if_lt_x_gpu({})", min_gpus);
  return fmt::format("Need at least {} CUDA device{} ({}; this machine has {})", need, need == 1 ? "" : "s", why, gpus);
}

int device_count() {
  if (detail::child_spec().active || internal::settings().launcher == Launcher::Thread) return cuda_device_count_here();
  static const int parent_count = cuda_device_count_from_child();
  return parent_count;
}

void internal::register_suite_options(const char* suite, const TestOptions& o) { suite_options()[suite] = o; }

namespace {
struct Capabilities {
  std::optional<ImplementationInfo> info;
  std::set<std::string> features;
};
Capabilities& capabilities() {
  static Capabilities c;
  return c;
}
}  // namespace

void declare_implementation(const ImplementationInfo& info) {
  auto& c = capabilities();
  c.info = info;
  c.features = std::set<std::string>(info.features.begin(), info.features.end());
}

void declare_capabilities(const std::string& implementation, const std::vector<std::string>& features) {
  declare_implementation({.name = implementation, .features = features});
}

const ImplementationInfo* declared_implementation() {
  const auto& c = capabilities();
  return c.info ? &*c.info : nullptr;
}

bool has_capability(const std::string& feature) {
  const auto& c = capabilities();
  return !c.info || c.features.count(feature) > 0;
}

namespace detail {

ContextScope::ContextScope(const RankContext& c) {
  t_ctx = &c;
  t_barrier_count = 0;
  t_subtest.clear();
}
ContextScope::~ContextScope() {
  t_ctx = nullptr;
  t_subtest.clear();
}

std::string& subtest_label() { return t_subtest; }

ChildSpec& child_spec() {
  static ChildSpec c;
  return c;
}

LastOutcome& last_outcome() {
  static LastOutcome o;
  return o;
}

namespace {
// [Note: tests whose ranks need a process each] (harness.h): the thread launcher gives way to fork.
void give_each_rank_a_process(LaunchSpec& spec, bool thread_launcher_forced) {
  if (thread_launcher_forced) {
    throw std::invalid_argument(fmt::format(
        "{}.{}: the test forces the thread launcher (.launcher = Launcher::Thread) but its ranks need a process "
        "each (.process_per_rank = true); drop one of the two",
        spec.suite, spec.name));
  }
  spec.launcher = Launcher::Fork;
  static bool said = false;
  if (!std::exchange(said, true))
    std::fprintf(stderr,
                 "tdc: tests whose ranks need a process each (.process_per_rank: they seed process-wide state such "
                 "as ATen's default generator per rank) start their ranks with the fork launcher, not as threads; "
                 "the results name the launcher each test used\n");
}
}  // namespace

LaunchSpec resolve(const char* suite, const char* name, const TestOptions& o) {
  const internal::RunSettings& s = internal::settings();
  TestOptions so;
  if (auto it = suite_options().find(suite); it != suite_options().end()) so = it->second;
  LaunchSpec spec;
  spec.suite = suite;
  spec.name = name;
  spec.world_size = o.world_size ? o.world_size : so.world_size ? so.world_size : s.default_world_size;
  spec.timeout_s = o.timeout_s > 0 ? o.timeout_s : so.timeout_s > 0 ? so.timeout_s : s.timeout_s;
  // Under an external launcher (env) the ranks already exist: a test cannot choose another.
  spec.launcher = s.launcher == Launcher::Env ? Launcher::Env
                  : o.launcher                ? *o.launcher
                  : so.launcher               ? *so.launcher
                                              : s.launcher;
  spec.num_threads = o.num_threads ? o.num_threads : so.num_threads ? so.num_threads : 1;
  spec.seed = o.seed ? *o.seed : so.seed ? *so.seed : 1234;
  if ((o.process_per_rank || so.process_per_rank) && spec.launcher == Launcher::Thread) {
    give_each_rank_a_process(spec, o.launcher || so.launcher);
  }
  return spec;
}

void EventSink::write(const nlohmann::json& j) {
  std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::lock_guard<std::mutex> lock(g_event_mu);
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // parent gone: nothing useful left to do with the event
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

namespace {

// Streams every GoogleTest result of the calling thread to the parent as it happens.
class RankReporter : public testing::ScopedFakeTestPartResultReporter {
 public:
  RankReporter(EventSink& sink, int rank)
      : ScopedFakeTestPartResultReporter(INTERCEPT_ONLY_CURRENT_THREAD, &unused_), sink_(sink), rank_(rank) {}

  void ReportTestPartResult(const testing::TestPartResult& r) override {
    std::string prefix = fmt::format("[rank {}] ", rank_);
    if (!t_subtest.empty()) prefix += "[subtest " + t_subtest + "] ";
    if (r.skipped()) {
      skipped_ = true;
      sink_.write({{"e", "skip"}, {"rank", rank_}, {"msg", prefix + r.message()}});
      return;
    }
    failed_ = true;
    // ADD_FAILURE() << m and FAIL() << m arrive as "Failed\nm": the first line should say what.
    std::string message = r.message();
    if (message.rfind("Failed\n", 0) == 0) message.erase(0, 7);
    sink_.write({{"e", "fail"},
                 {"rank", rank_},
                 {"file", r.file_name() ? r.file_name() : ""},
                 {"line", r.line_number()},
                 {"msg", prefix + message}});
  }
  bool failed() const { return failed_; }
  bool skipped() const { return skipped_; }

 private:
  testing::TestPartResultArray unused_;
  EventSink& sink_;
  int rank_;
  bool failed_ = false, skipped_ = false;
};

// Records how this rank's body ended, for barriers that other ranks are still waiting in.
void mark_left(const RankContext& c, const std::string& how) {
  if (c.world_size == 1 || !c.store) return;
  try {
    c.store->set(left_key(c.rank), std::vector<uint8_t>(how.begin(), how.end()));
    c.store->add(kLeftCount, 1);
  } catch (const std::exception&) {
    // The store is gone (the parent is tearing the test down): nobody is waiting any more.
  }
}

}  // namespace

namespace {
std::map<std::string, harness::RankReporter>& rank_reporters() {
  static std::map<std::string, harness::RankReporter> r;
  return r;
}
}  // namespace

void reset_rank_reports() {
  for (auto& [name, r] : rank_reporters()) {
    try {
      if (r.reset) r.reset();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tdc: rank reporter '%s' failed to reset: %s\n", name.c_str(), e.what());
    }
  }
}

void write_rank_reports(EventSink& sink, int rank) {
  for (auto& [name, r] : rank_reporters()) {
    try {
      if (!r.collect) continue;
      nlohmann::json data = nlohmann::json::object();
      for (const auto& [key, values] : r.collect()) data[key] = values;
      sink.write({{"e", "report"}, {"rank", rank}, {"name", name}, {"data", std::move(data)}});
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tdc: rank reporter '%s' failed on rank %d: %s\n", name.c_str(), rank, e.what());
    }
  }
}

void run_rank(const RankContext& c, const std::function<void()>& body, EventSink& sink, int num_threads) {
  auto t0 = std::chrono::steady_clock::now();
  mark_phase(c.test_id, c.rank, "rank_start");
  ContextScope scope(c);
  {
    RankReporter reporter(sink, c.rank);
    bool failed_by_exception = false;
    auto report_exception = [&](const std::string& what) {
      failed_by_exception = true;
      std::string msg = fmt::format("[rank {}] ", c.rank);
      if (!t_subtest.empty()) msg += "[subtest " + t_subtest + "] ";
      sink.write(
          {{"e", "fail"}, {"rank", c.rank}, {"file", ""}, {"line", 0}, {"msg", msg + "uncaught exception: " + what}});
    };
    bool peer_left = false;
    try {
      // Thread ranks share one process: the launcher sets threads and the seed once, before the
      // rank threads start (a per-thread manual_seed would race with other ranks' draws).
      if (c.launcher != Launcher::Thread) {
        if (num_threads > 0) at::set_num_threads(num_threads);
        at::manual_seed(c.seed);
        reset_rank_reports();  // one rank per process; the thread launcher resets before its threads
      }
      if (c.device.is_cuda()) c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(c.device);
      mark_phase(c.test_id, c.rank, "body_start");
      body();
    } catch (const PeerLeft&) {
      peer_left = true;  // a peer failed or skipped and left; its own event explains the outcome
    } catch (const c10::Error& e) {
      report_exception(e.what_without_backtrace());
    } catch (const std::exception& e) {
      report_exception(e.what());
    } catch (...) {
      report_exception("(not a std::exception)");
    }
    mark_phase(c.test_id, c.rank, "body_end");
    // Only "pass" makes a waiting peer's barrier fail loudly; the others explain themselves.
    mark_left(c, reporter.failed() || failed_by_exception ? "fail"
                 : reporter.skipped()                     ? "skip"
                 : peer_left                              ? "followed a peer"
                                                          : "pass");
  }
  double dur = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write_rank_reports(sink, c.rank);
  sink.write({{"e", "done"}, {"rank", c.rank}, {"dur", dur}});
}

}  // namespace detail

void add_rank_reporter(const std::string& name, RankReporter reporter) {
  if (name.empty()) throw std::invalid_argument("add_rank_reporter: the reporter's name is empty");
  if (!detail::rank_reporters().emplace(name, std::move(reporter)).second)
    throw std::invalid_argument(fmt::format("add_rank_reporter: a reporter named '{}' is already registered", name));
}

}  // namespace tdc::harness
