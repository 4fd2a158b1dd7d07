// `tdc report RUN... --out DIR [--parity FILE]...`: the report of one or more runs.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli.h"
#include "report/report.h"

namespace tdc::cli {

namespace fs = std::filesystem;

namespace {

const std::vector<OptionSpec> kReportOptions = {
    {"out", "DIR", "where report.html and report.md go (required)"},
    {"parity", "FILE", "a `tdc parity` file (tdc-parity/1); repeatable. Default: parity.json next to a run"},
    {"seed-table", "FILE", "the seed test list (default SOURCE/docs/conformance-status.md)"},
    {"build-dir", "DIR", "build directory, to find SOURCE (default $TDC_BUILD)"},
};

constexpr const char* kReportUsage =
    "usage: tdc report RUN... --out DIR [--parity FILE]...\n\n"
    "Writes DIR/report.html (one self-contained page: open it in a browser, no network needed) and\n"
    "DIR/report.md from one or more runs. A RUN is a results.json written by `tdc run`, or the\n"
    "directory holding it (its logs/ give the log excerpts). With two or more runs the diff\n"
    "compares the first with the last. docs/reports.md explains every section.\n\n"
    "Options:\n";

// --parity may repeat; parse_args keeps one value per option, so take them out first.
std::vector<std::string> take_repeated(std::vector<std::string>& args, const std::string& name) {
  std::vector<std::string> values, rest;
  const std::string flag = "--" + name, prefix = flag + "=";
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == flag) {
      if (i + 1 >= args.size()) throw UsageError(fmt::format("report: option '{}' needs a value (FILE)", flag));
      values.push_back(args[++i]);
    } else if (args[i].rfind(prefix, 0) == 0) {
      values.push_back(args[i].substr(prefix.size()));
    } else {
      rest.push_back(args[i]);
    }
  }
  args = rest;
  return values;
}

fs::path find_seed_table(const ParsedArgs& a) {
  if (auto v = a.get("seed-table")) return *v;
  std::vector<std::string> tried;
  auto from_source = [&](const fs::path& source, const std::string& how) -> std::optional<fs::path> {
    if (source.empty()) return std::nullopt;
    fs::path p = seed_table_path(source);
    if (fs::is_regular_file(p)) return p;
    tried.push_back(fmt::format("{} ({})", p.string(), how));
    return std::nullopt;
  };
  if (const char* root = std::getenv("TDC_ROOT"); root && *root)
    if (auto p = from_source(root, "$TDC_ROOT")) return *p;
  try {
    fs::path build = resolve_build_dir(a.get("build-dir"));
    if (auto p = from_source(resolve_source_dir(build), "the build's source directory")) return *p;
  } catch (const UsageError& e) {
    tried.push_back(e.what());
  }
  throw UsageError(fmt::format("report: cannot find docs/conformance-status.md (tried: {}); pass --seed-table FILE",
                               fmt::join(tried, "; ")));
}

}  // namespace

int report_command(const std::vector<std::string>& argv) {
  std::vector<std::string> args = argv;
  std::vector<std::string> parity_files = take_repeated(args, "parity");
  ParsedArgs a = parse_args("report", kReportOptions, args, true);
  if (a.help) {
    fmt::print("{}{}", kReportUsage, format_options(kReportOptions));
    return kExitOk;
  }
  if (a.positional.empty()) throw UsageError("report: give at least one RUN (a results.json or its directory)");
  auto out = a.get("out");
  if (!out || out->empty()) throw UsageError("report: --out DIR is required");

  ReportInput in;
  in.generated_at = harness::iso_now();
  try {
    in.seed = read_seed_table(find_seed_table(a));
    for (size_t i = 0; i < a.positional.size(); ++i)
      in.runs.push_back(load_run(a.positional[i], fmt::format("run {}", i + 1)));
    if (parity_files.empty())  // the default: parity.json next to a run's results.json
      for (const ReportRun& run : in.runs)
        if (fs::path p = run.results_path.parent_path() / "parity.json"; fs::is_regular_file(p))
          parity_files.push_back(p.string());
    for (const std::string& p : parity_files) in.parity.push_back(read_parity(p));
  } catch (const UsageError&) {
    throw;
  } catch (const std::exception& e) {
    throw UsageError(fmt::format("report: {}", e.what()));
  }
  ReportFiles files = write_report(in, *out);
  fmt::print("report: {}\n        {}\n", files.html.string(), files.markdown.string());
  return kExitOk;
}

}  // namespace tdc::cli
