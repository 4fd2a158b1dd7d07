// A state dict as one byte string and back (what PyTorch tests do with torch.save(sd, BytesIO) /
// torch.load; tdc never pickles). The bytes are self-describing: a JSON header (each key's kind,
// dtype, local shape and, for a DTensor, its spec: mesh layout, dim names, device type,
// placements, global shape and stride; JSON entries verbatim) followed by the tensors' raw data.
// Every rank serialises its own entries: a DTensor keeps only its local shard.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tdc/checkpoint/state_dict_value.h"
#include "tdc/device_mesh.h"

namespace tdc::checkpoint {

// Tensors are copied (to the CPU, contiguous); the state dict is not changed.
std::string to_bytes(const StateDict& state_dict);

// The state dict to_bytes was given, with fresh CPU tensors. A DTensor's mesh is the one of
// `meshes` with the recorded device type, rank layout and dim names (PyTorch's unpickled
// DeviceMesh is such a mesh again); none matching is a CheckpointError naming the recorded mesh.
// Bytes that are not what to_bytes wrote (truncated, a corrupt header, sizes that disagree) are a
// CheckpointError saying what is wrong, never a crash.
StateDict from_bytes(std::string_view bytes, const std::vector<DeviceMesh>& meshes = {});

}  // namespace tdc::checkpoint
