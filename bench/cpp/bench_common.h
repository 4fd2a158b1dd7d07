// What the benchmark programs share: order statistics, an atomic result write, and the
// command line (--out FILE [--repeat N]). Header-only; each benchmark is one small program.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <torch/version.h>

#include "tdc/harness/launch.h"
#include "tdc/harness/results.h"

namespace tdc::bench {

// Launches one benchmark case (`body` runs on every rank; rank 0 writes a JSON object with
// "step_ms" to `result_path`), prints `label` then the outcome on one progress line, and returns
// the parsed result; nullopt (with the reason printed) when the case failed or wrote nothing.
inline std::optional<nlohmann::json> run_case_and_read(const harness::LaunchSpec& spec, const std::string& label,
                                                       const std::string& result_path,
                                                       const std::function<void()>& body) {
  fmt::print(stderr, "{} ... ", label);
  auto t0 = std::chrono::steady_clock::now();
  harness::Outcome o = harness::launch(spec, body);
  if (o.status != harness::Status::Pass) {
    fmt::print(stderr, "{}: {}\n", harness::to_string(o.status), o.message);
    return std::nullopt;
  }
  std::ifstream in(result_path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("step_ms")) {
    fmt::print(stderr, "no result written\n");
    return std::nullopt;
  }
  fmt::print(stderr, "{:.2f} ms/step  ({:.1f} s)\n", j["step_ms"].get<double>(),
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return j;
}

// Nearest-rank percentile (q in (0, 1]).
inline double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t k = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(k, 1, v.size()) - 1];
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Temp name, then rename: a reader never sees half a file.
inline void write_atomic(const std::string& path, const std::string& text) {
  std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(fmt::format("cannot create '{}': {}", tmp, std::strerror(errno)));
    out << text;
    out.flush();
    if (!out) throw std::runtime_error(fmt::format("cannot write '{}'", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw std::runtime_error(fmt::format("cannot rename '{}' to '{}': {}", tmp, path, std::strerror(errno)));
}

// A private temp dir for the case results of one run (mkdtemp), removed with the object.
class TempDir {
 public:
  explicit TempDir(const std::string& program) {
    std::string tmpl = "/tmp/" + program + "-" + std::string(6, 'X');  // mkdtemp's pattern
    if (!::mkdtemp(tmpl.data())) {
      throw std::runtime_error(fmt::format("cannot create a temp dir: {}", std::strerror(errno)));
    }
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// What every benchmark JSON records about where and when it ran.
inline nlohmann::json run_info(const std::string& started_at, std::chrono::steady_clock::time_point start) {
  return {
      {"host", tdc::harness::hostname()},
      {"cpus", static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN))},
      {"libtorch_version", fmt::format("{}.{}.{}", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH)},
      {"started_at", started_at},
      {"duration_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()},
  };
}

// Writes the result JSON (parent dirs made, atomically); false after printing why not.
inline bool write_result(const std::string& program, const std::string& out_path, const nlohmann::json& out) {
  try {
    std::filesystem::path parent = std::filesystem::path(out_path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    write_atomic(out_path, out.dump(2) + "\n");
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: {}\n", program, e.what());
    return false;
  }
  return true;
}

struct Args {
  std::string out;
  int repeat = 0;
  std::vector<int> worlds{2, 4};  // --worlds: the world (pp) sizes to run, a subset of 2,4
};

// --worlds' value: "2", "4" or "2,4" (the sizes every benchmark's models and batches are laid
// out for); empty when it is anything else.
inline std::vector<int> parse_worlds(const std::string& v) {
  if (v == "2") return {2};
  if (v == "4") return {4};
  if (v == "2,4") return {2, 4};
  return {};
}

// Initialises the harness (its --tdc_* flags) and parses --out FILE [--repeat N] (and, where
// `takes_worlds`, [--worlds 2|4|2,4]). Exits 2 with the program's usage on a bad argument, 0
// after --help.
inline Args parse_args(int argc, char** argv, const std::string& program, int default_repeat,
                       const std::string& repeat_meaning, bool takes_worlds = false) {
  const std::string usage = fmt::format("usage: {} --out FILE [--repeat N]{}   (N {}, default {})", program,
                                        takes_worlds ? " [--worlds 2|4|2,4]" : "", repeat_meaning, default_repeat);
  auto fail = [&](const std::string& what) {
    fmt::print(stderr, "{}: error: {}\n{}\n", program, what, usage);
    std::exit(2);
  };
  std::string error;
  if (!tdc::harness::init(&argc, argv, &error)) fail(error);
  Args a;
  a.repeat = default_repeat;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char* flag) -> std::string {
      std::string prefix = std::string(flag) + "=";
      if (arg.rfind(prefix, 0) == 0) return arg.substr(prefix.size());
      if (i + 1 >= argc) fail(fmt::format("{} needs a value", flag));
      return argv[++i];
    };
    if (arg == "--out" || arg.rfind("--out=", 0) == 0) {
      a.out = value("--out");
    } else if (arg == "--repeat" || arg.rfind("--repeat=", 0) == 0) {
      std::string v = value("--repeat");
      char* end = nullptr;
      long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end || n < 1 || n > 100000)
        fail(fmt::format("--repeat must be a positive integer, got '{}'", v));
      a.repeat = static_cast<int>(n);
    } else if (takes_worlds && (arg == "--worlds" || arg.rfind("--worlds=", 0) == 0)) {
      std::string v = value("--worlds");
      a.worlds = parse_worlds(v);
      if (a.worlds.empty()) fail(fmt::format("--worlds must be 2, 4 or 2,4, got '{}'", v));
    } else if (arg == "-h" || arg == "--help") {
      fmt::print("{}\n", usage);
      std::exit(0);
    } else {
      fail(fmt::format("unknown argument '{}'", arg));
    }
  }
  if (a.out.empty()) fail("--out FILE is required");
  return a;
}

}  // namespace tdc::bench
