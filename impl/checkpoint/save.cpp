// tdc::checkpoint::save (checkpoint.h): plan who writes which chunk, write the rank files into a
// staging directory, commit atomically ([Note: atomic save], directory.h).
//
// [Note: the save plan]
// Every rank describes what it holds (per key: dtype, global shape, the boxes of its local shard,
// each with the XXH64 of its bytes) and all-gathers the descriptions, so every rank computes the same plan without another round:
// each distinct box is written once, by the holder with the fewest bytes assigned so far (ties:
// the lowest rank), keys in sorted order. Replicated tensors and HSDP's replicas are thereby
// written once, and replicas must have equal checksums (PyTorch keeps whichever copy its dedup
// picks; tdc refuses, naming the two ranks). The distinct boxes of a key must tile its global shape exactly (a Partial value,
// or ranks that disagree about a layout, fail here, on every rank, before anything is written).
// A rank holding k boxes of one key writes k files (a safetensors file holds one chunk per key).
#include <fcntl.h>
#include <unistd.h>
#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common.h"
#include "directory.h"
#include "tdc/checkpoint/detail/safetensors.h"
#include "tdc/checkpoint/checkpoint.h"
#include "tdc/checkpoint/errors.h"
#include "tdc/comm/gather_strings.h"

namespace fs = std::filesystem;

namespace tdc::checkpoint {
namespace {

using detail::Box;

struct KeyPlan {
  std::string dtype;
  std::vector<int64_t> shape;
  // Distinct boxes (offsets, sizes), the rank that writes each and the checksum of its bytes.
  struct Writer {
    Box box;
    int rank;
    uint64_t checksum;
  };
  std::vector<Writer> writers;
};

at::Tensor chunk_of(const Value& value, const Box& box);

// This rank's description of its tensor entries (each box with the checksum of its bytes, so
// that replicas can be compared), and its JSON values.
nlohmann::json describe(const StateDict& sd) {
  nlohmann::json tensors = nlohmann::json::object(), values = nlohmann::json::object();
  for (const auto& [key, value] : sd) {
    if (const auto* j = std::get_if<nlohmann::json>(&value)) {
      values[key] = *j;
      continue;
    }
    if (const auto* d = std::get_if<tensor::DTensor>(&value)) {
      for (const auto& p : d->placements()) {
        if (tensor::is_partial(p)) {
          throw CheckpointError(
              fmt::format("cannot save '{}': it is a Partial DTensor ({}); reduce it first "
                          "(redistribute to Replicate or Shard)",
                          key, tensor::to_string(d->placements())));
        }
      }
    }
    const at::Tensor& local = local_tensor(value);
    nlohmann::json boxes = nlohmann::json::array();
    for (const Box& b : detail::local_boxes(value)) {
      const at::Tensor chunk = chunk_of(value, b);
      boxes.push_back({b.offsets, b.sizes, detail::checksum64(chunk.data_ptr(), chunk.nbytes())});
    }
    tensors[key] = {
        {"dtype", detail::dtype_name(local.scalar_type())}, {"shape", detail::global_shape(value)}, {"boxes", boxes}};
  }
  return {{"tensors", tensors}, {"values", values}};
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// [Note: the save plan]. Throws CheckpointError (identically on every rank).
std::map<std::string, KeyPlan> plan(const std::vector<nlohmann::json>& ranks) {
  std::map<std::string, KeyPlan> out;
  std::map<std::string, int> first_holder;
  // key -> box -> (rank, checksum of its bytes) of every rank that holds it
  std::map<std::string,
           std::map<std::pair<std::vector<int64_t>, std::vector<int64_t>>, std::vector<std::pair<int, uint64_t>>>>
      holders;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    for (const auto& [key, t] : ranks[r]["tensors"].items()) {
      const auto dtype = t["dtype"].get<std::string>();
      const auto shape = t["shape"].get<std::vector<int64_t>>();
      auto [it, fresh] = out.try_emplace(key, KeyPlan{dtype, shape, {}});
      if (fresh) first_holder[key] = r;
      if (it->second.dtype != dtype || it->second.shape != shape) {
        throw CheckpointError(fmt::format("cannot save '{}': rank {} has it as {} {}, rank {} as {} {}", key,
                                          first_holder[key], it->second.dtype, detail::shape_str(it->second.shape), r,
                                          dtype, detail::shape_str(shape)));
      }
      for (const auto& b : t["boxes"]) {
        holders[key][{b[0].get<std::vector<int64_t>>(), b[1].get<std::vector<int64_t>>()}].emplace_back(
            r, b[2].get<uint64_t>());
      }
    }
  }
  std::vector<int64_t> bytes(ranks.size(), 0);
  for (auto& [key, kp] : out) {
    const int64_t item = detail::itemsize(detail::dtype_from_name(kp.dtype, key));
    const int64_t total = numel_of(kp.shape);
    int64_t covered = 0;
    std::vector<Box> distinct;
    for (const auto& [box, who] : holders[key]) {
      Box b{box.first, box.second, {}};
      if (b.numel() == 0 && total > 0) continue;
      for (const Box& other : distinct) {
        if (detail::intersect(b.offsets, b.sizes, other.offsets, other.sizes) && total > 0) {
          throw CheckpointError(fmt::format(
              "cannot save '{}': the ranks' shards overlap (box at {} size {} and box at {} size {}); ranks must hold "
              "disjoint shards or identical replicas",
              key, detail::shape_str(b.offsets), detail::shape_str(b.sizes), detail::shape_str(other.offsets),
              detail::shape_str(other.sizes)));
        }
      }
      // Replicas must agree: otherwise what loads would depend on which rank wrote.
      for (const auto& [r, sum] : who) {
        if (sum != who.front().second) {
          throw CheckpointError(fmt::format(
              "cannot save '{}': ranks {} and {} hold different values for its replicated part at {} size {} "
              "(replicated values must be equal on every rank that holds them)",
              key, who.front().first, r, detail::shape_str(b.offsets), detail::shape_str(b.sizes)));
        }
      }
      int writer = who.front().first;
      for (const auto& [r, sum] : who) {
        if (bytes[r] < bytes[writer]) writer = r;
      }
      bytes[writer] += b.numel() * item;
      covered += b.numel();
      distinct.push_back(b);
      kp.writers.push_back({b, writer, who.front().second});
      if (total == 0) break;  // one empty chunk records the key
    }
    if (covered != total) {
      throw CheckpointError(fmt::format("cannot save '{}' of shape {}: the ranks' shards cover {} of its {} elements",
                                        key, detail::shape_str(kp.shape), covered, total));
    }
  }
  return out;
}

// The files each rank writes: rank -> file index -> (key, what to write).
using FilePlan = std::map<int, std::vector<std::vector<std::pair<std::string, KeyPlan::Writer>>>>;
FilePlan files_of(const std::map<std::string, KeyPlan>& plans) {
  FilePlan out;
  for (const auto& [key, kp] : plans) {
    std::map<int, int> per_rank;
    for (const auto& w : kp.writers) {
      auto& files = out[w.rank];
      const int index = per_rank[w.rank]++;
      if (static_cast<int>(files.size()) <= index) files.resize(index + 1);
      files[index].emplace_back(key, w);
    }
  }
  return out;
}

// The chunk of `value` in global box `box` as a contiguous CPU tensor.
at::Tensor chunk_of(const Value& value, const Box& box) {
  const at::Tensor& local = local_tensor(value);
  at::Tensor t = local.detach();
  for (const Box& mine : detail::local_boxes(value)) {
    if (mine.offsets == box.offsets && mine.sizes == box.sizes) {
      for (size_t d = 0; d < box.sizes.size(); ++d) {
        t = t.narrow(static_cast<int64_t>(d), mine.local_offsets[d], mine.sizes[d]);
      }
      return t.cpu().contiguous();
    }
  }
  if (box.sizes.empty() || local.numel() == 0) return t.cpu().contiguous();
  throw std::logic_error("tdc::checkpoint::save: a planned box is not one of this rank's boxes");
}

// Runs `step`; its exception becomes this rank's error for the next agree().
template <class F>
std::optional<std::string> attempt(F&& step) {
  try {
    step();
    return std::nullopt;
  } catch (const std::exception& e) {
    return e.what();
  }
}

// The plan every rank computes from every rank's description ([Note: the save plan]).
struct SavePlan {
  std::string id;                     // names the staging directory
  std::vector<nlohmann::json> ranks;  // every rank's describe()
  std::map<std::string, KeyPlan> keys;
  FilePlan files;
};

// One exchange: every rank's description (or its error) and rank 0's id for the staging name.
SavePlan plan_collectively(const StateDict& state_dict, const comm::GroupPtr& group) {
  nlohmann::json mine;
  if (auto error = attempt([&] { mine = describe(state_dict); })) mine = {{"error", *error}};
  std::random_device rd;
  mine["id"] = fmt::format("{:08x}{:08x}", rd(), rd());
  SavePlan p;
  for (const auto& s : comm::all_gather_strings(mine.dump(), group)) p.ranks.push_back(nlohmann::json::parse(s));
  for (size_t r = 0; r < p.ranks.size(); ++r) {
    if (p.ranks[r].contains("error")) {
      const std::string msg = p.ranks[r]["error"].get<std::string>();
      throw CheckpointError(p.ranks.size() > 1 ? fmt::format("checkpoint save: rank {}: {}", r, msg)
                                               : fmt::format("checkpoint save: {}", msg));
    }
  }
  p.id = p.ranks[0]["id"].get<std::string>();
  p.keys = plan(p.ranks);
  p.files = files_of(p.keys);
  return p;
}

void write_rank_files(const StateDict& state_dict, const SavePlan& p, int rank, const std::string& staging) {
  auto it = p.files.find(rank);
  if (it == p.files.end()) return;  // nothing to write: no file, as PyTorch's writer
  const int count = static_cast<int>(it->second.size());
  for (int index = 0; index < count; ++index) {
    std::vector<detail::WriteItem> items;
    for (const auto& [key, w] : it->second[index]) {
      items.push_back({key, chunk_of(state_dict.at(key), w.box), w.box.offsets, p.keys.at(key).shape, w.checksum});
    }
    detail::write_file((fs::path(staging) / detail::shard_file_name(rank, index, count)).string(), items);
  }
}

detail::Manifest manifest_of(const SavePlan& p, int world, const std::string& staging) {
  detail::Manifest m;
  m.world_size = world;
  for (const auto& [r, rank_files] : p.files) {
    const int count = static_cast<int>(rank_files.size());
    for (int index = 0; index < count; ++index) {
      const std::string name = detail::shard_file_name(r, index, count);
      m.files[name] = fs::file_size(fs::path(staging) / name);
    }
  }
  for (const auto& [key, kp] : p.keys) m.tensors[key] = {kp.dtype, kp.shape};
  for (auto it = p.ranks.rbegin(); it != p.ranks.rend(); ++it) {  // the lowest rank's value wins
    for (const auto& [key, v] : (*it)["values"].items()) m.values[key] = v;
  }
  return m;
}

}  // namespace

void save(const StateDict& state_dict, const std::string& dir, const SaveOptions& options) {
  const comm::GroupPtr group = detail::resolve_group(options.group);
  const int rank = detail::group_rank(group), world = detail::group_size(group);
  const SavePlan p = plan_collectively(state_dict, group);

  // Rank 0 checks DIR and creates the staging directory ([Note: atomic save]).
  const std::string id = p.id, staging = detail::staging_path(dir, id);
  detail::agree("checkpoint save", attempt([&] {
                  if (rank == 0) detail::prepare_save(dir, id, options.replace_existing);
                }),
                "", group);

  // After a failure anywhere, rank 0 removes the staging directory (DIR is untouched until the
  // swap) and every rank throws.
  auto agree_or_clean_up = [&](const std::optional<std::string>& error) {
    try {
      detail::agree("checkpoint save", error, "", group);
    } catch (...) {
      if (rank == 0) detail::remove_tree(staging);
      throw;
    }
  };
  agree_or_clean_up(attempt([&] {
    write_rank_files(state_dict, p, rank, staging);
    detail::crash_point("rank-files-written");
  }));
  agree_or_clean_up(attempt([&] {
    if (rank == 0) detail::finish_save(dir, staging, id, manifest_of(p, world, staging));
  }));
}

}  // namespace tdc::checkpoint
