// The state dict as tdc::checkpoint names it: tdc::tensor's StateDict (flat, ordered, dotted keys;
// tensor, DTensor or JSON values) and its accessors. DCP (save, load, to_bytes) takes it, and the
// state-dict API (tdc/state_dict/state_dict.h) produces and consumes it, as PyTorch's
// torch.distributed.checkpoint and its state_dict module share STATE_DICT_TYPE.
#pragma once

#include "tdc/tensor/state_dict.h"

namespace tdc::checkpoint {

using Value = tensor::StateDictValue;
using tensor::as_dtensor;
using tensor::as_tensor;
using tensor::local_tensor;
using tensor::StateDict;

}  // namespace tdc::checkpoint
