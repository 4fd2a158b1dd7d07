// run_python_script and pytorch_side (pytorch_side.h).
#include "tdc/conformance/pytorch_side.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tdc/harness/harness.h"

namespace tdc::conformance {

PythonRun run_python_script(const std::string& script, const std::string& args, int limit_s) {
  const char* env = std::getenv("TDC_PYTHON");
  const std::string python = env && *env ? env : TDC_PYTHON_DEFAULT;
  PythonRun run;
  run.command = fmt::format("OMP_NUM_THREADS=1 timeout -k 10 {} '{}' '{}/{}' {} 2>&1", limit_s, python, TDC_SOURCE_DIR,
                            script, args);
  FILE* pipe = popen(run.command.c_str(), "r");
  if (!pipe) {
    run.output_tail = "popen failed";
    return run;
  }
  std::array<char, 4096> buf{};
  std::string output;
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe)) output.append(buf.data(), n);
  const int raw = pclose(pipe);
  run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  run.output_tail = output.size() > 6000 ? "..." + output.substr(output.size() - 6000) : output;
  return run;
}

bool pytorch_side(const std::string& script, const std::string& args, int limit_s) {
  // Every rank makes the same calls in the same order, so a per-process counter names the call.
  static int calls = 0;
  const std::string key = fmt::format("tdc_pytorch_side/{}", calls++);
  auto& ctx = harness::ctx();
  if (ctx.rank == 0) {
    const PythonRun run = run_python_script(script, args, limit_s);
    EXPECT_EQ(run.status, 0) << "PyTorch side failed" << (run.status == 124 ? " (time limit)" : "") << ": "
                             << run.command << "\n"
                             << run.output_tail;
    if (run.status == 0) std::printf("PyTorch side: %s\n%s\n", run.command.c_str(), run.output_tail.c_str());
    ctx.store->set(key, std::vector<uint8_t>{static_cast<uint8_t>(run.status == 0)});
  }
  harness::barrier();
  return ctx.store->get(key).at(0) == 1;
}

}  // namespace tdc::conformance
