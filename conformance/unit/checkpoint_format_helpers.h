// Helpers of the safetensors format unit tests (checkpoint_format_test.cpp,
// checkpoint_format_bad_file_test.cpp): a temp dir per test, raw file bytes, the errors thrown,
// tensors of every dtype of the format's table.
#pragma once

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <sys/resource.h>
#include <unistd.h>

#include "tdc/conformance/checks.h"
#include "tdc/checkpoint/detail/safetensors.h"

namespace checkpoint_format_test {

using tdc::conformance::assert_close;
using tdc::conformance::Tolerance;

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using namespace tdc::checkpoint;
using namespace tdc::checkpoint::detail;

// ------------------------------------------------------------------ helpers

// A fresh directory per test, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/tdc_checkpoint_format_XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed: " + std::string(std::strerror(errno)));
    path_ = tmpl;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// [u64 N][header, space-padded so that 8 + N is a multiple of 8 when `pad`][data]
inline std::string st_bytes(std::string header, const std::string& data, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  return le64(header.size()) + header + data;
}

inline void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

inline std::string read_raw(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// `text` as the JSON string that holds it (for DCP_SHARDING_INFO).
inline std::string json_str(const std::string& text) { return nlohmann::json(text).dump(); }

inline std::string bytes_of(const at::Tensor& t) {
  return std::string(static_cast<const char*>(t.data_ptr()), t.nbytes());
}

template <class F>
inline std::string checkpoint_error(F&& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<wrong exception type> ") + e.what();
  }
  return "<no exception>";
}

template <class F>
inline std::string invalid_argument(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<wrong exception type> ") + e.what();
  }
  return "<no exception>";
}

// Writes `bytes` as a file and expects read_header to throw CheckpointError naming the file and
// every one of `names`.
inline void expect_rejected(const std::string& bytes, const std::vector<std::string>& names) {
  TempDir dir;
  const std::string path = dir / "shard-00001-model-00001-of-00001.safetensors";
  write_raw(path, bytes);
  std::string msg = checkpoint_error([&] { read_header(path); });
  EXPECT_THAT(msg, HasSubstr("checkpoint file '" + path + "'"));
  for (const auto& name : names) EXPECT_THAT(msg, HasSubstr(name));
}

inline const ChunkHeader& chunk_of(const FileHeader& file, const std::string& key) {
  for (const auto& c : file.chunks) {
    if (c.key == key) return c;
  }
  throw std::runtime_error("no chunk '" + key + "' in " + file.path);
}

inline std::vector<std::string> keys_of(const FileHeader& file) {
  std::vector<std::string> keys;
  for (const auto& c : file.chunks) keys.push_back(c.key);
  return keys;
}

inline WriteItem item(std::string key, at::Tensor data, std::vector<int64_t> offsets = {},
                      std::vector<int64_t> global = {}) {
  if (offsets.empty()) offsets.assign(data.dim(), 0);
  if (global.empty()) global = data.sizes().vec();
  return {std::move(key), std::move(data), std::move(offsets), std::move(global)};
}

// A valid one-tensor file: "w", F32 [2, 3] at [0, 24], with DCP_SHARDING_INFO.
const std::string kOneTensorHeader = R"({"__metadata__":{"DCP_SHARDING_INFO":)" +
                                     json_str(R"({"w": {"saved_offsets": [0, 0]}})") +
                                     R"(},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})";

// Every dtype of the format's table, with random bytes (0/1 for BOOL).
inline at::Tensor random_tensor(at::ScalarType dtype, std::vector<int64_t> shape, int64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (dtype == at::kBool) return at::randint(0, 2, shape, gen, at::kByte).to(at::kBool);
  int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
  return at::randint(0, 256, {bytes}, gen, at::kByte).view(dtype).reshape(shape).contiguous();
}

const std::vector<std::pair<std::string, at::ScalarType>> kAllDtypes = {
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

}  // namespace checkpoint_format_test
