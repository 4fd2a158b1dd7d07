// A cache of freed CPU memory blocks for the buffers FSDP makes and drops at every step
// (libtdc's base, no component): [Note: FSDP's CPU buffers come back].
#pragma once

#include <cstddef>
#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>

namespace tdc::core {

// [Note: FSDP's CPU buffers come back] At every step FSDP allocates the same buffers again: each
// group's all-gather input and output, its unsharded parameters' storage (freed in place at
// reshard, re-allocated at unshard), its reduce-scatter input and output. On the CPU those are
// megabytes each, which glibc's malloc hands back to the kernel when they are freed and maps again
// (zeroed, one page fault per 4 KiB) when they are allocated: about 1,000 faults per rank and step
// of the MLPStack benchmark (docs/bench/README.md, "FSDP's CPU buffers come back"). PyTorch's
// FSDP2 on CUDA does not pay this: its caching allocator keeps freed blocks for the next request.
// This is the same idea for these buffers only: a block whose last tensor is gone goes into a
// cache keyed by its exact size, and the next request of that size takes it back (FSDP's groups
// repeat their sizes every step; transformer blocks share one). A block is reused only after its
// deleter ran, i.e. when no tensor refers to it any more, so the cache adds no aliasing. The cache
// holds at most TDC_CPU_BLOCK_CACHE_MB megabytes (default 256; 0: off, every block goes straight
// back to the CPU allocator); a larger block is not cached, and the oldest blocks leave first.
// The cache is process-wide and thread-safe (Gloo's threads may drop the last reference).

// The allocator whose blocks come back (a c10::Allocator: a storage made by it re-allocates from
// it, as alloc_storage does).
c10::Allocator* reusing_cpu_allocator();
// at::empty, from reusing_cpu_allocator() when `options` is on the CPU (else at::empty itself).
at::Tensor empty_reusing(at::IntArrayRef sizes, const at::TensorOptions& options);

struct CpuBlockCacheStats {
  int64_t cached_bytes = 0;   // held by the cache now
  int64_t cached_blocks = 0;  // held by the cache now
  int64_t reused = 0;         // requests served from the cache, since the start or the last reset
  int64_t allocated = 0;      // requests the CPU allocator served, since the start or the last reset
};
CpuBlockCacheStats cpu_block_cache_stats();
// Returns every cached block to the CPU allocator and zeroes the counters (tests; a user who
// wants the memory back between phases).
void reset_cpu_block_cache();
// The cache's limit in bytes (TDC_CPU_BLOCK_CACHE_MB, read once); set_... changes it (tests).
int64_t cpu_block_cache_limit();
void set_cpu_block_cache_limit(int64_t bytes);

}  // namespace tdc::core
