// all_gather_strings (tdc/comm/gather_strings.h).
#include "tdc/comm/gather_strings.h"

#include <algorithm>
#include <cstring>

#include <ATen/ATen.h>

#include "tdc/comm/argument_checks.h"
#include "tdc/comm/collectives.h"

namespace tdc::comm {

namespace {
// [Note: strings in one exchange] Every rank sends a frame of this many bytes: its string's
// length, then as much of the string as fits. When every rank's string fits (what libtdc's
// agreements send: a model's parameter list, a plan, a key list, mostly a few hundred bytes),
// that one all-gather is the whole exchange; otherwise every rank, having seen every length, sends
// its whole string padded to the longest in a second one. The frame's size is fixed, so the first
// exchange has the same size on every rank whatever the strings are.
constexpr int64_t kFrameBytes = 4096;
constexpr int64_t kHeadBytes = kFrameBytes - static_cast<int64_t>(sizeof(int64_t));

at::Device device_of(const GroupPtr& group) {
  return group->device_type() == "cpu" ? at::Device(at::kCPU) : at::Device(group->device_type());
}

// Every rank's `bytes` bytes of `mine`'s tensor form (rank r's at r * bytes), on the CPU.
at::Tensor gather_bytes(const at::Tensor& mine, const GroupPtr& group) {
  at::Tensor in = mine.to(device_of(group));
  at::Tensor all = at::empty({group->size() * in.numel()}, in.options());
  all_gather_into_tensor(all, in, group);
  return all.cpu();
}
}  // namespace

std::vector<std::string> all_gather_strings(const std::string& mine, const GroupPtr& group) {
  if (!group || group->size() == 1) return {mine};
  ScopedArgumentChecks unchecked(false);
  const int n = group->size();
  const auto len = static_cast<int64_t>(mine.size());
  at::Tensor frame = at::zeros({kFrameBytes}, at::kByte);
  std::memcpy(frame.data_ptr<uint8_t>(), &len, sizeof(len));
  std::memcpy(frame.data_ptr<uint8_t>() + sizeof(len), mine.data(), std::min(len, kHeadBytes));
  const at::Tensor frames = gather_bytes(frame, group);
  const uint8_t* f = frames.data_ptr<uint8_t>();
  std::vector<int64_t> lens(n);
  for (int r = 0; r < n; ++r) std::memcpy(&lens[r], f + r * kFrameBytes, sizeof(int64_t));
  const int64_t longest = std::max<int64_t>(1, *std::max_element(lens.begin(), lens.end()));
  std::vector<std::string> out;
  if (longest <= kHeadBytes) {
    for (int r = 0; r < n; ++r) {
      out.emplace_back(reinterpret_cast<const char*>(f + r * kFrameBytes + sizeof(int64_t)), lens[r]);
    }
    return out;
  }
  at::Tensor bytes = at::zeros({longest}, at::kByte);
  std::memcpy(bytes.data_ptr<uint8_t>(), mine.data(), mine.size());
  const at::Tensor all = gather_bytes(bytes, group);
  const auto* p = all.data_ptr<uint8_t>();
  for (int r = 0; r < n; ++r) out.emplace_back(reinterpret_cast<const char*>(p + r * longest), lens[r]);
  return out;
}

}  // namespace tdc::comm
