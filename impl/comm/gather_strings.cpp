// all_gather_strings (tdc/comm/gather_strings.h).
#include "tdc/comm/gather_strings.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "tdc/comm/argument_checks.h"
#include "tdc/comm/collectives.h"

namespace tdc::comm {

std::vector<std::string> all_gather_strings(const std::string& mine, const GroupPtr& group) {
  if (!group || group->size() == 1) return {mine};
  ScopedArgumentChecks unchecked(false);
  const int n = group->size();
  const auto cpu = at::TensorOptions().dtype(at::kLong);
  const bool on_cpu = group->device_type() == "cpu";
  const auto dev = on_cpu ? at::TensorOptions() : at::TensorOptions().device(group->device_type());
  at::Tensor len = at::full({1}, static_cast<int64_t>(mine.size()), cpu).to(dev.device_opt().value_or(at::kCPU));
  at::Tensor lens = at::empty({n}, len.options());
  all_gather_into_tensor(lens, len, group);
  lens = lens.cpu();
  int64_t longest = 1;
  for (int r = 0; r < n; ++r) longest = std::max(longest, lens[r].item<int64_t>());
  at::Tensor bytes = at::zeros({longest}, at::kByte);
  std::copy(mine.begin(), mine.end(), bytes.data_ptr<uint8_t>());
  bytes = bytes.to(len.device());
  at::Tensor all = at::empty({n * longest}, bytes.options());
  all_gather_into_tensor(all, bytes, group);
  all = all.cpu();
  std::vector<std::string> out;
  const auto* p = all.data_ptr<uint8_t>();
  for (int r = 0; r < n; ++r) {
    out.emplace_back(reinterpret_cast<const char*>(p + r * longest), lens[r].item<int64_t>());
  }
  return out;
}

}  // namespace tdc::comm
