// tdc_parity_runner: tdc's side of one parity scenario (`tdc parity` runs it once per scenario).
//
//   tdc_parity_runner --scenario FILE --inputs FILE.safetensors --trace OUT.json
//
// Runs the scenario on world_size forked ranks (tdc::harness::launch, gloo on the CPU, 1 ATen
// thread per rank), starting from the initial weights and data in the inputs file that
// tools/parity/run_scenario.py wrote, and writes tdc's trace (schema tdc-parity-trace/1). Each
// rank writes its RankResult into a private temp dir; this process merges them (train.h).
// Exit status: 0 trace written, 1 the run failed (the reason on stderr), 2 bad arguments or
// scenario file.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include <fmt/format.h>
#include <torch/version.h>

#include "tdc/harness/launch.h"
#include "tdc/harness/harness.h"
#include "tdc/parity/scenario.h"
#include "train.h"

#ifndef TDC_VERSION
#define TDC_VERSION "unknown"
#endif

namespace {

namespace fs = std::filesystem;
using namespace tdc;

constexpr const char* kUsage = "usage: tdc_parity_runner --scenario FILE --inputs FILE --trace FILE";

struct Args {
  fs::path scenario, inputs, trace;
};

[[noreturn]] void usage_error(const std::string& what) {
  fmt::print(stderr, "tdc_parity_runner: error: {}\n{}\n", what, kUsage);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      fmt::print("{}\n", kUsage);
      std::exit(0);
    }
    if (i + 1 >= argc) usage_error(fmt::format("'{}' needs a value (or is unknown)", arg));
    if (arg == "--scenario") {
      a.scenario = argv[++i];
    } else if (arg == "--inputs") {
      a.inputs = argv[++i];
    } else if (arg == "--trace") {
      a.trace = argv[++i];
    } else {
      usage_error(fmt::format("unknown argument '{}'", arg));
    }
  }
  if (a.scenario.empty() || a.inputs.empty() || a.trace.empty())
    usage_error("--scenario, --inputs and --trace are required");
  return a;
}

// A private temp dir (mkdtemp), removed with the object.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tdc-parity-XXXXXX").string();
    if (!::mkdtemp(tmpl.data()))
      throw std::runtime_error(fmt::format("cannot create a temp dir: {}", std::strerror(errno)));
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string error;
  if (!harness::init(&argc, argv, &error)) usage_error(error);
  const Args args = parse(argc, argv);
  parity::Scenario sc;
  try {
    sc = parity::load_scenario(args.scenario);
  } catch (const parity::ScenarioError& e) {
    usage_error(e.what());
  }
  if (!fs::is_regular_file(args.inputs))
    usage_error(fmt::format("inputs file '{}' does not exist", args.inputs.string()));
  try {
    const TempDir tmp;
    harness::LaunchSpec spec{.suite = "Parity", .name = sc.name, .world_size = sc.world_size, .timeout_s = 240};
    harness::Outcome o = harness::launch(spec, [&] {
      const parity::RankResult r = parity::train_rank(sc, args.inputs, tmp.path);
      std::ofstream(tmp.path / fmt::format("rank{}.json", harness::ctx().rank)) << parity::to_json(r).dump() << "\n";
    });
    if (o.status != harness::Status::Pass) {
      fmt::print(stderr, "tdc_parity_runner: scenario '{}': {}: {}\n", sc.name, harness::to_string(o.status),
                 o.message);
      return 1;
    }
    std::vector<parity::RankResult> ranks;
    for (int r = 0; r < sc.world_size; ++r) {
      std::ifstream in(tmp.path / fmt::format("rank{}.json", r));
      ranks.push_back(parity::rank_result_from_json(nlohmann::json::parse(in)));
    }
    const std::string version = fmt::format("tdc {} (LibTorch {}.{}.{})", TDC_VERSION, TORCH_VERSION_MAJOR,
                                            TORCH_VERSION_MINOR, TORCH_VERSION_PATCH);
    parity::write_trace(args.trace, parity::merge_ranks(sc, ranks, version));
  } catch (const std::exception& e) {
    fmt::print(stderr, "tdc_parity_runner: scenario '{}': {}\n", sc.name, e.what());
    return 1;
  }
  return 0;
}
