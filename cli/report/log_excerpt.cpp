// Log excerpts: GoogleTest's [ RUN ] ... [ FAILED ] block of one test in a binary's log.
#include "report/log_excerpt.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

namespace tdc::cli {

namespace fs = std::filesystem;

namespace {

constexpr const char* kRunMarker = "[ RUN      ] ";

bool ends_test(const std::string& line, const std::string& id) {
  return line.rfind("[  FAILED  ] " + id, 0) == 0 || line.rfind("[       OK ] " + id, 0) == 0 ||
         line.rfind("[  SKIPPED ] " + id, 0) == 0;
}

}  // namespace

std::string log_excerpt(const fs::path& log, const std::string& id, int max_lines) {
  std::ifstream in(log, std::ios::binary);
  std::vector<std::string> lines;
  std::string line;
  bool inside = false;
  const std::string run = kRunMarker + id;
  while (std::getline(in, line)) {
    if (line == run) {
      inside = true;
      lines.clear();
    }
    if (inside) {
      lines.push_back(line);
      if (ends_test(line, id)) inside = false;
    }
  }
  if (lines.empty()) return "";
  size_t from = lines.size() > static_cast<size_t>(max_lines) ? lines.size() - max_lines : 0;
  std::string out = from ? fmt::format("... ({} earlier lines in {})\n", from, log.string()) : "";
  for (size_t i = from; i < lines.size(); ++i) out += lines[i] + "\n";
  return out;
}

bool adds_to(const std::string& excerpt, const std::string& message) {
  std::istringstream in(excerpt);
  std::string line;
  while (std::getline(in, line)) {
    size_t b = line.find_first_not_of(" \t");
    if (b == std::string::npos) continue;
    line = line.substr(b);
    if (line.rfind("[ ", 0) == 0 || line.rfind("[  ", 0) == 0 || line == "Failed" ||
        line.rfind("... (", 0) == 0 ||  // log_excerpt's own "earlier lines" marker
        line.find(": Failure") != std::string::npos)
      continue;  // GoogleTest's own markers
    for (const char* status : {"FAIL", "SKIP", "NOT_SUPPORTED", "TIMEOUT", "CRASH"})
      if (line.rfind(std::string(status) + ": ", 0) == 0) line = line.substr(std::strlen(status) + 2);
    if (message.find(line) == std::string::npos) return true;
  }
  return false;
}

std::map<std::string, fs::path> index_logs(const fs::path& logs_dir) {
  std::vector<fs::path> logs;
  std::error_code ec;
  for (fs::directory_iterator it(logs_dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file() && it->path().extension() == ".log") logs.push_back(it->path());
  std::sort(logs.begin(), logs.end());
  std::map<std::string, fs::path> first, failed;
  for (const fs::path& log : logs) {
    std::ifstream in(log, std::ios::binary);
    std::string line;
    const size_t n = std::strlen(kRunMarker);
    while (std::getline(in, line)) {
      if (line.rfind(kRunMarker, 0) == 0) first.emplace(line.substr(n), log);
      if (line.rfind("[  FAILED  ] ", 0) == 0) {
        std::string id =
            line.substr(13, line.find(' ', 13) == std::string::npos ? std::string::npos : line.find(' ', 13) - 13);
        failed.emplace(id, log);
      }
    }
  }
  for (const auto& [id, log] : failed) first[id] = log;
  return first;
}

}  // namespace tdc::cli
