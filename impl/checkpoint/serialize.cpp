// to_bytes / from_bytes (serialize.h): a state dict as one self-describing byte string.
//
// [Note: the state-dict byte format]
//   [u64 little-endian N][N bytes of JSON header][data section]
// The header is an object:
//   {"format": "tdc-state-dict", "version": 1, "data_bytes": D,
//    "entries": [ one object per key, in the state dict's order ]}
// An entry has "key" and "kind":
//   "json":    "value" (the JSON value as it was);
//   "tensor":  "dtype" (safetensors' names: "F32", "BF16", ...), "shape", "offset", "nbytes",
//              "checksum" (XXH64 of the bytes, 16 lowercase hex digits; checksum.h);
//   "dtensor": the same for the local shard, and "spec": {"mesh": {"device_type", "shape",
//              "ranks" (row-major), "dim_names"}, "placements": [{"type": "Shard", "dim"} |
//              {"type": "StridedShard", "dim", "split_factor"} | {"type": "Replicate"} |
//              {"type": "Partial", "reduce_op": "SUM" | "AVG" | "MAX" | "MIN"}],
//              "shape" and "stride" (global)}.
// Tensors' bytes follow in entry order, contiguous, little-endian, without gaps: an entry's offset
// is the sum of the nbytes before it and the last one ends at D = the size of the data section.
// from_bytes checks all of it before it allocates anything (so no allocation exceeds the input's
// size), and a DTensor's local shape against its spec on the calling rank.
#include "tdc/checkpoint/serialize.h"

#include <bit>
#include <cstring>
#include <limits>
#include <set>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <tdc/json/reader.h>

#include "checksum.h"
#include "common.h"
#include "tdc/checkpoint/detail/safetensors.h"
#include "tdc/checkpoint/errors.h"

namespace tdc::checkpoint {

static_assert(std::endian::native == std::endian::little, "to_bytes writes tensors' memory as little-endian data");

namespace {

using nlohmann::json;

constexpr const char* kFormat = "tdc-state-dict";
constexpr int64_t kVersion = 1;
// Bounds the JSON parser's nesting (and the recursion of anything that walks a parsed value); far
// deeper than the header or an optimizer's param_groups go.
constexpr int kMaxDepth = 256;
constexpr comm::ReduceOp kReduceOps[] = {comm::ReduceOp::SUM, comm::ReduceOp::AVG, comm::ReduceOp::MAX,
                                         comm::ReduceOp::MIN};

// ------------------------------------------------------------------ to_bytes

json placement_json(const tensor::Placement& p) {
  if (const auto* s = std::get_if<tensor::Shard>(&p)) return {{"type", "Shard"}, {"dim", s->dim}};
  if (const auto* s = std::get_if<tensor::StridedShard>(&p)) {
    return {{"type", "StridedShard"}, {"dim", s->dim}, {"split_factor", s->split_factor}};
  }
  if (const auto* s = std::get_if<tensor::Partial>(&p))
    return {{"type", "Partial"}, {"reduce_op", comm::to_string(s->op)}};
  return {{"type", "Replicate"}};
}

json spec_json(const tensor::DTensorSpec& spec) {
  const at::Tensor ranks = spec.mesh.mesh().reshape({-1}).to(at::kLong).contiguous();
  json placements = json::array();
  for (const auto& p : spec.placements) placements.push_back(placement_json(p));
  return {{"mesh",
           {{"device_type", spec.mesh.device_type()},
            {"shape", spec.mesh.shape()},
            {"ranks", std::vector<int64_t>(ranks.data_ptr<int64_t>(), ranks.data_ptr<int64_t>() + ranks.numel())},
            {"dim_names", spec.mesh.mesh_dim_names()}}},
          {"placements", std::move(placements)},
          {"shape", spec.shape},
          {"stride", spec.stride}};
}

// The bytes to_bytes writes for a tensor: a contiguous CPU tensor with its conjugate / negative
// bits resolved (the tensor itself when it already is one; it is only read).
at::Tensor data_of(const at::Tensor& t, const std::string& key) {
  if (!t.defined()) throw std::invalid_argument(fmt::format("to_bytes: '{}' is an undefined tensor", key));
  if (t.layout() != at::kStrided) {
    throw std::invalid_argument(fmt::format("to_bytes: '{}' has layout {}; only strided (dense) tensors are written",
                                            key, c10::toString(t.layout())));
  }
  return t.detach().resolve_conj().resolve_neg().to(at::kCPU).contiguous();
}

// ------------------------------------------------------------------ from_bytes: reading the header

template <class... A>
[[noreturn]] void fail(fmt::format_string<A...> f, A&&... args) {
  throw CheckpointError(fmt::format("from_bytes: {}", fmt::format(f, std::forward<A>(args)...)));
}

json parse_header(std::string_view text) {
  return detail::parse_strict_json(text, kMaxDepth, "from_bytes", "the header");
}

// [Note: one JSON reader]: a field of the wrong type reads "from_bytes: the header: field
// 'entries[2].spec.mesh.shape': must be ... (value: ...)"; what the checks below find wrong with
// values of the right type names the entry by its key ("entry 2 ('w') has ...").
using Reader = tdc::json::Reader<CheckpointError>;

// Dims of a tensor: each >= 0, and both the element count and the largest contiguous stride
// (the product of max(dim, 1)) fit int64, so at::empty can neither overflow nor be asked for
// more than the caller checks.
std::vector<int64_t> read_shape(Reader& r, const char* key, const std::string& owner) {
  // 2^62: chunk arithmetic (size + n - 1) stays in range for any mesh.
  auto s = r.integers(key, 0, int64_t{1} << 62);
  int64_t numel = 1, span = 1;
  for (int64_t d : s) {
    if (__builtin_mul_overflow(numel, d, &numel) || __builtin_mul_overflow(span, std::max<int64_t>(d, 1), &span)) {
      fail("{} has \"{}\" {}, whose size overflows int64", owner, key, detail::shape_str(s));
    }
  }
  return s;
}

// The recorded mesh as DeviceMesh::to_string shows one.
struct RecordedMesh {
  std::string device_type;
  std::vector<int64_t> shape, ranks;
  std::vector<std::string> dim_names;

  bool matches(const DeviceMesh& m) const {
    if (!m.valid() || m.device_type() != device_type || m.shape() != shape || m.mesh_dim_names() != dim_names) {
      return false;
    }
    const at::Tensor r = m.mesh().reshape({-1}).to(at::kLong).contiguous();
    return std::equal(ranks.begin(), ranks.end(), r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
  }
  // Nested lists, row-major, built without recursion (a header may claim many dims of size 1);
  // cut after kMaxShown characters.
  std::string to_string() const {
    constexpr size_t kMaxShown = 400;
    std::string nested;
    std::vector<int64_t> index(shape.size(), 0);
    for (size_t k = 0; k < ranks.size() && nested.size() <= kMaxShown; ++k) {
      size_t open = 0;  // dims whose block starts at rank k
      while (open < shape.size() && index[shape.size() - 1 - open] == 0) ++open;
      if (k > 0) nested += ", ";
      nested.append(open, '[');
      nested += std::to_string(ranks[k]);
      size_t close = 0;  // dims whose block ends at rank k: advance the index like an odometer
      for (size_t d = shape.size(); d-- > 0;) {
        if (++index[d] < shape[d]) break;
        index[d] = 0;
        ++close;
      }
      nested.append(close, ']');
    }
    if (nested.size() > kMaxShown) nested = nested.substr(0, kMaxShown) + "...";
    std::string out = fmt::format("DeviceMesh('{}', {}", device_type, nested);
    if (!dim_names.empty()) {
      std::vector<std::string> q;
      for (const auto& n : dim_names) q.push_back("'" + n + "'");
      out += fmt::format(", mesh_dim_names=({}{})", fmt::join(q, ", "), q.size() == 1 ? "," : "");
    }
    return out + ")";
  }
};

RecordedMesh read_mesh(Reader& spec, const std::string& spec_owner) {
  Reader m = spec.object("mesh");
  const std::string owner = spec_owner + "'s mesh";
  RecordedMesh out;
  out.device_type = m.string("device_type", {}, /*may_be_empty=*/true);
  out.shape = m.integers("shape", 1);
  if (out.shape.empty()) fail("{} has an empty shape", owner);
  out.ranks = m.integers("ranks", 0);
  // The ranks were read one JSON number each, so their count bounds the product.
  size_t product = 1;
  for (int64_t s : out.shape) {
    if (static_cast<uint64_t>(s) > out.ranks.size() || (product *= static_cast<size_t>(s)) > out.ranks.size()) break;
  }
  if (product != out.ranks.size()) {
    fail("{} has shape {} but {} ranks", owner, detail::shape_str(out.shape), out.ranks.size());
  }
  out.dim_names = m.strings("dim_names");
  if (!out.dim_names.empty() && out.dim_names.size() != out.shape.size()) {
    fail("{} has {} dim names for {} dims", owner, out.dim_names.size(), out.shape.size());
  }
  return out;
}

tensor::Placement read_placement(Reader p, const std::string& spec_owner, int64_t mesh_dim, int64_t tensor_dims,
                                 int64_t mesh_ranks) {
  const std::string owner = fmt::format("{}'s placement on mesh dim {}", spec_owner, mesh_dim);
  const std::string type = p.string("type");
  if (type == "Replicate") return tensor::Replicate{};
  if (type == "Shard" || type == "StridedShard") {
    if (tensor_dims == 0) fail("{} is {} but the tensor is 0-dim", owner, type);
    const int64_t dim = p.integer("dim", 0, tensor_dims - 1);
    if (type == "Shard") return tensor::Shard{dim};
    // split_factor counts the shards of inner mesh dims: at most the mesh's ranks (this also
    // bounds the work of computing the local shape).
    return tensor::StridedShard{dim, p.integer("split_factor", 1, mesh_ranks)};
  }
  if (type == "Partial") {
    const std::string op = p.string("reduce_op");
    for (comm::ReduceOp o : kReduceOps) {
      if (op == comm::to_string(o)) return tensor::Partial{o};
    }
    fail("{} has reduce_op '{}' (known: SUM, AVG, MAX, MIN)", owner, op);
  }
  fail("{} has type '{}' (known: Shard, StridedShard, Replicate, Partial)", owner, type);
}

tensor::DTensorSpec read_spec(Reader& entry, const std::string& owner, const std::vector<int64_t>& local_shape,
                              at::ScalarType dtype, const std::vector<DeviceMesh>& meshes) {
  Reader spec = entry.object("spec");
  const std::string spec_owner = owner + "'s spec";
  const RecordedMesh recorded = read_mesh(spec, spec_owner);
  tensor::DTensorSpec out;
  out.dtype = dtype;
  out.shape = read_shape(spec, "shape", spec_owner);
  out.stride = spec.integers("stride", 0);
  const auto ndim = static_cast<int64_t>(local_shape.size());
  if (static_cast<int64_t>(out.shape.size()) != ndim || static_cast<int64_t>(out.stride.size()) != ndim) {
    fail("{} has global shape {} and stride {} for a local shape {}: not one entry per dim", spec_owner,
         detail::shape_str(out.shape), detail::shape_str(out.stride), detail::shape_str(local_shape));
  }
  const json& placements = spec.array("placements");
  if (placements.size() != recorded.shape.size()) {
    fail("{} has placements {}, not a list of one placement per mesh dim ({})", spec_owner,
         tdc::json::shown(placements), recorded.shape.size());
  }
  for (size_t i = 0; i < placements.size(); ++i) {
    out.placements.push_back(read_placement(spec.object_at("placements", placements, i), spec_owner,
                                            static_cast<int64_t>(i), ndim,
                                            static_cast<int64_t>(recorded.ranks.size())));
  }
  for (const DeviceMesh& m : meshes) {
    if (recorded.matches(m)) {
      out.mesh = m;
      break;
    }
  }
  if (!out.mesh.valid()) {
    std::vector<std::string> candidates;
    for (const DeviceMesh& m : meshes) candidates.push_back(m.valid() ? m.to_string() : "(no mesh)");
    fail(
        "{} was saved on {}, which matches none of the meshes given ({}): pass a mesh with that device type, rank "
        "layout and dim names",
        owner, recorded.to_string(),
        candidates.empty() ? std::string("none") : fmt::format("{}", fmt::join(candidates, "; ")));
  }
  // The local tensor must be the calling rank's shard of that spec (a rank outside the mesh has no
  // coordinate: nothing to compare with).
  const std::vector<int64_t> coord = out.mesh.get_coordinate();
  if (coord.size() == recorded.shape.size()) {
    std::vector<int64_t> expected;
    try {
      expected = out.local_shape();
    } catch (const std::exception& e) {
      fail("{}: {}", spec_owner, e.what());
    }
    if (expected != local_shape) {
      fail("{} has local shape {}, but rank {}'s shard of global shape {} with placements {} on {} is {}", owner,
           detail::shape_str(local_shape), out.mesh.get_rank(), detail::shape_str(out.shape),
           tensor::to_string(out.placements), recorded.to_string(), detail::shape_str(expected));
    }
  }
  return out;
}

}  // namespace

// ------------------------------------------------------------------ to_bytes

std::string to_bytes(const StateDict& state_dict) {
  json entries = json::array();
  std::vector<at::Tensor> data;
  uint64_t offset = 0;
  for (const auto& [key, value] : state_dict) {
    json e = {{"key", key}};
    if (const auto* j = std::get_if<json>(&value)) {
      e["kind"] = "json";
      e["value"] = *j;
      entries.push_back(std::move(e));
      continue;
    }
    const auto* d = std::get_if<tensor::DTensor>(&value);
    at::Tensor t = data_of(d ? d->to_local() : std::get<at::Tensor>(value), key);
    e["kind"] = d ? "dtensor" : "tensor";
    try {
      e["dtype"] = detail::dtype_name(t.scalar_type());
    } catch (const CheckpointError& err) {
      throw CheckpointError(fmt::format("to_bytes: '{}': {}", key, err.what()));
    }
    const auto nbytes = static_cast<uint64_t>(t.nbytes());
    e["shape"] = t.sizes().vec();
    e["offset"] = offset;
    e["nbytes"] = nbytes;
    e["checksum"] = detail::checksum_hex(detail::checksum64(t.data_ptr(), nbytes));
    if (d) e["spec"] = spec_json(d->spec());
    offset += nbytes;
    data.push_back(std::move(t));
    entries.push_back(std::move(e));
  }
  const json header = {
      {"format", kFormat}, {"version", kVersion}, {"data_bytes", offset}, {"entries", std::move(entries)}};
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    // A key or a JSON value that is not valid UTF-8: name it.
    for (const auto& [key, value] : state_dict) {
      try {
        (void)json(key).dump();
        if (const auto* j = std::get_if<json>(&value)) (void)j->dump();
      } catch (const json::exception&) {
        throw std::invalid_argument(fmt::format("to_bytes: the entry '{}' cannot be written as JSON: {}",
                                                json(key).dump(-1, ' ', false, json::error_handler_t::replace),
                                                e.what()));
      }
    }
    throw std::invalid_argument(fmt::format("to_bytes: the header cannot be written as JSON: {}", e.what()));
  }
  std::string out;
  out.reserve(8 + text.size() + offset);
  const uint64_t n = text.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += text;
  for (const at::Tensor& t : data) out.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  return out;
}

// ------------------------------------------------------------------ from_bytes

StateDict from_bytes(std::string_view bytes, const std::vector<DeviceMesh>& meshes) {
  if (bytes.size() < 8) fail("{} bytes are too few to hold the 8-byte header length", bytes.size());
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n > detail::kMaxHeaderBytes || n > bytes.size() - 8) {
    fail("the header length is {}, but {} bytes follow it (and at most {} are allowed)", n, bytes.size() - 8,
         detail::kMaxHeaderBytes);
  }
  const json header = parse_header(bytes.substr(8, n));
  const std::string_view data = bytes.substr(8 + n);
  Reader hr(header, "from_bytes: the header");
  if (const std::string format = hr.string("format", {}, true); format != kFormat) {
    fail("the header's format is '{}', not '{}'", format, kFormat);
  }
  if (const int64_t version = hr.integer("version", 0); version != kVersion) {
    fail("the header's version is {}; this reader knows version {}", version, kVersion);
  }
  if (const int64_t d = hr.integer("data_bytes", 0); static_cast<uint64_t>(d) != data.size()) {
    fail("the header says the data section holds {} bytes, but {} follow the header", d, data.size());
  }
  const json& entries = hr.array("entries");

  StateDict out;
  std::set<std::string> keys;
  uint64_t offset = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    Reader r = hr.object_at("entries", entries, i);
    const std::string key = r.string("key", {}, /*may_be_empty=*/true);
    const std::string owner = fmt::format("entry {} ('{}')", i, key);
    if (!keys.insert(key).second) fail("{}: the key is there twice", owner);
    const std::string kind = r.string("kind", {"tensor", "dtensor", "json"});
    if (kind == "json") {
      if (!entries[i].contains("value")) r.need("value");  // the missing-field error (null is a value here)
      out.set(key, entries[i].at("value"));
      continue;
    }
    const at::ScalarType dtype = detail::dtype_from_name(r.string("dtype"), "from_bytes: " + owner);
    const std::vector<int64_t> shape = read_shape(r, "shape", owner);
    int64_t numel = 1, nbytes = 0;
    for (int64_t s : shape) numel *= s;  // shape() checked the product
    if (__builtin_mul_overflow(numel, detail::itemsize(dtype), &nbytes)) {
      fail("{} has shape {} of {}: its byte count overflows int64", owner, detail::shape_str(shape),
           detail::dtype_name(dtype));
    }
    const int64_t at_offset = r.integer("offset", 0), recorded_nbytes = r.integer("nbytes", 0);
    if (recorded_nbytes != nbytes) {
      fail("{} has nbytes {}, but shape {} of {} takes {}", owner, recorded_nbytes, detail::shape_str(shape),
           detail::dtype_name(dtype), nbytes);
    }
    if (static_cast<uint64_t>(at_offset) != offset) {
      fail("{} has offset {}, but the entries before it end at {} (tensors follow each other without gaps)", owner,
           at_offset, offset);
    }
    if (static_cast<uint64_t>(nbytes) > data.size() - offset) {
      fail("{} has bytes [{}, {}), past the end of the {}-byte data section", owner, offset,
           offset + static_cast<uint64_t>(nbytes), data.size());
    }
    const std::string_view raw = data.substr(offset, static_cast<size_t>(nbytes));
    const std::string sum_text = r.string("checksum", {}, true);
    const auto sum = detail::parse_hex64(sum_text);
    if (!sum) fail("{} has checksum '{}', not 16 lowercase hex digits", owner, sum_text);
    if (detail::checksum64(raw.data(), raw.size()) != *sum) {
      fail("{}: its {} bytes do not match its checksum (corrupt data)", owner, raw.size());
    }
    offset += static_cast<uint64_t>(nbytes);
    if (kind == "dtensor") {
      tensor::DTensorSpec spec = read_spec(r, owner, shape, dtype, meshes);
      at::Tensor local = at::empty(shape, at::TensorOptions().dtype(dtype));
      if (nbytes > 0) std::memcpy(local.data_ptr(), raw.data(), raw.size());
      try {
        out.set(key, tensor::DTensor(std::move(local), std::move(spec)));
      } catch (const std::exception& err) {
        fail("{}: {}", owner, err.what());
      }
    } else {
      at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtype));
      if (nbytes > 0) std::memcpy(t.data_ptr(), raw.data(), raw.size());
      out.set(key, std::move(t));
    }
  }
  if (offset != data.size()) {
    fail("the entries' tensors end at byte {} of the {}-byte data section (bytes no entry owns)", offset, data.size());
  }
  return out;
}

}  // namespace tdc::checkpoint
