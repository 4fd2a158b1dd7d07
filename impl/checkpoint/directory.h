// A checkpoint directory on disk: its file names, the manifest, what a listing finds, and the
// atomic commit of a new checkpoint (docs/checkpoint.md, "Atomic save"). Internal to libtdc.
//
// [Note: atomic save]
// A save never writes into DIR. Rank 0 creates a staging directory next to it
// (".DIR.tdc-staging-<id>") holding the marker file tdc-save-in-progress; every rank writes its
// files there and fsyncs them; rank 0 writes the manifest tdc-checkpoint.json (fsync), removes the
// marker, fsyncs the staging directory and swaps it with DIR in one renameat2(RENAME_EXCHANGE)
// (or one rename when DIR does not exist), fsyncs the parent, and deletes the old checkpoint, now
// under the staging name. A crash before the swap leaves DIR as it was (plus a staging directory
// that load refuses: its marker, or no manifest); after it, DIR is the new checkpoint. Where the
// filesystem lacks RENAME_EXCHANGE, DIR is first renamed aside (".DIR.tdc-old-<id>"): a crash
// between the two renames leaves no DIR, and the next save or load names the directory to
// restore.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tdc::checkpoint::detail {

constexpr const char* kManifestName = "tdc-checkpoint.json";
constexpr const char* kInProgressName = "tdc-save-in-progress";
constexpr int kManifestVersion = 1;

// shard-{rank+1:05d}-model-{index+1:05d}-of-{count:05d}.safetensors (PyTorch's names).
std::string shard_file_name(int rank, int index, int count);

// What a directory holds: its top-level *.safetensors files (sorted; PyTorch's reader reads
// exactly these), whether it has a manifest and the in-progress marker.
struct Listing {
  std::vector<std::string> safetensors;
  bool has_manifest = false;
  bool in_progress = false;
  std::vector<std::string> other;  // any other entry (not followed)
};
// Throws CheckpointError when `dir` does not exist or is not a directory.
Listing list_dir(const std::string& dir);

struct TensorMeta {
  std::string dtype;
  std::vector<int64_t> shape;
};
struct Manifest {
  int world_size = 1;
  std::map<std::string, uint64_t> files;  // name -> size in bytes
  std::map<std::string, TensorMeta> tensors;
  nlohmann::json values = nlohmann::json::object();  // key -> non-tensor value
};
nlohmann::json manifest_json(const Manifest& m);
// Parses and checks the manifest of `dir` (CheckpointError naming the file and the field).
Manifest read_manifest(const std::string& dir);

// POSIX helpers: CheckpointError naming the path and errno's message.
void write_file_synced(const std::string& path, const std::string& contents);
void fsync_dir(const std::string& dir);
void remove_tree(const std::string& path);  // best effort

// Rank 0's part of a save. prepare: checks DIR (a directory holding something that is not a tdc
// checkpoint is never replaced; a tdc checkpoint only when `replace_existing`), creates the
// staging directory with its marker, returns the staging path. finish: manifest, marker removal,
// swap, cleanup ([Note: atomic save]).
// The staging directory of save `id` next to `dir` (every rank computes the same path).
std::string staging_path(const std::string& dir, const std::string& id);
std::string prepare_save(const std::string& dir, const std::string& id, bool replace_existing);
void finish_save(const std::string& dir, const std::string& staging, const std::string& id, const Manifest& manifest);

// Test hook: when the environment variable TDC_CHECKPOINT_CRASH_AT equals `point`, the process
// exits at once (_exit(86)), as a crash would, leaving its files as they are.
void crash_point(const char* point);

}  // namespace tdc::checkpoint::detail
