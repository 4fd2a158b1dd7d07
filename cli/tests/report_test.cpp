// The report generator (cli/report/): the seed table, the matrix and its counts, the diff, flaky
// detection, parity files, escaping, and both renderers, on the fixture runs of
// cli/tests/fixtures/report (their README lists the statuses these tests rely on).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <cmath>

#include "report/html.h"
#include "report/log_excerpt.h"
#include "report/report.h"
#include "report/report_model.h"
#include "report/svg_plot.h"

namespace tdc::cli {
namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = TDC_REPORT_FIXTURES;
const fs::path kStatusMd = TDC_SEED_TABLE;

const SeedTable& seed() {
  static const SeedTable table = read_seed_table(kStatusMd);
  return table;
}

ReportInput fixture_input() {
  ReportInput in;
  in.seed = seed();
  in.runs.push_back(load_run(kFixtures / "run_a", "run 1"));
  in.runs.push_back(load_run(kFixtures / "run_b" / "results.json", "run 2"));
  in.parity.push_back(read_parity(kFixtures / "parity.json"));
  in.generated_at = "2026-11-23T12:00:00Z";
  return in;
}

const MatrixGroup& group(const Matrix& m, const std::string& cls) {
  for (const auto& g : m.groups)
    if (g.cls == cls) return g;
  throw std::runtime_error("no group " + cls);
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// ------------------------------------------------------------------ seed table

TEST(SeedTable, TheStatusFileListsTheHundredAndTwoSeedTests) {
  const auto& tests = seed().tests();
  ASSERT_EQ(tests.size(), 102u);
  std::map<std::string, int> per_file;
  std::set<std::string> ids;
  for (const auto& t : tests) {
    ++per_file[t.file];
    ids.insert(t.id());
  }
  EXPECT_EQ(ids.size(), 102u) << "a seed test is listed twice";
  // The file totals of the status file's "Totals" table.
  EXPECT_EQ(per_file["test_2d_composability.py"], 18);
  EXPECT_EQ(per_file["test_composability.py"], 13);
  EXPECT_EQ(per_file["test_fully_shard_extensions.py"], 5);
  EXPECT_EQ(per_file["test_fsdp_dsd.py"], 6);
  EXPECT_EQ(per_file["test_fsdp_core.py"], 60);
  EXPECT_EQ(per_file.size(), 5u);
}

TEST(SeedTable, ADeviceInstantiatedRowMatchesTheRunsDevice) {
  auto cuda = seed().find("ComposabilityTestCUDA.test_pp_ddp_ScheduleClass0_cuda");
  ASSERT_TRUE(cuda.has_value());
  EXPECT_EQ(seed().find("ComposabilityTestCPU.test_pp_ddp_ScheduleClass0_cpu"), cuda);
  EXPECT_FALSE(seed().find("ComposabilityTestCPU.test_pp_ddp_ScheduleClass0_cuda").has_value())
      << "class and test suffixes must name the same device";
  EXPECT_FALSE(seed().find("HarnessBasics.TwoRanks").has_value());
  EXPECT_TRUE(seed().find("TestFullyShard2DTraining.test_train_parity_2d_mlp").has_value());
}

TEST(SeedTable, VariantsAndOtherSectionsAreNotSeedTests) {
  SeedTable t = parse_seed_table(
      "## Legend\n| `PASS` | `passes` |\n## test_a.py\n| class | method |\n|---|---|\n| `A` | `t1` | x |\n"
      "### sub (1)\n| `B` | `t2` |\n## Variants (not counted)\n| `C` | `t3` |\n",
      "mem.md");
  ASSERT_EQ(t.tests().size(), 2u);
  EXPECT_EQ(t.tests()[0].id(), "A.t1");
  EXPECT_EQ(t.tests()[1].id(), "B.t2");
  EXPECT_EQ(t.tests()[1].file, "test_a.py");
  EXPECT_EQ(t.tests()[1].line, 8);
}

TEST(SeedTable, AMalformedRowIsAnErrorNamingTheLine) {
  try {
    parse_seed_table("## test_a.py\n| `A` | t1 |\n", "mem.md");
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("mem.md:2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_seed_table("# nothing here\n", "empty.md"), std::runtime_error);
}

// ------------------------------------------------------------------ matrix

TEST(ReportMatrix, CountsPassesPerClassAndOverTheSeed) {
  ReportInput in = fixture_input();
  Matrix m = build_matrix(in.runs, in.seed);
  EXPECT_EQ(m.seed_total, 102u);
  EXPECT_EQ(m.seed_passes, (std::vector<int>{4, 3}));
  EXPECT_EQ(m.seed_with_result, (std::vector<int>{6, 6}));
  EXPECT_EQ(m.seed_status_counts[0].at(kNotImplemented), 96);
  EXPECT_EQ(m.seed_status_counts[1].at("FLAKY"), 1);
  const MatrixGroup& training = group(m, "TestFullyShard2DTraining");
  EXPECT_EQ(training.rows.size(), 4u);
  EXPECT_EQ(training.passes, (std::vector<int>{2, 2}));
  EXPECT_EQ(training.rows[3].status(0), kNotImplemented);  // checkpoint_resume: in neither run
  // The CPU run fills the CUDA row; the CUDA class has 13 rows, one with a result.
  const MatrixGroup& comp = group(m, "ComposabilityTestCUDA");
  EXPECT_EQ(comp.rows.size(), 13u);
  EXPECT_EQ(comp.rows[0].status(0), "PASS");
  EXPECT_EQ(comp.rows[0].status(1), "TIMEOUT");
  // Tests outside the seed table come last, grouped by suite; a run without them shows NOT_RUN.
  const MatrixGroup& other = m.groups.back();
  EXPECT_EQ(other.file, "");
  EXPECT_EQ(other.cls, "HarnessBasics");
  EXPECT_EQ(other.rows.at(0).status(0), "PASS");
  EXPECT_EQ(other.rows.at(0).status(1), kNotRun);
}

// ------------------------------------------------------------------ diff and flaky

TEST(ReportDiff, SortsChangesIntoRegressionsNewPassesAndOtherChanges) {
  ReportInput in = fixture_input();
  Matrix m = build_matrix(in.runs, in.seed);
  std::map<ChangeKind, std::set<std::string>> got;
  for (const Change& c : diff_runs(m, 0, 1)) got[c.kind].insert(c.id);
  EXPECT_EQ(
      got[ChangeKind::Regression],
      (std::set<std::string>{"TestFullyShard2DTraining.test_train_parity_2d_transformer",
                             "TestFullyShardAllGatherExtensionsMultiProcess.test_all_gather_extensions_train_parity",
                             "ComposabilityTestCUDA.test_pp_ddp_ScheduleClass0_cuda"}));
  EXPECT_EQ(got[ChangeKind::NewPass],
            (std::set<std::string>{"TestFullyShard2DTraining.test_tp_with_fsdp_offloading",
                                   "TestFullyShardWithDistributedStateDict.test_1d_fsdp_get_model_state_dict"}));
  EXPECT_EQ(got[ChangeKind::StatusChange], (std::set<std::string>{"HarnessBasics.TwoRanks"}));
  // Backwards, the FAIL that became a PASS is a regression and nothing that was new is one.
  std::set<std::string> back;
  for (const Change& c : diff_runs(m, 1, 0))
    if (c.kind == ChangeKind::Regression) back.insert(c.id);
  EXPECT_EQ(back, (std::set<std::string>{"TestFullyShard2DTraining.test_tp_with_fsdp_offloading"}));
}

TEST(ReportDiff, ASameRunHasNoChanges) {
  ReportInput in = fixture_input();
  Matrix m = build_matrix(in.runs, in.seed);
  EXPECT_TRUE(diff_runs(m, 1, 1).empty());
}

TEST(ReportFlaky, FindsFlakyStatusAndMixedRepeatCounts) {
  ReportInput in = fixture_input();
  std::vector<FlakyTest> flaky = flaky_tests(in.runs);
  ASSERT_EQ(flaky.size(), 1u);
  EXPECT_EQ(flaky[0].run, 1u);
  EXPECT_EQ(flaky[0].id, "TestFullyShardAllGatherExtensionsMultiProcess.test_all_gather_extensions_train_parity");
  EXPECT_EQ(flaky[0].statuses, (std::map<std::string, int>{{"PASS", 2}, {"FAIL", 1}}));
  // Mixed counts are flaky whatever the status says; one status repeated is not.
  ReportRun run;
  harness::TestResult mixed, steady;
  mixed.id = "S.mixed";
  mixed.status = harness::Status::Fail;
  mixed.repeat_statuses = {{"FAIL", 1}, {"TIMEOUT", 1}};
  steady.id = "S.steady";
  steady.status = harness::Status::Fail;
  steady.repeat_statuses = {{"FAIL", 2}};
  run.results.tests = {steady, mixed};
  auto found = flaky_tests({run});
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].id, "S.mixed");
  EXPECT_EQ(found[0].index, 1);
}

// [Note: tests whose ranks need a process each]: a thread run whose tests partly forked says so in
// its Runs row; a run whose tests all used its launcher (or none: plain TESTs) says just that.
TEST(ReportRuns, TheLauncherSaysWhichTestsUsedAnother) {
  harness::RunResults r;
  r.run_info.launcher = "thread";
  auto test = [](const char* id, const char* launcher) {
    harness::TestResult t;
    t.id = id;
    t.launcher = launcher;
    return t;
  };
  r.tests = {test("S.a", "thread"), test("S.b", "fork"), test("S.c", "fork"), test("S.d", "none")};
  EXPECT_EQ(run_launcher_label(r), "thread (2 of 3 tests with fork)");
  r.tests.push_back(test("S.e", "spawn"));
  EXPECT_EQ(run_launcher_label(r), "thread (2 of 4 tests with fork, 1 of 4 tests with spawn)");
  r.tests = {test("S.a", "thread"), test("S.d", "none")};
  EXPECT_EQ(run_launcher_label(r), "thread");
  ReportInput in = fixture_input();
  const std::string md = render_markdown(in);
  EXPECT_NE(md.find("| " + in.runs[0].results.run_info.launcher + " |"), std::string::npos) << md.substr(0, 800);
}

// ------------------------------------------------------------------ parity

TEST(ReportParity, ReadsTheSampleFile) {
  ParityRun p = read_parity(kFixtures / "parity.json");
  ASSERT_EQ(p.scenarios.size(), 2u);
  EXPECT_EQ(p.scenarios[0].name, "ddp_mlp");
  EXPECT_EQ(p.scenarios[0].verdict, "PASS");
  EXPECT_EQ(p.scenarios[0].loss_tdc.size(), 5u);
  EXPECT_EQ(p.scenarios[1].verdict, "FAIL");
  EXPECT_TRUE(p.scenarios[1].has_max_param_rel_diff);
  EXPECT_EQ(p.scenarios[1].world_size, 4);
}

// [Note: scenario requires a release]: a scenario that this LibTorch cannot run is NOT_SUPPORTED,
// with its why and without charts (neither side ran).
TEST(ReportParity, NotSupportedScenarioShowsItsWhyWithoutCharts) {
  const fs::path f = fs::temp_directory_path() / ("tdc-report-ns-" + std::to_string(::getpid()) + ".json");
  std::ofstream(f) << R"json({"schema": "tdc-parity/1", "created": "2026-11-25T07:00:00Z", "machine": {},
    "scenarios": [{"name": "bf16_old", "description": "d", "world_size": 2, "recipe": "fsdp (dp 2)",
      "tolerance": {"rtol": 1e-6, "atol": 0, "why": "w"}, "verdict": "NOT_SUPPORTED",
      "message": "needs PyTorch >= 2.12 (this is 2.11.0): mse_loss backward",
      "loss": {"tdc": [], "pytorch": []}, "grad_norm": {"tdc": [], "pytorch": []},
      "max_rel_diff_per_step": [], "max_param_rel_diff": null}]})json";
  ReportInput in = fixture_input();
  in.parity = {read_parity(f)};
  fs::remove(f);
  ASSERT_EQ(in.parity[0].scenarios[0].verdict, "NOT_SUPPORTED");
  const std::string html = render_html(in);
  const size_t at = html.find("data-scenario=\"bf16_old\"");
  ASSERT_NE(at, std::string::npos);
  const std::string block = html.substr(at, html.find("</div>", at) - at);
  EXPECT_NE(block.find("badge NOT_SUPPORTED"), std::string::npos) << block;
  EXPECT_NE(block.find("needs PyTorch &gt;= 2.12 (this is 2.11.0)"), std::string::npos) << block;
  EXPECT_EQ(block.find("loss-chart"), std::string::npos) << "a scenario that did not run has no curve";
}

TEST(ReportParity, ErrorsNameTheFileAndTheField) {
  fs::path dir = fs::temp_directory_path() / ("tdc-report-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto expect_error = [&](const std::string& text, const std::string& want) {
    fs::path f = dir / "p.json";
    std::ofstream(f) << text;
    try {
      read_parity(f);
      ADD_FAILURE() << "no error for " << text;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(f.string()), std::string::npos) << e.what();
    }
  };
  expect_error(R"({"schema":"tdc-parity/2","scenarios":[]})",
               "field 'schema': is not supported (this tdc reads 'tdc-parity/1') (value: \"tdc-parity/2\")");
  expect_error(R"({"schema":"tdc-parity/1","scenarios":[{"name":"a","verdict":"MAYBE"}]})",
               "field 'scenarios[0].verdict': unknown value (known: PASS, FAIL, ERROR, NOT_SUPPORTED)");
  expect_error(R"({"schema":"tdc-parity/1","scenarios":[{"name":"a","verdict":"PASS","loss":{"tdc":[1,"x"]}}]})",
               "scenarios[0].loss.tdc[1]");
  expect_error("{not json", "not valid JSON");
  fs::remove_all(dir);
}

TEST(ReportSvg, DrawsOnePolylinePerSeriesWithItsPoints) {
  std::string svg = line_chart_svg("loss", "loss", {{"tdc", "tdc", {1, 2, 3}}, {"PyTorch", "pytorch", {1, NAN, 2.5}}},
                                   "loss-chart", "data-x=\"1\"");
  EXPECT_EQ(count_of(svg, "<polyline"), 2u);
  EXPECT_NE(svg.find("class=\"series tdc\" data-points=\"3\""), std::string::npos) << svg;
  EXPECT_NE(svg.find("class=\"series pytorch\" data-points=\"2\""), std::string::npos) << svg;
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  // Without data the chart says so instead of drawing.
  std::string empty = line_chart_svg("loss", "loss", {{"tdc", "tdc", {}}}, "loss-chart", "");
  EXPECT_EQ(count_of(empty, "<polyline"), 0u);
  EXPECT_NE(empty.find("no data"), std::string::npos);
}

// ------------------------------------------------------------------ rendering

TEST(ReportHtml, EscapesEveryCharacterThatCouldOpenMarkup) {
  EXPECT_EQ(html_escape("<a href=\"x\">&'</a>"), "&lt;a href=&quot;x&quot;&gt;&amp;&apos;&lt;/a&gt;");
  EXPECT_EQ(html_escape("plain text"), "plain text");
}

TEST(ReportHtml, MessagesAreEscapedAndLinkedFromTheirCells) {
  ReportInput in = fixture_input();
  std::string html = render_html(in);
  EXPECT_EQ(html.find("<script>document.title"), std::string::npos) << "a message's markup reached the page";
  EXPECT_NE(html.find("&lt;tdc&gt; 0.512 &amp; &quot;pytorch&quot; 0.498 &lt;/pre&gt;&lt;script&gt;"),
            std::string::npos);
  EXPECT_EQ(count_of(html, "<script>"), 1u) << "only the page's own script";
  // run 2's FAIL (its tests[1]) links to its block, which holds the log excerpt.
  EXPECT_NE(html.find("<a href=\"#msg-r1-t1\">FAIL</a>"), std::string::npos);
  size_t block = html.find("id=\"msg-r1-t1\"");
  ASSERT_NE(block, std::string::npos);
  EXPECT_NE(html.find("step 3 losses: tdc 0.512 pytorch 0.498 (fixture log line)", block), std::string::npos);
  // Self-contained: no external resource.
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(count_of(html, "<svg"), 4u) << "a loss and a gradient-norm chart per parity scenario";
  EXPECT_NE(html.find("id=\"seed-total\" class=\"big\" data-count=\"102\""), std::string::npos);
}

TEST(ReportMarkdown, HasTheSectionsAndKeepsTablesIntact) {
  ReportInput in = fixture_input();
  std::string md = render_markdown(in);
  for (const char* heading : {"## Runs", "## Seed tests", "## Diff: run 1 → run 2", "### Regressions", "## Flaky tests",
                              "## Parity with PyTorch", "## Tests × runs", "## Messages"})
    EXPECT_NE(md.find(heading), std::string::npos) << heading;
  EXPECT_NE(md.find("**102** seed tests"), std::string::npos);
  EXPECT_NE(md.find("- run 2: **3 / 102** pass"), std::string::npos);
  EXPECT_NE(md.find("| **TestFullyShard2DTraining** | **2/4** | **2/4** |"), std::string::npos);
  EXPECT_NE(md.find("- `TestFullyShard2DTraining.test_train_parity_2d_transformer`: PASS → FAIL"), std::string::npos);
  EXPECT_NE(md.find("| `test_pp_ddp_ScheduleClass0_cuda` | PASS | TIMEOUT |"), std::string::npos);
  EXPECT_NE(md.find("| fsdp2_tp_mlp | **FAIL** |"), std::string::npos);
  // Every table line has the same number of unescaped pipes as its header.
  std::istringstream lines(md);
  std::string line;
  size_t expected = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("|", 0) != 0) {
      expected = 0;
      continue;
    }
    size_t pipes = 0;
    for (size_t i = 0; i < line.size(); ++i) pipes += line[i] == '|' && (i == 0 || line[i - 1] != '\\');
    if (expected == 0) expected = pipes;
    EXPECT_EQ(pipes, expected) << line;
  }
}

TEST(ReportFiles, WritesBothFilesAndLoadsADirectoryOrAFile) {
  fs::path dir = fs::temp_directory_path() / ("tdc-report-out-" + std::to_string(::getpid()));
  ReportFiles f = write_report(fixture_input(), dir);
  EXPECT_GT(fs::file_size(f.html), 10000u);
  EXPECT_GT(fs::file_size(f.markdown), 3000u);
  EXPECT_FALSE(fs::exists(dir / "report.html.tmp"));
  fs::remove_all(dir);
  EXPECT_THROW(load_run(kFixtures, "x"), std::runtime_error);  // a directory without results.json
  EXPECT_THROW(load_run(kFixtures / "nosuch.json", "x"), std::runtime_error);
}

TEST(ReportLogs, IndexesTheLogThatRanEachTest) {
  auto logs = index_logs(kFixtures / "run_b" / "logs");
  ASSERT_EQ(logs.count("TestFullyShard2DTraining.test_train_parity_2d_transformer"), 1u);
  std::string excerpt = log_excerpt(logs.at("TestFullyShard2DTraining.test_train_parity_2d_transformer"),
                                    "TestFullyShard2DTraining.test_train_parity_2d_transformer", 40);
  EXPECT_EQ(excerpt.rfind("[ RUN      ] TestFullyShard2DTraining.test_train_parity_2d_transformer", 0), 0u) << excerpt;
  EXPECT_NE(excerpt.find("[  FAILED  ]"), std::string::npos);
  EXPECT_EQ(excerpt.find("test_tp_with_fsdp_offloading"), std::string::npos) << "the next test is not part of it";
  EXPECT_TRUE(adds_to(excerpt, "loss mismatch"));
  EXPECT_EQ(index_logs(kFixtures / "run_a" / "logs").size(), 0u);
}

}  // namespace
}  // namespace tdc::cli
