// all_gather_strings: every rank's string to every rank. What libtdc's components agree through
// before they act collectively: DDP's model check, DCP's plans, the state-dict API's key lists.
#pragma once

#include <string>
#include <vector>

#include "tdc/comm/process_group.h"

namespace tdc::comm {

// Collective over `group` (null, or one rank: returns {mine}): every rank gets every rank's
// string, in rank order. One all-gather of a fixed-size frame when every string is under 4 KiB,
// else a second one of the strings padded to the longest ([Note: strings in one exchange],
// gather_strings.cpp); their arguments are equal on every rank by construction, so they skip the
// cross-rank argument checks ([Note: cross-rank argument checks]) that would only double the
// exchanges.
std::vector<std::string> all_gather_strings(const std::string& mine, const GroupPtr& group);

}  // namespace tdc::comm
