// The safetensors file format of PyTorch's DCP HuggingFace writer and reader (safetensors.h):
// header validation, chunk reads, the writer and the chunk checksum.
#include "tdc/checkpoint/detail/safetensors.h"

#include "checksum.h"
#include "common.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstring>
#include <limits>
#include <set>
#include <stdexcept>
#include <string_view>

#include <ATen/ATen.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

namespace tdc::checkpoint::detail {

// safetensors stores little-endian data and tdc writes tensors' memory as it is.
static_assert(std::endian::native == std::endian::little, "tdc's safetensors I/O assumes a little-endian host");

namespace {

using nlohmann::json;

// ------------------------------------------------------------------ dtypes

struct DtypeName {
  const char* name;
  at::ScalarType dtype;
};

// dcp-hf-format.md section 3: the dtypes safetensors names and PyTorch maps to a torch dtype.
constexpr DtypeName kDtypes[] = {
    {"F32", at::kFloat},
    {"BF16", at::kBFloat16},
    {"F16", at::kHalf},
    {"F64", at::kDouble},
    {"I64", at::kLong},
    {"I32", at::kInt},
    {"I16", at::kShort},
    {"I8", at::kChar},
    {"U8", at::kByte},
    {"U16", at::kUInt16},
    {"U32", at::kUInt32},
    {"U64", at::kUInt64},
    {"BOOL", at::kBool},
    {"F8_E4M3", at::kFloat8_e4m3fn},
    {"F8_E5M2", at::kFloat8_e5m2},
    {"C64", at::kComplexFloat},
};

std::string known_dtype_names() {
  std::vector<std::string> names;
  for (const auto& d : kDtypes) names.emplace_back(d.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

// ------------------------------------------------------------------ errors

template <class... A>
[[noreturn]] void fail(const std::string& path, fmt::format_string<A...> f, A&&... args) {
  throw CheckpointError(fmt::format("checkpoint file '{}': {}", path, fmt::format(f, std::forward<A>(args)...)));
}

[[noreturn]] void fail_errno(const std::string& path, const char* what, int err) {
  throw CheckpointError(fmt::format("checkpoint file '{}': {}: {} (errno {})", path, what, std::strerror(err), err));
}

// A JSON value as it appears in an error message: compact, bounded, never throwing.
std::string shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  constexpr size_t kMax = 80;
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

// ------------------------------------------------------------------ POSIX I/O

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

Fd open_for_read(const std::string& path) {
  int fd;
  do fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) fail_errno(path, "cannot open", errno);
  return Fd(fd);
}

// The largest single read/write: Linux moves at most ~2 GiB per call anyway.
constexpr size_t kMaxIo = size_t{1} << 30;
// Reads that are hashed go in pieces this large, so each is hashed while still in the CPU's cache.
constexpr size_t kHashPiece = size_t{1} << 20;

// Reads up to `bytes` at `offset`; fewer only at end of file. Retries short reads and EINTR.
size_t pread_all(int fd, void* buf, size_t bytes, uint64_t offset, const std::string& path) {
  auto p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = ::pread(fd, p + done, std::min(bytes - done, kMaxIo), static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno(path, "read failed", errno);
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

// ------------------------------------------------------------------ strict JSON

// Deeper than safetensors' structure ever goes; bounds the parser's and dump()'s recursion.
constexpr int kMaxJsonDepth = 16;

json parse_strict(std::string_view text, const std::string& path, const std::string& what) {
  return parse_strict_json(text, kMaxJsonDepth, fmt::format("checkpoint file '{}'", path), what);
}

// An integer >= 0 that fits int64, or nullopt (negative, fractional, too large, not a number).
std::optional<int64_t> as_index(const json& v) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return static_cast<int64_t>(u);
    return std::nullopt;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<int64_t>();
  return std::nullopt;
}

// `v` as a list of integers >= 0; `what` names it in the error ("tensor 'k' has shape").
std::vector<int64_t> index_list(const json& v, const std::string& path, const std::string& what) {
  if (!v.is_array()) fail(path, "{} {}, not a list of integers", what, shown(v));
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (const json& x : v) {
    auto i = as_index(x);
    if (!i) fail(path, "{} {}: {} is not an integer >= 0 (that fits int64)", what, shown(v), shown(x));
    out.push_back(*i);
  }
  return out;
}

const json& field(const json& entry, const char* name, const std::string& path, const std::string& owner) {
  auto it = entry.find(name);
  if (it == entry.end()) fail(path, "{} has no \"{}\" (entry: {})", owner, name, shown(entry));
  return *it;
}

std::optional<int64_t> checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  return n;
}

// ------------------------------------------------------------------ read_header's parts

// The 8-byte length and the N header bytes, checked for size and padding.
std::string read_header_text(int fd, const std::string& path, uint64_t file_size) {
  if (file_size < 8) fail(path, "file holds {} bytes, fewer than the 8-byte header length", file_size);
  unsigned char len[8];
  if (pread_all(fd, len, 8, 0, path) != 8) fail(path, "file ended while reading the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n < 2) fail(path, "header length N={} is too small for a JSON object", n);
  if (n > kMaxHeaderBytes) fail(path, "header length N={} exceeds safetensors' limit of {} bytes", n, kMaxHeaderBytes);
  if (8 + n > file_size) fail(path, "header length N={} runs past the end of the file ({} bytes)", n, file_size);
  std::string text(n, '\0');
  if (pread_all(fd, text.data(), n, 8, path) != n) fail(path, "file ended while reading the {}-byte header", n);
  if (text[0] != '{') fail(path, "header does not start with '{{' (first byte 0x{:02x})", (unsigned char)text[0]);
  // Only space padding may follow the object (PyTorch pads with spaces; safetensors rejects NULs).
  size_t close = text.find_last_of('}');
  if (close != std::string::npos) {
    size_t bad = text.find_first_not_of(' ', close + 1);
    if (bad != std::string::npos) {
      if (text.find('\0', close + 1) != std::string::npos) {
        fail(path, "header is padded with NUL bytes (at header byte {}); only spaces may pad it", bad);
      }
      fail(path, "header has byte 0x{:02x} after its closing '}}' (at header byte {}); only spaces may pad it",
           (unsigned char)text[bad], bad);
    }
  }
  return text;
}

ChunkHeader parse_tensor_entry(const std::string& key, const json& entry, const std::string& path) {
  const std::string owner = fmt::format("tensor '{}'", key);
  if (!entry.is_object()) fail(path, "{} is {}, not an object with dtype, shape and data_offsets", owner, shown(entry));
  ChunkHeader c;
  c.key = key;
  const json& dtype = field(entry, "dtype", path, owner);
  if (!dtype.is_string()) fail(path, "{} has dtype {}, not a string", owner, shown(dtype));
  c.dtype = dtype_from_name(dtype.get<std::string>(), fmt::format("checkpoint file '{}': {}", path, owner));
  c.shape = index_list(field(entry, "shape", path, owner), path, owner + " has shape");
  const json& offsets = field(entry, "data_offsets", path, owner);
  auto range = index_list(offsets, path, owner + " has data_offsets");
  if (range.size() != 2) fail(path, "{} has data_offsets {}, not [begin, end]", owner, shown(offsets));
  c.begin = static_cast<uint64_t>(range[0]);
  c.end = static_cast<uint64_t>(range[1]);
  if (c.begin > c.end) fail(path, "{} has data_offsets [{}, {}]: begin is after end", owner, c.begin, c.end);
  auto numel = checked_numel(c.shape);
  int64_t bytes = 0;
  if (!numel || __builtin_mul_overflow(*numel, itemsize(c.dtype), &bytes)) {
    fail(path, "{} has shape {} of {}: its byte count overflows int64", owner, c.shape, dtype_name(c.dtype));
  }
  if (c.end - c.begin != static_cast<uint64_t>(bytes)) {
    fail(path, "{} has data_offsets [{}, {}] but shape {} of {} needs {} bytes", owner, c.begin, c.end, c.shape,
         dtype_name(c.dtype), bytes);
  }
  return c;
}

// DCP_SHARDING_INFO: {key: {"saved_offsets": [...], "global_shape": [...]?, "checksum": "hex"?}}
// for exactly the file's tensor keys.
void apply_sharding_info(const std::string& text, std::vector<ChunkHeader>& chunks, const std::string& path) {
  json info = parse_strict(text, path, "__metadata__ DCP_SHARDING_INFO");
  if (!info.is_object()) fail(path, "DCP_SHARDING_INFO is {}, not a JSON object", shown(info));
  std::map<std::string, ChunkHeader*> by_key;
  for (auto& c : chunks) by_key[c.key] = &c;
  for (const auto& [key, entry] : info.items()) {
    if (!by_key.count(key)) fail(path, "DCP_SHARDING_INFO lists '{}', which is not a tensor of this file", key);
  }
  for (auto& c : chunks) {
    const std::string owner = fmt::format("tensor '{}'", c.key);
    auto it = info.find(c.key);
    if (it == info.end()) fail(path, "DCP_SHARDING_INFO has no entry for {}", owner);
    const json& entry = *it;
    if (!entry.is_object()) fail(path, "DCP_SHARDING_INFO entry of {} is {}, not an object", owner, shown(entry));
    c.offsets = index_list(field(entry, "saved_offsets", path, "DCP_SHARDING_INFO entry of " + owner), path,
                           owner + " has saved_offsets");
    if (c.offsets.size() != c.shape.size()) {
      fail(path, "{} has saved_offsets {} for shape {} ({} dims)", owner, c.offsets, c.shape, c.shape.size());
    }
    bool empty = std::find(c.shape.begin(), c.shape.end(), 0) != c.shape.end();
    if (auto g = entry.find("global_shape"); g != entry.end()) {
      auto global = index_list(*g, path, owner + " has global_shape");
      if (global.size() != c.shape.size()) {
        fail(path, "{} has global_shape {} for shape {} ({} dims)", owner, global, c.shape, c.shape.size());
      }
      for (size_t d = 0; d < global.size(); ++d) {
        // PyTorch places an empty chunk at the dim size (e.g. [6, 0] for [0, 4] of [6, 4]).
        bool fits =
            empty ? c.offsets[d] <= global[d] : c.shape[d] <= global[d] && c.offsets[d] <= global[d] - c.shape[d];
        if (!fits) {
          fail(path, "{} has saved_offsets {} and shape {}, past its global_shape {} in dim {}", owner, c.offsets,
               c.shape, global, d);
        }
      }
      c.global_shape = std::move(global);
    }
    if (auto s = entry.find("checksum"); s != entry.end()) {
      auto sum = s->is_string() ? parse_hex64(s->get<std::string>()) : std::nullopt;
      if (!sum) fail(path, "{} has checksum {}, not 16 lowercase hex digits", owner, shown(*s));
      c.checksum = sum;
    }
  }
}

// The tensors must tile the data section: no gap, no overlap, no trailing bytes.
void check_tiling(std::vector<ChunkHeader>& chunks, uint64_t data_size, uint64_t file_size, const std::string& path) {
  for (const auto& c : chunks) {
    if (c.end > data_size) {
      fail(path, "tensor '{}' has data_offsets [{}, {}] past the end of the data section ({} bytes; file size {})",
           c.key, c.begin, c.end, data_size, file_size);
    }
  }
  std::sort(chunks.begin(), chunks.end(), [](const ChunkHeader& a, const ChunkHeader& b) {
    return std::tie(a.begin, a.end, a.key) < std::tie(b.begin, b.end, b.key);
  });
  uint64_t covered = 0;
  const ChunkHeader* prev = nullptr;
  for (const auto& c : chunks) {
    if (c.begin < covered) {
      fail(path, "tensor '{}' has data_offsets [{}, {}] overlapping tensor '{}' at [{}, {}]", c.key, c.begin, c.end,
           prev->key, prev->begin, prev->end);
    }
    if (c.begin > covered) {
      fail(path, "data bytes [{}, {}) belong to no tensor (a gap before tensor '{}' at data_offsets [{}, {}])", covered,
           c.begin, c.key, c.begin, c.end);
    }
    covered = c.end;
    prev = &c;
  }
  if (covered != data_size) {
    fail(path, "the data section has {} bytes but the tensors cover only {} ({} trailing bytes{})", data_size, covered,
         data_size - covered, prev ? fmt::format(" after tensor '{}'", prev->key) : std::string(" and no tensor"));
  }
}

struct ReadRange {
  uint64_t offset = 0;  // in the file
  size_t bytes = 0;
  bool whole = false;
  std::vector<int64_t> shape;
};

ReadRange rows_range(const FileHeader& file, const ChunkHeader& chunk, int64_t row_begin, int64_t row_end) {
  ReadRange r;
  r.shape = chunk.shape;
  uint64_t chunk_bytes = chunk.end - chunk.begin;
  if (chunk.shape.empty()) {  // a 0-dim chunk: the row range is ignored
    r = {file.data_start + chunk.begin, static_cast<size_t>(chunk_bytes), true, {}};
    return r;
  }
  if (row_begin < 0 || row_begin > row_end || row_end > chunk.shape[0]) {
    throw std::invalid_argument(fmt::format("checkpoint file '{}': rows [{}, {}) of tensor '{}' of shape {}", file.path,
                                            row_begin, row_end, chunk.key, chunk.shape));
  }
  uint64_t row_bytes = chunk.shape[0] == 0 ? 0 : chunk_bytes / static_cast<uint64_t>(chunk.shape[0]);
  r.offset = file.data_start + chunk.begin + static_cast<uint64_t>(row_begin) * row_bytes;
  r.bytes = static_cast<size_t>(static_cast<uint64_t>(row_end - row_begin) * row_bytes);
  r.whole = row_begin == 0 && row_end == chunk.shape[0];
  r.shape[0] = row_end - row_begin;
  return r;
}

// [Note: huge pages for large reads] A fresh at::empty buffer is untouched memory: filling it
// costs one page fault per 4 KiB page, which halves read throughput from the page cache. Asking
// for transparent huge pages (where the kernel offers them on request) makes it one fault per
// 2 MiB. Advice only: no effect where THP is off or the range holds no whole huge page.
void advise_huge_pages(void* data, size_t bytes) {
#ifdef MADV_HUGEPAGE
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (bytes < 4 * kHuge) return;
  auto begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  auto end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#endif
}

[[noreturn]] void checksum_mismatch(const FileHeader& file, const ChunkHeader& chunk, uint64_t got) {
  fail(file.path,
       "tensor '{}' has checksum {} in its header but its data (data_offsets [{}, {}]) hashes to {}: the file is "
       "corrupt",
       chunk.key, checksum_hex(*chunk.checksum), chunk.begin, chunk.end, checksum_hex(got));
}

}  // namespace

// ------------------------------------------------------------------ dtypes

std::string dtype_name(at::ScalarType dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.name;
  }
  throw CheckpointError(
      fmt::format("dtype {} has no safetensors name (tdc writes {})", c10::toString(dtype), known_dtype_names()));
}

at::ScalarType dtype_from_name(const std::string& name, const std::string& where) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.dtype;
  }
  throw CheckpointError(fmt::format("{}{}unknown dtype '{}' (tdc reads {})", where, where.empty() ? "" : ": ", name,
                                    known_dtype_names()));
}

int64_t itemsize(at::ScalarType dtype) {
  (void)dtype_name(dtype);  // throws for a dtype outside the table
  return static_cast<int64_t>(c10::elementSize(dtype));
}

int64_t ChunkHeader::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ------------------------------------------------------------------ reading

FileHeader read_header(const std::string& path) {
  Fd fd = open_for_read(path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail_errno(path, "cannot stat", errno);
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  FileHeader file;
  file.path = path;
  file.file_size = static_cast<uint64_t>(st.st_size);
  std::string text = read_header_text(fd.get(), path, file.file_size);
  file.data_start = 8 + text.size();

  json header = parse_strict(text, path, "header");
  if (!header.is_object()) fail(path, "header is {}, not a JSON object", shown(header));
  for (const auto& [key, value] : header.items()) {
    if (key != "__metadata__") {
      file.chunks.push_back(parse_tensor_entry(key, value, path));
      continue;
    }
    if (!value.is_object()) fail(path, "__metadata__ is {}, not an object of strings", shown(value));
    for (const auto& [name, v] : value.items()) {
      if (!v.is_string()) fail(path, "__metadata__ value '{}' is {}, not a string", name, shown(v));
      file.metadata[name] = v.get<std::string>();
    }
  }
  if (auto it = file.metadata.find("DCP_SHARDING_INFO"); it != file.metadata.end()) {
    file.has_sharding_info = true;
    apply_sharding_info(it->second, file.chunks, path);
  } else {
    for (auto& c : file.chunks) c.offsets.assign(c.shape.size(), 0);  // a full tensor
  }
  check_tiling(file.chunks, file.file_size - file.data_start, file.file_size, path);
  return file;
}

at::Tensor read_rows(const FileHeader& file, const ChunkHeader& chunk, int64_t row_begin, int64_t row_end) {
  ReadRange r = rows_range(file, chunk, row_begin, row_end);
  at::Tensor out = at::empty(r.shape, at::TensorOptions().dtype(chunk.dtype));
  auto dst = static_cast<unsigned char*>(out.data_ptr());
  const bool check = r.whole && chunk.checksum.has_value();
  Checksum64 sum;
  if (r.bytes > 0) {
    advise_huge_pages(dst, r.bytes);
    Fd fd = open_for_read(file.path);
    (void)::posix_fadvise(fd.get(), static_cast<off_t>(r.offset), static_cast<off_t>(r.bytes), POSIX_FADV_SEQUENTIAL);
    // With a checksum to verify, read in pieces that are hashed while still in the CPU's cache.
    const size_t piece = check ? kHashPiece : r.bytes;
    for (size_t done = 0; done < r.bytes;) {
      size_t want = std::min(piece, r.bytes - done);
      size_t got = pread_all(fd.get(), dst + done, want, r.offset + done, file.path);
      if (got != want) {
        fail(file.path,
             "file ended at byte {} while reading tensor '{}' (data_offsets [{}, {}]); truncated after its header was "
             "read?",
             r.offset + done + got, chunk.key, chunk.begin, chunk.end);
      }
      if (check) sum.update(dst + done, want);
      done += want;
    }
  }
  if (check && sum.digest() != *chunk.checksum) checksum_mismatch(file, chunk, sum.digest());
  if (chunk.dtype == at::kBool) {
    // A bool byte other than 0/1 is undefined behaviour for ATen's kernels: reject it here.
    auto p = static_cast<const unsigned char*>(out.data_ptr());
    unsigned char any = 0;
    for (size_t i = 0; i < r.bytes; ++i) any |= p[i];
    if (any > 1) {
      size_t i = 0;
      while (p[i] <= 1) ++i;
      fail(file.path, "tensor '{}' of BOOL holds byte 0x{:02x} (only 0 and 1 are bools)", chunk.key, p[i]);
    }
  }
  return out;
}

void verify_chunk(const FileHeader& file, const ChunkHeader& chunk) {
  if (!chunk.checksum) return;  // nothing to verify against
  Fd fd = open_for_read(file.path);
  const uint64_t bytes = chunk.end - chunk.begin;
  std::vector<unsigned char> buf(static_cast<size_t>(std::min<uint64_t>(bytes, kHashPiece)));
  Checksum64 sum;
  for (uint64_t done = 0; done < bytes;) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(bytes - done, buf.size()));
    uint64_t at = file.data_start + chunk.begin + done;
    if (pread_all(fd.get(), buf.data(), want, at, file.path) != want) {
      fail(file.path, "file ended while verifying tensor '{}' (data_offsets [{}, {}])", chunk.key, chunk.begin,
           chunk.end);
    }
    sum.update(buf.data(), want);
    done += want;
  }
  if (sum.digest() != *chunk.checksum) checksum_mismatch(file, chunk, sum.digest());
}

// ------------------------------------------------------------------ writing

namespace {

std::string json_string(const std::string& s, const std::string& path, const char* what) {
  try {
    return json(s).dump();
  } catch (const json::exception&) {
    throw std::invalid_argument(fmt::format("write_file('{}'): {} is not valid UTF-8", path, what));
  }
}

std::string int_list(const std::vector<int64_t>& v, const char* sep) { return fmt::format("[{}]", fmt::join(v, sep)); }

// The tensors write_file will write, checked; conjugate/negative views are resolved (the only copy).
std::vector<at::Tensor> checked_tensors(const std::string& path, const std::vector<WriteItem>& items) {
  std::set<std::string> keys;
  std::vector<at::Tensor> out;
  out.reserve(items.size());
  for (const auto& item : items) {
    auto bad = [&](const std::string& why) {
      return std::invalid_argument(fmt::format("write_file('{}'): tensor '{}' {}", path, item.key, why));
    };
    if (item.key == "__metadata__") throw bad("has a key reserved by safetensors");
    if (!keys.insert(item.key).second) throw bad("appears twice");
    const at::Tensor& t = item.data;
    if (!t.defined()) throw bad("is undefined");
    if (!t.device().is_cpu()) throw bad(fmt::format("is on {}, not on the CPU", t.device().str()));
    if (t.layout() != at::kStrided) throw bad("is not a strided (dense) tensor");
    if (!t.is_contiguous())
      throw bad(fmt::format("is not contiguous (shape {}, strides {})", t.sizes().vec(), t.strides().vec()));
    (void)dtype_name(t.scalar_type());
    const std::vector<int64_t> shape = t.sizes().vec();
    if (item.offsets.size() != shape.size() || item.global_shape.size() != shape.size()) {
      throw bad(fmt::format("has shape {} but offsets {} and global_shape {}", shape, item.offsets, item.global_shape));
    }
    bool empty = t.numel() == 0;
    for (size_t d = 0; d < shape.size(); ++d) {
      int64_t o = item.offsets[d], g = item.global_shape[d];
      if (o < 0 || g < 0 || (empty ? o > g : o > g - shape[d])) {
        throw bad(fmt::format("of shape {} at offsets {} does not fit global_shape {}", shape, item.offsets,
                              item.global_shape));
      }
    }
    out.push_back(t.is_conj() || t.is_neg() ? t.resolve_conj().resolve_neg() : t);
  }
  return out;
}

// Removes a file that was not finished (unless commit() is called).
class PartialFile {
 public:
  explicit PartialFile(std::string path) : path_(std::move(path)) {}
  PartialFile(const PartialFile&) = delete;
  PartialFile& operator=(const PartialFile&) = delete;
  ~PartialFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  int fd_ = -1;
  bool committed_ = false;

 private:
  std::string path_;
};

// writev() until everything went out, handling short writes and EINTR.
void write_all(int fd, std::vector<iovec> iov, const std::string& path) {
#ifdef IOV_MAX
  constexpr size_t kMaxIov = IOV_MAX;
#else
  constexpr size_t kMaxIov = 16;  // POSIX's minimum
#endif
  size_t i = 0;
  while (i < iov.size()) {
    // Bound one call's bytes so the total never approaches SSIZE_MAX.
    size_t count = 0, total = 0;
    while (i + count < iov.size() && count < kMaxIov && total < kMaxIo) total += iov[i + count++].iov_len;
    ssize_t n = ::writev(fd, &iov[i], static_cast<int>(count));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno(path, "write failed", errno);
    }
    if (n == 0) fail_errno(path, "write failed", EIO);
    auto left = static_cast<size_t>(n);
    while (left > 0) {
      if (left >= iov[i].iov_len) {
        left -= iov[i++].iov_len;
      } else {
        iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + left;
        iov[i].iov_len -= left;
        left = 0;
      }
    }
  }
}

}  // namespace

uint64_t write_file(const std::string& path, const std::vector<WriteItem>& items) {
  std::vector<at::Tensor> tensors = checked_tensors(path, items);

  // The header: PyTorch's key order (__metadata__ first), compact JSON; DCP_SHARDING_INFO in
  // Python json.dumps' style, as PyTorch writes it.
  std::string info = "{";
  std::string entries;
  uint64_t data_bytes = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const at::Tensor& t = tensors[i];
    const std::string key = json_string(items[i].key, path, "a tensor key");
    const std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
    const uint64_t bytes = t.nbytes();
    const std::string sum = checksum_hex(items[i].checksum ? *items[i].checksum : checksum64(t.data_ptr(), bytes));
    info +=
        fmt::format("{}{}: {{\"saved_offsets\": {}, \"global_shape\": {}, \"checksum\": \"{}\"}}", i == 0 ? "" : ", ",
                    key, int_list(items[i].offsets, ", "), int_list(items[i].global_shape, ", "), sum);
    entries += fmt::format(",{}:{{\"dtype\":\"{}\",\"shape\":{},\"data_offsets\":[{},{}]}}", key,
                           dtype_name(t.scalar_type()), int_list(shape, ","), data_bytes, data_bytes + bytes);
    data_bytes += bytes;
  }
  info += "}";
  std::string header = "{\"__metadata__\":{\"DCP_SHARDING_INFO\":" + json(info).dump() +
                       ",\"DCP_VERSION\":\"1.0\",\"format\":\"pt\"}" + entries + "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // 8 + N is a multiple of 8
  if (header.size() > kMaxHeaderBytes) {
    throw CheckpointError(fmt::format("checkpoint file '{}': header of {} bytes exceeds safetensors' limit of {}", path,
                                      header.size(), kMaxHeaderBytes));
  }
  std::string prefix(8, '\0');
  for (int b = 0; b < 8; ++b) prefix[b] = static_cast<char>((header.size() >> (8 * b)) & 0xff);
  prefix += header;

  std::vector<iovec> iov;
  iov.reserve(tensors.size() + 1);
  iov.push_back({prefix.data(), prefix.size()});
  for (const auto& t : tensors) {
    if (t.nbytes() > 0) iov.push_back({t.data_ptr(), t.nbytes()});
  }

  PartialFile out(path);
  do out.fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  while (out.fd_ < 0 && errno == EINTR);
  if (out.fd_ < 0) {
    out.committed_ = true;  // nothing was created
    fail_errno(path, "cannot create", errno);
  }
  write_all(out.fd_, std::move(iov), path);
  if (::fsync(out.fd_) != 0) fail_errno(path, "fsync failed", errno);
  int fd = std::exchange(out.fd_, -1);
  if (::close(fd) != 0) fail_errno(path, "close failed", errno);
  out.committed_ = true;
  return prefix.size() + data_bytes;
}

}  // namespace tdc::checkpoint::detail
