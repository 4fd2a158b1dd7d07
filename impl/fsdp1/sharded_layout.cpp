// FSDP1 state-dict layouts (sharded_layout.h).
#include "sharded_layout.h"

#include <map>
#include <stdexcept>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tdc/core/checkpoint_error.h"
#include "unit_state.h"

namespace tdc::fsdp1 {

bool FullyShardedDataParallel::uses_dtensor_extension() const { return detail::uses_dtensor_extension(options()); }

namespace detail {

bool uses_dtensor_extension(const FSDPOptions& options) {
  const auto& mesh = options.device_mesh;
  return mesh && mesh->root_mesh().ndim() > mesh->ndim();
}

namespace {

struct Layout {
  DeviceMesh mesh;
  tensor::Placements placements;
};

// A 1-D mesh over the unit's process group when it has no device_mesh (made once per group).
DeviceMesh group_mesh(FullyShardedDataParallel& unit) {
  static thread_local std::map<const comm::ProcessGroup*, DeviceMesh> meshes;
  const comm::GroupPtr& pg = unit.process_group();
  if (auto it = meshes.find(pg.get()); it != meshes.end()) return it->second;
  if (pg->size() != comm::default_group()->size()) {
    throw std::invalid_argument(fmt::format(
        "SHARDED_STATE_DICT: FSDP unit {} shards over a group of {} of the {} ranks; pass FSDPOptions::device_mesh so "
        "that its entries can be DTensors",
        unit.unit().label(), pg->size(), comm::default_group()->size()));
  }
  DeviceMesh mesh = init_device_mesh(pg->device_type(), {pg->size()});
  meshes.emplace(pg.get(), mesh);
  return mesh;
}

Layout layout_of(FullyShardedDataParallel& unit, const ParamSlot& slot) {
  if (!unit.options().device_mesh) return {group_mesh(unit), {tensor::Shard{0}}};
  const DeviceMesh& dm = *unit.options().device_mesh;
  if (!unit.uses_dtensor_extension()) {
    // PyTorch's _create_chunk_dtensor: Shard(0) on the last dim whatever group FSDP shards over.
    tensor::Placements ps(dm.ndim(), tensor::Replicate{});
    ps.back() = tensor::Shard{0};
    return {dm, ps};
  }
  // DTensorExtensions: over the root mesh, Shard(0) on the slice's last dim, TP's placements on its dims.
  const DeviceMesh root = dm.root_mesh();
  tensor::Placements ps(root.ndim(), tensor::Replicate{});
  ps[dm.dims_in_root().back()] = tensor::Shard{0};
  if (slot.tp_spec) {
    const auto tp_dims = slot.tp_spec->mesh.dims_in_root();
    for (size_t i = 0; i < tp_dims.size(); ++i) ps[tp_dims[i]] = slot.tp_spec->placements[i];
  }
  return {root, ps};
}

// The parameter's global value (TP's local shard gathered over the TP mesh).
at::Tensor global_value(const ParamSlot& slot, const at::Tensor& value) {
  if (!slot.tp_spec) return value;
  return tensor::DTensor(value, *slot.tp_spec).full_tensor();
}

}  // namespace

tensor::DTensor sharded_entry(FullyShardedDataParallel& unit, const ParamSlot& slot, const at::Tensor& value) {
  at::NoGradGuard no_grad;
  const Layout l = layout_of(unit, slot);
  tensor::DTensor d = tensor::distribute_tensor(global_value(slot, value.detach()), l.mesh, l.placements);
  return tensor::DTensor(d.to_local().clone(), d.spec());
}

tensor::StateDictValue full_entry(const ParamSlot& slot, const at::Tensor& value) {
  at::Tensor copy = value.detach().clone();
  if (slot.tp_spec) return tensor::DTensor(copy, *slot.tp_spec);
  return copy;
}

at::Tensor global_tensor(const tensor::StateDictValue& value, const std::string& key, const std::string& who) {
  if (const auto* d = std::get_if<tensor::DTensor>(&value)) return d->full_tensor();
  if (const auto* t = std::get_if<at::Tensor>(&value)) return *t;
  throw core::CheckpointError(fmt::format("{}: '{}' holds JSON, not a tensor", who, key));
}

at::Tensor slot_value(const tensor::StateDictValue& value, const ParamSlot& slot, const std::string& key,
                      const std::string& who) {
  const at::Tensor full = global_tensor(value, key, who);
  const std::vector<int64_t> want = slot.tp_spec ? slot.tp_spec->shape : slot.shape;
  if (full.sizes().vec() != want) {
    throw core::CheckpointError(fmt::format("{}: '{}' has shape [{}] but the parameter's is [{}]", who, key,
                                            fmt::join(full.sizes(), ", "), fmt::join(want, ", ")));
  }
  if (!slot.tp_spec) return full;
  return tensor::distribute_tensor(full, slot.tp_spec->mesh, slot.tp_spec->placements).to_local();
}

void check_tp_slots(const FSDPOptions& options, const std::vector<ParamSlot>& slots, const std::string& where) {
  for (const auto& s : slots) {
    if (!s.tp_spec) continue;
    const auto& dm = options.device_mesh;
    if (uses_dtensor_extension(options) && dm->root_mesh() == s.tp_spec->mesh.root_mesh()) continue;
    throw std::invalid_argument(fmt::format(
        "{}: parameter '{}' is distributed over {} (tensor parallel) but the FSDP unit's {} is not a slice of that "
        "mesh's root; pass FSDPOptions::device_mesh = <root>[\"<dp dim>\"]",
        where, s.fqn, s.tp_spec->mesh.to_string(),
        dm ? "device_mesh " + dm->to_string() : std::string("process_group")));
  }
}

}  // namespace detail
}  // namespace tdc::fsdp1
