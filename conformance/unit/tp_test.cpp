// Unit tests of tdc::tp (tensor parallel): each parallel style and the fixtures' TP recipes
// against single-process ground truth, the communication TP issues (CommDebugMode), plans with
// wildcards, and the errors a user can cause.
//
// Ground truth: every rank holds the same unsharded copy of the model (taken before
// parallelize_module and broadcast from rank 0) and feeds it the same input; the TP model must
// produce the same outputs, the same gradients (distributed parameters compared through
// full_tensor()) and, after optimizer steps, the same parameters. Tolerance: torch.testing's
// float32 default (rtol 1.3e-6, atol 1e-5), the one PyTorch's assertEqual uses in the seed tests.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include "tdc/comm/collectives.h"
#include "tdc/comm/debug_mode.h"
#include "tdc/conformance/checks.h"
#include "tdc/conformance/support.h"
#include "tdc/device_mesh.h"
#include "tdc/fixtures/models.h"
#include "tdc/harness/harness.h"
#include "tdc/harness/subtests.h"
#include "tdc/nn/layers.h"
#include "tdc/tensor/module_params.h"
#include "tdc/tp/parallelize.h"

namespace {

using tdc::conformance::assert_close;
using tdc::conformance::Tolerance;

using namespace tdc;
using harness::ctx;
using tensor::Partial;
using tensor::Placements;
using tensor::Replicate;
using tensor::Shard;
using ::testing::HasSubstr;

using conformance::error_of;
using conformance::reference_copy;

// Same tensor on every rank: drawn from a generator seeded the same everywhere.
at::Generator gen(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

// Compares every parameter (full_tensor of distributed ones) and, when `grads`, every gradient.
// tol: none = PyTorch's defaults of the dtype.
void expect_model_matches(nn::Module& tp_model, nn::Module& ref, const std::string& what, bool grads,
                          std::optional<conformance::Tolerance> tol = std::nullopt) {
  auto got = tensor::named_params_with_specs(tp_model);
  auto want = ref.named_params();
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].fqn, want[i].first) << what;
    if (grads) {
      at::Tensor g = got[i].full_grad(), rg = want[i].second.grad();
      ASSERT_EQ(g.defined(), rg.defined()) << what << " gradient of '" << got[i].fqn << "'";
      if (g.defined()) {
        EXPECT_TRUE(assert_close(g, rg, {.tol = tol})) << what + " gradient of '" + got[i].fqn + "'";
      }
    } else {
      EXPECT_TRUE(assert_close(got[i].full(), want[i].second, {.tol = tol}))
          << what + " parameter '" + got[i].fqn + "'";
    }
  }
}

DeviceMesh tp_mesh() {
  conformance::world();
  return init_device_mesh("cpu", {ctx().world_size}, {"tp"});
}

// ------------------------------------------------------------------ Colwise + Rowwise Linear

// fixtures::MLP(3, dim_multiplier 3): in_proj 3 -> 9 columnwise, out_proj 9 -> 3 rowwise. 9 over
// 2 or 4 ranks is uneven (5/4, 3/3/3/0), the input requires grad (Colwise's backward all-reduce).
void colwise_rowwise_pair(int64_t dim, bool bias) {
  DeviceMesh mesh = tp_mesh();
  auto model = std::make_shared<fixtures::MLP>(dim, bias, /*with_buffer=*/false, /*dim_multiplier=*/3);
  nn::ModulePtr ref = reference_copy(*model);
  tp::parallelize_module(*model, mesh, {{"in_proj", tp::ColwiseParallel{}}, {"out_proj", tp::RowwiseParallel{}}});
  // Specs read back.
  auto w1 = tensor::param_dtensor(*model, "in_proj.weight");
  auto w2 = tensor::param_dtensor(*model, "out_proj.weight");
  ASSERT_TRUE(w1 && w2);
  EXPECT_EQ(w1->placements(), Placements{Shard{0}});
  EXPECT_EQ(w2->placements(), Placements{Shard{1}});
  EXPECT_EQ(w1->shape(), (std::vector<int64_t>{3 * dim, dim}));
  if (bias) {
    EXPECT_EQ(tensor::param_dtensor(*model, "in_proj.bias")->placements(), Placements{Shard{0}});
    EXPECT_EQ(tensor::param_dtensor(*model, "out_proj.bias")->placements(), Placements{Replicate{}});
  }
  expect_model_matches(*model, *ref, "after parallelize_module:", false, Tolerance{0, 0});

  at::Tensor x = at::randn({4, dim}, gen(7)).requires_grad_(true);
  at::Tensor xr = x.detach().clone().requires_grad_(true);
  at::Tensor y = (*model)(x), yr = (*ref)(xr);
  EXPECT_TRUE(assert_close(y, yr)) << "output";
  (y * y).sum().backward();
  (yr * yr).sum().backward();
  EXPECT_TRUE(assert_close(x.grad(), xr.grad())) << "input gradient";
  expect_model_matches(*model, *ref, "", true);
}

TDC_DIST_TEST(TpTest, ColwiseRowwiseLinearWorld2, .world_size = 2) {
  harness::subtests({{"dim", {int64_t(3), int64_t(4)}}, {"bias", {true, false}}},
                    [](const harness::Params& p) { colwise_rowwise_pair(p.get<int64_t>("dim"), p.get<bool>("bias")); });
}
TDC_DIST_TEST(TpTest, ColwiseRowwiseLinearWorld3, .world_size = 3) { colwise_rowwise_pair(3, true); }
TDC_DIST_TEST(TpTest, ColwiseRowwiseLinearWorld4, .world_size = 4) { colwise_rowwise_pair(3, true); }

// ------------------------------------------------------------------ layouts of inputs and outputs

// Rowwise with output Shard(0) (reduce-scatter) feeding a Colwise with input Shard(0) (all-gather
// in forward, reduce-scatter of the partial gradient in backward); Colwise output Replicate.
TDC_DIST_TEST(TpTest, ShardedActivationLayouts, .world_size = 2) {
  DeviceMesh mesh = tp_mesh();
  auto model = std::make_shared<nn::Sequential>(
      std::vector<nn::ModulePtr>{std::make_shared<nn::Linear>(6, 8), std::make_shared<nn::Linear>(8, 10),
                                 std::make_shared<nn::Tanh>(), std::make_shared<nn::Linear>(10, 6)});
  nn::ModulePtr ref = reference_copy(*model);
  tp::parallelize_module(*model, mesh,
                         {{"0", tp::ColwiseParallel{}},
                          {"1", tp::RowwiseParallel{.output_layouts = Shard{0}}},
                          {"3", tp::ColwiseParallel{.input_layouts = Shard{0}, .output_layouts = Replicate{}}}});
  at::Tensor x = at::randn({4, 6}, gen(3)).requires_grad_(true);
  at::Tensor xr = x.detach().clone().requires_grad_(true);
  at::Tensor y = (*model)(x), yr = (*ref)(xr);
  EXPECT_TRUE(assert_close(y, yr)) << "output (Replicate)";
  (y * y).sum().backward();
  (yr * yr).sum().backward();
  EXPECT_TRUE(assert_close(x.grad(), xr.grad())) << "input gradient";
  expect_model_matches(*model, *ref, "", true);
}

// PrepareModuleInput / PrepareModuleOutput around a Colwise linear whose output stays Shard(-1).
TDC_DIST_TEST(TpTest, PrepareModuleInputOutput, .world_size = 2) {
  DeviceMesh mesh = tp_mesh();
  auto model = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{std::make_shared<nn::Linear>(4, 6)});
  nn::ModulePtr ref = reference_copy(*model);
  tp::parallelize_module(*model, mesh, {{"0", tp::ColwiseParallel{}}});
  // The module's input arrives sharded on dim 0, its output is wanted whole.
  tp::parallelize_module(*model, mesh,
                         tp::PrepareModuleInput{.input_layouts = {Shard{0}}, .desired_input_layouts = {Replicate{}}});
  tp::parallelize_module(
      *model, mesh, tp::PrepareModuleOutput{.output_layouts = {Shard{-1}}, .desired_output_layouts = {Replicate{}}});
  at::Tensor x = at::randn({4, 4}, gen(5));
  at::Tensor x_local = x.chunk(2, 0)[mesh.get_local_rank()].clone().requires_grad_(true);
  at::Tensor xr = x.clone().requires_grad_(true);
  at::Tensor y = (*model)(x_local), yr = (*ref)(xr);
  EXPECT_TRUE(assert_close(y, yr)) << "output";
  y.pow(2).sum().backward();
  yr.pow(2).sum().backward();
  EXPECT_TRUE(assert_close(x_local.grad(), xr.grad().chunk(2, 0)[mesh.get_local_rank()]))
      << "input gradient (this rank's rows)";
  expect_model_matches(*model, *ref, "", true);
}

// ------------------------------------------------------------------ Embedding

void embedding_case(const std::string& style, const std::string& out_layout) {
  DeviceMesh mesh = tp_mesh();
  // 7 ids over 2 or 4 ranks: uneven vocabulary rows (4/3, 2/2/2/1); dim 8.
  auto model = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{std::make_shared<nn::Embedding>(7, 8)});
  nn::ModulePtr ref = reference_copy(*model);
  tp::Placement out = out_layout == "replicate" ? tp::Placement(Replicate{}) : tp::Placement(Shard{1});
  if (style == "rowwise") {
    tp::parallelize_module(*model, mesh,
                           {{"0", tp::RowwiseParallel{.input_layouts = Replicate{}, .output_layouts = out}}});
    EXPECT_EQ(tensor::param_dtensor(*model, "0.weight")->placements(), Placements{Shard{0}});
  } else {
    tp::parallelize_module(*model, mesh, {{"0", tp::ColwiseParallel{.output_layouts = out}}});
    EXPECT_EQ(tensor::param_dtensor(*model, "0.weight")->placements(), Placements{Shard{1}});
  }
  at::Tensor ids = at::randint(7, {3, 4}, gen(11));
  at::Tensor y = (*model)(ids), yr = (*ref)(ids);
  if (out_layout == "replicate") {
    EXPECT_TRUE(assert_close(y, yr)) << "output";
  } else {
    const int64_t n = mesh.size(), me = mesh.get_local_rank();
    EXPECT_TRUE(assert_close(y, yr.chunk(n, 1)[me])) << "output (Shard(1), this rank's piece)";
    yr = yr.chunk(n, 1)[me];  // the loss below sums the local pieces: one term per rank
  }
  at::Tensor w = at::randn(y.sizes(), gen(13));
  (y * w).sum().backward();
  (yr * w).sum().backward();
  if (out_layout == "replicate") {
    expect_model_matches(*model, *ref, "", true);
  } else {
    // Each rank's reference gradient covers its own sequence piece; their sum is the full one.
    at::Tensor g = ref->named_params()[0].second.grad().clone();
    comm::all_reduce(g, comm::ReduceOp::SUM, mesh.get_group());
    EXPECT_TRUE(assert_close(tensor::named_params_with_specs(*model)[0].full_grad(), g)) << "weight gradient";
  }
}

TDC_DIST_TEST(TpTest, EmbeddingWorld2, .world_size = 2) {
  harness::subtests(
      {{"style", {std::string("rowwise"), std::string("colwise")}},
       {"output", {std::string("replicate"), std::string("shard1")}}},
      [](const harness::Params& p) { embedding_case(p.get<std::string>("style"), p.get<std::string>("output")); });
}
TDC_DIST_TEST(TpTest, EmbeddingWorld4, .world_size = 4) {
  harness::subtests({{"style", {std::string("rowwise"), std::string("colwise")}}},
                    [](const harness::Params& p) { embedding_case(p.get<std::string>("style"), "replicate"); });
}

// ------------------------------------------------------------------ MLPStack: test_tp_with_fsdp_offloading's counts

// The TP part of MLPStack.parallelize on a ws-way TP mesh: forward issues exactly 3 functional
// all-reduces (one per rowwise out_proj) and nothing else; backward exactly 2 (the colwise
// in_proj inputs of MLPs 1 and 2; MLP 0's input needs no gradient); no all-gather or
// reduce-scatter. The loss equals the single-process loss at every step (Adam, lr 1e-2).
void mlp_stack_counts(int64_t mlp_dim) {
  DeviceMesh mesh = tp_mesh();
  auto model = std::make_shared<fixtures::MLPStack>(mlp_dim);
  nn::ModulePtr ref = reference_copy(*model);
  model->parallelize_tp(mesh);
  torch::optim::Adam opt(model->params(), torch::optim::AdamOptions(1e-2));
  torch::optim::Adam ref_opt(ref->params(), torch::optim::AdamOptions(1e-2));
  at::Tensor x = at::randn({4, mlp_dim}, gen(42));
  for (int it = 0; it < 5; ++it) {
    opt.zero_grad();
    ref_opt.zero_grad();
    at::Tensor loss;
    {
      comm::CommDebugMode mode;
      loss = (*model)(x).sum();
      EXPECT_EQ(mode.get_comm_counts(), (std::map<std::string, int64_t>{{"c10d_functional.all_reduce", 3}}))
          << "forward of iteration " << it;
    }
    at::Tensor ref_loss = (*ref)(x).sum();
    EXPECT_TRUE(assert_close(loss, ref_loss)) << "loss at iteration " + std::to_string(it);
    {
      comm::CommDebugMode mode;
      loss.backward();
      EXPECT_EQ(mode.get_comm_counts(), (std::map<std::string, int64_t>{{"c10d_functional.all_reduce", 2}}))
          << "backward of iteration " << it;
    }
    ref_loss.backward();
    opt.step();
    ref_opt.step();
  }
  expect_model_matches(*model, *ref, "after 5 Adam steps:", false);
}

TDC_DIST_TEST(TpTest, MLPStackCommCountsWorld4, .world_size = 4) {
  harness::subtests({{"mlp_dim", {int64_t(16), int64_t(3), int64_t(17)}}},
                    [](const harness::Params& p) { mlp_stack_counts(p.get<int64_t>("mlp_dim")); });
}
TDC_DIST_TEST(TpTest, MLPStackCommCountsWorld2, .world_size = 2) { mlp_stack_counts(17); }

// ------------------------------------------------------------------ Transformer parity

// Transformer(n_layers, dropout 0) parallelized by its recipe, sequence parallel on or off,
// against the single-process model: 5 AdamW steps (lr 1e-2) on loss = output.sum() of one
// randint(0, 8, (2, 16)) batch. Losses every step, every gradient (full_tensor) every step, every
// parameter after the last.
void transformer_parity(int64_t n_layers, bool seq_parallel) {
  DeviceMesh mesh = tp_mesh();
  fixtures::ModelArgs args;
  args.n_layers = n_layers;
  args.dropout_p = 0.0;
  auto model = std::make_shared<fixtures::Transformer>(args);
  nn::ModulePtr ref = reference_copy(*model);
  fixtures::Transformer::parallelize(*model, mesh, seq_parallel);
  // The tied weight stays one parameter, sharded on the vocabulary.
  auto tied = tensor::param_dtensor(*model, "tok_embeddings.weight");
  ASSERT_TRUE(tied.has_value());
  EXPECT_EQ(tied->placements(), Placements{Shard{0}});
  EXPECT_TRUE(model->child("output").find_param("weight")->is_same(tied->to_local()));
  EXPECT_EQ(model->named_params().size(), ref->named_params().size());
  expect_model_matches(*model, *ref, "after parallelize:", false, Tolerance{0, 0});

  torch::optim::AdamW opt(model->params(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW ref_opt(ref->params(), torch::optim::AdamWOptions(1e-2));
  at::Tensor tokens = at::randint(args.vocab_size, {2, 16}, gen(42));
  for (int it = 0; it < 5; ++it) {
    at::Tensor loss = (*model)(tokens).sum();
    at::Tensor ref_loss = (*ref)(tokens).sum();
    EXPECT_TRUE(assert_close(loss, ref_loss)) << "loss at step " + std::to_string(it);
    loss.backward();
    ref_loss.backward();
    // Gradients: rtol 1e-5 (the sum-of-logits loss makes gradients of magnitude ~10 whose
    // float32 rounding differs with the reduction order: 1.6e-5 seen at TP=4).
    expect_model_matches(*model, *ref, "step " + std::to_string(it), true, Tolerance{1e-5, 1e-5});
    opt.step();
    ref_opt.step();
    opt.zero_grad();
    ref_opt.zero_grad();
  }
  expect_model_matches(*model, *ref, "after 5 AdamW steps:", false);
}

void transformer_grid() {
  harness::subtests(
      {{"n_layers", {int64_t(2), int64_t(3)}}, {"seq_parallel", {false, true}}},
      [](const harness::Params& p) { transformer_parity(p.get<int64_t>("n_layers"), p.get<bool>("seq_parallel")); });
}
TDC_DIST_TEST(TpTest, TransformerParityTP2, .world_size = 2, .timeout_s = 120) { transformer_grid(); }
TDC_DIST_TEST(TpTest, TransformerParityTP4, .world_size = 4, .timeout_s = 120) { transformer_grid(); }

// ------------------------------------------------------------------ plans

TEST(TpPlanTest, WildcardsMatchInModuleOrder) {
  fixtures::ModelArgs args;
  args.n_layers = 3;
  fixtures::Transformer model(args);
  auto found = tp::match_modules(model, "layers.*.attention.w[qk]");
  std::vector<std::string> names;
  for (auto& [fqn, m] : found) names.push_back(fqn);
  EXPECT_EQ(names,
            (std::vector<std::string>{"layers.0.attention.wq", "layers.0.attention.wk", "layers.1.attention.wq",
                                      "layers.1.attention.wk", "layers.2.attention.wq", "layers.2.attention.wk"}));
  EXPECT_EQ(tp::match_modules(model, "layers.[12].feed_forward.w?").size(), 4u);
  EXPECT_EQ(tp::match_modules(model, "output").size(), 1u);
  EXPECT_TRUE(tp::match_modules(model, "layers.*.attn").empty());
}

// ------------------------------------------------------------------ bad input

TDC_DIST_TEST(TpTest, BadPlansLeaveTheModuleUntouched, .world_size = 2) {
  DeviceMesh mesh = tp_mesh();
  auto model = std::make_shared<fixtures::MLPStack>(4);
  nn::ModulePtr before = model->deep_copy();
  auto unchanged = [&](const std::string& what) {
    auto a = model->named_params(), b = before->named_params();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(assert_close(a[i].second, b[i].second, Tolerance{0, 0}))
          << what << ": '" << a[i].first << "' changed";
      auto [owner, name] = model->owner_of(a[i].first);
      EXPECT_EQ(tensor::param_spec(*owner, name), nullptr) << what << ": '" << a[i].first << "' got a spec";
    }
  };

  // A key that matches nothing (after a good one: nothing may have been applied).
  std::string msg = error_of([&] {
    tp::parallelize_module(*model, mesh, {{"0.in_proj", tp::ColwiseParallel{}}, {"*.up_proj", tp::RowwiseParallel{}}});
  });
  EXPECT_THAT(msg, HasSubstr("plan key '*.up_proj' (RowwiseParallel) matches no submodule of MLPStack"));
  EXPECT_THAT(msg, HasSubstr("nothing matches 'up_proj' under '0' (type MLP; children: in_proj, out_proj)"));
  unchanged("unmatched key");

  // A style on a module it cannot parallelize.
  msg = error_of([&] { tp::parallelize_module(*model, mesh, {{"0", tp::ColwiseParallel{}}}); });
  EXPECT_THAT(msg, HasSubstr("ColwiseParallel on '0' (MLP): only Linear and Embedding"));
  unchanged("style on an MLP");

  // Two styles distributing one module's parameters.
  msg = error_of([&] {
    tp::parallelize_module(*model, mesh, {{"*.in_proj", tp::ColwiseParallel{}}, {"1.in_proj", tp::RowwiseParallel{}}});
  });
  EXPECT_THAT(msg, HasSubstr("module '1.in_proj' (Linear) is matched by plan keys '*.in_proj' and '1.in_proj'"));
  unchanged("two styles");

  // Layout lists of different lengths; a Partial input layout.
  msg = error_of([&] {
    tp::parallelize_module(*model, mesh,
                           {{"0", tp::PrepareModuleInput{.input_layouts = {Shard{0}, Replicate{}},
                                                         .desired_input_layouts = {Replicate{}}}}});
  });
  EXPECT_THAT(
      msg, HasSubstr("PrepareModuleInput on '0' (MLP): input_layouts has 2 entries but desired_input_layouts has 1"));
  msg = error_of([&] {
    tp::parallelize_module(*model, mesh, {{"0.in_proj", tp::ColwiseParallel{.input_layouts = Partial{}}}});
  });
  EXPECT_THAT(msg, HasSubstr("ColwiseParallel: input_layouts Partial(sum) is not supported"));
  unchanged("layouts");

  // An empty key.
  msg = error_of([&] { tp::parallelize_module(*model, mesh, {{"", tp::ColwiseParallel{}}}); });
  EXPECT_THAT(msg, HasSubstr("empty plan key"));

  // Re-parallelizing a parameter another way.
  tp::parallelize_module(*model, mesh, {{"0.in_proj", tp::ColwiseParallel{}}});
  msg = error_of([&] { tp::parallelize_module(*model, mesh, {{"0.in_proj", tp::RowwiseParallel{}}}); });
  EXPECT_THAT(
      msg,
      HasSubstr("RowwiseParallel on '0.in_proj' (Linear): parameter 'weight' is already distributed as (Shard(0))"));
}

TDC_DIST_TEST(TpTest, MeshMustBeOneDimensional, .world_size = 4) {
  conformance::world();
  DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  auto model = std::make_shared<fixtures::MLPStack>(4);
  std::string msg = error_of([&] { tp::parallelize_module(*model, mesh, {{"0.in_proj", tp::ColwiseParallel{}}}); });
  EXPECT_THAT(msg, HasSubstr("tensor parallel takes a 1-D mesh, got 2 dims"));
  // The sliced TP dim works.
  tp::parallelize_module(*model, mesh["tp"], {{"0.in_proj", tp::ColwiseParallel{}}});
  EXPECT_EQ(tensor::param_dtensor(*model, "0.in_proj.weight")->device_mesh(), mesh["tp"]);
}

TDC_DIST_TEST(TpTest, TransformerRecipeRejectsIndivisibleHeads, .world_size = 3) {
  DeviceMesh mesh = tp_mesh();
  fixtures::ModelArgs args;
  args.dropout_p = 0.0;
  fixtures::Transformer model(args);
  std::string msg = error_of([&] { fixtures::Transformer::parallelize(model, mesh, false); });
  EXPECT_THAT(msg, HasSubstr("layers.0.attention has n_heads 4 and dim 16; both must be divisible by the TP size 3"));
  EXPECT_FALSE(tensor::param_dtensor(model, "tok_embeddings.weight").has_value()) << "nothing may have been applied";
}

}  // namespace

namespace {

// The example of docs/tp.md, verbatim between the markers (world size 2).
TDC_DIST_TEST(TpTest, DocsExample, .world_size = 2) {
  // --- docs/tp.md example begin ---
  using namespace tdc;
  conformance::world();  // the default process group (2 ranks)
  DeviceMesh mesh = init_device_mesh("cpu", {2}, {"tp"});

  at::manual_seed(0);  // same model on every rank
  auto model = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(8, 32), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(32, 8)});
  nn::ModulePtr reference = model->deep_copy();  // unsharded, to compare with

  tp::parallelize_module(*model, mesh,
                         {{"0", tp::ColwiseParallel{}},    // weight, bias Shard(0): output Shard(-1)
                          {"2", tp::RowwiseParallel{}}});  // weight Shard(1): partial sums all-reduced

  // The registered parameters are the local shards (what optimizers see); their specs make them
  // read back as DTensors.
  std::optional<tensor::DTensor> w = tensor::param_dtensor(*model, "0.weight");
  // w->placements() == {Shard{0}}, w->shape() == {32, 8}, w->to_local().sizes() == {16, 8}

  torch::optim::AdamW opt(model->params(), torch::optim::AdamWOptions(1e-3));
  at::Tensor x = at::randn({4, 8});             // same input on every rank
  at::Tensor loss = (*model)(x).pow(2).mean();  // forward: one all-reduce
  loss.backward();
  at::Tensor full_grad = w->grad()->full_tensor();  // [32, 8], all-gathered
  opt.step();
  // --- docs/tp.md example end ---

  EXPECT_EQ(w->placements(), tensor::Placements{tensor::Shard{0}});
  EXPECT_EQ(w->shape(), (std::vector<int64_t>{32, 8}));
  EXPECT_EQ(w->to_local().sizes(), (c10::IntArrayRef{16, 8}));
  at::Tensor ref_loss = (*reference)(x).pow(2).mean();
  EXPECT_TRUE(assert_close(loss, ref_loss)) << "loss";
  ref_loss.backward();
  EXPECT_TRUE(assert_close(full_grad, reference->named_params()[0].second.grad())) << "0.weight gradient";
}

}  // namespace
