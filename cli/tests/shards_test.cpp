// The shard planner of `tdc run` ([Note: tests side by side], cli/shards.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <stdexcept>

#include "shards.h"

namespace tdc::cli {
namespace {

std::vector<std::string> names(const std::string& prefix, int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(prefix + "." + std::to_string(i));
  return out;
}

// Every listed test lands in exactly one shard of its own binary, in listed order there.
void expect_partition(const std::vector<std::vector<std::string>>& tests, const std::vector<Shard>& plan) {
  for (size_t b = 0; b < tests.size(); ++b) {
    std::multiset<std::string> seen;
    for (const Shard& s : plan) {
      if (s.binary != b) continue;
      EXPECT_FALSE(s.tests.empty()) << "binary " << b << " shard " << s.index;
      for (size_t i = 1; i < s.tests.size(); ++i) {
        auto pos = [&](const std::string& id) { return std::find(tests[b].begin(), tests[b].end(), id); };
        EXPECT_LT(pos(s.tests[i - 1]), pos(s.tests[i])) << "listed order broken in shard " << s.index;
      }
      seen.insert(s.tests.begin(), s.tests.end());
    }
    EXPECT_EQ(seen, std::multiset<std::string>(tests[b].begin(), tests[b].end())) << "binary " << b;
  }
}

TEST(Shards, OneJobIsOneProcessPerBinaryInOrder) {
  std::vector<std::vector<std::string>> tests = {names("A", 3), names("B", 50), {}, names("C", 1)};
  auto plan = plan_shards(tests, 1, {{"B.7", 100.0}});
  ASSERT_EQ(plan.size(), 3u);  // the empty binary gets no process
  EXPECT_EQ(plan[0].binary, 0u);
  EXPECT_EQ(plan[1].binary, 1u);
  EXPECT_EQ(plan[2].binary, 3u);
  for (const Shard& s : plan) EXPECT_EQ(s.of, 1);
  EXPECT_EQ(plan[1].tests, tests[1]);
  expect_partition(tests, plan);
}

TEST(Shards, LongTestsAreSpreadAndStartFirst) {
  // Four long tests listed next to each other, then short ones: round robin by position would put
  // two long ones together; the planner deals them onto four shards.
  std::vector<std::string> list = names("P", 20);
  std::map<std::string, double> took;
  for (int i = 0; i < 20; ++i) took["P." + std::to_string(i)] = i < 4 ? 10.0 : 0.5;
  auto plan = plan_shards({list}, 4, took);
  ASSERT_EQ(plan.size(), 4u);
  expect_partition({list}, plan);
  for (const Shard& s : plan) {
    int long_ones = 0;
    for (const auto& id : s.tests) long_ones += took[id] > 1;
    EXPECT_EQ(long_ones, 1) << "shard " << s.index;
    EXPECT_DOUBLE_EQ(s.expected_s, 10.0 + 2.0);  // 16 short ones, 4 each
  }
  std::vector<Shard> small = plan_shards({list, names("Q", 2)}, 4, took);
  EXPECT_GT(small.front().expected_s, small.back().expected_s) << "the longest shard starts first";
  // --suites: the binaries in the order given, each one's shards longest first.
  std::vector<Shard> ordered = plan_shards({names("Q", 2), list}, 4, took, true);
  ASSERT_EQ(ordered.size(), 5u);
  EXPECT_EQ(ordered.front().binary, 0u);
  for (size_t i = 2; i < ordered.size(); ++i) EXPECT_GE(ordered[i - 1].expected_s, ordered[i].expected_s);
}

TEST(Shards, ShortBinariesAreNotSplit) {
  // Unknown tests count 1 s each when no duration is known: three of them make one shard (a
  // process start costs about 0.5 s), sixty make as many shards as jobs.
  auto plan = plan_shards({names("U", 3), names("S", 60)}, 6, {});
  int u = 0, s = 0;
  for (const Shard& sh : plan) (sh.binary == 0 ? u : s)++;
  EXPECT_EQ(u, 1);
  EXPECT_EQ(s, 6);
  // Known to be quick: one shard even with many tests.
  std::map<std::string, double> quick;
  for (const auto& id : names("S", 60)) quick[id] = 0.01;
  EXPECT_EQ(plan_shards({names("S", 60)}, 6, quick).size(), 1u);
  // Unknown tests next to known ones count as the median known duration.
  std::map<std::string, double> some = {{"S.0", 4.0}, {"S.1", 4.0}, {"S.2", 4.0}};
  auto mixed = plan_shards({names("S", 4)}, 8, some);
  EXPECT_EQ(mixed.size(), 4u);  // 16 s expected: up to 8 shards, but only 4 tests
  expect_partition({names("S", 4)}, mixed);
}

TEST(Shards, JobsMustBePositiveAndDefaultsFollowTheRun) {
  EXPECT_THROW(plan_shards({names("A", 2)}, 0, {}), std::invalid_argument);
  EXPECT_EQ(default_jobs("cpu", "fork", 2), 6);
  EXPECT_EQ(default_jobs("cpu", "thread", 64), 8);
  EXPECT_EQ(default_jobs("cpu", "fork", 0), 3);  // hardware_concurrency() may not know
  EXPECT_EQ(default_jobs("cuda", "fork", 16), 1);
  EXPECT_EQ(default_jobs("cpu", "env", 16), 1);
}

}  // namespace
}  // namespace tdc::cli
