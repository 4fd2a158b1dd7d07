// tdc's layers: PyTorch's torch.nn layers the fixtures need, built on tdc::nn::Module. Parameter
// names, registration order, shapes and default initialisation follow PyTorch exactly, so that
// with the same seed a tdc model and a PyTorch model start from the same numbers.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "tdc/nn/module.h"

namespace tdc::nn {

// weight [out, in] (kaiming_uniform a=sqrt(5)), bias [out] (uniform ±1/sqrt(in)), as nn.Linear.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensors forward(const Tensors& inputs) override;
  ModulePtr clone_empty() const override;
  void reset_parameters();
  const int64_t in_features, out_features;
  const bool has_bias;
};

// weight [num, dim] ~ N(0, 1), as nn.Embedding. Input: int64 indices.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  Tensors forward(const Tensors& inputs) override;
  ModulePtr clone_empty() const override;
  const int64_t num_embeddings, embedding_dim;
};

// weight ones, bias zeros (each optional), over the last dim.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool elementwise_affine = true, bool bias = true);
  Tensors forward(const Tensors& inputs) override;
  ModulePtr clone_empty() const override;
  const int64_t dim;
  const double eps;
  const bool elementwise_affine, has_bias;
};

// weight ones, bias zeros; buffers running_mean, running_var, num_batches_tracked (int64).
class BatchNorm1d : public Module {
 public:
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5, double momentum = 0.1);
  Tensors forward(const Tensors& inputs) override;
  ModulePtr clone_empty() const override;
  const int64_t num_features;
  const double eps, momentum;
};

class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensors forward(const Tensors& inputs) override;
  ModulePtr clone_empty() const override;
  const double p;
};

class ReLU : public Module {
 public:
  ReLU();
  Tensors forward(const Tensors& inputs) override;
  ModulePtr clone_empty() const override;
};
class GELU : public Module {
 public:
  GELU();
  Tensors forward(const Tensors& inputs) override;
  ModulePtr clone_empty() const override;
};
class Tanh : public Module {
 public:
  Tanh();
  Tensors forward(const Tensors& inputs) override;
  ModulePtr clone_empty() const override;
};
class Identity : public Module {
 public:
  Identity();
  Tensors forward(const Tensors& inputs) override;
  ModulePtr clone_empty() const override;
};

// Children named "0", "1", ...; forward chains them.
class Sequential : public Module {
 public:
  Sequential();
  explicit Sequential(std::vector<ModulePtr> modules);
  void push_back(ModulePtr m);
  size_t size() const;
  ModulePtr operator[](size_t i) const;
  Tensors forward(const Tensors& inputs) override;
  ModulePtr clone_empty() const override;
};

// Children named "0", "1", ...; no forward (calling it throws).
class ModuleList : public Module {
 public:
  ModuleList();
  explicit ModuleList(std::vector<ModulePtr> modules);
  void push_back(ModulePtr m);
  size_t size() const;
  ModulePtr operator[](size_t i) const;
  Tensors forward(const Tensors& inputs) override;
  ModulePtr clone_empty() const override;
};

// nn.MultiheadAttention (batch_first=false: inputs [S, B, E]); parameters in_proj_weight [3E, E],
// in_proj_bias [3E], out_proj (Linear E->E). forward({query, key, value}[, attn_mask]) -> {output}.
// attn_mask: [L, S] or [B*num_heads, L, S]; bool (true = masked out) or float (added). Like
// PyTorch, out_proj's parameters are read (through out_proj.p()) but out_proj's hooks do not run.
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0.0);
  Tensors forward(const Tensors& inputs) override;
  ModulePtr clone_empty() const override;
  const int64_t embed_dim, num_heads;
  const double dropout;
};

// nn.TransformerEncoderLayer / DecoderLayer (post-norm, ReLU, batch_first=false), same children
// names as PyTorch: self_attn, [multihead_attn,] linear1, dropout, linear2, norm1, norm2,
// [norm3,] dropout1, dropout2[, dropout3].
class TransformerEncoderLayer : public Module {
 public:
  TransformerEncoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward = 2048, double dropout = 0.1);
  Tensors forward(const Tensors& inputs) override;  // {src} -> {out}
  ModulePtr clone_empty() const override;
  const int64_t d_model, nhead, dim_feedforward;
  const double dropout_p;
};
class TransformerDecoderLayer : public Module {
 public:
  TransformerDecoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward = 2048, double dropout = 0.1);
  Tensors forward(const Tensors& inputs) override;  // {tgt, memory} -> {out}
  ModulePtr clone_empty() const override;
  const int64_t d_model, nhead, dim_feedforward;
  const double dropout_p;
};

// nn.TransformerEncoder / TransformerDecoder: children "layers" (ModuleList of num_layers deep
// copies of `layer`, as PyTorch's _get_clones) and "norm" (optional). A null layer builds an
// empty ModuleList (clone_empty uses that). Encoder forward({src[, mask]}); decoder
// forward({tgt, memory[, tgt_mask, memory_mask]}).
class TransformerEncoder : public Module {
 public:
  TransformerEncoder(const ModulePtr& layer, int64_t num_layers, ModulePtr norm = nullptr);
  Tensors forward(const Tensors& inputs) override;
  ModulePtr clone_empty() const override;
  const int64_t num_layers;
};
class TransformerDecoder : public Module {
 public:
  TransformerDecoder(const ModulePtr& layer, int64_t num_layers, ModulePtr norm = nullptr);
  Tensors forward(const Tensors& inputs) override;
  ModulePtr clone_empty() const override;
  const int64_t num_layers;
};

// nn.Transformer: encoder (layers, norm), decoder (layers, norm). forward({src, tgt[, src_mask,
// tgt_mask, memory_mask]}) -> {out}. Initialisation as PyTorch: one prototype layer each (its
// own init), deep copies, then xavier_uniform_ on every parameter with dim > 1.
class Transformer : public Module {
 public:
  Transformer(int64_t d_model = 512, int64_t nhead = 8, int64_t num_encoder_layers = 6, int64_t num_decoder_layers = 6,
              int64_t dim_feedforward = 2048, double dropout = 0.1);
  Tensors forward(const Tensors& inputs) override;
  ModulePtr clone_empty() const override;
  const int64_t d_model, nhead, num_encoder_layers, num_decoder_layers, dim_feedforward;
  const double dropout_p;
};

}  // namespace tdc::nn
