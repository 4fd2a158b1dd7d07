// DeviceMesh: an N-d arrangement of the world's ranks with named dims and a process group per
// dim (torch.distributed.device_mesh). Ranks are laid out row-major: mesh = arange(world).view(shape).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdc/comm/process_group.h"

namespace tdc {

class DeviceMesh {
 public:
  // No mesh (a default DTensorSpec's, say): valid() is false and every other query throws.
  DeviceMesh() = default;
  bool valid() const { return state_ != nullptr; }

  const std::string& device_type() const;
  int64_t ndim() const;
  std::vector<int64_t> shape() const;
  int64_t size() const;  // number of ranks in the mesh
  int64_t size(int64_t dim) const;
  const std::vector<std::string>& mesh_dim_names() const;
  at::Tensor mesh() const;  // int64 tensor of global ranks, shape()

  // Slicing by dim name(s): mesh["dp"], mesh[{"dp", "tp"}]. The result reuses the parent's
  // per-dim groups. Throws std::invalid_argument naming an unknown dim and the known ones.
  DeviceMesh operator[](const std::string& name) const;
  DeviceMesh operator[](const std::vector<std::string>& names) const;
  // Makes mesh[{"dp", "tp"}] unambiguous (a braced pair of literals also converts to std::string).
  DeviceMesh operator[](std::initializer_list<std::string> names) const {
    return (*this)[std::vector<std::string>(names)];
  }

  // The same by dim indices (increasing); works on meshes without dim names.
  DeviceMesh select_dims(const std::vector<int64_t>& dims) const;

  // The group of dim `dim` that contains the calling rank. get_group() is for 1-D meshes.
  comm::GroupPtr get_group(int64_t dim) const;
  comm::GroupPtr get_group(const std::string& name) const;
  comm::GroupPtr get_group() const;
  int64_t get_local_rank(int64_t dim) const;
  int64_t get_local_rank(const std::string& name) const;
  int64_t get_local_rank() const;               // 1-D meshes
  int64_t get_rank() const;                     // global rank of the caller
  std::vector<int64_t> get_coordinate() const;  // caller's coordinate in this mesh

  // Flattens all dims into one named dim with its own group (DeviceMesh._flatten). The name
  // defaults to the dim names joined by "_". Collective over the mesh's ranks.
  DeviceMesh flatten(const std::string& name = "") const;

  int64_t dim_index(const std::string& name) const;  // throws on unknown names
  // The mesh this one was sliced from (itself when it is not a slice; a slice of a slice gives
  // the first mesh), and this mesh's dims as dims of that root. FSDP over TP lays a parameter out
  // on the root of its "dp" and "tp" slices.
  DeviceMesh root_mesh() const;
  std::vector<int64_t> dims_in_root() const;
  // Same device type, shape, dim names and ranks.
  bool operator==(const DeviceMesh& other) const;
  std::string to_string() const;  // "DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp'))"

 private:
  struct State;
  explicit DeviceMesh(std::shared_ptr<const State> state);
  const State& state() const;  // throws on a default-constructed DeviceMesh
  friend DeviceMesh init_device_mesh(const std::string&, const std::vector<int64_t>&, const std::vector<std::string>&);
  std::shared_ptr<const State> state_;
};

// Collective over the world: every rank calls it with the same arguments. The product of
// `shape` must equal the world size (std::invalid_argument otherwise, naming both); names,
// when given, must be unique and one per dim. Uses the default process group's store.
DeviceMesh init_device_mesh(const std::string& device_type, const std::vector<int64_t>& shape,
                            const std::vector<std::string>& mesh_dim_names = {});

}  // namespace tdc
