// How `tdc run` splits the selected tests into shards that run side by side.
//
// [Note: tests side by side] A distributed test on the CPU spends most of its wall time waiting:
// each Gloo collective is a chain of thread wake-ups (caller -> Gloo worker -> TCP loop -> peer
// and back), 0.3 to 1 ms per tiny op on a 2-vCPU VM, while both CPUs sit mostly idle
// (docs/bench/suite_time.md). So `tdc run` runs several test processes at once: each binary's
// tests are split into shards (one process each, an explicit --gtest_filter list), and up to
// --jobs shards run together. Every test still runs alone in its own ranks, with its own temp
// dir and FileStore and Gloo on ephemeral ports, so shards share nothing but the CPUs.
//   - A shard holds tests of one binary only; tests keep their listed order inside it.
//   - Tests are dealt to a binary's shards longest first onto the least-loaded shard (LPT), with
//     the durations of the previous run in the same --out directory where there is one (unknown
//     tests count as the median known duration, or 1 s), so the shards of a binary end together.
//   - A binary gets at most --jobs shards, and no more than one per 2 s of expected time: a
//     shard costs a process start and LibTorch's load (about 0.5 s).
//   - The shards start longest first (with --suites, the binaries in the order given, each one's
//     shards longest first: tdc mutate names the suites likeliest to fail first); results are
//     merged back in the binaries' listed order, so results.json does not depend on --jobs or on
//     which shard finished first.
//   - --jobs 1 is the old behaviour exactly: one process per binary, binaries in order.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace tdc::cli {

struct Shard {
  size_t binary = 0;               // index into the run's binaries
  int index = 0, of = 1;           // shard `index` of the binary's `of` shards
  std::vector<std::string> tests;  // in the binary's listed order
  double expected_s = 0;           // sum of the tests' expected durations
};

// `tests[b]`: binary b's listed tests. `expected_s`: test id -> duration of an earlier run.
// Returns the shards in the order to start them: longest first, or with `binary_order` the
// binaries in order and each one's shards longest first. Throws std::invalid_argument for jobs < 1.
std::vector<Shard> plan_shards(const std::vector<std::vector<std::string>>& tests, int jobs,
                               const std::map<std::string, double>& expected_s, bool binary_order = false);

// --jobs when not given: 1 on CUDA (ranks share the GPUs) and under an external launcher (every
// rank's `tdc run` must start the same test at the same time); else 3 per CPU, at most 8.
int default_jobs(const std::string& device, const std::string& launcher, unsigned cpus);

}  // namespace tdc::cli
