// The models the DDP and FSDP benchmarks time (the same ones, so their numbers compare; the
// PyTorch runner bench/pytorch/fsdp_pytorch.py builds them too): fixtures::MLPStack(256) with MSE on
// [B, 256] and fixtures::Transformer (dim 128, 2 blocks, 4 heads, vocab 512, sequence 64, no
// dropout, weight tying) with token cross-entropy on [B, 64]. Inputs and targets come from the
// caller's generator.
#pragma once

#include <cstdint>
#include <memory>

#include <ATen/ATen.h>

#include "tdc/fixtures/models.h"

namespace tdc::bench::models {

inline constexpr int64_t kMlpDim = 256;
inline tdc::nn::ModulePtr make_mlp_stack() { return std::make_shared<tdc::fixtures::MLPStack>(kMlpDim); }
inline tdc::nn::Tensors mlp_inputs(int64_t b, at::Generator& g) { return {at::randn({b, kMlpDim}, g)}; }
inline at::Tensor mlp_target(int64_t b, at::Generator& g) { return at::randn({b, kMlpDim}, g); }

inline tdc::fixtures::ModelArgs transformer_args() {
  tdc::fixtures::ModelArgs a;
  a.n_layers = 2;
  a.vocab_size = 512;
  a.max_seq_len = 64;
  a.dim = 128;
  a.n_heads = 4;
  a.dropout_p = 0.0;
  return a;
}
inline tdc::nn::ModulePtr make_transformer() {
  return std::make_shared<tdc::fixtures::Transformer>(transformer_args());
}
inline tdc::nn::Tensors tf_inputs(int64_t b, at::Generator& g) {
  auto a = transformer_args();
  return {at::randint(a.vocab_size, {b, a.max_seq_len}, g)};
}
inline at::Tensor tf_target(int64_t b, at::Generator& g) {
  auto a = transformer_args();
  return at::randint(a.vocab_size, {b, a.max_seq_len}, g);
}

}  // namespace tdc::bench::models
