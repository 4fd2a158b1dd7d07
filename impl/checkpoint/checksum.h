// The chunk checksum of tdc's safetensors files ([Note: the chunk checksum is XXH64]), in a
// streaming form so that reads can hash a chunk as it lands. Internal to libtdc.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tdc::checkpoint::detail {

static_assert(std::endian::native == std::endian::little, "the checksum reads little-endian words as stored");

// [Note: the chunk checksum is XXH64] checksum64 is XXH64 with seed 0 (Yann Collet's xxHash, a
// public algorithm: 4 independent 64-bit lanes over 32-byte blocks, multiply/rotate mixing, a
// tail, a final avalanche), so anyone can recompute a header's "checksum" (Python:
// xxhash.xxh64_hexdigest(bytes)). It detects corruption (flipped bits, torn or misplaced writes),
// not tampering: it is not a cryptographic hash. Loads are little-endian via memcpy, so the value
// is the same on every machine.
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ULL;

inline uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;  // little-endian host (static_assert below the includes)
}
inline uint32_t load32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t lane_round(uint64_t acc, uint64_t in) { return std::rotl(acc + in * kP2, 31) * kP1; }
inline uint64_t merge_lane(uint64_t h, uint64_t lane) { return (h ^ lane_round(0, lane)) * kP1 + kP4; }

// Streaming form, so verify_chunk can hash a chunk without holding it in memory.
class Checksum64 {
 public:
  void update(const void* data, size_t bytes) {
    auto p = static_cast<const unsigned char*>(data);
    total_ += bytes;
    if (buffered_ + bytes < 32) {
      if (bytes > 0) std::memcpy(buf_ + buffered_, p, bytes);
      buffered_ += bytes;
      return;
    }
    if (buffered_ > 0) {
      size_t fill = 32 - buffered_;
      std::memcpy(buf_ + buffered_, p, fill);
      blocks(buf_, 32);
      p += fill;
      bytes -= fill;
      buffered_ = 0;
    }
    size_t whole = bytes & ~size_t{31};
    blocks(p, whole);
    buffered_ = bytes - whole;
    if (buffered_ > 0) std::memcpy(buf_, p + whole, buffered_);
  }

  uint64_t digest() const {
    uint64_t h = kP5;  // seed 0
    if (total_ >= 32) {
      h = std::rotl(v_[0], 1) + std::rotl(v_[1], 7) + std::rotl(v_[2], 12) + std::rotl(v_[3], 18);
      for (uint64_t lane : v_) h = merge_lane(h, lane);
    }
    h += total_;
    const unsigned char* p = buf_;
    size_t n = buffered_;
    for (; n >= 8; p += 8, n -= 8) h = std::rotl(h ^ lane_round(0, load64(p)), 27) * kP1 + kP4;
    if (n >= 4) {
      h = std::rotl(h ^ (uint64_t{load32(p)} * kP1), 23) * kP2 + kP3;
      p += 4;
      n -= 4;
    }
    for (; n > 0; ++p, --n) h = std::rotl(h ^ (uint64_t{*p} * kP5), 11) * kP1;
    h ^= h >> 33;
    h *= kP2;
    h ^= h >> 29;
    h *= kP3;
    h ^= h >> 32;
    return h;
  }

 private:
  void blocks(const unsigned char* p, size_t bytes) {
    uint64_t a = v_[0], b = v_[1], c = v_[2], d = v_[3];
    for (const unsigned char* end = p + bytes; p < end; p += 32) {
      a = lane_round(a, load64(p));
      b = lane_round(b, load64(p + 8));
      c = lane_round(c, load64(p + 16));
      d = lane_round(d, load64(p + 24));
    }
    v_[0] = a, v_[1] = b, v_[2] = c, v_[3] = d;
  }

  uint64_t v_[4] = {kP1 + kP2, kP2, 0, 0 - kP1};
  uint64_t total_ = 0;
  unsigned char buf_[32];
  size_t buffered_ = 0;
};

}  // namespace tdc::checkpoint::detail
