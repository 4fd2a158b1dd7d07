// Module.to_empty(device=...): materialises a model built on the meta device.
#pragma once

#include <c10/core/Device.h>

#include "tdc/nn/module.h"

namespace tdc::nn {

// Gives every parameter and buffer of `module`'s tree uninitialised storage on `device`;
// initialise the parameters afterwards. A tensor registered twice (tied) gets one new tensor, so
// ties are kept. Parameters are replaced by new leaves (same requires_grad); fully_shard'ed modules
// adopt their new shards at their next unshard (on the CPU with CPU offload). Buffers keep their
// identity and move too, except meta buffers: an error naming the buffer (LibTorch cannot re-point
// them).
void to_empty(Module& module, c10::Device device);

}  // namespace tdc::nn
