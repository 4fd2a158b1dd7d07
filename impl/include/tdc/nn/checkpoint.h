// Activation checkpointing (torch.distributed._composable.checkpoint): after checkpoint(m), m's
// forward runs without keeping activations, and backward recomputes it — running m's forward
// hooks again, as PyTorch does, so FSDP's pre-forward unshard happens for the recompute too.
// RNG state (CPU and, when used, CUDA) is saved in forward and restored for the recompute, so
// dropout masks match.
#pragma once

#include "tdc/nn/module.h"

namespace tdc::nn {

void checkpoint(Module& module);

}  // namespace tdc::nn
