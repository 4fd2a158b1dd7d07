// A launch whose ranks cannot be started throws, naming the cause, and leaves nothing behind:
// no temp dir, no rank process (launcher.cpp, RemoveTempDirOnThrow).
#include <dirent.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "tdc/harness/launch.h"

namespace {

// The highest file descriptor this process has open.
int highest_open_fd() {
  int highest = 2;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return 1024;
  while (dirent* e = readdir(d)) highest = std::max(highest, std::atoi(e->d_name));
  closedir(d);
  return highest;
}

int entries_in(const std::string& dir) {
  int n = 0;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) n += std::string(e->d_name) != "." && std::string(e->d_name) != "..";
  closedir(d);
  return n;
}

// Exit codes of the child below: what went wrong, for the assertion's message.
enum ChildExit { kCleanFailure = 0, kDidNotThrow = 1, kWrongMessage = 2, kLeftSomething = 3, kSetupFailed = 4 };

// In a child process (its descriptor limit must not reach the rest of the run): a private TMPDIR,
// then no file descriptor left for the first rank's pipes, then a launch.
[[noreturn]] void launch_without_descriptors(const tdc::harness::Launcher launcher) {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base && *base ? base : "/tmp") + "/tdc-launch-failure-" + std::string(6, 'X');
  char* tmpl = pattern.data();
  if (mkdtemp(tmpl) == nullptr || setenv("TMPDIR", tmpl, 1) != 0) _exit(kSetupFailed);
  // Fill the holes below the highest open descriptor, then allow one more: a pipe needs two.
  const int highest = highest_open_fd();
  for (int fd = dup(2); fd != -1; fd = dup(2)) {
    if (fd > highest) {
      close(fd);
      break;
    }
  }
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = static_cast<rlim_t>(highest + 2);
  if (setrlimit(RLIMIT_NOFILE, &lim) != 0) _exit(kSetupFailed);
  int code = kDidNotThrow;
  try {
    tdc::harness::launch({.suite = "LaunchFailure", .name = "NoDescriptors", .world_size = 2, .launcher = launcher},
                         [] {});
  } catch (const std::exception& e) {
    code = std::string(e.what()).find("pipe2 failed") != std::string::npos ? kCleanFailure : kWrongMessage;
  }
  if (code == kCleanFailure && entries_in(tmpl) != 0) code = kLeftSomething;
  rmdir(tmpl);  // only when empty: a leak stays visible
  _exit(code);
}

void expect_clean_failure(tdc::harness::Launcher launcher) {
  const pid_t pid = fork();
  ASSERT_NE(pid, -1);
  if (pid == 0) launch_without_descriptors(launcher);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died: " << status;
  EXPECT_EQ(WEXITSTATUS(status), kCleanFailure)
      << "1: launch did not throw; 2: not the pipe's error; 3: the temp dir was left; 4: setup failed";
}

TEST(HarnessLaunchFailure, ForkLauncherThrowsAndLeavesNoTempDir) { expect_clean_failure(tdc::harness::Launcher::Fork); }
TEST(HarnessLaunchFailure, ThreadLauncherThrowsAndLeavesNoTempDir) {
  expect_clean_failure(tdc::harness::Launcher::Thread);
}

}  // namespace
