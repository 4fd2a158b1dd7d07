// Loading and validating the goldens computed by the venv's PyTorch (see the header's Note).
#include "tdc/conformance/pytorch_goldens.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <stdexcept>

#include <ATen/Version.h>
#include <fmt/format.h>
#include <torch/version.h>

#ifndef TDC_GOLDEN_DIR_DEFAULT
#error "TDC_GOLDEN_DIR_DEFAULT must name the build's goldens folder"
#endif

namespace tdc::conformance {

std::string cpu_capability() { return at::get_cpu_capability(); }

namespace {

std::filesystem::path golden_dir() {
  if (const char* env = std::getenv("TDC_GOLDEN_DIR"); env && *env) return env;
  return TDC_GOLDEN_DIR_DEFAULT;
}

nlohmann::json load_and_check(const std::filesystem::path& path) {
  const std::string how =
      "goldens are computed on this machine by the venv's PyTorch: run the suite through CTest "
      "(./tdc test; its setup step tdc_goldens writes them) or run fixtures/golden/<generator>.py "
      "--out FILE with the venv's python and point TDC_GOLDEN_DIR at FILE's folder";
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("golden file '{}' does not exist; {}", path.string(), how));
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw std::runtime_error(fmt::format("golden file '{}' is not a JSON object; {}", path.string(), how));
  const std::string theirs = j.value("cpu_capability", std::string("(none recorded)"));
  if (theirs != cpu_capability())
    throw std::runtime_error(
        fmt::format("golden file '{}' was computed under ATen CPU capability {} but this process runs {} "
                    "(ATEN_CPU_CAPABILITY='{}'): the kernels differ, so its numbers do not apply; {}",
                    path.string(), theirs, cpu_capability(),
                    std::getenv("ATEN_CPU_CAPABILITY") ? std::getenv("ATEN_CPU_CAPABILITY") : "", how));
  const std::string torch = j.value("torch", std::string("(none recorded)"));
  if (torch.rfind(TORCH_VERSION, 0) != 0)
    throw std::runtime_error(
        fmt::format("golden file '{}' was computed by torch {} but tdc is built "
                    "against LibTorch {}; {}",
                    path.string(), torch, TORCH_VERSION, how));
  return j;
}

}  // namespace

const nlohmann::json& pytorch_goldens(const std::string& name) {
  static std::mutex mu;  // thread-launched ranks share the cache
  static std::map<std::string, nlohmann::json> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, load_and_check(golden_dir() / name)).first;
  return it->second;
}

}  // namespace tdc::conformance
