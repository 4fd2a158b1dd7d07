// The 102 seed tests: every test of the five seed PyTorch files, with its file and class, as the
// table in docs/conformance-status.md lists them (the single source of truth; parsed, not copied).
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tdc::cli {

struct SeedTest {
  std::string file;    // "test_2d_composability.py"
  std::string cls;     // "TestFullyShard2DTraining" (PyTorch's class, device suffix included)
  std::string method;  // "test_train_parity_2d_mlp" (the full test name)
  int line = 0;        // where the row is in the status file

  std::string id() const { return cls + "." + method; }
};

class SeedTable {
 public:
  SeedTable() = default;
  SeedTable(std::string source, std::vector<SeedTest> tests);

  const std::string& source() const { return source_; }
  const std::vector<SeedTest>& tests() const { return tests_; }
  // The row a result id stands for: the same id, or the same test instantiated for another device
  // ([Note: device-instantiated seed rows]). nullopt for a test that is not a seed test.
  std::optional<size_t> find(const std::string& result_id) const;

 private:
  std::string source_;
  std::vector<SeedTest> tests_;
  std::map<std::string, size_t> by_id_, by_generic_id_;
};

// Rows of the "## test_*.py" sections' tables (`| \`Class\` | \`method\` | ...`); the
// "## Variants (not counted)" section and every other section are not seed tests. Throws
// std::runtime_error naming the source and line of a malformed row, or saying no row was found.
SeedTable parse_seed_table(const std::string& markdown, const std::string& source);
SeedTable read_seed_table(const std::filesystem::path& status_md);

}  // namespace tdc::cli
