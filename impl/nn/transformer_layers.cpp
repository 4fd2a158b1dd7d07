// MultiheadAttention, Transformer{Encoder,Decoder}{Layer,} and Transformer, after torch.nn
// (batch_first=false, post-norm, ReLU). Parameter names, order and init as PyTorch's.
#include <cmath>
#include <stdexcept>

#include "init.h"
#include "tdc/nn/layers.h"

namespace tdc::nn {

namespace {

void need_inputs(const Module& m, const Tensors& inputs, size_t min, size_t max, const char* what) {
  if (inputs.size() < min || inputs.size() > max) {
    throw std::invalid_argument("tdc::nn: module of type '" + m.type_name() + "' expects " + what + ", got " +
                                std::to_string(inputs.size()) + " input(s)");
  }
  for (size_t i = 0; i < min; ++i) {
    if (!inputs[i].defined()) {
      throw std::invalid_argument("tdc::nn: module of type '" + m.type_name() + "': input " + std::to_string(i) +
                                  " is undefined (expects " + what + ")");
    }
  }
}

at::Tensor opt(const Tensors& inputs, size_t i) { return i < inputs.size() ? inputs[i] : at::Tensor(); }

bool same(const at::Tensor& a, const at::Tensor& b) { return a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl(); }

// PyTorch's _canonical_mask: bool (true = masked out) -> float with -inf.
at::Tensor canonical_mask(const at::Tensor& mask, at::ScalarType dtype) {
  if (!mask.defined()) return mask;
  if (mask.scalar_type() == at::kBool) {
    return at::zeros_like(mask, mask.options().dtype(dtype)).masked_fill_(mask, -INFINITY);
  }
  return mask;
}

}  // namespace

// ------------------------------------------------------------------ MultiheadAttention

MultiheadAttention::MultiheadAttention(int64_t e, int64_t h, double d)
    : Module("MultiheadAttention"), embed_dim(e), num_heads(h), dropout(d) {
  if (h <= 0 || e % h != 0) {
    throw std::invalid_argument("MultiheadAttention: embed_dim " + std::to_string(e) +
                                " must be divisible by num_heads " + std::to_string(h));
  }
  register_param("in_proj_weight", at::empty({3 * e, e}));
  register_param("in_proj_bias", at::empty({3 * e}));
  auto out_proj = register_child("out_proj", std::make_shared<Linear>(e, e, true));  // its own init first
  // _reset_parameters
  init::xavier_uniform_(p("in_proj_weight"));
  init::constant_(p("in_proj_bias"), 0);
  init::constant_(out_proj->p("bias"), 0);
}

Tensors MultiheadAttention::forward(const Tensors& inputs) {
  need_inputs(*this, inputs, 3, 4, "{query, key, value[, attn_mask]}");
  const at::Tensor &query = inputs[0], &key = inputs[1], &value = inputs[2];
  const int64_t L = query.size(0), B = query.size(1), E = embed_dim, H = num_heads, hd = E / H;
  if (query.dim() != 3 || query.size(2) != E) {
    throw std::invalid_argument("MultiheadAttention: query must be [L, B, " + std::to_string(E) + "], got " +
                                c10::str(query.sizes()));
  }
  const at::Tensor& w = p("in_proj_weight");
  const at::Tensor& bias = p("in_proj_bias");
  at::Tensor q, k, v;
  if (same(query, key) && same(key, value)) {  // F._in_projection_packed, self-attention
    at::Tensor proj = at::linear(query, w, bias);
    proj = proj.unflatten(-1, {3, E}).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous();
    q = proj[0], k = proj[1], v = proj[2];
  } else if (same(key, value)) {
    auto ws = w.split_with_sizes({E, 2 * E});
    auto bs = bias.split_with_sizes({E, 2 * E});
    q = at::linear(query, ws[0], bs[0]);
    at::Tensor kv = at::linear(key, ws[1], bs[1]);
    kv = kv.unflatten(-1, {2, E}).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous();
    k = kv[0], v = kv[1];
  } else {
    auto ws = w.chunk(3);
    auto bs = bias.chunk(3);
    q = at::linear(query, ws[0], bs[0]);
    k = at::linear(key, ws[1], bs[1]);
    v = at::linear(value, ws[2], bs[2]);
  }
  at::Tensor mask = canonical_mask(opt(inputs, 3), q.scalar_type());
  if (mask.defined() && mask.dim() == 2) mask = mask.unsqueeze(0);
  const int64_t S = k.size(0);
  q = q.view({L, B * H, hd}).transpose(0, 1);
  k = k.view({S, B * H, hd}).transpose(0, 1);
  v = v.view({S, B * H, hd}).transpose(0, 1);
  at::Tensor q_scaled = q * std::sqrt(1.0 / static_cast<double>(hd));
  at::Tensor weights =
      mask.defined() ? at::baddbmm(mask, q_scaled, k.transpose(-2, -1)) : at::bmm(q_scaled, k.transpose(-2, -1));
  weights = at::softmax(weights, -1);
  const double dp = is_training() ? dropout : 0.0;
  if (dp > 0) weights = at::dropout(weights, dp, true);
  at::Tensor out = at::bmm(weights, v).transpose(0, 1).contiguous().view({L * B, E});
  Module& out_proj = child("out_proj");
  out = at::linear(out, out_proj.p("weight"), out_proj.p("bias"));
  return {out.view({L, B, E})};
}

ModulePtr MultiheadAttention::clone_empty() const {
  return std::make_shared<MultiheadAttention>(embed_dim, num_heads, dropout);
}

// ------------------------------------------------------------------ encoder / decoder layers

TransformerEncoderLayer::TransformerEncoderLayer(int64_t d, int64_t h, int64_t ff, double dp)
    : Module("TransformerEncoderLayer"), d_model(d), nhead(h), dim_feedforward(ff), dropout_p(dp) {
  register_child("self_attn", std::make_shared<MultiheadAttention>(d, h, dp));
  register_child("linear1", std::make_shared<Linear>(d, ff));
  register_child("dropout", std::make_shared<Dropout>(dp));
  register_child("linear2", std::make_shared<Linear>(ff, d));
  register_child("norm1", std::make_shared<LayerNorm>(d));
  register_child("norm2", std::make_shared<LayerNorm>(d));
  register_child("dropout1", std::make_shared<Dropout>(dp));
  register_child("dropout2", std::make_shared<Dropout>(dp));
}

Tensors TransformerEncoderLayer::forward(const Tensors& inputs) {
  need_inputs(*this, inputs, 1, 2, "{src[, src_mask]}");
  at::Tensor x = inputs[0];
  at::Tensor mask = opt(inputs, 1);
  Tensors attn_in{x, x, x};
  if (mask.defined()) attn_in.push_back(mask);
  at::Tensor sa = child("dropout1")(child("self_attn")(attn_in)[0]);
  x = child("norm1")(x + sa);
  at::Tensor ffo = child("linear2")(child("dropout")(at::relu(child("linear1")(x))));
  x = child("norm2")(x + child("dropout2")(ffo));
  return {x};
}

ModulePtr TransformerEncoderLayer::clone_empty() const {
  return std::make_shared<TransformerEncoderLayer>(d_model, nhead, dim_feedforward, dropout_p);
}

TransformerDecoderLayer::TransformerDecoderLayer(int64_t d, int64_t h, int64_t ff, double dp)
    : Module("TransformerDecoderLayer"), d_model(d), nhead(h), dim_feedforward(ff), dropout_p(dp) {
  register_child("self_attn", std::make_shared<MultiheadAttention>(d, h, dp));
  register_child("multihead_attn", std::make_shared<MultiheadAttention>(d, h, dp));
  register_child("linear1", std::make_shared<Linear>(d, ff));
  register_child("dropout", std::make_shared<Dropout>(dp));
  register_child("linear2", std::make_shared<Linear>(ff, d));
  register_child("norm1", std::make_shared<LayerNorm>(d));
  register_child("norm2", std::make_shared<LayerNorm>(d));
  register_child("norm3", std::make_shared<LayerNorm>(d));
  register_child("dropout1", std::make_shared<Dropout>(dp));
  register_child("dropout2", std::make_shared<Dropout>(dp));
  register_child("dropout3", std::make_shared<Dropout>(dp));
}

Tensors TransformerDecoderLayer::forward(const Tensors& inputs) {
  need_inputs(*this, inputs, 2, 4, "{tgt, memory[, tgt_mask, memory_mask]}");
  at::Tensor x = inputs[0];
  const at::Tensor& memory = inputs[1];
  at::Tensor tgt_mask = opt(inputs, 2), memory_mask = opt(inputs, 3);
  Tensors sa_in{x, x, x};
  if (tgt_mask.defined()) sa_in.push_back(tgt_mask);
  x = child("norm1")(x + child("dropout1")(child("self_attn")(sa_in)[0]));
  Tensors mha_in{x, memory, memory};
  if (memory_mask.defined()) mha_in.push_back(memory_mask);
  x = child("norm2")(x + child("dropout2")(child("multihead_attn")(mha_in)[0]));
  at::Tensor ffo = child("linear2")(child("dropout")(at::relu(child("linear1")(x))));
  x = child("norm3")(x + child("dropout3")(ffo));
  return {x};
}

ModulePtr TransformerDecoderLayer::clone_empty() const {
  return std::make_shared<TransformerDecoderLayer>(d_model, nhead, dim_feedforward, dropout_p);
}

// ------------------------------------------------------------------ stacks

namespace {
std::shared_ptr<ModuleList> clones(const ModulePtr& layer, int64_t n) {
  auto list = std::make_shared<ModuleList>();
  if (layer) {
    for (int64_t i = 0; i < n; ++i) list->push_back(layer->deep_copy());
  }
  return list;
}
}  // namespace

TransformerEncoder::TransformerEncoder(const ModulePtr& layer, int64_t n, ModulePtr norm)
    : Module("TransformerEncoder"), num_layers(n) {
  register_child("layers", clones(layer, n));
  if (norm) register_child("norm", std::move(norm));
}

Tensors TransformerEncoder::forward(const Tensors& inputs) {
  need_inputs(*this, inputs, 1, 2, "{src[, mask]}");
  at::Tensor x = inputs[0];
  at::Tensor mask = opt(inputs, 1);
  Module& layers = child("layers");
  for (const auto& [name, layer] : layers.named_children_tdc()) {
    // Built by size rather than push_back after an initializer list: GCC 12 reports a false
    // -Warray-bounds for the latter.
    Tensors in(mask.defined() ? 2 : 1);
    in[0] = x;
    if (mask.defined()) in[1] = mask;
    x = (*layer)(std::move(in))[0];
  }
  if (named_children().contains("norm")) x = child("norm")(x);
  return {x};
}

ModulePtr TransformerEncoder::clone_empty() const { return std::make_shared<TransformerEncoder>(nullptr, num_layers); }

TransformerDecoder::TransformerDecoder(const ModulePtr& layer, int64_t n, ModulePtr norm)
    : Module("TransformerDecoder"), num_layers(n) {
  register_child("layers", clones(layer, n));
  if (norm) register_child("norm", std::move(norm));
}

Tensors TransformerDecoder::forward(const Tensors& inputs) {
  need_inputs(*this, inputs, 2, 4, "{tgt, memory[, tgt_mask, memory_mask]}");
  at::Tensor x = inputs[0];
  Module& layers = child("layers");
  for (const auto& [name, layer] : layers.named_children_tdc()) {
    Tensors in(inputs.begin(), inputs.end());  // {tgt, memory[, masks]} with tgt replaced
    in[0] = x;
    x = (*layer)(std::move(in))[0];
  }
  if (named_children().contains("norm")) x = child("norm")(x);
  return {x};
}

ModulePtr TransformerDecoder::clone_empty() const { return std::make_shared<TransformerDecoder>(nullptr, num_layers); }

// ------------------------------------------------------------------ Transformer

Transformer::Transformer(int64_t d, int64_t h, int64_t ne, int64_t nd, int64_t ff, double dp)
    : Module("Transformer"),
      d_model(d),
      nhead(h),
      num_encoder_layers(ne),
      num_decoder_layers(nd),
      dim_feedforward(ff),
      dropout_p(dp) {
  // The order of RNG draws is PyTorch's: encoder prototype, (copies), decoder prototype, then
  // xavier over all matrices in named_parameters order.
  auto enc_layer = std::make_shared<TransformerEncoderLayer>(d, h, ff, dp);
  register_child("encoder", std::make_shared<TransformerEncoder>(enc_layer, ne, std::make_shared<LayerNorm>(d)));
  auto dec_layer = std::make_shared<TransformerDecoderLayer>(d, h, ff, dp);
  register_child("decoder", std::make_shared<TransformerDecoder>(dec_layer, nd, std::make_shared<LayerNorm>(d)));
  for (auto& [name, t] : named_params()) {
    if (t.dim() > 1) init::xavier_uniform_(t);
  }
}

Tensors Transformer::forward(const Tensors& inputs) {
  need_inputs(*this, inputs, 2, 5, "{src, tgt[, src_mask, tgt_mask, memory_mask]}");
  at::Tensor src_mask = opt(inputs, 2), tgt_mask = opt(inputs, 3), memory_mask = opt(inputs, 4);
  Tensors enc_in{inputs[0]};
  if (src_mask.defined()) enc_in.push_back(src_mask);
  at::Tensor memory = child("encoder")(enc_in)[0];
  Tensors dec_in{inputs[1], memory, tgt_mask, memory_mask};
  return child("decoder")(dec_in);
}

ModulePtr Transformer::clone_empty() const {
  return std::make_shared<Transformer>(d_model, nhead, num_encoder_layers, num_decoder_layers, dim_feedforward,
                                       dropout_p);
}

}  // namespace tdc::nn
