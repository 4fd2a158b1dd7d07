#include "tdc/device_mesh.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tdc {

// Everything a mesh (or a slice of one) knows. Immutable once built, so slices share it freely.
struct DeviceMesh::State {
  std::string device_type;
  std::vector<int64_t> shape;
  std::vector<std::string> names;      // empty, or one per dim
  at::Tensor mesh;                     // int64 global ranks, `shape`
  std::vector<comm::GroupPtr> groups;  // per dim: the slice group containing the caller
  std::vector<int64_t> coord;          // the caller's coordinate
  int64_t rank = 0;                    // the caller's global rank
  std::shared_ptr<const State> root;   // the mesh this one was sliced from (null: a root)
  std::vector<int64_t> root_dims;      // this mesh's dims in the root (sliced meshes only)
};

namespace {

std::string quoted(const std::vector<std::string>& names) {
  std::vector<std::string> q;
  for (const auto& n : names) q.push_back("'" + n + "'");
  return fmt::format("{}", fmt::join(q, ", "));
}

std::string nested(const at::Tensor& t) {
  if (t.dim() == 0) return std::to_string(t.item<int64_t>());
  std::vector<std::string> parts;
  for (int64_t i = 0; i < t.size(0); ++i) parts.push_back(nested(t[i]));
  return fmt::format("[{}]", fmt::join(parts, ", "));
}

// The group of `ranks` (sorted global ranks) for the caller, who is a member. A slice covering
// the whole world reuses the world group, as torch's DeviceMesh does for 1-D meshes.
comm::GroupPtr group_for(const std::vector<int>& ranks, const std::string& name) {
  comm::GroupPtr world = comm::default_group();
  if (static_cast<int>(ranks.size()) == world->size()) return world;
  comm::GroupOptions opts = world->options();
  opts.name = name;
  return comm::new_group(ranks, opts);
}

std::vector<int> ranks_of(const at::Tensor& t) {
  at::Tensor flat = t.contiguous().view({-1});
  std::vector<int> out;
  for (int64_t i = 0; i < flat.numel(); ++i) out.push_back(static_cast<int>(flat[i].item<int64_t>()));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

DeviceMesh::DeviceMesh(std::shared_ptr<const State> state) : state_(std::move(state)) {}

const DeviceMesh::State& DeviceMesh::state() const {
  if (!state_)
    throw std::logic_error("DeviceMesh: this is no mesh (default-constructed); build one with init_device_mesh");
  return *state_;
}

const std::string& DeviceMesh::device_type() const { return state().device_type; }
int64_t DeviceMesh::ndim() const { return static_cast<int64_t>(state().shape.size()); }
std::vector<int64_t> DeviceMesh::shape() const { return state().shape; }
int64_t DeviceMesh::size() const { return state().mesh.numel(); }
int64_t DeviceMesh::size(int64_t dim) const {
  if (dim < 0 || dim >= ndim()) {
    throw std::out_of_range(fmt::format("DeviceMesh::size: dim {} is out of range for {}", dim, to_string()));
  }
  return state().shape[dim];
}
const std::vector<std::string>& DeviceMesh::mesh_dim_names() const { return state().names; }
at::Tensor DeviceMesh::mesh() const { return state().mesh.clone(); }

int64_t DeviceMesh::dim_index(const std::string& name) const {
  auto it = std::find(state().names.begin(), state().names.end(), name);
  if (it == state().names.end()) {
    throw std::invalid_argument(fmt::format("DeviceMesh: no dim named '{}'; this mesh's dims are ({})", name,
                                            state().names.empty() ? std::string("unnamed") : quoted(state().names)));
  }
  return it - state().names.begin();
}

DeviceMesh DeviceMesh::operator[](const std::string& name) const { return (*this)[std::vector<std::string>{name}]; }

DeviceMesh DeviceMesh::operator[](const std::vector<std::string>& names) const {
  if (names.empty()) throw std::invalid_argument("DeviceMesh: slicing needs at least one dim name");
  std::vector<int64_t> dims;
  for (const auto& n : names) dims.push_back(dim_index(n));
  for (size_t i = 1; i < dims.size(); ++i) {
    if (dims[i] <= dims[i - 1]) {
      throw std::invalid_argument(fmt::format("DeviceMesh: slice ({}) must name distinct dims in mesh order ({})",
                                              quoted(names), quoted(state().names)));
    }
  }
  return select_dims(dims);
}

DeviceMesh DeviceMesh::select_dims(const std::vector<int64_t>& dims) const {
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0 || dims[i] >= ndim() || (i > 0 && dims[i] <= dims[i - 1])) {
      throw std::invalid_argument(fmt::format("DeviceMesh::select_dims: dims [{}] must be increasing dims of {}",
                                              fmt::join(dims, ", "), to_string()));
    }
  }
  auto s = std::make_shared<State>();
  s->device_type = state().device_type;
  s->rank = state().rank;
  // Keep the caller's slice: fix every dropped dim at the caller's coordinate (highest first, so
  // lower dim indices stay valid).
  at::Tensor t = state().mesh;
  for (int64_t d = ndim() - 1; d >= 0; --d) {
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) t = t.select(d, state().coord[d]);
  }
  s->mesh = t.contiguous();
  for (int64_t d : dims) {
    s->shape.push_back(state().shape[d]);
    if (!state().names.empty()) s->names.push_back(state().names[d]);
    s->groups.push_back(state().groups[d]);
    s->coord.push_back(state().coord[d]);
    s->root_dims.push_back(state().root ? state().root_dims[d] : d);
  }
  s->root = state().root ? state().root : state_;
  return DeviceMesh(std::move(s));
}

DeviceMesh DeviceMesh::root_mesh() const { return state().root ? DeviceMesh(state().root) : *this; }

std::vector<int64_t> DeviceMesh::dims_in_root() const {
  if (state().root) return state().root_dims;
  std::vector<int64_t> all(ndim());
  for (int64_t d = 0; d < ndim(); ++d) all[d] = d;
  return all;
}

comm::GroupPtr DeviceMesh::get_group(int64_t dim) const {
  if (dim < 0 || dim >= ndim()) {
    throw std::out_of_range(fmt::format("DeviceMesh::get_group: dim {} is out of range for {}", dim, to_string()));
  }
  return state().groups[dim];
}
comm::GroupPtr DeviceMesh::get_group(const std::string& name) const { return get_group(dim_index(name)); }
comm::GroupPtr DeviceMesh::get_group() const {
  if (ndim() != 1) {
    throw std::invalid_argument(fmt::format(
        "DeviceMesh::get_group() without a dim needs a 1-D mesh; {} is {}-D: pass a dim", to_string(), ndim()));
  }
  return state().groups[0];
}

int64_t DeviceMesh::get_local_rank(int64_t dim) const {
  if (dim < 0 || dim >= ndim()) {
    throw std::out_of_range(fmt::format("DeviceMesh::get_local_rank: dim {} is out of range for {}", dim, to_string()));
  }
  return state().coord[dim];
}
int64_t DeviceMesh::get_local_rank(const std::string& name) const { return get_local_rank(dim_index(name)); }
int64_t DeviceMesh::get_local_rank() const {
  if (ndim() != 1) {
    throw std::invalid_argument(fmt::format(
        "DeviceMesh::get_local_rank() without a dim needs a 1-D mesh; {} is {}-D: pass a dim", to_string(), ndim()));
  }
  return state().coord[0];
}
int64_t DeviceMesh::get_rank() const { return state().rank; }
std::vector<int64_t> DeviceMesh::get_coordinate() const { return state().coord; }

DeviceMesh DeviceMesh::flatten(const std::string& name) const {
  std::string flat_name = name;
  if (flat_name.empty()) {
    flat_name = state().names.empty() ? std::string("flat") : fmt::format("{}", fmt::join(state().names, "_"));
  }
  auto s = std::make_shared<State>();
  s->device_type = state().device_type;
  s->rank = state().rank;
  s->mesh = state().mesh.reshape({-1}).contiguous();
  s->shape = {s->mesh.numel()};
  s->names = {flat_name};
  const std::vector<int> ranks = ranks_of(state().mesh);
  s->groups = {group_for(ranks, flat_name)};
  // Row-major flattening of the caller's coordinate.
  int64_t index = 0;
  for (int64_t d = 0; d < ndim(); ++d) index = index * state().shape[d] + state().coord[d];
  s->coord = {index};
  return DeviceMesh(std::move(s));
}

bool DeviceMesh::operator==(const DeviceMesh& other) const {
  return state_ == other.state_ ||
         (state().device_type == other.state().device_type && state().shape == other.state().shape &&
          state().names == other.state().names && state().mesh.equal(other.state().mesh));
}

std::string DeviceMesh::to_string() const {
  std::string out = fmt::format("DeviceMesh('{}', {}", state().device_type, nested(state().mesh));
  if (!state().names.empty()) {
    out += fmt::format(", mesh_dim_names=({}{})", quoted(state().names), state().names.size() == 1 ? "," : "");
  }
  return out + ")";
}

DeviceMesh init_device_mesh(const std::string& device_type, const std::vector<int64_t>& shape,
                            const std::vector<std::string>& mesh_dim_names) {
  comm::GroupPtr world = comm::default_group();
  if (shape.empty()) throw std::invalid_argument("init_device_mesh: mesh shape is empty");
  int64_t product = 1;
  for (int64_t s : shape) {
    if (s < 1) {
      throw std::invalid_argument(
          fmt::format("init_device_mesh: mesh shape [{}] has a dim of size {}", fmt::join(shape, ", "), s));
    }
    product *= s;
  }
  if (product != world->size()) {
    throw std::invalid_argument(
        fmt::format("init_device_mesh: mesh shape [{}] holds {} ranks, but the world size is {}",
                    fmt::join(shape, ", "), product, world->size()));
  }
  if (!mesh_dim_names.empty()) {
    if (mesh_dim_names.size() != shape.size()) {
      throw std::invalid_argument(
          fmt::format("init_device_mesh: {} mesh_dim_names ({}) for a {}-d mesh shape [{}]; give one per dim",
                      mesh_dim_names.size(), quoted(mesh_dim_names), shape.size(), fmt::join(shape, ", ")));
    }
    std::set<std::string> seen;
    for (const auto& n : mesh_dim_names) {
      if (n.empty()) throw std::invalid_argument("init_device_mesh: a mesh dim name is empty");
      if (!seen.insert(n).second) {
        throw std::invalid_argument(
            fmt::format("init_device_mesh: mesh dim name '{}' appears twice in ({})", n, quoted(mesh_dim_names)));
      }
    }
  }
  auto s = std::make_shared<DeviceMesh::State>();
  s->device_type = device_type;
  s->shape = shape;
  s->names = mesh_dim_names;
  s->mesh = at::arange(product, at::kLong).view(shape);
  s->rank = world->rank();
  // Row-major coordinate of the caller.
  s->coord.assign(shape.size(), 0);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1, r = s->rank; d >= 0; --d) {
    s->coord[d] = r % shape[d];
    r /= shape[d];
  }
  // One group per dim: the caller's slice along it (the ranks that share every other coordinate).
  // Every member reaches this loop in the same dim order, so new_group's ordering rule holds;
  // non-members of a slice never create it.
  for (size_t d = 0; d < shape.size(); ++d) {
    std::vector<int> ranks;
    std::vector<int64_t> c = s->coord;
    for (int64_t k = 0; k < shape[d]; ++k) {
      c[d] = k;
      int64_t r = 0;
      for (size_t e = 0; e < shape.size(); ++e) r = r * shape[e] + c[e];
      ranks.push_back(static_cast<int>(r));
    }
    const std::string name = mesh_dim_names.empty() ? fmt::format("mesh_dim{}", d) : mesh_dim_names[d];
    s->groups.push_back(group_for(ranks, name));
  }
  return DeviceMesh(std::move(s));
}

}  // namespace tdc
