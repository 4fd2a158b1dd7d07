// The group of a checkpoint operation and agreement among its ranks (tdc/checkpoint/detail/agreement.h).
#include "tdc/checkpoint/detail/agreement.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "tdc/checkpoint/errors.h"
#include "tdc/comm/argument_checks.h"
#include "tdc/comm/collectives.h"

namespace tdc::checkpoint::detail {

comm::GroupPtr resolve_group(const comm::GroupPtr& group) {
  if (group) return group;
  return comm::is_initialized() ? comm::default_group() : nullptr;
}
int group_rank(const comm::GroupPtr& group) { return group ? group->rank() : 0; }
int group_size(const comm::GroupPtr& group) { return group ? group->size() : 1; }

std::vector<std::string> all_gather_strings(const std::string& mine, const comm::GroupPtr& group) {
  if (!group || group->size() == 1) return {mine};
  // Both all-gathers have the same arguments on every rank by construction (one int64, then the
  // longest string's length from the first), so tdc::comm's argument checks would only double
  // the round trips.
  comm::ScopedArgumentChecks unchecked(false);
  const int n = group->size();
  const auto cpu = at::TensorOptions().dtype(at::kLong);
  const bool on_cpu = group->device_type() == "cpu";
  const auto dev = on_cpu ? at::TensorOptions() : at::TensorOptions().device(group->device_type());
  at::Tensor len = at::full({1}, static_cast<int64_t>(mine.size()), cpu).to(dev.device_opt().value_or(at::kCPU));
  at::Tensor lens = at::empty({n}, len.options());
  comm::all_gather_into_tensor(lens, len, group);
  lens = lens.cpu();
  int64_t longest = 1;
  for (int r = 0; r < n; ++r) longest = std::max(longest, lens[r].item<int64_t>());
  at::Tensor bytes = at::zeros({longest}, at::kByte);
  std::copy(mine.begin(), mine.end(), bytes.data_ptr<uint8_t>());
  bytes = bytes.to(len.device());
  at::Tensor all = at::empty({n * longest}, bytes.options());
  comm::all_gather_into_tensor(all, bytes, group);
  all = all.cpu();
  std::vector<std::string> out;
  const auto* p = all.data_ptr<uint8_t>();
  for (int r = 0; r < n; ++r) {
    out.emplace_back(reinterpret_cast<const char*>(p + r * longest), lens[r].item<int64_t>());
  }
  return out;
}

void agree(const std::string& what, const std::optional<std::string>& error, const std::string& signature,
           const comm::GroupPtr& group) {
  // One string per rank: "E<message>" or "S<signature>".
  auto all = all_gather_strings(error ? "E" + *error : "S" + signature, group);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r][0] != 'E') continue;
    const std::string msg = all[r].substr(1);
    throw CheckpointError(all.size() > 1 ? fmt::format("{}: rank {}: {}", what, r, msg)
                                         : fmt::format("{}: {}", what, msg));
  }
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] != all[0]) {
      throw CheckpointError(
          fmt::format("{}: ranks disagree on what to do (rank 0: '{}', rank {}: '{}'); every rank "
                      "must pass state dicts with the same keys and kinds",
                      what, all[0].substr(1, 300), r, all[r].substr(1, 300)));
    }
  }
}

}  // namespace tdc::checkpoint::detail
