// DTensor placements: how a tensor lies on one mesh dim (torch.distributed.tensor.placement_types).
// Tiny value types; a std::vector<Placement> has one entry per mesh dim.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "tdc/comm/reduce_op.h"

namespace tdc::tensor {

// Split along `dim` with torch.chunk semantics: ceil(size / n) per shard, the last shards short
// or empty. A negative dim is normalised against the tensor rank when the spec is built.
struct Shard {
  int64_t dim = 0;
  bool operator==(const Shard&) const = default;
};

// FSDP over TP: a shard along `dim` of a tensor already split `split_factor` ways along the same
// dim by an inner (later) mesh dim (PyTorch's _StridedShard).
struct StridedShard {
  int64_t dim = 0;
  int64_t split_factor = 1;
  bool operator==(const StridedShard&) const = default;
};

struct Replicate {
  bool operator==(const Replicate&) const = default;
};

// Every rank holds a partial value; the full value is their reduction.
struct Partial {
  comm::ReduceOp op = comm::ReduceOp::SUM;
  bool operator==(const Partial&) const = default;
};

using Placement = std::variant<Shard, StridedShard, Replicate, Partial>;
using Placements = std::vector<Placement>;

bool is_shard(const Placement& p, int64_t dim = -1);  // any dim when dim < 0 (StridedShard too)
bool is_replicate(const Placement& p);
bool is_partial(const Placement& p);
std::string to_string(const Placement& p);    // "Shard(0)", "Replicate()", "Partial(sum)"
std::string to_string(const Placements& ps);  // "(Shard(0), Replicate())"

// torch.chunk rule: the [offset, offset + size) of shard `index` of `n` along a dim of `size`.
struct ChunkRange {
  int64_t offset = 0, size = 0;
};
ChunkRange chunk_range(int64_t dim_size, int64_t n, int64_t index);

}  // namespace tdc::tensor
