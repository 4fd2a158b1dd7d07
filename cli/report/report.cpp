// Loading runs for the report and writing its two files.
#include "report/report.h"

#include <fstream>
#include <stdexcept>

#include <fmt/format.h>

#include "report/log_excerpt.h"

namespace tdc::cli {

namespace fs = std::filesystem;

ReportRun load_run(const fs::path& file_or_dir, const std::string& label) {
  fs::path file = file_or_dir;
  if (fs::is_directory(file_or_dir)) {
    file = file_or_dir / "results.json";
    if (!fs::is_regular_file(file))
      throw std::runtime_error(
          fmt::format("run '{}' is a directory without a results.json (give a `tdc run --out` directory or a "
                      "results.json)",
                      file_or_dir.string()));
  } else if (!fs::exists(file_or_dir)) {
    throw std::runtime_error(fmt::format("run '{}' does not exist", file_or_dir.string()));
  }
  ReportRun run;
  run.label = label;
  run.results_path = fs::absolute(file).lexically_normal();
  run.results = harness::read_results(file);  // errors name the file and the field
  run.log_of = index_logs(run.results_path.parent_path() / "logs");
  return run;
}

fs::path seed_table_path(const fs::path& source_dir) { return source_dir / "docs" / "conformance-status.md"; }

namespace {

void write_atomically(const fs::path& path, const std::string& text) {
  fs::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush()) throw std::runtime_error(fmt::format("cannot write '{}'", tmp.string()));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec)
    throw std::runtime_error(fmt::format("cannot rename '{}' to '{}': {}", tmp.string(), path.string(), ec.message()));
}

}  // namespace

ReportFiles write_report(const ReportInput& in, const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error(fmt::format("cannot create '{}': {}", dir.string(), ec.message()));
  ReportFiles files{dir / "report.html", dir / "report.md"};
  write_atomically(files.html, render_html(in));
  write_atomically(files.markdown, render_markdown(in));
  return files;
}

}  // namespace tdc::cli
