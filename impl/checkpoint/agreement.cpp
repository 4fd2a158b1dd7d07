// The group of a checkpoint operation and agreement among its ranks (tdc/checkpoint/detail/agreement.h).
#include "tdc/checkpoint/detail/agreement.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "tdc/checkpoint/errors.h"
#include "tdc/comm/gather_strings.h"

namespace tdc::checkpoint::detail {

comm::GroupPtr resolve_group(const comm::GroupPtr& group) {
  if (group) return group;
  return comm::is_initialized() ? comm::default_group() : nullptr;
}
int group_rank(const comm::GroupPtr& group) { return group ? group->rank() : 0; }
int group_size(const comm::GroupPtr& group) { return group ? group->size() : 1; }

void agree(const std::string& what, const std::optional<std::string>& error, const std::string& signature,
           const comm::GroupPtr& group) {
  // One string per rank: "E<message>" or "S<signature>".
  auto all = comm::all_gather_strings(error ? "E" + *error : "S" + signature, group);
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
