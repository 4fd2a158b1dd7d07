// Unit tests of tdc::fsdp1 (FullyShardedDataParallel): training parity against a replicated
// reference for every strategy × use_orig_params × prefetch, gradient accumulation (with and
// without no_sync), a forward after the step, summon_full_params, the three state dict types,
// clip_grad_norm_, mixed precision, the test observers, and bad input.
//
// Reference: every rank holds an unwrapped deep copy of the model and feeds it its own input;
// after backward the reference's gradients are summed over the ranks and divided by the world
// size (what FSDP1's pre/post-divided reduction computes), then both take the same SGD step.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <torch/optim/sgd.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tdc/comm/collectives.h"
#include "tdc/comm/testing.h"
#include "tdc/conformance/checks.h"
#include "tdc/conformance/support.h"
#include "tdc/device_mesh.h"
#include "tdc/fixtures/fsdp1_models.h"
#include "tdc/fixtures/models.h"
#include "tdc/fsdp1/fully_sharded_data_parallel.h"
#include "tdc/fsdp1/testing.h"
#include "tdc/harness/harness.h"
#include "tdc/harness/subtests.h"
#include "tdc/nn/layers.h"

namespace {

using tdc::conformance::assert_close;
using tdc::conformance::Tolerance;

using namespace tdc;
using fsdp1::FSDPOptions;
using fsdp1::FullyShardedDataParallel;
using fsdp1::ShardingStrategy;
using harness::ctx;
using ::testing::HasSubstr;

using conformance::average_reference_grads;
using conformance::error_of;
using conformance::reference_copy;

at::Generator gen(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

// Sequential(Linear(5->7), Linear(7->3), Linear(3->5)): uneven sizes, so flat vectors pad.
nn::ModulePtr make_mlp() {
  at::manual_seed(0);
  return std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(5, 7), std::make_shared<nn::Linear>(7, 3), std::make_shared<nn::Linear>(3, 5)});
}
at::Tensor make_input(int step) { return at::randn({4, 5}, gen(100 * ctx().rank + step)); }

// Full parameters of an FSDP model, in parameters() order.
std::vector<at::Tensor> full_params(nn::Module& model) {
  auto guard = fsdp1::summon_full_params(model, {.writeback = false});
  std::vector<at::Tensor> out;
  for (auto& p : model.params()) out.push_back(p.detach().clone());
  return out;
}

void expect_params_close(nn::Module& fsdp_model, nn::Module& ref, const std::string& what) {
  auto full = full_params(fsdp_model);
  auto refp = ref.params();
  ASSERT_EQ(full.size(), refp.size()) << what;
  for (size_t i = 0; i < full.size(); ++i) {
    ASSERT_EQ(full[i].sizes(), refp[i].sizes()) << what << " param " << i;
    EXPECT_TRUE(assert_close(full[i], refp[i], Tolerance{1.3e-6, 1e-5}))
        << what << " param " << i << " max diff " << (full[i] - refp[i]).abs().max().item<float>();
  }
}

// `steps` SGD steps (lr 0.1, momentum 0.9) of loss = output.sum() on both; parity each step.
void train_and_compare(nn::Module& model, nn::Module& ref, int steps, const std::string& what) {
  torch::optim::SGD opt(model.params(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD ref_opt(ref.params(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < steps; ++step) {
    at::Tensor x = make_input(step);
    opt.zero_grad();
    ref_opt.zero_grad();
    at::Tensor loss = model(x).sum();
    loss.backward();
    at::Tensor ref_loss = ref(x).sum();
    ref_loss.backward();
    average_reference_grads(ref);
    EXPECT_TRUE(assert_close(loss, ref_loss, Tolerance{1e-5, 1e-5})) << what << " step " << step;
    opt.step();
    ref_opt.step();
    for (auto* u : FullyShardedDataParallel::fsdp_modules(model)) {
      EXPECT_EQ(u->training_state(), fsdp1::TrainingState::IDLE) << what;
      EXPECT_EQ(u->handle_training_state(), fsdp1::HandleTrainingState::IDLE) << what;
    }
  }
  expect_params_close(model, ref, what);
}

struct GridCase {
  ShardingStrategy strategy;
  bool use_orig_params;
  std::optional<fsdp1::BackwardPrefetch> prefetch;
  bool forward_prefetch;
  bool always_wrap;
  std::optional<DeviceMesh> mesh = std::nullopt;
};

void parity_case(const GridCase& c) {
  auto model = make_mlp();
  auto ref = reference_copy(*model);
  FSDPOptions o;
  o.sharding_strategy = c.strategy;
  o.use_orig_params = c.use_orig_params;
  o.backward_prefetch = c.prefetch;
  o.forward_prefetch = c.forward_prefetch;
  if (c.always_wrap) o.auto_wrap_policy = fsdp1::always_wrap_policy();
  o.device_mesh = c.mesh;
  auto fsdp = FullyShardedDataParallel::make(model, o);
  EXPECT_EQ(FullyShardedDataParallel::fsdp_modules(*fsdp).size(), c.always_wrap ? 4u : 1u);
  train_and_compare(*fsdp, *ref, 3, fmt::format("{} orig={}", fsdp1::to_string(c.strategy), c.use_orig_params));
}

TDC_DIST_TEST(FSDP1Test, TrainParityGrid, .world_size = 2, .timeout_s = 120) {
  conformance::world();
  std::vector<GridCase> cases;
  for (auto s : {ShardingStrategy::FULL_SHARD, ShardingStrategy::SHARD_GRAD_OP, ShardingStrategy::NO_SHARD}) {
    for (bool orig : {false, true}) {
      for (auto pf : {std::optional<fsdp1::BackwardPrefetch>{}, std::optional{fsdp1::BackwardPrefetch::BACKWARD_PRE},
                      std::optional{fsdp1::BackwardPrefetch::BACKWARD_POST}}) {
        for (bool fwd : {false, true}) cases.push_back({s, orig, pf, fwd, true});
      }
    }
  }
  cases.push_back({ShardingStrategy::FULL_SHARD, false, fsdp1::BackwardPrefetch::BACKWARD_PRE, false, false});
  for (const auto& c : cases) parity_case(c);
}

TDC_DIST_TEST(FSDP1Test, TrainParityWorld3, .world_size = 3, .timeout_s = 120) {
  conformance::world();
  parity_case({ShardingStrategy::FULL_SHARD, true, fsdp1::BackwardPrefetch::BACKWARD_PRE, true, true});
  parity_case({ShardingStrategy::SHARD_GRAD_OP, false, std::nullopt, false, true});
}

// HYBRID_SHARD / _HYBRID_SHARD_ZERO2 over a 2x2 mesh (replicate, shard), and a 1-D device_mesh.
TDC_DIST_TEST(FSDP1Test, TrainParityHybridAndMesh, .world_size = 4, .timeout_s = 120) {
  conformance::world();
  DeviceMesh mesh2d = init_device_mesh("cpu", {2, 2}, {"replicate", "shard"});
  for (auto s : {ShardingStrategy::HYBRID_SHARD, ShardingStrategy::_HYBRID_SHARD_ZERO2}) {
    for (bool orig : {false, true}) {
      parity_case({s, orig, fsdp1::BackwardPrefetch::BACKWARD_PRE, false, true, mesh2d});
    }
  }
  parity_case({ShardingStrategy::FULL_SHARD, false, std::nullopt, true, true, init_device_mesh("cpu", {4})});
}

// Wrap policies other than always-wrap: which submodules become units.
TDC_DIST_TEST(FSDP1Test, WrapPolicies, .world_size = 2) {
  conformance::world();
  // Linear(5->7) holds 42 parameters, Linear(7->3) 24, Linear(3->5) 20.
  auto sized = FullyShardedDataParallel::make(make_mlp(), {.auto_wrap_policy = fsdp1::size_based_auto_wrap_policy(30)});
  EXPECT_EQ(FullyShardedDataParallel::fsdp_modules(*sized).size(), 2u);
  EXPECT_EQ(sized->flat_param_fqns(), (std::vector<std::string>{"1.weight", "1.bias", "2.weight", "2.bias"}));
  auto custom = FullyShardedDataParallel::make(
      make_mlp(), {.auto_wrap_policy = fsdp1::CustomPolicy([](nn::Module& m) { return m.type_name() == "Linear"; })});
  EXPECT_EQ(FullyShardedDataParallel::fsdp_modules(*custom).size(), 4u);
  EXPECT_TRUE(custom->flat_param_fqns().empty());  // the root owns no parameter of its own
  EXPECT_EQ(FullyShardedDataParallel::fsdp_modules(*custom, /*root_only=*/true).size(), 1u);
  // Manual nesting: wrap a child first, then the root.
  auto model = make_mlp();
  nn::ModulePtr child1 = model->named_children_tdc()[1].second;
  model->replace_module("1", FullyShardedDataParallel::make(child1));
  auto root = FullyShardedDataParallel::make(model);
  EXPECT_EQ(FullyShardedDataParallel::fsdp_modules(*root).size(), 2u);
  EXPECT_EQ(root->flat_param_fqns(), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  (*root)(make_input(0)).sum().backward();
  for (auto& p : root->params()) EXPECT_TRUE(p.grad().defined());
}

// ignored_modules stay ordinary parameters (not flattened, gradients not reduced);
// sync_module_states makes every rank start from rank 0's values.
TDC_DIST_TEST(FSDP1Test, IgnoredModulesAndSyncModuleStates, .world_size = 2) {
  conformance::world();
  auto model = make_mlp();
  nn::Module* ignored = &model->child("1");
  auto fsdp = FullyShardedDataParallel::make(model, {.ignored_modules = {ignored}});
  EXPECT_EQ(fsdp->flat_param_fqns(), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  const at::Tensor w = *ignored->find_param("weight");
  EXPECT_EQ(w.sizes(), (std::vector<int64_t>{3, 7}));
  (*fsdp)(make_input(0)).sum().backward();
  ASSERT_TRUE(w.grad().defined());
  auto full = fsdp->state_dict();
  EXPECT_TRUE(full.contains("1.weight"));

  auto perturbed = make_mlp();
  if (ctx().rank == 1) {
    at::NoGradGuard ng;
    for (auto& p : perturbed->params()) p.add_(1.0);
  }
  auto synced = FullyShardedDataParallel::make(perturbed, {.sync_module_states = true});
  for (auto& p : full_params(*synced)) {
    at::Tensor rank0 = p.clone();
    comm::broadcast(rank0, 0);
    EXPECT_TRUE(assert_close(p, rank0, Tolerance{0, 0}));
  }
}

TDC_DIST_TEST(FSDP1Test, ParametersAsTheOptimizerSeesThem, .world_size = 2) {
  conformance::world();
  auto fsdp = FullyShardedDataParallel::make(make_mlp(), {.auto_wrap_policy = fsdp1::always_wrap_policy()});
  std::vector<std::string> names;
  for (auto& [n, p] : fsdp->named_params()) names.push_back(n);
  // One flat parameter per unit with parameters (the three Linears; the Sequential has none).
  EXPECT_EQ(names.size(), 3u);
  for (const auto& n : names) EXPECT_THAT(n, HasSubstr("_fsdp_wrapped_module._flat_param"));
  // 5*7+7 = 42 -> 21 per rank.
  EXPECT_EQ(fsdp->params()[0].numel(), 21);
  auto orig = FullyShardedDataParallel::make(make_mlp(), {.use_orig_params = true});
  EXPECT_EQ(orig->params().size(), 6u);
  EXPECT_EQ(orig->flat_param_fqns(),
            (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias"}));
  {
    auto guard = fsdp1::summon_full_params(*fsdp);
    auto ps = fsdp->named_params();
    ASSERT_EQ(ps.size(), 6u);
    EXPECT_EQ(ps[0].second.sizes(), (std::vector<int64_t>{7, 5}));
    EXPECT_EQ(fsdp->training_state(), fsdp1::TrainingState::SUMMON_FULL_PARAMS);
  }
  EXPECT_EQ(fsdp->training_state(), fsdp1::TrainingState::IDLE);
}

// Two backwards before one optimizer step accumulate: the second's gradient adds to the first's,
// for the flat parameter (use_orig_params=false) and for the original parameters' .grad views
// (use_orig_params=true). `first_under_no_sync`: the first backward runs under no_sync() (its
// unsharded gradient kept locally, reduced with the second); otherwise both are synchronised, as
// gradient accumulation with communication (PyTorch's test_fsdp_grad_acc.py): a state that only
// matters from the second backward on.
void two_backwards_accumulate(bool first_under_no_sync) {
  conformance::world();
  for (bool orig : {false, true}) {
    for (auto s : {ShardingStrategy::FULL_SHARD, ShardingStrategy::SHARD_GRAD_OP, ShardingStrategy::NO_SHARD}) {
      auto model = make_mlp();
      auto ref = reference_copy(*model);
      auto fsdp = FullyShardedDataParallel::make(
          model, {.sharding_strategy = s, .auto_wrap_policy = fsdp1::always_wrap_policy(), .use_orig_params = orig});
      torch::optim::SGD opt(fsdp->params(), torch::optim::SGDOptions(0.1));
      torch::optim::SGD ref_opt(ref->params(), torch::optim::SGDOptions(0.1));
      auto backward = [&](int micro) { (*fsdp)(make_input(micro)).sum().backward(); };
      if (first_under_no_sync) {
        auto no_sync = fsdp->no_sync();
        backward(0);
      } else {
        backward(0);
      }
      backward(1);
      (*ref)(make_input(0)).sum().backward();
      (*ref)(make_input(1)).sum().backward();
      average_reference_grads(*ref);
      opt.step();
      ref_opt.step();
      expect_params_close(
          *fsdp, *ref,
          fmt::format("{} {} orig={}", first_under_no_sync ? "no_sync" : "two backwards", fsdp1::to_string(s), orig));
    }
  }
}

TDC_DIST_TEST(FSDP1Test, NoSyncAccumulates, .world_size = 2) { two_backwards_accumulate(true); }
TDC_DIST_TEST(FSDP1Test, GradientsAccumulateAcrossBackwards, .world_size = 2) { two_backwards_accumulate(false); }

// A forward after an optimizer step computes with the stepped parameters, even when a unit stayed
// unsharded since before the step: here an evaluation forward under no_grad between backward and
// the step leaves the root (and SHARD_GRAD_OP / NO_SHARD units) unsharded, and the step changes
// the shards in place. PyTorch re-gathers because its unsharded views are views of the flat
// parameter; tdc must notice the in-place change (the flat parameter's version) and gather again.
TDC_DIST_TEST(FSDP1Test, ForwardAfterStepSeesTheStep, .world_size = 2) {
  conformance::world();
  for (bool orig : {false, true}) {
    for (auto s : {ShardingStrategy::FULL_SHARD, ShardingStrategy::SHARD_GRAD_OP, ShardingStrategy::NO_SHARD}) {
      const std::string what = fmt::format("{} orig={}", fsdp1::to_string(s), orig);
      auto model = make_mlp();
      auto ref = reference_copy(*model);
      auto fsdp = FullyShardedDataParallel::make(model, {.sharding_strategy = s, .use_orig_params = orig});
      torch::optim::SGD opt(fsdp->params(), torch::optim::SGDOptions(0.1));
      torch::optim::SGD ref_opt(ref->params(), torch::optim::SGDOptions(0.1));
      (*fsdp)(make_input(0)).sum().backward();
      (*ref)(make_input(0)).sum().backward();
      average_reference_grads(*ref);
      {
        at::NoGradGuard no_grad;
        EXPECT_TRUE(assert_close((*fsdp)(make_input(1)), (*ref)(make_input(1)), Tolerance{1.3e-6, 1e-5}))
            << what << ": the evaluation forward";
      }
      opt.step();
      ref_opt.step();
      EXPECT_TRUE(assert_close((*fsdp)(make_input(2)), (*ref)(make_input(2)), Tolerance{1.3e-6, 1e-5}))
          << what << ": the forward after the step";
    }
  }
  // NO_SHARD frees nothing after backward, so its unsharded vector lives across the step; with
  // mixed precision it is a bf16 copy of the parameter, which the step leaves stale unless the
  // unshard notices the change.
  for (bool orig : {false, true}) {
    auto fsdp = FullyShardedDataParallel::make(make_mlp(),
                                               {.sharding_strategy = ShardingStrategy::NO_SHARD,
                                                .mixed_precision = fsdp1::MixedPrecision{.param_dtype = at::kBFloat16},
                                                .use_orig_params = orig});
    torch::optim::SGD opt(fsdp->params(), torch::optim::SGDOptions(0.1));
    (*fsdp)(make_input(0)).sum().backward();
    at::Tensor before, after;
    {
      at::NoGradGuard no_grad;
      before = (*fsdp)(make_input(1));
      opt.step();
      after = (*fsdp)(make_input(1));
    }
    EXPECT_TRUE(conformance::assert_not_equal(after, before))
        << "NO_SHARD bf16 orig=" << orig << ": the forward after the step used the parameters from before it";
  }
}

TDC_DIST_TEST(FSDP1Test, SummonFullParamsWriteback, .world_size = 2) {
  conformance::world();
  for (bool orig : {false, true}) {
    auto fsdp = FullyShardedDataParallel::make(make_mlp(), {.use_orig_params = orig});
    {
      auto guard = fsdp1::summon_full_params(*fsdp);
      at::NoGradGuard ng;
      for (auto& p : fsdp->params()) p.fill_(2.0);
    }
    for (auto& p : full_params(*fsdp)) EXPECT_TRUE(at::all(p == 2.0).item<bool>());
    {
      auto guard = fsdp1::summon_full_params(*fsdp, {.writeback = false});
      at::NoGradGuard ng;
      for (auto& p : fsdp->params()) p.fill_(3.0);
    }
    for (auto& p : full_params(*fsdp)) EXPECT_TRUE(at::all(p == 2.0).item<bool>()) << "writeback=false kept";
    // The next forward sees the written-back values.
    at::Tensor y = (*fsdp)(at::ones({1, 5}));
    EXPECT_GT(y.abs().sum().item<float>(), 0.0f);
  }
  // rank0_only: rank 0 sees full parameters, the others their shards; offload_to_cpu: CPU copies.
  {
    auto fsdp = FullyShardedDataParallel::make(make_mlp());
    auto guard = fsdp1::summon_full_params(*fsdp, {.writeback = false, .rank0_only = true, .offload_to_cpu = true});
    auto ps = fsdp->named_params();
    if (ctx().rank == 0) {
      ASSERT_EQ(ps.size(), 6u);
      EXPECT_EQ(ps[0].second.sizes(), (std::vector<int64_t>{7, 5}));
    } else {
      ASSERT_EQ(ps.size(), 1u);
      EXPECT_THAT(ps[0].first, HasSubstr("_flat_param"));
    }
    for (auto& [n, p] : ps) EXPECT_TRUE(p.device().is_cpu()) << n;
  }
  EXPECT_THAT(error_of([&] {
                auto fsdp = FullyShardedDataParallel::make(make_mlp());
                fsdp1::summon_full_params(*fsdp, {.writeback = true, .rank0_only = true});
              }),
              HasSubstr("writeback=true with rank0_only=true is not supported"));
  // with_grads: full gradients of use_orig_params units.
  auto model = make_mlp();
  auto ref = reference_copy(*model);
  auto fsdp = FullyShardedDataParallel::make(model, {.use_orig_params = true});
  (*fsdp)(make_input(0)).sum().backward();
  (*ref)(make_input(0)).sum().backward();
  average_reference_grads(*ref);
  auto guard = fsdp1::summon_full_params(*fsdp, {.writeback = false, .with_grads = true});
  auto ps = fsdp->params();
  auto rs = ref->params();
  ASSERT_EQ(ps.size(), rs.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    ASSERT_TRUE(ps[i].grad().defined());
    EXPECT_TRUE(assert_close(ps[i].grad(), rs[i].grad(), Tolerance{1e-5, 1e-6})) << i;
  }
}

TDC_DIST_TEST(FSDP1Test, StateDictTypes, .world_size = 2) {
  conformance::world();
  using fsdp1::StateDictType;
  for (bool orig : {false, true}) {
    auto fsdp = FullyShardedDataParallel::make(
        make_mlp(), {.auto_wrap_policy = fsdp1::always_wrap_policy(), .use_orig_params = orig});
    auto full = fsdp->state_dict();
    EXPECT_EQ(full.keys(),
              (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias"}));
    EXPECT_EQ(tensor::as_tensor(full, "0.weight").sizes(), (std::vector<int64_t>{7, 5}));
    tensor::StateDict sharded, local;
    {
      auto t = FullyShardedDataParallel::state_dict_type(*fsdp, StateDictType::SHARDED_STATE_DICT);
      sharded = fsdp->state_dict();
    }
    {
      auto t = FullyShardedDataParallel::state_dict_type(*fsdp, StateDictType::LOCAL_STATE_DICT);
      local = fsdp->state_dict();
    }
    // torch.chunk of 7 rows over 2 ranks: 4 and 3.
    EXPECT_EQ(tensor::as_dtensor(sharded, "0.weight").to_local().size(0), ctx().rank == 0 ? 4 : 3);
    EXPECT_TRUE(assert_close(tensor::as_dtensor(sharded, "0.weight").full_tensor(), tensor::as_tensor(full, "0.weight"),
                             Tolerance{0, 0}));
    EXPECT_EQ(local.keys(), (std::vector<std::string>{"0._flat_param", "1._flat_param", "2._flat_param"}));
    // Round trips: zero the model, load each kind, compare with the full dict.
    for (auto type :
         {StateDictType::FULL_STATE_DICT, StateDictType::SHARDED_STATE_DICT, StateDictType::LOCAL_STATE_DICT}) {
      {
        auto g = fsdp1::summon_full_params(*fsdp);
        at::NoGradGuard ng;
        for (auto& p : fsdp->params()) p.zero_();
      }
      auto t = FullyShardedDataParallel::state_dict_type(*fsdp, type);
      fsdp->load_state_dict(type == StateDictType::FULL_STATE_DICT      ? full
                            : type == StateDictType::SHARDED_STATE_DICT ? sharded
                                                                        : local);
      auto t2 = FullyShardedDataParallel::state_dict_type(*fsdp, StateDictType::FULL_STATE_DICT);
      auto back = fsdp->state_dict();
      for (const auto& k : full.keys()) {
        EXPECT_TRUE(assert_close(tensor::as_tensor(back, k), tensor::as_tensor(full, k), Tolerance{0, 0}))
            << fsdp1::to_string(type) << " " << k;
      }
    }
  }
}

TDC_DIST_TEST(FSDP1Test, ClipGradNorm, .world_size = 2) {
  conformance::world();
  for (auto s : {ShardingStrategy::FULL_SHARD, ShardingStrategy::NO_SHARD}) {
    auto model = make_mlp();
    auto ref = reference_copy(*model);
    auto fsdp = FullyShardedDataParallel::make(
        model, {.sharding_strategy = s, .auto_wrap_policy = fsdp1::always_wrap_policy()});
    (*fsdp)(make_input(0)).sum().backward();
    (*ref)(make_input(0)).sum().backward();
    average_reference_grads(*ref);
    std::vector<at::Tensor> gs;
    for (auto& p : ref->params()) gs.push_back(p.grad());
    at::Tensor ref_norm = at::linalg_vector_norm(at::cat([&] {
                                                   std::vector<at::Tensor> flat;
                                                   for (auto& g : gs) flat.push_back(g.reshape({-1}));
                                                   return flat;
                                                 }()),
                                                 2.0);
    at::Tensor norm = fsdp->clip_grad_norm_(0.5);
    EXPECT_NEAR(norm.item<double>(), ref_norm.item<double>(), 1e-4 * ref_norm.item<double>());
    double sq = 0;
    for (auto& p : fsdp->params()) sq += p.grad().pow(2).sum().item<double>();
    comm::GroupPtr world = comm::default_group();
    at::Tensor t = at::tensor({sq}, at::kDouble);
    if (s != ShardingStrategy::NO_SHARD) comm::all_reduce(t, comm::ReduceOp::SUM, world);
    EXPECT_NEAR(std::sqrt(t.item<double>()), 0.5, 1e-4) << fsdp1::to_string(s);
  }
}

TDC_DIST_TEST(FSDP1Test, MixedPrecision, .world_size = 2) {
  conformance::world();
  for (bool orig : {false, true}) {
    fsdp1::MixedPrecision mp{.param_dtype = at::kBFloat16, .reduce_dtype = at::kFloat, .buffer_dtype = at::kBFloat16};
    auto fsdp = FullyShardedDataParallel::make(
        make_mlp(), {.auto_wrap_policy = fsdp1::always_wrap_policy(), .mixed_precision = mp, .use_orig_params = orig});
    at::Tensor y = (*fsdp)(make_input(0));
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    y.sum().backward();
    for (auto& p : fsdp->params()) {
      EXPECT_EQ(p.scalar_type(), at::kFloat);
      if (p.numel()) {
        EXPECT_EQ(p.grad().scalar_type(), at::kFloat);
      }
    }
    // Full precision inside summon_full_params.
    auto g = fsdp1::summon_full_params(*fsdp);
    for (auto& p : fsdp->params()) EXPECT_EQ(p.scalar_type(), at::kFloat);
  }
}

// The reduction runs in reduce_dtype, and the gradient the optimizer sees is in the parameter's
// dtype unless keep_low_precision_grads (as test_fsdp_mixed_precision checks by patching the
// reduce-scatter): with reduce_dtype low too, the gradient still comes back in float32.
TDC_DIST_TEST(FSDP1Test, MixedPrecisionReduceDtype, .world_size = 2) {
  conformance::world();
  for (at::ScalarType reduce : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(reduce));
    std::vector<at::ScalarType> reduced_in;
    comm::PatchReduceScatter patch([&](at::Tensor&, const at::Tensor& input, comm::ReduceOp, const comm::GroupPtr&,
                                       bool, const std::function<comm::Work()>& original) {
      reduced_in.push_back(input.scalar_type());
      return original();
    });
    fsdp1::MixedPrecision mp{.param_dtype = at::kBFloat16, .reduce_dtype = reduce, .buffer_dtype = at::kBFloat16};
    auto fsdp = FullyShardedDataParallel::make(
        make_mlp(), {.auto_wrap_policy = fsdp1::always_wrap_policy(), .mixed_precision = mp});
    (*fsdp)(make_input(0)).sum().backward();
    ASSERT_FALSE(reduced_in.empty());
    for (at::ScalarType t : reduced_in) EXPECT_EQ(t, reduce) << "a gradient was reduced in " << c10::toString(t);
    for (auto& p : fsdp->params()) {
      if (p.numel()) {
        EXPECT_EQ(p.grad().scalar_type(), at::kFloat) << "keep_low_precision_grads is off";
      }
    }
  }
}

TDC_DIST_TEST(FSDP1Test, ObserversAndHookCount, .world_size = 2) {
  conformance::world();
  int pre = 0, post = 0, as_params = 0, as_tensors = 0, reshards = 0;
  fsdp1::testing::ScopedObservers obs({
      .on_register_pre_backward_hook_call = [&] { ++pre; },
      .on_register_post_backward_hook = [&] { ++post; },
      .on_use_unsharded_views = [&](bool p) { ++(p ? as_params : as_tensors); },
      .before_reshard = [&](const FullyShardedDataParallel&) { ++reshards; },
  });
  auto fsdp = FullyShardedDataParallel::make(make_mlp(), {.auto_wrap_policy = fsdp1::always_wrap_policy()});
  at::Tensor y = (*fsdp)(make_input(0));
  // The root's output is the last Linear unit's output too: both units hooked it (as PyTorch).
  EXPECT_EQ(fsdp1::testing::pre_backward_hook_count(y), 2);
  EXPECT_EQ(pre, 4);   // every unit's forward
  EXPECT_EQ(post, 3);  // the three units with parameters
  EXPECT_GT(as_tensors, 0);
  EXPECT_EQ(as_params, 0);
  y.sum().backward();
  EXPECT_EQ(fsdp1::testing::pre_backward_hook_count(y), 2);
  EXPECT_GT(reshards, 0);
  auto single = FullyShardedDataParallel::make(make_mlp());
  at::Tensor z = (*single)(make_input(0));
  EXPECT_EQ(fsdp1::testing::pre_backward_hook_count(z), 1);
  z.sum().backward();
  EXPECT_EQ(fsdp1::testing::pre_backward_hook_count(z), 1);
  { auto g = fsdp1::summon_full_params(*fsdp); }
  EXPECT_EQ(as_params, 3);
}

// [Note: FSDP1 async prefetch] and [Note: FSDP1 async reduce-scatter]: with forward_prefetch, the
// next unit's all-gather is in flight when a unit reshards after its forward (from the second
// iteration, once the order is known); in backward, a unit's reduction is in flight when it
// reshards; when backward() returns nothing is in flight and every gradient is there. Without
// prefetching, nothing is gathered ahead.
TDC_DIST_TEST(FSDP1Test, CommunicationOverlapsCompute, .world_size = 2) {
  conformance::world();
  for (bool prefetch : {true, false}) {
    FSDPOptions o{.auto_wrap_policy = fsdp1::always_wrap_policy()};
    o.forward_prefetch = prefetch;
    o.backward_prefetch = prefetch ? std::optional{fsdp1::BackwardPrefetch::BACKWARD_PRE} : std::nullopt;
    auto fsdp = FullyShardedDataParallel::make(make_mlp(), o);
    const auto units = FullyShardedDataParallel::fsdp_modules(*fsdp);
    bool in_backward = false;
    int gathering_in_forward = 0, reducing_in_backward = 0;
    fsdp1::testing::ScopedObservers obs({.before_reshard = [&](const FullyShardedDataParallel&) {
      const auto now = fsdp1::testing::overlap_state(units);
      if (!in_backward) gathering_in_forward = std::max(gathering_in_forward, now.unsharding);
      if (in_backward) reducing_in_backward = std::max(reducing_in_backward, now.reducing);
    }});
    torch::optim::SGD opt(fsdp->params(), torch::optim::SGDOptions(0.1));
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      at::Tensor loss = (*fsdp)(make_input(step)).sum();
      in_backward = true;
      loss.backward();
      in_backward = false;
      const auto after = fsdp1::testing::overlap_state(units);
      EXPECT_EQ(after.unsharding, 0) << "prefetch=" << prefetch << " step " << step;
      EXPECT_EQ(after.reducing, 0) << "prefetch=" << prefetch << " step " << step;
      for (auto* u : units) {
        if (u->flat_param().defined()) {
          EXPECT_TRUE(u->flat_param().grad().defined()) << "step " << step;
        }
      }
      opt.step();
    }
    EXPECT_EQ(gathering_in_forward, prefetch ? 1 : 0) << "prefetch=" << prefetch;
    EXPECT_EQ(reducing_in_backward, 1) << "prefetch=" << prefetch;  // at most one in flight
  }
}

// [Note: FSDP1 checks its collectives once per tree]: ranks that wrap different models all throw
// at the first forward, naming the unit and each rank's collective, instead of hanging in Gloo.
TDC_DIST_TEST(FSDP1Test, RanksThatWrapDifferentModelsAllThrow, .world_size = 2) {
  conformance::world();
  at::manual_seed(0);
  const int64_t hidden = ctx().rank == 0 ? 7 : 9;
  auto model = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{std::make_shared<nn::Linear>(5, 7),
                                                                           std::make_shared<nn::Linear>(7, hidden),
                                                                           std::make_shared<nn::Linear>(hidden, 5)});
  auto fsdp = FullyShardedDataParallel::make(model, {.auto_wrap_policy = fsdp1::always_wrap_policy()});
  const std::string msg = error_of([&] { (*fsdp)(make_input(0)); });
  EXPECT_THAT(msg, HasSubstr("would issue different collectives on group 'world' (size 2)"));
  EXPECT_THAT(msg, HasSubstr("(unit '1' (Linear))"));
  EXPECT_THAT(msg, HasSubstr("rank 0: all_gather Float[28] -> [56]; rank 1: all_gather Float[36] -> [72]"));
}

// ------------------------------------------------------------------ bad input

TDC_DIST_TEST(FSDP1Test, BadInput, .world_size = 2) {
  conformance::world();
  // Wrapping twice.
  auto model = make_mlp();
  auto fsdp = FullyShardedDataParallel::make(model);
  EXPECT_THAT(error_of([&] { FullyShardedDataParallel::make(model); }), HasSubstr("already wrapped"));
  EXPECT_THAT(error_of([&] { FullyShardedDataParallel::make(fsdp); }), HasSubstr("already a FullyShardedDataParallel"));
  // Mixed dtypes / requires_grad in one flat parameter: nothing changed.
  {
    auto m = make_mlp();
    m->child("1").replace_param("weight",
                                m->child("1").find_param("weight")->detach().to(at::kDouble).requires_grad_());
    auto before = m->named_params();
    EXPECT_THAT(error_of([&] { FullyShardedDataParallel::make(m); }),
                HasSubstr("'0.weight' is Float but '1.weight' is Double"));
    auto after = m->named_params();
    ASSERT_EQ(before.size(), after.size());
    for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(before[i].second.is_same(after[i].second));
  }
  {
    auto m = make_mlp();
    m->child("2").find_param("bias")->requires_grad_(false);
    EXPECT_THAT(error_of([&] { FullyShardedDataParallel::make(m); }),
                HasSubstr("'0.weight' has requires_grad=true but '2.bias' has requires_grad=false"));
    // With an auto-wrap policy the error comes before any child was wrapped.
    EXPECT_THAT(error_of([&] {
                  FullyShardedDataParallel::make(m, {.auto_wrap_policy = fsdp1::ModuleWrapPolicy({"Sequential"})});
                }),
                HasSubstr("requires_grad"));
    EXPECT_TRUE(FullyShardedDataParallel::fsdp_modules(*m).empty());
    EXPECT_NO_THROW(FullyShardedDataParallel::make(m, {.use_orig_params = true}));
  }
  // An unknown wrap-policy target.
  EXPECT_THAT(error_of([&] {
                FullyShardedDataParallel::make(make_mlp(), {.auto_wrap_policy = fsdp1::ModuleWrapPolicy({"Linaer"})});
              }),
              HasSubstr("names module type 'Linaer', which no module of the tree has (types present: Linear, "
                        "Sequential)"));
  // Offloaded parameters not on the CPU (the meta device stands for an accelerator here).
  {
    auto m = make_mlp();
    auto off = FullyShardedDataParallel::make(m, {.cpu_offload = {.offload_params = true}});
    off->to(c10::Device(c10::kMeta));
    EXPECT_THAT(error_of([&] { (*off)(make_input(0)); }),
                HasSubstr("An FSDP-managed module with parameter CPU offloading enabled has parameters on meta"));
  }
  // summon_full_params inside forward.
  {
    struct Summoner : nn::Module {
      Summoner() : nn::Module("Summoner") { register_child("lin", std::make_shared<nn::Linear>(2, 2)); }
      nn::Tensors forward(const nn::Tensors& in) override {
        auto g = fsdp1::summon_full_params(*self_root);
        return child("lin")(in);
      }
      nn::ModulePtr clone_empty() const override { return std::make_shared<Summoner>(); }
      nn::Module* self_root = nullptr;
    };
    auto s = std::make_shared<Summoner>();
    auto w = FullyShardedDataParallel::make(s);
    s->self_root = w.get();
    EXPECT_THAT(error_of([&] { (*w)(at::ones({1, 2})); }), HasSubstr("summon_full_params while FORWARD_BACKWARD"));
  }
  // state_dict_type the strategy cannot produce.
  {
    auto ns = FullyShardedDataParallel::make(make_mlp(), {.sharding_strategy = ShardingStrategy::NO_SHARD});
    EXPECT_THAT(
        error_of([&] { FullyShardedDataParallel::state_dict_type(*ns, fsdp1::StateDictType::SHARDED_STATE_DICT); }),
        HasSubstr("uses NO_SHARD"));
    EXPECT_EQ(ns->current_state_dict_type(), fsdp1::StateDictType::FULL_STATE_DICT);
  }
  // A hybrid strategy without a 2-D mesh; a dtype conversion of a wrapped model.
  EXPECT_THAT(error_of([&] {
                FullyShardedDataParallel::make(make_mlp(), {.sharding_strategy = ShardingStrategy::HYBRID_SHARD});
              }),
              HasSubstr("HYBRID_SHARD needs a 2-D device_mesh"));
  EXPECT_THAT(error_of([&] { fsdp->to(at::kHalf); }), HasSubstr("use FSDPOptions::mixed_precision"));
}

}  // namespace
