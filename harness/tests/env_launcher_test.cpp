// Self-tests of the harness: the env launcher (ranks started as torchrun starts them), run as
// separate child processes (child_harness.h).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tdc/harness/results.h"

#include "child_harness.h"

using namespace tdc::harness;
using namespace tdc_selftest;

namespace {
int free_port() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  close(s);
  return port;
}

// Starts `world` copies of a binary the way torchrun does (env vars), returns rank 0's results.
std::vector<ChildRun> run_env_world(const std::string& binary, const std::string& filter, int world) {
  int port = free_port();
  std::vector<std::thread> threads;
  std::vector<ChildRun> runs(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      ChildOptions o;
      o.binary = binary;
      o.args = {"--tdc_launcher=env"};
      o.env = {"RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(world),
               "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)};
      runs[r] = run_child(filter, o);
    });
  }
  for (auto& t : threads) t.join();
  return runs;
}
}  // namespace

TEST(HarnessEnvLauncher, TwoRanksPassAndRank0Reports) {
  auto runs = run_env_world("tdc_harness_selftest", "HarnessBasics.TwoRanks", 2);
  const TestResult& t = only_test(runs[0]);
  EXPECT_EQ(t.status, Status::Pass) << t.message << runs[0].output << runs[1].output;
  EXPECT_EQ(t.launcher, "env");
  EXPECT_EQ(t.world_size, 2);
  EXPECT_EQ(runs[0].results.run_info.launcher, "env");
  for (auto& r : runs) EXPECT_EQ(r.exit_code, 0) << r.output;
  for (auto& r : runs) expect_clean(r);
}

TEST(HarnessEnvLauncher, FailureOnRank1IsReportedByRank0) {
  auto runs = run_env_world("tdc_harness_mustfail", "MustFail.EnvFailOnRank1", 2);
  const TestResult& t = only_test(runs[0]);
  EXPECT_EQ(t.status, Status::Fail) << runs[0].output;
  EXPECT_TRUE(contains(t.message, "[rank 1] ")) << t.message;
  EXPECT_TRUE(contains(t.message, "rank 1 fails on purpose")) << t.message;
  EXPECT_EQ(runs[0].exit_code, 1);
  for (auto& r : runs) expect_clean(r);
}
