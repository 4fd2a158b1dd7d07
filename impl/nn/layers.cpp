// tdc's basic layers. Initialisation follows torch.nn exactly (same formulas, same order of RNG
// draws), so after at::manual_seed(s) a layer holds PyTorch's values for seed s.
#include "tdc/nn/layers.h"

#include <cmath>
#include <stdexcept>

#include "init.h"

namespace tdc::nn {

namespace init {

// init.kaiming_uniform_(w, a=sqrt(5)) as nn.Linear.reset_parameters computes it.
void linear_weight_(const at::Tensor& w) {
  if (deep_copy_in_progress() || w.numel() == 0) return;
  const double a = std::sqrt(5.0);
  const double gain = std::sqrt(2.0 / (1 + std::pow(a, 2)));
  const double std_ = gain / std::sqrt(static_cast<double>(w.size(1)));
  const double bound = std::sqrt(3.0) * std_;
  at::NoGradGuard g;
  w.uniform_(-bound, bound);
}

void linear_bias_(const at::Tensor& b, int64_t fan_in) {
  if (deep_copy_in_progress() || b.numel() == 0) return;
  const double bound = fan_in > 0 ? 1 / std::sqrt(static_cast<double>(fan_in)) : 0;
  at::NoGradGuard g;
  b.uniform_(-bound, bound);
}

void xavier_uniform_(const at::Tensor& w) {
  if (deep_copy_in_progress()) return;
  int64_t fan_in = w.size(1), fan_out = w.size(0);
  int64_t receptive = 1;
  for (int64_t d = 2; d < w.dim(); ++d) receptive *= w.size(d);
  fan_in *= receptive;
  fan_out *= receptive;
  const double std_ = 1.0 * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
  const double a = std::sqrt(3.0) * std_;
  at::NoGradGuard g;
  w.uniform_(-a, a);
}

void constant_(const at::Tensor& t, double v) {
  at::NoGradGuard g;
  t.fill_(v);
}

}  // namespace init

namespace {
const at::Tensor& one_input(const Module& m, const Tensors& inputs) {
  if (inputs.empty() || !inputs[0].defined()) {
    throw std::invalid_argument("tdc::nn: module of type '" + m.type_name() + "' needs one defined input tensor, got " +
                                std::to_string(inputs.size()) + " input(s)");
  }
  return inputs[0];
}
}  // namespace

// ------------------------------------------------------------------ Linear

Linear::Linear(int64_t in, int64_t out, bool bias)
    : Module("Linear"), in_features(in), out_features(out), has_bias(bias) {
  register_param("weight", at::empty({out, in}));
  if (bias) register_param("bias", at::empty({out}));
  reset_parameters();
}

void Linear::reset_parameters() {
  init::linear_weight_(p("weight"));
  if (has_bias) init::linear_bias_(p("bias"), in_features);
}

Tensors Linear::forward(const Tensors& inputs) {
  const at::Tensor& x = one_input(*this, inputs);
  return {at::linear(x, p("weight"), has_bias ? std::optional<at::Tensor>(p("bias")) : std::nullopt)};
}

ModulePtr Linear::clone_empty() const { return std::make_shared<Linear>(in_features, out_features, has_bias); }

// ------------------------------------------------------------------ Embedding

Embedding::Embedding(int64_t num, int64_t dim) : Module("Embedding"), num_embeddings(num), embedding_dim(dim) {
  at::Tensor& w = register_param("weight", at::empty({num, dim}));
  if (!deep_copy_in_progress()) {
    at::NoGradGuard g;
    w.normal_(0, 1);
  }
}

Tensors Embedding::forward(const Tensors& inputs) { return {at::embedding(p("weight"), one_input(*this, inputs))}; }

ModulePtr Embedding::clone_empty() const { return std::make_shared<Embedding>(num_embeddings, embedding_dim); }

// ------------------------------------------------------------------ LayerNorm

LayerNorm::LayerNorm(int64_t d, double e, bool affine, bool bias)
    : Module("LayerNorm"), dim(d), eps(e), elementwise_affine(affine), has_bias(affine && bias) {
  if (affine) {
    register_param("weight", at::ones({d}));
    if (bias) register_param("bias", at::zeros({d}));
  }
}

Tensors LayerNorm::forward(const Tensors& inputs) {
  const at::Tensor& x = one_input(*this, inputs);
  std::optional<at::Tensor> w, b;
  if (elementwise_affine) w = p("weight");
  if (has_bias) b = p("bias");
  return {at::layer_norm(x, {dim}, w, b, eps)};
}

ModulePtr LayerNorm::clone_empty() const {
  return std::make_shared<LayerNorm>(dim, eps, elementwise_affine, has_bias || !elementwise_affine);
}

// ------------------------------------------------------------------ BatchNorm1d

BatchNorm1d::BatchNorm1d(int64_t n, double e, double m) : Module("BatchNorm1d"), num_features(n), eps(e), momentum(m) {
  register_param("weight", at::ones({n}));
  register_param("bias", at::zeros({n}));
  register_buf("running_mean", at::zeros({n}));
  register_buf("running_var", at::ones({n}));
  register_buf("num_batches_tracked", at::zeros({}, at::kLong));
}

Tensors BatchNorm1d::forward(const Tensors& inputs) {
  const at::Tensor& x = one_input(*this, inputs);
  if (x.dim() != 2 && x.dim() != 3) {
    throw std::invalid_argument("BatchNorm1d: expected 2D or 3D input, got " + std::to_string(x.dim()) + "D");
  }
  const bool training = is_training();
  if (training) {
    at::NoGradGuard g;
    b("num_batches_tracked").add_(1);
  }
  return {at::batch_norm(x, p("weight"), p("bias"), b("running_mean"), b("running_var"), training, momentum, eps,
                         /*cudnn_enabled=*/true)};
}

ModulePtr BatchNorm1d::clone_empty() const { return std::make_shared<BatchNorm1d>(num_features, eps, momentum); }

// ------------------------------------------------------------------ Dropout and activations

Dropout::Dropout(double prob) : Module("Dropout"), p(prob) {
  if (prob < 0 || prob > 1) {
    throw std::invalid_argument("Dropout: probability has to be between 0 and 1, but got " + std::to_string(prob));
  }
}
Tensors Dropout::forward(const Tensors& inputs) { return {at::dropout(one_input(*this, inputs), p, is_training())}; }
ModulePtr Dropout::clone_empty() const { return std::make_shared<Dropout>(p); }

ReLU::ReLU() : Module("ReLU") {}
Tensors ReLU::forward(const Tensors& inputs) { return {at::relu(one_input(*this, inputs))}; }
ModulePtr ReLU::clone_empty() const { return std::make_shared<ReLU>(); }

GELU::GELU() : Module("GELU") {}
Tensors GELU::forward(const Tensors& inputs) { return {at::gelu(one_input(*this, inputs))}; }
ModulePtr GELU::clone_empty() const { return std::make_shared<GELU>(); }

Tanh::Tanh() : Module("Tanh") {}
Tensors Tanh::forward(const Tensors& inputs) { return {at::tanh(one_input(*this, inputs))}; }
ModulePtr Tanh::clone_empty() const { return std::make_shared<Tanh>(); }

Identity::Identity() : Module("Identity") {}
Tensors Identity::forward(const Tensors& inputs) { return inputs; }
ModulePtr Identity::clone_empty() const { return std::make_shared<Identity>(); }

// ------------------------------------------------------------------ containers

Sequential::Sequential() : Module("Sequential") {}
Sequential::Sequential(std::vector<ModulePtr> modules) : Sequential() {
  for (auto& m : modules) push_back(std::move(m));
}
void Sequential::push_back(ModulePtr m) {
  if (!m) throw std::invalid_argument("Sequential::push_back: null module");
  register_module(std::to_string(size()), std::move(m));
}
size_t Sequential::size() const { return named_children().size(); }
ModulePtr Sequential::operator[](size_t i) const {
  auto children = named_children();
  if (i >= children.size()) {
    throw std::out_of_range("Sequential: index " + std::to_string(i) + " out of range (size " +
                            std::to_string(children.size()) + ")");
  }
  return std::dynamic_pointer_cast<Module>(children[i].value());
}
Tensors Sequential::forward(const Tensors& inputs) {
  Tensors x = inputs;
  for (const auto& item : named_children()) {
    auto* m = dynamic_cast<Module*>(item.value().get());
    if (!m) throw std::invalid_argument("Sequential: child '" + item.key() + "' is not a tdc::nn::Module");
    x = (*m)(std::move(x));
  }
  return x;
}
ModulePtr Sequential::clone_empty() const { return std::make_shared<Sequential>(); }

ModuleList::ModuleList() : Module("ModuleList") {}
ModuleList::ModuleList(std::vector<ModulePtr> modules) : ModuleList() {
  for (auto& m : modules) push_back(std::move(m));
}
void ModuleList::push_back(ModulePtr m) {
  if (!m) throw std::invalid_argument("ModuleList::push_back: null module");
  register_module(std::to_string(size()), std::move(m));
}
size_t ModuleList::size() const { return named_children().size(); }
ModulePtr ModuleList::operator[](size_t i) const {
  auto children = named_children();
  if (i >= children.size()) {
    throw std::out_of_range("ModuleList: index " + std::to_string(i) + " out of range (size " +
                            std::to_string(children.size()) + ")");
  }
  return std::dynamic_pointer_cast<Module>(children[i].value());
}
Tensors ModuleList::forward(const Tensors&) {
  throw std::logic_error("ModuleList has no forward(): call its elements");
}
ModulePtr ModuleList::clone_empty() const { return std::make_shared<ModuleList>(); }

}  // namespace tdc::nn
