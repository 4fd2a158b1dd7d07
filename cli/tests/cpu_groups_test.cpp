// Where `tdc run`'s test processes run ([Note: a test process on its own CPUs], cli/cpu_groups.h):
// the groups, the choice of the least-loaded one, and a spawned child really on its CPUs.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "cpu_groups.h"
#include "process.h"

namespace tdc::cli {
namespace {

TEST(CpuGroups, OneCpuPerGroupWhenJobsOutnumberCpus) {
  CpuGroups g({0, 1}, 6);
  ASSERT_TRUE(g.pins());
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g.cpus(0), std::vector<int>{0});
  EXPECT_EQ(g.cpus(1), std::vector<int>{1});
}

TEST(CpuGroups, NeighbouringCpusTogetherWhenCpusOutnumberJobs) {
  CpuGroups g({7, 2, 3, 4, 5, 6, 0, 1, 3}, 3);  // unsorted, 3 twice: 8 CPUs
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g.cpus(0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(g.cpus(1), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(g.cpus(2), (std::vector<int>{6, 7}));
}

TEST(CpuGroups, OneJobOrOneCpuPinsNothing) {
  for (const CpuGroups& g : {CpuGroups({0, 1, 2, 3}, 1), CpuGroups({5}, 6), CpuGroups({}, 6)}) {
    EXPECT_FALSE(g.pins());
    CpuGroups copy = g;
    EXPECT_EQ(copy.acquire(), -1);
    EXPECT_TRUE(copy.cpus(-1).empty());
    copy.release(-1);  // ignored
  }
}

TEST(CpuGroups, EachProcessGoesToTheLeastLoadedGroup) {
  CpuGroups g({0, 1}, 6);
  EXPECT_EQ(g.acquire(), 0);
  EXPECT_EQ(g.acquire(), 1);
  EXPECT_EQ(g.acquire(), 0);
  EXPECT_EQ(g.acquire(), 1);
  g.release(0);
  g.release(0);
  EXPECT_EQ(g.load(0), 0);
  EXPECT_EQ(g.load(1), 2);
  EXPECT_EQ(g.acquire(), 0);  // the emptied group first
  EXPECT_EQ(g.acquire(), 0);
  EXPECT_EQ(g.acquire(), 0);  // ties go to the lower index
  EXPECT_EQ(g.load(0), 3);
}

TEST(CpuGroups, RejectsWhatIsNotAProcessCount) {
  EXPECT_THROW(CpuGroups({0, 1}, 0), std::invalid_argument);
  CpuGroups g({0, 1}, 2);
  EXPECT_THROW(g.release(1), std::logic_error);  // never acquired
}

// The child's own /proc/self/status names the CPUs it may use.
std::string child_cpus_allowed(const std::vector<int>& cpus) {
  char path[] = "/tmp/tdc-cpus-XXXXXX";
  int fd = ::mkstemp(path);
  if (fd < 0) throw std::runtime_error("mkstemp failed");
  SpawnOptions so;
  so.argv = {"grep", "^Cpus_allowed_list:", "/proc/self/status"};
  so.stdout_fd = fd;
  so.cpus = cpus;
  Child c = Child::spawn(so);
  const int status = c.wait();
  ::close(fd);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  ::unlink(path);
  EXPECT_EQ(exit_code(status), 0) << text.str();
  std::string line = text.str();
  const auto colon = line.find(':');
  line = colon == std::string::npos ? line : line.substr(colon + 1);
  line.erase(0, line.find_first_not_of(" \t"));
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
  return line;
}

TEST(CpuGroups, ASpawnedChildRunsOnItsGroupAndTheParentKeepsItsMask) {
  const std::vector<int> mine = allowed_cpus();
  ASSERT_FALSE(mine.empty());
  const int last = mine.back();
  EXPECT_EQ(child_cpus_allowed({last}), std::to_string(last));
  EXPECT_EQ(allowed_cpus(), mine) << "the spawning thread did not get its own mask back";
  if (mine.size() == 1) return;                    // nothing else to tell apart on one CPU
  const std::string all = child_cpus_allowed({});  // inherits ours
  EXPECT_NE(all, std::to_string(last));
  EXPECT_NE(all.find_first_of(",-"), std::string::npos) << all;
}

}  // namespace
}  // namespace tdc::cli
