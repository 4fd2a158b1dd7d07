// Distributed checkpoints (torch.distributed.checkpoint save / load) in the safetensors layout of
// PyTorch's HuggingFaceStorageWriter(save_distributed=True) / HuggingFaceStorageReader
// (docs/checkpoint.md, docs/design/dcp-hf-format.md):
//
//   DIR/shard-00001-model-00001-of-00001.safetensors   rank 0's chunks (one file per rank and box)
//   DIR/shard-00002-model-00001-of-00001.safetensors   ...
//   DIR/tdc-checkpoint.json                            manifest + non-tensor values (never pickle)
//
// PyTorch loads DIR with dcp.load(sd, storage_reader=HuggingFaceStorageReader(DIR)) on any world
// size and layout; tdc loads directories PyTorch wrote (no manifest) the same way.
#pragma once

#include <string>

#include "tdc/checkpoint/state_dict_value.h"
#include "tdc/comm/process_group.h"

namespace tdc::checkpoint {

struct SaveOptions {
  // The ranks that save together (every one calls save with its part of the state dict). Null:
  // the default group when one is initialised, else this process alone.
  comm::GroupPtr group;
  // A directory that already holds a tdc checkpoint is replaced (atomically). When false, that is
  // a CheckpointError. A directory that holds anything else is never replaced.
  bool replace_existing = true;
};

// Collective over the group. Every rank writes the chunks it owns (a replicated chunk once, by one
// rank); non-tensor values go to the manifest. Atomic: the checkpoint is written under a staging
// name next to DIR, fsynced, and swapped in with one rename, so a crash at any point leaves DIR
// holding the old checkpoint or the new one, never a mix. Partial DTensors must be reduced first
// (CheckpointError naming the key). Ranks must agree on each key's dtype and global shape.
void save(const StateDict& state_dict, const std::string& dir, const SaveOptions& options = {});

struct LoadOptions {
  comm::GroupPtr group;  // as SaveOptions::group
  // Keys of the state dict that the checkpoint lacks are an error (naming them) unless this is set;
  // then they keep their values.
  bool allow_partial_load = false;
};

// Collective over the group. Fills `state_dict` in place: each tensor or DTensor entry receives
// the checkpoint's values for its key, resharded to the entry's own layout (any world size, mesh,
// placements); JSON entries are replaced by the manifest's values. Validates everything before
// changing anything: every file's header and size, the manifest (when present: every file it
// lists, no other), dtypes and global shapes against the entries', and that the chunks of every
// requested key cover each element exactly once; data checksums are verified as chunks are read.
// All ranks read into staging buffers and agree that every rank succeeded before any entry is
// written, so a failure on one rank leaves every rank's state dict untouched (CheckpointError
// naming the file, key and value).
void load(StateDict& state_dict, const std::string& dir, const LoadOptions& options = {});

}  // namespace tdc::checkpoint
