// Checks on tdc::checkpoint state dicts, as PyTorch's tests use assertEqual on them.
#pragma once

#include <gtest/gtest.h>

#include "tdc/state_dict/state_dict.h"

namespace tdc::conformance {

// assertEqual on two state dicts: the same keys in any order; each pair of entries of the same
// kind; tensors compared with torch.testing's tolerances for their dtype (float32: rtol 1.3e-6,
// atol 1e-5; exact for integers); DTensors by their spec (mesh, placements, global shape) and
// local tensors; JSON values equal. The first difference is named.
[[nodiscard]] ::testing::AssertionResult state_dicts_equal(const checkpoint::StateDict& actual,
                                                           const checkpoint::StateDict& expected);

// copy.deepcopy of a state dict: every tensor (and DTensor local tensor) cloned.
checkpoint::StateDict deep_copy(const checkpoint::StateDict& sd);

}  // namespace tdc::conformance
