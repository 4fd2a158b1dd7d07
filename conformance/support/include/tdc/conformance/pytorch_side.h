// The PyTorch side of an interop or parity test: a script of this source tree run by the venv's
// python (TDC_PYTHON, else the python CMake configured) on rank 0 while the other ranks wait.
#pragma once

#include <string>

namespace tdc::conformance {

struct PythonRun {
  int status = -1;  // exit status; 124: stopped after the time limit
  std::string command;
  std::string output_tail;  // the last 6000 characters of stdout and stderr together
};

// Runs `<python> <source>/<script> <args>` (args already quoted for the shell) with
// OMP_NUM_THREADS=1, stopped after limit_s seconds.
PythonRun run_python_script(const std::string& script, const std::string& args, int limit_s);

// Collective over the test's ranks: rank 0 runs the script (run_python_script) and reports a
// failure with the command and the output's tail as a GoogleTest failure; every rank returns
// whether it succeeded.
bool pytorch_side(const std::string& script, const std::string& args, int limit_s);

}  // namespace tdc::conformance
