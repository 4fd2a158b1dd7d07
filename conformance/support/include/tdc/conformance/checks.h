// Assertions shared by the unit and conformance suites (GoogleTest based).
//
//  * assert_close, assert_equal, assert_not_equal (assert_close.h): PyTorch's comparisons, as
//    AssertionResults, so the caller decides whether a mismatch stops the test:
//    ASSERT_TRUE(assert_equal(a, b)) << "what" (PyTorch's assertEqual raises) or EXPECT_TRUE(...).
//  * reference_copy: the single-process reference of a model: a deep copy of rank 0's
//    parameters and buffers on every rank (thread-launched ranks share one generator, so copies
//    are broadcast rather than assumed identical).
//  * sharded_parity: common_fsdp.py's check_sharded_parity (FSDP2's check, with assertEqual), as an AssertionResult:
//    every parameter of `sharded` is a DTensor
//    whose local shard equals the rank's piece of the reference parameter laid out the same way
//    (distribute_tensor with its placements), and the same for gradients (none <-> none).
//  * error_of: the what() of the exception `fn` throws, or "(no error)".
#pragma once

#include <functional>
#include <string>

#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>

#include "tdc/conformance/assert_close.h"
#include "tdc/nn/module.h"

namespace tdc::conformance {

nn::ModulePtr reference_copy(const nn::Module& model);

// Makes every rank's parameters and buffers rank 0's (broadcast over the default group). PyTorch's
// tests get identical models by seeding every process the same; thread-launched ranks share one
// ATen generator, so the same seeding races. Conformance tests call this right after building a
// model: a no-op when the ranks are processes, what makes the test launcher-independent otherwise.
void sync_from_rank0(nn::Module& model);

// The gradient data parallelism computes, on a replicated reference: every parameter's gradient
// summed over the default group's ranks and divided by their number (parameters without one skipped).
void average_reference_grads(nn::Module& reference);

[[nodiscard]] ::testing::AssertionResult sharded_parity(nn::Module& reference, nn::Module& sharded);

std::string error_of(const std::function<void()>& fn);

}  // namespace tdc::conformance
