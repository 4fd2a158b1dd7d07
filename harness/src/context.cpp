// The rank context, run settings, suite options, and running one rank's body.
#include <unistd.h>

#include <set>

#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <gtest/gtest-spi.h>

#include "internal.h"

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
    case Launcher::Fork: return "fork";
    case Launcher::Thread: return "thread";
    case Launcher::Spawn: return "spawn";
    case Launcher::Env: return "env";
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

RunSettings& settings() {
  static RunSettings s;
  return s;
}

const RankContext& ctx() {
  if (!t_ctx)
    throw std::logic_error(
        "tdc::harness::ctx() called outside a rank body (only TDC_DIST_TEST bodies and the "
        "functions they call have a rank context)");
  return *t_ctx;
}

bool in_rank() { return t_ctx != nullptr; }

void barrier() {
  const auto& c = ctx();
  if (c.world_size == 1) return;
  // Keys are unique per test (fresh store) and per barrier (counter), so no reset is needed.
  const std::string key = fmt::format("tdc/barrier/{}", t_barrier_count++);
  if (c.store->add(key, 1) == c.world_size) c.store->set(key + "/done", std::vector<uint8_t>{1});
  c.store->wait({key + "/done"});
}

int device_count() {
  if (!at::detail::getCUDAHooks().hasCUDA()) return 0;
  return static_cast<int>(at::detail::getCUDAHooks().deviceCount());
}

void register_suite_options(const char* suite, const TestOptions& o) { suite_options()[suite] = o; }

namespace {
struct Capabilities {
  bool declared = false;
  std::string implementation;
  std::set<std::string> features;
};
Capabilities& capabilities() {
  static Capabilities c;
  return c;
}
}  // namespace

void declare_capabilities(const std::string& implementation, const std::vector<std::string>& features) {
  auto& c = capabilities();
  c.declared = true;
  c.implementation = implementation;
  c.features.insert(features.begin(), features.end());
}

bool has_capability(const std::string& feature) {
  const auto& c = capabilities();
  return !c.declared || c.features.count(feature) > 0;
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

LaunchSpec resolve(const char* suite, const char* name, const TestOptions& o) {
  const RunSettings& s = settings();
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
      : ScopedFakeTestPartResultReporter(INTERCEPT_ONLY_CURRENT_THREAD, &unused_), sink_(sink),
        rank_(rank) {}

  void ReportTestPartResult(const testing::TestPartResult& r) override {
    std::string prefix = fmt::format("[rank {}] ", rank_);
    if (!t_subtest.empty()) prefix += "[subtest " + t_subtest + "] ";
    if (r.skipped()) {
      skipped_ = true;
      sink_.write({{"e", "skip"}, {"rank", rank_}, {"msg", prefix + r.message()}});
      return;
    }
    failed_ = true;
    sink_.write({{"e", "fail"},
                 {"rank", rank_},
                 {"file", r.file_name() ? r.file_name() : ""},
                 {"line", r.line_number()},
                 {"msg", prefix + r.message()}});
  }
  bool failed() const { return failed_; }

 private:
  testing::TestPartResultArray unused_;
  EventSink& sink_;
  int rank_;
  bool failed_ = false, skipped_ = false;
};

}  // namespace

void run_rank(const RankContext& c, const std::function<void()>& body, EventSink& sink,
              int num_threads) {
  auto t0 = std::chrono::steady_clock::now();
  ContextScope scope(c);
  {
    RankReporter reporter(sink, c.rank);
    auto report_exception = [&](const std::string& what) {
      std::string msg = fmt::format("[rank {}] ", c.rank);
      if (!t_subtest.empty()) msg += "[subtest " + t_subtest + "] ";
      sink.write({{"e", "fail"}, {"rank", c.rank}, {"file", ""}, {"line", 0},
                  {"msg", msg + "uncaught exception: " + what}});
    };
    try {
      // Thread ranks share one process: the launcher sets threads and the seed once, before the
      // rank threads start (a per-thread manual_seed would race with other ranks' draws).
      if (c.launcher != Launcher::Thread) {
        if (num_threads > 0) at::set_num_threads(num_threads);
        at::manual_seed(c.seed);
      }
      if (c.device.is_cuda())
        c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(c.device);
      body();
    } catch (const c10::Error& e) {
      report_exception(e.what_without_backtrace());
    } catch (const std::exception& e) {
      report_exception(e.what());
    } catch (...) {
      report_exception("(not a std::exception)");
    }
  }
  double dur = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  sink.write({{"e", "done"}, {"rank", c.rank}, {"dur", dur}});
}

}  // namespace detail
}  // namespace tdc::harness
