// The child harness of the self-tests (child_harness.h).
#include "child_harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>

#include <gtest/gtest.h>

namespace tdc_selftest {

using namespace tdc::harness;

std::string self_dir() { return std::filesystem::read_symlink("/proc/self/exe").parent_path(); }

std::string fresh_dir(const std::string& what) {
  std::string t =
      (std::filesystem::temp_directory_path() / ("tdc-selftest-" + what + "-" + std::string(6, 'X'))).string();
  std::vector<char> b(t.begin(), t.end());
  b.push_back(0);
  if (!mkdtemp(b.data())) throw std::runtime_error("mkdtemp failed");
  return b.data();
}

std::vector<int> processes_with_token(const std::string& token) {
  std::vector<int> pids;
  const std::string needle = "TDC_SELFTEST_TOKEN=" + token;
  for (auto& e : std::filesystem::directory_iterator("/proc")) {
    std::string name = e.path().filename();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    std::ifstream f(e.path() / "environ", std::ios::binary);
    std::string env((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (env.find(needle) != std::string::npos) {
      // A zombie is already dead; only count live processes.
      std::ifstream st(e.path() / "stat");
      std::string stat((std::istreambuf_iterator<char>(st)), std::istreambuf_iterator<char>());
      auto rp = stat.rfind(')');
      if (rp != std::string::npos && rp + 2 < stat.size() && stat[rp + 2] == 'Z') continue;
      pids.push_back(std::stoi(name));
    }
  }
  return pids;
}

ChildRun run_child(const std::string& filter, const ChildOptions& o) {
  ChildRun run;
  std::string work = fresh_dir("child");
  run.remove_work = std::shared_ptr<void>(nullptr, [work](void*) {
    std::error_code ignored;
    std::filesystem::remove_all(work, ignored);
  });
  run.tmpdir = work + "/tmp";
  std::filesystem::create_directory(run.tmpdir);
  run.token = std::to_string(getpid()) + "-" + std::to_string(std::random_device{}());
  std::string results = work + "/results.json";
  int out[2];
  if (pipe(out) != 0) throw std::runtime_error("pipe");
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(out[1], 2);
    close(out[0]);
    setenv("TMPDIR", run.tmpdir.c_str(), 1);
    setenv("TDC_SELFTEST_TOKEN", run.token.c_str(), 1);
    // The cases test the harness, not a backend: they run on Gloo and CPU whatever this run's
    // --backend and --device (under NCCL on one GPU their multi-rank cases would all skip).
    setenv("TDC_BACKEND", "gloo", 1);
    setenv("TDC_DEVICE", "cpu", 1);
    for (auto& kv : o.env) putenv(strdup(kv.c_str()));
    std::vector<std::string> args = {self_dir() + "/" + o.binary, "--gtest_filter=" + filter,
                                     "--tdc_results=" + results};
    args.insert(args.end(), o.args.begin(), o.args.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  int status = 0;
  bool interrupted = false;
  for (;;) {
    char buf[4096];
    ssize_t n;
    while ((n = read(out[0], buf, sizeof buf)) > 0) run.output.append(buf, n);
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (o.interrupt_after_s > 0 && !interrupted && el > o.interrupt_after_s) {
      kill(pid, SIGTERM);
      interrupted = true;
    }
    if (el > 600) {  // the self-test's own safety net, far beyond every deadline used here
      kill(pid, SIGKILL);
    }
    usleep(5000);
  }
  char buf[4096];
  ssize_t n;
  while ((n = read(out[0], buf, sizeof buf)) > 0) run.output.append(buf, n);
  close(out[0]);
  run.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (std::filesystem::exists(results)) run.results = read_results(results);
  return run;
}

const TestResult& only_test(const ChildRun& r) {
  if (r.results.tests.size() != 1)
    throw std::runtime_error("expected one test result, got " + std::to_string(r.results.tests.size()) +
                             "; child output:\n" + r.output);
  return r.results.tests[0];
}

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

void expect_clean(const ChildRun& r) {
  // Ranks are SIGKILLed and reaped before the child harness exits; allow a moment anyway.
  std::vector<int> left;
  for (int i = 0; i < 50; ++i) {
    left = processes_with_token(r.token);
    if (left.empty()) break;
    usleep(20000);
  }
  EXPECT_TRUE(left.empty()) << "orphan processes: " << left.size();
  for (int pid : left) kill(pid, SIGKILL);
  std::vector<std::string> leftovers;
  for (auto& e : std::filesystem::directory_iterator(r.tmpdir)) leftovers.push_back(e.path().filename());
  EXPECT_TRUE(leftovers.empty()) << "left in TMPDIR: " << (leftovers.empty() ? "" : leftovers[0]);
}

ChildRun expect_outcome(const std::string& test, const Expected& e, const ChildOptions& o) {
  ChildRun r = run_child(test, o);
  const TestResult& t = only_test(r);
  EXPECT_EQ(to_string(t.status), std::string(to_string(e.status))) << t.message << "\n" << r.output;
  for (auto& m : e.in_message) EXPECT_TRUE(contains(t.message, m)) << "'" << m << "' not in:\n" << t.message;
  if (e.when == When::Prompt) {
    EXPECT_LT(t.duration_s, e.deadline_s / 2)
        << test << ": reported after " << t.duration_s << " s, deadline " << e.deadline_s << " s";
  } else {
    EXPECT_GE(t.duration_s, e.deadline_s) << test << " timed out before its deadline";
    EXPECT_LT(t.duration_s, 2 * e.deadline_s + e.stacks_budget_s)
        << test << ": reported after " << t.duration_s << " s, deadline " << e.deadline_s << " s";
  }
  EXPECT_EQ(r.exit_code, is_failure(e.status) ? 1 : 0) << r.output;
  expect_clean(r);
  return r;
}

void expect_status(const char* test, Status status, std::vector<std::string> in_message) {
  expect_outcome(std::string("MustFail.") + test, {status, std::move(in_message)});
}
void expect_timeout(const char* test, std::vector<std::string> in_message, double deadline_s) {
  expect_outcome(std::string("MustFail.") + test,
                 {Status::Timeout, std::move(in_message), When::AtDeadline, deadline_s});
}
std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

void expect_location(const TestResult& t, const std::string& what) {
  ASSERT_FALSE(t.file.empty()) << t.id << " has no file";
  EXPECT_TRUE(t.file.ends_with("mustfail_cases.cpp")) << t.file;
  std::ifstream in(t.file);
  std::string line;
  for (int n = 0; n < t.line && std::getline(in, line);) ++n;
  EXPECT_TRUE(contains(line, what)) << t.file << ":" << t.line << " is '" << line << "', not '" << what << "'";
}

std::string frame_location(const TestResult& t, const std::string& text) {
  std::ifstream in(t.file);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n)
    if (n >= t.line && contains(line, text)) return "at tests/mustfail_cases.cpp:" + std::to_string(n);
  ADD_FAILURE() << "'" << text << "' is not in " << t.file;
  return "(not found)";
}

}  // namespace tdc_selftest
