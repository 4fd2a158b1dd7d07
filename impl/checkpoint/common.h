// What DCP's save, load and to_bytes share: boxes (where a rank's part of a tensor lies in the
// global tensor), strict JSON, checksums as headers print them; and (tdc/checkpoint/detail/
// agreement.h) the group the ranks act in and agreement. Internal to the checkpoint component.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "tdc/checkpoint/detail/agreement.h"
#include "tdc/checkpoint/state_dict_value.h"
#include "tdc/tensor/detail/layout.h"

namespace tdc::checkpoint::detail {

// A box of a tensor: `sizes` elements from `offsets` in the global tensor, stored in the local
// tensor from `local_offsets`. A 0-dim tensor has one box with no dims.
struct Box {
  std::vector<int64_t> offsets, sizes, local_offsets;
  int64_t numel() const;
};
// The boxes the calling rank holds of `value`: one for a plain tensor (the whole of it); for a
// DTensor the product of its per-dim index runs (one box unless a StridedShard splits it).
// Empty boxes are left out unless the whole local tensor is empty (then one, at the offsets where
// it would begin).
std::vector<Box> local_boxes(const Value& value);
using tensor::global_shape;
// The part of `t` (whose element [0...] is global position `t_offsets`) inside `box` -> a view.
at::Tensor narrow_to(const at::Tensor& t, const std::vector<int64_t>& t_offsets, const std::vector<int64_t>& offsets,
                     const std::vector<int64_t>& sizes);
// The intersection of two boxes given as (offsets, sizes); nullopt when empty (0-dim: always).
struct Range {
  std::vector<int64_t> offsets, sizes;
};
std::optional<Range> intersect(const std::vector<int64_t>& a_off, const std::vector<int64_t>& a_size,
                               const std::vector<int64_t>& b_off, const std::vector<int64_t>& b_size);

using tensor::detail::shape_str;  // "[2, 3]"

// Strict JSON (nlohmann's default: UTF-8 checked, no comments, no trailing commas) nesting at
// most `max_depth` levels and refusing an object with a key twice (json::parse would keep the last
// silently). Throws CheckpointError "<where>: <what> is not valid JSON: ..." / "... nests deeper
// than N levels" / "... has the key 'k' twice in one object".
nlohmann::json parse_strict_json(std::string_view text, int max_depth, const std::string& where,
                                 const std::string& what);
// A checksum as headers print it (16 lowercase hex digits), or nullopt.
std::optional<uint64_t> parse_hex64(const std::string& s);

}  // namespace tdc::checkpoint::detail
