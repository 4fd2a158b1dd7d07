// FSDP2's shared vocabulary (torch/distributed/fsdp/_fully_shard/_fsdp_common.py): the two
// lifecycles, the mesh a group shards over, and the error that names a broken transition.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "tdc/comm/process_group.h"
#include "tdc/core/lifecycle.h"
#include "tdc/device_mesh.h"

namespace tdc::fsdp {

// [Note: FSDP lifecycles]
// A parameter group (one fully_shard call) is in one ShardedState:
//   SHARDED    -- only the shards hold data; the unsharded tensors have no storage.
//   UNSHARDING -- an all-gather is in flight (unshard(async_op=true), or a prefetch); the
//                 unsharded tensors are not written yet.
//   UNSHARDED  -- the unsharded tensors hold the parameters (they may be stale when a shard changed
//                 in place since: the next unshard gathers again into the same storage).
// SHARDED -> UNSHARDING -> UNSHARDED -> SHARDED, and UNSHARDED -> UNSHARDING for a stale gather.
// Resharding while UNSHARDING is an error from the public API (FSDPModule::reshard): the gather
// would land in freed memory. FSDP's own hooks finish a pending gather before they reshard.
//
// An FSDP state (one fully_shard'ed module) is in one TrainingState:
//   IDLE         -- outside its forward and backward.
//   FORWARD      -- between its forward pre-hook and forward hook.
//   PRE_BACKWARD -- a gradient of one of its outputs has arrived; its parameters are unsharded for
//                   its backward.
//   POST_BACKWARD -- its gradients were reduce-scattered (it stays there until the root's
//                   end-of-backward callback returns every state to IDLE).
// IDLE -> FORWARD -> IDLE -> PRE_BACKWARD -> POST_BACKWARD -> IDLE. A module called twice before
// backward goes round FORWARD twice and PRE_BACKWARD -> POST_BACKWARD twice. Activation
// checkpointing re-enters FORWARD during backward: [Note: activation checkpointing re-enters
// forward] in state.cpp.
enum class ShardedState { SHARDED, UNSHARDING, UNSHARDED };
enum class TrainingState { IDLE, FORWARD, PRE_BACKWARD, POST_BACKWARD };
const char* to_string(ShardedState state);
const char* to_string(TrainingState state);

// The mesh one parameter group shards over (FSDPMeshInfo / HSDPMeshInfo): 1-D, shard over it;
// 2-D, (replicate, shard).
struct MeshInfo {
  DeviceMesh mesh;
  DeviceMesh shard_mesh;        // the 1-D shard dim of `mesh`
  comm::GroupPtr shard_pg;      // the calling rank's group along the shard dim
  comm::GroupPtr replicate_pg;  // HSDP only: its group along the replicate dim
  int64_t shard_size = 1, shard_rank = 0, replicate_size = 1;

  static MeshInfo of(const DeviceMesh& mesh);
  int64_t data_parallel_size() const { return shard_size * replicate_size; }
};

// Throws std::logic_error "fully_shard '<who>': <action> while <state>; it needs <expected>":
// the module (its FQN under the root, or its type before lazy init) and both states.
template <class State>
void check_state(const std::string& who, const char* action, State now, std::initializer_list<State> allowed);
[[noreturn]] void throw_lifecycle_error(const std::string& who, const char* action, const std::string& now,
                                        const std::string& expected);

template <class State>
void check_state(const std::string& who, const char* action, State now, std::initializer_list<State> allowed) {
  core::check_transition(now, allowed, [&](const std::string& state, const std::string& expected) {
    throw_lifecycle_error(who, action, state, expected);
  });
}

}  // namespace tdc::fsdp
