// Placements: predicates, names, and the torch.chunk rule every shard layout is built on.
#include "tdc/tensor/placement.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace tdc::tensor {

bool is_shard(const Placement& p, int64_t dim) {
  if (const auto* s = std::get_if<Shard>(&p)) return dim < 0 || s->dim == dim;
  if (const auto* s = std::get_if<StridedShard>(&p)) return dim < 0 || s->dim == dim;
  return false;
}

bool is_replicate(const Placement& p) { return std::holds_alternative<Replicate>(p); }
bool is_partial(const Placement& p) { return std::holds_alternative<Partial>(p); }

namespace {
std::string op_name(comm::ReduceOp op) {
  switch (op) {
    case comm::ReduceOp::SUM:
      return "sum";
    case comm::ReduceOp::AVG:
      return "avg";
    case comm::ReduceOp::MAX:
      return "max";
    case comm::ReduceOp::MIN:
      return "min";
  }
  return "?";
}
}  // namespace

std::string to_string(const Placement& p) {
  if (const auto* s = std::get_if<Shard>(&p)) return fmt::format("Shard({})", s->dim);
  if (const auto* s = std::get_if<StridedShard>(&p)) {
    return fmt::format("StridedShard({}, split_factor={})", s->dim, s->split_factor);
  }
  if (std::holds_alternative<Replicate>(p)) return "Replicate()";
  return fmt::format("Partial({})", op_name(std::get<Partial>(p).op));
}

std::string to_string(const Placements& ps) {
  std::string out = "(";
  for (size_t i = 0; i < ps.size(); ++i) {
    if (i) out += ", ";
    out += to_string(ps[i]);
  }
  return out + ")";
}

ChunkRange chunk_range(int64_t dim_size, int64_t n, int64_t index) {
  if (n <= 0 || index < 0 || index >= n) {
    throw std::invalid_argument(fmt::format("chunk_range: index {} is out of range for {} chunks", index, n));
  }
  const int64_t chunk = (dim_size + n - 1) / n;  // torch.chunk: ceil(size / n)
  const int64_t begin = std::min(index * chunk, dim_size);
  const int64_t end = std::min(begin + chunk, dim_size);
  return {begin, end - begin};
}

}  // namespace tdc::tensor
