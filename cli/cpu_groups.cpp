// [Note: a test process on its own CPUs] (cpu_groups.h).
#include "cpu_groups.h"

#include <sched.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace tdc::cli {

CpuGroups::CpuGroups(std::vector<int> allowed, int jobs) {
  if (jobs < 1) throw std::invalid_argument("CpuGroups: jobs must be >= 1, got " + std::to_string(jobs));
  std::sort(allowed.begin(), allowed.end());
  allowed.erase(std::unique(allowed.begin(), allowed.end()), allowed.end());
  const size_t n = std::min(allowed.size(), static_cast<size_t>(jobs));
  // Neighbouring CPUs together (often one core's hyper-threads, one cache), the first groups one
  // CPU larger when they do not divide evenly.
  size_t next = 0;
  for (size_t g = 0; g < n; ++g) {
    const size_t take = allowed.size() / n + (g < allowed.size() % n ? 1 : 0);
    groups_.emplace_back(allowed.begin() + static_cast<long>(next), allowed.begin() + static_cast<long>(next + take));
    next += take;
  }
  load_.assign(groups_.size(), 0);
}

int CpuGroups::acquire() {
  if (!pins()) return -1;
  const auto it = std::min_element(load_.begin(), load_.end());
  ++*it;
  return static_cast<int>(it - load_.begin());
}

void CpuGroups::release(int group) {
  if (group < 0) return;
  int& l = load_.at(static_cast<size_t>(group));
  if (l <= 0) throw std::logic_error("CpuGroups::release: group " + std::to_string(group) + " was not acquired");
  --l;
}

std::vector<int> CpuGroups::cpus(int group) const {
  if (group < 0) return {};
  return groups_.at(static_cast<size_t>(group));
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return {};
  std::vector<int> out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

}  // namespace tdc::cli
