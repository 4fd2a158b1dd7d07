// Unit tests of tdc::ddp: DistributedDataParallel and replicate against single-process training.
//
// Every rank builds the same model (same seed) and the same global batch; rank r trains on its
// slice of the batch, the single-process reference on the whole batch with the mean loss. With
// equal slices, mean-of-rank-means equals the global mean, so after each SGD step the parameters
// agree up to float32 rounding (summation order differs: per-rank partial sums, then the
// all-reduce). Ranks other than 0 perturb their copy before wrapping, which the construction-time
// broadcast must undo.
#include <ATen/ATen.h>
#include <gmock/gmock.h>

#include "tdc/comm/collectives.h"
#include "tdc/conformance/checks.h"
#include "tdc/conformance/support.h"
#include "tdc/ddp/ddp.h"
#include "tdc/harness/harness.h"
#include "tdc/harness/subtests.h"
#include "tdc/fixtures/models.h"
#include "tdc/nn/layers.h"

namespace {

using namespace tdc;
using harness::ctx;
using ::testing::HasSubstr;

// ------------------------------------------------------------------------------ models and data
struct Batch {
  nn::Tensors inputs;
  at::Tensor target;  // float regression target, or int64 token ids (classification)
  // Rank r's share of a global batch of world * B samples (batch is dim 0 for both models).
  Batch slice(int r, int world) const {
    Batch b;
    int64_t per = target.size(0) / world;
    for (const auto& t : inputs) b.inputs.push_back(t.narrow(0, r * per, per));
    b.target = target.narrow(0, r * per, per);
    return b;
  }
};

// fixtures::MLPStack(8) (three MLPs, 8 -> 24/32 -> 8) and fixtures::Transformer (2 blocks, dim 16,
// vocab 8, tied output/embedding weights) without dropout.
constexpr int64_t kMlpDim = 8, kSeq = 8;
nn::ModulePtr make_transformer() {
  fixtures::ModelArgs args;
  args.dropout_p = 0.0;
  return std::make_shared<fixtures::Transformer>(args);
}
nn::ModulePtr make_model(const std::string& name) {
  if (name == "mlp") return std::make_shared<fixtures::MLPStack>(kMlpDim);
  return make_transformer();
}

// The global batch of `step`: identical on every rank (own generator), 2 samples per rank.
Batch global_batch(const std::string& model, int step, int world) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + 17 * step);
  const int64_t n = 2 * world;
  if (model == "mlp") return {{at::randn({n, kMlpDim}, gen)}, at::randn({n, kMlpDim}, gen)};
  const int64_t vocab = fixtures::ModelArgs{}.vocab_size;
  return {{at::randint(vocab, {n, kSeq}, gen)}, at::randint(vocab, {n, kSeq}, gen)};
}

// Mean loss over the batch: MSE, or token cross-entropy for the Transformer.
at::Tensor loss_of(nn::Module& m, const Batch& b) {
  at::Tensor y = m(b.inputs).at(0);
  if (b.target.scalar_type() == at::kLong) return at::cross_entropy_loss(y.flatten(0, 1), b.target.flatten());
  return at::mse_loss(y, b.target);
}

void sgd_step(const std::vector<at::Tensor>& params, double lr) {
  at::NoGradGuard no_grad;
  for (auto p : params) {
    if (!p.grad().defined()) continue;
    p.add_(p.grad(), -lr);
    p.mutable_grad().reset();
  }
}

void expect_params_close(const nn::Module& actual, const nn::Module& expected, double rtol, double atol,
                         const std::string& what) {
  auto a = actual.named_params(), e = expected.named_params();
  ASSERT_EQ(a.size(), e.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, e[i].first);
    EXPECT_TRUE(tdc::conformance::assert_close(a[i].second, e[i].second, tdc::conformance::Tolerance{rtol, atol}))
        << what + " parameter '" + a[i].first + "'";
  }
}

// The single-process reference: conformance::reference_copy, a copy of rank 0's model broadcast to
// every rank (thread-launched ranks share one generator and build different models).
using conformance::reference_copy;

void perturb_unless_rank0(nn::Module& m) {
  if (ctx().rank == 0) return;
  at::NoGradGuard no_grad;
  for (auto p : m.params()) p.add_(0.25 * ctx().rank);
}

// A DDP-wrapped or replicated model: the module to call and the module holding the parameters.
struct Wrapped {
  nn::ModulePtr keep;  // owns what `call` refers to
  nn::Module* call;
  nn::Module* inner;
};
Wrapped wrap(const std::string& api, nn::ModulePtr model, ddp::DDPOptions opts = {}) {
  if (api == "ddp") {
    auto d = std::make_shared<ddp::DistributedDataParallel>(model, conformance::world(), opts);
    return {d, d.get(), &d->module()};
  }
  ddp::replicate(*model, conformance::world(), opts);
  return {model, model.get(), model.get()};
}

// Tolerances: float32 default of torch.testing (rtol 1.3e-6, atol 1e-5). Summation order differs
// from the reference (per-rank partial sums, then the all-reduce), which after 5 steps stays well
// inside atol for these small models; the Transformer gets rtol 1e-5 (LayerNorm and softmax
// amplify rounding differences of the first step's gradients).
void train_parity(const std::string& model_name, const std::string& api) {
  const int world = ctx().world_size, rank = ctx().rank;
  const double rtol = 1.3e-6, atol = 1e-5, lr = 0.05;
  nn::ModulePtr model = make_model(model_name);
  nn::ModulePtr ref = reference_copy(*model);
  perturb_unless_rank0(*model);
  Wrapped w = wrap(api, model);
  for (int step = 0; step < 5; ++step) {
    Batch global = global_batch(model_name, step, world);
    at::Tensor loss = loss_of(*w.call, global.slice(rank, world));
    loss.backward();
    sgd_step(w.inner->params(), lr);
    at::Tensor ref_loss = loss_of(*ref, global);
    ref_loss.backward();
    sgd_step(ref->params(), lr);
    at::Tensor avg = loss.detach().clone();
    comm::all_reduce(avg, comm::ReduceOp::AVG);
    EXPECT_TRUE(tdc::conformance::assert_close(avg, ref_loss, tdc::conformance::Tolerance{rtol, atol}))
        << "loss at step " + std::to_string(step);
  }
  expect_params_close(*w.inner, *ref, rtol, atol, "after 5 steps:");
}

void train_parity_grid() {
  harness::subtests(
      {{"model", {std::string("mlp"), std::string("transformer")}},
       {"api", {std::string("ddp"), std::string("replicate")}}},
      [](const harness::Params& p) { train_parity(p.get<std::string>("model"), p.get<std::string>("api")); });
}

TDC_DIST_TEST(DDPTest, TrainParityWorld2, .world_size = 2) { train_parity_grid(); }
TDC_DIST_TEST(DDPTest, TrainParityWorld4, .world_size = 4) { train_parity_grid(); }

// no_sync: gradients of micro-batch 1 stay local; the synchronised backward of micro-batch 2
// reduces the accumulated sum, which equals the reference's gradient accumulated over the two
// global micro-batches (one SGD step on the summed loss).
void no_sync_parity(const std::string& api) {
  const int world = ctx().world_size, rank = ctx().rank;
  nn::ModulePtr model = std::make_shared<fixtures::MLPStack>(kMlpDim);
  nn::ModulePtr ref = reference_copy(*model);
  Wrapped w = wrap(api, model);
  Batch m1 = global_batch("mlp", 0, world), m2 = global_batch("mlp", 1, world);

  if (api == "ddp") {
    auto guard = static_cast<ddp::DistributedDataParallel*>(w.call)->no_sync();
    loss_of(*w.call, m1.slice(rank, world)).backward();
  } else {
    ddp::replicate_set_requires_gradient_sync(*w.inner, false);
    loss_of(*w.call, m1.slice(rank, world)).backward();
    ddp::replicate_set_requires_gradient_sync(*w.inner, true);
  }
  // Local only: equal to this rank's own gradient of micro-batch 1.
  nn::ModulePtr local = ref->deep_copy();
  loss_of(*local, m1.slice(rank, world)).backward();
  {
    auto got = w.inner->named_params(), want = local->named_params();
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(tdc::conformance::assert_close(got[i].second.grad(), want[i].second.grad(),
                                                 tdc::conformance::Tolerance{1.3e-6, 1e-7}))
          << "no_sync gradient of '" + got[i].first + "'";
  }
  loss_of(*w.call, m2.slice(rank, world)).backward();
  loss_of(*ref, m1).backward();
  loss_of(*ref, m2).backward();
  auto got = w.inner->named_params(), want = ref->named_params();
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(tdc::conformance::assert_close(got[i].second.grad(), want[i].second.grad(),
                                               tdc::conformance::Tolerance{1.3e-6, 1e-5}))
        << "accumulated gradient of '" + got[i].first + "'";
  sgd_step(w.inner->params(), 0.05);
  sgd_step(ref->params(), 0.05);
  expect_params_close(*w.inner, *ref, 1.3e-6, 1e-5, "after the accumulated step:");
}

TDC_DIST_TEST(DDPTest, NoSyncAccumulation, .world_size = 2) {
  harness::subtests({{"api", {std::string("ddp"), std::string("replicate")}}},
                    [](const harness::Params& p) { no_sync_parity(p.get<std::string>("api")); });
}
TDC_DIST_TEST(DDPTest, NoSyncAccumulationWorld4, .world_size = 4) { no_sync_parity("ddp"); }

// With tiny buckets (one parameter each) the first buckets launch while the gradients of earlier
// layers are still being computed: their launches see gradient-ready events outstanding.
TDC_DIST_TEST(DDPTest, BucketsLaunchDuringBackward, .world_size = 2) {
  const int world = ctx().world_size, rank = ctx().rank;
  auto d = std::make_shared<ddp::DistributedDataParallel>(std::make_shared<fixtures::MLPStack>(kMlpDim),
                                                          conformance::world(), ddp::DDPOptions{.bucket_cap_mb = 1e-4});
  loss_of(*d, global_batch("mlp", 0, world).slice(rank, world)).backward();
  const ddp::BackwardStats& s = d->last_backward();
  EXPECT_TRUE(s.finished);
  EXPECT_EQ(s.buckets, 12);  // 3 MLPs x 2 Linears x (weight, bias); a 1e-4 MB cap is 104 bytes
  ASSERT_EQ(s.launches.size(), 12u);
  int overlapped = 0;
  for (size_t i = 0; i < s.launches.size(); ++i) {
    EXPECT_EQ(s.launches[i].first, static_cast<int>(i)) << "buckets launch in index order";
    if (s.launches[i].second > 0) ++overlapped;
  }
  EXPECT_GE(overlapped, 1) << "no bucket was launched before the last gradient was ready";
  EXPECT_EQ(s.launches.back().second, 0);

  // One bucket (default 25 MB): a single launch once every gradient is in.
  auto one = std::make_shared<ddp::DistributedDataParallel>(std::make_shared<fixtures::MLPStack>(kMlpDim),
                                                            conformance::world());
  loss_of(*one, global_batch("mlp", 0, world).slice(rank, world)).backward();
  EXPECT_EQ(one->last_backward().buckets, 1);
  ASSERT_EQ(one->last_backward().launches.size(), 1u);
  EXPECT_EQ(one->last_backward().launches[0].second, 0);
}

// Buffers: broadcast from rank 0 at construction and, with broadcast_buffers (default), before
// every forward; without it a rank keeps its own buffer values.
TDC_DIST_TEST(DDPTest, BroadcastBuffers, .world_size = 2) {
  harness::subtests({{"broadcast_buffers", {true, false}}}, [](const harness::Params& p) {
    const bool broadcast = p.get<bool>("broadcast_buffers");
    const int rank = ctx().rank;
    auto model = std::make_shared<fixtures::MLP>(kMlpDim, /*bias=*/true, /*with_buffer=*/true);
    auto set_buffer = [&](double v) {
      at::NoGradGuard no_grad;
      model->named_bufs().at(0).second.fill_(v);
    };
    set_buffer(rank + 1.0);
    ddp::DistributedDataParallel d(model, conformance::world(), ddp::DDPOptions{.broadcast_buffers = broadcast});
    at::Tensor buf = model->named_bufs().at(0).second;
    EXPECT_TRUE(buf.eq(1.0).all().item<bool>()) << "construction broadcasts buffers from rank 0";
    set_buffer(10.0 * (rank + 1));
    d(at::randn({2, kMlpDim}));
    const double want = broadcast ? 10.0 : 10.0 * (rank + 1);
    EXPECT_TRUE(buf.eq(want).all().item<bool>()) << "buffer after forward: " << buf;
  });
}

// ------------------------------------------------------------------------------ bad input
// A model with a branch its forward never uses ("unused"), registered last so its parameters land
// in the first bucket (reverse order).
class PartlyUsed : public nn::Module {
 public:
  PartlyUsed() : PartlyUsed(Empty{}) {
    register_child("used", std::make_shared<nn::Linear>(kMlpDim, kMlpDim));
    register_child("unused", std::make_shared<nn::Linear>(kMlpDim, kMlpDim));
  }
  nn::Tensors forward(const nn::Tensors& in) override { return submodule("used")(in); }
  nn::ModulePtr clone_empty() const override { return std::shared_ptr<PartlyUsed>(new PartlyUsed(Empty{})); }

 private:
  struct Empty {};
  explicit PartlyUsed(Empty) : nn::Module("PartlyUsed") {}
};

TDC_DIST_TEST(DDPTest, UnusedParametersError, .world_size = 2) {
  const int world = ctx().world_size, rank = ctx().rank;
  auto d = std::make_shared<ddp::DistributedDataParallel>(std::make_shared<PartlyUsed>(), conformance::world());
  Batch b = global_batch("mlp", 0, world).slice(rank, world);
  try {
    loss_of(*d, b).backward();
    ADD_FAILURE() << "backward with unused parameters did not throw";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("'unused.weight', 'unused.bias'"));
    EXPECT_THAT(e.what(), HasSubstr("find_unused_parameters=true"));
  }
  try {
    (*d)(b.inputs);
    ADD_FAILURE() << "forward after a failed reduction did not throw";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("'unused.weight'"));
    EXPECT_THAT(e.what(), HasSubstr("previous backward"));
  }
}

// find_unused_parameters: the unused branch is marked ready (zeros in its bucket) and the used
// parameters train exactly as without it; parameters no rank used keep no gradient (None, as
// PyTorch); tiny buckets so that used and unused share no bucket, and the default size so that
// they do.
TDC_DIST_TEST(DDPTest, FindUnusedParameters, .world_size = 2) {
  const int world = ctx().world_size, rank = ctx().rank;
  harness::subtests({{"bucket_cap_mb", {25.0, 1e-4}}}, [&](const harness::Params& p) {
    auto model = std::make_shared<PartlyUsed>();
    nn::ModulePtr ref = reference_copy(*model);
    auto d = std::make_shared<ddp::DistributedDataParallel>(
        model, conformance::world(),
        ddp::DDPOptions{.bucket_cap_mb = p.get<double>("bucket_cap_mb"), .find_unused_parameters = true});
    for (int step = 0; step < 3; ++step) {
      Batch global = global_batch("mlp", step, world);
      loss_of(*d, global.slice(rank, world)).backward();
      EXPECT_TRUE(d->last_backward().finished);
      for (const auto& [name, t] : model->submodule("unused").named_params())
        EXPECT_FALSE(t.grad().defined()) << name << ": unused on every rank, its gradient stays None";
      sgd_step(model->params(), 0.05);
      loss_of(*ref, global).backward();
      sgd_step(ref->params(), 0.05);
    }
    expect_params_close(*model, *ref, 1.3e-6, 1e-5, "find_unused_parameters:");
  });
}

// "used" on every rank, "branch" only where use_branch is set (rank 0 in the test below).
class BranchOnSomeRanks : public nn::Module {
 public:
  explicit BranchOnSomeRanks(bool use_branch) : BranchOnSomeRanks(use_branch, Empty{}) {
    register_child("used", std::make_shared<nn::Linear>(kMlpDim, kMlpDim));
    register_child("branch", std::make_shared<nn::Linear>(kMlpDim, kMlpDim));
  }
  nn::Tensors forward(const nn::Tensors& in) override {
    at::Tensor y = submodule("used")(in).at(0);
    if (use_branch_) y = y + submodule("branch")(in).at(0);
    return {y};
  }
  nn::ModulePtr clone_empty() const override {
    return std::shared_ptr<BranchOnSomeRanks>(new BranchOnSomeRanks(use_branch_, Empty{}));
  }

 private:
  struct Empty {};
  BranchOnSomeRanks(bool use_branch, Empty) : nn::Module("BranchOnSomeRanks"), use_branch_(use_branch) {}
  bool use_branch_;
};

// A parameter that one rank used and the other did not is used: the decision is global (PyTorch's
// reducer all-reduces the local usage with SUM), so every rank gets the average of rank 0's
// gradient and rank 1's zeros. A rank-local decision, or a MIN over ranks, would leave it unsynced.
TDC_DIST_TEST(DDPTest, FindUnusedParametersUsedOnOneRankOnly, .world_size = 2) {
  const int world = ctx().world_size, rank = ctx().rank;
  auto model = std::make_shared<BranchOnSomeRanks>(rank == 0);
  nn::ModulePtr local = reference_copy(*model);  // the same weights, no DDP: this rank's own gradient
  auto d = std::make_shared<ddp::DistributedDataParallel>(model, conformance::world(),
                                                          ddp::DDPOptions{.find_unused_parameters = true});
  for (int step = 0; step < 2; ++step) {
    Batch b = global_batch("mlp", step, world).slice(rank, world);
    loss_of(*d, b).backward();
    loss_of(*local, b).backward();
    auto got = model->named_params(), mine = local->named_params();
    ASSERT_EQ(got.size(), mine.size());
    for (size_t i = 0; i < got.size(); ++i) {
      at::Tensor want =
          mine[i].second.grad().defined() ? mine[i].second.grad().clone() : at::zeros_like(mine[i].second);
      comm::all_reduce(want, comm::ReduceOp::AVG, conformance::world());
      ASSERT_TRUE(got[i].second.grad().defined())
          << "step " << step << ": '" << got[i].first << "' was used on rank 0, so it has a gradient on every rank";
      EXPECT_TRUE(tdc::conformance::assert_close(got[i].second.grad(), want, tdc::conformance::Tolerance{1.3e-6, 1e-5}))
          << "step " << step << ": '" << got[i].first << "'";
    }
    sgd_step(model->params(), 0.05);
    sgd_step(local->params(), 0.05);
    // The local copy follows the synchronised weights, so the next step starts from the same ones.
    at::NoGradGuard no_grad;
    auto to = local->params(), from = model->params();
    for (size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
  }
}

// Different models on different ranks: every rank gets the same error naming the first differing
// parameter and each rank's shape, at construction (no hang in the broadcast).
TDC_DIST_TEST(DDPTest, MismatchedParametersError, .world_size = 2) {
  nn::ModulePtr model = std::make_shared<fixtures::MLPStack>(ctx().rank == 0 ? 8 : 12);
  try {
    ddp::DistributedDataParallel d(model, conformance::world());
    ADD_FAILURE() << "construction with different models did not throw";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("parameter '0.in_proj.weight'"));
    EXPECT_THAT(e.what(), HasSubstr("rank 0: parameter '0.in_proj.weight' Float [24, 8]"));
    EXPECT_THAT(e.what(), HasSubstr("rank 1: parameter '0.in_proj.weight' Float [36, 12]"));
    EXPECT_THAT(e.what(), HasSubstr("DistributedDataParallel: the model differs across ranks"));
  }
  // replicate checks the same way; a different dtype is named too.
  nn::ModulePtr m2 = std::make_shared<fixtures::MLPStack>(kMlpDim);
  if (ctx().rank == 1) m2->to(at::kDouble);
  try {
    ddp::replicate(*m2, conformance::world());
    ADD_FAILURE() << "replicate with different dtypes did not throw";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("replicate: the model differs across ranks in parameter "
                                    "'0.in_proj.weight'"));
    EXPECT_THAT(e.what(), HasSubstr("rank 1: parameter '0.in_proj.weight' Double [24, 8]"));
  }
}

TDC_DIST_TEST(DDPTest, ReplicateTwiceError, .world_size = 2) {
  nn::ModulePtr model = std::make_shared<fixtures::MLPStack>(kMlpDim);
  ddp::replicate(*model, conformance::world());
  try {
    ddp::replicate(*model, conformance::world());
    ADD_FAILURE() << "second replicate did not throw";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("already replicated"));
  }
  nn::ModulePtr other = std::make_shared<fixtures::MLPStack>(kMlpDim);
  EXPECT_THROW(ddp::replicate_last_backward(*other), std::invalid_argument);
}

}  // namespace
