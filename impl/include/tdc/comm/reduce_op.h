// Reduction ops of tdc's collectives (c10d's ReduceOp), apart from the collectives so that value
// types such as DTensor's Partial placement can name one without the c10d headers.
#pragma once

namespace tdc::comm {

enum class ReduceOp { SUM, AVG, MAX, MIN };
const char* to_string(ReduceOp op);

}  // namespace tdc::comm
