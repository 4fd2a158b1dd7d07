// The group the ranks of a checkpoint operation act in, and agreement: every rank learns every
// rank's error before anyone changes anything. DCP's save and load stand on it, and so does the
// state-dict API's all-or-nothing set_* (tdc/state_dict/), as PyTorch's state_dict module stands
// on torch.distributed.checkpoint's utilities. For libtdc's own components, not API.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tdc/comm/process_group.h"

namespace tdc::checkpoint::detail {

// The group `group` names, else the default group when initialised, else none (one process).
comm::GroupPtr resolve_group(const comm::GroupPtr& group);
int group_rank(const comm::GroupPtr& group);  // 0 without a group
int group_size(const comm::GroupPtr& group);  // 1 without a group

// Collective: every rank passes its error (nullopt when fine) and a signature of what it is about
// to do collectively (e.g. the keys and kinds it will redistribute). If any rank has an error or
// the signatures differ, every rank throws CheckpointError with `what`, the first failing rank's
// message (its rank named when the group has several) or the differing signatures.
void agree(const std::string& what, const std::optional<std::string>& error, const std::string& signature,
           const comm::GroupPtr& group);

}  // namespace tdc::checkpoint::detail
