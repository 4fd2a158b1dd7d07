// tdc::checkpoint::load (checkpoint.h): read and check every header, check that the requested
// keys are covered exactly once, read each entry's part into staging tensors, agree, commit.
//
// [Note: a load changes nothing until every rank has everything]
// Phase 1 (no collective, no tensor touched): list DIR, check the manifest (when present) against
// the listing, read and validate every file's header, index chunks by key, check each requested
// key's dtype, global shape and coverage, and read its part into staging tensors (checksums
// verified). Phase 2: the ranks agree; if any failed, every rank throws with that rank's message.
// Phase 3: copy the staging tensors into the state dict's tensors. PyTorch's reader, by contrast,
// keeps the target's old values where a chunk is missing (dcp-hf-format.md, pitfall 3).
#include <filesystem>
#include <map>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common.h"
#include "directory.h"
#include "tdc/checkpoint/detail/safetensors.h"
#include "tdc/checkpoint/checkpoint.h"
#include "tdc/checkpoint/errors.h"

namespace fs = std::filesystem;

namespace tdc::checkpoint {
namespace {

using detail::ChunkHeader;
using detail::FileHeader;

struct ChunkRef {
  const FileHeader* file;
  const ChunkHeader* chunk;
};

struct Checkpoint {
  std::string dir;
  std::vector<FileHeader> files;
  std::optional<detail::Manifest> manifest;
  std::map<std::string, std::vector<ChunkRef>> chunks;  // key -> its chunks
  std::map<std::string, std::vector<int64_t>> shapes;   // key -> global shape (max of offset + shape)
};

Checkpoint open_checkpoint(const std::string& dir) {
  Checkpoint ck{dir, {}, {}, {}, {}};
  const detail::Listing listing = detail::list_dir(dir);
  if (listing.in_progress) {
    throw CheckpointError(
        fmt::format("'{}' is an unfinished checkpoint: it still holds {} (a save that crashed or is "
                    "running); load the directory the save was writing to instead",
                    dir, detail::kInProgressName));
  }
  if (listing.has_manifest) {
    ck.manifest = detail::read_manifest(dir);
    for (const auto& name : listing.safetensors) {
      if (!ck.manifest->files.contains(name)) {
        throw CheckpointError(
            fmt::format("checkpoint '{}' holds '{}', which its manifest does not list (a file from "
                        "another save?)",
                        dir, name));
      }
    }
    for (const auto& [name, size] : ck.manifest->files) {
      std::error_code ec;
      const auto path = fs::path(dir) / name;
      if (!fs::exists(path, ec)) {
        throw CheckpointError(fmt::format("checkpoint '{}' lacks '{}', which its manifest lists", dir, name));
      }
      if (fs::file_size(path, ec) != size) {
        throw CheckpointError(fmt::format("checkpoint file '{}' has {} bytes; the manifest says {}", path.string(),
                                          fs::file_size(path, ec), size));
      }
    }
  } else if (listing.safetensors.empty()) {
    throw CheckpointError(fmt::format("'{}' holds no .safetensors file: not a checkpoint", dir));
  }
  ck.files.reserve(listing.safetensors.size());
  for (const auto& name : listing.safetensors) ck.files.push_back(detail::read_header((fs::path(dir) / name).string()));
  for (const auto& f : ck.files) {
    for (const auto& c : f.chunks) {
      ck.chunks[c.key].push_back({&f, &c});
      auto& shape = ck.shapes[c.key];
      if (shape.empty()) shape.assign(c.shape.size(), 0);
      if (shape.size() != c.shape.size()) {
        throw CheckpointError(fmt::format("checkpoint '{}': key '{}' has chunks of {} and {} dims ('{}')", dir, c.key,
                                          shape.size(), c.shape.size(), f.path));
      }
      for (size_t d = 0; d < shape.size(); ++d) shape[d] = std::max(shape[d], c.offsets[d] + c.shape[d]);
    }
  }
  return ck;
}

std::string where(const ChunkRef& r) {
  return fmt::format("'{}' in '{}' (offsets {}, shape {})", r.chunk->key, r.file->path,
                     detail::shape_str(r.chunk->offsets), detail::shape_str(r.chunk->shape));
}

// The checkpoint's global shape of `key`, checked against the manifest and the chunks' own
// global_shape fields.
std::vector<int64_t> checked_shape(const Checkpoint& ck, const std::string& key) {
  const auto& shape = ck.shapes.at(key);
  for (const auto& r : ck.chunks.at(key)) {
    if (r.chunk->global_shape && *r.chunk->global_shape != shape) {
      throw CheckpointError(
          fmt::format("checkpoint '{}': chunk {} says the global shape is {}, but the chunks reach {} "
                      "(a missing chunk?)",
                      ck.dir, where(r), detail::shape_str(*r.chunk->global_shape), detail::shape_str(shape)));
    }
  }
  if (ck.manifest) {
    auto it = ck.manifest->tensors.find(key);
    if (it == ck.manifest->tensors.end()) {
      throw CheckpointError(
          fmt::format("checkpoint '{}': key '{}' is in the files but not in the manifest", ck.dir, key));
    }
    if (it->second.shape != shape) {
      throw CheckpointError(
          fmt::format("checkpoint '{}': key '{}' has shape {} in the manifest but its chunks reach {}", ck.dir, key,
                      detail::shape_str(it->second.shape), detail::shape_str(shape)));
    }
  }
  return shape;
}

// Every element of `key` covered exactly once by its chunks.
void check_coverage(const Checkpoint& ck, const std::string& key, const std::vector<int64_t>& shape) {
  int64_t total = 1;
  for (int64_t s : shape) total *= s;
  int64_t covered = 0;
  std::vector<ChunkRef> nonempty;
  for (const auto& r : ck.chunks.at(key)) {
    if (r.chunk->numel() == 0) continue;
    for (const auto& o : nonempty) {
      if (detail::intersect(r.chunk->offsets, r.chunk->shape, o.chunk->offsets, o.chunk->shape)) {
        throw CheckpointError(fmt::format("checkpoint '{}': chunks {} and {} overlap", ck.dir, where(r), where(o)));
      }
    }
    covered += r.chunk->numel();
    nonempty.push_back(r);
  }
  if (covered != total) {
    throw CheckpointError(
        fmt::format("checkpoint '{}': the chunks of '{}' cover {} of its {} elements (shape {}): a "
                    "shard file is missing or incomplete",
                    ck.dir, key, covered, total, detail::shape_str(shape)));
  }
}

// Reads `value`'s part of `key` into a new CPU tensor shaped like its local tensor.
at::Tensor read_entry(const Checkpoint& ck, const std::string& key, const Value& value) {
  const at::Tensor& local = local_tensor(value);
  const std::vector<detail::Box> boxes = detail::local_boxes(value);
  // The same layout as saved (a resume): one chunk is exactly the local tensor, read as it is.
  if (boxes.size() == 1) {
    for (const auto& r : ck.chunks.at(key)) {
      if (r.chunk->offsets == boxes[0].offsets && r.chunk->shape == boxes[0].sizes && r.chunk->numel() > 0) {
        return detail::read_rows(*r.file, *r.chunk, 0, r.chunk->shape.empty() ? 1 : r.chunk->shape[0]);
      }
    }
  }
  at::Tensor staged = at::empty(local.sizes(), at::TensorOptions().dtype(local.scalar_type()));
  std::map<const ChunkHeader*, at::Tensor> whole;  // chunks read whole (checksummed), by chunk
  for (const detail::Box& box : boxes) {
    for (const auto& r : ck.chunks.at(key)) {
      const ChunkHeader& c = *r.chunk;
      if (c.numel() == 0) continue;
      auto hit = detail::intersect(box.offsets, box.sizes, c.offsets, c.shape);
      if (!hit) continue;
      at::Tensor piece;
      std::vector<int64_t> piece_offsets = c.offsets;
      if (c.shape.empty()) {
        piece = detail::read_rows(*r.file, c, 0, 1);
      } else if (c.checksum) {
        auto [it, fresh] = whole.try_emplace(&c);
        if (fresh) it->second = detail::read_rows(*r.file, c, 0, c.shape[0]);
        piece = it->second;
      } else {
        const int64_t lo = hit->offsets[0] - c.offsets[0];
        piece = detail::read_rows(*r.file, c, lo, lo + hit->sizes[0]);
        piece_offsets[0] = hit->offsets[0];
      }
      std::vector<int64_t> local_at(box.sizes.size());
      for (size_t d = 0; d < local_at.size(); ++d)
        local_at[d] = box.local_offsets[d] + hit->offsets[d] - box.offsets[d];
      at::Tensor dst = staged;
      for (size_t d = 0; d < local_at.size(); ++d)
        dst = dst.narrow(static_cast<int64_t>(d), local_at[d], hit->sizes[d]);
      dst.copy_(detail::narrow_to(piece, piece_offsets, hit->offsets, hit->sizes));
    }
  }
  return staged;
}

}  // namespace

void load(StateDict& state_dict, const std::string& dir, const LoadOptions& options) {
  const comm::GroupPtr group = detail::resolve_group(options.group);
  std::optional<std::string> error;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (destination, staged)
  std::vector<std::pair<std::string, nlohmann::json>> values;
  try {
    const Checkpoint ck = open_checkpoint(dir);
    std::vector<std::string> missing;
    for (const auto& [key, value] : state_dict) {
      if (std::holds_alternative<nlohmann::json>(value)) {
        if (ck.manifest && ck.manifest->values.contains(key)) {
          values.emplace_back(key, ck.manifest->values[key]);
        } else {
          missing.push_back(key);
        }
        continue;
      }
      if (!ck.chunks.contains(key)) {
        missing.push_back(key);
        continue;
      }
      const auto shape = checked_shape(ck, key);
      const auto want = detail::global_shape(value);
      const auto want_dtype = local_tensor(value).scalar_type();
      const at::ScalarType have_dtype = ck.chunks.at(key).front().chunk->dtype;
      for (const auto& r : ck.chunks.at(key)) {
        if (r.chunk->dtype != have_dtype) {
          throw CheckpointError(fmt::format("checkpoint '{}': chunks of '{}' have dtypes {} and {}", dir, key,
                                            detail::dtype_name(have_dtype), detail::dtype_name(r.chunk->dtype)));
        }
      }
      if (have_dtype != want_dtype) {
        throw CheckpointError(fmt::format("checkpoint '{}': '{}' is {} in the checkpoint but {} in the state dict", dir,
                                          key, detail::dtype_name(have_dtype), detail::dtype_name(want_dtype)));
      }
      if (shape != want) {
        throw CheckpointError(
            fmt::format("checkpoint '{}': '{}' has shape {} in the checkpoint but {} in the state dict", dir, key,
                        detail::shape_str(shape), detail::shape_str(want)));
      }
      check_coverage(ck, key, shape);
      copies.emplace_back(local_tensor(value), read_entry(ck, key, value));
    }
    if (!missing.empty() && !options.allow_partial_load) {
      throw CheckpointError(fmt::format("checkpoint '{}' lacks {} key(s) of the state dict: {}", dir, missing.size(),
                                        fmt::join(missing, ", ")));
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  detail::agree("checkpoint load", error, "", group);
  c10::NoGradGuard no_grad;
  for (auto& [dst, staged] : copies) const_cast<at::Tensor&>(dst).copy_(staged);
  for (auto& [key, v] : values) state_dict.set(key, v);
}

}  // namespace tdc::checkpoint
