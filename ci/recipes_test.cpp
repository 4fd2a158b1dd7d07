// tdc_ci_recipes_test: the CI recipes in ci/ are complete and do what docs/plugging-in.md
// § CI recipes says. Both YAML files are parsed with yaml-cpp and their structure checked (GitHub
// Actions: triggers, inputs, cache, setup, the job script, upload-artifact always; GitLab: stages,
// cache, script, artifacts with the JUnit report). Then the job script runs exactly as the
// recipes call it, on this build, once for a passing selection and several times for runs that
// must fail the job.
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

namespace {

namespace fs = std::filesystem;

const fs::path kSource = TDC_SOURCE_DIR;
const fs::path kTdcCli = TDC_CLI_PATH;
const fs::path kWork = TDC_CI_WORK_DIR;
// One fast conformance test (about 0.2 s): the job's passing run.
const std::string kFastTest = "TestFullyShardAllGatherExtensionsMultiThread.test_all_gather_extension_hsdp_mesh";
// The artifacts both recipes upload, relative to the job's OUT directory.
const std::vector<std::string> kArtifacts = {"results.json", "junit.xml", "report.html", "logs/"};
// The commands both recipes run; tdc_src/ is where they clone tdc.
const std::vector<std::string> kJobCommands = {"ci/conformance-job.sh setup", "ci/conformance-job.sh run"};

// ------------------------------------------------------------------ YAML helpers

YAML::Node load(const std::string& name) {
  fs::path p = kSource / "ci" / name;
  if (!fs::exists(p)) throw std::runtime_error("recipe '" + p.string() + "' does not exist");
  return YAML::LoadFile(p.string());  // throws YAML::ParserException naming line and column
}

std::string scalar(const YAML::Node& n, const std::string& what) {
  if (!n || !n.IsScalar()) throw std::runtime_error(what + ": expected a string");
  return n.Scalar();
}

// A block scalar of lines ("a\nb\n") or a YAML list, as its lines.
std::vector<std::string> lines_of(const YAML::Node& n, const std::string& what) {
  std::vector<std::string> out;
  if (n && n.IsSequence()) {
    for (const auto& item : n) out.push_back(scalar(item, what + " item"));
    return out;
  }
  std::istringstream in(scalar(n, what));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  for (const auto& x : v)
    if (x == s) return true;
  return false;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// Lines of a run: / script: entry that call the job script, with the tdc clone's prefix removed.
std::vector<std::string> job_commands(const std::vector<std::string>& lines, const std::string& tdc_src) {
  std::vector<std::string> out;
  for (const auto& line : lines)
    if (line.find("conformance-job.sh") != std::string::npos && !starts_with(line, "#")) {
      EXPECT_TRUE(starts_with(line, tdc_src + "/")) << "'" << line << "' does not call the script in " << tdc_src;
      out.push_back(starts_with(line, tdc_src + "/") ? line.substr(tdc_src.size() + 1) : line);
    }
  return out;
}

// ------------------------------------------------------------------ running the job script

struct JobRun {
  int code = -1;
  std::string output;
  std::string verdict;  // the last line that starts with "conformance-job: "
};

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `command` (a recipe's line, relative to the tdc tree) with `env` and none of the job's
// inputs inherited from the environment; without $TDC_BUILD, tdc-cli runs the binaries of its own
// build directory.
JobRun run_job(const std::string& command, const std::map<std::string, std::string>& env) {
  std::string cmd = "cd " + quote(kWork.string()) + " && env";
  for (const char* var : {"IMPL_LIB", "BACKEND", "BACKEND_LIB", "REPEAT", "OUT", "FILTER", "EXPECTATIONS",
                          "TDC_RUN_ARGS", "TDC_CLI", "TDC_BUILD", "GITHUB_STEP_SUMMARY"})
    cmd += std::string(" -u ") + var;
  for (const auto& [k, v] : env) cmd += " " + k + "=" + quote(v);
  cmd += " " + quote((kSource / command.substr(0, command.find(' '))).string()) + command.substr(command.find(' '));
  cmd += " 2>&1";
  JobRun r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed for: " + cmd);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
  int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);)
    if (starts_with(line, "conformance-job: ")) r.verdict = line;
  return r;
}

fs::path fresh_dir(const std::string& name) {
  fs::path d = kWork / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// The job's run command as the recipes spell it (checked equal in both by RecipesTest).
const std::string kRunCommand = kJobCommands[1];

// ------------------------------------------------------------------ GitHub Actions

class GithubActionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    doc_ = load("github-actions.yml");
    ASSERT_TRUE(doc_.IsMap()) << "github-actions.yml is not a mapping";
    tdc_src_ = scalar(doc_["env"]["TDC_SRC"], "env.TDC_SRC");
    out_ = scalar(doc_["env"]["OUT"], "env.OUT");
    const YAML::Node jobs = doc_["jobs"];
    ASSERT_TRUE(jobs && jobs.IsMap() && jobs.size() == 1) << "expected one job under jobs:";
    job_ = jobs.begin()->second;
    steps_ = job_["steps"];
    ASSERT_TRUE(steps_ && steps_.IsSequence()) << "the job has no steps: list";
  }
  // Index of the first step whose `uses:` starts with `action@`, or -1.
  int step_using(const std::string& action, int from = 0) const {
    for (int i = from; i < static_cast<int>(steps_.size()); ++i)
      if (steps_[i]["uses"] && starts_with(steps_[i]["uses"].Scalar(), action + "@")) return i;
    return -1;
  }
  // Index of the step whose `run:` calls the job script with `command`, or -1.
  int step_running(const std::string& command) const {
    for (int i = 0; i < static_cast<int>(steps_.size()); ++i)
      if (steps_[i]["run"] && contains(job_commands(lines_of(steps_[i]["run"], "run"), tdc_src_), command)) return i;
    return -1;
  }

  YAML::Node doc_, job_, steps_;
  std::string tdc_src_, out_;
};

TEST_F(GithubActionsTest, TriggersAndInputsReachTheJobScript) {
  // yaml-cpp reads YAML 1.2, where `on` is a string key (YAML 1.1 would read it as true).
  const YAML::Node on = doc_["on"];
  ASSERT_TRUE(on && on.IsMap()) << "no on: mapping";
  for (const char* trigger : {"push", "pull_request", "workflow_dispatch"})
    EXPECT_TRUE(on[trigger].IsDefined()) << "on: lacks " << trigger;
  const YAML::Node inputs = on["workflow_dispatch"]["inputs"];
  ASSERT_TRUE(inputs && inputs.IsMap()) << "workflow_dispatch has no inputs";
  // input -> the job script's environment variable
  for (const auto& [input, var] : std::map<std::string, std::string>{
           {"impl_lib", "IMPL_LIB"}, {"backend", "BACKEND"}, {"backend_lib", "BACKEND_LIB"}, {"repeat", "REPEAT"}}) {
    EXPECT_TRUE(inputs[input]["description"].IsDefined()) << "input " << input << " is missing or undescribed";
    std::string value = scalar(doc_["env"][var], "env." + var);
    EXPECT_NE(value.find("inputs." + input), std::string::npos) << "env." << var << " = '" << value << "'";
  }
  for (const char* var : {"TDC_REPO", "TDC_REF"}) EXPECT_TRUE(doc_["env"][var].IsDefined()) << "env lacks " << var;
}

TEST_F(GithubActionsTest, ChecksOutCachesSetsUpRunsAndUploadsAlways) {
  int checkout = step_using("actions/checkout");
  int cache_venv = -1, cache_build = -1, cache_ccache = -1;
  for (int i = step_using("actions/cache"); i >= 0; i = step_using("actions/cache", i + 1)) {
    const YAML::Node with = steps_[i]["with"];
    auto paths = lines_of(with["path"], "cache path");
    std::string key = scalar(with["key"], "cache key");
    EXPECT_NE(key.find("torch${{ steps.tdc.outputs.torch }}"), std::string::npos) << "key '" << key << "'";
    if (contains(paths, tdc_src_ + "/.venv")) cache_venv = i;
    if (contains(paths, ".ccache")) cache_ccache = i;
    if (contains(paths, tdc_src_ + "/build")) {
      cache_build = i;
      EXPECT_NE(key.find("CMakeLists.txt"), std::string::npos) << "build key '" << key << "' ignores CMake files";
    }
  }
  int setup = step_running(kJobCommands[0]);
  int run = step_running(kJobCommands[1]);
  int upload = step_using("actions/upload-artifact");
  ASSERT_GE(checkout, 0) << "no actions/checkout step";
  ASSERT_GE(cache_venv, 0) << "no actions/cache step for " << tdc_src_ << "/.venv";
  ASSERT_GE(cache_build, 0) << "no actions/cache step for " << tdc_src_ << "/build";
  ASSERT_GE(cache_ccache, 0) << "no actions/cache step for .ccache ([Note: ccache])";
  EXPECT_EQ(scalar(doc_["env"]["CCACHE_DIR"], "env.CCACHE_DIR"), "${{ github.workspace }}/.ccache")
      << "ccache must use the cached directory";
  ASSERT_GE(setup, 0) << "no step runs " << tdc_src_ << "/" << kJobCommands[0];
  ASSERT_GE(run, 0) << "no step runs " << tdc_src_ << "/" << kJobCommands[1];
  ASSERT_GE(upload, 0) << "no actions/upload-artifact step";
  EXPECT_LT(checkout, cache_venv);
  EXPECT_LT(std::max({cache_venv, cache_build, cache_ccache}), setup) << "caches must be restored before the setup";
  EXPECT_LT(setup, run);
  EXPECT_LT(run, upload);

  const YAML::Node up = steps_[upload];
  EXPECT_NE(scalar(up["if"], "upload if").find("always()"), std::string::npos) << "upload must run on failure too";
  auto paths = lines_of(up["with"]["path"], "upload path");
  for (const auto& a : kArtifacts) EXPECT_TRUE(contains(paths, out_ + "/" + a)) << "upload lacks " << out_ << "/" << a;
}

// ------------------------------------------------------------------ GitLab CI

class GitlabCiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    doc_ = load("gitlab-ci.yml");
    ASSERT_TRUE(doc_.IsMap()) << "gitlab-ci.yml is not a mapping";
    tdc_src_ = scalar(doc_["variables"]["TDC_SRC"], "variables.TDC_SRC");
    out_ = scalar(doc_["variables"]["OUT"], "variables.OUT");
    for (const auto& entry : doc_)
      if (entry.second.IsMap() && entry.second["script"]) jobs_.push_back(entry.second);
    ASSERT_EQ(jobs_.size(), 1u) << "expected one job (a mapping with script:)";
    job_ = jobs_[0];
  }
  YAML::Node doc_, job_;
  std::vector<YAML::Node> jobs_;
  std::string tdc_src_, out_;
};

TEST_F(GitlabCiTest, StageVariablesAndScript) {
  auto stages = lines_of(doc_["stages"], "stages");
  EXPECT_TRUE(contains(stages, scalar(job_["stage"], "stage"))) << "the job's stage is not in stages:";
  for (const char* var : {"TDC_REPO", "TDC_REF", "IMPL_LIB", "BACKEND", "BACKEND_LIB", "REPEAT"})
    EXPECT_TRUE(doc_["variables"][var].IsDefined()) << "variables: lacks " << var;
  EXPECT_EQ(job_commands(lines_of(job_["script"], "script"), tdc_src_), kJobCommands);
}

TEST_F(GitlabCiTest, CachesVenvBuildAndCcache) {
  const YAML::Node cache = job_["cache"];
  ASSERT_TRUE(cache) << "the job has no cache:";
  std::vector<std::string> paths;
  auto add = [&](const YAML::Node& c) {
    EXPECT_TRUE(c["key"].IsDefined()) << "a cache without key:";
    for (const auto& p : lines_of(c["paths"], "cache paths")) paths.push_back(p);
  };
  if (cache.IsSequence()) {
    for (const auto& c : cache) add(c);
  } else {
    add(cache);
  }
  EXPECT_TRUE(contains(paths, tdc_src_ + "/.venv")) << "cache lacks " << tdc_src_ << "/.venv";
  EXPECT_TRUE(contains(paths, tdc_src_ + "/build")) << "cache lacks " << tdc_src_ << "/build";
  EXPECT_TRUE(contains(paths, ".ccache")) << "cache lacks .ccache ([Note: ccache])";
  EXPECT_EQ(scalar(doc_["variables"]["CCACHE_DIR"], "variables.CCACHE_DIR"), "$CI_PROJECT_DIR/.ccache")
      << "ccache must use the cached directory";
}

TEST_F(GitlabCiTest, ArtifactsAlwaysWithJunitReport) {
  const YAML::Node art = job_["artifacts"];
  ASSERT_TRUE(art && art.IsMap()) << "the job has no artifacts:";
  EXPECT_EQ(scalar(art["when"], "artifacts.when"), "always");
  auto paths = lines_of(art["paths"], "artifacts.paths");
  for (const auto& a : kArtifacts)
    EXPECT_TRUE(contains(paths, out_ + "/" + a)) << "artifacts lack " << out_ << "/" << a;
  EXPECT_EQ(scalar(art["reports"]["junit"], "artifacts.reports.junit"), out_ + "/junit.xml");
}

// ------------------------------------------------------------------ both

TEST(RecipesTest, BothRunTheSameJobScriptCommands) {
  YAML::Node gh = load("github-actions.yml"), gl = load("gitlab-ci.yml");
  std::string gh_src = scalar(gh["env"]["TDC_SRC"], "env.TDC_SRC");
  std::vector<std::string> gh_cmds;
  for (const auto& step : gh["jobs"].begin()->second["steps"])
    if (step["run"])
      for (const auto& c : job_commands(lines_of(step["run"], "run"), gh_src)) gh_cmds.push_back(c);
  EXPECT_EQ(gh_cmds, kJobCommands);
  EXPECT_EQ(scalar(gh["env"]["OUT"], "env.OUT"), scalar(gl["variables"]["OUT"], "variables.OUT"));
  fs::path script = kSource / "ci" / "conformance-job.sh";
  ASSERT_TRUE(fs::exists(script)) << script;
  EXPECT_NE(fs::status(script).permissions() & fs::perms::owner_exec, fs::perms::none)
      << script << " is not executable";
}

// ------------------------------------------------------------------ the job script, as the recipes run it

TEST(JobScriptTest, PassingRunLeavesArtifactsAndExitsZero) {
  fs::path out = fresh_dir("pass");
  JobRun r = run_job(kRunCommand, {{"TDC_CLI", kTdcCli.string()}, {"OUT", out.string()}, {"FILTER", kFastTest}});
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(starts_with(r.verdict, "conformance-job: PASS: 1 tests (PASS 1)")) << r.verdict;
  for (const char* f : {"results.json", "junit.xml", "report.html", "report.md", "logs", "verdict.txt"})
    EXPECT_TRUE(fs::exists(out / f)) << out / f << " missing";
}

TEST(JobScriptTest, FailureStatusFailsTheJob) {
  // The fast test declared a known failure: it passes, so it is XPASS, a failure status.
  fs::path out = fresh_dir("xpass");
  fs::path expectations = out.parent_path() / "xpass-expectations.json";
  std::ofstream(expectations) << R"({"tests": {")" << kFastTest
                              << R"(": {"status": "FAIL", "reason": "tdc_ci_recipes_test: must fail"}}})"
                              << "\n";
  JobRun r = run_job(kRunCommand + " --expectations " + expectations.string(),
                     {{"TDC_CLI", kTdcCli.string()}, {"OUT", out.string()}, {"FILTER", kFastTest}});
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(starts_with(r.verdict, "conformance-job: FAIL: 1 of 1 tests failed (XPASS 1")) << r.verdict;
  for (const char* f : {"results.json", "junit.xml", "report.html"})
    EXPECT_TRUE(fs::exists(out / f)) << out / f << " missing: artifacts must exist on failure too";
}

TEST(JobScriptTest, NoTestRunFailsTheJob) {
  fs::path out = fresh_dir("none");
  JobRun r = run_job(kRunCommand, {{"TDC_CLI", kTdcCli.string()}, {"OUT", out.string()}, {"FILTER", "NoSuch.Test"}});
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(starts_with(r.verdict, "conformance-job: FAIL: no test ran")) << r.verdict;
}

// The verdict reads results.json itself: a tdc that exits 0 over a failing test still fails the job.
TEST(JobScriptTest, ResultsDecideEvenWhenTdcExitsZero) {
  fs::path out = fresh_dir("lying");
  fs::path fake = out.parent_path() / "lying-tdc.sh";
  std::ofstream(fake) << "#!/bin/sh\n"
                         "# a tdc that writes one TIMEOUT and one PASS and exits 0; $3 is --out's value\n"
                         "printf '%s\\n' '{\"tests\": [{\"id\": \"A.a\", \"status\": \"TIMEOUT\", \"ranks\": "
                         "[{\"status\": \"PASS\"}]}, {\"id\": \"A.b\", \"status\": \"PASS\"}]}' > \"$3/results.json\"\n"
                         "exit 0\n";
  JobRun r = run_job(kRunCommand, {{"TDC_CLI", "sh " + fake.string()}, {"OUT", out.string()}});
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(starts_with(r.verdict, "conformance-job: FAIL: 1 of 2 tests failed (PASS 1, TIMEOUT 1; tdc run exit 0)"))
      << r.verdict;
}

// The recipes' inputs arrive as environment variables; each becomes its `tdc run` option.
TEST(JobScriptTest, InputsBecomeTdcRunOptions) {
  fs::path out = fresh_dir("inputs");
  fs::path fake = out.parent_path() / "recording-tdc.sh";
  std::ofstream(fake)
      << "#!/bin/sh\n"
         "# a tdc that records its arguments and writes one PASS; $3 is --out's value\n"
         "echo \"$*\" > \"$3/args.txt\"\n"
         "printf '%s\\n' '{\"tests\": [{\"id\": \"A.a\", \"status\": \"PASS\"}]}' > \"$3/results.json\"\n";
  JobRun r = run_job(kRunCommand, {{"TDC_CLI", "sh " + fake.string()},
                                   {"OUT", out.string()},
                                   {"IMPL_LIB", "/x/libimpl.so"},
                                   {"BACKEND", "mybackend"},
                                   {"BACKEND_LIB", "/x/libbackend.so"},
                                   {"REPEAT", "3"},
                                   {"TDC_RUN_ARGS", "--timeout 30"}});
  EXPECT_EQ(r.code, 0) << r.output;
  std::ifstream in(out / "args.txt");
  std::string args((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(args, "run --out " + out.string() +
                      " --check --impl /x/libimpl.so --backend mybackend --backend-lib /x/libbackend.so --repeat 3"
                      " --timeout 30\n");
}

TEST(JobScriptTest, UnknownArgumentIsAUsageError) {
  JobRun r = run_job(kRunCommand + " --bogus", {{"TDC_CLI", kTdcCli.string()}, {"OUT", fresh_dir("usage").string()}});
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("unknown argument '--bogus'"), std::string::npos) << r.output;
}

}  // namespace
