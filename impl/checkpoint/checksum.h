// The chunk checksum of tdc's safetensors files ([Note: the chunk checksum is XXH64]), in a
// streaming form so that reads can hash a chunk as it lands. Internal to libtdc.
#pragma once

#include <cstddef>
#include <cstdint>

// The reference implementation (Debian's libxxhash-dev), compiled into this TU: libtdc needs no
// libxxhash at run time.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace tdc::checkpoint::detail {

// [Note: the chunk checksum is XXH64] checksum64 is XXH64 with seed 0 (Yann Collet's xxHash, a
// public algorithm), computed by xxHash's own reference implementation, so anyone can recompute a
// header's "checksum" (Python: xxhash.xxh64_hexdigest(bytes)). It detects corruption (flipped
// bits, torn or misplaced writes), not tampering: it is not a cryptographic hash. XXH64 reads its
// input as little-endian words on every host, so the value is the same on every machine.
// Streaming form, so verify_chunk can hash a chunk without holding it in memory.
class Checksum64 {
 public:
  Checksum64() { XXH64_reset(&state_, 0); }
  void update(const void* data, size_t bytes) { XXH64_update(&state_, data, bytes); }
  uint64_t digest() const { return XXH64_digest(&state_); }

 private:
  XXH64_state_t state_;
};

}  // namespace tdc::checkpoint::detail
