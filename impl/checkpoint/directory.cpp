// Checkpoint directories: names, listing, manifest, atomic commit (directory.h).
#include "directory.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "tdc/checkpoint/errors.h"

namespace fs = std::filesystem;

namespace tdc::checkpoint::detail {
namespace {

std::string sys_error(const std::string& what, const std::string& path) {
  return fmt::format("{} '{}': {}", what, path, std::strerror(errno));
}

// The sibling path ".<name>.tdc-<kind>-<id>" of `dir`.
std::string sibling(const std::string& dir, const std::string& kind, const std::string& id) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return (p.parent_path() / fmt::format(".{}.tdc-{}-{}", p.filename().string(), kind, id)).string();
}

std::string parent_of(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  fs::path parent = p.parent_path();
  return parent.empty() ? "." : parent.string();
}

// Old checkpoints a crashed fallback swap left next to `dir`.
std::vector<std::string> stranded(const std::string& dir) {
  std::vector<std::string> out;
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  const std::string prefix = "." + p.filename().string() + ".tdc-old-";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(parent_of(dir), ec)) {
    if (e.path().filename().string().starts_with(prefix)) out.push_back(e.path().string());
  }
  return out;
}

}  // namespace

std::string shard_file_name(int rank, int index, int count) {
  return fmt::format("shard-{:05d}-model-{:05d}-of-{:05d}.safetensors", rank + 1, index + 1, count);
}

Listing list_dir(const std::string& dir) {
  std::error_code ec;
  const auto st = fs::status(dir, ec);
  if (!fs::exists(st)) {
    auto old = stranded(dir);
    if (!old.empty()) {
      throw CheckpointError(
          fmt::format("no checkpoint at '{}', but '{}' holds the previous one: a save crashed between "
                      "its two renames; rename it back to '{}'",
                      dir, old.front(), dir));
    }
    throw CheckpointError(fmt::format("checkpoint directory '{}' does not exist", dir));
  }
  if (!fs::is_directory(st)) throw CheckpointError(fmt::format("checkpoint path '{}' is not a directory", dir));
  Listing out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name == kManifestName) {
      out.has_manifest = true;
    } else if (name == kInProgressName) {
      out.in_progress = true;
    } else if (name.size() > 12 && name.ends_with(".safetensors") && !e.is_directory()) {
      out.safetensors.push_back(name);
    } else {
      out.other.push_back(name);
    }
  }
  if (ec) throw CheckpointError(fmt::format("cannot list checkpoint directory '{}': {}", dir, ec.message()));
  std::sort(out.safetensors.begin(), out.safetensors.end());
  return out;
}

nlohmann::json manifest_json(const Manifest& m) {
  nlohmann::json j;
  j["format"] = "tdc-checkpoint";
  j["version"] = kManifestVersion;
  j["world_size"] = m.world_size;
  j["files"] = nlohmann::json::object();
  for (const auto& [name, size] : m.files) j["files"][name] = size;
  j["tensors"] = nlohmann::json::object();
  for (const auto& [key, t] : m.tensors) j["tensors"][key] = {{"dtype", t.dtype}, {"shape", t.shape}};
  j["values"] = m.values;
  return j;
}

Manifest read_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kManifestName).string();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(sys_error("cannot open manifest", path));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  auto bad = [&](const std::string& why) { return CheckpointError(fmt::format("manifest '{}': {}", path, why)); };
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw bad("not a JSON object");
  if (j.value("format", "") != "tdc-checkpoint") throw bad("\"format\" is not \"tdc-checkpoint\"");
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<int>() != kManifestVersion) {
    throw bad(fmt::format("version {} is not {} (written by another tdc?)",
                          j.contains("version") ? j["version"].dump() : "missing", kManifestVersion));
  }
  Manifest m;
  try {
    m.world_size = j.at("world_size").get<int>();
    for (const auto& [name, size] : j.at("files").items()) {
      if (name.find('/') != std::string::npos || !name.ends_with(".safetensors")) {
        throw bad(fmt::format("file name '{}' is not a .safetensors file of the directory", name));
      }
      m.files[name] = size.get<uint64_t>();
    }
    for (const auto& [key, t] : j.at("tensors").items()) {
      m.tensors[key] = TensorMeta{t.at("dtype").get<std::string>(), t.at("shape").get<std::vector<int64_t>>()};
    }
    m.values = j.at("values");
    if (!m.values.is_object()) throw bad("\"values\" is not an object");
  } catch (const nlohmann::json::exception& e) {
    throw bad(fmt::format("malformed: {}", e.what()));
  }
  return m;
}

void write_file_synced(const std::string& path, const std::string& contents) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw CheckpointError(sys_error("cannot create", path));
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string msg = sys_error("cannot write", path);
      ::close(fd);
      throw CheckpointError(msg);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const std::string msg = sys_error("cannot fsync", path);
    ::close(fd);
    throw CheckpointError(msg);
  }
  ::close(fd);
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError(sys_error("cannot open directory", dir));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0 && errno != EINVAL) throw CheckpointError(sys_error("cannot fsync directory", dir));
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

std::string staging_path(const std::string& dir, const std::string& id) { return sibling(dir, "staging", id); }

std::string prepare_save(const std::string& dir, const std::string& id, bool replace_existing) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec))
      throw CheckpointError(fmt::format("cannot save to '{}': it is not a directory", dir));
    const Listing l = list_dir(dir);
    const bool empty = l.safetensors.empty() && !l.has_manifest && !l.in_progress && l.other.empty();
    if (!empty && !l.has_manifest) {
      const std::string example = !l.safetensors.empty() ? l.safetensors.front()
                                  : !l.other.empty()     ? l.other.front()
                                                         : kInProgressName;
      throw CheckpointError(
          fmt::format("cannot save to '{}': it holds '{}' and is not a tdc checkpoint (no {}); tdc "
                      "replaces only its own checkpoints: pick an empty or new directory",
                      dir, example, kManifestName));
    }
    if (l.has_manifest && !replace_existing) {
      throw CheckpointError(
          fmt::format("cannot save to '{}': it already holds a checkpoint and replace_existing is off", dir));
    }
  } else {
    auto old = stranded(dir);
    if (!old.empty()) {
      throw CheckpointError(
          fmt::format("cannot save to '{}': '{}' holds the previous checkpoint of an interrupted save; "
                      "rename it back to '{}' or delete it first",
                      dir, old.front(), dir));
    }
  }
  fs::create_directories(parent_of(dir), ec);  // like DCP, a save creates the path to DIR
  if (ec)
    throw CheckpointError(fmt::format("cannot create '{}' for checkpoint '{}': {}", parent_of(dir), dir, ec.message()));
  const std::string staging = staging_path(dir, id);
  if (::mkdir(staging.c_str(), 0755) != 0) throw CheckpointError(sys_error("cannot create staging directory", staging));
  write_file_synced((fs::path(staging) / kInProgressName).string(), "tdc save in progress\n");
  fsync_dir(parent_of(dir));
  return staging;
}

void finish_save(const std::string& dir, const std::string& staging, const std::string& id, const Manifest& manifest) {
  write_file_synced((fs::path(staging) / kManifestName).string(), manifest_json(manifest).dump(2) + "\n");
  crash_point("manifest-written");
  if (::unlink((fs::path(staging) / kInProgressName).c_str()) != 0) {
    throw CheckpointError(sys_error("cannot remove the in-progress marker of", staging));
  }
  fsync_dir(staging);
  crash_point("before-swap");
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    if (::rename(staging.c_str(), dir.c_str()) != 0) throw CheckpointError(sys_error("cannot rename staging to", dir));
    fsync_dir(parent_of(dir));
    return;
  }
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    fsync_dir(parent_of(dir));
    crash_point("after-swap");
    remove_tree(staging);  // the old checkpoint now lives there
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
    throw CheckpointError(sys_error("cannot swap the new checkpoint into", dir));
  }
  // No RENAME_EXCHANGE on this filesystem: two renames ([Note: atomic save]).
  const std::string old = sibling(dir, "old", id);
  if (::rename(dir.c_str(), old.c_str()) != 0) throw CheckpointError(sys_error("cannot move aside", dir));
  crash_point("between-renames");
  if (::rename(staging.c_str(), dir.c_str()) != 0) throw CheckpointError(sys_error("cannot rename staging to", dir));
  fsync_dir(parent_of(dir));
  remove_tree(old);
}

void crash_point(const char* point) {
  const char* wanted = std::getenv("TDC_CHECKPOINT_CRASH_AT");
  if (wanted && std::strcmp(wanted, point) == 0) ::_exit(86);
}

}  // namespace tdc::checkpoint::detail
