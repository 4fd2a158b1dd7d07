// Unit tests of all_gather_strings (tdc/comm/gather_strings.h) and [Note: strings in one
// exchange]: every rank gets every rank's string, byte for byte (empty ones, NUL bytes, lengths at
// and past the frame's limit on one rank only), in one all-gather when all fit and two otherwise.
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "tdc/comm/debug_mode.h"
#include "tdc/comm/gather_strings.h"
#include "tdc/conformance/support.h"
#include "tdc/harness/harness.h"

// A named namespace: the comm unit tests share one unity TU.
namespace gather_strings_test {

using namespace tdc::comm;

TDC_DIST_SUITE(GatherStringsTest, .world_size = 3);

// The frame's room for a string (impl/comm/gather_strings.cpp: 4 KiB less the length).
constexpr size_t kFits = 4096 - 8;

// Rank r's string of `len` bytes: NUL bytes and every other byte value, different per rank.
std::string text(int rank, size_t len) {
  std::string s(len, '\0');
  for (size_t i = 0; i < len; ++i) s[i] = static_cast<char>((i * 7 + static_cast<size_t>(rank) * 31) % 256);
  return s;
}

// Gathers rank r's string of lens[r] bytes; expects every rank's back and `exchanges` all-gathers.
void gathers(const std::vector<size_t>& lens, int exchanges) {
  GroupPtr g = tdc::conformance::world();
  SCOPED_TRACE(fmt::format("world {}, lengths {}", g->size(), fmt::join(lens, ", ")));
  CommDebugMode mode;
  const std::vector<std::string> all = all_gather_strings(text(g->rank(), lens[g->rank()]), g);
  ASSERT_EQ(all.size(), static_cast<size_t>(g->size()));
  for (int r = 0; r < g->size(); ++r) EXPECT_EQ(all[r], text(r, lens[r])) << "rank " << r << "'s string";
  EXPECT_EQ(mode.get_comm_counts()["c10d._allgather_base_"], exchanges);
}

void gathers_every_length() {
  const int n = tdc::conformance::world()->size();
  auto lens_with = [n](size_t first, size_t others) {
    std::vector<size_t> lens(n, others);
    lens[0] = first;
    return lens;
  };
  gathers(lens_with(0, 0), 1);           // all empty
  gathers(lens_with(0, 300), 1);         // one empty, the others short
  gathers(lens_with(kFits, 17), 1);      // exactly at the limit
  gathers(lens_with(kFits + 1, 17), 2);  // one byte over, on rank 0 only
  gathers(lens_with(5, 3 * kFits), 2);   // the others far over
}

TDC_DIST_TEST(GatherStringsTest, EveryLengthWorldSize2, .world_size = 2) { gathers_every_length(); }
TDC_DIST_TEST(GatherStringsTest, EveryLengthWorldSize3) { gathers_every_length(); }

}  // namespace gather_strings_test
