// tdc compat: the LibTorch version × suite matrix (docs/compat.md). For each release it runs the
// bootstrap (`SOURCE/tdc` with TDC_TORCH=V: that release's venv and build dir, side by side), then
// the suites, and writes OUT/compat.json, OUT/compat.md, a report with a column per release, and,
// with --doc, the matrix into a Markdown file between its markers.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "process.h"
#include "report/parity.h"
#include "report/report.h"
#include "report/seed_table.h"

namespace tdc::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The releases tdc is built and tested against; ./tdc's SUPPORTED_TORCH says the same.
const std::vector<std::string> kSupportedTorch = {"2.11.0", "2.12.1", "2.13.0", "2.14.1"};
const std::string kDefaultTorch = "2.13.0";
// The suites of one cell each, in the order they run. unit: the project's CTest tests but the
// other cells' (what `./tdc test` runs: unit binaries, goldens, CLI, examples, benchmark smokes,
// the seed suite and parity under ATEN_CPU_CAPABILITY=default); interop: the CTest tests that
// hand checkpoints and pipelines to PyTorch; seed: `tdc run`, the 102 seed tests (CTest's
// tdc_conformance); parity: `tdc parity` (CTest's tdc_parity). The four cells together are
// `./tdc test`.
const std::vector<std::string> kSuites = {"build", "unit", "interop", "seed", "parity"};
const std::vector<std::string> kInteropTests = {"tdc_checkpoint_interop_test", "tdc_pipelining_parity_test"};
const std::vector<std::string> kOtherCellsTests = {"tdc_checkpoint_interop_test", "tdc_pipelining_parity_test",
                                                   "tdc_conformance", "tdc_parity"};

const std::vector<OptionSpec> kCompatOptions = {
    {"torch", "V,V", "LibTorch releases (default every supported one: 2.11.0,2.12.1,2.13.0,2.14.1)"},
    {"suites", "A,B", "cells to run, of build,unit,interop,seed,parity (default all; build always runs)"},
    {"out", "DIR", "where each release's runs, compat.json, compat.md and report.html go (default results/compat)"},
    {"doc", "FILE", "also write the matrix into FILE between its tdc-compat markers (docs/compat.md)"},
};

constexpr const char* kCompatUsage =
    "usage: tdc compat [--torch V,V] [--suites A,B] [--out DIR] [--doc FILE]\n\n"
    "Builds tdc against each LibTorch release (./tdc with TDC_TORCH=V: a venv and a build dir per\n"
    "release, side by side) and runs the unit suites, the interop tests, the seed suite and tdc\n"
    "parity, each with that release's PyTorch as the oracle. Writes OUT/compat.json, OUT/compat.md\n"
    "(the release x suite matrix), OUT/report.html (a column per release) and OUT/<V>/ (each run's\n"
    "results and logs). A release's first build installs its wheel (CUDA builds: several GB) and\n"
    "compiles tdc (about 30 min on 2 cores). Exit status: 0 when every cell passed, 1 otherwise.\n\n"
    "Options:\n";

constexpr const char* kDocBegin = "<!-- tdc-compat: begin (written by `tdc compat --doc`) -->";
constexpr const char* kDocEnd = "<!-- tdc-compat: end -->";

struct Cell {
  std::string status = "NOT_RUN";  // PASS, FAIL, NOT_RUN
  std::string detail;              // "66 PASS, 2 SKIP", "exit status 1", why not run
  double seconds = 0;
  std::string log;       // relative to OUT
  std::string revision;  // of the source tree it ran on: `git describe --always --dirty`
  std::string finished;  // ISO time
};

struct Row {
  std::string torch;
  std::string libtorch;  // what the build says: "2.11.0 (CUDA 13.0, NCCL 2.28.9; GNU 12.2.0)"
  std::map<std::string, Cell> cells;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Runs SOURCE/tdc ARGS for release `torch` with the log in `log`; the wait status.
int run_bootstrap(const fs::path& source, const std::string& torch, const std::vector<std::string>& args,
                  const fs::path& log) {
  // The bootstrap picks venv, build dir and oracle from TDC_TORCH alone: nothing of the calling
  // run's choice may leak into another release's.
  ::setenv("TDC_TORCH", torch.c_str(), 1);
  for (const char* v : {"TDC_TORCH_PREFIX", "TDC_BUILD_DIR", "TDC_BUILD", "TDC_PYTHON", "TDC_VENV"}) ::unsetenv(v);
  fs::create_directories(log.parent_path());
  int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(fmt::format("compat: cannot write '{}'", log.string()));
  SpawnOptions o;
  o.argv = {(source / "tdc").string()};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.stdout_fd = fd;
  o.stderr_fd = fd;
  Child child = Child::spawn(o);
  ::close(fd);
  return child.wait();
}

// "66 PASS, 2 SKIP"; PASS unless a test has a failure status or none ran.
void judge_results(const fs::path& results, int wait_status, Cell& cell) {
  if (!fs::exists(results)) {
    cell.status = "FAIL";
    cell.detail = fmt::format("no results.json ({})", describe_exit(wait_status));
    return;
  }
  harness::RunResults r = harness::read_results(results);
  std::vector<std::string> parts;
  bool failed = r.tests.empty();
  for (auto [status, n] : r.counts()) {
    if (!n) continue;
    parts.push_back(fmt::format("{} {}", n, harness::to_string(status)));
    if (harness::is_failure(status)) failed = true;
  }
  cell.status = failed || exit_code(wait_status) != 0 ? "FAIL" : "PASS";
  cell.detail = parts.empty() ? "no tests" : fmt::format("{}", fmt::join(parts, ", "));
}

// CTest's closing line, "100% tests passed, 0 tests failed out of 63": PASS when it says no test
// failed and ctest exited 0.
void judge_ctest(const fs::path& log, int wait_status, Cell& cell) {
  std::ifstream in(log);
  std::string line, summary;
  while (std::getline(in, line))
    if (line.find("tests passed,") != std::string::npos && line.find("out of") != std::string::npos) summary = line;
  int failed = -1, total = -1;
  if (auto p = summary.find("tests passed, "); p != std::string::npos)
    std::sscanf(summary.c_str() + p, "tests passed, %d tests failed out of %d", &failed, &total);
  cell.status = exit_code(wait_status) == 0 && failed == 0 && total > 0 ? "PASS" : "FAIL";
  cell.detail = total > 0 ? fmt::format("{}/{} CTest tests", total - failed, total) : describe_exit(wait_status);
}

// "c4025a2" or "c4025a2-dirty"; "unknown" outside a git checkout.
std::string source_revision(const fs::path& source) {
  const Captured c = capture({"git", "-C", source.string(), "describe", "--always", "--dirty"}, false, 30);
  std::string r = c.output;
  while (!r.empty() && std::isspace(static_cast<unsigned char>(r.back()))) r.pop_back();
  return exit_code(c.status) == 0 && !r.empty() ? r : "unknown";
}

fs::path build_dir_of(const fs::path& source, const std::string& torch) {
  return torch == kDefaultTorch ? source / "build" : source / ("build-" + torch);
}

std::string libtorch_of(const fs::path& build) {
  std::ifstream in(build / "tdc_build_info.json");
  if (!in) return "";
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded()) return "";
  std::string label = j.value("torch_version", "?");
  std::vector<std::string> parts;
  if (auto c = j.value("torch_cuda", ""); !c.empty()) parts.push_back("CUDA " + c);
  if (auto n = j.value("nccl_version", ""); !n.empty()) parts.push_back("NCCL " + n);
  if (!parts.empty()) label += fmt::format(" ({})", fmt::join(parts, ", "));
  if (auto c = j.value("compiler", ""); !c.empty()) label += "; " + c;
  return label;
}

void run_cell(const fs::path& source, const fs::path& out, Row& row, const std::string& suite) {
  Cell& cell = row.cells[suite];
  const fs::path dir = out / row.torch;
  const fs::path build = build_dir_of(source, row.torch);
  cell.log = fs::path(row.torch) / (suite + ".log");
  fmt::print(stderr, "tdc compat: torch {}: {} ...\n", row.torch, suite);
  cell.revision = source_revision(source);  // what the cell builds and runs (at its start)
  auto t0 = std::chrono::steady_clock::now();
  int status = 0;
  if (suite == "build") {
    status = run_bootstrap(source, row.torch, {"build"}, out / cell.log);
    cell.status = exit_code(status) == 0 ? "PASS" : "FAIL";
    cell.detail = exit_code(status) == 0 ? "configured and built" : describe_exit(status) + ": see the log";
    row.libtorch = libtorch_of(build);
  } else if (suite == "unit" || suite == "interop") {
    // Through CTest, as `./tdc test` runs them: it also makes the goldens some unit suites need.
    // unit leaves out what the other cells run (interop, the seed suite, parity).
    // (One -R or -E each: CTest keeps only the last of several.)
    auto any_of = [](const std::vector<std::string>& names) { return fmt::format("^({})$", fmt::join(names, "|")); };
    std::vector<std::string> args = {"test"};
    if (suite == "interop")
      args.insert(args.end(), {"-R", any_of(kInteropTests)});
    else
      args.insert(args.end(), {"-E", any_of(kOtherCellsTests)});
    status = run_bootstrap(source, row.torch, args, out / cell.log);
    judge_ctest(out / cell.log, status, cell);
  } else if (suite == "seed") {
    const fs::path results = dir / "seed";
    fs::remove_all(results);
    status = run_bootstrap(source, row.torch,
                           {"run", "--kind", "conformance", "--out", results.string(), "--no-report"}, out / cell.log);
    judge_results(results / "results.json", status, cell);
  } else if (suite == "parity") {
    fs::path results = dir / "parity";
    status = run_bootstrap(source, row.torch, {"parity", "--out", results.string()}, out / cell.log);
    std::ifstream in(results / "parity.json");
    json j = in ? json::parse(in, nullptr, false) : json();
    int pass = 0, not_supported = 0, total = 0;
    if (j.is_object() && j.contains("scenarios") && j["scenarios"].is_array())
      for (const auto& s : j["scenarios"]) {
        ++total;
        if (s.value("verdict", "") == "PASS") ++pass;
        if (s.value("verdict", "") == "NOT_SUPPORTED") ++not_supported;
      }
    cell.status = exit_code(status) == 0 && pass > 0 && pass + not_supported == total ? "PASS" : "FAIL";
    cell.detail = total ? fmt::format("{}/{} scenarios{}", pass, total,
                                      not_supported ? fmt::format(", {} NOT_SUPPORTED", not_supported) : "")
                        : describe_exit(status);
  }
  cell.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  cell.finished = harness::iso_now();
  fmt::print(stderr, "tdc compat: torch {}: {} {} ({}; {})\n", row.torch, suite, cell.status, cell.detail,
             format_duration(cell.seconds));
}

std::string render_matrix(const std::vector<Row>& rows) {
  std::string out = "| LibTorch | " + fmt::format("{}", fmt::join(kSuites, " | ")) + " | tdc revision |\n|---|";
  for (size_t i = 0; i <= kSuites.size(); ++i) out += "---|";
  out += "\n";
  for (const Row& r : rows) {
    out += fmt::format("| {} |", r.libtorch.empty() ? r.torch : r.libtorch);
    std::set<std::string> revisions;  // of the cells that ran
    for (const auto& [s, c] : r.cells)
      if (!c.revision.empty()) revisions.insert(c.revision);
    for (const auto& s : kSuites) {
      auto it = r.cells.find(s);
      if (it == r.cells.end()) {
        out += " — |";
        continue;
      }
      const Cell& c = it->second;
      out += fmt::format(" {} {}{} |",
                         c.status == "PASS"   ? "✅"
                         : c.status == "FAIL" ? "❌"
                                              : "⏸",
                         c.status, c.detail.empty() ? "" : " (" + c.detail + ")");
    }
    out += fmt::format(" {} |\n", revisions.empty() ? "—" : fmt::format("{}", fmt::join(revisions, ", ")));
  }
  return out;
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream f(p);
  f << text;
  if (!f) throw std::runtime_error(fmt::format("compat: cannot write '{}'", p.string()));
}

// Replaces what lies between the markers; the file must have them (nothing else is touched).
// With `block` nullopt, only checks that it could.
void write_doc(const fs::path& doc, const std::optional<std::string>& block) {
  std::ifstream in(doc);
  if (!in) throw UsageError(fmt::format("compat: --doc '{}' cannot be read", doc.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  size_t b = text.find(kDocBegin), e = text.find(kDocEnd);
  if (b == std::string::npos || e == std::string::npos || e < b)
    throw UsageError(
        fmt::format("compat: --doc '{}' lacks the markers '{}' ... '{}'", doc.string(), kDocBegin, kDocEnd));
  b += std::string(kDocBegin).size();
  if (block) write_file(doc, text.substr(0, b) + "\n" + *block + text.substr(e));
}

json to_json(const std::vector<Row>& rows) {
  json j = json::array();
  for (const Row& r : rows) {
    json cells = json::object();
    for (const auto& [s, c] : r.cells)
      cells[s] = {{"status", c.status}, {"detail", c.detail},     {"seconds", c.seconds},
                  {"log", c.log},       {"revision", c.revision}, {"finished", c.finished}};
    j.push_back({{"torch", r.torch}, {"libtorch", r.libtorch}, {"cells", cells}});
  }
  return j;
}

// [Note: compat rows accumulate] OUT/compat.json keeps every cell that ran into OUT, each with
// the revision it ran on: `tdc compat --torch 2.14.1 --suites unit` re-runs one cell and keeps the
// rest, and releases run one at a time (or on two machines' worth of evenings) add up to one
// matrix. A fresh matrix is a fresh --out. Two runs into one OUT at once (other releases each)
// merge under a lock at every write; one release in two runs at once: the last write wins.
std::vector<Row> read_previous(const fs::path& file) {
  std::vector<Row> rows;
  if (!fs::exists(file)) return rows;
  std::ifstream in(file);
  json j = json::parse(in, nullptr, false);
  auto bad = [&](const std::string& what) {
    return UsageError(fmt::format("compat: '{}' is not a compat matrix ({}): move it away or choose another --out",
                                  file.string(), what));
  };
  if (!j.is_array()) throw bad("not a JSON array");
  for (const auto& r : j) {
    if (!r.is_object() || !r.contains("torch") || !r["torch"].is_string() || !r.contains("cells") ||
        !r["cells"].is_object())
      throw bad("a row lacks 'torch' or 'cells'");
    Row row;
    row.torch = r["torch"].get<std::string>();
    if (!contains(kSupportedTorch, row.torch)) throw bad(fmt::format("row '{}' is not a supported release", row.torch));
    row.libtorch = r.value("libtorch", "");
    for (const auto& [name, c] : r["cells"].items()) {
      if (!contains(kSuites, name) || !c.is_object()) throw bad(fmt::format("row '{}': cell '{}'", row.torch, name));
      Cell cell;
      cell.status = c.value("status", "NOT_RUN");
      cell.detail = c.value("detail", "");
      cell.seconds = c.value("seconds", 0.0);
      cell.log = c.value("log", "");
      cell.revision = c.value("revision", "");
      cell.finished = c.value("finished", "");
      row.cells[name] = cell;
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

// What `tdc compat`'s flags ask for.
struct CompatRun {
  std::vector<std::string> torches, suites;
  fs::path source, out;
  std::optional<fs::path> doc;
};

CompatRun parse_compat_run(const ParsedArgs& a) {
  CompatRun r;
  r.torches = a.get("torch") ? split_list(*a.get("torch")) : kSupportedTorch;
  for (const auto& t : r.torches)
    if (!contains(kSupportedTorch, t))
      throw UsageError(fmt::format("compat: --torch names '{}', not a supported release (supported: {})", t,
                                   fmt::join(kSupportedTorch, ", ")));
  if (r.torches.empty()) throw UsageError("compat: --torch names no release");
  r.suites = a.get("suites") ? split_list(*a.get("suites")) : kSuites;
  for (const auto& s : r.suites)
    if (!contains(kSuites, s))
      throw UsageError(fmt::format("compat: --suites names '{}' (known: {})", s, fmt::join(kSuites, ", ")));
  if (!contains(r.suites, "build")) r.suites.insert(r.suites.begin(), "build");
  const char* root = std::getenv("TDC_ROOT");
  r.source = root && *root ? fs::path(root) : fs::path();
  if (r.source.empty() || !fs::exists(r.source / "tdc"))
    throw UsageError("compat: cannot find the source tree's ./tdc (run it as ./tdc compat, which sets TDC_ROOT)");
  r.out = fs::absolute(a.get("out") ? fs::path(*a.get("out")) : fs::path("results") / "compat");
  if (auto d = a.get("doc")) r.doc = fs::absolute(*d);
  return r;
}

// Writes this run's rows into OUT/compat.json as it is now (another `tdc compat` into the same
// OUT may have added other releases meanwhile), under a lock; returns every row, in release order.
std::vector<Row> save_rows(const CompatRun& r, const std::map<std::string, Row>& by_torch) {
  const fs::path lock = r.out / ".compat.lock";
  const int fd = ::open(lock.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  const std::unique_ptr<const int, void (*)(const int*)> closer(&fd, [](const int* f) {
    if (*f >= 0) ::close(*f);  // (releases the lock)
  });
  if (fd < 0 || ::flock(fd, LOCK_EX) != 0)
    throw std::runtime_error(fmt::format("compat: cannot lock '{}'", lock.string()));
  std::map<std::string, Row> now;
  for (Row& row : read_previous(r.out / "compat.json")) now[row.torch] = std::move(row);
  for (const auto& t : r.torches)
    if (auto it = by_torch.find(t); it != by_torch.end()) now[t] = it->second;
  std::vector<Row> rows;
  for (const auto& t : kSupportedTorch)
    if (auto it = now.find(t); it != now.end()) rows.push_back(it->second);
  write_file(r.out / "compat.json", to_json(rows).dump(2) + "\n");
  return rows;
}

// The seed runs side by side: the report's matrix gets a column per release.
void write_compat_report(const CompatRun& r, const std::vector<Row>& rows) {
  ReportInput in;
  for (const Row& row : rows)
    if (fs::exists(r.out / row.torch / "seed" / "results.json"))
      in.runs.push_back(load_run(r.out / row.torch / "seed", "torch " + row.torch));
  if (in.runs.empty()) return;
  in.generated_at = harness::iso_now();
  if (fs::exists(seed_table_path(r.source))) in.seed = read_seed_table(seed_table_path(r.source));
  for (const Row& row : rows)
    if (fs::path p = r.out / row.torch / "parity" / "parity.json"; fs::is_regular_file(p))
      in.parity.push_back(read_parity(p));
  write_report(in, r.out);
}

}  // namespace

int compat_command(const std::vector<std::string>& args) {
  ParsedArgs a = parse_args("compat", kCompatOptions, args, false);
  if (a.help) {
    fmt::print("{}{}", kCompatUsage, format_options(kCompatOptions));
    return kExitOk;
  }
  const CompatRun r = parse_compat_run(a);
  fs::create_directories(r.out);
  if (r.doc) write_doc(*r.doc, std::nullopt);  // checks the markers before hours of builds
  // [Note: compat rows accumulate]
  std::map<std::string, Row> by_torch;
  for (Row& row : read_previous(r.out / "compat.json")) by_torch[row.torch] = std::move(row);
  for (const auto& t : r.torches) {
    Row& row = by_torch[t];
    row.torch = t;
    for (const auto& s : kSuites) {
      if (!contains(r.suites, s)) continue;
      if (s != "build" && row.cells["build"].status != "PASS") {
        row.cells[s] = Cell{.detail = "the build failed"};
        continue;
      }
      run_cell(r.source, r.out, row, s);
      if (interrupted()) return kExitInterrupted;
      save_rows(r, by_torch);  // each cell as it ends
    }
  }
  const std::vector<Row> rows = save_rows(r, by_torch);
  bool all_pass = true;  // of the cells this run ran
  for (const auto& t : r.torches)
    for (const auto& s : r.suites)
      if (by_torch[t].cells[s].status != "PASS") all_pass = false;
  const std::string matrix = render_matrix(rows);
  write_file(r.out / "compat.md", "# tdc compat\n\n" + matrix);
  if (r.doc) write_doc(*r.doc, matrix);
  write_compat_report(r, rows);
  fmt::print("{}\ntdc compat: {} (OUT: {})\n", matrix, all_pass ? "every cell passed" : "some cells did not pass",
             r.out.string());
  return all_pass ? kExitOk : kExitFailed;
}

}  // namespace tdc::cli
