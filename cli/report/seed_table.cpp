// Parsing docs/conformance-status.md's seed tables, and matching result ids to their rows.
#include "report/seed_table.h"

#include <cctype>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

namespace tdc::cli {

namespace {

// [Note: device-instantiated seed rows] PyTorch's instantiate_device_type_tests appends the
// upper-case device to the class and "_<device>" to the test; the status file lists the CUDA
// instantiation (test_composability, test_fsdp_core). A run on another device reports
// `ComposabilityTestCPU.test_pp_ddp_ScheduleClass0_cpu` for the row
// `ComposabilityTestCUDA.test_pp_ddp_ScheduleClass0_cuda`: both reduce to the same generic id
// (class and test without the device suffixes) and so share a row.
constexpr const char* kDevices[] = {"CUDA", "CPU", "XPU", "HPU", "MPS"};

std::optional<std::string> generic_id(const std::string& cls, const std::string& method) {
  for (const char* dev : kDevices) {
    std::string upper = dev, lower;
    for (char c : upper) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const std::string suffix = "_" + lower;
    if (cls.size() > upper.size() && cls.compare(cls.size() - upper.size(), upper.size(), upper) == 0 &&
        method.size() > suffix.size() && method.compare(method.size() - suffix.size(), suffix.size(), suffix) == 0)
      return cls.substr(0, cls.size() - upper.size()) + "." + method.substr(0, method.size() - suffix.size());
  }
  return std::nullopt;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// "`Name`" -> "Name"; nullopt when the cell is not one backticked word.
std::optional<std::string> code_cell(const std::string& cell) {
  std::string c = trim(cell);
  if (c.size() < 3 || c.front() != '`' || c.back() != '`') return std::nullopt;
  std::string inner = c.substr(1, c.size() - 2);
  if (inner.empty() || inner.find_first_of("` ") != std::string::npos) return std::nullopt;
  return inner;
}

std::vector<std::string> split_cells(const std::string& row) {
  std::vector<std::string> cells;
  std::string cur;
  for (size_t i = 1; i < row.size(); ++i) {  // row[0] is the leading '|'
    if (row[i] == '|') {
      cells.push_back(cur);
      cur.clear();
    } else {
      cur += row[i];
    }
  }
  return cells;
}

}  // namespace

SeedTable::SeedTable(std::string source, std::vector<SeedTest> tests)
    : source_(std::move(source)), tests_(std::move(tests)) {
  for (size_t i = 0; i < tests_.size(); ++i) {
    by_id_.emplace(tests_[i].id(), i);
    if (auto g = generic_id(tests_[i].cls, tests_[i].method)) by_generic_id_.emplace(*g, i);
  }
}

std::optional<size_t> SeedTable::find(const std::string& result_id) const {
  if (auto it = by_id_.find(result_id); it != by_id_.end()) return it->second;
  size_t dot = result_id.find('.');
  if (dot == std::string::npos) return std::nullopt;
  if (auto g = generic_id(result_id.substr(0, dot), result_id.substr(dot + 1)))
    if (auto it = by_generic_id_.find(*g); it != by_generic_id_.end()) return it->second;
  return std::nullopt;
}

SeedTable parse_seed_table(const std::string& markdown, const std::string& source) {
  std::vector<SeedTest> tests;
  std::istringstream in(markdown);
  std::string line, file;  // file: the "## test_*.py" section we are in, "" outside one
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.rfind("## ", 0) == 0) {
      std::string title = trim(line.substr(3));
      bool seed_file = title.rfind("test_", 0) == 0 && title.size() > 3 && title.substr(title.size() - 3) == ".py";
      file = seed_file ? title : "";
      continue;
    }
    if (file.empty() || line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells = split_cells(line);
    auto cls = cells.size() > 0 ? code_cell(cells[0]) : std::nullopt;
    auto method = cells.size() > 1 ? code_cell(cells[1]) : std::nullopt;
    if (!cls || !method)
      throw std::runtime_error(fmt::format("{}:{}: a row of the {} table must start with `Class` | `method`, got: {}",
                                           source, n, file, line));
    tests.push_back({file, *cls, *method, n});
  }
  if (tests.empty())
    throw std::runtime_error(
        fmt::format("{}: no seed test rows found (expected '## test_*.py' sections with "
                    "tables whose rows start with | `Class` | `method` |)",
                    source));
  return SeedTable(source, std::move(tests));
}

SeedTable read_seed_table(const std::filesystem::path& status_md) {
  std::ifstream in(status_md, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("cannot read the seed table '{}'", status_md.string()));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_seed_table(text, status_md.string());
}

}  // namespace tdc::cli
