// FSDP2's shared vocabulary (common.h).
#include "common.h"

#include <stdexcept>

#include <fmt/format.h>

namespace tdc::fsdp {

const char* to_string(ShardedState state) {
  switch (state) {
    case ShardedState::SHARDED:
      return "SHARDED";
    case ShardedState::UNSHARDING:
      return "UNSHARDING";
    case ShardedState::UNSHARDED:
      return "UNSHARDED";
  }
  return "?";
}

const char* to_string(TrainingState state) {
  switch (state) {
    case TrainingState::IDLE:
      return "IDLE";
    case TrainingState::FORWARD:
      return "FORWARD";
    case TrainingState::PRE_BACKWARD:
      return "PRE_BACKWARD";
    case TrainingState::POST_BACKWARD:
      return "POST_BACKWARD";
  }
  return "?";
}

MeshInfo MeshInfo::of(const DeviceMesh& mesh) {
  MeshInfo info;
  info.mesh = mesh;
  const int64_t shard_dim = mesh.ndim() - 1;
  info.shard_mesh = mesh.ndim() == 2 ? mesh.select_dims({1}) : mesh;
  info.shard_pg = mesh.get_group(shard_dim);
  info.shard_size = mesh.size(shard_dim);
  info.shard_rank = mesh.get_local_rank(shard_dim);
  if (mesh.ndim() == 2) {
    info.replicate_pg = mesh.get_group(0);
    info.replicate_size = mesh.size(0);
  }
  return info;
}

void throw_lifecycle_error(const std::string& who, const char* action, const std::string& now,
                           const std::string& expected) {
  throw std::logic_error(fmt::format("fully_shard '{}': {} while {}; it needs {}", who, action, now, expected));
}

}  // namespace tdc::fsdp
