// Unit tests of [Note: FSDP's CPU buffers come back] (tdc/core/cpu_block_cache.h): a block is
// reused only once no tensor holds it, never handed out twice, the cache stays within its limit,
// and FSDP's steps reuse their buffers with the same results.
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>

#include "tdc/conformance/support.h"
#include "tdc/core/cpu_block_cache.h"
#include "tdc/core/storage.h"
#include "tdc/fixtures/models.h"
#include "tdc/fsdp/fully_shard.h"
#include "tdc/harness/harness.h"

namespace {

using tdc::core::cpu_block_cache_stats;
using tdc::core::empty_reusing;

const void* ptr_of(const at::Tensor& t) { return t.storage().data(); }

// Each test starts from an empty cache with the default limit, and leaves it so.
class CpuBlockCache : public testing::Test {
 protected:
  void SetUp() override {
    limit_ = tdc::core::cpu_block_cache_limit();
    tdc::core::reset_cpu_block_cache();
  }
  void TearDown() override {
    tdc::core::set_cpu_block_cache_limit(limit_);
    tdc::core::reset_cpu_block_cache();
  }
  int64_t limit_ = 0;
};

TEST_F(CpuBlockCache, ABlockComesBackOnlyWhenNoTensorHoldsIt) {
  at::Tensor a = empty_reusing({1000}, at::kFloat);
  const void* pa = ptr_of(a);
  at::Tensor b = empty_reusing({1000}, at::kFloat);
  EXPECT_NE(ptr_of(b), pa) << "a is alive: its block is not free";
  at::Tensor view = a.narrow(0, 10, 100);
  a.reset();
  EXPECT_EQ(cpu_block_cache_stats().cached_blocks, 0) << "a view still holds the block";
  view.reset();
  EXPECT_EQ(cpu_block_cache_stats().cached_blocks, 1);
  EXPECT_EQ(cpu_block_cache_stats().cached_bytes, 4000);
  at::Tensor c = empty_reusing({1000}, at::kFloat), d = empty_reusing({1000}, at::kFloat);
  EXPECT_EQ(ptr_of(c), pa) << "the same size takes the cached block back";
  EXPECT_NE(ptr_of(d), pa) << "a block is handed out once";
  EXPECT_NE(ptr_of(d), ptr_of(b));
  at::Tensor e = empty_reusing({250, 4}, at::kInt);  // same bytes, another shape and dtype
  EXPECT_EQ(cpu_block_cache_stats().reused, 1);
  b.reset();
  at::Tensor f = empty_reusing({999}, at::kFloat);  // another size: not b's block
  EXPECT_EQ(cpu_block_cache_stats().reused, 1);
  EXPECT_EQ(cpu_block_cache_stats().allocated, 5);
  EXPECT_EQ(cpu_block_cache_stats().cached_blocks, 1);
}

// FSDP's unsharded parameters are freed and re-allocated in place (tdc/core/storage.h): the
// storage's allocator is the cache's, so the block comes back at reshard and is taken at unshard.
TEST_F(CpuBlockCache, FreedStorageComesBackAndIsTakenAgain) {
  at::Tensor t = empty_reusing({64, 64}, at::kFloat);
  const void* p = ptr_of(t);
  tdc::core::free_storage(t);
  EXPECT_FALSE(tdc::core::has_storage_allocated(t));
  EXPECT_EQ(cpu_block_cache_stats().cached_blocks, 1);
  tdc::core::alloc_storage(t);
  EXPECT_EQ(ptr_of(t), p);
  EXPECT_EQ(cpu_block_cache_stats().reused, 1);
  t.fill_(2.0f);
  EXPECT_EQ(t.sum().item<float>(), 2.0f * 64 * 64);
}

TEST_F(CpuBlockCache, StaysWithinItsLimitOldestFirst) {
  tdc::core::set_cpu_block_cache_limit(3000);
  std::vector<at::Tensor> ts;
  std::vector<const void*> ptrs;
  for (int i = 0; i < 4; ++i) {
    ts.push_back(empty_reusing({250}, at::kFloat));  // 1000 bytes each
    ptrs.push_back(ptr_of(ts.back()));
  }
  ts.clear();  // freed in order 0, 1, 2, 3: block 0 leaves when block 3 comes
  EXPECT_EQ(cpu_block_cache_stats().cached_blocks, 3);
  EXPECT_EQ(cpu_block_cache_stats().cached_bytes, 3000);
  std::set<const void*> back;
  for (int i = 0; i < 3; ++i) ts.push_back(empty_reusing({250}, at::kFloat));
  for (const auto& t : ts) back.insert(ptr_of(t));
  EXPECT_EQ(back, (std::set<const void*>{ptrs[1], ptrs[2], ptrs[3]}));
  ts.clear();
  at::Tensor big = empty_reusing({1000}, at::kFloat);  // 4000 bytes: over the limit
  big.reset();
  EXPECT_EQ(cpu_block_cache_stats().cached_bytes, 3000) << "a block over the limit is not cached";
  tdc::core::set_cpu_block_cache_limit(0);
  EXPECT_EQ(cpu_block_cache_stats().cached_blocks, 0) << "a lower limit evicts at once";
  empty_reusing({250}, at::kFloat).reset();
  EXPECT_EQ(cpu_block_cache_stats().cached_blocks, 0) << "limit 0: the cache is off";
}

// Gloo's threads may drop the last reference: blocks come and go from several threads at once,
// and the books balance afterwards.
TEST_F(CpuBlockCache, ThreadsShareItSafely) {
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([k] {
      for (int i = 0; i < 500; ++i) {
        at::Tensor t = empty_reusing({256 * (1 + (i + k) % 3)}, at::kFloat);
        t.fill_(static_cast<float>(k));
        EXPECT_EQ(t.max().item<float>(), static_cast<float>(k)) << "another thread wrote into this block";
      }
    });
  }
  for (auto& t : threads) t.join();
  const auto s = cpu_block_cache_stats();
  EXPECT_EQ(s.reused + s.allocated, 2000);
  EXPECT_GT(s.reused, 0);
  EXPECT_LE(s.cached_blocks, 12);
  // The books: every cached block is one of the three sizes (1024, 2048, 3072 bytes).
  EXPECT_GE(s.cached_bytes, 1024 * s.cached_blocks);
  EXPECT_LE(s.cached_bytes, 3072 * s.cached_blocks);
}

// Not on the CPU, or pinned: at::empty as it is.
TEST_F(CpuBlockCache, OnlyPlainCpuTensors) {
  at::Tensor m = empty_reusing({8}, at::TensorOptions().device(at::kMeta));
  EXPECT_TRUE(m.is_meta());
  at::Tensor c =
      empty_reusing({2, 3}, at::TensorOptions().dtype(at::kDouble).memory_format(at::MemoryFormat::Contiguous));
  EXPECT_EQ(c.scalar_type(), at::kDouble);
  EXPECT_EQ(c.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(c.is_cpu());
  EXPECT_EQ(cpu_block_cache_stats().allocated, 1) << "the meta tensor did not go through the cache";
}

// FSDP2's steps take their buffers back from the cache, and compute exactly what they compute
// without it (the cache off: limit 0).
struct Trained {
  std::vector<at::Tensor> losses, shards;
  tdc::core::CpuBlockCacheStats stats;
};
Trained train_with_cache_limit(int64_t limit) {
  tdc::core::set_cpu_block_cache_limit(limit);
  tdc::core::reset_cpu_block_cache();
  at::manual_seed(42);
  auto model = std::make_shared<tdc::fixtures::MLPStack>(16);
  for (auto& [name, child] : model->named_children_tdc()) tdc::fsdp::fully_shard(*child);
  tdc::fsdp::fully_shard(*model);
  torch::optim::Adam opt(model->params(), torch::optim::AdamOptions(1e-2));
  const at::Tensor inp = at::randn({4, 16}, at::make_generator<at::CPUGeneratorImpl>(7 + tdc::harness::ctx().rank));
  Trained out;
  for (int step = 0; step < 4; ++step) {
    at::Tensor loss = (*model)(inp).pow(2).sum();
    loss.backward();
    opt.step();
    opt.zero_grad();
    out.losses.push_back(loss.detach());
  }
  for (const auto& p : model->params()) out.shards.push_back(p.detach().clone());
  out.stats = cpu_block_cache_stats();
  return out;
}

TDC_DIST_TEST(CpuBlockCacheFSDP, StepsReuseTheirBuffersWithTheSameResults, .world_size = 2) {
  tdc::conformance::world();
  const int64_t limit = tdc::core::cpu_block_cache_limit();
  const Trained on = train_with_cache_limit(limit), off = train_with_cache_limit(0);
  tdc::core::set_cpu_block_cache_limit(limit);
  EXPECT_GT(on.stats.reused, on.stats.allocated) << "after the first step the buffers come from the cache";
  EXPECT_EQ(off.stats.reused, 0);
  ASSERT_EQ(on.losses.size(), off.losses.size());
  for (size_t i = 0; i < on.losses.size(); ++i) EXPECT_TRUE(at::equal(on.losses[i], off.losses[i])) << "step " << i;
  ASSERT_EQ(on.shards.size(), off.shards.size());
  for (size_t i = 0; i < on.shards.size(); ++i) EXPECT_TRUE(at::equal(on.shards[i], off.shards[i])) << "shard " << i;
}

}  // namespace
