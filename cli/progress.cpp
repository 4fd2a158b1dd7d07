#include "progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "cli.h"

namespace tdc::cli {

using harness::Status;

namespace {
constexpr double kHeartbeatS = 30;  // non-terminal: "still running" every this many seconds

std::string clock_text(double s) {
  long t = static_cast<long>(s);
  return t < 3600 ? fmt::format("{}:{:02}", t / 60, t % 60)
                  : fmt::format("{}:{:02}:{:02}", t / 3600, (t / 60) % 60, t % 60);
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }
}  // namespace

Progress::Progress(int total) : total_(total) {
  const char* term = std::getenv("TERM");
  tty_ = ::isatty(STDERR_FILENO) && !(term && std::strcmp(term, "dumb") == 0);
  winsize ws{};
  if (tty_ && ::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 20) width_ = ws.ws_col;
}

double Progress::elapsed_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

std::string Progress::counters() const {
  std::string s = fmt::format("pass {} fail {} skip {}", pass_, fail_, skip_);
  if (xfail_ > 0) s += fmt::format(" xfail {}", xfail_);
  return s;
}

void Progress::clear_line() {
  if (tty_ && line_shown_) {
    std::fputs("\r\x1b[K", stderr);
    line_shown_ = false;
  }
}

void Progress::redraw() {
  if (!tty_) return;
  std::string line = fmt::format("[{}/{}] {}  {}", done_, total_, clock_text(elapsed_s()), counters());
  if (!current_.empty()) {
    double t = std::chrono::duration<double>(Clock::now() - test_start_).count();
    line += fmt::format("  {} ({:.0f} s)", current_, t);
  }
  if (static_cast<int>(line.size()) > width_ - 1) line = line.substr(0, width_ - 4) + "...";
  std::fputs(("\r\x1b[K" + line).c_str(), stderr);
  std::fflush(stderr);
  line_shown_ = true;
}

void Progress::binary_started(const std::string& binary) {
  binary_ = binary;
  if (!tty_) note(fmt::format("running {}", binary));
  redraw();
}

void Progress::test_started(const std::string& id) {
  current_ = id;
  test_start_ = last_heartbeat_ = Clock::now();
  redraw();
}

void Progress::test_ended(const std::string& id, Status status, double duration_s, const std::string& message) {
  ++done_;
  switch (status) {
    case Status::Pass:
      ++pass_;
      break;
    case Status::XFail:  // a known failure: neither a pass nor a new failure
      ++xfail_;
      break;
    case Status::Skip:
    case Status::NotSupported:
      ++skip_;
      break;
    default:
      ++fail_;
  }
  if (id == current_) current_.clear();
  bool failed = harness::is_failure(status);
  if (tty_) {
    if (failed)
      note(fmt::format("{:<8} {} ({}): {}", harness::to_string(status), id, format_duration(duration_s),
                       first_line(message)));
    redraw();
  } else {
    std::string line = fmt::format("[{}/{}] {:<13} {} ({})  | {} {}", done_, total_, harness::to_string(status), id,
                                   format_duration(duration_s), clock_text(elapsed_s()), counters());
    if (failed && !message.empty()) line += "\n    " + first_line(message);
    note(line);
  }
}

void Progress::note(const std::string& line) {
  clear_line();
  fmt::print(stderr, "{}\n", line);
  std::fflush(stderr);
  redraw();
}

void Progress::tick() {
  if (tty_) {
    redraw();
    return;
  }
  if (current_.empty()) return;
  auto now = Clock::now();
  if (std::chrono::duration<double>(now - last_heartbeat_).count() >= kHeartbeatS) {
    last_heartbeat_ = now;
    double t = std::chrono::duration<double>(now - test_start_).count();
    note(fmt::format("[{}/{}] still running {} ({:.0f} s)  | {} {}", done_, total_, current_, t,
                     clock_text(elapsed_s()), counters()));
  }
}

void Progress::finish() {
  clear_line();
  std::fflush(stderr);
}

}  // namespace tdc::cli
