// What the state-dict and save/load halves of tdc::checkpoint share: boxes (where a rank's part
// of a tensor lies in the global tensor), the group the ranks act in, and agreement (every rank
// learns every rank's error before anyone changes anything). Internal to libtdc.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "tdc/checkpoint/state_dict.h"
#include "tdc/comm/process_group.h"
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
std::vector<int64_t> global_shape(const Value& value);
// The rank's shard of `full` (the whole global tensor) laid out as `spec` on this rank.
at::Tensor local_slice(const at::Tensor& full, const tensor::DTensorSpec& spec);
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
using tensor::kind_name;  // "tensor", "DTensor (Shard(0)) on mesh ...", "JSON value"

// The full form of a sharded state dict (full_state_dict): DTensors gathered (a collective per
// entry, in order), on the CPU with cpu_offload, where only rank 0 keeps the result.
StateDict to_full(const StateDict& sharded, const StateDictOptions& options);

// The group `group` names, else the default group when initialised, else none (one process).
comm::GroupPtr resolve_group(const comm::GroupPtr& group);
int group_rank(const comm::GroupPtr& group);  // 0 without a group
int group_size(const comm::GroupPtr& group);  // 1 without a group

// Collective: every rank contributes a string; every rank gets all of them, in rank order.
std::vector<std::string> all_gather_strings(const std::string& mine, const comm::GroupPtr& group);
// Collective: every rank passes its error (nullopt when fine) and a signature of what it is about
// to do collectively (e.g. the keys and kinds it will redistribute). If any rank has an error or
// the signatures differ, every rank throws CheckpointError with `what`, the first failing rank's
// message (its rank named when the group has several) or the differing signatures.
void agree(const std::string& what, const std::optional<std::string>& error, const std::string& signature,
           const comm::GroupPtr& group);

}  // namespace tdc::checkpoint::detail
