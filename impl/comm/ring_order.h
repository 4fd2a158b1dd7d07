// Internal to impl/comm: the order in which Gloo's ring all-reduce adds the ranks' contributions,
// for the reduce-scatter by all-to-all ([Note: a reduce-scatter by all-to-all, in the ring's
// order], tdc/comm/backend_registry.h).
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "tdc/comm/reduce_op.h"

namespace tdc::comm::detail {

// Gloo's ring all-reduce (gloo/allreduce.cc, `ring`) cuts a buffer of `total_numel` elements of
// `element_size` bytes into n blocks of this many elements each (the last one shorter or empty).
// Block b is summed along the ring towards rank b: it starts as rank b-1's contribution, then rank
// b-2's, b-3's, ..., b's are added, one at a time (ranks mod n).
int64_t ring_block_numel(int64_t total_numel, int64_t element_size, int n);

// Rank `rank`'s chunk of a SUM or AVG reduce-scatter from the n `rows` (row k: rank k's
// contribution, `chunk` elements, 1-D; the rows need not share a buffer), reduced into `out` in
// that order: bit for bit what Gloo's all-reduce of the whole buffer leaves in that chunk.
void reduce_in_ring_order(at::Tensor out, at::TensorList rows, ReduceOp op, int rank);

// The SUM of a whole all-reduce from the n `rows` (row k: rank k's tensor, numel elements, 1-D),
// into `out` (numel elements) in that order: bit for bit what Gloo's all-reduce returns.
void sum_in_ring_order(at::Tensor out, at::TensorList rows);

}  // namespace tdc::comm::detail
