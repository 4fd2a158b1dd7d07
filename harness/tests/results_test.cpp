// The results model: JSON round trip, atomic writes, JUnit XML, expectations, reader errors.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tdc/harness/results.h"
#include "tdc/harness/xml_check.h"

namespace {

namespace fs = std::filesystem;
using namespace tdc::harness;
using nlohmann::json;

const Status kAllStatuses[] = {Status::Pass,  Status::Fail,  Status::Skip,    Status::NotSupported,
                               Status::XFail, Status::XPass, Status::Timeout, Status::Crash};
const RankStatus kAllRankStatuses[] = {RankStatus::Pass,    RankStatus::Fail,    RankStatus::Skip,   RankStatus::Crash,
                                       RankStatus::Timeout, RankStatus::Aborted, RankStatus::Unknown};

// A private temp dir, removed at the end of the test.
class ResultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / ("tdc-results-test-" + std::string(6, 'X'))).string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  static std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  static void spit(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

  static RunResults sample() {
    RunResults r;
    r.run_info.implementation = "tdc-reference";
    r.run_info.implementation_version = "0.1.0";
    r.run_info.world_size = 4;
    r.run_info.suite_revision = "abc1234";
    r.run_info.tdc_version = "0.1.0";
    r.run_info.libtorch_version = "2.13.0";
    r.run_info.host = "host<&>";
    r.run_info.started_at = "2025-01-02T03:04:05Z";
    r.run_info.duration_s = 12.5;
    r.run_info.user_s = 20.25;
    r.run_info.system_s = 4.5;
    int k = 0;
    for (Status s : kAllStatuses) {
      TestResult t;
      t.suite = "Suite";
      t.name = std::string("Test_") + to_string(s);
      t.id = t.suite + "." + t.name;
      t.status = s;
      t.duration_s = 0.25 * ++k;
      t.world_size = 4;
      t.launcher = "fork";
      if (s != Status::Pass) t.message = std::string("[rank 1] why ") + to_string(s) + "\nline 2";
      RankDetail d;
      d.rank = 1;
      d.status = kAllRankStatuses[(k - 1) % std::size(kAllRankStatuses)];
      d.message = "boom";
      d.duration_s = 0.1;
      if (s == Status::Crash) d.signal = 11;
      if (s == Status::Fail) d.exit_code = 1;
      t.ranks.push_back(d);
      if (s == Status::XFail) t.expectation = "expected FAIL: known bug #12";
      r.tests.push_back(t);
    }
    return r;
  }

  fs::path dir_;
};

TEST_F(ResultsTest, StatusNamesRoundTrip) {
  for (Status s : kAllStatuses) EXPECT_EQ(status_from_string(to_string(s)), s) << to_string(s);
  EXPECT_STREQ(to_string(Status::NotSupported), "NOT_SUPPORTED");
  try {
    status_from_string("PASSED");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'PASSED'"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(is_failure(Status::Fail));
  EXPECT_TRUE(is_failure(Status::XPass));
  EXPECT_TRUE(is_failure(Status::Timeout));
  EXPECT_TRUE(is_failure(Status::Crash));
  EXPECT_FALSE(is_failure(Status::Pass));
  EXPECT_FALSE(is_failure(Status::Skip));
  EXPECT_FALSE(is_failure(Status::NotSupported));
  EXPECT_FALSE(is_failure(Status::XFail));
}

// results.json spells rank statuses in lower case, exactly as before RankStatus was an enum.
TEST_F(ResultsTest, RankStatusNamesRoundTripWithTheirJsonSpelling) {
  const std::pair<RankStatus, std::string> spelled[] = {
      {RankStatus::Pass, "pass"},       {RankStatus::Fail, "fail"},       {RankStatus::Skip, "skip"},
      {RankStatus::Crash, "crash"},     {RankStatus::Timeout, "timeout"}, {RankStatus::Aborted, "aborted"},
      {RankStatus::Unknown, "unknown"},
  };
  ASSERT_EQ(std::size(spelled), std::size(kAllRankStatuses));
  for (const auto& [status, name] : spelled) {
    EXPECT_EQ(to_string(status), name);
    EXPECT_EQ(rank_status_from_string(name), status) << name;
  }
  try {
    rank_status_from_string("PASS");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'PASS'"), std::string::npos) << e.what();
  }
  RunResults r = sample();
  json j = to_json(r);
  for (size_t i = 0; i < r.tests.size(); ++i) {
    const auto& [status, name] = spelled[i % std::size(spelled)];
    ASSERT_EQ(r.tests[i].ranks[0].status, status);
    EXPECT_EQ(j["tests"][i]["ranks"][0]["status"], name) << r.tests[i].id;
  }
}

TEST_F(ResultsTest, JsonRoundTripOfEveryStatus) {
  RunResults r = sample();
  fs::path p = dir_ / "sub" / "results.json";  // the writer creates the directory
  write_results_json(r, p);
  RunResults back = read_results(p);

  EXPECT_EQ(back.schema_version, 1);
  EXPECT_EQ(back.run_info.implementation, "tdc-reference");
  EXPECT_EQ(back.run_info.world_size, 4);
  EXPECT_EQ(back.run_info.host, "host<&>");
  EXPECT_EQ(back.run_info.started_at, "2025-01-02T03:04:05Z");
  EXPECT_DOUBLE_EQ(back.run_info.duration_s, 12.5);
  EXPECT_DOUBLE_EQ(back.run_info.user_s, 20.25);
  EXPECT_DOUBLE_EQ(back.run_info.system_s, 4.5);
  ASSERT_EQ(back.tests.size(), r.tests.size());
  for (size_t i = 0; i < r.tests.size(); ++i) {
    const TestResult &a = r.tests[i], &b = back.tests[i];
    EXPECT_EQ(b.id, a.id);
    EXPECT_EQ(b.status, a.status) << a.id;
    EXPECT_DOUBLE_EQ(b.duration_s, a.duration_s);
    EXPECT_EQ(b.message, a.message);
    EXPECT_EQ(b.expectation, a.expectation);
    ASSERT_EQ(b.ranks.size(), 1u);
    EXPECT_EQ(b.ranks[0].status, a.ranks[0].status) << a.id;
    EXPECT_EQ(b.ranks[0].signal, a.ranks[0].signal);
    EXPECT_EQ(b.ranks[0].exit_code, a.ranks[0].exit_code);
    EXPECT_EQ(b.ranks[0].message, "boom");
  }
  EXPECT_EQ(back.counts(), r.counts());
  EXPECT_EQ(back.counts().at(Status::Crash), 1);
  EXPECT_FALSE(back.ok());

  // The summary block is derived and present for people reading the file.
  json j = json::parse(slurp(p));
  EXPECT_EQ(j["summary"]["total"], 8);
  EXPECT_EQ(j["summary"]["XPASS"], 1);
  EXPECT_EQ(j["tests"][0]["status"], "PASS");
}

// [Note: rank reports]: tests[].reports and the run's reports round-trip; the run's is the
// union of the tests' even when a writer left it out; a malformed report is refused by field.
TEST_F(ResultsTest, ReportsRoundTripAndMerge) {
  RunResults r = sample();
  r.tests[0].reports["comm_ops"]["gloo.native"] = {"all_reduce", "reduce_scatter_tensor"};
  r.tests[1].reports["comm_ops"]["gloo.native"] = {"broadcast"};
  r.tests[1].reports["comm_ops"]["gloo.emulated"] = {"AVG"};
  for (const auto& t : r.tests) merge_reports(r.reports, t.reports);
  EXPECT_EQ(r.reports["comm_ops"]["gloo.native"],
            (std::set<std::string>{"all_reduce", "broadcast", "reduce_scatter_tensor"}));
  fs::path p = dir_ / "results.json";
  write_results_json(r, p);
  RunResults back = read_results(p);
  EXPECT_EQ(back.tests[0].reports, r.tests[0].reports);
  EXPECT_EQ(back.tests[1].reports, r.tests[1].reports);
  EXPECT_TRUE(back.tests[2].reports.empty());
  EXPECT_EQ(back.reports, r.reports);

  json j = json::parse(slurp(p));
  j.erase("reports");
  EXPECT_EQ(results_from_json(j).reports, r.reports) << "the run's reports are the union of the tests'";
  j["tests"][1]["reports"]["comm_ops"]["gloo.native"] = json::array({"broadcast", 3});
  try {
    results_from_json(j);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("tests[1].reports.comm_ops.gloo.native"), std::string::npos) << e.what();
  }
  j["tests"][1]["reports"] = json::array();
  EXPECT_THROW(results_from_json(j), std::runtime_error);
}

TEST_F(ResultsTest, InvalidUtf8InMessagesStillWritesJson) {
  RunResults r = sample();
  r.tests[1].message = "bad bytes \xff\xfe from a rank";
  fs::path p = dir_ / "results.json";
  write_results_json(r, p);
  RunResults back = read_results(p);
  EXPECT_NE(back.tests[1].message.find("bad bytes"), std::string::npos);
}

TEST_F(ResultsTest, AtomicWriteReplacesAndLeavesNoTempFiles) {
  fs::path p = dir_ / "results.json";
  spit(p, "old contents");
  RunResults r = sample();
  write_results_json(r, p);
  EXPECT_EQ(read_results(p).tests.size(), r.tests.size());
  r.tests.resize(2);
  write_results_json(r, p);
  EXPECT_EQ(read_results(p).tests.size(), 2u);
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    ++files;
    EXPECT_EQ(e.path().filename(), "results.json") << "left behind: " << e.path();
  }
  EXPECT_EQ(files, 1);
}

TEST_F(ResultsTest, WriteIntoUnwritablePlaceNamesThePath) {
  fs::path blocker = dir_ / "file";
  spit(blocker, "x");
  try {
    write_results_json(sample(), blocker / "results.json");  // parent is a regular file
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(blocker.string()), std::string::npos) << e.what();
  }
}

TEST_F(ResultsTest, JunitXmlIsWellFormedWithFailuresSkipsAndEscaping) {
  RunResults r = sample();
  r.tests[1].message = "expected <a> & \"b\" 'c' ]]> \x01 ctl\ncaf\xc3\xa9 \xff";
  r.tests[2].message = "skip <reason> & more";
  r.tests.push_back(r.tests[0]);
  r.tests.back().suite = "Other<Suite>";
  r.tests.back().id = "Other<Suite>.T";
  fs::path p = dir_ / "junit.xml";
  write_junit_xml(r, p);
  std::string text = slurp(p);

  XmlSummary s;
  auto err = xml_wellformed_error(text, &s);
  ASSERT_FALSE(err) << *err << "\n" << text;
  EXPECT_EQ(s.root, "testsuites");
  EXPECT_EQ(s.count("testsuite"), 2);
  EXPECT_EQ(s.count("testcase"), 9);
  EXPECT_EQ(s.count("failure"), 2);  // FAIL, XPASS
  EXPECT_EQ(s.count("error"), 2);    // TIMEOUT, CRASH
  EXPECT_EQ(s.count("skipped"), 3);  // SKIP, NOT_SUPPORTED, XFAIL
  EXPECT_NE(text.find("tests=\"9\" failures=\"2\" errors=\"2\" skipped=\"3\""), std::string::npos) << text;
  EXPECT_NE(text.find("expected &lt;a&gt; &amp; &quot;b&quot; &apos;c&apos; ]]&gt;"), std::string::npos) << text;
  EXPECT_NE(text.find("caf\xc3\xa9"), std::string::npos);  // valid UTF-8 kept
  EXPECT_EQ(text.find('\x01'), std::string::npos);         // control characters not written
  EXPECT_EQ(text.find('\xff'), std::string::npos);         // invalid UTF-8 replaced
  EXPECT_NE(text.find("name=\"Other&lt;Suite&gt;\""), std::string::npos);
}

TEST_F(ResultsTest, XmlCheckerRejectsBrokenDocuments) {
  using tdc::harness::xml_wellformed_error;
  EXPECT_FALSE(xml_wellformed_error("<?xml version=\"1.0\"?>\n<a x=\"1\"><b/>t&amp;</a>\n"));
  EXPECT_TRUE(xml_wellformed_error("<a><b></a></b>"));
  EXPECT_TRUE(xml_wellformed_error("<a x=\"<\"/>"));
  EXPECT_TRUE(xml_wellformed_error("<a>&bogus;</a>"));
  EXPECT_TRUE(xml_wellformed_error("<a>x & y</a>"));
  EXPECT_TRUE(xml_wellformed_error("<a/><b/>"));
  EXPECT_TRUE(xml_wellformed_error("<a x='1' x='2'/>"));
  EXPECT_TRUE(xml_wellformed_error("<a>\x01</a>"));
  auto err = xml_wellformed_error("<a>\n  <b>\n</a>");
  ASSERT_TRUE(err);
  EXPECT_NE(err->find("line 3"), std::string::npos) << *err;
}

TEST_F(ResultsTest, ExpectationsTurnFailIntoXfailAndPassIntoXpass) {
  fs::path p = dir_ / "expectations.json";
  spit(p, R"({"tests": {
      "S.Fails": {"status": "FAIL", "reason": "issue #1"},
      "S.Passes": {"status": "FAIL", "reason": "issue #2"},
      "S.Crashes": {"status": "CRASH"},
      "S.Skipped": {"status": "FAIL", "reason": "only on cuda"},
      "Glob.*": {"status": "FAIL", "reason": "whole suite"}
  }})");
  Expectations e = read_expectations(p);
  ASSERT_EQ(e.size(), 5u);
  EXPECT_EQ(e.at("S.Fails").status, Status::Fail);

  auto make = [](const std::string& id, Status s, const std::string& msg) {
    TestResult t;
    t.id = id;
    t.suite = id.substr(0, id.find('.'));
    t.name = id.substr(id.find('.') + 1);
    t.status = s;
    t.message = msg;
    return t;
  };
  TestResult fails = make("S.Fails", Status::Fail, "[rank 0] x != y");
  apply_expectations(fails, e);
  EXPECT_EQ(fails.status, Status::XFail);
  EXPECT_NE(fails.message.find("x != y"), std::string::npos) << fails.message;
  EXPECT_NE(fails.expectation.find("issue #1"), std::string::npos) << fails.expectation;

  TestResult passes = make("S.Passes", Status::Pass, "");
  apply_expectations(passes, e);
  EXPECT_EQ(passes.status, Status::XPass);
  EXPECT_TRUE(is_failure(passes.status));
  EXPECT_NE(passes.message.find("issue #2"), std::string::npos) << passes.message;

  TestResult crashes = make("S.Crashes", Status::Crash, "signal 11");
  apply_expectations(crashes, e);
  EXPECT_EQ(crashes.status, Status::XFail);

  TestResult skipped = make("S.Skipped", Status::Skip, "needs 2 GPUs");
  apply_expectations(skipped, e);
  EXPECT_EQ(skipped.status, Status::Skip);

  TestResult globbed = make("Glob.Anything", Status::Timeout, "deadline");
  apply_expectations(globbed, e);
  EXPECT_EQ(globbed.status, Status::XFail);

  TestResult unrelated = make("T.Other", Status::Fail, "real bug");
  apply_expectations(unrelated, e);
  EXPECT_EQ(unrelated.status, Status::Fail);
  EXPECT_TRUE(unrelated.expectation.empty());

  // Applying twice changes nothing (binaries and `tdc run` both apply them).
  TestResult again = fails;
  apply_expectations(again, e);
  EXPECT_EQ(again.status, Status::XFail);
  EXPECT_EQ(again.message, fails.message);
}

TEST_F(ResultsTest, BadExpectationsNameFileAndField) {
  fs::path p = dir_ / "expectations.json";
  spit(p, R"({"tests": {"S.T": {"status": "BROKEN"}}})");
  try {
    read_expectations(p);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(p.string()), std::string::npos) << m;
    EXPECT_NE(m.find("S.T"), std::string::npos) << m;
    EXPECT_NE(m.find("BROKEN"), std::string::npos) << m;
  }
}

// Reads `text` as a results file and returns the error message (empty if it was accepted).
std::string read_error(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
  try {
    read_results(p);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST_F(ResultsTest, CorruptOrIncompatibleResultsNameFileAndField) {
  fs::path p = dir_ / "results.json";
  json good = to_json(sample());

  std::string m = read_error(p, good.dump().substr(0, 100));  // truncated
  EXPECT_NE(m.find(p.string()), std::string::npos) << m;
  EXPECT_NE(m.find("not valid JSON"), std::string::npos) << m;

  json wrong_version = good;
  wrong_version["schema_version"] = 2;
  m = read_error(p, wrong_version.dump());
  EXPECT_NE(m.find(p.string()), std::string::npos) << m;
  EXPECT_NE(m.find("schema_version"), std::string::npos) << m;
  EXPECT_NE(m.find('2'), std::string::npos) << m;

  json bad_status = good;
  bad_status["tests"][3]["status"] = "PASSED";
  m = read_error(p, bad_status.dump());
  EXPECT_NE(m.find("tests[3].status"), std::string::npos) << m;
  EXPECT_NE(m.find("'PASSED'"), std::string::npos) << m;

  json bad_type = good;
  bad_type["tests"][0]["duration_s"] = "fast";
  m = read_error(p, bad_type.dump());
  EXPECT_NE(m.find("tests[0].duration_s"), std::string::npos) << m;
  EXPECT_NE(m.find("number"), std::string::npos) << m;

  json missing = good;
  missing["run_info"].erase("backend");
  m = read_error(p, missing.dump());
  EXPECT_NE(m.find("missing field 'run_info.backend'"), std::string::npos) << m;

  json bad_rank_status = good;
  bad_rank_status["tests"][2]["ranks"][0]["status"] = "passed";
  m = read_error(p, bad_rank_status.dump());
  EXPECT_NE(m.find("tests[2].ranks[0].status"), std::string::npos) << m;
  EXPECT_NE(m.find("'passed'"), std::string::npos) << m;

  json bad_rank = good;
  bad_rank["tests"][1]["ranks"][0]["signal"] = "SIGSEGV";
  m = read_error(p, bad_rank.dump());
  EXPECT_NE(m.find("tests[1].ranks[0].signal"), std::string::npos) << m;

  m = read_error(p, "[1, 2]");
  EXPECT_NE(m.find("must be a JSON object (value: [1,2])"), std::string::npos) << m;

  m = read_error(dir_ / "absent" / "results.json", "");  // cannot even create: open fails
  EXPECT_FALSE(m.empty());
}

TEST_F(ResultsTest, HostFacts) {
  std::string now = iso_now();
  ASSERT_EQ(now.size(), 20u) << now;  // 2025-01-02T03:04:05Z
  EXPECT_EQ(now[10], 'T');
  EXPECT_EQ(now.back(), 'Z');
  EXPECT_FALSE(hostname().empty());
}

}  // namespace
