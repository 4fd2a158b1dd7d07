#include "ring_order.h"

#include <algorithm>

#include <ATen/ATen.h>

namespace tdc::comm::detail {

namespace {
// gloo::AllreduceOptions::kMaxSegmentSize: c10d's ProcessGroupGloo keeps Gloo's default.
constexpr int64_t kGlooMaxSegmentBytes = 1024 * 1024;

int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }
}  // namespace

int64_t ring_block_numel(int64_t total_numel, int64_t element_size, int n) {
  // As gloo's ring: at least two segments per rank, at most kGlooMaxSegmentBytes each, a multiple
  // of n in all, each a whole number of elements; rank b's block is its run of segments.
  const int64_t total_bytes = total_numel * element_size;
  const int64_t max_segment = element_size * std::max<int64_t>(1, kGlooMaxSegmentBytes / element_size);
  const int64_t segments = round_up(std::max<int64_t>((total_bytes + max_segment - 1) / max_segment, 2 * n), n);
  const int64_t segment_bytes = round_up((total_bytes + segments - 1) / segments, element_size);
  return segments / n * segment_bytes / element_size;
}

namespace {
// Elements [first, first + out.numel()) of a ring all-reduce over `total` elements, from the rows
// of those elements (n rows of out.numel()), summed block by block in the ring's order.
void sum_range_in_ring_order(at::Tensor out, at::TensorList rows, int64_t first, int64_t total) {
  const int n = static_cast<int>(rows.size());
  const int64_t block = ring_block_numel(total, static_cast<int64_t>(rows[0].element_size()), n);
  const int64_t last = first + out.numel();
  for (int64_t pos = first; pos < last;) {
    const int64_t b = pos / block;
    const int64_t end = std::min(last, (b + 1) * block);
    const int64_t offset = pos - first, length = end - pos;
    auto row = [&](int64_t k) { return rows[((k % n) + n) % n].narrow(0, offset, length); };
    at::Tensor dst = out.narrow(0, offset, length);
    at::add_out(dst, row(b - 1), row(b - 2));
    for (int j = 3; j <= n; ++j) dst.add_(row(b - j));
    pos = end;
  }
}
}  // namespace

void reduce_in_ring_order(at::Tensor out, at::TensorList rows, ReduceOp op, int rank) {
  const auto n = static_cast<int64_t>(rows.size());
  const int64_t chunk = rows[0].numel();
  sum_range_in_ring_order(out, rows, rank * chunk, n * chunk);
  if (op == ReduceOp::AVG) out.div_(n);
}

void sum_in_ring_order(at::Tensor out, at::TensorList rows) { sum_range_in_ring_order(out, rows, 0, rows[0].numel()); }

}  // namespace tdc::comm::detail
