// How an FSDP1 unit's parameters (and their optimizer state) appear in state dicts:
// [Note: FSDP1 sharded state-dict layout] (fully_sharded_data_parallel.h). Internal.
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

#include "flat_param.h"
#include "tdc/tensor/state_dict.h"
#include "tdc/tensor/dtensor.h"

namespace tdc::fsdp1::detail {

// The SHARDED_STATE_DICT entry of `slot` (a slot of `unit`'s handle) whose whole value, as this
// rank holds it, is `value` (TP's local shard when the slot has a tp_spec): a fresh DTensor.
// Collective over the entry's mesh (and the TP mesh).
tensor::DTensor sharded_entry(FullyShardedDataParallel& unit, const ParamSlot& slot, const at::Tensor& value);
// The FULL_STATE_DICT entry: a copy of `value`; a TP slot stays TP's DTensor (as PyTorch's FSDP1).
tensor::StateDictValue full_entry(const ParamSlot& slot, const at::Tensor& value);
// A state-dict value as its whole (global) tensor: a DTensor gathered (collective), a tensor as is.
// JSON is CheckpointError "<who>: '<key>' holds JSON, not a tensor".
at::Tensor global_tensor(const tensor::StateDictValue& value, const std::string& key, const std::string& who);
// The inverse of both: any state-dict value for `slot` (a full tensor, a DTensor on any mesh) as
// the slot's value on this rank (TP's local shard for a TP slot). Throws CheckpointError
// "<who>: '<key>' ..." when its global shape is not the parameter's. Collective for DTensors.
at::Tensor slot_value(const tensor::StateDictValue& value, const ParamSlot& slot, const std::string& key,
                      const std::string& who);

// FullyShardedDataParallel::uses_dtensor_extension for a unit made with `options`.
bool uses_dtensor_extension(const FSDPOptions& options);
// Throws std::invalid_argument, naming the parameter and both meshes, when a TP slot cannot be
// laid out by a unit made with `options` (its device_mesh is not a slice of the TP mesh's root:
// PyTorch has no DTensor extension then).
void check_tp_slots(const FSDPOptions& options, const std::vector<ParamSlot>& slots, const std::string& where);

}  // namespace tdc::fsdp1::detail
