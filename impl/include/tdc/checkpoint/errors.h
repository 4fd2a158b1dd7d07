// What tdc::checkpoint throws for a bad checkpoint or a state dict that does not fit: one type,
// so callers can tell "this checkpoint is unusable" from programming errors. Messages name the
// file, the key and the values involved. (Defined in libtdc's base: FSDP1 throws it too.)
#pragma once

#include "tdc/core/checkpoint_error.h"

namespace tdc::checkpoint {

using core::CheckpointError;

}  // namespace tdc::checkpoint
