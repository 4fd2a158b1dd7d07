// Unit tests of the safetensors format layer of tdc::checkpoint (impl/checkpoint/safetensors.h):
// every malformed file read_header must reject, with a message naming the file and the key or
// value at fault. Single-process: plain TESTs.
#include "checkpoint_format_helpers.h"

namespace {

using namespace checkpoint_format_test;

// ------------------------------------------------------------------ malformed files

TEST(CheckpointFormatBadFile, ShorterThanTheHeaderLength) { expect_rejected("abc", {"3 bytes"}); }

TEST(CheckpointFormatBadFile, DataSectionShorterThanOffsets) {
  expect_rejected(st_bytes(kOneTensorHeader, std::string(16, '\0')), {"'w'", "[0, 24]", "16 bytes"});
}

TEST(CheckpointFormatBadFile, HeaderLengthPastEndOfFile) { expect_rejected(le64(1000) + "{}", {"N=1000", "10 bytes"}); }

TEST(CheckpointFormatBadFile, HeaderLengthTooSmall) { expect_rejected(le64(1) + "{", {"N=1"}); }

TEST(CheckpointFormatBadFile, HeaderOver100MB) {
  expect_rejected(le64(100000001) + "{}      ", {"N=100000001", "100000000"});
}

TEST(CheckpointFormatBadFile, PickledPrefix) {
  expect_rejected(std::string("PK\x03\x04\x14\x00\x00\x00\x08\x00", 10), {"N="});
}

TEST(CheckpointFormatBadFile, HeaderNotJson) {
  expect_rejected(st_bytes(R"({"w": {"dtype": "F32",}})", ""), {"header is not valid JSON", "parse error"});
  expect_rejected(st_bytes(R"({"w": 01})", ""), {"header is not valid JSON"});
  expect_rejected(st_bytes("{\"w\xff\": 1}", ""), {"header is not valid JSON"});  // not UTF-8
  expect_rejected(st_bytes(R"({} {})", ""), {"header is not valid JSON"});
}

TEST(CheckpointFormatBadFile, HeaderNotStartingWithBrace) {
  expect_rejected(st_bytes(" " + kOneTensorHeader, std::string(24, '\0')), {"does not start with '{'", "0x20"});
  expect_rejected(st_bytes("[1, 2]", ""), {"does not start with '{'", "0x5b"});
}

TEST(CheckpointFormatBadFile, NulPadding) {
  std::string header = kOneTensorHeader;
  header.append(8 - header.size() % 8 + 8, '\0');
  expect_rejected(st_bytes(header, std::string(24, '\0'), /*pad=*/false), {"NUL"});
}

TEST(CheckpointFormatBadFile, NonSpaceAfterTheObject) {
  expect_rejected(st_bytes(kOneTensorHeader + "\n", std::string(24, '\0')), {"0x0a", "only spaces"});
}

TEST(CheckpointFormatBadFile, JsonNestedTooDeep) {
  expect_rejected(st_bytes(R"({"__metadata__":{"a":)" + std::string(40, '[') + std::string(40, ']') + "}}", ""),
                  {"deeper than"});
}

TEST(CheckpointFormatBadFile, UnknownDtype) {
  expect_rejected(st_bytes(R"({"w":{"dtype":"F128","shape":[2],"data_offsets":[0,32]}})", std::string(32, '\0')),
                  {"tensor 'w'", "unknown dtype 'F128'"});
  expect_rejected(st_bytes(R"({"w":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0')),
                  {"tensor 'w'", "'f32'"});
  expect_rejected(st_bytes(R"({"w":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0')),
                  {"tensor 'w'", "dtype 7"});
}

TEST(CheckpointFormatBadFile, MissingFields) {
  expect_rejected(st_bytes(R"({"w":{"dtype":"F32","shape":[2]}})", ""), {"tensor 'w'", "data_offsets"});
  expect_rejected(st_bytes(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", std::string(8, '\0')),
                  {"tensor 'w'", "shape"});
  expect_rejected(st_bytes(R"({"w":[1,2]})", ""), {"tensor 'w'", "[1,2]"});
}

TEST(CheckpointFormatBadFile, DataOffsetsOverlap) {
  expect_rejected(st_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                           R"("b":{"dtype":"F32","shape":[3],"data_offsets":[8,20]}})",
                           std::string(20, '\0')),
                  {"tensor 'b'", "[8, 20]", "overlapping tensor 'a'", "[0, 12]"});
}

TEST(CheckpointFormatBadFile, DataOffsetsOutOfRange) {
  expect_rejected(st_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                           R"("b":{"dtype":"F32","shape":[3],"data_offsets":[24,36]}})",
                           std::string(24, '\0')),
                  {"tensor 'b'", "[24, 36]", "past the end of the data section (24 bytes"});
}

TEST(CheckpointFormatBadFile, DataOffsetsGap) {
  expect_rejected(st_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                           R"("b":{"dtype":"F32","shape":[3],"data_offsets":[16,28]}})",
                           std::string(28, '\0')),
                  {"[12, 16)", "tensor 'b'", "[16, 28]"});
  expect_rejected(st_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[4,16]}})", std::string(16, '\0')),
                  {"[0, 4)", "tensor 'a'"});
}

TEST(CheckpointFormatBadFile, DataOffsetsBackwards) {
  expect_rejected(st_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[12,0]}})", std::string(12, '\0')),
                  {"tensor 'a'", "[12, 0]"});
  expect_rejected(st_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12,24]}})", std::string(12, '\0')),
                  {"tensor 'a'", "[0,12,24]"});
}

// An empty tensor inside another one's bytes does not tile (safetensors: "invalid offset").
TEST(CheckpointFormatBadFile, EmptyTensorInsideAnother) {
  expect_rejected(st_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                           R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                           std::string(12, '\0')),
                  {"tensor 'a'", "tensor 'e'", "[4, 4]"});
}

TEST(CheckpointFormatBadFile, TrailingBytes) {
  expect_rejected(st_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})", std::string(16, '\0')),
                  {"4 trailing bytes", "after tensor 'a'"});
  expect_rejected(st_bytes(R"({})", std::string(3, '\0')), {"3 trailing bytes"});
}

TEST(CheckpointFormatBadFile, WrongByteCountForShape) {
  TempDir dir;
  const std::string path = dir / "shard-00001-model-00001-of-00001.safetensors";
  write_raw(path, st_bytes(R"({"layers.0.bias":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                           R"("layers.0.weight":{"dtype":"F32","shape":[3,5],"data_offsets":[12,60]}})",
                           std::string(60, '\0')));
  EXPECT_EQ(checkpoint_error([&] { read_header(path); }),
            "checkpoint file '" + path +
                "': tensor 'layers.0.weight' has data_offsets [12, 60] but shape [3, 5] of F32 needs 60 bytes");
}

TEST(CheckpointFormatBadFile, DuplicateKeys) {
  expect_rejected(st_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                           R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                           std::string(8, '\0')),
                  {"header has the key 'w' twice"});
  expect_rejected(
      st_bytes(R"({"w":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0')),
      {"'dtype' twice"});
  expect_rejected(st_bytes(R"({"__metadata__":{"DCP_SHARDING_INFO":)" +
                               json_str(R"({"w": {"saved_offsets": [0]}, "w": {"saved_offsets": [1]}})") +
                               R"(},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                           std::string(4, '\0')),
                  {"DCP_SHARDING_INFO has the key 'w' twice"});
}

TEST(CheckpointFormatBadFile, MetadataValueNotAString) {
  expect_rejected(st_bytes(R"({"__metadata__":{"format":1}})", ""), {"__metadata__ value 'format'", "is 1"});
  expect_rejected(st_bytes(R"({"__metadata__":["pt"]})", ""), {"__metadata__ is [\"pt\"]"});
}

TEST(CheckpointFormatBadFile, ShardingInfoAsObject) {
  expect_rejected(st_bytes(R"({"__metadata__":{"DCP_SHARDING_INFO":{"w":{"saved_offsets":[0]}}},)"
                           R"("w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                           std::string(4, '\0')),
                  {"'DCP_SHARDING_INFO'", "not a string"});
  expect_rejected(st_bytes(R"({"__metadata__":{"DCP_SHARDING_INFO":"[1]"}})", ""),
                  {"DCP_SHARDING_INFO is [1], not a JSON object"});
  expect_rejected(st_bytes(R"({"__metadata__":{"DCP_SHARDING_INFO":"{\"w\": "}})", ""),
                  {"DCP_SHARDING_INFO is not valid JSON"});
}

TEST(CheckpointFormatBadFile, ShardingInfoMissingAKey) {
  expect_rejected(st_bytes(R"({"__metadata__":{"DCP_SHARDING_INFO":)" + json_str(R"({"a": {"saved_offsets": [0]}})") +
                               R"(},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                               R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                           std::string(8, '\0')),
                  {"DCP_SHARDING_INFO has no entry for tensor 'b'"});
}

TEST(CheckpointFormatBadFile, ShardingInfoListsAnExtraKey) {
  expect_rejected(st_bytes(R"({"__metadata__":{"DCP_SHARDING_INFO":)" +
                               json_str(R"({"a": {"saved_offsets": [0]}, "ghost": {"saved_offsets": [0]}})") +
                               R"(},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                           std::string(4, '\0')),
                  {"'ghost'", "not a tensor of this file"});
}

TEST(CheckpointFormatBadFile, SavedOffsetsWrongRankOrValue) {
  auto with_info = [](const std::string& info) {
    return st_bytes(R"({"__metadata__":{"DCP_SHARDING_INFO":)" + json_str(info) +
                        R"(},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})",
                    std::string(24, '\0'));
  };
  expect_rejected(with_info(R"({"w": {"saved_offsets": [0]}})"), {"tensor 'w'", "saved_offsets [0]", "[2, 3]"});
  expect_rejected(with_info(R"({"w": {"saved_offsets": [0, -1]}})"), {"tensor 'w'", "-1"});
  expect_rejected(with_info(R"({"w": {"saved_offsets": [0, 0.5]}})"), {"tensor 'w'", "0.5"});
  expect_rejected(with_info(R"({"w": {}})"), {"tensor 'w'", "saved_offsets"});
  expect_rejected(with_info(R"({"w": {"saved_offsets": [0, 0], "checksum": "ABCDEF0123456789"}})"),
                  {"tensor 'w'", "checksum \"ABCDEF0123456789\""});
  expect_rejected(with_info(R"({"w": {"saved_offsets": [0, 0], "global_shape": [2]}})"),
                  {"tensor 'w'", "global_shape [2]"});
}

TEST(CheckpointFormatBadFile, OffsetPlusShapePastGlobalShape) {
  auto with_info = [](const std::string& info, const std::string& shape, int bytes) {
    return st_bytes(R"({"__metadata__":{"DCP_SHARDING_INFO":)" + json_str(info) + R"(},"w":{"dtype":"F32","shape":)" +
                        shape + R"(,"data_offsets":[0,)" + std::to_string(bytes) + "]}}",
                    std::string(bytes, '\0'));
  };
  expect_rejected(with_info(R"({"w": {"saved_offsets": [1, 0], "global_shape": [2, 3]}})", "[2,3]", 24),
                  {"tensor 'w'", "saved_offsets [1, 0]", "shape [2, 3]", "global_shape [2, 3]", "dim 0"});
  // An empty chunk may sit at the dim size (PyTorch's convention), not past it.
  EXPECT_NO_THROW({
    TempDir dir;
    write_raw(dir / "ok.safetensors",
              with_info(R"({"w": {"saved_offsets": [6, 0], "global_shape": [6, 4]}})", "[0,4]", 0));
    read_header(dir / "ok.safetensors");
  });
  expect_rejected(with_info(R"({"w": {"saved_offsets": [7, 0], "global_shape": [6, 4]}})", "[0,4]", 0),
                  {"tensor 'w'", "saved_offsets [7, 0]"});
}

TEST(CheckpointFormatBadFile, BadShapeValues) {
  auto with_shape = [](const std::string& shape, int bytes) {
    return st_bytes(
        R"({"w":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":[0,)" + std::to_string(bytes) + "]}}",
        std::string(bytes, '\0'));
  };
  expect_rejected(with_shape("[-2,3]", 24), {"tensor 'w'", "shape [-2,3]", "-2 is not an integer"});
  expect_rejected(with_shape("[1.5,2]", 12), {"tensor 'w'", "1.5"});
  expect_rejected(with_shape("[2.0,3]", 24), {"tensor 'w'", "2.0"});
  expect_rejected(with_shape("[\"2\",3]", 24), {"tensor 'w'", "\"2\""});
  expect_rejected(with_shape("[18446744073709551616]", 4), {"tensor 'w'", "1.8446744073709552e+19"});
  expect_rejected(with_shape("[9223372036854775808]", 4), {"tensor 'w'", "9223372036854775808"});
  expect_rejected(with_shape("[4294967296,4294967296,4]", 4),
                  {"tensor 'w'", "[4294967296, 4294967296, 4]", "overflows"});
  expect_rejected(with_shape("[2305843009213693952]", 4), {"tensor 'w'", "overflows"});  // 2^61 * 4 bytes
  expect_rejected(with_shape("3", 12), {"tensor 'w'", "shape 3"});
  expect_rejected(st_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,-4]}})", ""), {"tensor 'w'", "-4"});
}

TEST(CheckpointFormatBadFile, NotAFile) {
  TempDir dir;
  std::string msg = checkpoint_error([&] { read_header(dir / "missing.safetensors"); });
  EXPECT_THAT(msg, HasSubstr(dir / "missing.safetensors"));
  EXPECT_THAT(msg, HasSubstr("No such file or directory"));
  EXPECT_THAT(checkpoint_error([&] { read_header(dir.path()); }), HasSubstr("not a regular file"));
}

TEST(CheckpointFormatBadFile, ChecksumMismatchOnRead) {
  TempDir dir;
  const std::string path = dir / "shard-00001-model-00001-of-00001.safetensors";
  write_file(path, {item("layers.0.weight", at::arange(12, at::kFloat).reshape({3, 4}))});
  std::string raw = read_raw(path);
  raw[raw.size() - 5] ^= 0x40;  // a bit of element 10
  write_raw(path, raw);
  FileHeader file = read_header(path);  // the header alone is fine
  const ChunkHeader& c = chunk_of(file, "layers.0.weight");
  for (const std::string& msg :
       {checkpoint_error([&] { read_rows(file, c, 0, 3); }), checkpoint_error([&] { verify_chunk(file, c); })}) {
    EXPECT_THAT(msg, HasSubstr("checkpoint file '" + path + "'"));
    EXPECT_THAT(msg, HasSubstr("tensor 'layers.0.weight' has checksum " + checksum_hex(*c.checksum)));
    EXPECT_THAT(msg, HasSubstr("corrupt"));
  }
  // A partial read cannot be checked against the whole chunk's checksum.
  EXPECT_TRUE(assert_close(read_rows(file, c, 0, 2), at::arange(8, at::kFloat).reshape({2, 4}), Tolerance{0, 0}));
}

// read_rows and verify_chunk hash in 1 MiB pieces: a chunk of several pieces and a tail,
// corrupted in its last byte.
TEST(CheckpointFormatBadFile, ChecksumMismatchInALargeChunk) {
  TempDir dir;
  const std::string path = dir / "big.safetensors";
  at::Tensor t = random_tensor(at::kByte, {(3 << 20) + 37}, 7);
  write_file(path, {item("big", t)});
  FileHeader file = read_header(path);
  EXPECT_NO_THROW(verify_chunk(file, file.chunks[0]));
  EXPECT_TRUE(assert_close(read_rows(file, file.chunks[0], 0, t.size(0)), t, Tolerance{0, 0}));
  std::string raw = read_raw(path);
  raw.back() ^= 1;
  write_raw(path, raw);
  EXPECT_THAT(checkpoint_error([&] { verify_chunk(file, file.chunks[0]); }), HasSubstr("tensor 'big' has checksum"));
  EXPECT_THAT(checkpoint_error([&] { read_rows(file, file.chunks[0], 0, t.size(0)); }),
              HasSubstr("tensor 'big' has checksum"));
}

TEST(CheckpointFormatBadFile, BoolByteOtherThanZeroOrOne) {
  TempDir dir;
  const std::string path = dir / "mask.safetensors";
  write_raw(path,
            st_bytes(R"({"mask":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", std::string("\x01\x02\x00", 3)));
  FileHeader file = read_header(path);
  EXPECT_THAT(checkpoint_error([&] { read_rows(file, file.chunks[0], 0, 3); }),
              HasSubstr("tensor 'mask' of BOOL holds byte 0x02"));
}

// A file that changed after its header was read.
TEST(CheckpointFormatBadFile, TruncatedAfterTheHeaderWasRead) {
  TempDir dir;
  const std::string path = dir / "t.safetensors";
  write_file(path, {item("w", at::ones({4, 4}))});
  FileHeader file = read_header(path);
  fs::resize_file(path, file.file_size - 10);
  EXPECT_THAT(checkpoint_error([&] { read_rows(file, file.chunks[0], 0, 4); }), HasSubstr("tensor 'w'"));
}

}  // namespace
