#include "shards.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace tdc::cli {

namespace {

constexpr double kUnknownTestS = 1.0;  // a test no earlier run timed, when none was timed
constexpr double kSecondsPerShard = 2.0;

double median_of(const std::map<std::string, double>& m) {
  std::vector<double> v;
  for (const auto& [id, s] : m)
    if (s > 0) v.push_back(s);
  if (v.empty()) return kUnknownTestS;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// One binary's tests dealt onto `k` shards, longest first onto the least-loaded one.
std::vector<Shard> deal(size_t binary, const std::vector<std::string>& tests, const std::vector<double>& cost, int k) {
  std::vector<size_t> order(tests.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  std::vector<std::vector<size_t>> members(static_cast<size_t>(k));
  std::vector<double> load(static_cast<size_t>(k), 0.0);
  for (size_t i : order) {
    size_t s = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    members[s].push_back(i);
    load[s] += cost[i];
  }
  std::vector<Shard> out;
  for (int s = 0; s < k; ++s) {
    auto& m = members[static_cast<size_t>(s)];
    std::sort(m.begin(), m.end());  // listed order inside the shard
    Shard sh;
    sh.binary = binary;
    sh.index = s;
    sh.of = k;
    sh.expected_s = load[static_cast<size_t>(s)];
    for (size_t i : m) sh.tests.push_back(tests[i]);
    out.push_back(std::move(sh));
  }
  return out;
}

}  // namespace

std::vector<Shard> plan_shards(const std::vector<std::vector<std::string>>& tests, int jobs,
                               const std::map<std::string, double>& expected_s, bool binary_order) {
  if (jobs < 1) throw std::invalid_argument("plan_shards: jobs must be at least 1");
  const double unknown = median_of(expected_s);
  std::vector<Shard> shards;
  for (size_t b = 0; b < tests.size(); ++b) {
    const auto& list = tests[b];
    if (list.empty()) continue;
    std::vector<double> cost;
    for (const auto& id : list) {
      auto it = expected_s.find(id);
      cost.push_back(it != expected_s.end() && it->second > 0 ? it->second : unknown);
    }
    const double total = std::accumulate(cost.begin(), cost.end(), 0.0);
    const int by_time = std::max(1, static_cast<int>(std::floor(total / kSecondsPerShard)));
    const int k = std::min({jobs, static_cast<int>(list.size()), by_time});
    for (auto& s : deal(b, list, cost, k)) shards.push_back(std::move(s));
  }
  // --jobs 1 keeps the binaries' order; otherwise the longest shards start first (within each
  // binary only, with binary_order).
  if (jobs > 1)
    std::stable_sort(shards.begin(), shards.end(), [&](const Shard& a, const Shard& b) {
      if (binary_order && a.binary != b.binary) return a.binary < b.binary;
      return a.expected_s > b.expected_s;
    });
  return shards;
}

int default_jobs(const std::string& device, const std::string& launcher, unsigned cpus) {
  if (device != "cpu" || launcher == "env") return 1;
  return static_cast<int>(std::clamp(3u * std::max(cpus, 1u), 1u, 8u));
}

}  // namespace tdc::cli
