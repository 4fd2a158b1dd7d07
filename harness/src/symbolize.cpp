// Frames a person can read: backtrace_symbols' "bin(+0x562c7)" frames named with their function
// and file:line by addr2line ([Note: frames with file:line]); and the one way the harness runs a
// helper program (addr2line, gdb) with a time budget.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "internal.h"

namespace tdc::harness::detail {

ProgramOutput run_program(const std::vector<std::string>& argv, double budget_s) {
  ProgramOutput r;
  int out[2];
  if (argv.empty() || pipe2(out, O_CLOEXEC) != 0) return r;
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(out[1], 2);
    execvp(args[0], args.data());
    _exit(127);
  }
  ::close(out[1]);
  if (pid < 0) {
    ::close(out[0]);
    return r;
  }
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  auto drain = [&] {
    char buf[8192];
    ssize_t n;
    while ((n = ::read(out[0], buf, sizeof buf)) > 0) r.text.append(buf, static_cast<size_t>(n));
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(budget_s);
  while (std::chrono::steady_clock::now() < deadline) {
    drain();
    if (waitpid(pid, &r.status, WNOHANG) == pid) {
      r.finished = true;
      drain();
      break;
    }
    usleep(5000);
  }
  if (!r.finished) {
    kill(pid, SIGKILL);
    waitpid(pid, &r.status, 0);
  }
  ::close(out[0]);
  return r;
}

namespace {

// "/src/tdc/harness/tests/mustfail_cases.cpp:42 (discriminator 1)" -> "tests/mustfail_cases.cpp:42".
std::string short_location(std::string loc) {
  if (size_t d = loc.find(" (discriminator"); d != std::string::npos) loc.resize(d);
  size_t cut = loc.rfind('/');
  if (cut != std::string::npos && cut > 0) cut = loc.rfind('/', cut - 1);
  return cut == std::string::npos ? loc : loc.substr(cut + 1);
}

struct Frame {
  size_t line;      // index into the text's lines
  uint64_t offset;  // in the binary, as backtrace_symbols printed it (a return address)
};

// addr2line's two lines per address (function, then file:line) for `frames` of `binary`, appended
// to their lines; nothing when addr2line is missing, slow, or knows nothing of them.
void name_frames(const std::string& binary, const std::vector<Frame>& frames, std::vector<std::string>& lines,
                 double budget_s) {
  std::vector<std::string> argv = {"addr2line", "-C", "-f", "-e", binary};
  // A return address points after the call: the call's line is the byte before it.
  for (const Frame& f : frames) argv.push_back(fmt::format("0x{:x}", f.offset > 0 ? f.offset - 1 : 0));
  const ProgramOutput out = run_program(argv, budget_s);
  if (!out.finished || !WIFEXITED(out.status) || WEXITSTATUS(out.status) != 0) return;
  std::istringstream in(out.text);
  std::vector<std::string> answer;
  for (std::string l; std::getline(in, l);) answer.push_back(l);
  if (answer.size() != 2 * frames.size()) return;
  for (size_t i = 0; i < frames.size(); ++i) {
    const std::string& function = answer[2 * i];
    const std::string& location = answer[2 * i + 1];
    // addr2line says "??" for what it does not know, "file:?" or ":?" for a missing line table.
    const bool known_function = function != "??";
    const bool known_line = !location.empty() && location[0] != '?' && location[0] != ':' &&
                            location.find(":?") == std::string::npos && location.find(":0") == std::string::npos;
    if (!known_function && !known_line) continue;
    std::string& line = lines[frames[i].line];
    line += " " + (known_function ? function : std::string("(function unknown)"));
    if (known_line) line += " at " + short_location(location);
  }
}

}  // namespace

// [Note: frames with file:line] backtrace_symbols names only exported functions: a test body (a
// static function, a lambda) shows as "bin(+0x562c7) [0x55...]". The harness asks addr2line
// (binutils, there wherever a compiler is) for those frames, one call per binary, and appends
// the function and its file:line; tdc's test binaries carry line tables for that (-g1,
// cmake/TdcTargets.cmake). Without addr2line, within the budget or line tables, a frame stays as
// it was: symbolizing is best effort and never hides a frame.
std::string symbolize_frames(const std::string& text, double budget_s) {
  // The binary as the process named it: absolute, or relative to the directory both started in.
  static const std::regex unnamed(R"(^\s*([^(\s]+)\(\+0x([0-9a-fA-F]+)\) ?\[0x[0-9a-fA-F]+\]\s*$)");
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  std::map<std::string, std::vector<Frame>> by_binary;
  std::smatch m;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (std::regex_match(lines[i], m, unnamed))
      by_binary[m[1].str()].push_back({i, std::stoull(m[2].str(), nullptr, 16)});
  }
  if (by_binary.empty()) return text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(budget_s);
  for (const auto& [binary, frames] : by_binary) {
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) break;
    name_frames(binary, frames, lines, left);
  }
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

}  // namespace tdc::harness::detail
