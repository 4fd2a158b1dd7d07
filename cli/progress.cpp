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
  if (auto [id, since] = longest_running(); !id.empty()) {
    double t = std::chrono::duration<double>(Clock::now() - since).count();
    line += fmt::format("  {} ({:.0f} s)", id, t);
    if (running_.size() > 1) line += fmt::format(" +{} more", running_.size() - 1);
  }
  if (static_cast<int>(line.size()) > width_ - 1) line = line.substr(0, width_ - 4) + "...";
  std::fputs(("\r\x1b[K" + line).c_str(), stderr);
  std::fflush(stderr);
  line_shown_ = true;
}

std::pair<std::string, Progress::Clock::time_point> Progress::longest_running() const {
  std::pair<std::string, Clock::time_point> out{"", Clock::now()};
  for (const auto& [id, since] : running_)
    if (out.first.empty() || since < out.second) out = {id, since};
  return out;
}

void Progress::binary_started(const std::string& label, int tests) {
  if (!tty_) note(fmt::format("running {} ({} test{})", label, tests, tests == 1 ? "" : "s"));
  redraw();
}

void Progress::test_started(const std::string& id) {
  running_[id] = Clock::now();
  if (running_.size() == 1) last_heartbeat_ = Clock::now();
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
  running_.erase(id);
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

void Progress::test_stopped(const std::string& id) {
  running_.erase(id);
  redraw();
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
  auto [id, since] = longest_running();
  if (id.empty()) return;
  auto now = Clock::now();
  if (std::chrono::duration<double>(now - last_heartbeat_).count() >= kHeartbeatS &&
      std::chrono::duration<double>(now - since).count() >= kHeartbeatS) {
    last_heartbeat_ = now;
    double t = std::chrono::duration<double>(now - since).count();
    std::string others = running_.size() > 1 ? fmt::format(" (+{} more)", running_.size() - 1) : "";
    note(fmt::format("[{}/{}] still running {} ({:.0f} s){}  | {} {}", done_, total_, id, t, others,
                     clock_text(elapsed_s()), counters()));
  }
}

void Progress::finish() {
  clear_line();
  std::fflush(stderr);
}

}  // namespace tdc::cli
