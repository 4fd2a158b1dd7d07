// `tdc run`: list the selected test binaries' tests, run each binary with the run's flags and a
// progress pipe, merge their results into one RunResults, write results.json + junit.xml, and
// print a summary. A binary that dies without results is reported, never dropped.
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <fmt/ranges.h>

#include "test_lists.h"
#include "cli.h"
#include "process.h"
#include "progress.h"
#include "implementation_library.h"
#include "report/report.h"
#include "run_processes.h"
#include "shards.h"
#include "summary.h"
#include "tdc/harness/external_launcher.h"
#include "tdc/harness/results.h"

#ifndef TDC_VERSION
#define TDC_VERSION "unknown"
#endif

namespace tdc::cli {

namespace fs = std::filesystem;
using harness::RunResults;
using harness::Status;
using harness::TestResult;
using nlohmann::json;

using namespace run_detail;  // Binary, Options, the test processes

namespace {

const std::vector<OptionSpec> kRunOptions = {
    {"filter", "GLOB", "GoogleTest filter of tests to run (default '*'; 'A.*:B.*', '*-Slow.*')"},
    {"backend", "NAME", "c10d backend (default gloo)"},
    {"device", "cpu|cuda", "device type (default cpu)"},
    {"launcher", "fork|thread|spawn|env", "how ranks start (default fork)"},
    {"backend-lib", "PATH", "shared library that registers the --backend"},
    {"impl", "LIB", "run against the implementation library LIB in place of libtdc.so (docs/plugging-in.md)"},
    {"implementation", "NAME", "name the implementation under test in the results (default: its descriptor's)"},
    {"timeout", "S", "per-test deadline in seconds (default: the harness's, 60)"},
    {"expectations", "FILE", "known failures: FAIL->XFAIL, PASS->XPASS (docs/results-schema.md)"},
    {"kind", "conformance|unit|mustfail",
     "which test binaries (default conformance; unit if none;\n"
     "                                   mustfail: the harness's must-fail cases)"},
    {"out", "DIR", "results directory (default results/ in the current directory)"},
    {"build-dir", "DIR", "build directory (default $TDC_BUILD)"},
    {"idle-timeout", "S", "kill a binary that reports no test event for S seconds (default 600)"},
    {"check", nullptr, "after writing, re-read results.json and junit.xml and validate both"},
    {"repeat", "N", "run every selected test N times; one whose status differs is FLAKY (a failure)"},
    {"suites", "A,B", "only these test binaries, in this order (names as in tdc_suites.json)"},
    {"binary", "PATH,PATH",
     "run these test binaries instead of tdc_suites.json's: yours, built outside tdc's tree\n"
     "                                   (GoogleTest + tdc::harness; docs/writing-a-distributed-test.md)"},
    {"stop-on-failure", nullptr, "stop every test process once one had a failing test (tdc mutate)"},
    {"durations", "FILE",
     "balance the shards by the test durations in FILE (a results.json; default: DIR/results.json\n"
     "                                   of the previous run, when there is one)"},
    {"jobs", "N",
     "test processes at once (default: 3 per CPU, at most 8; 1 on cuda and with --launcher env;\n"
     "                                   [Note: tests side by side] in cli/shards.h)"},
    {"no-pin", nullptr,
     "let the kernel place the test processes on any CPU (default with --jobs > 1: each on its own\n"
     "                                   CPUs, [Note: a test process on its own CPUs] in cli/cpu_groups.h)"},
    {"no-report", nullptr, "do not write DIR/report.html and DIR/report.md (tdc report RUN --out DIR)"},
};

constexpr const char* kRunUsage =
    "usage: tdc run [options]\n\n"
    "Runs the conformance suite (test binaries of kind 'conformance' in tdc_suites.json; the\n"
    "unit suites when there are none yet; your own test binaries with --binary) with live\n"
    "progress, then writes DIR/results.json,\n"
    "DIR/junit.xml and DIR/logs/<binary>[.shard<k>].log and prints a per-suite summary; then the report a\n"
    "person reads, DIR/report.html and DIR/report.md (as `tdc report DIR --out DIR` writes it).\n"
    "Exit status: 0 when no test has a failure status (FAIL, XPASS, TIMEOUT, CRASH), 1 otherwise\n"
    "(also when no test matches the filter), 2 on a usage or setup error, 130 when interrupted.\n"
    "With --repeat N each test's record carries repeat_statuses (status -> count); a test seen\n"
    "with more than one status is FLAKY, and a FLAKY test fails the run.\n\n"
    "Options:\n";

// --binary P1,P2: test binaries outside tdc_suites.json, each an executable file (absolute, so a
// binary's working directory does not matter). --suites and --kind select from the manifest and
// cannot be combined with it.
std::vector<fs::path> parse_binaries(const std::string& value, const Options& o) {
  if (!o.suites.empty() || o.kind)
    throw UsageError("run: --binary names the test binaries itself; it cannot be combined with --suites or --kind");
  std::vector<fs::path> out;
  std::stringstream in(value);
  for (std::string path; std::getline(in, path, ',');) {
    if (path.empty()) continue;
    if (!fs::is_regular_file(path) || ::access(path.c_str(), X_OK) != 0)
      throw UsageError(fmt::format("run: --binary '{}' is not an executable file", path));
    out.push_back(fs::absolute(path).lexically_normal());
  }
  if (out.empty()) throw UsageError(fmt::format("run: --binary needs paths of test binaries, got '{}'", value));
  return out;
}

// The flags every test binary of the run gets (--tdc_*), each checked here first.
void parse_binary_flags(const ParsedArgs& a, Options& o) {
  if (auto v = a.get("launcher")) {
    static const std::set<std::string> kLaunchers = {"fork", "thread", "spawn", "env"};
    if (!kLaunchers.count(*v))
      throw UsageError(fmt::format("run: --launcher must be fork, thread, spawn or env, got '{}'", *v));
    o.launcher = *v;
    o.forwarded.push_back("--tdc_launcher=" + *v);
  }
  if (auto v = a.get("device")) {
    if (*v != "cpu" && *v != "cuda") throw UsageError(fmt::format("run: --device must be cpu or cuda, got '{}'", *v));
    o.device = *v;
    o.forwarded.push_back("--tdc_device=" + *v);
  }
  if (auto v = a.get("backend")) {
    if (v->empty()) throw UsageError("run: --backend needs a non-empty name");
    o.backend = *v;
    o.forwarded.push_back("--tdc_backend=" + *v);
  }
  if (auto v = a.get("backend-lib")) {
    if (!fs::is_regular_file(*v)) throw UsageError(fmt::format("run: --backend-lib '{}' is not a file", *v));
    o.forwarded.push_back("--tdc_backend_lib=" + fs::absolute(*v).string());
  }
  if (auto v = a.get("implementation")) {
    o.implementation = *v;
    o.forwarded.push_back("--tdc_implementation=" + *v);
  }
  if (auto v = a.get("timeout")) {
    double t = parse_seconds("run", "timeout", *v);
    o.forwarded.push_back(fmt::format("--tdc_timeout={}", t));
    o.idle_timeout_s = std::max(o.idle_timeout_s, 2 * t + 60);
  }
  if (auto v = a.get("expectations")) {
    o.expectations = fs::absolute(*v);
    harness::read_expectations(*o.expectations);  // fail now, naming the file and field
    o.forwarded.push_back("--tdc_expectations=" + o.expectations->string());
  }
}

// Which test binaries: --suites or --kind from tdc_suites.json, or --binary.
void parse_selection(const ParsedArgs& a, Options& o) {
  if (auto v = a.get("suites")) {
    std::stringstream in(*v);
    for (std::string name; std::getline(in, name, ',');)
      if (!name.empty()) o.suites.push_back(name);
    if (o.suites.empty()) throw UsageError(fmt::format("run: --suites needs binary names, got '{}'", *v));
  }
  if (auto v = a.get("kind")) {
    if (*v != "conformance" && *v != "unit" && *v != "mustfail")
      throw UsageError(fmt::format("run: --kind must be conformance, unit or mustfail, got '{}'", *v));
    o.kind = *v;
  }
  if (auto v = a.get("binary")) o.binaries = parse_binaries(*v, o);
}

// How many test processes at once, and where this rank writes under an external launcher.
void parse_processes(const ParsedArgs& a, Options& o) {
  if (o.launcher == "env") {
    try {
      if (auto r = harness::external_rank()) o.external_rank = std::max(r->rank, 0);
    } catch (const std::invalid_argument& e) {
      throw UsageError(fmt::format("run: --launcher env: {}", e.what()));
    }
    if (o.external_rank > 0) o.out = o.out / "ranks" / std::to_string(o.external_rank);
  }
  o.jobs = default_jobs(o.device, o.launcher, std::thread::hardware_concurrency());
  if (auto v = a.get("jobs")) {
    o.jobs = parse_positive_int("run", "jobs", *v);
    // Every rank's `tdc run` under an external launcher must start the same test at the same time.
    if (o.launcher == "env" && o.jobs > 1)
      throw UsageError(
          fmt::format("run: --jobs {} with --launcher env: ranks started by an external launcher "
                      "run one test at a time (--jobs 1)",
                      o.jobs));
  }
}

Options parse_options(const ParsedArgs& a) {
  Options o;
  if (auto v = a.get("filter")) o.filter = *v;
  parse_binary_flags(a, o);
  parse_selection(a, o);
  if (auto v = a.get("impl")) o.impl = fs::absolute(*v);
  o.stop_on_failure = a.has("stop-on-failure");
  if (auto v = a.get("idle-timeout")) o.idle_timeout_s = parse_seconds("run", "idle-timeout", *v);
  o.out = fs::absolute(a.get("out").value_or("results"));
  o.build = resolve_build_dir(a.get("build-dir"));
  o.check = a.has("check");
  o.no_report = a.has("no-report");
  o.pin = !a.has("no-pin");
  if (auto v = a.get("repeat")) o.repeat = parse_positive_int("run", "repeat", *v);
  if (auto v = a.get("durations")) {
    if (!fs::is_regular_file(*v)) throw UsageError(fmt::format("run: --durations '{}' is not a file", *v));
    o.durations = fs::absolute(*v);
  }
  parse_processes(a, o);
  return o;
}

json read_json_file(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw UsageError(fmt::format("cannot read '{}': {}", p.string(), std::strerror(errno)));
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    throw UsageError(fmt::format("'{}' is not valid JSON: {}", p.string(), e.what()));
  }
}

std::vector<Binary> select_binaries(const Options& o) {
  if (!o.binaries.empty()) {
    std::vector<Binary> out;
    for (const fs::path& p : o.binaries)
      out.push_back(Binary{.kind = "binary", .path = p, .name = p.filename().string()});
    return out;
  }
  fs::path manifest = o.build / "tdc_suites.json";
  json j = read_json_file(manifest);
  if (!j.is_array()) throw UsageError(fmt::format("'{}': expected a JSON array", manifest.string()));
  std::vector<Binary> all;
  for (size_t i = 0; i < j.size(); ++i) {
    const json& e = j[i];
    if (!e.is_object() || !e.contains("kind") || !e["kind"].is_string() || !e.contains("binary") ||
        !e["binary"].is_string())
      throw UsageError(fmt::format("'{}': entry [{}] needs string fields 'kind' and 'binary', got {}",
                                   manifest.string(), i, e.dump()));
    Binary b;
    b.kind = e["kind"].get<std::string>();
    b.path = e["binary"].get<std::string>();
    b.name = b.path.filename().string();
    all.push_back(std::move(b));
  }
  auto of_kind = [&](const std::string& kind) {
    std::vector<Binary> out;
    for (const auto& b : all)
      if (b.kind == kind) out.push_back(b);
    return out;
  };
  if (!o.suites.empty()) {
    std::vector<Binary> out;
    for (const std::string& name : o.suites) {
      auto it = std::find_if(all.begin(), all.end(), [&](const Binary& b) { return b.name == name; });
      if (it == all.end()) {
        std::vector<std::string> known;
        for (const auto& b : all) known.push_back(b.name);
        throw UsageError(fmt::format("run: --suites: no test binary '{}' in {} (known: {})", name, manifest.string(),
                                     fmt::join(known, ", ")));
      }
      out.push_back(*it);
    }
    return out;
  }
  if (o.kind) return of_kind(*o.kind);
  auto conformance = of_kind("conformance");
  if (!conformance.empty()) return conformance;
  fmt::print(stderr,
             "tdc run: note: no conformance test binaries in {} yet; running the unit "
             "suites (--kind unit)\n",
             manifest.string());
  return of_kind("unit");
}

// Parses --gtest_list_tests output: "Suite.\n  Name\n  Name2  # GetParam() = 3\n".
std::vector<std::string> parse_test_list(const std::string& text) {
  std::vector<std::string> tests;
  std::string suite;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (auto hash = line.find("  #"); hash != std::string::npos) line = line.substr(0, hash);
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.pop_back();
    if (line[0] != ' ') {
      suite = (!line.empty() && line.back() == '.' && line.find(' ') == std::string::npos)
                  ? line.substr(0, line.size() - 1)
                  : "";
      continue;
    }
    std::string name = line.substr(line.find_first_not_of(' '));
    if (suite.empty() || name.empty() || name.find(' ') != std::string::npos) continue;
    if (suite.rfind("DISABLED_", 0) == 0 || name.rfind("DISABLED_", 0) == 0) continue;
    tests.push_back(suite + "." + name);
  }
  return tests;
}

// ------------------------------------------------------------------ merging

std::string git_revision(const fs::path& root) {
  if (root.empty()) return "unknown";
  try {
    Captured c = capture({"git", "-C", root.string(), "rev-parse", "--short", "HEAD"}, false, 10);
    std::string rev = c.output.substr(0, c.output.find('\n'));
    if (WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0 && !rev.empty()) return rev;
  } catch (const std::exception&) {
  }
  return "unknown";
}

// What the build says of its LibTorch (tdc_build_info.json, cmake/TdcTargets.cmake); empty
// fields when the file is missing or unreadable.
void fill_libtorch_info(const fs::path& build, harness::RunInfo& info) {
  std::ifstream in(build / "tdc_build_info.json");
  if (!in) return;
  try {
    json j = json::parse(in);
    if (auto v = j.value("torch_version", std::string()); !v.empty()) info.libtorch_version = v;
    info.libtorch_cuda = j.value("torch_cuda", info.libtorch_cuda);
    info.nccl_version = j.value("nccl_version", info.nccl_version);
    info.compiler = j.value("compiler", info.compiler);
  } catch (const std::exception&) {
  }
}

// Asks the first test binary whether this run can work at all (backend known, plug-in loads,
// device present) before any test starts: one clear message and exit 2 instead of every test
// failing the same way.
void preflight(const std::vector<Binary>& binaries, const Options& o) {
  for (const Binary& b : binaries) {
    if (!fs::exists(b.path)) continue;
    std::vector<std::string> argv = {b.path.string(), "--tdc_preflight"};
    argv.insert(argv.end(), o.forwarded.begin(), o.forwarded.end());
    Captured c = capture(argv, true, 120);
    if (c.timed_out) throw UsageError(fmt::format("preflight: '{}' did not answer within 120 s", b.path.string()));
    std::string out = c.output;
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    if (WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0) return;
    if (out.rfind("tdc: ", 0) == 0) out = out.substr(5);
    bool said_why = WIFEXITED(c.status) && WEXITSTATUS(c.status) == 2;  // the harness's own answer
    throw UsageError(fmt::format("this run cannot start: {}{}", out,
                                 said_why ? "" : fmt::format(" ({} {})", b.name, describe_exit(c.status))));
  }
}

// The run's report next to its results (`tdc report DIR --out DIR`). A report that cannot be
// written is a warning: the results are what the run is for.
void write_run_report(const Options& o, const fs::path& json_path) {
  try {
    ReportInput in;
    in.generated_at = harness::iso_now();
    in.seed = read_seed_table(seed_table_path(resolve_source_dir(o.build)));
    in.runs.push_back(load_run(json_path, "run 1"));
    if (fs::path p = o.out / "parity.json"; fs::is_regular_file(p)) in.parity.push_back(read_parity(p));
    ReportFiles files = write_report(in, o.out);
    fmt::print("report:  {}\n         {}\n", files.html.string(), files.markdown.string());
  } catch (const std::exception& e) {
    fmt::print(stderr, "tdc run: warning: report not written: {}\n", e.what());
  }
}

// [Note: one verdict per test over repeats] With --repeat N every test ran N times. A test that
// ended the same way each time keeps that status (and the record of its first repeat); one that
// did not is FLAKY, whatever the mix, with the record of its first repeat that failed (or else
// its first) so the message shows a failure. Counts per status go to repeat_statuses.
std::vector<TestResult> merge_repeats(const std::vector<std::vector<TestResult>>& reps) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::pair<int, const TestResult*>>> seen;
  for (size_t k = 0; k < reps.size(); ++k)
    for (const TestResult& t : reps[k]) {
      if (!seen.count(t.id)) order.push_back(t.id);
      seen[t.id].push_back({static_cast<int>(k) + 1, &t});
    }
  std::vector<TestResult> out;
  for (const std::string& id : order) {
    const auto& runs = seen[id];
    std::map<std::string, int> counts;
    const std::pair<int, const TestResult*>* shown = &runs.front();
    for (const auto& run : runs) {
      ++counts[harness::to_string(run.second->status)];
      if (harness::is_failure(run.second->status) && !harness::is_failure(shown->second->status)) shown = &run;
    }
    TestResult merged = *shown->second;
    merged.repeat_statuses = counts;
    if (counts.size() > 1) {
      std::vector<std::string> parts;
      for (const auto& [status, n] : counts) parts.push_back(fmt::format("{} x{}", status, n));
      merged.status = Status::Flaky;
      merged.message =
          fmt::format("statuses over {} repeats: {}; repeat {} ended {}:\n{}", runs.size(), fmt::join(parts, ", "),
                      shown->first, harness::to_string(shown->second->status), shown->second->message);
    }
    out.push_back(std::move(merged));
  }
  return out;
}

// [Note: a run's steps] `tdc run` is a pipeline: select -> preflight -> prepare -> list -> run ->
// assemble -> write -> verdict. Each step below is one function; what flows between them is the
// Options, the binaries (with their listed tests), the records, and what the tests reported.

// What running the tests produced (step "run").
struct TestsRun {
  std::vector<TestResult> records;
  std::map<std::string, fs::path> log_of;  // test id -> the log that holds it
  std::vector<harness::RunInfo> reported;  // run_info of every binary results file
  bool interrupted = false;
};

// step "prepare": the output folders, without an earlier run's logs and raw results (they would
// be read as this run's: the report indexes every log there, and another --jobs names its shards
// differently).
void prepare_out_dir(const Options& o) {
  for (const char* sub : {"logs", "raw"}) {
    std::error_code ec;
    fs::create_directories(o.out / sub, ec);
    if (ec) throw UsageError(fmt::format("cannot create '{}': {}", (o.out / sub).string(), ec.message()));
    const std::string ext = std::string(sub) == "logs" ? ".log" : ".json";
    for (fs::directory_iterator it(o.out / sub, ec), end; !ec && it != end; it.increment(ec))
      if (it->is_regular_file() && it->path().extension() == ext) fs::remove(it->path(), ec);
  }
}

// step "list": each binary's tests (into b.tests). A binary that does not exist or cannot list
// its tests becomes a CRASH record, returned.
std::vector<TestResult> list_tests(std::vector<Binary>& binaries, const Options& o) {
  std::vector<TestResult> records;
  for (Binary& b : binaries) {
    if (!fs::exists(b.path)) {
      records.push_back(make_record(b.name, "(binary)", Status::Crash, 0,
                                    fmt::format("test binary '{}' (kind {}) from tdc_suites.json "
                                                "does not exist: build it (ninja -C {} {})",
                                                b.path.string(), b.kind, o.build.string(), b.name)));
      continue;
    }
    const fs::path cache = o.build / ".tdc-test-lists";  // [Note: test lists are cached]
    if (auto listed = cached_test_list(cache, b.path, o.filter)) {
      b.tests = parse_test_list(*listed);
      continue;
    }
    Captured c = capture({b.path.string(), "--gtest_list_tests", "--gtest_filter=" + o.filter}, true, 120);
    if (interrupted()) break;
    if (c.timed_out || !WIFEXITED(c.status) || WEXITSTATUS(c.status) != 0) {
      records.push_back(make_record(
          b.name, "(binary)", Status::Crash, 0,
          fmt::format("listing the tests of '{}' failed ({}):\n{}", b.path.string(),
                      c.timed_out ? "no answer within 120 s" : describe_exit(c.status),
                      c.output.size() > 4000 ? "..." + c.output.substr(c.output.size() - 4000) : c.output)));
      continue;
    }
    b.tests = parse_test_list(c.output);
    store_test_list(cache, b.path, o.filter, c.output);
  }
  return records;
}

// step "run": every repeat of the listed tests, as shards side by side ([Note: tests side by
// side]), merged back in listed order (and over repeats).
TestsRun run_tests(const Options& o, const std::vector<Binary>& binaries) {
  int total = 0;
  std::vector<std::vector<std::string>> lists;
  for (const Binary& b : binaries) {
    lists.push_back(b.tests);
    total += static_cast<int>(b.tests.size());
  }
  fmt::print(stderr, "tdc run: {} tests in {} binaries (filter '{}', backend {}, device {}, launcher {}) -> {}\n",
             total, binaries.size(), o.filter, o.backend, o.device, o.launcher, o.out.string());
  if (o.repeat > 1) fmt::print(stderr, "tdc run: every test {} times (--repeat)\n", o.repeat);
  const std::vector<Shard> plan =
      plan_shards(lists, o.jobs, previous_durations(o.durations.value_or(o.out / "results.json")), !o.suites.empty());
  if (o.jobs > 1)
    fmt::print(stderr, "tdc run: {} test processes, up to {} at once (--jobs {})\n", plan.size(), o.jobs, o.jobs);

  TestsRun run;
  run.interrupted = interrupted() != 0;
  Progress progress(total * o.repeat);
  std::vector<std::vector<TestResult>> repeats(static_cast<size_t>(o.repeat));
  for (int rep = 0; rep < o.repeat && !run.interrupted; ++rep) {
    std::vector<ShardOutcome> outcomes = run_shards(o, progress, binaries, plan, rep, run.interrupted);
    for (const ShardOutcome& r : outcomes)
      if (r.outcome.results) run.reported.push_back(r.outcome.results->run_info);
    repeats[static_cast<size_t>(rep)] = merge_shards(binaries, outcomes, run.log_of);
  }
  run.records = o.repeat == 1 ? std::move(repeats[0]) : merge_repeats(repeats);
  progress.finish();
  if (run.interrupted) fmt::print(stderr, "tdc run: interrupted; writing the results so far\n");
  return run;
}

// [Note: run_info from the CLI] The run's backend, device and launcher are what the CLI asked
// for; a binary that reports others is named in a warning (it ignored a flag), not believed.
// What only the binaries know (the implementation they loaded, LibTorch as they saw it, the
// largest world) comes from their results, the first that says.
harness::RunInfo run_info_of(const Options& o, const std::vector<harness::RunInfo>& reported,
                             const std::string& revision) {
  harness::RunInfo info;
  info.backend = o.backend;
  info.device = o.device;
  info.launcher = o.launcher;
  if (o.implementation) info.implementation = *o.implementation;
  bool named = false;
  for (const harness::RunInfo& ri : reported) {
    for (auto [field, ours, theirs] :
         {std::tuple{"backend", info.backend, ri.backend}, std::tuple{"device", info.device, ri.device},
          std::tuple{"launcher", info.launcher, ri.launcher}})
      if (!theirs.empty() && theirs != ours)
        fmt::print(stderr, "tdc run: warning: a test binary reports {} '{}' where this run asked for '{}'\n", field,
                   theirs, ours);
    if (!named && !ri.implementation_version.empty()) {
      info.implementation = ri.implementation;
      info.implementation_version = ri.implementation_version;
      info.implementation_library = ri.implementation_library;
      named = true;
    }
    if (info.libtorch_version.empty()) info.libtorch_version = ri.libtorch_version;
    if (info.libtorch_cuda.empty()) info.libtorch_cuda = ri.libtorch_cuda;
    if (info.nccl_version.empty()) info.nccl_version = ri.nccl_version;
    if (info.compiler.empty()) info.compiler = ri.compiler;
    info.world_size = std::max(info.world_size, ri.world_size);
  }
  fill_libtorch_info(o.build, info);
  info.suite_revision = revision;
  info.tdc_version = TDC_VERSION;
  info.host = harness::hostname();
  return info;
}

// step "assemble": the records under the run's expectations, with the run_info and the union of
// the tests' reports.
RunResults assemble(const Options& o, std::vector<TestResult> records, const TestsRun& run,
                    const std::string& revision) {
  RunResults merged;
  merged.run_info = run_info_of(o, run.reported, revision);
  harness::Expectations expectations;
  if (o.expectations) expectations = harness::read_expectations(*o.expectations);
  for (auto& t : records) {
    harness::apply_expectations(t, expectations);  // idempotent: binaries applied them already
    merged.run_info.world_size = std::max(merged.run_info.world_size, t.world_size);
  }
  merged.tests = std::move(records);
  for (const TestResult& t : merged.tests) harness::merge_reports(merged.reports, t.reports);
  return merged;
}

// step "write": results.json, junit.xml, the summary and failures on the console, the report
// (on rank 0 only under an external launcher: [Note: rank 0 writes the run]).
void write_outputs(const Options& o, const RunResults& merged, const TestsRun& run) {
  if (o.external_rank > 0) {
    fmt::print(
        "tdc run: rank {} of an external launcher: rank 0 writes every rank's results to {}; this rank's "
        "logs are in {}\n",
        o.external_rank, o.out.parent_path().parent_path().string(), (o.out / "logs").string());
    return;
  }
  const fs::path json_path = o.out / "results.json", xml_path = o.out / "junit.xml";
  harness::write_results_json(merged, json_path);
  harness::write_junit_xml(merged, xml_path);
  print_summary(merged, merged.run_info.duration_s);
  print_failures(merged, run.log_of);
  fmt::print("\nresults: {}\njunit:   {}\nlogs:    {}\n", json_path.string(), xml_path.string(),
             (o.out / "logs").string());
  if (!o.no_report) write_run_report(o, json_path);
}

// step "verdict": the exit status (kExit* in cli.h), after --check re-read the files.
int verdict(const Options& o, const RunResults& merged, const TestsRun& run, size_t binaries) {
  int code = merged.ok() ? kExitOk : kExitFailed;
  if (merged.tests.empty()) {
    fmt::print(stderr, "tdc run: no tests matched --filter '{}' in the {} binaries\n", o.filter, binaries);
    code = kExitFailed;
  }
  if (o.check && o.external_rank == 0) {
    if (auto err = check_outputs(o.out / "results.json", o.out / "junit.xml")) {
      fmt::print(stderr, "tdc run: check failed: {}\n", *err);
      code = kExitFailed;
    } else {
      fmt::print("check:   results.json ({} tests) and junit.xml re-read and valid\n", merged.tests.size());
    }
  }
  return run.interrupted ? kExitInterrupted : code;
}

// CPU seconds, user and system, of this process and of every child it has reaped: the children's
// include their own reaped children (a test binary's ranks), so after the run this is what `time`
// reports for it.
struct CpuSeconds {
  double user = 0, system = 0;
};
CpuSeconds cpu_seconds() {
  CpuSeconds c;
  for (int who : {RUSAGE_SELF, RUSAGE_CHILDREN}) {
    rusage r{};
    ::getrusage(who, &r);
    c.user += static_cast<double>(r.ru_utime.tv_sec) + static_cast<double>(r.ru_utime.tv_usec) * 1e-6;
    c.system += static_cast<double>(r.ru_stime.tv_sec) + static_cast<double>(r.ru_stime.tv_usec) * 1e-6;
  }
  return c;
}

}  // namespace

// [Note: a run's steps]
int run_command(const std::vector<std::string>& args) {
  ParsedArgs a = parse_args("run", kRunOptions, args, false);
  if (a.help) {
    fmt::print("{}{}", kRunUsage, format_options(kRunOptions));
    return kExitOk;
  }
  const Options o = parse_options(a);
  const std::string started_at = harness::iso_now();
  const auto t0 = std::chrono::steady_clock::now();
  const CpuSeconds cpu0 = cpu_seconds();

  std::vector<Binary> binaries = select_binaries(o);
  if (o.impl) {
    ImplementationDescriptor d = use_implementation(*o.impl, o.out / "impl");
    fmt::print(stderr, "tdc run: implementation {} {} from {} ({} features)\n", d.name, d.version, o.impl->string(),
               d.features.size());
  }
  preflight(binaries, o);
  const std::string revision = git_revision(resolve_source_dir(o.build));
  ::setenv("TDC_SUITE_REVISION", revision.c_str(), 1);  // the binaries put it in their run_info too
  prepare_out_dir(o);
  std::vector<TestResult> records = list_tests(binaries, o);
  TestsRun run = run_tests(o, binaries);
  for (TestResult& t : run.records) records.push_back(std::move(t));
  RunResults merged = assemble(o, std::move(records), run, revision);
  merged.run_info.started_at = started_at;
  merged.run_info.duration_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const CpuSeconds cpu1 = cpu_seconds();
  merged.run_info.user_s = cpu1.user - cpu0.user;
  merged.run_info.system_s = cpu1.system - cpu0.system;
  write_outputs(o, merged, run);
  return verdict(o, merged, run, binaries.size());
}

}  // namespace tdc::cli
