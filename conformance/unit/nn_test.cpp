// Unit tests of tdc::nn: hooks, parameter indirection (substitutes, replace, tie, metadata),
// the module tree with PyTorch's FQNs and de-duplication, deep copy, the layers against goldens
// written by real PyTorch (fixtures/golden/nn_layers.py), and activation checkpointing.
// Single-process behaviour: every test runs at world size 1.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <torch/torch.h>

#include "tdc/conformance/checks.h"
#include "tdc/conformance/pytorch_goldens.h"
#include "tdc/harness/harness.h"
#include "tdc/nn/checkpoint.h"
#include "tdc/nn/layers.h"
#include "tdc/nn/module.h"

namespace {

using tdc::conformance::assert_close;
using tdc::conformance::Tolerance;
using tdc::conformance::torch_allclose;

using ::testing::HasSubstr;
using namespace tdc::nn;

TDC_DIST_SUITE(NnModule, .world_size = 1);
TDC_DIST_SUITE(NnLayers, .world_size = 1);
TDC_DIST_SUITE(NnCheckpoint, .world_size = 1);

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}

template <class E, class F>
std::string error_of_type(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<wrong exception type> ") + e.what();
  }
  return "<no exception>";
}

std::vector<std::string> names_of(const std::vector<std::pair<std::string, at::Tensor>>& v) {
  std::vector<std::string> out;
  for (const auto& [n, t] : v) out.push_back(n);
  return out;
}

// A user model the way docs/modules.md describes it: members pointing at registered children.
class MyBlock : public Module {
 public:
  explicit MyBlock(int64_t dim) : Module("MyBlock"), dim(dim) {
    fc1 = register_child("fc1", std::make_shared<Linear>(dim, 2 * dim));
    fc2 = register_child("fc2", std::make_shared<Linear>(2 * dim, dim));
    register_param("scale", at::ones({dim}));
  }
  Tensors forward(const Tensors& in) override { return {(*fc2)(at::relu((*fc1)(in[0]))) * p("scale")}; }
  ModulePtr clone_empty() const override { return std::make_shared<MyBlock>(dim); }
  std::shared_ptr<Linear> fc1, fc2;
  const int64_t dim;
};

// Forgets clone_empty().
class NoCopyBlock : public Module {
 public:
  NoCopyBlock() : Module("MyBlock") { register_param("w", at::ones({2})); }
  Tensors forward(const Tensors& in) override { return {in[0] * p("w")}; }
};

// Holds a LibTorch child.
class HoldsTorchLinear : public Module {
 public:
  HoldsTorchLinear() : Module("HoldsTorchLinear") { register_module("raw", torch::nn::Linear(2, 2)); }
  Tensors forward(const Tensors& in) override { return in; }
  ModulePtr clone_empty() const override { return std::make_shared<HoldsTorchLinear>(); }
};

// ------------------------------------------------------------------ hooks

TDC_DIST_TEST(NnModule, HooksRunInRegistrationOrderAndReplace) {
  auto lin = std::make_shared<Linear>(3, 2);
  at::Tensor x = at::randn({4, 3});
  std::vector<std::string> order;
  auto h1 = lin->register_forward_pre_hook([&](Module& m, const Tensors&) -> std::optional<Tensors> {
    EXPECT_EQ(m.type_name(), "Linear");
    order.push_back("pre1");
    return std::nullopt;
  });
  auto h2 = lin->register_forward_pre_hook([&](Module&, const Tensors& in) -> std::optional<Tensors> {
    order.push_back("pre2");
    return Tensors{in[0] * 2};
  });
  auto h3 = lin->register_forward_hook([&](Module&, const Tensors& in, const Tensors& out) -> std::optional<Tensors> {
    order.push_back("post1");
    EXPECT_TRUE(assert_close(in[0], x * 2, Tolerance{0, 0}));  // post-hooks see the replaced inputs
    return Tensors{out[0] + 1};
  });
  auto h4 = lin->register_forward_hook([&](Module&, const Tensors&, const Tensors& out) -> std::optional<Tensors> {
    order.push_back("post2");
    return std::nullopt;
  });
  at::Tensor y = (*lin)(x);
  EXPECT_EQ(order, (std::vector<std::string>{"pre1", "pre2", "post1", "post2"}));
  EXPECT_TRUE(torch_allclose(y, at::linear(x * 2, lin->p("weight"), lin->p("bias")) + 1));

  EXPECT_TRUE(h2.active());
  h2.remove();
  h3.remove();
  EXPECT_FALSE(h2.active());
  h2.remove();  // twice: no-op
  order.clear();
  y = (*lin)(x);
  EXPECT_EQ(order, (std::vector<std::string>{"pre1", "post2"}));
  EXPECT_TRUE(torch_allclose(y, at::linear(x, lin->p("weight"), lin->p("bias"))));

  // forward() itself runs no hooks; a hook may remove itself while running.
  order.clear();
  lin->forward({x});
  EXPECT_TRUE(order.empty());
  HookHandle self;
  int runs = 0;
  self = lin->register_forward_pre_hook([&](Module&, const Tensors&) -> std::optional<Tensors> {
    ++runs;
    self.remove();
    return std::nullopt;
  });
  (*lin)(x);
  (*lin)(x);
  EXPECT_EQ(runs, 1);

  // A handle outliving its module does nothing.
  HookHandle orphan;
  {
    auto tmp = std::make_shared<ReLU>();
    orphan = tmp->register_forward_hook([](Module&, const Tensors&, const Tensors&) { return std::nullopt; });
  }
  EXPECT_FALSE(orphan.active());
  orphan.remove();
  h1.remove();
  h4.remove();
}

TDC_DIST_TEST(NnModule, HookWrongReplacementIsRejected) {
  auto lin = std::make_shared<Linear>(3, 2);
  at::Tensor x = at::randn({4, 3});
  auto h = lin->register_forward_pre_hook([](Module&, const Tensors&) { return std::optional<Tensors>(Tensors{}); });
  std::string msg = error_of_type<std::invalid_argument>([&] { (*lin)(x); });
  EXPECT_THAT(msg, HasSubstr("forward pre-hook of module type 'Linear' returned 0 inputs, but it received 1"));
  h.remove();

  h = lin->register_forward_pre_hook(
      [](Module&, const Tensors&) { return std::optional<Tensors>(Tensors{at::Tensor()}); });
  msg = error_of_type<std::invalid_argument>([&] { (*lin)(x); });
  EXPECT_THAT(msg, HasSubstr("forward pre-hook of module type 'Linear' returned an undefined tensor for input 0"));
  h.remove();

  h = lin->register_forward_hook(
      [](Module&, const Tensors&, const Tensors&) { return std::optional<Tensors>(Tensors{at::Tensor()}); });
  msg = error_of_type<std::invalid_argument>([&] { (*lin)(x); });
  EXPECT_THAT(msg, HasSubstr("forward hook of module type 'Linear' returned an undefined tensor for output 0"));
  h.remove();

  h = lin->register_forward_hook([](Module&, const Tensors&, const Tensors& out) {
    return std::optional<Tensors>(Tensors{out[0], out[0]});
  });
  msg = error_of_type<std::invalid_argument>([&] { (*lin)(x); });
  EXPECT_THAT(msg, HasSubstr("forward hook of module type 'Linear' returned 2 outputs, but it received 1"));
  h.remove();

  // An undefined optional input may stay undefined.
  auto enc = std::make_shared<TransformerEncoderLayer>(4, 2, 8, 0.0);
  h = enc->register_forward_pre_hook([](Module&, const Tensors& in) { return std::optional<Tensors>(in); });
  at::Tensor src = at::randn({3, 1, 4});
  EXPECT_EQ((*enc)(Tensors{src, at::Tensor()})[0].sizes(), src.sizes());
}

// ------------------------------------------------------------------ parameters

TDC_DIST_TEST(NnModule, SubstituteIsWhatForwardUsesAndGradientsFollowIt) {
  auto lin = std::make_shared<Linear>(3, 2);
  at::Tensor weight = lin->p("weight");
  // A "shard" leaf whose differentiable expansion is the substitute (as FSDP's all-gather).
  at::Tensor shard = (weight.detach() * 0.5).requires_grad_();
  auto pre = lin->register_forward_pre_hook([&](Module& m, const Tensors&) -> std::optional<Tensors> {
    m.set_param_substitute("weight", shard * 2);
    return std::nullopt;
  });
  auto post = lin->register_forward_hook([&](Module& m, const Tensors&, const Tensors&) -> std::optional<Tensors> {
    EXPECT_TRUE(m.has_param_substitute("weight"));
    m.clear_param_substitute("weight");
    return std::nullopt;
  });
  at::Tensor x = at::randn({5, 3});
  at::Tensor y = (*lin)(x);
  EXPECT_FALSE(lin->has_param_substitute("weight"));
  EXPECT_TRUE(torch_allclose(y, at::linear(x, weight, lin->p("bias"))));
  y.sum().backward();
  EXPECT_FALSE(weight.grad().defined()) << "the registered leaf was not used";
  ASSERT_TRUE(shard.grad().defined());
  at::Tensor expect = at::ones({5, 2}).t().mm(x) * 2;  // d sum(x W^T) / dW, times 2 for the expansion
  EXPECT_TRUE(torch_allclose(shard.grad(), expect));
  EXPECT_TRUE(lin->p("bias").grad().defined());
  // The registered parameter is still the leaf the optimizer sees.
  auto params = lin->named_params();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_TRUE(params[0].second.is_same(weight));

  std::string msg = error_of_type<std::invalid_argument>([&] { lin->set_param_substitute("wieght", shard); });
  EXPECT_THAT(msg, HasSubstr("'wieght'"));
  pre.remove();
  post.remove();
}

TDC_DIST_TEST(NnModule, UnknownNamesListWhatExists) {
  auto lin = std::make_shared<Linear>(3, 2);
  std::string msg = error_of_type<std::invalid_argument>([&] { lin->p("nonexistent"); });
  EXPECT_EQ(msg, "tdc::nn: module of type 'Linear' has no parameter 'nonexistent' (its parameters: 'weight', 'bias')");
  msg = error_of_type<std::invalid_argument>([&] { std::make_shared<ReLU>()->b("running_mean"); });
  EXPECT_THAT(msg, HasSubstr("module of type 'ReLU' has no buffer 'running_mean' (its buffers: none)"));
  auto mha = std::make_shared<MultiheadAttention>(4, 2);
  msg = error_of_type<std::invalid_argument>([&] { mha->child("q_proj"); });
  EXPECT_THAT(msg, HasSubstr("has no child 'q_proj' (its children: 'out_proj')"));
}

TDC_DIST_TEST(NnModule, ReplaceTieAndMetadata) {
  auto seq = std::make_shared<Sequential>(
      std::vector<ModulePtr>{std::make_shared<Embedding>(10, 4), std::make_shared<Linear>(4, 10, false)});
  auto& emb = seq->submodule("0");
  auto& out = seq->submodule("1");
  out.tie_param("weight", emb.p("weight"));
  EXPECT_EQ(names_of(seq->named_params()), (std::vector<std::string>{"0.weight"}));
  EXPECT_EQ(seq->params().size(), 1u);
  EXPECT_TRUE(out.p("weight").is_same(emb.p("weight")));
  auto seq_copy = seq->deep_copy();  // the tie survives the copy
  EXPECT_TRUE(seq_copy->submodule("1").p("weight").is_same(seq_copy->submodule("0").p("weight")));
  EXPECT_FALSE(seq_copy->submodule("0").p("weight").is_same(emb.p("weight")));
  EXPECT_EQ(names_of(seq_copy->named_params()), (std::vector<std::string>{"0.weight"}));

  // replace_param keeps the name and the position.
  auto lin = std::make_shared<Linear>(3, 2);
  at::Tensor shard = at::zeros({1, 3}).requires_grad_();
  lin->replace_param("weight", shard);
  auto named = lin->named_params();
  EXPECT_EQ(names_of(named), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_TRUE(named[0].second.is_same(shard));
  EXPECT_THAT(error_of([&] { lin->replace_param("w", shard); }), HasSubstr("has no parameter 'w'"));

  // metadata
  EXPECT_EQ(lin->param_meta("weight"), nullptr);
  lin->set_param_meta("weight", std::string("Shard(0)"));
  ASSERT_NE(lin->param_meta("weight"), nullptr);
  EXPECT_EQ(std::any_cast<std::string>(*lin->param_meta("weight")), "Shard(0)");
  EXPECT_THAT(error_of([&] { lin->set_param_meta("nope", 1); }), HasSubstr("has no parameter 'nope'"));
  auto copy = std::dynamic_pointer_cast<Linear>(lin->deep_copy());
  ASSERT_NE(copy->param_meta("weight"), nullptr);
  EXPECT_EQ(std::any_cast<std::string>(*copy->param_meta("weight")), "Shard(0)");
  EXPECT_EQ(copy->p("weight").sizes(), shard.sizes());
}

TDC_DIST_TEST(NnModule, PLookupIsCheap) {
  auto lin = std::make_shared<Linear>(3, 2);
  const std::string name = "bias";
  const int n = 200000;
  auto t0 = std::chrono::steady_clock::now();
  int64_t acc = 0;
  for (int i = 0; i < n; ++i) acc += lin->p(name).dim();
  double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n;
  EXPECT_EQ(acc, n);
  EXPECT_LT(ns, 500.0) << "p() took " << ns << " ns per call";
  lin->set_param_substitute("weight", at::zeros({2, 3}));
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) acc += lin->p(name).dim();
  ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n;
  EXPECT_LT(ns, 500.0) << "p() with a substitute installed took " << ns << " ns per call";
}

// ------------------------------------------------------------------ tree

TDC_DIST_TEST(NnModule, FqnsFollowPyTorchWithSharedModulesOnce) {
  // PyTorch: root = nn.Sequential(a, nn.Sequential(a, nn.ReLU()), nn.Linear(2, 2)) yields
  // named_modules ['', '0', '1', '1.1', '2'] and parameters ['0.weight', '0.bias', '2.weight', '2.bias'].
  auto a = std::make_shared<Linear>(2, 2);
  auto inner = std::make_shared<Sequential>(std::vector<ModulePtr>{a, std::make_shared<ReLU>()});
  auto root = std::make_shared<Sequential>(std::vector<ModulePtr>{a, inner, std::make_shared<Linear>(2, 2)});
  std::vector<std::string> mods;
  for (auto& [n, m] : root->named_modules_tdc()) mods.push_back(n + ":" + m->type_name());
  EXPECT_EQ(mods, (std::vector<std::string>{":Sequential", "0:Linear", "1:Sequential", "1.1:ReLU", "2:Linear"}));
  EXPECT_EQ(names_of(root->named_params()), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_EQ(names_of(root->named_params(false)), std::vector<std::string>{});
  EXPECT_EQ(root->named_modules_tdc("model")[1].first, "model.0");

  // Own parameters come before children's, whatever the registration order (PyTorch order).
  struct P : Module {
    P() : Module("P") {
      register_child("c", std::make_shared<Linear>(1, 1));
      register_param("own", at::zeros({1}));
      register_buf("buf", at::zeros({1}), false);
    }
    Tensors forward(const Tensors& in) override { return in; }
  } p;
  EXPECT_EQ(names_of(p.named_params()), (std::vector<std::string>{"own", "c.weight", "c.bias"}));
  EXPECT_EQ(names_of(p.named_bufs()), (std::vector<std::string>{"buf"}));
  EXPECT_FALSE(p.is_persistent_buf("buf"));

  auto bn = std::make_shared<BatchNorm1d>(3);
  EXPECT_EQ(names_of(bn->named_bufs()),
            (std::vector<std::string>{"running_mean", "running_var", "num_batches_tracked"}));
  EXPECT_TRUE(bn->is_persistent_buf("running_mean"));
  // Buffers are in LibTorch's registry too (to(), named_buffers()).
  EXPECT_EQ(bn->named_buffers().size(), 3u);
}

TDC_DIST_TEST(NnModule, SubmoduleAndOwnerOf) {
  Transformer t(8, 2, 2, 1, 16, 0.0);
  EXPECT_EQ(t.submodule("encoder.layers.1.self_attn").type_name(), "MultiheadAttention");
  EXPECT_EQ(&t.submodule(""), &t);
  auto [owner, name] = t.owner_of("encoder.layers.1.self_attn.out_proj.weight");
  EXPECT_EQ(owner, &t.submodule("encoder.layers.1.self_attn.out_proj"));
  EXPECT_EQ(name, "weight");
  EXPECT_EQ(t.owner_of("decoder.norm.bias").first, &t.submodule("decoder.norm"));

  std::string msg = error_of_type<std::invalid_argument>([&] { t.submodule("encoder.layers.5.self_attn"); });
  EXPECT_EQ(msg,
            "submodule: no module at 'encoder.layers.5.self_attn': module 'encoder.layers' (type 'ModuleList') has "
            "no child '5' (its children: '0', '1')");
  msg = error_of_type<std::invalid_argument>([&] { t.owner_of("encoder.norm.scale"); });
  EXPECT_THAT(msg, HasSubstr("no parameter or buffer 'encoder.norm.scale'"));
  EXPECT_THAT(msg, HasSubstr("'weight', 'bias'"));
}

// ------------------------------------------------------------------ deep copy

TDC_DIST_TEST(NnModule, DeepCopyCopiesValuesTiesModesAndNoRng) {
  auto shared = std::make_shared<Linear>(4, 4);
  auto root = std::make_shared<Sequential>(std::vector<ModulePtr>{
      std::make_shared<MyBlock>(4), shared, std::make_shared<BatchNorm1d>(4), std::make_shared<Dropout>(0.5), shared});
  root->submodule("0").p("scale").requires_grad_(false);
  root->submodule("3").eval();
  (*root)(at::randn({3, 4}));  // BatchNorm running stats move away from their init
  int hook_runs = 0;
  root->register_forward_pre_hook([&](Module&, const Tensors&) {
    ++hook_runs;
    return std::nullopt;
  });

  at::manual_seed(5);
  auto copy = root->deep_copy();
  at::Tensor after_copy = at::rand({3});
  at::manual_seed(5);
  EXPECT_TRUE(assert_close(at::rand({3}), after_copy, Tolerance{0, 0})) << "deep_copy consumed RNG";

  auto a = root->named_params(), b = copy->named_params();
  ASSERT_EQ(names_of(a), names_of(b));
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(assert_close(a[i].second, b[i].second, Tolerance{0, 0})) << a[i].first;
    EXPECT_FALSE(a[i].second.is_same(b[i].second)) << a[i].first;
    EXPECT_EQ(a[i].second.requires_grad(), b[i].second.requires_grad()) << a[i].first;
    EXPECT_TRUE(b[i].second.is_leaf()) << a[i].first;
  }
  EXPECT_FALSE(copy->submodule("0").p("scale").requires_grad());
  auto ab = root->named_bufs(), bb = copy->named_bufs();
  ASSERT_EQ(names_of(ab), names_of(bb));
  for (size_t i = 0; i < ab.size(); ++i)
    EXPECT_TRUE(assert_close(ab[i].second, bb[i].second, Tolerance{0, 0})) << ab[i].first;
  // shared module stays shared
  EXPECT_EQ(&copy->submodule("1"), &copy->submodule("4"));
  EXPECT_NE(&copy->submodule("1"), &root->submodule("1"));
  // modes
  EXPECT_TRUE(copy->is_training());
  EXPECT_FALSE(copy->submodule("3").is_training());
  // members of a user module point at the copy's children
  auto* blk = dynamic_cast<MyBlock*>(&copy->submodule("0"));
  ASSERT_NE(blk, nullptr);
  EXPECT_EQ(blk->fc1.get(), &copy->submodule("0.fc1"));
  // hooks are not copied; outputs agree (BatchNorm in eval for determinism)
  root->eval();
  copy->eval();
  at::Tensor x = at::randn({3, 4});
  at::Tensor y0 = (*root)(x);
  at::Tensor y1 = (*copy)(x);
  EXPECT_EQ(hook_runs, 1);
  EXPECT_TRUE(torch_allclose(y0, y1));
  // independent values
  {
    at::NoGradGuard g;
    copy->submodule("0.fc1").p("weight").add_(1);
  }
  EXPECT_FALSE(root->submodule("0.fc1").p("weight").equal(copy->submodule("0.fc1").p("weight")));
}

TDC_DIST_TEST(NnModule, DeepCopyOfWhatCannotBeCopiedNamesIt) {
  auto list = std::make_shared<ModuleList>(std::vector<ModulePtr>{std::make_shared<NoCopyBlock>()});
  auto root = std::make_shared<Sequential>();
  root->register_child("layers", list);
  std::string msg = error_of_type<std::invalid_argument>([&] { root->deep_copy(); });
  EXPECT_EQ(msg,
            "deep_copy: module 'layers.0' of type 'MyBlock' cannot be copied: it does not implement clone_empty()");
  msg = error_of_type<std::invalid_argument>([&] { NoCopyBlock().deep_copy(); });
  EXPECT_EQ(msg, "deep_copy: module '(root)' of type 'MyBlock' cannot be copied: it does not implement clone_empty()");
  auto holder = std::make_shared<Sequential>(std::vector<ModulePtr>{std::make_shared<HoldsTorchLinear>()});
  msg = error_of_type<std::invalid_argument>([&] { holder->deep_copy(); });
  EXPECT_THAT(msg, HasSubstr("deep_copy: module '0.raw' (child 'raw' of module type 'HoldsTorchLinear'"));
  EXPECT_THAT(msg, HasSubstr("is not a tdc::nn::Module and cannot be copied"));
  // LibTorch children's parameters still count in the tree.
  EXPECT_EQ(names_of(holder->named_params()), (std::vector<std::string>{"0.raw.weight", "0.raw.bias"}));
}

// ------------------------------------------------------------------ layers vs PyTorch goldens

at::Tensor inp(std::vector<int64_t> shape, double off = 0.0) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return at::sin(at::arange(n, at::kFloat) * 0.37 + off).reshape(shape);
}

// Computed by the venv's PyTorch on this machine (pytorch_goldens.h).
const nlohmann::json& goldens() { return tdc::conformance::pytorch_goldens("nn_layers.json"); }

void expect_summary(const std::string& what, const at::Tensor& t, const nlohmann::json& g, double tol) {
  std::vector<int64_t> shape = g["shape"].get<std::vector<int64_t>>();
  ASSERT_EQ(t.sizes().vec(), shape) << what;
  at::Tensor d = t.detach().to(at::kDouble);
  double sum = d.sum().item<double>(), abs_sum = d.abs().sum().item<double>();
  double scale = 1.0 + std::abs(g["abs_sum"].get<double>());
  EXPECT_NEAR(sum, g["sum"].get<double>(), tol * scale) << what;
  EXPECT_NEAR(abs_sum, g["abs_sum"].get<double>(), tol * scale) << what;
  auto flat = d.reshape(-1);
  auto first = g["first"].get<std::vector<double>>();
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_NEAR(flat[i].item<double>(), first[i], tol * (1 + std::abs(first[i]))) << what << " [" << i << "]";
  }
}

std::string py_type(const std::string& t) { return t == "NonDynamicallyQuantizableLinear" ? "Linear" : t; }

void expect_layer(const std::string& key, Module& m, const at::Tensor& out, double out_tol = 1e-5) {
  SCOPED_TRACE("layer " + key);
  const auto& g = goldens()["layers"][key];
  ASSERT_FALSE(g.is_null()) << "no golden for " << key;
  // parameters: names, order, shapes, values (bit-equal RNG draws -> tight tolerance)
  auto params = m.named_params();
  ASSERT_EQ(params.size(), g["params"].size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].first, g["params"][i][0].get<std::string>());
    expect_summary(key + " param " + params[i].first, params[i].second, g["params"][i][1], 1e-6);
  }
  auto bufs = m.named_bufs();
  ASSERT_EQ(bufs.size(), g["buffers"].size());
  for (size_t i = 0; i < bufs.size(); ++i) EXPECT_EQ(bufs[i].first, g["buffers"][i][0].get<std::string>());
  std::vector<std::string> mods, want;
  for (auto& [n, mm] : m.named_modules_tdc()) mods.push_back(n + ":" + mm->type_name());
  for (const auto& e : g["modules"]) want.push_back(e[0].get<std::string>() + ":" + py_type(e[1].get<std::string>()));
  EXPECT_EQ(mods, want);
  expect_summary(key + " output", out, g["output"], out_tol);
}

TDC_DIST_TEST(NnLayers, MatchPyTorchInitAndForward) {
  {
    at::manual_seed(0);
    Linear m(5, 3);
    expect_layer("Linear", m, m(inp({2, 5})));
  }
  {
    at::manual_seed(0);
    Linear m(4, 3, false);
    expect_layer("LinearNoBias", m, m(inp({2, 4})));
  }
  {
    at::manual_seed(0);
    Embedding m(10, 4);
    expect_layer("Embedding", m, m(at::tensor({1, 2, 3, 4, 5, 9}, at::kLong).reshape({2, 3})));
  }
  {
    at::manual_seed(0);
    LayerNorm m(6);
    expect_layer("LayerNorm", m, m(inp({2, 6})));
  }
  {
    at::manual_seed(0);
    BatchNorm1d m(4);
    at::Tensor x = inp({3, 4});
    expect_layer("BatchNorm1d", m, m(x));
    const auto& g = goldens()["layers"]["BatchNorm1d"];
    auto bufs = m.named_bufs();
    for (size_t i = 0; i < bufs.size(); ++i) {
      expect_summary("BatchNorm1d buffer after train " + bufs[i].first, bufs[i].second, g["buffers_after_train"][i][1],
                     1e-6);
    }
    m.eval();
    expect_summary("BatchNorm1d eval output", m(x), g["eval_output"], 1e-5);
  }
  {
    at::manual_seed(0);
    Sequential m(std::vector<ModulePtr>{std::make_shared<Linear>(4, 3), std::make_shared<ReLU>(),
                                        std::make_shared<Linear>(3, 2), std::make_shared<Tanh>()});
    expect_layer("Sequential", m, m(inp({2, 4})));
  }
  {
    GELU m;
    expect_layer("GELU", m, m(inp({2, 5})));
  }
  {
    at::manual_seed(0);
    MultiheadAttention m(8, 2);
    at::Tensor x = inp({3, 2, 8});
    expect_layer("MultiheadAttention", m, m(Tensors{x, x, x})[0]);
  }
  {
    at::manual_seed(0);
    MultiheadAttention m(8, 2);
    at::Tensor q = inp({3, 2, 8}), kv = inp({4, 2, 8}, 1.0);
    expect_layer("MultiheadAttentionCross", m, m(Tensors{q, kv, kv})[0]);
  }
  {
    at::manual_seed(0);
    MultiheadAttention m(8, 2);
    at::Tensor x = inp({3, 2, 8});
    at::Tensor mask = at::triu(at::ones({3, 3}, at::kBool), 1);
    expect_layer("MultiheadAttentionMask", m, m(Tensors{x, x, x, mask})[0]);
  }
  {
    at::manual_seed(0);
    TransformerEncoderLayer m(8, 2, 16, 0.0);
    expect_layer("TransformerEncoderLayer", m, m(inp({3, 2, 8})));
  }
  {
    at::manual_seed(0);
    TransformerDecoderLayer m(8, 2, 16, 0.0);
    expect_layer("TransformerDecoderLayer", m, m(Tensors{inp({3, 2, 8}), inp({4, 2, 8}, 0.5)})[0]);
  }
  {
    at::manual_seed(0);
    Transformer m(8, 2, 2, 2, 16, 0.0);
    expect_layer("Transformer", m, m(Tensors{inp({4, 2, 8}), inp({3, 2, 8}, 0.5)})[0]);
  }
}

TDC_DIST_TEST(NnLayers, DropoutContainersAndBadInput) {
  Dropout d(0.5);
  at::Tensor x = at::ones({1000});
  at::Tensor y = d(x);
  double zeros = (y == 0).sum().item<double>();
  EXPECT_GT(zeros, 350);
  EXPECT_LT(zeros, 650);
  EXPECT_TRUE((y.masked_select(y != 0) == 2).all().item<bool>());
  d.eval();
  EXPECT_TRUE(assert_close(d(x), x, Tolerance{0, 0}));
  EXPECT_THAT(error_of([] { Dropout(1.5); }), HasSubstr("1.5"));

  ModuleList list(std::vector<ModulePtr>{std::make_shared<ReLU>(), std::make_shared<Tanh>()});
  EXPECT_EQ(list.size(), 2u);
  EXPECT_EQ(list[1]->type_name(), "Tanh");
  EXPECT_THAT(error_of([&] { list(x); }), HasSubstr("ModuleList has no forward()"));
  EXPECT_THAT(error_of([&] { list[2]; }), HasSubstr("index 2 out of range (size 2)"));
  Sequential seq;
  seq.push_back(std::make_shared<Identity>());
  EXPECT_TRUE(assert_close(seq(x), x, Tolerance{0, 0}));
  EXPECT_THAT(error_of([] { MultiheadAttention(6, 4); }), HasSubstr("embed_dim 6 must be divisible by num_heads 4"));
  MultiheadAttention mha(4, 2);
  EXPECT_THAT(error_of([&] { mha(at::ones({2, 1, 4})); }), HasSubstr("expects {query, key, value[, attn_mask]}"));
}

// ------------------------------------------------------------------ checkpointing

void expect_same_grads(Module& a, Module& b) {
  auto pa = a.named_params(), pb = b.named_params();
  ASSERT_EQ(names_of(pa), names_of(pb));
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_TRUE(pa[i].second.grad().defined()) << pa[i].first;
    ASSERT_TRUE(pb[i].second.grad().defined()) << pb[i].first << " has no grad with checkpointing";
    EXPECT_TRUE(assert_close(pa[i].second.grad(), pb[i].second.grad(), Tolerance{1e-5, 1e-6})) << pa[i].first;
  }
}

TDC_DIST_TEST(NnCheckpoint, GradientsEqualTheNonCheckpointedRunWithDropout) {
  auto ref = std::make_shared<Sequential>(
      std::vector<ModulePtr>{std::make_shared<Linear>(6, 16), std::make_shared<Dropout>(0.3), std::make_shared<ReLU>(),
                             std::make_shared<Linear>(16, 4)});
  auto ck = std::dynamic_pointer_cast<Sequential>(ref->deep_copy());
  checkpoint(*ck);
  EXPECT_TRUE(ck->checkpointed());
  at::Tensor x = at::randn({8, 6});  // no requires_grad: parameter grads must still come

  at::manual_seed(7);
  at::Tensor y0 = (*ref)(x);
  (y0 * y0).sum().backward();
  at::manual_seed(7);
  at::Tensor y1 = (*ck)(x);
  EXPECT_TRUE(y1.requires_grad());
  (y1 * y1).sum().backward();
  EXPECT_TRUE(assert_close(y0, y1, Tolerance{0, 0}));
  expect_same_grads(*ref, *ck);

  // with an input that requires grad, the input gradient too; and in a bigger graph
  at::Tensor xa = x.clone().requires_grad_(), xb = x.clone().requires_grad_();
  for (auto& t : ref->params()) t.mutable_grad().reset();
  for (auto& t : ck->params()) t.mutable_grad().reset();
  at::manual_seed(9);
  ((*ref)(xa * 3).pow(3)).sum().backward();
  at::manual_seed(9);
  ((*ck)(xb * 3).pow(3)).sum().backward();
  ASSERT_TRUE(xb.grad().defined());
  EXPECT_TRUE(assert_close(xa.grad(), xb.grad(), Tolerance{1e-5, 1e-6}));
  expect_same_grads(*ref, *ck);
}

TDC_DIST_TEST(NnCheckpoint, TransformerLayerWithDropoutAndSelfAttention) {
  auto ref = std::make_shared<TransformerEncoderLayer>(8, 2, 16, 0.2);
  auto ck = ref->deep_copy();
  checkpoint(*ck);
  at::Tensor x = at::randn({5, 3, 8});
  at::Tensor xa = x.clone().requires_grad_(), xb = x.clone().requires_grad_();
  at::manual_seed(3);
  at::Tensor y0 = (*ref)(xa);
  y0.sum().backward();
  at::manual_seed(3);
  at::Tensor y1 = (*ck)(xb);
  y1.sum().backward();
  EXPECT_TRUE(torch_allclose(y0, y1));
  EXPECT_TRUE(assert_close(xa.grad(), xb.grad(), Tolerance{1e-5, 1e-6}));
  expect_same_grads(*ref, *ck);
}

TDC_DIST_TEST(NnCheckpoint, HooksRunAgainInRecompute) {
  for (bool use_checkpoint : {false, true}) {
    auto m =
        std::make_shared<Sequential>(std::vector<ModulePtr>{std::make_shared<Linear>(4, 4), std::make_shared<GELU>()});
    if (use_checkpoint) checkpoint(*m);
    int pre = 0, post = 0, child_pre = 0;
    m->register_forward_pre_hook([&](Module&, const Tensors&) {
      ++pre;
      return std::nullopt;
    });
    m->register_forward_hook([&](Module&, const Tensors&, const Tensors&) {
      ++post;
      return std::nullopt;
    });
    m->submodule("0").register_forward_pre_hook([&](Module&, const Tensors&) {
      ++child_pre;
      return std::nullopt;
    });
    at::Tensor y = (*m)(at::randn({2, 4}));
    EXPECT_EQ(pre, 1);
    y.sum().backward();
    int expected = use_checkpoint ? 2 : 1;
    EXPECT_EQ(pre, expected) << "checkpoint=" << use_checkpoint;
    EXPECT_EQ(post, expected) << "checkpoint=" << use_checkpoint;
    EXPECT_EQ(child_pre, expected) << "checkpoint=" << use_checkpoint;
    // Under no-grad a checkpointed module just runs (nothing to recompute).
    at::NoGradGuard g;
    (*m)(at::randn({2, 4}));
    EXPECT_EQ(pre, expected + 1);
  }
}

TDC_DIST_TEST(NnCheckpoint, SubstitutesInstalledByHooksGetGradientsInRecompute) {
  // FSDP's pattern: a pre-hook installs a differentiable expansion of a shard as the parameter.
  auto lin = std::make_shared<Linear>(4, 3);
  at::Tensor shard = lin->p("weight").detach().clone().requires_grad_();
  lin->replace_param("weight", shard);
  lin->register_forward_pre_hook([&](Module& m, const Tensors&) {
    m.set_param_substitute("weight", shard * 1.0);
    return std::nullopt;
  });
  lin->register_forward_hook([&](Module& m, const Tensors&, const Tensors&) {
    m.clear_param_substitutes();
    return std::nullopt;
  });
  checkpoint(*lin);
  at::Tensor x = at::randn({5, 4});
  (*lin)(x).sum().backward();
  ASSERT_TRUE(shard.grad().defined());
  EXPECT_TRUE(torch_allclose(shard.grad(), at::ones({5, 3}).t().mm(x)));
}

}  // namespace
