// Test counters of tdc's FSDP2 (what PyTorch's tests read from torch.cuda.memory_allocated): not
// part of the fully_shard API.
#pragma once

#include <cstdint>

#include "tdc/nn/module.h"

namespace tdc::fsdp {

// Per calling thread (rank): live unsharded parameter bytes now, and the peak since reset.
// Unsharded storage is counted from all-gather until reshard.
struct MemoryStats {
  int64_t unsharded_bytes = 0;
  int64_t peak_unsharded_bytes = 0;
};
MemoryStats memory_stats();
void reset_peak_memory_stats();

// The parameters of every fully_shard'ed module under `root` (itself included) and how many of
// them are unsharded now (PyTorch's tests count FSDPParam.sharded_state == UNSHARDED).
struct ShardedCounts {
  int params = 0;
  int unsharded = 0;
  int unsharding = 0;  // gathers issued and not yet waited for (prefetched)
};
ShardedCounts sharded_counts(const nn::Module& root);

}  // namespace tdc::fsdp
