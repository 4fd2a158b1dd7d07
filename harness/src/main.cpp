// Flags (init), the results listener, and internal::main() for harness test binaries.
#include <fcntl.h>
#include <cstdlib>
#include <unistd.h>

#include <ATen/Parallel.h>
#include <torch/version.h>

#include <cctype>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "internal.h"
#include "tdc/harness/implementation.h"

#ifndef TDC_VERSION
#define TDC_VERSION "0.0.0"
#endif

namespace tdc::harness {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

double parse_double(const std::string& flag, const std::string& v) {
  try {
    size_t idx = 0;
    double d = std::stod(v, &idx);
    if (idx == v.size() && d > 0) return d;
  } catch (...) {
  }
  throw std::invalid_argument(fmt::format("{} expects a positive number of seconds, got '{}'", flag, v));
}

int parse_int(const std::string& flag, const std::string& v) {
  try {
    size_t idx = 0;
    int i = std::stoi(v, &idx);
    if (idx == v.size()) return i;
  } catch (...) {
  }
  throw std::invalid_argument(fmt::format("{} expects an integer, got '{}'", flag, v));
}

bool truthy(const std::string& v) { return v == "1" || v == "true" || v == "yes" || v.empty(); }

bool& preflight_requested() {
  static bool requested = false;
  return requested;
}

std::vector<PreflightCheck>& preflight_checks() {
  static std::vector<PreflightCheck> checks;
  return checks;
}

// The harness's own check (devices), then the implementation's; the first failure's message.
std::optional<std::string> preflight_error() {
  const internal::RunSettings& s = internal::settings();
  PreflightSettings p{s.backend, s.backend_lib, s.device_type};
  try {
    if (s.backend == "nccl" && s.device_type != "cuda")
      throw std::invalid_argument(fmt::format(
          "backend 'nccl' works on CUDA tensors only, and the device is '{}': add --device cuda (or use gloo "
          "on CPU)",
          s.device_type));
    if (s.device_type == "cuda" && device_count() == 0)
      throw std::invalid_argument(
          "device 'cuda': no CUDA device is visible to this process (device count 0: a CPU-only "
          "LibTorch build, or no GPU on this host)");
    for (PreflightCheck check : preflight_checks()) check(p);
  } catch (const std::exception& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

// The spawn launcher's child description: rank,world,events_fd,seed,num_threads,temp_dir.
void apply_child(const std::string& flag, const std::string& value) {
  auto& c = detail::child_spec();
  std::vector<std::string> parts;
  size_t start = 0;
  for (int i = 0; i < 5; ++i) {
    size_t comma = value.find(',', start);
    if (comma == std::string::npos) throw std::invalid_argument("malformed " + flag + "=" + value);
    parts.push_back(value.substr(start, comma - start));
    start = comma + 1;
  }
  c.active = true;
  c.rank = parse_int(flag, parts[0]);
  c.world_size = parse_int(flag, parts[1]);
  c.events_fd = parse_int(flag, parts[2]);
  c.seed = std::stoull(parts[3]);
  c.num_threads = parse_int(flag, parts[4]);
  c.temp_dir = value.substr(start);
}

// [Note: the harness's settings] One table holds every setting: its name (flag --tdc_<name>;
// environment TDC_<NAME> where `env` says so), whether it needs a value, and how it is applied.
// init() reads the environment, then the flags, from this table alone, and an unknown flag's
// message lists the table's public names. Flags win over the environment.
enum class Source { kFlagAndEnv, kFlagOnly, kInternal };  // kInternal: flag only, never listed
struct Setting {
  const char* name;
  Source source;
  bool needs_value;
  void (*apply)(internal::RunSettings& s, const std::string& flag, const std::string& value);
};

using RS = internal::RunSettings;
using Str = const std::string&;
const Setting kSettings[] = {
    {"launcher", Source::kFlagAndEnv, true, [](RS& s, Str, Str v) { s.launcher = launcher_from_string(v); }},
    {"backend", Source::kFlagAndEnv, true, [](RS& s, Str, Str v) { s.backend = v; }},
    {"backend_lib", Source::kFlagAndEnv, false, [](RS& s, Str, Str v) { s.backend_lib = v; }},
    {"device", Source::kFlagAndEnv, true,
     [](RS& s, Str flag, Str v) {
       if (v != "cpu" && v != "cuda")
         throw std::invalid_argument(fmt::format("{} must be cpu or cuda, got '{}'", flag, v));
       s.device_type = v;
     }},
    {"timeout", Source::kFlagAndEnv, true, [](RS& s, Str flag, Str v) { s.timeout_s = parse_double(flag, v); }},
    {"world_size", Source::kFlagAndEnv, true,
     [](RS& s, Str flag, Str v) {
       s.default_world_size = parse_int(flag, v);
       if (s.default_world_size < 1) throw std::invalid_argument(flag + " must be >= 1");
     }},
    {"keep_temp", Source::kFlagAndEnv, false, [](RS& s, Str, Str v) { s.keep_temp = truthy(v); }},
    {"show_output", Source::kFlagAndEnv, false, [](RS& s, Str, Str v) { s.show_output = truthy(v); }},
    {"stacks", Source::kFlagAndEnv, true,
     [](RS& s, Str flag, Str v) {
       if (v != "signal" && v != "gdb" && v != "both")
         throw std::invalid_argument(fmt::format("{} must be signal, gdb or both, got '{}'", flag, v));
       s.stacks = v;
     }},
    {"results", Source::kFlagAndEnv, true, [](RS& s, Str, Str v) { s.results_path = v; }},
    {"junit", Source::kFlagAndEnv, true, [](RS& s, Str, Str v) { s.junit_path = v; }},
    {"expectations", Source::kFlagAndEnv, true, [](RS& s, Str, Str v) { s.expectations_path = v; }},
    {"implementation", Source::kFlagAndEnv, true,
     [](RS& s, Str, Str v) {
       auto colon = v.find(':');
       s.implementation = v.substr(0, colon);
       s.implementation_version = colon == std::string::npos ? "" : v.substr(colon + 1);
     }},
    {"abort_grace", Source::kFlagAndEnv, true, [](RS& s, Str flag, Str v) { s.abort_grace_s = parse_double(flag, v); }},
    {"stacks_timeout", Source::kFlagAndEnv, true,
     [](RS& s, Str flag, Str v) { s.stacks_timeout_s = parse_double(flag, v); }},
    {"events_fd", Source::kFlagOnly, true, [](RS& s, Str flag, Str v) { s.events_fd = parse_int(flag, v); }},
    {"preflight", Source::kFlagOnly, false, [](RS&, Str, Str v) { preflight_requested() = truthy(v); }},
    {"child", Source::kInternal, true, [](RS&, Str flag, Str v) { apply_child(flag, v); }},
};

void apply(const std::string& name, const std::string& value, bool has_value) {
  const std::string flag = "--tdc_" + name;
  for (const Setting& setting : kSettings) {
    if (name != setting.name) continue;
    if (setting.needs_value && (!has_value || value.empty()))
      throw std::invalid_argument(flag + " needs a value (" + flag + "=...)");
    setting.apply(internal::settings(), flag, value);
    return;
  }
  std::vector<std::string> known;
  for (const Setting& setting : kSettings)
    if (setting.source != Source::kInternal) known.push_back(std::string("--tdc_") + setting.name);
  throw std::invalid_argument(fmt::format("unknown flag {} (known: {})", flag, fmt::join(known, ", ")));
}

// TDC_<NAME> of every setting the environment may set.
void apply_environment() {
  for (const Setting& setting : kSettings) {
    if (setting.source != Source::kFlagAndEnv) continue;
    std::string upper = "TDC_";
    for (const char* p = setting.name; *p; ++p) upper += static_cast<char>(std::toupper(*p));
    if (const char* v = std::getenv(upper.c_str()); v && *v) apply(setting.name, v, true);
  }
}

// ---------------------------------------------------------------- results listener
class ResultsListener : public testing::EmptyTestEventListener {
 public:
  void OnTestProgramStart(const testing::UnitTest&) override {
    t0_ = std::chrono::steady_clock::now();
    const internal::RunSettings& s = internal::settings();
    auto& info = results_.run_info;
    // --tdc_implementation names the run; else the implementation's own declaration; else the
    // reference's name (a binary without conformance glue declares nothing).
    const ImplementationInfo* declared = declared_implementation();
    info.implementation = !s.implementation.empty() ? s.implementation : declared ? declared->name : "tdc-reference";
    info.implementation_version = !s.implementation_version.empty() ? s.implementation_version
                                  : declared                        ? declared->version
                                                                    : TDC_VERSION;
    if (declared) info.implementation_library = declared->library;
    info.backend = s.backend;
    info.device = s.device_type;
    info.launcher = to_string(s.launcher);
    info.suite_revision = env("TDC_SUITE_REVISION").empty() ? "unknown" : env("TDC_SUITE_REVISION");
    info.tdc_version = TDC_VERSION;
    info.libtorch_version = TORCH_VERSION;
    info.libtorch_cuda = TDC_TORCH_CUDA;
    info.nccl_version = TDC_NCCL_VERSION;
    info.compiler = TDC_COMPILER;
    info.host = hostname();
    info.started_at = iso_now();
    if (!s.expectations_path.empty()) expectations_ = read_expectations(s.expectations_path);
  }

  void OnTestStart(const testing::TestInfo& t) override {
    detail::last_outcome() = {};
    test_t0_ = std::chrono::steady_clock::now();
    emit({{"event", "start"}, {"test", id(t)}});
  }

  void OnTestEnd(const testing::TestInfo& t) override {
    TestResult r;
    r.id = id(t);
    r.suite = t.test_suite_name();
    r.name = t.name();
    r.duration_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - test_t0_).count();
    const testing::TestResult& g = *t.result();
    std::vector<std::string> msgs;
    for (int i = 0; i < g.total_part_count(); ++i) msgs.push_back(g.GetTestPartResult(i).message());
    if (g.Skipped()) {
      r.status = Status::Skip;
      for (auto& m : msgs)
        if (detail::is_not_supported_message(m)) r.status = Status::NotSupported;
    } else if (g.Failed()) {
      r.status = Status::Fail;
    }
    r.message = fmt::format("{}", fmt::join(msgs, "\n"));
    r.world_size = 1;
    r.launcher = "none";
    auto& last = detail::last_outcome();
    if (last.test_id == r.id) {
      r.status = last.outcome.status;
      r.message = last.outcome.message;
      r.ranks = last.outcome.ranks;
      r.world_size = last.world_size;
      r.launcher = last.launcher;
      r.reports = last.outcome.reports;
      // An assertion in the TEST body itself (outside the ranks) still fails the test.
      if (r.status == Status::Pass && g.Failed())
        r.status = Status::Fail, r.message = fmt::format("{}", fmt::join(msgs, "\n"));
    }
    if (r.status == Status::Pass) r.message.clear();
    set_location(r, g);
    apply_expectations(r, expectations_);
    results_.run_info.world_size = std::max(results_.run_info.world_size, r.world_size);
    emit({{"event", "end"},
          {"test", r.id},
          {"status", to_string(r.status)},
          {"duration_s", r.duration_s},
          {"message", r.message.substr(0, 4000)}});
    results_.tests.push_back(std::move(r));
  }

  void OnTestProgramEnd(const testing::UnitTest&) override {
    results_.run_info.duration_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    for (const TestResult& t : results_.tests) merge_reports(results_.reports, t.reports);
    const internal::RunSettings& s = internal::settings();
    if (!s.results_path.empty()) write_results_json(results_, s.results_path);
    if (!s.junit_path.empty()) write_junit_xml(results_, s.junit_path);
  }

  const RunResults& results() const { return results_; }

 private:
  static std::string id(const testing::TestInfo& t) { return std::string(t.test_suite_name()) + "." + t.name(); }
  // A failing test's file:line: its first failed test part's (run_distributed reports every
  // failure at its assertion, or at the test's definition when none is behind it).
  static void set_location(TestResult& r, const testing::TestResult& g) {
    if (!is_failure(r.status)) return;
    for (int i = 0; i < g.total_part_count(); ++i) {
      const testing::TestPartResult& p = g.GetTestPartResult(i);
      if (!p.failed() || !p.file_name()) continue;
      r.file = p.file_name();
      r.line = p.line_number();
      return;
    }
  }
  void emit(const nlohmann::json& j) {
    int fd = internal::settings().events_fd;
    if (fd < 0) return;
    detail::EventSink(fd).write(j);
  }

  RunResults results_;
  Expectations expectations_;
  std::chrono::steady_clock::time_point t0_, test_t0_;
};

}  // namespace

void register_preflight(PreflightCheck check) { preflight_checks().push_back(check); }

bool init(int* argc, char** argv, std::string* error) {
  try {
    apply_environment();
    int out = 1;
    for (int i = 1; i < *argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--tdc_", 0) != 0) {
        argv[out++] = argv[i];
        continue;
      }
      auto eq = a.find('=');
      std::string name = a.substr(6, eq == std::string::npos ? std::string::npos : eq - 6);
      apply(name, eq == std::string::npos ? "" : a.substr(eq + 1), eq != std::string::npos);
    }
    *argc = out;
    argv[out] = nullptr;
  } catch (const std::exception& e) {
    if (error) *error = e.what();
    return false;
  }
  // [Note: one source of truth for the device] The run's device and backend, published for code
  // that cannot see the harness (fixtures/models.h reads them); ranks inherit them.
  ::setenv("TDC_DEVICE", internal::settings().device_type.c_str(), 1);
  ::setenv("TDC_BACKEND", internal::settings().backend.c_str(), 1);
  // The parent runs no parallel ATen work, so fork() stays safe: a child forked after its parent
  // ran a multi-threaded ATen op inherits a thread pool whose threads it does not have, and hangs
  // in its first parallel op.
  at::set_num_threads(1);
  if (!detail::child_spec().active) detail::install_parent_signal_handlers();
  return true;
}

namespace internal {
int main(int argc, char** argv) {
  std::string error;
  if (!init(&argc, argv, &error)) {
    std::fprintf(stderr, "tdc: %s\n", error.c_str());
    return 2;
  }
  if (preflight_requested()) {
    if (auto err = preflight_error()) {
      std::fprintf(stderr, "tdc: %s\n", err->c_str());
      return 2;
    }
    std::printf("tdc: preflight ok (backend %s, device %s)\n", internal::settings().backend.c_str(),
                internal::settings().device_type.c_str());
    return 0;
  }
  testing::InitGoogleTest(&argc, argv);
  if (detail::child_spec().active) return RUN_ALL_TESTS();  // the rank _exit()s inside its test
  detail::install_process_signal_handlers();
  auto* listener = new ResultsListener;  // owned by GoogleTest
  testing::UnitTest::GetInstance()->listeners().Append(listener);
  int rc = RUN_ALL_TESTS();
  // Expectations can turn failures into XFAIL: the results decide the exit code.
  if (rc != 0 && listener->results().ok() && !listener->results().tests.empty()) rc = 0;
  if (rc == 0 && !listener->results().ok()) rc = 1;
  return rc;
}
}  // namespace internal

}  // namespace tdc::harness
