// The phase trace (phases.h).
#include "tdc/harness/phases.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>

#include <fmt/format.h>

namespace tdc::harness {

void mark_phase(const std::string& test_id, int rank, const char* phase) {
  static const char* const file = std::getenv("TDC_PHASES");
  if (!file || !*file) return;
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const long long us = static_cast<long long>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
  const std::string line = fmt::format("{} {} {} {}\n", test_id, rank, phase, us);
  const int fd = ::open(file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;  // a trace is best effort: never a test's failure
  [[maybe_unused]] ssize_t n = ::write(fd, line.data(), line.size());
  ::close(fd);
}

}  // namespace tdc::harness
