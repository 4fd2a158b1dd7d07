// Fixture models (PyTorch's test models) against real PyTorch: parameter FQNs in named_parameters order,
// shapes, initial values for the same seed, forward output, loss and gradients, all compared with
// fixture_models.json, which fixtures/golden/make_fixture_goldens.py computes with the venv's
// PyTorch on this machine before the suite runs (CTest setup step tdc_goldens). Plus determinism,
// identical init across ranks, weight tying, per-rank inputs, deep_copy, the FSDP1 wrap callback
// contract and MixtureOfExperts' gradient averaging.
#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tdc/conformance/checks.h"
#include "tdc/comm/collectives.h"
#include "tdc/conformance/pytorch_goldens.h"
#include "tdc/conformance/support.h"
#include "tdc/fixtures/fsdp1_models.h"
#include "tdc/fixtures/models.h"
#include "tdc/harness/harness.h"

namespace {

using tdc::conformance::assert_close;
using tdc::conformance::Tolerance;

using nlohmann::json;
using namespace tdc;
using namespace tdc::fixtures;
using nn::Tensors;

// Computed by the venv's PyTorch on this machine, under this process's kernels (see
// [Note: goldens are computed where they are checked] in pytorch_goldens.h).
const json& goldens() { return conformance::pytorch_goldens("fixture_models.json"); }

const json& golden(const std::string& name) {
  for (const auto& c : goldens()["cases"]) {
    if (c["name"] == name) return c;
  }
  throw std::runtime_error("no golden case '" + name + "'");
}

at::Tensor from_golden(const json& t) {
  std::vector<int64_t> shape = t["shape"].get<std::vector<int64_t>>();
  if (t["dtype"] == "int64") return at::tensor(t["values"].get<std::vector<int64_t>>(), at::kLong).view(shape);
  return at::tensor(t["values"].get<std::vector<double>>(), at::kDouble).to(at::kFloat).view(shape);
}

// "The same float32 numbers": the oracle ran the same LibTorch kernels on the same machine, so the
// float32 data are identical and only the float64 summaries (sums) may round differently.
constexpr double kExact = 1e-12;

double tol(double x, double rel) { return rel * (1.0 + std::abs(x)); }

// Shape, sum and weighted sum of `t` against a golden summary.
void expect_summary(const at::Tensor& t, const json& g, const std::string& what, double rel) {
  EXPECT_EQ(t.sizes().vec(), g["shape"].get<std::vector<int64_t>>()) << what;
  double sum = t.detach().to(at::kDouble).sum().item<double>();
  EXPECT_NEAR(sum, g["sum"].get<double>(), tol(g["sum"].get<double>(), rel)) << what << " (sum)";
  EXPECT_NEAR(weighted_sum(t), g["wsum"].get<double>(), tol(g["wsum"].get<double>(), rel)) << what << " (wsum)";
}

void expect_params_and_buffers(nn::Module& m, const json& c) {
  auto params = m.named_params();
  std::vector<std::string> names, want;
  for (const auto& [n, p] : params) names.push_back(n);
  for (const auto& p : c["params"]) want.push_back(p["fqn"]);
  ASSERT_EQ(names, want) << c["name"] << ": parameter FQNs in named_parameters order";
  for (size_t i = 0; i < params.size(); ++i) {
    expect_summary(params[i].second, c["params"][i], c["name"].get<std::string>() + " param " + names[i], kExact);
  }
  auto bufs = m.named_bufs();
  ASSERT_EQ(bufs.size(), c["buffers"].size()) << c["name"] << ": buffers";
  for (size_t i = 0; i < bufs.size(); ++i) {
    EXPECT_EQ(bufs[i].first, c["buffers"][i]["fqn"].get<std::string>()) << c["name"];
    EXPECT_EQ(std::string(c10::toString(bufs[i].second.scalar_type())) == "Long" ? "int64" : "float32",
              c["buffers"][i]["dtype"].get<std::string>() == "int64" ? "int64" : "float32")
        << c["name"] << " buffer " << bufs[i].first;
    expect_summary(bufs[i].second, c["buffers"][i], c["name"].get<std::string>() + " buffer " + bufs[i].first, kExact);
  }
}

using LossFn = std::function<at::Tensor(const Tensors& input, const Tensors& output)>;

// Params, buffers, forward output, loss and grads of `m` on `inputs` against golden case `c`.
// Parameters and buffers must be PyTorch's values exactly. Outputs, loss and grads within `rel`:
// the default is "the same float32 numbers" (the sums are float64 over identical data); a case
// whose forward composes ops differently from PyTorch passes a float32-rounding tolerance.
void expect_matches_golden(nn::Module& m, const Tensors& inputs, const json& c, const LossFn& loss_of = {},
                           const std::function<void()>& before_forward = {}, double rel = kExact) {
  m.train(c["training"].get<bool>());
  expect_params_and_buffers(m, c);
  ASSERT_EQ(inputs.size(), c["inputs"].size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_TRUE(assert_close(inputs[i], from_golden(c["inputs"][i]), Tolerance{0, 0})) << c["name"] << ": input " << i;
  }
  if (before_forward) before_forward();
  Tensors out = m(inputs);
  const std::string name = c["name"];
  expect_summary(out.at(0), c["output"], name + " output", rel);
  at::Tensor loss = loss_of ? loss_of(inputs, out) : out.at(0).sum();
  EXPECT_NEAR(loss.item<double>(), c["loss"].get<double>(), tol(c["loss"].get<double>(), std::max(rel, 1e-7)))
      << name << " loss";
  loss.backward();
  size_t gi = 0;
  for (const auto& [n, p] : m.named_params()) {
    if (!p.grad().defined()) continue;
    ASSERT_LT(gi, c["grads"].size()) << name << ": more grads than PyTorch";
    EXPECT_EQ(n, c["grads"][gi]["fqn"].get<std::string>()) << name;
    expect_summary(p.grad(), c["grads"][gi], name + " grad " + n, rel);
    ++gi;
  }
  EXPECT_EQ(gi, c["grads"].size()) << name << ": grads";
}

Tensors golden_inputs(const json& c) {
  Tensors t;
  for (const auto& i : c["inputs"]) t.push_back(from_golden(i));
  return t;
}

// Builders of the models whose golden input is data (not the model's get_input).
std::map<std::string, std::function<nn::ModulePtr()>> simple_builders() {
  ModelArgs untied;
  untied.weight_tying = false;
  untied.n_layers = 1;
  ModelArgs nomask;
  nomask.use_attn_mask = false;
  return {
      {"MLP_dim8", [] { return std::make_shared<MLP>(8); }},
      {"MLP_dim8_nobias_buffer_x3", [] { return std::make_shared<MLP>(8, false, true, 3); }},
      {"MLPStack_3", [] { return std::make_shared<MLPStack>(3); }},
      {"MLPStack_16", [] { return std::make_shared<MLPStack>(16); }},
      {"MLPStack_17", [] { return std::make_shared<MLPStack>(17); }},
      {"MLPStack_16_seqpar", [] { return std::make_shared<MLPStack>(16, true); }},
      {"MLPModule", [] { return std::make_shared<MLPModule>(); }},
      {"MLPModule_nobias", [] { return std::make_shared<MLPModule>(c10::kCPU, false); }},
      {"MLPModuleComposability_10", [] { return std::make_shared<MLPModuleComposability>(10); }},
      {"MLPModuleEven_10", [] { return std::make_shared<MLPModuleEven>(10); }},
      {"Transformer_eval", [] { return std::make_shared<Transformer>(); }},
      {"Transformer_untied_eval", [untied] { return std::make_shared<Transformer>(untied); }},
      {"Transformer_nomask_eval", [nomask] { return std::make_shared<Transformer>(nomask); }},
      {"Transformer_train_seed100", [] { return std::make_shared<Transformer>(); }},
  };
}

nn::ModulePtr build_seeded(const std::string& name) {
  at::manual_seed(golden(name)["build_seed"].get<uint64_t>());
  return simple_builders().at(name)();
}

// All parameters of `m` flattened into one float tensor (for cross-rank comparisons).
at::Tensor flat_params(nn::Module& m) {
  Tensors flat;
  for (const auto& [n, p] : m.named_params()) flat.push_back(p.detach().flatten().to(at::kFloat));
  return at::cat(flat);
}

// Rank r's copy of `t`, gathered from every rank.
std::vector<at::Tensor> gather(const at::Tensor& t) {
  auto group = conformance::world();
  at::Tensor out = at::empty({group->size() * t.numel()}, t.options());
  comm::all_gather_into_tensor(out, t.contiguous().view(-1), group);
  return out.view({group->size(), t.numel()}).unbind(0);
}

// The models seed the global generator (as PyTorch's do): thread-launched ranks would share it and
// race, so the multi-rank tests run each rank in its own process (ignored under `env`, where
// they are separate processes anyway).
constexpr harness::Launcher kOwnProcesses = harness::Launcher::Fork;

TDC_DIST_SUITE(FixturesTest, .world_size = 1);

// ---------------------------------------------------------------- values vs PyTorch

TDC_DIST_TEST(FixturesTest, ModelsMatchPyTorchGoldens) {
  for (const auto& [name, build] : simple_builders()) {
    SCOPED_TRACE(name);
    nn::ModulePtr m = build_seeded(name);
    std::function<void()> before;
    if (name == "Transformer_train_seed100") before = [] { at::manual_seed(100); };  // dropout masks
    expect_matches_golden(*m, golden_inputs(golden(name)), golden(name), {}, before);
  }
}

TDC_DIST_TEST(FixturesTest, SimpleModelsAndGetInputMatchPyTorch) {
  for (const std::string name : {"SimpleModel", "SimpleModelUneven"}) {
    SCOPED_TRACE(name);
    at::manual_seed(golden(name)["build_seed"].get<uint64_t>());
    nn::ModulePtr m;
    at::Tensor x;
    if (name == "SimpleModel") {
      m = std::make_shared<SimpleModel>();
      x = SimpleModel::get_input(c10::kCPU);  // continues the generator, as in PyTorch
    } else {
      m = std::make_shared<SimpleModelUneven>();
      x = SimpleModelUneven::get_input(c10::kCPU);
    }
    expect_matches_golden(*m, {x}, golden(name));
  }
}

TDC_DIST_TEST(FixturesTest, TransformerWithSharedParamsMatchesPyTorch) {
  auto group = conformance::world();
  for (bool add_bn : {true, false}) {
    const json& c = golden(std::string("TransformerWithSharedParams_bn") + (add_bn ? "1" : "0"));
    SCOPED_TRACE(c["name"].get<std::string>());
    at::manual_seed(1234);
    auto m = TransformerWithSharedParams::init(group, FSDPInitMode::NO_FSDP, DEVICEInitMode::DEVICE_NEVER, {},
                                               /*deterministic=*/true, add_bn);
    EXPECT_FALSE(m->is_training()) << "deterministic => eval()";
    auto& tm = test_model_of(*m);
    Tensors in = tm.get_input(c10::kCPU);
    // Init is exact; forward differs from PyTorch by float32 rounding (~1e-7 relative):
    // PyTorch's encoder/decoder layers call MultiheadAttention with need_weights=False, which
    // runs scaled_dot_product_attention; tdc::nn's MultiheadAttention uses bmm + softmax.
    expect_matches_golden(
        *m, in, c, [&](const Tensors& i, const Tensors& o) { return tm.get_loss(i, o); }, {},
        /*rel=*/1e-5);
  }
}

TDC_DIST_TEST(FixturesTest, LossFnMatchesPyTorch) {
  const json& g = goldens()["loss_fn"];
  at::Tensor y = from_golden(g["inputs"][0]), target = from_golden(g["inputs"][1]);
  EXPECT_NEAR(loss_fn(y, target).item<double>(), g["loss"].get<double>(), 1e-9);
  EXPECT_NEAR(loss_fn(y, target, 1.0).item<double>(), g["loss_scale1"].get<double>(), 1e-6);
}

// ---------------------------------------------------------------- determinism, copies, tying

TDC_DIST_TEST(FixturesTest, SameSeedGivesBitwiseEqualForwardAndBackward) {
  for (const std::string name : {"MLPStack_17", "Transformer_train_seed100", "MLPModuleEven_10"}) {
    SCOPED_TRACE(name);
    Tensors in = golden_inputs(golden(name));
    std::vector<Tensors> results;
    for (int run = 0; run < 2; ++run) {
      nn::ModulePtr m = build_seeded(name);
      at::manual_seed(100);
      Tensors out = m->operator()(in);
      out[0].sum().backward();
      Tensors r = {out[0].detach()};
      for (const auto& [n, p] : m->named_params()) {
        r.push_back(p.detach().clone());
        r.push_back(p.grad().clone());
      }
      results.push_back(r);
    }
    ASSERT_EQ(results[0].size(), results[1].size());
    for (size_t i = 0; i < results[0].size(); ++i)
      EXPECT_TRUE(assert_close(results[0][i], results[1][i], Tolerance{0, 0})) << "item " << i;
  }
}

TDC_DIST_TEST(FixturesTest, DeepCopyKeepsNamesValuesTiesAndForward) {
  auto group = conformance::world();
  std::vector<std::pair<std::string, nn::ModulePtr>> models;
  for (const std::string name : {"MLP_dim8_nobias_buffer_x3", "MLPStack_16_seqpar", "Transformer_eval"}) {
    models.emplace_back(name, build_seeded(name));
  }
  models.emplace_back(
      "TransformerWithSharedParams",
      TransformerWithSharedParams::init(group, FSDPInitMode::NO_FSDP, DEVICEInitMode::DEVICE_NEVER, {}, true));
  models.emplace_back("MixtureOfExperts",
                      MixtureOfExperts::init(group, FSDPInitMode::NO_FSDP, DEVICEInitMode::DEVICE_NEVER, {}, true));
  for (auto& [name, m] : models) {
    SCOPED_TRACE(name);
    m->eval();
    nn::ModulePtr c = m->deep_copy();
    EXPECT_EQ(c->type_name(), m->type_name());
    auto a = m->named_params(), b = c->named_params();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].first, b[i].first);
      EXPECT_TRUE(assert_close(a[i].second, b[i].second, Tolerance{0, 0})) << a[i].first;
      EXPECT_NE(a[i].second.unsafeGetTensorImpl(), b[i].second.unsafeGetTensorImpl()) << a[i].first;
    }
    Tensors in;
    if (auto* tm = dynamic_cast<FSDPTestModel*>(m.get())) {
      in = tm->get_input(c10::kCPU);
    } else {
      in = golden_inputs(golden(name));
    }
    EXPECT_TRUE(assert_close(m->operator()(in)[0], c->operator()(in)[0], Tolerance{0, 0}));
  }
  // The tie survives the copy: the copy's output.weight is its own tok_embeddings.weight.
  nn::ModulePtr t = build_seeded("Transformer_eval")->deep_copy();
  EXPECT_EQ(t->submodule("output").p("weight").unsafeGetTensorImpl(),
            t->submodule("tok_embeddings").p("weight").unsafeGetTensorImpl());
}

TDC_DIST_TEST(FixturesTest, WeightTyingIsOneTensorWithAccumulatedGrads) {
  nn::ModulePtr tied = build_seeded("Transformer_eval");
  tied->eval();
  const at::Tensor& emb = tied->submodule("tok_embeddings").p("weight");
  EXPECT_EQ(tied->submodule("output").p("weight").unsafeGetTensorImpl(), emb.unsafeGetTensorImpl());
  for (const auto& [n, p] : tied->named_params()) EXPECT_NE(n, "output.weight") << "a tied parameter is yielded once";

  // An untied model with the same values: the tied grad is the sum of the two uses' grads.
  ModelArgs args;
  args.weight_tying = false;
  auto untied = std::make_shared<Transformer>(args);
  untied->eval();
  {
    at::NoGradGuard g;
    auto src = tied->named_params();
    std::map<std::string, at::Tensor> by_name(src.begin(), src.end());
    for (auto& [n, p] : untied->named_params()) p.copy_(by_name.count(n) ? by_name[n] : emb);
  }
  Tensors in = golden_inputs(golden("Transformer_eval"));
  tied->operator()(in)[0].sum().backward();
  untied->operator()(in)[0].sum().backward();
  at::Tensor both =
      untied->submodule("tok_embeddings").p("weight").grad() + untied->submodule("output").p("weight").grad();
  EXPECT_TRUE(assert_close(emb.grad(), both, Tolerance{1e-5, 1e-6}));
  EXPECT_FALSE(at::allclose(emb.grad(), untied->submodule("tok_embeddings").p("weight").grad(), 1e-5, 1e-6));

  auto group = conformance::world();
  auto tw = TransformerWithSharedParams::init(group, FSDPInitMode::NO_FSDP, DEVICEInitMode::DEVICE_NEVER, {}, true);
  EXPECT_EQ(tw->submodule("output_proj").p("weight").unsafeGetTensorImpl(),
            tw->submodule("embed_tokens").p("weight").unsafeGetTensorImpl());
}

TDC_DIST_TEST(FixturesTest, CheckpointedTransformerMatchesPlain) {
  ModelArgs args;
  args.checkpoint_activations = true;
  Tensors in = golden_inputs(golden("Transformer_train_seed100"));
  std::vector<Tensors> runs;
  for (bool ckpt : {false, true}) {
    at::manual_seed(0);
    ModelArgs a = args;
    a.checkpoint_activations = ckpt;
    auto m = std::make_shared<Transformer>(a);
    at::manual_seed(100);
    at::Tensor out = m->operator()(in)[0];
    out.sum().backward();
    Tensors r = {out.detach()};
    for (const auto& [n, p] : m->named_params()) {
      if (!p.grad().defined()) {
        ADD_FAILURE() << n << " has no grad (checkpoint_activations=" << ckpt << ")";
        r.push_back(at::zeros_like(p));
      } else {
        r.push_back(p.grad().clone());
      }
    }
    runs.push_back(r);
  }
  // The recompute replays the same ops with the same dropout masks: bitwise equal.
  for (size_t i = 0; i < runs[0].size(); ++i) EXPECT_TRUE(assert_close(runs[0][i], runs[1][i], Tolerance{0, 0})) << i;
}

// ---------------------------------------------------------------- FSDP1 models across ranks

TDC_DIST_TEST(FixturesTest, NestedWrappedModuleMatchesPyTorchWithPerRankInputs, .world_size = 2,
              .launcher = kOwnProcesses) {
  auto group = conformance::world();
  const int rank = group->rank();
  const json& c = golden("NestedWrappedModule_rank" + std::to_string(rank));
  at::manual_seed(1234);
  auto m = NestedWrappedModule::init(group, FSDPInitMode::NO_FSDP, DEVICEInitMode::DEVICE_NEVER, {}, true);
  auto& tm = test_model_of(*m);
  Tensors in = tm.get_input(c10::kCPU);
  expect_matches_golden(*m, in, c, [&](const Tensors& i, const Tensors& o) { return tm.get_loss(i, o); });
  auto inputs = gather(in[0]);
  EXPECT_FALSE(inputs[0].equal(inputs[1])) << "get_input seeds 1 + rank: inputs differ per rank";
  auto params = gather(flat_params(*m));
  EXPECT_TRUE(assert_close(params[0], params[1], Tolerance{0, 0})) << "deterministic init is identical on every rank";

  // TransformerWithSharedParams: the same input everywhere.
  auto tw = TransformerWithSharedParams::init(group, FSDPInitMode::NO_FSDP, DEVICEInitMode::DEVICE_NEVER, {}, true);
  auto src = gather(test_model_of(*tw).get_input(c10::kCPU)[0].to(at::kFloat));
  EXPECT_TRUE(assert_close(src[0], src[1], Tolerance{0, 0}));
}

TDC_DIST_TEST(FixturesTest, IdenticalInitAcrossRanks, .world_size = 2, .launcher = kOwnProcesses) {
  auto group = conformance::world();
  for (const std::string name : {"MLPStack_17", "Transformer_eval", "MLPModule"}) {
    SCOPED_TRACE(name);
    nn::ModulePtr m = build_seeded(name);
    auto all = gather(flat_params(*m));
    EXPECT_TRUE(assert_close(all[0], all[1], Tolerance{0, 0}));
  }
  auto tw = TransformerWithSharedParams::init(group, FSDPInitMode::NO_FSDP, DEVICEInitMode::DEVICE_NEVER, {}, true);
  auto all = gather(flat_params(*tw));
  EXPECT_TRUE(assert_close(all[0], all[1], Tolerance{0, 0}));
}

TDC_DIST_TEST(FixturesTest, MixtureOfExpertsMatchesPyTorchAndAveragesSharedGrads, .world_size = 2,
              .launcher = kOwnProcesses) {
  auto group = conformance::world();
  const int rank = group->rank();
  const json& c = golden("MixtureOfExperts_rank" + std::to_string(rank));
  at::manual_seed(1234);
  auto m = MixtureOfExperts::init(group, FSDPInitMode::NO_FSDP, DEVICEInitMode::DEVICE_NEVER, {}, true);
  auto& moe = dynamic_cast<MixtureOfExperts&>(*m);
  EXPECT_EQ(moe.expert_param_names(), c["expert_fqns"].get<std::vector<std::string>>());
  EXPECT_EQ(moe.num_expert_params(), c["num_expert_params"].get<int64_t>());
  // Local forward/backward equals PyTorch's (loss.backward() only, before the all-reduce).
  Tensors in = moe.get_input(c10::kCPU);
  expect_matches_golden(*m, in, c, [&](const Tensors& i, const Tensors& o) { return moe.get_loss(i, o); });
  // Experts differ across ranks, everything else is identical.
  for (const auto& [n, p] : m->named_params()) {
    auto all = gather(p.detach().flatten());
    EXPECT_EQ(all[0].equal(all[1]), !moe.is_expert_param(n)) << n;
  }
  // run_backward: non-expert grads averaged over the group, expert grads local.
  m->zero_grad();
  moe.run_backward(moe.get_loss(in, m->operator()(in)));
  const json& avg = c["grads_after_run_backward_world2_nonexpert"];
  size_t ai = 0, gi = 0;
  for (const auto& [n, p] : m->named_params()) {
    const json* want = nullptr;
    if (moe.is_expert_param(n)) {
      while (c["grads"][gi]["fqn"] != n) ++gi;
      want = &c["grads"][gi];
    } else {
      want = &avg[ai++];
      EXPECT_EQ((*want)["fqn"].get<std::string>(), n);
    }
    expect_summary(p.grad(), *want, "after run_backward: " + n, kExact);
  }
}

// ---------------------------------------------------------------- the FSDP1 wrap callback contract

TDC_DIST_TEST(FixturesTest, RecursiveNeedsAWrapFunction) {
  auto group = conformance::world();
  auto expect_logic_error = [](const std::function<void()>& f) {
    try {
      f();
      ADD_FAILURE() << "no exception";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("FSDP1 not available: pass a wrap function"), std::string::npos) << e.what();
    }
  };
  auto rec = FSDPInitMode::RECURSIVE;
  auto dev = DEVICEInitMode::DEVICE_NEVER;
  expect_logic_error([&] { NestedWrappedModule::init(group, rec, dev); });
  expect_logic_error([&] { AlwaysWrapNestedWrappedModule::init(group, rec, dev); });
  expect_logic_error([&] { TransformerWithSharedParams::init(group, rec, dev); });
  expect_logic_error([&] { MixtureOfExperts::init(group, rec, dev); });
  expect_logic_error([&] { NestedWrappedModuleWithDelay::init(group, rec, dev); });
}

TDC_DIST_TEST(FixturesTest, WrapRequestsFollowCommonFsdp, .world_size = 2, .launcher = kOwnProcesses) {
  auto group = conformance::world();
  auto rec = FSDPInitMode::RECURSIVE, none = FSDPInitMode::NO_FSDP;
  auto dev = DEVICEInitMode::DEVICE_NEVER;
  struct Call {
    std::string type;
    WrapRequest request;
  };
  std::vector<Call> calls;
  // A stand-in FSDP unit: records the request and wraps in a transparent container.
  FSDPWrapFn record = [&](nn::ModulePtr m, const WrapRequest& r) -> nn::ModulePtr {
    calls.push_back({m->type_name(), r});
    return std::make_shared<DummyDDP>(m);
  };
  using AW = WrapRequest::AutoWrap;

  // NestedWrappedModule: three inner units on the given group, no root; wrapping draws nothing.
  auto nwm = NestedWrappedModule::init(group, rec, dev, record, true);
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].type, "Linear");
  EXPECT_EQ(calls[1].type, "Sequential");
  EXPECT_EQ(calls[2].type, "Linear");
  for (const auto& c : calls) {
    EXPECT_EQ(c.request.group, group);
    EXPECT_EQ(c.request.auto_wrap, AW::NONE);
  }
  auto plain = NestedWrappedModule::init(group, none, dev, {}, true);
  EXPECT_TRUE(assert_close(flat_params(*nwm), flat_params(*plain), Tolerance{0, 0}));
  EXPECT_EQ(nwm->named_params()[2].first, "module.1.module.0.module.weight");

  // AlwaysWrap: one root unit, default group, always-wrap policy.
  calls.clear();
  auto always = AlwaysWrapNestedWrappedModule::init(group, rec, dev, record, true);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].type, "NestedWrappedModule");
  EXPECT_EQ(calls[0].request.group, nullptr);
  EXPECT_EQ(calls[0].request.auto_wrap, AW::ALWAYS);
  EXPECT_EQ(&test_model_of(*always), always->named_children()["module"].get());

  // TransformerWithSharedParams: one root unit with ModuleWrapPolicy({encoder, decoder layers}).
  calls.clear();
  auto tw = TransformerWithSharedParams::init(group, rec, dev, record, true);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].type, "TransformerWithSharedParams");
  EXPECT_EQ(calls[0].request.auto_wrap, AW::MODULE_TYPES);
  EXPECT_EQ(calls[0].request.module_types,
            (std::vector<std::string>{"TransformerEncoderLayer", "TransformerDecoderLayer"}));
  EXPECT_NO_THROW(test_model_of(*tw).get_input(c10::kCPU));

  // MixtureOfExperts: expert on a singleton group of this rank, shared on the group.
  calls.clear();
  auto moe = MixtureOfExperts::init(group, rec, dev, record, true);
  ASSERT_EQ(calls.size(), 2u);
  ASSERT_NE(calls[0].request.group, nullptr);
  EXPECT_EQ(calls[0].request.group->size(), 1);
  EXPECT_EQ(calls[0].request.group->global_ranks(), std::vector<int>{group->rank()});
  EXPECT_EQ(calls[1].request.group, group);
  auto moe_plain = MixtureOfExperts::init(group, none, dev, {}, true);
  EXPECT_TRUE(assert_close(flat_params(*moe), flat_params(*moe_plain), Tolerance{0, 0}));
}

TDC_DIST_TEST(FixturesTest, ModuleWithDelaySleepsAfterLossAndDelegates) {
  auto group = conformance::world();
  auto m = NestedWrappedModuleWithDelay::init(group, FSDPInitMode::NO_FSDP, DEVICEInitMode::DEVICE_AFTER, {}, true,
                                              /*delay_after_loss_ms=*/40);
  auto plain = NestedWrappedModule::init(group, FSDPInitMode::NO_FSDP, DEVICEInitMode::DEVICE_AFTER, {}, true);
  Tensors in = m->get_input(c10::kCPU);
  EXPECT_TRUE(assert_close(in[0], test_model_of(*plain).get_input(c10::kCPU)[0], Tolerance{0, 0}));
  Tensors out = m->operator()(in);
  EXPECT_TRUE(assert_close(out[0], plain->operator()(in)[0], Tolerance{0, 0}));
  auto t0 = std::chrono::steady_clock::now();
  at::Tensor loss = m->get_loss(in, out);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(ms, 40);
  m->run_backward(loss);
  for (const auto& [n, p] : m->named_params()) EXPECT_TRUE(p.grad().defined()) << n;
  EXPECT_EQ(m->named_params()[0].first, "module.module.0.weight");
}

// delay_before_reduction_ms: every reduce-scatter issued during run_backward sleeps first (the
// backward here issues two, from a gradient hook); outside run_backward there is no delay.
// Sleeps give lower bounds that hold under any load; the "no delay afterwards" bound is the delay
// itself (two reduce-scatters of 8 floats stay far below 2 x 200 ms even on a saturated machine).
TDC_DIST_TEST(FixturesTest, ModuleWithDelaySleepsBeforeEachReduceScatter) {
  constexpr int kDelayMs = 200;
  auto group = conformance::world();
  auto m = NestedWrappedModuleWithDelay::init(group, FSDPInitMode::NO_FSDP, DEVICEInitMode::DEVICE_AFTER, {}, true,
                                              /*delay_after_loss_ms=*/0, /*delay_before_reduction_ms=*/kDelayMs);
  auto reduce_scatter_twice = [&] {
    for (int i = 0; i < 2; ++i) {
      at::Tensor in = at::ones({2 * group->size()}), out = at::empty({2});
      comm::reduce_scatter_tensor(out, in, comm::ReduceOp::SUM, group);
      EXPECT_TRUE(assert_close(out, at::full({2}, static_cast<float>(group->size())), Tolerance{0, 0}));
    }
  };
  at::Tensor x = at::ones({3}).requires_grad_();
  at::Tensor y = x * 2;
  y.register_hook([&](const at::Tensor& g) {
    reduce_scatter_twice();
    return g;
  });
  auto t0 = std::chrono::steady_clock::now();
  m->run_backward(y.sum());
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(ms, 2 * kDelayMs) << "two reduce-scatters, a delay before each";
  t0 = std::chrono::steady_clock::now();
  reduce_scatter_twice();
  ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(ms, 2 * kDelayMs) << "the patch ends with run_backward";
}

}  // namespace
