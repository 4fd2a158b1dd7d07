// Unit tests of tdc::fsdp (FSDP2 fully_shard): training parity against a replicated reference,
// parameters as DTensors (1-D, HSDP, over TP), the FSDPModule methods, mixed precision,
// activation checkpointing, the unsharded-memory bound of reshard_after_forward, and bad input.
//
// Reference (the recipe of test_fully_shard_extensions.py's multi-process tests): every rank holds the unsharded model and its own input; after
// backward the reference's gradients are summed over the ranks and divided by the world size
// (what FSDP's reduce-scatter computes). sharded_parity (common_fsdp.py's check_sharded_parity) compares each shard and
// shard gradient with the rank's chunk of the reference's.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <torch/optim/adam.h>

#include "tdc/comm/collectives.h"
#include "tdc/comm/debug_mode.h"
#include "tdc/comm/testing.h"
#include "tdc/conformance/checks.h"
#include "tdc/conformance/support.h"
#include "tdc/device_mesh.h"
#include "tdc/fixtures/models.h"
#include "tdc/fsdp/all_gather_extension.h"
#include "tdc/fsdp/fully_shard.h"
#include "tdc/fsdp/testing.h"
#include "tdc/harness/harness.h"
#include "tdc/harness/subtests.h"
#include "tdc/nn/checkpoint.h"
#include "tdc/nn/layers.h"
#include "tdc/tensor/module_params.h"
#include "tdc/tp/parallelize.h"

namespace {

using namespace tdc;
using harness::ctx;
using tensor::Placements;
using tensor::Replicate;
using tensor::Shard;
using ::testing::HasSubstr;

using conformance::average_reference_grads;
using conformance::error_of;
using conformance::reference_copy;

at::Generator gen(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

// MLPStack(mlp_dim) (uneven: 3x multiplier) or the Transformer (dropout 0).
nn::ModulePtr make_model(const std::string& name) {
  if (name == "mlp") return std::make_shared<fixtures::MLPStack>(5);
  fixtures::ModelArgs args;
  args.dropout_p = 0.0;
  return std::make_shared<fixtures::Transformer>(args);
}
at::Tensor make_input(const std::string& name, uint64_t seed) {
  if (name == "mlp") return at::randn({2, 5}, gen(seed));
  return at::randint(8, {2, 8}, gen(seed));
}
// fully_shard on each child that has parameters (MLPs / Transformer blocks), then the root.
void shard_model(nn::Module& model, const std::string& name, const fsdp::FullyShardOptions& opts) {
  if (name == "mlp") {
    for (auto& [n, child] : model.named_children_tdc()) fsdp::fully_shard(*child, opts);
  } else {
    for (auto& [n, block] : model.child("layers").named_children_tdc()) fsdp::fully_shard(*block, opts);
  }
  fsdp::fully_shard(model, opts);
}

// ------------------------------------------------------------------ parity

// `iters` Adam steps (lr 1e-2) of loss = output.sum() on this rank's `inp`, the reference's
// gradients averaged over the ranks; losses and sharded_parity every step.
void train_steps(nn::Module& model, nn::Module& ref, const at::Tensor& inp, int iters) {
  torch::optim::Adam opt(model.params(), torch::optim::AdamOptions(1e-2));
  torch::optim::Adam ref_opt(ref.params(), torch::optim::AdamOptions(1e-2));
  for (int it = 0; it < iters; ++it) {
    at::Tensor ref_loss = ref(inp).sum();
    ref_loss.backward();
    average_reference_grads(ref);
    at::Tensor loss = model(inp).sum();
    loss.backward();
    EXPECT_TRUE(conformance::assert_close(loss, ref_loss)) << "loss at iteration " + std::to_string(it);
    EXPECT_TRUE(conformance::sharded_parity(ref, model)) << "iteration " + std::to_string(it) + ":";
    opt.step();
    ref_opt.step();
    opt.zero_grad();
    ref_opt.zero_grad();
  }
  EXPECT_TRUE(conformance::sharded_parity(ref, model)) << "after " + std::to_string(iters) + " Adam steps:";
}

void train_parity(const std::string& model_name, bool reshard_after_forward, bool checkpoint) {
  conformance::world();
  at::manual_seed(42);
  nn::ModulePtr model = make_model(model_name);
  nn::ModulePtr ref = reference_copy(*model);
  if (checkpoint) {
    if (model_name == "mlp") {
      for (auto& [n, c] : model->named_children_tdc()) nn::checkpoint(*c);
    } else {
      for (auto& [n, b] : model->child("layers").named_children_tdc()) nn::checkpoint(*b);
    }
  }
  fsdp::FullyShardOptions opts;
  opts.reshard_after_forward = reshard_after_forward;
  shard_model(*model, model_name, opts);
  EXPECT_TRUE(conformance::sharded_parity(*ref, *model)) << "after fully_shard:";
  train_steps(*model, *ref, make_input(model_name, 42 + ctx().rank + 1), 5);
  EXPECT_TRUE(conformance::sharded_parity(*ref, *model)) << "after 5 Adam steps:";
}

void parity_grid() {
  harness::subtests({{"model", {std::string("mlp"), std::string("transformer")}},
                     {"reshard_after_forward", {true, false}},
                     {"checkpoint", {false, true}}},
                    [](const harness::Params& p) {
                      train_parity(p.get<std::string>("model"), p.get<bool>("reshard_after_forward"),
                                   p.get<bool>("checkpoint"));
                    });
}
TDC_DIST_TEST(FSDPTest, TrainParityWorld2, .world_size = 2, .timeout_s = 120) { parity_grid(); }
TDC_DIST_TEST(FSDPTest, TrainParityWorld3, .world_size = 3, .timeout_s = 120) { train_parity("mlp", true, false); }

// One model called twice before backward (two inputs in one graph): every block's group has two
// autograd nodes; the first to run must not free the storage the other call's saved tensors use.
TDC_DIST_TEST(FSDPTest, TwoForwardsOneBackward, .world_size = 2) {
  harness::subtests({{"model", {std::string("mlp"), std::string("transformer")}}}, [](const harness::Params& prm) {
    const std::string name = prm.get<std::string>("model");
    conformance::world();
    at::manual_seed(42);
    nn::ModulePtr model = make_model(name);
    nn::ModulePtr ref = reference_copy(*model);
    shard_model(*model, name, {});
    at::Tensor a = make_input(name, 10 + ctx().rank), b = make_input(name, 20 + ctx().rank);
    at::Tensor loss = (*model)(a).sum() + (*model)(b).pow(2).sum();
    loss.backward();
    at::Tensor ref_loss = (*ref)(a).sum() + (*ref)(b).pow(2).sum();
    ref_loss.backward();
    average_reference_grads(*ref);
    EXPECT_TRUE(conformance::assert_close(loss, ref_loss)) << "loss";
    EXPECT_TRUE(conformance::sharded_parity(*ref, *model)) << "two forwards:";
    EXPECT_EQ(fsdp::memory_stats().unsharded_bytes, 0) << "everything resharded after backward";
  });
}

// HSDP: (replicate 2, shard 2); parameters (Replicate(), Shard(0)); gradients averaged over all 4.
TDC_DIST_TEST(FSDPTest, HSDPTrainParity, .world_size = 4, .timeout_s = 120) {
  conformance::world();
  DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"dp_replicate", "dp_shard"});
  at::manual_seed(42);
  nn::ModulePtr model = make_model("transformer");
  nn::ModulePtr ref = reference_copy(*model);
  fsdp::FullyShardOptions opts;
  opts.mesh = mesh;
  shard_model(*model, "transformer", opts);
  auto p = tensor::param_dtensor(*model, "layers.0.attention.wq.weight");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->placements(), (Placements{Replicate{}, Shard{0}}));
  train_steps(*model, *ref, make_input("transformer", 42 + ctx().rank + 1), 3);
}

// ------------------------------------------------------------------ DTensor view, 2-D with TP

TDC_DIST_TEST(FSDPTest, ParametersReadBackAsDTensors, .world_size = 2) {
  conformance::world();
  at::manual_seed(1);
  auto model = std::make_shared<fixtures::MLPStack>(5);
  nn::ModulePtr ref = reference_copy(*model);
  shard_model(*model, "mlp", {});
  for (const auto& np : tensor::named_params_with_specs(*model)) {
    ASSERT_TRUE(np.dtensor.has_value()) << np.fqn;
    EXPECT_EQ(np.dtensor->placements(), Placements{Shard{0}}) << np.fqn;
  }
  auto want = ref->named_params();
  auto got = tensor::named_params_with_specs(*model);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(conformance::assert_close(got[i].full(), want[i].second, conformance::Tolerance{0, 0}))
        << "full_tensor of " + got[i].fqn;
  // 15 rows over 2 ranks: 8 and 7 (torch.chunk).
  EXPECT_EQ(tensor::param_dtensor(*model, "0.in_proj.weight")->to_local().size(0), ctx().rank == 0 ? 8 : 7);
}

// FSDP over TP on a (dp 2, tp 2) mesh: TP-sharded parameters get (StridedShard(0, 2), Shard(0))
// when both shard dim 0, (Shard(0), Shard(1)) for a rowwise weight, (Shard(0), Replicate()) for
// its bias; full_tensor() is the original.
TDC_DIST_TEST(FSDPTest, FSDPOverTPPlacements, .world_size = 4) {
  conformance::world();
  DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  at::manual_seed(3);
  auto model = std::make_shared<fixtures::MLPStack>(5);
  nn::ModulePtr ref = reference_copy(*model);
  model->parallelize_tp(mesh["tp"]);
  fsdp::FullyShardOptions opts;
  opts.mesh = mesh["dp"];
  shard_model(*model, "mlp", opts);
  auto w1 = tensor::param_dtensor(*model, "0.in_proj.weight");
  auto w2 = tensor::param_dtensor(*model, "0.out_proj.weight");
  auto b2 = tensor::param_dtensor(*model, "0.out_proj.bias");
  EXPECT_EQ(w1->placements(), (Placements{tensor::StridedShard{0, 2}, Shard{0}}));
  EXPECT_EQ(w2->placements(), (Placements{Shard{0}, Shard{1}}));
  EXPECT_EQ(b2->placements(), (Placements{Shard{0}, Replicate{}}));
  EXPECT_EQ(w1->device_mesh(), mesh);
  auto want = ref->named_params();
  auto got = tensor::named_params_with_specs(*model);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(conformance::assert_close(got[i].full(), want[i].second, conformance::Tolerance{0, 0}))
        << "full_tensor of " + got[i].fqn;
}

// ------------------------------------------------------------------ memory bound

// reshard_after_forward=true keeps at most the root's group plus one block's group unsharded
// during forward (no prefetch); false keeps every block's after it ran.
TDC_DIST_TEST(FSDPTest, ReshardAfterForwardBoundsUnshardedMemory, .world_size = 2) {
  harness::subtests({{"reshard_after_forward", {true, false}}}, [](const harness::Params& prm) {
    const bool reshard = prm.get<bool>("reshard_after_forward");
    conformance::world();
    fixtures::ModelArgs args;
    args.n_layers = 4;
    args.dropout_p = 0.0;
    auto model = std::make_shared<fixtures::Transformer>(args);
    auto bytes_of = [](nn::Module& m) {
      int64_t b = 0;
      for (auto& p : m.params()) b += p.numel() * p.element_size();
      return b;
    };
    const int64_t block_bytes = bytes_of(model->child("layers").child("0"));
    const int64_t all_bytes = bytes_of(*model);
    const int64_t root_bytes = all_bytes - args.n_layers * block_bytes;
    std::vector<int64_t> seen;  // unsharded bytes while each block runs
    for (auto& [n, block] : model->child("layers").named_children_tdc()) {
      block->register_forward_hook(
          [&seen](nn::Module&, const nn::Tensors&, const nn::Tensors&) -> std::optional<nn::Tensors> {
            seen.push_back(fsdp::memory_stats().unsharded_bytes);
            return std::nullopt;
          });
    }
    fsdp::FullyShardOptions opts;
    opts.reshard_after_forward = reshard;
    shard_model(*model, "transformer", opts);
    const int64_t before = fsdp::memory_stats().unsharded_bytes;
    fsdp::reset_peak_memory_stats();
    at::Tensor loss = (*model)(make_input("transformer", 5)).sum();
    const int64_t peak = fsdp::memory_stats().peak_unsharded_bytes - before;
    ASSERT_EQ(seen.size(), static_cast<size_t>(args.n_layers));
    if (reshard) {
      EXPECT_LE(peak, root_bytes + block_bytes) << "more than the root's and one block's parameters were unsharded";
      for (int64_t s : seen) EXPECT_EQ(s - before, root_bytes + block_bytes);
      EXPECT_EQ(fsdp::memory_stats().unsharded_bytes - before, root_bytes) << "after forward only the root stays";
    } else {
      EXPECT_EQ(peak, all_bytes);
      EXPECT_EQ(seen.back() - before, all_bytes);
    }
    loss.backward();
    EXPECT_EQ(fsdp::memory_stats().unsharded_bytes, before) << "after backward everything is resharded";

    // The second forward knows the order: each block but the last has issued the next block's
    // all-gather before it computes ([Note: implicit prefetch]): two blocks at a time, never three.
    std::vector<fsdp::ShardedCounts> counts;
    for (auto& [n, block] : model->child("layers").named_children_tdc()) {
      block->register_forward_hook(
          [&counts, &model](nn::Module&, const nn::Tensors&, const nn::Tensors&) -> std::optional<nn::Tensors> {
            counts.push_back(fsdp::sharded_counts(*model));
            return std::nullopt;
          });
    }
    const int block_params = static_cast<int>(model->child("layers").child("0").params().size());
    fsdp::reset_peak_memory_stats();
    loss = (*model)(make_input("transformer", 5)).sum();
    ASSERT_EQ(counts.size(), static_cast<size_t>(args.n_layers));
    // (Backward resharded every block, so they are gathered again either way.)
    for (size_t i = 0; i + 1 < counts.size(); ++i)
      EXPECT_EQ(counts[i].unsharding, block_params) << "block " << i << " did not prefetch the next one";
    EXPECT_EQ(counts.back().unsharding, 0) << "the last block has nothing to prefetch";
    if (reshard) {
      EXPECT_LE(fsdp::memory_stats().peak_unsharded_bytes - before, root_bytes + 2 * block_bytes);
    }
    loss.backward();
    EXPECT_EQ(fsdp::memory_stats().unsharded_bytes, before) << "after backward everything is resharded";
  });
}

// ------------------------------------------------------------------ FSDPModule methods

int64_t all_gathers(const comm::CommDebugMode& m) {
  auto c = m.get_comm_counts();
  auto it = c.find("c10d._allgather_base_");
  return it == c.end() ? 0 : it->second;
}
int64_t reduce_scatters(const comm::CommDebugMode& m) {
  auto c = m.get_comm_counts();
  auto it = c.find("c10d._reduce_scatter_base_");
  return it == c.end() ? 0 : it->second;
}

TDC_DIST_TEST(FSDPTest, UnshardReshardAndCommCounts, .world_size = 2) {
  conformance::world();
  auto model = make_model("mlp");
  shard_model(*model, "mlp", {});
  at::Tensor inp = make_input("mlp", 7);
  {
    comm::CommDebugMode mode;
    at::Tensor loss = (*model)(inp).sum();
    EXPECT_EQ(all_gathers(mode), 3) << "one all-gather per MLP; the root has no parameters of its own";
    loss.backward();
    EXPECT_EQ(all_gathers(mode), 6) << "reshard_after_forward: gathered again for backward";
    EXPECT_EQ(reduce_scatters(mode), 3) << "one reduce-scatter per group";
  }
  // An explicit unshard: the next forward of that module gathers nothing for it.
  fsdp::FSDPModule mlp0 = fsdp::as_fsdp(model->child("0"));
  {
    fsdp::UnshardHandle h = mlp0.unshard(/*async_op=*/true);
    h.wait();
    comm::CommDebugMode mode;
    (*model)(inp);
    EXPECT_EQ(all_gathers(mode), 2);
  }
  const int64_t before = fsdp::memory_stats().unsharded_bytes;
  mlp0.unshard();
  EXPECT_GT(fsdp::memory_stats().unsharded_bytes, before);
  mlp0.reshard();
  EXPECT_EQ(fsdp::memory_stats().unsharded_bytes, before);
}

// set_requires_gradient_sync(false): no reduce-scatter; the next synced backward reduces the sum.
TDC_DIST_TEST(FSDPTest, GradientSyncOffAccumulates, .world_size = 2) {
  conformance::world();
  at::manual_seed(42);
  nn::ModulePtr model = make_model("mlp");
  nn::ModulePtr ref = reference_copy(*model);
  shard_model(*model, "mlp", {});
  fsdp::FSDPModule root = fsdp::as_fsdp(*model);
  at::Tensor a = make_input("mlp", 100 + ctx().rank), b = make_input("mlp", 200 + ctx().rank);
  root.set_requires_gradient_sync(false);
  {
    comm::CommDebugMode mode;
    (*model)(a).sum().backward();
    EXPECT_EQ(reduce_scatters(mode), 0);
  }
  for (auto& p : model->params()) EXPECT_FALSE(p.grad().defined()) << "no shard gradient before the synced backward";
  root.set_requires_gradient_sync(true);
  (*model)(b).sum().backward();
  (*ref)(a).sum().backward();
  (*ref)(b).sum().backward();
  average_reference_grads(*ref);
  EXPECT_TRUE(conformance::sharded_parity(*ref, *model)) << "after accumulation:";
}

// set_modules_to_forward_prefetch: block 1's all-gather is issued from block 0's pre-forward, so
// when block 1 starts, its group is already gathered.
TDC_DIST_TEST(FSDPTest, ForwardPrefetchOrder, .world_size = 2) {
  conformance::world();
  fixtures::ModelArgs args;
  args.dropout_p = 0.0;
  auto model = std::make_shared<fixtures::Transformer>(args);
  std::vector<int64_t> at_start;
  std::unique_ptr<comm::CommDebugMode> mode;
  // Registered before fully_shard: runs before FSDP's own pre-forward of the block.
  for (auto& [n, block] : model->child("layers").named_children_tdc()) {
    block->register_forward_pre_hook([&](nn::Module&, const nn::Tensors&) -> std::optional<nn::Tensors> {
      if (mode) at_start.push_back(all_gathers(*mode));
      return std::nullopt;
    });
  }
  shard_model(*model, "transformer", {});
  auto& layers = model->child("layers");
  // The first forward knows no order yet; the second prefetches implicitly ([Note: implicit
  // prefetch]): the root issues block 0's gather, block 0 issues block 1's; the third does the
  // same through an explicit list on block 0.
  for (const char* phase : {"first", "implicit", "explicit"}) {
    if (std::string(phase) == "explicit")
      fsdp::as_fsdp(layers.child("0")).set_modules_to_forward_prefetch({&layers.child("1")});
    const bool prefetch = std::string(phase) != "first";
    at_start.clear();
    mode = std::make_unique<comm::CommDebugMode>();
    at::Tensor loss = (*model)(make_input("transformer", 1)).sum();
    mode.reset();
    loss.backward();  // reshards everything, the root included
    ASSERT_EQ(at_start.size(), 2u);
    EXPECT_EQ(at_start[0], prefetch ? 2 : 1) << phase << ": gathers issued when block 0 starts";
    EXPECT_EQ(at_start[1], prefetch ? 3 : 2) << phase << ": gathers issued when block 1 starts";
  }
}

// Backward prefetch (implicit, or set_modules_to_backward_prefetch): block 0's all-gather for backward is issued when block 1's
// backward starts (block 1's output gradient arrives), before block 1's backward computes.
TDC_DIST_TEST(FSDPTest, BackwardPrefetchOrder, .world_size = 2) {
  conformance::world();
  fixtures::ModelArgs args;
  args.dropout_p = 0.0;
  auto model = std::make_shared<fixtures::Transformer>(args);
  shard_model(*model, "transformer", {});
  auto& layers = model->child("layers");
  std::unique_ptr<comm::CommDebugMode> mode;
  std::vector<int64_t> at_block1_backward;
  // Registered after fully_shard: runs after FSDP's post-forward, so this gradient hook fires
  // after FSDP's own pre-backward hook on the same output.
  layers.child("1").register_forward_hook(
      [&](nn::Module&, const nn::Tensors&, const nn::Tensors& out) -> std::optional<nn::Tensors> {
        at::Tensor y = out[0];
        y.register_hook([&](const at::Tensor& g) {
          if (mode) at_block1_backward.push_back(all_gathers(*mode));
          return g;
        });
        return std::nullopt;
      });
  // Without a list block 1 prefetches block 0 implicitly, as PyTorch ([Note: implicit prefetch]);
  // with one, through the list.
  for (bool explicit_list : {false, true}) {
    if (explicit_list) fsdp::as_fsdp(layers.child("1")).set_modules_to_backward_prefetch({&layers.child("0")});
    at_block1_backward.clear();
    at::Tensor loss = (*model)(make_input("transformer", 1)).sum();
    mode = std::make_unique<comm::CommDebugMode>();
    loss.backward();
    const int64_t total = all_gathers(*mode);
    mode.reset();
    ASSERT_EQ(at_block1_backward.size(), 1u);
    EXPECT_EQ(at_block1_backward[0], 2) << "block 0 was not prefetched by block 1 (explicit list: " << explicit_list
                                        << ")";
    EXPECT_EQ(total, 2) << "each block is gathered once for backward";
  }
}

// ------------------------------------------------------------------ mixed precision

TDC_DIST_TEST(FSDPTest, MixedPrecisionBf16, .world_size = 2) {
  conformance::world();
  at::manual_seed(42);
  nn::ModulePtr model = make_model("mlp");
  nn::ModulePtr ref = reference_copy(*model);
  at::ScalarType seen = at::kFloat;
  model->child("0").child("in_proj").register_forward_hook(
      [&seen](nn::Module& m, const nn::Tensors&, const nn::Tensors&) -> std::optional<nn::Tensors> {
        seen = m.p("weight").scalar_type();
        return std::nullopt;
      });
  fsdp::FullyShardOptions opts;
  opts.mp_policy.param_dtype = at::kBFloat16;
  opts.mp_policy.reduce_dtype = at::kFloat;
  shard_model(*model, "mlp", opts);
  at::Tensor inp = make_input("mlp", 42 + ctx().rank);
  at::Tensor out = (*model)(inp);
  EXPECT_EQ(seen, at::kBFloat16) << "the unsharded parameters are bf16";
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  // The reduce-scatter runs in reduce_dtype (PyTorch's mixed-precision tests patch it to check).
  std::vector<at::ScalarType> reduced_in;
  {
    comm::PatchReduceScatter patch([&](at::Tensor&, const at::Tensor& input, comm::ReduceOp, const comm::GroupPtr&,
                                       bool, const std::function<comm::Work()>& original) {
      reduced_in.push_back(input.scalar_type());
      return original();
    });
    out.sum().backward();
  }
  ASSERT_FALSE(reduced_in.empty());
  for (at::ScalarType t : reduced_in) EXPECT_EQ(t, at::kFloat) << "a gradient was reduce-scattered in " << t;
  for (auto& p : model->params()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().scalar_type(), at::kFloat) << "shard gradients keep the parameter dtype";
  }
  (*ref)(inp).sum().backward();
  average_reference_grads(*ref);
  // bf16 compute: compare gradients at bf16 resolution.
  auto got = tensor::named_params_with_specs(*model);
  auto want = ref->named_params();
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(
        conformance::assert_close(got[i].full_grad(), want[i].second.grad(), conformance::Tolerance{5e-2, 5e-2}))
        << got[i].fqn;
}

// output_dtype: the root casts its floating outputs; cast_forward_inputs casts inputs to bf16.
TDC_DIST_TEST(FSDPTest, MixedPrecisionOutputDtype, .world_size = 2) {
  conformance::world();
  nn::ModulePtr model = make_model("mlp");
  at::ScalarType input_dtype = at::kFloat;
  model->child("0").register_forward_pre_hook([&](nn::Module&, const nn::Tensors& in) -> std::optional<nn::Tensors> {
    input_dtype = in[0].scalar_type();
    return std::nullopt;
  });
  fsdp::FullyShardOptions opts;
  opts.mp_policy.param_dtype = at::kBFloat16;
  opts.mp_policy.output_dtype = at::kFloat;
  shard_model(*model, "mlp", opts);
  at::Tensor out = (*model)(make_input("mlp", 3));
  EXPECT_EQ(out.scalar_type(), at::kFloat) << "the root's output is cast to output_dtype";
  EXPECT_EQ(input_dtype, at::kBFloat16) << "the root cast the float input to param_dtype";
  out.sum().backward();
  for (auto& p : model->params()) EXPECT_EQ(p.grad().scalar_type(), at::kFloat);
}

// ------------------------------------------------------------------ lifecycles
// [Note: FSDP lifecycles] (impl/fsdp/common.h): an illegal transition driven from the public API
// is a std::logic_error naming the module's FQN and both states.

TDC_DIST_TEST(FSDPTest, ReshardWhileAsyncUnshardIsPendingIsNamed, .world_size = 2) {
  conformance::world();
  auto model = make_model("mlp");
  shard_model(*model, "mlp", {});
  at::Tensor inp = make_input("mlp", 7);
  (*model)(inp).sum().backward();  // lazy init: the states know their FQNs
  fsdp::FSDPModule mlp0 = fsdp::as_fsdp(model->child("0"));
  fsdp::UnshardHandle h = mlp0.unshard(/*async_op=*/true);
  const std::string err = error_of([&] { mlp0.reshard(); });
  EXPECT_THAT(err, HasSubstr("fully_shard '0 (MLP)': reshard() while UNSHARDING; it needs SHARDED or UNSHARDED"));
  h.wait();
  mlp0.reshard();  // legal once the gather finished
  EXPECT_EQ(fsdp::memory_stats().unsharded_bytes, 0) << "after the legal reshard nothing is unsharded";
  at::Tensor loss = (*model)(inp).sum();  // and the model still trains
  loss.backward();
  for (auto& p : model->params()) EXPECT_TRUE(p.grad().defined());
}

TDC_DIST_TEST(FSDPTest, UnshardDuringBackwardOfAnotherGroupIsNamed, .world_size = 2) {
  conformance::world();
  auto model = make_model("mlp");
  shard_model(*model, "mlp", {});
  at::Tensor inp = make_input("mlp", 7);
  (*model)(inp).sum().backward();
  // A hook on module 2's output runs inside module 2's backward and tries to unshard module 0.
  bool hook_ran = false;
  model->child("2").register_forward_hook(
      [&](nn::Module&, const nn::Tensors&, const nn::Tensors& out) -> std::optional<nn::Tensors> {
        at::Tensor(out[0]).register_hook([&](const at::Tensor& g) {
          hook_ran = true;
          fsdp::as_fsdp(model->child("0")).unshard();
          return g;
        });
        return std::nullopt;
      });
  const std::string err = error_of([&] { (*model)(inp).sum().backward(); });
  EXPECT_TRUE(hook_ran);
  EXPECT_THAT(err, HasSubstr("fully_shard '0 (MLP)': unshard() while IDLE during a backward pass"));
  EXPECT_THAT(err, HasSubstr("it needs IDLE outside forward and backward"));
}

TDC_DIST_TEST(FSDPTest, ReshardInsideItsOwnForwardIsNamed, .world_size = 2) {
  conformance::world();
  auto model = make_model("mlp");
  shard_model(*model, "mlp", {});
  at::Tensor inp = make_input("mlp", 7);
  (*model)(inp).sum().backward();
  // Registered after fully_shard's pre-hook, so it runs inside the module's Forward state.
  std::string err;
  model->child("1").register_forward_pre_hook([&](nn::Module& m, const nn::Tensors&) -> std::optional<nn::Tensors> {
    err = error_of([&] { fsdp::as_fsdp(m).reshard(); });
    return std::nullopt;
  });
  (*model)(inp).sum().backward();
  EXPECT_THAT(err, HasSubstr("fully_shard '1 (MLP)': reshard() while FORWARD (inside its own forward); it needs IDLE"));
}

// ------------------------------------------------------------------ bad input

TDC_DIST_TEST(FSDPTest, BadInput, .world_size = 2) {
  conformance::world();
  auto model = make_model("mlp");
  fsdp::fully_shard(model->child("0"));
  EXPECT_THAT(error_of([&] { fsdp::fully_shard(model->child("0")); }),
              HasSubstr("type 'MLP' is already fully_shard'ed"));
  EXPECT_THAT(error_of([&] { fsdp::as_fsdp(model->child("1")).unshard(); }),
              HasSubstr("module of type 'MLP' was never fully_shard'ed"));

  // A non-floating parameter: rejected, nothing changed.
  auto lin = std::make_shared<nn::Linear>(4, 4);
  lin->register_param("steps", at::zeros({2}, at::kLong), /*requires_grad=*/false);
  at::Tensor w_before = lin->find_param("weight")->clone();
  EXPECT_THAT(error_of([&] { fsdp::fully_shard(*lin); }),
              HasSubstr("parameter 'steps' has dtype Long; only floating-point parameters can be sharded"));
  EXPECT_FALSE(fsdp::is_fully_sharded(*lin));
  EXPECT_TRUE(lin->find_param("weight")->equal(w_before)) << "nothing may have been sharded";
  fsdp::FullyShardOptions ignore;
  ignore.ignored_params = {"steps"};
  fsdp::fully_shard(*lin, ignore);  // accepted once the parameter is ignored
  EXPECT_EQ(lin->find_param("steps")->sizes(), (c10::IntArrayRef{2}));

  fsdp::FullyShardOptions mp;
  mp.mp_policy.reduce_dtype = at::kInt;
  EXPECT_THAT(error_of([&] { fsdp::fully_shard(model->child("1"), mp); }),
              HasSubstr("mp_policy dtype Int is not a floating type"));

  fsdp::FullyShardOptions k;
  k.reshard_after_forward = int64_t(3);
  EXPECT_THAT(error_of([&] { fsdp::fully_shard(model->child("1"), k); }),
              HasSubstr("reshard_after_forward=3 must be a positive divisor of the shard world size 2"));
  fsdp::FullyShardOptions bad_dim;
  bad_dim.shard_placement_fn = [](const at::Tensor&, const tensor::DTensorSpec*, const std::string&) {
    return std::optional<tensor::Shard>(tensor::Shard{5});
  };
  EXPECT_THAT(error_of([&] { fsdp::fully_shard(model->child("1"), bad_dim); }),
              HasSubstr("shard_placement_fn gave Shard(5) for 'in_proj.weight' with 2 dims"));
  EXPECT_FALSE(fsdp::is_fully_sharded(model->child("1")));

  // Extensions: incomplete, or for a parameter no fully_shard'ed module owns.
  fsdp::AllGatherExtension incomplete;
  incomplete.pre_all_gather_v1 = [](const at::Tensor& t, const DeviceMesh&) {
    return fsdp::PreAllGatherResult{{t}, nullptr};
  };
  EXPECT_THAT(error_of([&] { fsdp::set_all_gather_extension(*model, "0.in_proj.weight", incomplete); }),
              HasSubstr("needs post_all_gather"));
  incomplete.post_all_gather = [](const std::vector<at::Tensor>& o, const std::shared_ptr<void>&, at::ScalarType,
                                  at::Tensor*) {
    return fsdp::PostAllGatherResult{o[0], {}};
  };
  EXPECT_THAT(error_of([&] { fsdp::set_all_gather_extension(*model, "2.in_proj.weight", incomplete); }),
              HasSubstr("parameter '2.in_proj.weight' of MLPStack is not sharded by a fully_shard'ed module"));
  EXPECT_THAT(error_of([&] { fsdp::set_all_gather_extension(*model, "0.nope.weight", incomplete); }),
              HasSubstr("nope"));

  // An optimizer step between forward and backward.
  auto m2 = make_model("mlp");
  shard_model(*m2, "mlp", {});
  torch::optim::Adam opt(m2->params(), torch::optim::AdamOptions(1e-2));
  at::Tensor loss = (*m2)(make_input("mlp", 1)).sum();
  for (auto& p : m2->params()) p.mutable_grad() = at::ones_like(p);
  opt.step();
  EXPECT_THAT(error_of([&] { loss.backward(); }), HasSubstr("was modified in place between forward and backward"));
}

TDC_DIST_TEST(FSDPTest, ThreeDimensionalMeshRejected, .world_size = 8) {
  conformance::world();
  DeviceMesh mesh = init_device_mesh("cpu", {2, 2, 2});
  auto model = make_model("mlp");
  fsdp::FullyShardOptions opts;
  opts.mesh = mesh;
  EXPECT_THAT(error_of([&] { fsdp::fully_shard(*model, opts); }), HasSubstr("the mesh has 3 dims"));
}

}  // namespace

namespace {

// The example of docs/fsdp.md, verbatim between the markers (world size 2).
TDC_DIST_TEST(FSDPTest, DocsExample, .world_size = 2) {
  // --- docs/fsdp.md example begin ---
  using namespace tdc;
  conformance::world();  // the default process group (2 ranks)
  DeviceMesh mesh = init_device_mesh("cpu", {2}, {"dp"});

  at::manual_seed(0);  // same model on every rank
  fixtures::ModelArgs args;
  args.dropout_p = 0.0;
  auto model = std::make_shared<fixtures::Transformer>(args);

  fsdp::FullyShardOptions options;
  options.mesh = mesh;
  options.reshard_after_forward = true;  // free each block's gathered weights after its forward
  for (auto& [name, block] : model->child("layers").named_children_tdc()) fsdp::fully_shard(*block, options);
  fsdp::FSDPModule root = fsdp::fully_shard(*model, options);  // the root last: it owns what is left

  // The registered parameters are now the shards; they read back as DTensors (Shard(0)).
  std::optional<tensor::DTensor> w = tensor::param_dtensor(*model, "layers.0.feed_forward.w1.weight");
  // w->shape() == {64, 16}, w->to_local().sizes() == {32, 16}

  torch::optim::Adam opt(model->params(), torch::optim::AdamOptions(1e-2));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + mesh.get_local_rank());
  at::Tensor tokens = at::randint(args.vocab_size, {2, 8}, gen);  // each rank its own batch
  at::Tensor loss = (*model)(tokens).sum();                       // all-gathers, block by block
  loss.backward();                                                // reduce-scatters: shard grads, averaged
  opt.step();
  opt.zero_grad();

  root.set_requires_gradient_sync(false);  // gradient accumulation without comms
  (*model)(tokens).sum().backward();
  root.set_requires_gradient_sync(true);
  // --- docs/fsdp.md example end ---

  EXPECT_EQ(w->placements(), tensor::Placements{tensor::Shard{0}});
  EXPECT_EQ(w->shape(), (std::vector<int64_t>{64, 16}));
  EXPECT_EQ(w->to_local().sizes(), (c10::IntArrayRef{32, 16}));
  for (auto& p : model->params()) EXPECT_FALSE(p.grad().defined()) << "no reduce-scatter while sync is off";
}

}  // namespace
