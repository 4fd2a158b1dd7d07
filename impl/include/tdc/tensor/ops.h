// DTensor ops with sharding rules (the subset TP and FSDP need). Each op looks at its inputs'
// placements, picks the output placements by its rule (redistributing an input when the rule
// requires it), runs the local ATen op on local tensors, and returns a DTensor. Autograd flows
// through the local tensors. An op with no rule for its inputs' placements throws
// std::invalid_argument naming the op and the placements; DTensors on different meshes in one
// op are an error naming both meshes.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "tdc/tensor/dtensor.h"

namespace tdc::tensor::ops {

// Elementwise (broadcasting allowed where shards stay aligned).
DTensor add(const DTensor& a, const DTensor& b);
DTensor sub(const DTensor& a, const DTensor& b);
DTensor mul(const DTensor& a, const DTensor& b);
DTensor div(const DTensor& a, const DTensor& b);
DTensor neg(const DTensor& a);
DTensor relu(const DTensor& a);
DTensor gelu(const DTensor& a);
DTensor tanh(const DTensor& a);

// Reductions.
DTensor sum(const DTensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
DTensor mean(const DTensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);

// Linear algebra: a [.., k] x b [k, n] style rules (Shard on the contracted dim -> Partial).
DTensor mm(const DTensor& a, const DTensor& b);
DTensor addmm(const DTensor& bias, const DTensor& a, const DTensor& b);
// y = x W^T + b with W [out, in] (nn.Linear); no bias when `bias` is empty.
DTensor linear(const DTensor& input, const DTensor& weight, const std::optional<DTensor>& bias = std::nullopt);
// Vocabulary-sharded weight (Shard(0)) -> Partial(SUM) output; replicated weight -> replicate.
DTensor embedding(const DTensor& weight, const DTensor& indices);

// Views.
DTensor transpose(const DTensor& a, int64_t dim0, int64_t dim1);
DTensor view(const DTensor& a, const std::vector<int64_t>& shape);
DTensor reshape(const DTensor& a, const std::vector<int64_t>& shape);

}  // namespace tdc::tensor::ops
