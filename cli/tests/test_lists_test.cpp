// The test-list cache of `tdc run` ([Note: test lists are cached], cli/test_lists.h).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "test_lists.h"

namespace tdc::cli {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tdc-test-lists-XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path path;
};

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

TEST(TestListCache, StoredListingIsReadBackForTheSameBinaryAndFilter) {
  TempDir dir;
  const fs::path bin = dir.path / "my_test";
  write(bin, "binary v1");
  const fs::path cache = dir.path / "cache";
  EXPECT_FALSE(cached_test_list(cache, bin, "*").has_value());
  store_test_list(cache, bin, "*", "Suite.\n  A\n  B\n");
  ASSERT_TRUE(cached_test_list(cache, bin, "*").has_value());
  EXPECT_EQ(*cached_test_list(cache, bin, "*"), "Suite.\n  A\n  B\n");
  EXPECT_FALSE(cached_test_list(cache, bin, "Suite.A").has_value()) << "another filter is another list";
}

TEST(TestListCache, ARebuiltBinaryIsListedAgain) {
  TempDir dir;
  const fs::path bin = dir.path / "my_test";
  write(bin, "binary v1");
  const fs::path cache = dir.path / "cache";
  store_test_list(cache, bin, "*", "Suite.\n  A\n");
  write(bin, "binary v2, longer");  // a new size
  EXPECT_FALSE(cached_test_list(cache, bin, "*").has_value());
  store_test_list(cache, bin, "*", "Suite.\n  A\n");
  write(bin, "binary v3, longer");  // the same size, a later time
  fs::last_write_time(bin, fs::last_write_time(bin) + std::chrono::seconds(1));
  EXPECT_FALSE(cached_test_list(cache, bin, "*").has_value());
}

TEST(TestListCache, MissingBinaryOrUnwritableCacheIsNotAnError) {
  TempDir dir;
  EXPECT_FALSE(cached_test_list(dir.path / "cache", dir.path / "nosuch", "*").has_value());
  store_test_list(dir.path / "cache", dir.path / "nosuch", "*", "Suite.\n  A\n");
  const fs::path bin = dir.path / "my_test";
  write(bin, "binary");
  write(dir.path / "file", "");
  store_test_list(dir.path / "file" / "cache", bin, "*", "Suite.\n  A\n");  // a file in the way
  EXPECT_FALSE(cached_test_list(dir.path / "file" / "cache", bin, "*").has_value());
}

}  // namespace
}  // namespace tdc::cli
