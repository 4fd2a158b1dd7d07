// fully_shard's init steps (torch/distributed/fsdp/_fully_shard/_fsdp_init.py): the mesh, the
// checks of the options, and the plan of the parameters it will manage. Nothing here changes the
// module: fully_shard validates everything before it shards anything.
#pragma once

#include <vector>

#include "param.h"
#include "tdc/device_mesh.h"
#include "tdc/fsdp/fully_shard.h"

namespace tdc::fsdp {

// The 1-D mesh over the default group, made once per default group (a mesh makes groups).
DeviceMesh default_mesh();
void check_not_fully_sharded(const nn::Module& module);
// Throws naming the module when the mesh or an option is invalid.
void check_options(const nn::Module& module, const DeviceMesh& mesh, const FullyShardOptions& options);
// The parameters this call manages (not owned by a nested fully_shard'ed module, not ignored),
// each checked (dtype, device, rank, TP layout) and with its shard dim. Throws naming the first
// parameter that cannot be sharded.
std::vector<ParamPlan> plan_params(nn::Module& module, const DeviceMesh& mesh, const FullyShardOptions& options);

}  // namespace tdc::fsdp
