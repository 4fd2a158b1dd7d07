// Which CPUs each of `tdc run`'s side-by-side test processes may use.
//
// [Note: a test process on its own CPUs] With --jobs > 1 the CPUs are shared by several test
// processes, and a distributed test is a chain of thread wake-ups (a rank -> its Gloo worker ->
// the TCP loop -> the peer's loop -> its worker, and back; [Note: tests side by side]). Left to
// itself the kernel spreads those threads over every CPU, so nearly every wake-up crosses CPUs:
// an inter-processor interrupt (through the hypervisor on a VM), a migration, a cold cache. So
// `tdc run` splits the CPUs it may use (its affinity mask) into min(--jobs, CPUs) groups of
// neighbouring CPUs, and starts each test process on the group that has the fewest test
// processes on it at that moment. The process, its ranks and their Gloo threads stay on that
// group; with at least as many jobs as CPUs (6 on 2 CPUs by default) a group is one CPU, and
// every wake-up inside a test is a local one. What a test computes does not change (ranks run
// one intra-op thread each); only where its threads run. Measured on the 2-vCPU VM: the seed
// suite's system time -27 %, wall -12 % (docs/bench/suite_time.md, "A test process on its own
// CPU"). --jobs 1 (one group of every CPU) and --no-pin leave placement to the kernel, as before.
#pragma once

#include <vector>

namespace tdc::cli {

class CpuGroups {
 public:
  // `allowed`: the CPUs to share out (allowed_cpus()); `jobs`: processes at once (>= 1).
  // Throws std::invalid_argument when jobs < 1.
  CpuGroups(std::vector<int> allowed, int jobs);

  // Whether there is anything to choose: false with one group (or no CPUs known).
  bool pins() const { return groups_.size() > 1; }
  size_t size() const { return groups_.size(); }
  // The group with the fewest processes on it (the lowest such index), now counted as one more;
  // -1 when pins() is false.
  int acquire();
  // Gives back a group acquire() returned; -1 is ignored.
  void release(int group);
  // The CPUs of a group, ascending; empty for -1.
  std::vector<int> cpus(int group) const;
  // Processes on a group now.
  int load(int group) const { return load_.at(static_cast<size_t>(group)); }

 private:
  std::vector<std::vector<int>> groups_;
  std::vector<int> load_;
};

// The CPUs this process may run on (its affinity mask), ascending; empty if it cannot be read.
std::vector<int> allowed_cpus();

}  // namespace tdc::cli
