#include "tdc/harness/external_launcher.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace tdc::harness {
namespace {

// The first of the variables that is set, as an integer.
std::optional<int> first_int(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    try {
      size_t used = 0;
      int x = std::stoi(v, &used);
      if (used == std::string(v).size()) return x;
    } catch (const std::exception&) {
    }
    throw std::invalid_argument(fmt::format("environment variable {}='{}' is not an integer", name, v));
  }
  return std::nullopt;
}

}  // namespace

std::optional<ExternalRank> external_rank() {
  std::optional<int> rank = first_int({"RANK", "SLURM_PROCID"});
  if (!rank) return std::nullopt;
  ExternalRank r;
  r.rank = *rank;
  r.world_size = first_int({"WORLD_SIZE", "SLURM_NTASKS"}).value_or(-1);
  r.local_rank = first_int({"LOCAL_RANK", "SLURM_LOCALID"}).value_or(r.rank);
  return r;
}

}  // namespace tdc::harness
