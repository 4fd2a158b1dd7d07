// Fuzzing tdc::checkpoint::load: valid checkpoints (two ranks' files: sharded and replicated
// tensors, F32 / BF16 / I64, a 0-dim step, an empty shard; and the manifest) are mutated — bit
// flips anywhere, truncations, inserted and deleted bytes, edits of the JSON header (dtypes,
// shapes, data_offsets, saved_offsets, keys, metadata) with its length kept consistent — and
// loaded. Every case must end in a CheckpointError that names the checkpoint, or in a load whose
// values are exactly the saved ones (a mutation that changed nothing that matters); never a crash,
// a hang, another exception, or a wrong value. The case count and the outcome split are printed.
// A failing case prints its index and mutation: rerun with TDC_FUZZ_CASE=<index> to replay it.
//
// The same for from_bytes (to_bytes' format, [Note: the state-dict byte format]): each rank's
// bytes (plain tensors of several dtypes, 0-dim and empty ones, JSON values, DTensors on a 1-D and
// a 2-D mesh) are mutated and read back; every case ends in a CheckpointError or a state dict whose
// tensors hold exactly the bytes written.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tdc/conformance/checks.h"
#include "tdc/checkpoint/checkpoint.h"
#include "tdc/checkpoint/errors.h"
#include "tdc/checkpoint/serialize.h"
#include "tdc/comm/collectives.h"
#include "tdc/conformance/support.h"
#include "tdc/device_mesh.h"
#include "tdc/harness/harness.h"
#include "tdc/tensor/dtensor.h"

namespace {

using tdc::conformance::assert_close;
using tdc::conformance::Tolerance;

using namespace tdc;
using checkpoint::StateDict;
using harness::ctx;
namespace fs = std::filesystem;

constexpr int kCases = 2400;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
void write_bytes(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary | std::ios::trunc) << s; }

// The state saved by the two ranks: sharded rows (uneven over 2), a replicated BF16 tensor, an
// I64 tensor, a 0-dim step, a tensor whose shard on rank 1 is empty, and a JSON value.
StateDict saved_state(const DeviceMesh& mesh) {
  StateDict sd;
  sd.set("w", tensor::distribute_tensor(at::arange(5 * 3, at::kFloat).reshape({5, 3}), mesh, {tensor::Shard{0}}));
  sd.set("cols",
         tensor::distribute_tensor(at::arange(4 * 5, at::kFloat).reshape({4, 5}) / 7, mesh, {tensor::Shard{1}}));
  sd.set("tiny", tensor::distribute_tensor(at::ones({1, 2}), mesh, {tensor::Shard{0}}));
  sd.set("scale", at::tensor({1.5, -2.0}).to(at::kBFloat16));
  sd.set("ids", at::arange(7, at::kLong) * 1000003);
  sd.set("step", at::scalar_tensor(3.0, at::kFloat));
  sd.set("extra", nlohmann::json{{"epoch", 3}});
  return sd;
}

// What rank 0 loads into: plain full tensors (a world-1 reshard of everything), zeros.
StateDict fresh_target() {
  StateDict sd;
  sd.set("w", at::zeros({5, 3}));
  sd.set("cols", at::zeros({4, 5}));
  sd.set("tiny", at::zeros({1, 2}));
  sd.set("scale", at::zeros({2}, at::kBFloat16));
  sd.set("ids", at::zeros({7}, at::kLong));
  sd.set("step", at::scalar_tensor(0.0, at::kFloat));
  return sd;
}

StateDict expected_target() {
  StateDict sd;
  sd.set("w", at::arange(5 * 3, at::kFloat).reshape({5, 3}));
  sd.set("cols", at::arange(4 * 5, at::kFloat).reshape({4, 5}) / 7);
  sd.set("tiny", at::ones({1, 2}));
  sd.set("scale", at::tensor({1.5, -2.0}).to(at::kBFloat16));
  sd.set("ids", at::arange(7, at::kLong) * 1000003);
  sd.set("step", at::scalar_tensor(3.0, at::kFloat));
  return sd;
}

// ------------------------------------------------------------------ mutations

struct Mutator {
  std::mt19937_64 rng;
  size_t below(size_t n) { return n == 0 ? 0 : std::uniform_int_distribution<size_t>(0, n - 1)(rng); }

  // A value that is wrong in an interesting way for a JSON number or string.
  nlohmann::ordered_json odd_value() {
    switch (below(10)) {
      case 0:
        return -1;
      case 1:
        return 1.5;
      case 2:
        return "12";
      case 3:
        return nlohmann::ordered_json::array();
      case 4:
        return int64_t{1} << 62;
      case 5:
        return 0;
      case 6:
        return uint64_t{18446744073709551615ull};
      case 7:
        return nullptr;
      case 8:
        return nlohmann::ordered_json::object();
      default:
        return static_cast<int64_t>(below(100));
    }
  }

  // Edits one thing in a header and re-serialises it with a consistent length prefix.
  std::string edit_header(const std::string& file, std::string& what) {
    uint64_t n = 0;
    std::memcpy(&n, file.data(), 8);
    nlohmann::ordered_json h = nlohmann::ordered_json::parse(file.substr(8, n));
    std::vector<std::string> keys;
    for (auto& [k, v] : h.items()) {
      if (k != "__metadata__") keys.push_back(k);
    }
    const std::string key = keys.empty() ? "" : keys[below(keys.size())];
    std::string extra_text;
    switch (below(12)) {
      case 0:
        what = "dtype of " + key;
        h[key]["dtype"] =
            std::vector<std::string>{"F16", "BF16", "I64", "F64", "U8", "BOOL", "X9", "f32", ""}[below(9)];
        break;
      case 1:
        what = "a shape entry of " + key;
        if (!h[key]["shape"].empty())
          h[key]["shape"][below(h[key]["shape"].size())] = odd_value();
        else
          h[key]["shape"].push_back(odd_value());
        break;
      case 2:
        what = "data_offsets of " + key;
        h[key]["data_offsets"][below(2)] = odd_value();
        break;
      case 3:
        what = "key " + key + " removed";
        h.erase(key);
        break;
      case 4: {
        what = "key " + key + " renamed";
        auto v = h[key];
        h.erase(key);
        h[key + "x"] = v;
        break;
      }
      case 5: {
        what = "DCP_SHARDING_INFO edited";
        auto info = nlohmann::ordered_json::parse(h["__metadata__"]["DCP_SHARDING_INFO"].get<std::string>());
        auto& entry = info[key];
        const char* field = std::vector<const char*>{"saved_offsets", "global_shape", "checksum"}[below(3)];
        if (entry.contains(field) && entry[field].is_array() && !entry[field].empty()) {
          entry[field][below(entry[field].size())] = odd_value();
        } else {
          entry[field] = odd_value();
        }
        h["__metadata__"]["DCP_SHARDING_INFO"] = info.dump();
        break;
      }
      case 6:
        what = "DCP_SHARDING_INFO as an object";
        h["__metadata__"]["DCP_SHARDING_INFO"] =
            nlohmann::ordered_json::parse(h["__metadata__"]["DCP_SHARDING_INFO"].get<std::string>());
        break;
      case 7:
        what = "__metadata__ removed";
        h.erase("__metadata__");
        break;
      case 8:
        what = "duplicate key " + key;
        extra_text = key;
        break;
      case 9:
        what = "the shape and data_offsets of " + key + " swapped with another key's";
        if (keys.size() > 1) std::swap(h[keys[0]]["data_offsets"], h[keys[1]]["data_offsets"]);
        break;
      case 10:
        what = "a field added to " + key;
        h[key]["global_shape"] = odd_value();
        break;
      default:
        what = "an extra tensor entry";
        h["ghost"] = {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}};
        break;
    }
    std::string text = h.dump();
    if (!extra_text.empty() && !keys.empty()) {
      // Inject a second copy of the key's entry right after the opening brace.
      text = "{\"" + extra_text + "\":" + h[extra_text].dump() + "," + text.substr(1);
    }
    const uint64_t len = text.size();
    std::string out(8, '\0');
    std::memcpy(out.data(), &len, 8);
    return out + text + file.substr(8 + n);
  }

  std::string mutate(const std::string& file, std::string& what) {
    const size_t kind = below(6);
    return kind == 5 ? edit_header(file, what) : mutate_bytes(file, what, kind);
  }

  // Mutations that know nothing of the format: kind 0-1 bit flips, 2 truncation, 3 insertion,
  // 4 deletion.
  std::string mutate_bytes(const std::string& file, std::string& what, size_t kind) {
    std::string out = file;
    switch (kind) {
      case 0:
      case 1: {  // bit flips: anywhere (the length prefix, the header, the data)
        const size_t flips = 1 + below(3);
        what = fmt::format("{} bit flip(s) at", flips);
        for (size_t i = 0; i < flips; ++i) {
          const size_t at = below(2) ? below(out.size()) : below(std::min<size_t>(out.size(), 16));
          out[at] = static_cast<char>(out[at] ^ (1 << below(8)));
          what += fmt::format(" {}", at);
        }
        return out;
      }
      case 2: {
        const size_t len = below(out.size());
        what = fmt::format("truncated to {} of {} bytes", len, out.size());
        return out.substr(0, len);
      }
      case 3: {
        const size_t at = below(out.size() + 1), count = 1 + below(9);
        what = fmt::format("{} byte(s) inserted at {}", count, at);
        std::string junk(count, '\0');
        for (auto& c : junk) c = static_cast<char>(below(256));
        return out.insert(at, junk);
      }
      case 4: {
        const size_t at = below(out.size()), count = 1 + below(9);
        what = fmt::format("{} byte(s) deleted at {}", count, at);
        return out.erase(at, count);
      }
      default:
        throw std::logic_error(fmt::format("mutate_bytes: no mutation kind {}", kind));
    }
  }
};

std::string mutate_manifest(Mutator& m, const std::string& text, std::string& what) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text);
  switch (m.below(5)) {
    case 0: {
      what = "manifest: a file size";
      auto& files = j["files"];
      auto it = files.begin();
      std::advance(it, m.below(files.size()));
      *it = m.odd_value();
      break;
    }
    case 1:
      what = "manifest: a tensor shape";
      j["tensors"]["w"]["shape"] = nlohmann::ordered_json::array({m.below(9), 3});
      break;
    case 2:
      what = "manifest: version";
      j["version"] = m.odd_value();
      break;
    case 3:
      what = "manifest: a file name";
      j["files"]["../escape.safetensors"] = 10;
      break;
    default:
      what = "manifest: truncated";
      return text.substr(0, m.below(text.size()));
  }
  return j.dump();
}

// ------------------------------------------------------------------ the test

TDC_DIST_TEST(CheckpointFuzzTest, MutatedCheckpointsLoadCorrectlyOrFailCleanly, .world_size = 2, .timeout_s = 600) {
  conformance::world();
  DeviceMesh mesh = init_device_mesh("cpu", {2});
  const fs::path valid = ctx().temp_dir / "valid";
  checkpoint::save(saved_state(mesh), valid.string());
  comm::barrier();
  if (ctx().rank == 0) {
    auto self = comm::new_group({0});
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(valid)) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    ASSERT_EQ(files.size(), 3u) << "two rank files and the manifest";
    const StateDict expected = expected_target();
    {
      StateDict sd = fresh_target();
      checkpoint::load(sd, valid.string(), {.group = self});  // the unmutated checkpoint loads
    }
    int errors = 0, loads = 0, first = 0, last = kCases;
    if (const char* one = std::getenv("TDC_FUZZ_CASE")) first = std::atoi(one), last = first + 1;
    for (int c = first; c < last; ++c) {
      Mutator m{std::mt19937_64(0x7dc0000 + c)};
      const fs::path dir = ctx().temp_dir / "case";
      fs::remove_all(dir);
      fs::copy(valid, dir);
      const fs::path victim = dir / files[m.below(files.size())].filename();
      std::string what;
      const bool manifest = victim.extension() == ".json";
      const std::string bytes = read_bytes(victim);
      write_bytes(victim, manifest ? mutate_manifest(m, bytes, what) : m.mutate(bytes, what));
      const std::string label = fmt::format("case {} ({}: {})", c, victim.filename().string(), what);
      StateDict sd = fresh_target();
      try {
        checkpoint::load(sd, dir.string(), {.group = self});
      } catch (const checkpoint::CheckpointError& e) {
        ++errors;
        ASSERT_NE(std::string(e.what()).find(dir.string()), std::string::npos)
            << label << ": the error does not name the checkpoint: " << e.what();
        continue;
      } catch (const std::exception& e) {
        FAIL() << label << ": not a CheckpointError: " << e.what();
      }
      ++loads;
      for (const auto& key : expected.keys()) {
        ASSERT_TRUE(assert_close(checkpoint::as_tensor(sd, key), checkpoint::as_tensor(expected, key), Tolerance{0, 0}))
            << label << ": loaded without an error but '" << key << "' is wrong";
      }
    }
    fmt::print("checkpoint fuzz: {} cases: {} refused with a CheckpointError, {} loaded exactly\n", last - first,
               errors, loads);
    EXPECT_GT(errors, (last - first) / 2) << "most mutations must be caught";
  }
  comm::barrier();
}

// ------------------------------------------------------------------ from_bytes

constexpr int kBytesCases = 4000;  // per rank

// Each rank's state: plain tensors (F32, BF16, I64, BOOL, a 0-dim step, an empty tensor), JSON
// values, and DTensors (uneven Shard, Replicate, Partial on the 1-D mesh; StridedShard x Shard
// and Replicate x Shard on the 2-D one).
StateDict bytes_state(const DeviceMesh& mesh1, const DeviceMesh& mesh2) {
  using namespace tensor;
  StateDict sd;
  sd.set("w", distribute_tensor(at::arange(5 * 3, at::kFloat).reshape({5, 3}), mesh1, {Shard{0}}));
  sd.set("scale", at::tensor({1.5, -2.0}).to(at::kBFloat16));
  sd.set("ids", at::arange(7, at::kLong) * 1000003);
  sd.set("mask", at::tensor({1, 0, 0, 1}, at::kLong).to(at::kBool));
  sd.set("state.w.step", at::scalar_tensor(3.0, at::kFloat));
  sd.set("empty", at::empty({0, 3}));
  sd.set("param_groups", nlohmann::json::array({{{"lr", 0.01}, {"betas", {0.9, 0.999}}, {"params", {"w"}}}}));
  sd.set("rep", distribute_tensor(at::ones({2, 2}), mesh1, {Replicate{}}));
  sd.set("partial", from_local(at::ones({3}), mesh1, {Partial{}}));
  sd.set("tp_fsdp",
         distribute_tensor(at::arange(6 * 4, at::kFloat).reshape({6, 4}), mesh2, {StridedShard{0, 2}, Shard{0}}));
  sd.set("hsdp", distribute_tensor(at::arange(3 * 2, at::kFloat).reshape({3, 2}), mesh2, {Replicate{}, Shard{0}}));
  sd.set("extra", nlohmann::json{{"epoch", 3}, {"note", "x"}});
  return sd;
}

// The bytes of every tensor of `sd`, in order (what to_bytes' data section holds).
std::string tensor_bytes(const StateDict& sd) {
  std::string out;
  for (const auto& [key, value] : sd) {
    if (std::holds_alternative<nlohmann::json>(value)) continue;
    const at::Tensor t = checkpoint::local_tensor(value).contiguous();
    out.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  }
  return out;
}

// Edits one thing in the JSON header of to_bytes' output and re-serialises it with a consistent
// length prefix (the data section kept).
std::string edit_bytes_header(Mutator& m, const std::string& bytes, std::string& what) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  nlohmann::ordered_json h = nlohmann::ordered_json::parse(bytes.substr(8, n));
  auto& entries = h["entries"];
  const size_t i = m.below(entries.size());
  auto& e = entries[i];
  const std::string key = e["key"].get<std::string>();
  std::string text;
  auto one_of = [&](std::vector<nlohmann::ordered_json> values) { return values[m.below(values.size())]; };
  switch (m.below(16)) {
    case 0:
      what = "dtype of " + key;
      e["dtype"] = one_of({"F16", "BF16", "I64", "I32", "F64", "U8", "BOOL", "X9", "f32", "", 7});
      break;
    case 1:
      what = "a shape entry of " + key;
      if (e.contains("shape") && !e["shape"].empty())
        e["shape"][m.below(e["shape"].size())] = m.odd_value();
      else
        e["shape"] = nlohmann::ordered_json::array({m.odd_value()});
      break;
    case 2:
      what = "offset or nbytes of " + key;
      e[m.below(2) ? "offset" : "nbytes"] = m.odd_value();
      break;
    case 3:
      what = "checksum of " + key;
      e["checksum"] = one_of({"", "0000000000000000", "FFFFFFFFFFFFFFFF", "xyz", 12, "0123456789abcdef0"});
      break;
    case 4:
      what = "kind of " + key;
      e["kind"] = one_of({"tensor", "dtensor", "json", "DTensor", "", nullptr});
      break;
    case 5:
      what = "entry " + key + " removed";
      entries.erase(i);
      break;
    case 6: {
      what = "entry " + key + " twice, or two entries swapped";
      const size_t j = m.below(entries.size());
      if (m.below(2))
        entries.push_back(entries[i]);
      else
        std::swap(entries[i], entries[j]);
      break;
    }
    case 7: {
      what = "a field of " + key + " removed";
      std::vector<std::string> fields;
      for (auto& [k, v] : e.items()) fields.push_back(k);
      e.erase(fields[m.below(fields.size())]);
      break;
    }
    case 8:
    case 9:
    case 10: {
      auto& spec = e["spec"];  // a plain tensor or JSON entry gets a bogus one
      const size_t field = m.below(9);
      what = fmt::format("spec field {} of {}", field, key);
      if (!spec.is_object()) spec = {{"mesh", {{"shape", {1}}}}};
      auto& mesh = spec["mesh"];
      switch (field) {
        case 0:
          mesh["device_type"] = one_of({"cuda", "", 3});
          break;
        case 1:
          mesh["shape"] = one_of({nlohmann::ordered_json::array({4}), nlohmann::ordered_json::array({2, 2}),
                                  nlohmann::ordered_json::array({1, 1, 4}), nlohmann::ordered_json::array({0}),
                                  nlohmann::ordered_json::array(), m.odd_value()});
          break;
        case 2:
          if (mesh["ranks"].is_array() && !mesh["ranks"].empty())
            mesh["ranks"][m.below(mesh["ranks"].size())] = m.odd_value();
          else
            mesh["ranks"] = m.odd_value();
          break;
        case 3:
          mesh["dim_names"] =
              one_of({nlohmann::ordered_json::array({"dp"}), nlohmann::ordered_json::array({"tp", "dp"}),
                      nlohmann::ordered_json::array({1, 2}), "dp"});
          break;
        case 4: {
          auto& ps = spec["placements"];
          if (!ps.is_array() || ps.empty()) {
            ps = m.odd_value();
            break;
          }
          auto& p = ps[m.below(ps.size())];
          const char* f = std::vector<const char*>{"type", "dim", "split_factor", "reduce_op"}[m.below(4)];
          p[f] = m.below(2) ? m.odd_value()
                            : one_of({"Shard", "StridedShard", "Replicate", "Partial", "SUM", "sum", "PRODUCT"});
          break;
        }
        case 5:
        case 6: {
          auto& v = spec[field == 5 ? "shape" : "stride"];
          if (v.is_array() && !v.empty())
            v[m.below(v.size())] = m.odd_value();
          else
            v = m.odd_value();
          break;
        }
        case 7:
          spec["placements"].push_back({{"type", "Replicate"}});
          break;
        default:
          spec = m.odd_value();
          break;
      }
      break;
    }
    case 11:
      what = "a top-level field";
      h[std::vector<const char*>{"format", "version", "data_bytes", "entries"}[m.below(4)]] = m.odd_value();
      break;
    case 12:
      what = "huge shape of " + key + " with consistent nbytes";
      e["shape"] = {int64_t{1} << 31, int64_t{1} << 31};
      e["nbytes"] = int64_t{1} << 62;
      break;
    case 13:
      what = "a mesh of 100000 dims of size 1 for " + key;
      e["kind"] = "dtensor";
      e["spec"]["mesh"] = {{"device_type", "cpu"},
                           {"shape", std::vector<int64_t>(100000, 1)},
                           {"ranks", {0}},
                           {"dim_names", nlohmann::ordered_json::array()}};
      break;
    case 14:
      what = "a JSON value nested 100000 deep";
      text = h.dump();
      text.insert(text.size() - 1, ",\"deep\":" + std::string(100000, '[') + std::string(100000, ']'));
      break;
    default: {
      what = "the header length prefix";
      const uint64_t len = std::vector<uint64_t>{
          0, 1, n - 1, n + 1, bytes.size(), uint64_t{1} << 63, ~uint64_t{0}, 100'000'001}[m.below(8)];
      std::string out = bytes;
      std::memcpy(out.data(), &len, 8);
      return out;
    }
  }
  if (text.empty()) text = h.dump();
  const uint64_t len = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &len, 8);
  return out + text + bytes.substr(8 + n);
}

TDC_DIST_TEST(CheckpointFuzzTest, MutatedBytesLoadExactlyOrFailCleanly, .world_size = 2, .timeout_s = 600) {
  conformance::world();
  const DeviceMesh mesh1 = init_device_mesh("cpu", {2});
  const DeviceMesh mesh2 = init_device_mesh("cpu", {1, 2}, {"dp", "tp"});
  const std::vector<DeviceMesh> meshes = {mesh1, mesh2};
  const StateDict saved = bytes_state(mesh1, mesh2);
  const std::string bytes = checkpoint::to_bytes(saved);
  const std::string data = tensor_bytes(saved);
  ASSERT_EQ(checkpoint::to_bytes(checkpoint::from_bytes(bytes, meshes)), bytes) << "the unmutated bytes round trip";
  // Each rank mutates its own bytes (from_bytes is local: no collective).
  int errors = 0, exact = 0, changed = 0, first = 0, last = kBytesCases;
  if (const char* one = std::getenv("TDC_FUZZ_CASE")) first = std::atoi(one), last = first + 1;
  for (int c = first; c < last; ++c) {
    Mutator m{std::mt19937_64(0xb17e5000 + 1000003 * ctx().rank + c)};
    std::string what;
    const std::string input = m.below(3) ? m.mutate_bytes(bytes, what, m.below(5)) : edit_bytes_header(m, bytes, what);
    const std::string label = fmt::format("rank {} case {} ({})", ctx().rank, c, what);
    StateDict back;
    try {
      back = checkpoint::from_bytes(input, meshes);
    } catch (const checkpoint::CheckpointError& e) {
      ++errors;
      ASSERT_EQ(std::string(e.what()).rfind("from_bytes: ", 0), 0u) << label << ": " << e.what();
      continue;
    } catch (const std::exception& e) {
      FAIL() << label << ": not a CheckpointError: " << e.what();
    }
    // A mutation that got through changed the header only (keys, JSON values, a DTensor's kind):
    // every tensor still holds exactly the bytes written, and every DTensor is consistent.
    ASSERT_EQ(tensor_bytes(back), data) << label << ": tensor bytes changed without an error";
    for (const auto& [key, value] : back) {
      if (const auto* d = std::get_if<tensor::DTensor>(&value)) {
        ASSERT_TRUE(d->device_mesh() == mesh1 || d->device_mesh() == mesh2) << label << ": " << key;
        ASSERT_EQ(d->spec().local_shape(), d->to_local().sizes().vec()) << label << ": " << key;
      }
    }
    (checkpoint::to_bytes(back) == bytes ? exact : changed)++;
  }
  fmt::print(
      "rank {}: from_bytes fuzz: {} cases: {} refused with a CheckpointError, {} read back exactly, {} with "
      "a changed header (tensor bytes intact)\n",
      ctx().rank, last - first, errors, exact, changed);
  EXPECT_GT(errors, (last - first) / 2) << "most mutations must be caught";
  comm::barrier();
}

}  // namespace
