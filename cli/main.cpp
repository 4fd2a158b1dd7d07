// tdc-cli: the command behind ./tdc. Dispatches to run / test / bench; shared helpers live here.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli.h"
#include "process.h"

#ifndef TDC_VERSION
#define TDC_VERSION "unknown"
#endif

namespace tdc::cli {

namespace fs = std::filesystem;

// ------------------------------------------------------------------ options

std::optional<std::string> ParsedArgs::get(const std::string& name) const {
  auto it = values.find(name);
  if (it == values.end()) return std::nullopt;
  return it->second;
}

ParsedArgs parse_args(const std::string& command, const std::vector<OptionSpec>& specs,
                      const std::vector<std::string>& args, bool allow_positional) {
  ParsedArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      out.help = true;
      continue;
    }
    if (a.rfind("--", 0) != 0 || a == "--") {
      if (!allow_positional || (a.size() > 1 && a[0] == '-' && a != "--"))
        throw UsageError(a.size() > 1 && a[0] == '-'
                             ? fmt::format("{}: unknown option '{}' (see 'tdc {} --help')", command, a, command)
                             : fmt::format("{}: unexpected argument '{}' (see 'tdc {} --help')", command, a, command));
      out.positional.push_back(a);
      continue;
    }
    std::string name = a.substr(2);
    std::optional<std::string> inline_value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const OptionSpec* spec = nullptr;
    for (const auto& s : specs)
      if (name == s.name) spec = &s;
    if (!spec) throw UsageError(fmt::format("{}: unknown option '--{}' (see 'tdc {} --help')", command, name, command));
    if (!spec->metavar) {
      if (inline_value)
        throw UsageError(fmt::format("{}: option '--{}' takes no value (got '{}')", command, name, *inline_value));
      out.values[name] = "";
    } else if (inline_value) {
      out.values[name] = *inline_value;
    } else {
      if (i + 1 >= args.size())
        throw UsageError(fmt::format("{}: option '--{}' needs a value ({})", command, name, spec->metavar));
      out.values[name] = args[++i];
    }
  }
  return out;
}

std::string format_options(const std::vector<OptionSpec>& specs) {
  std::string out;
  for (const auto& s : specs) {
    std::string left = fmt::format("--{}{}{}", s.name, s.metavar ? " " : "", s.metavar ? s.metavar : "");
    out += fmt::format("  {:<32} {}\n", left, s.help);
  }
  out += fmt::format("  {:<32} {}\n", "-h, --help", "show this help");
  return out;
}

double parse_seconds(const std::string& command, const std::string& option, const std::string& value) {
  char* end = nullptr;
  double v = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || !(v > 0))
    throw UsageError(fmt::format("{}: --{} must be a positive number of seconds, got '{}'", command, option, value));
  return v;
}

int parse_positive_int(const std::string& command, const std::string& option, const std::string& value) {
  char* end = nullptr;
  long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || v <= 0 || v > 1000000)
    throw UsageError(fmt::format("{}: --{} must be a positive integer, got '{}'", command, option, value));
  return static_cast<int>(v);
}

// ------------------------------------------------------------------ locations

fs::path resolve_build_dir(const std::optional<std::string>& flag) {
  auto check = [](const fs::path& dir, const std::string& source) {
    if (!fs::is_regular_file(dir / "tdc_suites.json"))
      throw UsageError(
          fmt::format("build directory '{}' (from {}) has no tdc_suites.json: configure and build it first "
                      "(./tdc build)",
                      dir.string(), source));
    return fs::absolute(dir).lexically_normal();
  };
  if (flag) return check(*flag, "--build-dir");
  if (const char* env = std::getenv("TDC_BUILD"); env && *env) return check(env, "$TDC_BUILD");
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && fs::is_regular_file(self.parent_path() / "tdc_suites.json")) return self.parent_path();
  throw UsageError("no build directory: pass --build-dir DIR or set TDC_BUILD (./tdc sets it for you)");
}

fs::path resolve_source_dir(const fs::path& build_dir) {
  if (const char* env = std::getenv("TDC_ROOT"); env && *env) return env;
  std::ifstream cache(build_dir / "CMakeCache.txt");
  std::string line;
  const std::string key = "tdc_SOURCE_DIR:STATIC=";
  while (std::getline(cache, line))
    if (line.rfind(key, 0) == 0) return line.substr(key.size());
  return {};
}

fs::path resolve_oracle_python(const std::optional<std::string>& flag, const fs::path& build_dir,
                               const fs::path& source_dir) {
  if (flag) return *flag;
  if (const char* env = std::getenv("TDC_PYTHON"); env && *env) return env;
  std::ifstream cache(build_dir / "CMakeCache.txt");
  std::string line;
  const std::string key = "TDC_PYTHON:FILEPATH=";
  while (std::getline(cache, line))
    if (line.rfind(key, 0) == 0 && line.size() > key.size()) return line.substr(key.size());
  return source_dir.empty() ? fs::path() : source_dir / ".venv" / "bin" / "python";
}

// ------------------------------------------------------------------ text helpers

std::string file_tail(const fs::path& p, int lines) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return "";
  std::deque<std::string> last;
  std::string line;
  while (std::getline(in, line)) {
    last.push_back(std::move(line));
    if (static_cast<int>(last.size()) > lines) last.pop_front();
  }
  std::string out;
  for (const auto& l : last) out += l + "\n";
  return out;
}

std::string indent(const std::string& text, const std::string& prefix) {
  std::string out;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    size_t end = nl == std::string::npos ? text.size() : nl;
    out += prefix + text.substr(start, end - start) + "\n";
    start = end + 1;
  }
  return out;
}

std::string format_duration(double s) {
  if (s < 60) return fmt::format("{:.2f} s", s);
  long t = static_cast<long>(s);
  if (t < 3600) return fmt::format("{}:{:02}", t / 60, t % 60);
  return fmt::format("{}:{:02}:{:02}", t / 3600, (t / 60) % 60, t % 60);
}

// ------------------------------------------------------------------ test (ctest)

int test_command(const std::vector<std::string>& args) {
  static const std::vector<OptionSpec> kOptions = {
      {"build-dir", "DIR", "build directory (default $TDC_BUILD)"},
  };
  // Everything but --build-dir and --help goes to ctest untouched.
  std::vector<std::string> ours, passthrough;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--help" || args[i] == "-h" || args[i].rfind("--build-dir=", 0) == 0) {
      ours.push_back(args[i]);
    } else if (args[i] == "--build-dir") {
      ours.push_back(args[i]);
      if (i + 1 < args.size()) ours.push_back(args[++i]);
    } else {
      passthrough.push_back(args[i]);
    }
  }
  ParsedArgs a = parse_args("test", kOptions, ours, false);
  if (a.help) {
    fmt::print(
        "usage: tdc test [--build-dir DIR] [ctest arguments...]\n\n"
        "Runs the project's own tests: ctest --test-dir BUILD --output-on-failure -j2 [ctest "
        "arguments].\nExamples: tdc test -R comm   tdc test -j1 --repeat until-fail:3\n\n"
        "Options:\n{}",
        format_options(kOptions));
    return kExitOk;
  }
  fs::path build = resolve_build_dir(a.get("build-dir"));
  std::vector<std::string> argv = {"ctest", "--test-dir", build.string(), "--output-on-failure", "-j2"};
  argv.insert(argv.end(), passthrough.begin(), passthrough.end());
  fmt::print(stderr, "tdc test: {}\n", fmt::join(argv, " "));
  auto t0 = std::chrono::steady_clock::now();
  SpawnOptions o;
  o.argv = argv;
  Child child = Child::spawn(o);
  int status = child.wait();
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int code = exit_code(status);
  fmt::print(stderr, "tdc test: ctest finished in {} ({})\n", format_duration(elapsed),
             code == 0 ? "all passed" : describe_exit(status));
  if (interrupted()) return kExitInterrupted;
  return code;
}

}  // namespace tdc::cli

namespace {

constexpr const char* kUsage = R"(usage: tdc <command> [options]

Commands:
  run      run the conformance suite (or the unit suites) and write results/results.json,
           results/junit.xml and per-binary logs; live progress, summary, exit 1 on failures;
           --repeat N finds flaky tests; also writes report.html and report.md there
  report   'tdc report RUN... --out DIR': one HTML page (matrix, diff, flaky, parity curves)
           and Markdown from one or more runs
  test     the project's own tests (ctest): what CI runs
  bench    benchmarks: 'tdc bench harness --out FILE' times the harness launchers,
           'tdc bench ddp --out FILE' compares DDP and single-process step times,
           'tdc bench fsdp --out FILE' compares tdc's FSDP2 with PyTorch's fully_shard (+ plot),
           'tdc bench checkpoint --out FILE' checkpoint save/load MB/s: tdc, PyTorch's DCP, dd (+ plot),
           'tdc bench pipelining --out FILE' pipeline step time per schedule: tdc vs PyTorch (+ plot),
           'tdc bench kernel --out FILE' the kernel's price of a system call, a thread hand-off and
           a loopback TCP message on this machine
  parity   numeric parity with real PyTorch: every scenario of fixtures/scenarios trains in
           tdc and in PyTorch 2.13 from the same weights and data; per-scenario verdicts in
           OUT/parity.json, a table, exit 1 unless all pass
  mutate   the mutation score: each mutant of conformance/mutants.json (a realistic bug in
           libtdc) built as an alternative implementation and run through the suite; killed
           or survived per mutant, OUT/mutation.json and OUT/mutation.md
  compat   the LibTorch version x suite matrix: 'tdc compat --torch 2.11.0,2.14.1' builds tdc
           against each release (TDC_TORCH=V: its own venv and build dir) and runs the unit,
           interop, seed and parity suites with that release as the oracle; OUT/compat.md,
           OUT/report.html (a column per release), --doc docs/compat.md
  help     'tdc help COMMAND' shows a command's options
  build    (the ./tdc script) install what is missing and build; run nothing

Which LibTorch (the ./tdc script; docs/compat.md):
  default                  torch 2.13.0's CPU wheel (.venv, build/)
  TDC_TORCH=2.14.1         a supported release from PyPI (2.11.0, 2.12.1, 2.13.0, 2.14.1) in
                           .venv-2.14.1 and build-2.14.1/, side by side: switching costs nothing
  TDC_TORCH_PREFIX=DIR     an installed PyTorch (DIR = site-packages/torch, e.g. a CUDA build);
                           the oracle is the python that imports it (TDC_PYTHON to name it)

Options:
  -h, --help     show this help
  --version      show tdc's version

Exit status: 0 success, 1 test/benchmark failures, 2 usage or setup error, 130 interrupted.
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace tdc::cli;
  install_signal_handlers();
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help") {
    fmt::print("{}", kUsage);
    return args.empty() ? kExitUsage : kExitOk;
  }
  if (args[0] == "--version") {
    fmt::print("tdc {}\n", TDC_VERSION);
    return kExitOk;
  }
  std::string command = args[0];
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (command == "help") {
    if (rest.empty()) {
      fmt::print("{}", kUsage);
      return kExitOk;
    }
    command = rest[0];
    rest = {"--help"};
  }
  try {
    if (command == "run") return run_command(rest);
    if (command == "test") return test_command(rest);
    if (command == "bench") return bench_command(rest);
    if (command == "parity") return parity_command(rest);
    if (command == "report") return report_command(rest);
    if (command == "mutate") return mutate_command(rest);
    if (command == "compat") return compat_command(rest);
    throw UsageError(fmt::format(
        "unknown command '{}' (commands: run, test, bench, report, parity, mutate, compat, help)", command));
  } catch (const UsageError& e) {
    fmt::print(stderr, "tdc: error: {}\n", e.what());
    return kExitUsage;
  } catch (const std::exception& e) {
    fmt::print(stderr, "tdc: error: {}\n", e.what());
    return kExitUsage;
  }
}
