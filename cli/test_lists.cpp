// The test-list cache of `tdc run` ([Note: test lists are cached], test_lists.h).
#include "test_lists.h"

#include <cstdint>
#include <fstream>
#include <sstream>
#include <system_error>

#include <unistd.h>

namespace tdc::cli {

namespace fs = std::filesystem;

namespace {

// FNV-1a: a file name that is the same in every run (std::hash need not be).
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// "<absolute path>\t<size>\t<mtime ns>\t<filter>", or "" when the binary cannot be read.
std::string stamp_of(const fs::path& binary, const std::string& filter) {
  std::error_code ec;
  const fs::path abs = fs::absolute(binary, ec);
  if (ec) return "";
  const auto size = fs::file_size(abs, ec);
  if (ec) return "";
  const auto mtime = fs::last_write_time(abs, ec);
  if (ec) return "";
  std::ostringstream out;
  out << abs.string() << '\t' << size << '\t' << mtime.time_since_epoch().count() << '\t' << filter;
  return out.str();
}

fs::path entry_of(const fs::path& cache_dir, const fs::path& binary, const std::string& filter) {
  std::error_code ec;
  const std::string key = fs::absolute(binary, ec).string() + '\n' + filter;
  std::ostringstream name;
  name << binary.filename().string() << '.' << std::hex << fnv1a(key) << ".txt";
  return cache_dir / name.str();
}

}  // namespace

std::optional<std::string> cached_test_list(const fs::path& cache_dir, const fs::path& binary,
                                            const std::string& filter) {
  const std::string stamp = stamp_of(binary, filter);
  if (stamp.empty()) return std::nullopt;
  std::ifstream in(entry_of(cache_dir, binary, filter), std::ios::binary);
  std::string first;
  if (!in || !std::getline(in, first) || first != stamp) return std::nullopt;
  std::ostringstream rest;
  rest << in.rdbuf();
  return rest.str();
}

void store_test_list(const fs::path& cache_dir, const fs::path& binary, const std::string& filter,
                     const std::string& listing) {
  const std::string stamp = stamp_of(binary, filter);
  if (stamp.empty()) return;
  std::error_code ec;
  fs::create_directories(cache_dir, ec);
  if (ec) return;
  const fs::path entry = entry_of(cache_dir, binary, filter);
  const fs::path tmp = entry.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return;
    out << stamp << '\n' << listing;
    if (!out.flush()) {
      fs::remove(tmp, ec);
      return;
    }
  }
  fs::rename(tmp, entry, ec);
  if (ec) fs::remove(tmp, ec);
}

}  // namespace tdc::cli
