// The safetensors file format as PyTorch's DCP HuggingFace writer and reader use it
// (docs/design/dcp-hf-format.md): one file = [u64 LE header length N][N bytes of JSON header]
// [data section]. The header maps each tensor key to {dtype, shape, data_offsets}; the optional
// "__metadata__" object (string values only) carries DCP_SHARDING_INFO, a JSON *string* mapping
// each key to {"saved_offsets": [...]} (tdc adds "global_shape" and "checksum", which PyTorch ignores).
//
// For libtdc's own use (tdc::checkpoint's save/load stand on it) and its format tests. Every function that reads a file
// validates before it returns and throws CheckpointError naming the file, the key and the value.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdc/checkpoint/errors.h"

namespace tdc::checkpoint::detail {

// safetensors' own limit on N (the Rust reader rejects larger headers).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// "F32" <-> at::kFloat, ... (the table of dcp-hf-format.md section 3). Unknown names/types throw
// CheckpointError naming the value (and `where`, e.g. the file and key).
std::string dtype_name(at::ScalarType dtype);
at::ScalarType dtype_from_name(const std::string& name, const std::string& where);
int64_t itemsize(at::ScalarType dtype);

// XXH64 (seed 0) of bytes: detects corruption, not tampering ([Note: the chunk checksum is XXH64],
// impl/checkpoint/checksum.h); printed as 16 lowercase hex digits in headers (Python:
// xxhash.xxh64_hexdigest).
uint64_t checksum64(const void* data, size_t bytes);
std::string checksum_hex(uint64_t sum);

// One tensor entry (one chunk of a possibly larger global tensor) of a file's header.
struct ChunkHeader {
  std::string key;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;   // the chunk's shape
  uint64_t begin = 0, end = 0;  // data_offsets, relative to the data section
  // From DCP_SHARDING_INFO: the chunk's offset in the global tensor (all zeros when the file has
  // no DCP_SHARDING_INFO: a full tensor). PyTorch writes the dim size as the offset of an empty
  // chunk; such offsets are kept as read.
  std::vector<int64_t> offsets;
  std::optional<std::vector<int64_t>> global_shape;  // tdc's extra field, when present
  std::optional<uint64_t> checksum;                  // tdc's extra field, when present
  int64_t numel() const;
};

struct FileHeader {
  std::string path;
  uint64_t file_size = 0;
  uint64_t data_start = 0;  // 8 + N
  bool has_sharding_info = false;
  std::map<std::string, std::string> metadata;  // __metadata__ (DCP_SHARDING_INFO included, raw)
  std::vector<ChunkHeader> chunks;              // in data order (sorted by begin)
};

// Reads and validates a file's header without reading the data section:
//  - the file holds at least 8 bytes; 2 <= N <= kMaxHeaderBytes and 8 + N <= file size;
//  - the header is strict UTF-8 JSON, an object, first byte '{', trailing padding spaces only;
//  - __metadata__ (optional) is an object of strings; DCP_SHARDING_INFO (optional) parses as a
//    JSON object with an entry for every tensor key of the file and no other key; each entry's
//    saved_offsets has one integer >= 0 per dim; global_shape (optional) likewise and
//    offset + shape <= global_shape per dim (an empty chunk: offset <= global dim);
//  - every tensor has a known dtype, a shape of integers >= 0, data_offsets [begin, end] with
//    begin <= end, end - begin == numel * itemsize; keys are unique (the raw JSON is scanned for
//    duplicates: a JSON parser would keep one silently);
//  - the tensors tile the data section exactly: sorted by begin, no gap, no overlap, and the last
//    end == file size - data_start.
// Throws CheckpointError naming the file and what is wrong (the key and value where one is).
FileHeader read_header(const std::string& path);

// Reads the bytes of rows [row_begin, row_end) of dim 0 of `chunk` (the whole chunk of a 0-dim
// tensor) into a new contiguous CPU tensor of the chunk's dtype and shape [row_end-row_begin,
// shape[1:]...]. Unaligned data is copied, never reinterpreted in place. When the chunk has a
// checksum and the whole chunk is read, the checksum is verified (CheckpointError naming the
// file and key on a mismatch); verify_chunk checks a chunk on its own.
at::Tensor read_rows(const FileHeader& file, const ChunkHeader& chunk, int64_t row_begin, int64_t row_end);
void verify_chunk(const FileHeader& file, const ChunkHeader& chunk);

// One tensor to write: `data` is a contiguous CPU tensor (the chunk); `offsets` its place in the
// global tensor of `global_shape`.
struct WriteItem {
  std::string key;
  at::Tensor data;
  std::vector<int64_t> offsets;
  std::vector<int64_t> global_shape;
  std::optional<uint64_t> checksum;  // checksum64 of data's bytes when the caller has it (else computed)
};

// Writes one file as PyTorch's writer does: header padded with spaces so that 8 + N is a multiple
// of 8, '{' first, __metadata__ = {DCP_SHARDING_INFO (string; saved_offsets, global_shape,
// checksum per key), DCP_VERSION "1.0", format "pt"}, tensors in the order given, data tiling the
// data section. Writes to `path` directly (the caller picks a temporary name and renames), then
// fsyncs the file. Returns the file size. Throws CheckpointError on I/O errors (naming the path
// and errno's message) and std::invalid_argument on a non-contiguous / non-CPU tensor or a
// duplicate key.
uint64_t write_file(const std::string& path, const std::vector<WriteItem>& items);

}  // namespace tdc::checkpoint::detail
