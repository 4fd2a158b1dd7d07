// Unit tests of the safetensors format layer of tdc::checkpoint (impl/checkpoint/safetensors.h):
// write_file/read_header/read_rows round trips for every dtype, headers PyTorch 2.13 wrote
// (docs/design/dcp-hf-format.md, "Real headers"), write_file's errors, and the venv's
// `safetensors` package reading what write_file writes (and the other way round). Every malformed
// file read_header must reject: checkpoint_format_bad_file_test.cpp. Single-process: plain TESTs.
#include "checkpoint_format_helpers.h"

namespace {

using namespace checkpoint_format_test;

// ------------------------------------------------------------------ dtypes and checksum

TEST(CheckpointFormat, DtypeTableMapsBothWays) {
  for (const auto& [name, dtype] : kAllDtypes) {
    EXPECT_EQ(dtype_name(dtype), name);
    EXPECT_EQ(dtype_from_name(name, "here"), dtype);
    EXPECT_EQ(itemsize(dtype), static_cast<int64_t>(c10::elementSize(dtype))) << name;
  }
  EXPECT_THAT(checkpoint_error([] { dtype_from_name("f32", "file 'x': tensor 'k'"); }),
              HasSubstr("file 'x': tensor 'k': unknown dtype 'f32'"));
  EXPECT_THAT(checkpoint_error([] { dtype_name(at::kComplexDouble); }), HasSubstr("ComplexDouble"));
}

// [Note: the chunk checksum is XXH64] (safetensors.cpp): vectors from the xxhash package.
TEST(CheckpointFormat, ChecksumIsXXH64) {
  auto sum = [](const std::string& s) { return checksum_hex(checksum64(s.data(), s.size())); };
  EXPECT_EQ(sum(""), "ef46db3751d8e999");
  EXPECT_EQ(sum("a"), "d24ec4f1a98c6e5b");
  EXPECT_EQ(sum("abc"), "44bc2cf5ad770999");
  EXPECT_EQ(sum(std::string(31, 'x')), "60dd0d01083b99f0");
  EXPECT_EQ(sum(std::string(32, 'y')), "64da1f1d3495ce66");
  EXPECT_EQ(sum(std::string(33, 'z')), "c5241253c64e0268");
  std::string ramp;
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 256; ++i) ramp += static_cast<char>(i);
  }
  EXPECT_EQ(sum(ramp), "8e03c838c596036f");
  EXPECT_EQ(checksum_hex(0x1f), "000000000000001f");
}

// ------------------------------------------------------------------ round trips

TEST(CheckpointFormat, RoundTripEveryDtype) {
  TempDir dir;
  const std::string path = dir / "shard-00001-model-00001-of-00001.safetensors";
  std::vector<WriteItem> items;
  for (size_t i = 0; i < kAllDtypes.size(); ++i) {
    auto [name, dtype] = kAllDtypes[i];
    int64_t off = static_cast<int64_t>(i);
    items.push_back(item("t." + name, random_tensor(dtype, {4, 3}, 100 + off), {off, 0}, {4 + 2 * off, 3}));
  }
  uint64_t size = write_file(path, items);
  EXPECT_EQ(size, fs::file_size(path));

  FileHeader file = read_header(path);
  EXPECT_EQ(file.path, path);
  EXPECT_EQ(file.file_size, size);
  EXPECT_EQ(file.data_start % 8, 0u);
  EXPECT_TRUE(file.has_sharding_info);
  EXPECT_EQ(file.metadata.at("DCP_VERSION"), "1.0");
  EXPECT_EQ(file.metadata.at("format"), "pt");
  ASSERT_EQ(file.chunks.size(), items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const WriteItem& want = items[i];
    const ChunkHeader& c = file.chunks[i];  // data order = the order given
    SCOPED_TRACE(want.key);
    EXPECT_EQ(c.key, want.key);
    EXPECT_EQ(c.dtype, want.data.scalar_type());
    EXPECT_EQ(c.shape, want.data.sizes().vec());
    EXPECT_EQ(c.numel(), 12);
    EXPECT_EQ(c.offsets, want.offsets);
    EXPECT_EQ(c.global_shape, want.global_shape);
    EXPECT_EQ(c.checksum, checksum64(want.data.data_ptr(), want.data.nbytes()));
    EXPECT_EQ(c.end - c.begin, want.data.nbytes());

    at::Tensor whole = read_rows(file, c, 0, 4);
    EXPECT_EQ(whole.scalar_type(), want.data.scalar_type());
    EXPECT_EQ(whole.sizes(), want.data.sizes());
    EXPECT_EQ(bytes_of(whole), bytes_of(want.data));  // bit-exact, NaN payloads included
    at::Tensor rows = read_rows(file, c, 1, 3);
    EXPECT_EQ(rows.sizes().vec(), (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(bytes_of(rows), bytes_of(want.data.slice(0, 1, 3).contiguous()));
    EXPECT_EQ(read_rows(file, c, 2, 2).sizes().vec(), (std::vector<int64_t>{0, 3}));
    EXPECT_NO_THROW(verify_chunk(file, c));
  }
  EXPECT_THAT(invalid_argument([&] { read_rows(file, file.chunks[0], 3, 5); }), HasSubstr("rows [3, 5)"));
}

TEST(CheckpointFormat, ZeroDimTensor) {
  TempDir dir;
  const std::string path = dir / "optim.safetensors";
  write_file(path, {item("state.layers.0.weight.step", at::scalar_tensor(3.0, at::kFloat)),
                    item("state.layers.0.weight.exp_avg", at::arange(6, at::kFloat).reshape({2, 3}))});
  FileHeader file = read_header(path);
  const ChunkHeader& step = chunk_of(file, "state.layers.0.weight.step");
  EXPECT_TRUE(step.shape.empty());
  EXPECT_TRUE(step.offsets.empty());
  EXPECT_EQ(step.global_shape, std::vector<int64_t>{});
  EXPECT_EQ(step.end - step.begin, 4u);
  at::Tensor t = read_rows(file, step, 0, 1);
  EXPECT_EQ(t.dim(), 0);
  EXPECT_EQ(t.item<float>(), 3.0f);
  EXPECT_THAT(read_raw(path), HasSubstr(R"("state.layers.0.weight.step":{"dtype":"F32","shape":[],)"));
}

// An empty FSDP2 shard is saved at the dim size, as PyTorch does ([6, 0] for [0, 4] of [6, 4]).
TEST(CheckpointFormat, EmptyChunks) {
  TempDir dir;
  const std::string mixed = dir / "mixed.safetensors", empty = dir / "empty.safetensors";
  write_file(mixed, {item("a", at::empty({0, 4}), {6, 0}, {6, 4}), item("b", at::ones({2, 2}), {0, 0}, {2, 2}),
                     item("c", at::empty({0}), {6}, {6})});
  FileHeader file = read_header(mixed);
  EXPECT_EQ(keys_of(file), (std::vector<std::string>{"a", "b", "c"}));  // [0, 0], [0, 16], [16, 16]
  EXPECT_EQ(chunk_of(file, "a").offsets, (std::vector<int64_t>{6, 0}));
  EXPECT_EQ(read_rows(file, chunk_of(file, "a"), 0, 0).sizes().vec(), (std::vector<int64_t>{0, 4}));
  EXPECT_TRUE(assert_close(read_rows(file, chunk_of(file, "b"), 0, 2), at::ones({2, 2}), Tolerance{0, 0}));

  write_file(empty, {item("layers.0.weight", at::empty({0, 4}), {6, 0}, {6, 4})});
  FileHeader all_empty = read_header(empty);
  EXPECT_EQ(all_empty.file_size, all_empty.data_start);
  EXPECT_EQ(chunk_of(all_empty, "layers.0.weight").global_shape, (std::vector<int64_t>{6, 4}));
  EXPECT_NO_THROW(verify_chunk(all_empty, all_empty.chunks[0]));
}

TEST(CheckpointFormat, HeaderIsCompactSpacePaddedAndDcpShaped) {
  TempDir dir;
  for (int len = 1; len <= 16; ++len) {
    SCOPED_TRACE(len);
    const std::string path = dir / fmt::format("k{}.safetensors", len);
    const std::string key(len, 'k');
    write_file(path, {item(key, at::arange(6, at::kFloat).reshape({2, 3}), {2, 0}, {4, 3})});
    std::string raw = read_raw(path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(raw[i]);
    EXPECT_EQ((8 + n) % 8, 0u);
    std::string header = raw.substr(8, n);
    EXPECT_EQ(header[0], '{');
    size_t close = header.find_last_not_of(' ');
    EXPECT_EQ(header[close], '}');
    EXPECT_LT(n - 1 - close, 8u);  // at most 7 padding spaces
    EXPECT_THAT(header, testing::StartsWith(R"({"__metadata__":{"DCP_SHARDING_INFO":"{)"));
    EXPECT_THAT(header, HasSubstr(fmt::format(R"("{}":{{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})", key)));
    auto j = nlohmann::json::parse(header);
    EXPECT_EQ(j["__metadata__"]["DCP_VERSION"], "1.0");
    EXPECT_EQ(j["__metadata__"]["format"], "pt");
    auto info = nlohmann::json::parse(j["__metadata__"]["DCP_SHARDING_INFO"].get<std::string>());
    EXPECT_EQ(info[key]["saved_offsets"], nlohmann::json::parse("[2, 0]"));
    EXPECT_EQ(info[key]["global_shape"], nlohmann::json::parse("[4, 3]"));
    at::Tensor data = at::arange(6, at::kFloat);
    EXPECT_EQ(info[key]["checksum"], checksum_hex(checksum64(data.data_ptr(), 24)));
    EXPECT_EQ(raw.size(), 8 + n + 24);
  }
}

// ------------------------------------------------------------------ headers PyTorch wrote

// The consolidated file of dcp-hf-format.md (Real headers): no __metadata__, unpadded (N=305, so
// every tensor's data is unaligned), Python's spaced JSON, header order != sorted order.
TEST(CheckpointFormat, UnalignedConsolidatedFile) {
  const std::string header =
      R"({"scale": {"shape": [2], "dtype": "BF16", "data_offsets": [0, 4]}, "layers.0.weight": {"shape": [6, 4], "dtype": "F32", "data_offsets": [4, 100]}, "layers.0.bias": {"shape": [6], "dtype": "F32", "data_offsets": [100, 124]}, "layers.1.weight": {"shape": [3, 6], "dtype": "F32", "data_offsets": [124, 196]}})";
  ASSERT_EQ(header.size(), 305u);
  at::Tensor w0 = at::arange(24, at::kFloat).reshape({6, 4}), b0 = at::arange(6, at::kFloat) - 3,
             w1 = at::arange(18, at::kFloat).reshape({3, 6}) * 0.25;
  TempDir dir;
  const std::string path = dir / "model-00001-of-00001.safetensors";
  write_raw(path, st_bytes(header, std::string("\xc0\x3f\x00\xc0", 4) + bytes_of(w0) + bytes_of(b0) + bytes_of(w1),
                           /*pad=*/false));
  FileHeader file = read_header(path);
  EXPECT_EQ(file.data_start, 313u);
  EXPECT_FALSE(file.has_sharding_info);
  EXPECT_TRUE(file.metadata.empty());
  EXPECT_EQ(keys_of(file), (std::vector<std::string>{"scale", "layers.0.weight", "layers.0.bias", "layers.1.weight"}));
  for (const auto& c : file.chunks) {
    EXPECT_EQ(c.offsets, std::vector<int64_t>(c.shape.size(), 0)) << c.key;  // full tensors
    EXPECT_FALSE(c.global_shape.has_value());
    EXPECT_FALSE(c.checksum.has_value());
  }
  at::Tensor scale = read_rows(file, chunk_of(file, "scale"), 0, 2);
  EXPECT_EQ(scale.scalar_type(), at::kBFloat16);
  EXPECT_EQ(scale[0].item<float>(), 1.5f);
  EXPECT_EQ(scale[1].item<float>(), -2.0f);
  EXPECT_TRUE(assert_close(read_rows(file, chunk_of(file, "layers.0.weight"), 0, 6), w0, Tolerance{0, 0}));
  EXPECT_TRUE(
      assert_close(read_rows(file, chunk_of(file, "layers.0.weight"), 2, 5), w0.slice(0, 2, 5), Tolerance{0, 0}));
  EXPECT_TRUE(assert_close(read_rows(file, chunk_of(file, "layers.0.bias"), 1, 6), b0.slice(0, 1, 6), Tolerance{0, 0}));
  EXPECT_TRUE(assert_close(read_rows(file, chunk_of(file, "layers.1.weight"), 0, 3), w1, Tolerance{0, 0}));
}

// FSDP2, ws=2, rank 1's file as torch wrote it (N=432: 4 trailing spaces).
TEST(CheckpointFormat, GoldenPyTorchHeaderWs2Rank1) {
  const std::string header =
      R"({"__metadata__":{"DCP_SHARDING_INFO":"{\"layers.0.weight\": {\"saved_offsets\": [3, 0]}, \"layers.0.bias\": {\"saved_offsets\": [3]}, \"layers.1.weight\": {\"saved_offsets\": [2, 0]}}","DCP_VERSION":"1.0","format":"pt"},"layers.0.bias":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"layers.0.weight":{"dtype":"F32","shape":[3,4],"data_offsets":[12,60]},"layers.1.weight":{"dtype":"F32","shape":[1,6],"data_offsets":[60,84]}})"
      "    ";
  ASSERT_EQ(header.size(), 432u);
  at::Tensor bias = at::arange(3, at::kFloat), w0 = at::arange(12, at::kFloat).reshape({3, 4}) + 100,
             w1 = at::arange(6, at::kFloat).reshape({1, 6}) - 7;
  TempDir dir;
  const std::string path = dir / "shard-00002-model-00001-of-00001.safetensors";
  write_raw(path, st_bytes(header, bytes_of(bias) + bytes_of(w0) + bytes_of(w1)));
  FileHeader file = read_header(path);
  EXPECT_EQ(file.data_start, 440u);
  EXPECT_EQ(file.file_size, 440u + 84);
  EXPECT_TRUE(file.has_sharding_info);
  EXPECT_EQ(keys_of(file), (std::vector<std::string>{"layers.0.bias", "layers.0.weight", "layers.1.weight"}));
  EXPECT_EQ(chunk_of(file, "layers.0.weight").offsets, (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(chunk_of(file, "layers.0.bias").offsets, (std::vector<int64_t>{3}));
  EXPECT_EQ(chunk_of(file, "layers.1.weight").offsets, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(chunk_of(file, "layers.0.weight").begin, 12u);
  EXPECT_FALSE(chunk_of(file, "layers.0.weight").global_shape.has_value());
  EXPECT_TRUE(assert_close(read_rows(file, chunk_of(file, "layers.0.bias"), 0, 3), bias, Tolerance{0, 0}));
  EXPECT_TRUE(assert_close(read_rows(file, chunk_of(file, "layers.0.weight"), 0, 3), w0, Tolerance{0, 0}));
  EXPECT_TRUE(assert_close(read_rows(file, chunk_of(file, "layers.1.weight"), 0, 1), w1, Tolerance{0, 0}));
}

// FSDP2, ws=4, rank 3: every shard empty, at the dim size; N=424, file size 432.
TEST(CheckpointFormat, GoldenPyTorchHeaderWs4AllEmpty) {
  const std::string header =
      R"({"__metadata__":{"DCP_VERSION":"1.0","format":"pt","DCP_SHARDING_INFO":"{\"layers.0.weight\": {\"saved_offsets\": [6, 0]}, \"layers.0.bias\": {\"saved_offsets\": [6]}, \"layers.1.weight\": {\"saved_offsets\": [3, 0]}}"},"layers.0.bias":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"layers.0.weight":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},"layers.1.weight":{"dtype":"F32","shape":[0,6],"data_offsets":[0,0]}})";
  TempDir dir;
  const std::string path = dir / "shard-00004-model-00001-of-00001.safetensors";
  write_raw(path, st_bytes(header, ""));
  FileHeader file = read_header(path);
  EXPECT_EQ(file.data_start, 432u);
  EXPECT_EQ(file.file_size, 432u);
  EXPECT_EQ(chunk_of(file, "layers.0.weight").offsets, (std::vector<int64_t>{6, 0}));
  EXPECT_EQ(chunk_of(file, "layers.0.bias").offsets, (std::vector<int64_t>{6}));
  EXPECT_EQ(chunk_of(file, "layers.1.weight").offsets, (std::vector<int64_t>{3, 0}));
  for (const auto& c : file.chunks) {
    EXPECT_EQ(c.numel(), 0) << c.key;
    EXPECT_EQ(read_rows(file, c, 0, 0).numel(), 0) << c.key;
  }
  EXPECT_EQ(read_rows(file, chunk_of(file, "layers.1.weight"), 0, 0).sizes().vec(), (std::vector<int64_t>{0, 6}));
}

// ------------------------------------------------------------------ write_file's errors

TEST(CheckpointFormatWrite, RejectsBadItems) {
  TempDir dir;
  const std::string path = dir / "x.safetensors";
  at::Tensor t = at::ones({2, 3});
  EXPECT_THAT(invalid_argument([&] { write_file(path, {item("w", t.t())}); }), HasSubstr("'w' is not contiguous"));
  EXPECT_THAT(invalid_argument([&] {
                write_file(path, {item("w", t), item("w", t)});
              }),
              HasSubstr("'w' appears twice"));
  EXPECT_THAT(invalid_argument([&] { write_file(path, {item("__metadata__", t)}); }), HasSubstr("reserved"));
  EXPECT_THAT(invalid_argument([&] { write_file(path, {item("w", t, {0}, {2, 3})}); }), HasSubstr("offsets [0]"));
  EXPECT_THAT(invalid_argument([&] {
                write_file(path, {item("w", t, {1, 0}, {2, 3})});
              }),
              HasSubstr("does not fit global_shape [2, 3]"));
  EXPECT_THAT(invalid_argument([&] {
                write_file(path, {WriteItem{"w", at::Tensor(), {}, {}}});
              }),
              HasSubstr("undefined"));
  EXPECT_THAT(invalid_argument([&] { write_file(path, {item("w\xff", t)}); }), HasSubstr("not valid UTF-8"));
  EXPECT_THAT(checkpoint_error([&] { write_file(path, {item("w", at::ones({2}, at::kComplexDouble))}); }),
              HasSubstr("ComplexDouble"));
  EXPECT_FALSE(fs::exists(path));
}

TEST(CheckpointFormatWrite, ConjugateViewIsWrittenResolved) {
  TempDir dir;
  at::Tensor z = at::complex(at::arange(3, at::kFloat), at::ones({3}));
  write_file(dir / "z.safetensors", {item("z", z.conj())});
  FileHeader file = read_header(dir / "z.safetensors");
  EXPECT_TRUE(assert_close(read_rows(file, file.chunks[0], 0, 3), z.conj().resolve_conj(), Tolerance{0, 0}));
}

TEST(CheckpointFormatWrite, CannotCreateNamesThePath) {
  TempDir dir;
  const std::string path = dir / "no-such-dir/x.safetensors";
  std::string msg = checkpoint_error([&] { write_file(path, {item("w", at::ones({2}))}); });
  EXPECT_THAT(msg, HasSubstr("'" + path + "'"));
  EXPECT_THAT(msg, HasSubstr("No such file or directory"));
}

// A write that fails midway (here: the file size limit, EFBIG) removes the partial file.
TEST(CheckpointFormatWrite, FailedWriteRemovesThePartialFile) {
  TempDir dir;
  const std::string path = dir / "partial.safetensors";
  at::Tensor big = at::ones({1 << 18});  // 1 MiB
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 64 << 10;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string msg = checkpoint_error([&] { write_file(path, {item("w", big)}); });
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_THAT(msg, HasSubstr("checkpoint file '" + path + "': write failed"));
  EXPECT_THAT(msg, HasSubstr(std::strerror(EFBIG)));
  EXPECT_FALSE(fs::exists(path));
}

// ------------------------------------------------------------------ PyTorch's side

// The venv's python: $TDC_PYTHON, else .venv/bin/python above the test binary or the current dir.
std::optional<std::string> find_python() {
  if (const char* env = std::getenv("TDC_PYTHON"); env && *env) return std::string(env);
  std::vector<fs::path> starts;
  std::error_code ec;
  if (auto exe = fs::read_symlink("/proc/self/exe", ec); !ec) starts.push_back(exe.parent_path());
  starts.push_back(fs::current_path(ec));
  for (fs::path p : starts) {
    for (; !p.empty(); p = p.parent_path()) {
      if (fs::exists(p / ".venv/bin/python")) return (p / ".venv/bin/python").string();
      if (p == p.root_path()) break;
    }
  }
  return std::nullopt;
}

// Runs `script` under the venv's python with the directory as argv[1]; returns {exit code, output}.
std::pair<int, std::string> run_python(const std::string& python, const TempDir& dir, const std::string& script) {
  write_raw(dir / "script.py", script);
  std::string cmd =
      "'" + python + "' '" + (dir / "script.py") + "' '" + dir.path() + "' > '" + (dir / "python.log") + "' 2>&1";
  int rc = std::system(cmd.c_str());
  return {rc, read_raw(dir / "python.log")};
}

// Skips unless the venv's python has `safetensors` (./tdc installs it; dcp-hf-format.md).
std::optional<std::string> python_with_safetensors(const TempDir& dir) {
  auto python = find_python();
  if (!python) return std::nullopt;
  auto [rc, out] = run_python(*python, dir, "import safetensors, torch\n");
  if (rc != 0) return std::nullopt;
  return python;
}

// What write_file writes, safetensors.torch.load_file and DCP's HuggingFaceStorageReader load
// (values bit-exact), and what safetensors.torch.save_file writes, read_header/read_rows read.
TEST(CheckpointFormatInterop, SafetensorsAndDcpReadWhatWriteFileWrites) {
  TempDir dir;
  auto python = python_with_safetensors(dir);
  if (!python) GTEST_SKIP() << "no venv python with `safetensors` (set TDC_PYTHON, or pip install safetensors)";
  fs::create_directory(dir / "ckpt");
  at::Tensor w = at::arange(24, at::kFloat).reshape({6, 4}) * 0.5 - 3;
  write_file(dir / "ckpt/shard-00001-model-00001-of-00001.safetensors",
             {item("w", w.slice(0, 0, 4).contiguous(), {0, 0}, {6, 4}),
              item("bf16", (at::arange(6, at::kFloat) - 2.5).to(at::kBFloat16)),
              item("i64", at::arange(5, at::kLong) * 1000000000007LL),
              item("mask", at::tensor({1, 0, 1}, at::kByte).to(at::kBool)),
              item("f8", at::tensor({0.5, 1.0, -2.0}, at::kFloat).to(at::kFloat8_e4m3fn)),
              item("c64", at::complex(at::arange(3, at::kFloat), -at::ones({3}))),
              item("step", at::scalar_tensor(3.0, at::kFloat))});
  write_file(dir / "ckpt/shard-00002-model-00001-of-00001.safetensors",
             {item("w", w.slice(0, 4, 6).contiguous(), {4, 0}, {6, 4})});
  auto [rc, out] = run_python(*python, dir, R"(
import json, sys, torch
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from safetensors.torch import load_file, save_file

d = sys.argv[1]
w = torch.arange(24, dtype=torch.float32).reshape(6, 4) * 0.5 - 3
want = {
    "w": w[:4],
    "bf16": (torch.arange(6, dtype=torch.float32) - 2.5).to(torch.bfloat16),
    "i64": torch.arange(5, dtype=torch.int64) * 1000000000007,
    "mask": torch.tensor([True, False, True]),
    "f8": torch.tensor([0.5, 1.0, -2.0]).to(torch.float8_e4m3fn),
    "c64": torch.complex(torch.arange(3, dtype=torch.float32), -torch.ones(3)),
    "step": torch.tensor(3.0),
}
def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and \
        a.reshape(-1).view(torch.uint8).equal(b.reshape(-1).view(torch.uint8))
f1 = d + "/ckpt/shard-00001-model-00001-of-00001.safetensors"
got = load_file(f1)
assert sorted(got) == sorted(want), sorted(got)
for k in want:
    assert same(got[k], want[k]), (k, got[k], want[k])
with safe_open(f1, "pt") as f:
    meta = f.metadata()
assert meta["DCP_VERSION"] == "1.0" and meta["format"] == "pt", meta
info = json.loads(meta["DCP_SHARDING_INFO"])
assert info["w"]["saved_offsets"] == [0, 0] and info["step"]["saved_offsets"] == [], info

# DCP's reader reassembles "w" from both files (no process group: world size 1).
sd = {"w": torch.zeros(6, 4), "step": torch.tensor(0.0), "i64": torch.zeros(5, dtype=torch.int64)}
dcp.load(sd, storage_reader=dcp.HuggingFaceStorageReader(d + "/ckpt"))
assert sd["w"].equal(w), sd["w"]
assert sd["step"].item() == 3.0 and sd["i64"].equal(want["i64"]), sd

# The other way: safetensors' own writer, read by tdc.
save_file({"x": w, "y": torch.tensor([1, -2], dtype=torch.int16)}, d + "/py.safetensors", metadata={"format": "pt"})
print("OK")
)");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_THAT(out, HasSubstr("OK"));
  FileHeader file = read_header(dir / "py.safetensors");
  EXPECT_FALSE(file.has_sharding_info);
  EXPECT_EQ(file.metadata.at("format"), "pt");
  EXPECT_TRUE(assert_close(read_rows(file, chunk_of(file, "x"), 0, 6), w, Tolerance{0, 0}));
  EXPECT_TRUE(
      assert_close(read_rows(file, chunk_of(file, "y"), 0, 2), at::tensor({1, -2}, at::kShort), Tolerance{0, 0}));
}

}  // namespace
