// The cache of freed CPU blocks (tdc/core/cpu_block_cache.h): [Note: FSDP's CPU buffers come back].
#include "tdc/core/cpu_block_cache.h"

#include <pthread.h>

#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <ATen/ATen.h>

namespace tdc::core {

namespace {

// A block of the CPU allocator. While a tensor holds it, the DataPtr handed out carries the block
// as its context; its deleter gives the block back to the cache.
struct Block {
  c10::DataPtr real;
  size_t bytes;
};

int64_t limit_from_env() {
  const char* v = std::getenv("TDC_CPU_BLOCK_CACHE_MB");
  if (v == nullptr || *v == '\0') return int64_t{256} << 20;
  char* end = nullptr;
  const long long mb = std::strtoll(v, &end, 10);
  return (end == v || *end != '\0' || mb < 0) ? int64_t{256} << 20 : static_cast<int64_t>(mb) << 20;
}

class Cache {
 public:
  // Never destroyed: a tensor may drop its block while static destructors run.
  static Cache& instance() {
    static Cache* cache = new Cache();
    return *cache;
  }

  c10::DataPtr allocate(size_t bytes) {
    Block* b = take(bytes);
    if (b == nullptr) b = new Block{c10::GetCPUAllocator()->allocate(bytes), bytes};
    return c10::DataPtr(b->real.get(), b, &Cache::give_back, c10::Device(c10::kCPU));
  }

  CpuBlockCacheStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void reset() {
    std::vector<Block*> drop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      drop.assign(order_.begin(), order_.end());
      order_.clear();
      free_.clear();
      stats_ = {};
    }
    for (Block* b : drop) delete b;
  }

  int64_t limit() {
    std::lock_guard<std::mutex> lock(mu_);
    return limit_;
  }

  void set_limit(int64_t bytes) {
    std::vector<Block*> drop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      limit_ = bytes;
      evict_over_limit(drop);
    }
    for (Block* b : drop) delete b;
  }

 private:
  // A process forked while another thread held the lock would find it held forever (the
  // harness forks ranks): fork waits for the lock and both sides release it, as malloc does.
  Cache() : limit_(limit_from_env()) {
    pthread_atfork([] { instance().mu_.lock(); }, [] { instance().mu_.unlock(); }, [] { instance().mu_.unlock(); });
  }

  static void give_back(void* ctx) { instance().put(static_cast<Block*>(ctx)); }

  Block* take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(bytes);
    if (it == free_.end() || it->second.empty()) {
      ++stats_.allocated;
      return nullptr;
    }
    Block* b = it->second.back();
    it->second.pop_back();
    for (auto o = order_.begin(); o != order_.end(); ++o) {
      if (*o == b) {
        order_.erase(o);
        break;
      }
    }
    stats_.cached_bytes -= static_cast<int64_t>(bytes);
    --stats_.cached_blocks;
    ++stats_.reused;
    return b;
  }

  void put(Block* b) {
    std::vector<Block*> drop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (static_cast<int64_t>(b->bytes) > limit_) {
        drop.push_back(b);
      } else {
        free_[b->bytes].push_back(b);
        order_.push_back(b);
        stats_.cached_bytes += static_cast<int64_t>(b->bytes);
        ++stats_.cached_blocks;
        evict_over_limit(drop);
      }
    }
    for (Block* d : drop) delete d;  // the CPU allocator frees it, outside the lock
  }

  // The oldest blocks leave until the cache is within its limit (callers hold mu_).
  void evict_over_limit(std::vector<Block*>& drop) {
    while (stats_.cached_bytes > limit_ && !order_.empty()) {
      Block* old = order_.front();
      order_.pop_front();
      auto& same = free_[old->bytes];
      for (auto s = same.begin(); s != same.end(); ++s) {
        if (*s == old) {
          same.erase(s);
          break;
        }
      }
      stats_.cached_bytes -= static_cast<int64_t>(old->bytes);
      --stats_.cached_blocks;
      drop.push_back(old);
    }
  }

  std::mutex mu_;
  std::map<size_t, std::vector<Block*>> free_;  // by exact size
  std::deque<Block*> order_;                    // every cached block, oldest first
  CpuBlockCacheStats stats_;
  int64_t limit_;
};

struct ReusingAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return c10::GetCPUAllocator()->allocate(0);
    return Cache::instance().allocate(n);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
};

}  // namespace

c10::Allocator* reusing_cpu_allocator() {
  static ReusingAllocator* allocator = new ReusingAllocator();
  return allocator;
}

at::Tensor empty_reusing(at::IntArrayRef sizes, const at::TensorOptions& options) {
  if (options.device().type() != c10::kCPU || options.pinned_memory()) return at::empty(sizes, options);
  return at::detail::empty_generic(sizes, reusing_cpu_allocator(), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   c10::typeMetaToScalarType(options.dtype()), options.memory_format_opt());
}

CpuBlockCacheStats cpu_block_cache_stats() { return Cache::instance().stats(); }
void reset_cpu_block_cache() { Cache::instance().reset(); }
int64_t cpu_block_cache_limit() { return Cache::instance().limit(); }
void set_cpu_block_cache_limit(int64_t bytes) { Cache::instance().set_limit(bytes); }

}  // namespace tdc::core
