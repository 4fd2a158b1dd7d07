// Values and comparisons shared by the comm unit tests that hold tdc's collectives to Gloo's own
// bit for bit (comm_reduce_scatter_by_alltoall_test.cpp, comm_gather_by_alltoall_test.cpp,
// comm_p2p_all_gather_test.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "tdc/comm/process_group.h"

namespace tdc_comm_bits {

// `numel` doubles whose magnitudes span 1e-20 to 1e20 with both signs, so that the order of a sum
// shows in its bits; the first 8 are special values, the same on every rank but the last, which
// has the partner of each. Across the ranks at 0-7: all +0 / a -0 (+0), all -0 (-0), ... + -0 /
// +0, +0, inf and -inf (NaN), all -inf, NaN and 1, 1 and NaN.
inline at::Tensor summands(int64_t numel, int n, int rank, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor x = at::randn({numel}, gen, at::kDouble) * at::pow(10.0, at::randint(-20, 20, {numel}, gen, at::kDouble));
  const bool last = rank == n - 1;
  const std::vector<double> special = last ? std::vector<double>{-0.0, -0.0, 0.0, 0.0, -INFINITY, -INFINITY, 1.0, NAN}
                                           : std::vector<double>{0.0, -0.0, -0.0, 0.0, INFINITY, -INFINITY, NAN, 1.0};
  const int64_t k = std::min<int64_t>(8, numel);
  x.narrow(0, 0, k).copy_(at::tensor(special, at::kDouble).narrow(0, 0, k));
  return x;
}

// NaN where `want` has NaN (its sign and payload are the hardware's, not a result); every other
// element bit for bit, so -0.0 is not +0.0.
inline void expect_same_bits(const at::Tensor& got, const at::Tensor& want, const std::string& against) {
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << against;
  const at::Tensor nan = at::isnan(got);
  EXPECT_TRUE(at::equal(nan, at::isnan(want))) << against << ": NaN in other places";
  const at::Tensor a = got.masked_fill(nan, 0).contiguous().view(at::kByte);
  const at::Tensor b = want.masked_fill(nan, 0).contiguous().view(at::kByte);
  EXPECT_TRUE(at::equal(a, b)) << against << ": bytes that differ: " << at::ne(a, b).sum().item<int64_t>() << " of "
                               << a.numel();
}

// Arbitrary bit patterns of `numel` elements: every float payload (NaN, -0.0, denormals, inf)
// appears, so only a byte-for-byte copy reproduces them (a bool is 0 or 1).
inline at::Tensor random_bits(int64_t numel, at::ScalarType dtype, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t bytes = numel * static_cast<int64_t>(at::elementSize(dtype));
  at::Tensor raw = at::randint(0, 256, {bytes}, gen, at::kByte);
  if (dtype == at::kBool) return raw.remainder(2).to(at::kBool);
  return raw.view(dtype);
}

inline bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         at::equal(a.contiguous().view(at::kByte), b.contiguous().view(at::kByte));
}

// Elements of `dtype` in `bytes`.
inline int64_t numel_in(int64_t bytes, at::ScalarType dtype) {
  return bytes / static_cast<int64_t>(at::elementSize(dtype));
}

// Gloo's own all-gather of `in` on g's backend, for comparison.
inline at::Tensor gloo_all_gather(const tdc::comm::GroupPtr& g, const at::Tensor& in) {
  at::Tensor out = at::empty({g->size() * in.numel()}, in.options());
  at::Tensor in_flat = in.contiguous().view({in.numel()});
  g->backend()._allgather_base(out, in_flat)->wait();
  return out;
}

}  // namespace tdc_comm_bits
