// The test lists `tdc run` reads from each binary (--gtest_list_tests), kept between runs.
//
// [Note: test lists are cached] Listing a binary's tests starts it, and a LibTorch binary takes
// about 0.25 s of CPU to load before it prints anything; `tdc run --kind unit` lists 24 of them,
// so listing was most of a small run (6 of 7 s for the 9 HarnessBasics tests). A binary's list
// depends only on the binary and the filter: tests register at static initialisation, and no
// flag or environment variable changes which exist. So the listing is kept in
// BUILD/.tdc-test-lists, one file per binary and filter, whose first line is a stamp (the binary's
// absolute path, size, modification time in nanoseconds, and the filter); a stored listing is
// used only while its stamp matches the binary on disk exactly, and a rebuilt binary (new size or
// time) is listed again. Files are written whole under a temporary name and renamed, so runs side
// by side never read half a file; a cache that cannot be read or written is simply not used.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace tdc::cli {

// The stored output of `binary --gtest_list_tests --gtest_filter=filter`, or nullopt when there
// is none or the binary changed since it was stored.
std::optional<std::string> cached_test_list(const std::filesystem::path& cache_dir, const std::filesystem::path& binary,
                                            const std::string& filter);
// Stores a listing (best effort: errors are ignored).
void store_test_list(const std::filesystem::path& cache_dir, const std::filesystem::path& binary,
                     const std::string& filter, const std::string& listing);

}  // namespace tdc::cli
