// The tdc command line: commands and the small option parser they share.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace tdc::cli {

// Exit codes of every command.
constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;  // tests failed / the benchmark or ctest failed
constexpr int kExitUsage = 2;   // bad command line or environment (message names what)
constexpr int kExitInterrupted = 130;

// A bad command line: reported as "tdc: error: ..." with exit status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct OptionSpec {
  const char* name;     // without the leading "--"
  const char* metavar;  // nullptr: a flag without value
  const char* help;
};

struct ParsedArgs {
  std::map<std::string, std::string> values;  // option name -> value ("" for flags)
  std::vector<std::string> positional;
  bool help = false;

  bool has(const std::string& name) const { return values.count(name) != 0; }
  std::optional<std::string> get(const std::string& name) const;
};

// Parses --name VALUE, --name=VALUE and flags. Unknown options throw UsageError naming the option
// and the command. With allow_positional false, a positional argument is an error too.
ParsedArgs parse_args(const std::string& command, const std::vector<OptionSpec>& specs,
                      const std::vector<std::string>& args, bool allow_positional);
std::string format_options(const std::vector<OptionSpec>& specs);

// Seconds > 0; UsageError naming the option and the value otherwise.
double parse_seconds(const std::string& command, const std::string& option, const std::string& value);
int parse_positive_int(const std::string& command, const std::string& option, const std::string& value);

// The build directory: --build-dir, else $TDC_BUILD, else the directory holding this executable
// when it has a tdc_suites.json. Throws UsageError saying what was tried.
std::filesystem::path resolve_build_dir(const std::optional<std::string>& flag);
// The source directory: $TDC_ROOT, else the build's CMakeCache.txt (tdc_SOURCE_DIR); may be empty.
std::filesystem::path resolve_source_dir(const std::filesystem::path& build_dir);
// The oracle: the python whose PyTorch the PyTorch side of parity and benchmarks runs on. --python,
// else $TDC_PYTHON (./tdc sets it: the venv of TDC_TORCH, or the interpreter of TDC_TORCH_PREFIX),
// else the python the build was configured with (CMakeCache TDC_PYTHON), else SOURCE/.venv.
std::filesystem::path resolve_oracle_python(const std::optional<std::string>& flag,
                                            const std::filesystem::path& build_dir,
                                            const std::filesystem::path& source_dir);

// Last `lines` lines of a file ("" if unreadable).
std::string file_tail(const std::filesystem::path& p, int lines);
std::string indent(const std::string& text, const std::string& prefix);
std::string format_duration(double s);  // "0.12 s", "1:05", "1:02:03"

// The commands. Each returns the process exit code.
int run_command(const std::vector<std::string>& args);
int test_command(const std::vector<std::string>& args);
int bench_command(const std::vector<std::string>& args);
int parity_command(const std::vector<std::string>& args);  // parity.cpp
int report_command(const std::vector<std::string>& args);  // cli/report/report_command.cpp
int mutate_command(const std::vector<std::string>& args);  // cli/mutate/mutate.cpp
int compat_command(const std::vector<std::string>& args);  // compat.cpp

}  // namespace tdc::cli
