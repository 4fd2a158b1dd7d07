// Conformance: PyTorch's test/distributed/checkpoint/fsdp/test_fsdp_dsd.py,
// class TestFullyShardWithDistributedStateDict. Same method names, same assertions. All six
// methods: the four FSDP2 / TP ones and the two that save from FSDP1 (tdc::fsdp1) and load into
// FSDP2 (+ TP).
//
// Launch: FSDPTest (a fresh process per rank: the fork launcher), world size min(4, #devices) in
// PyTorch; here 4 on any device (2 for the 1-D methods would do; 4 is what PyTorch runs with 4
// GPUs). PyTorch skips these below 2 / 4 GPUs; on gloo/cpu every assertion means the same.
//
// Differences, each the closest honest equivalent:
//  * `model.state_dict()` is tdc::checkpoint::module_state_dict (tdc::nn modules have no
//    state_dict of their own).
//  * `model.load_state_dict(sd)` / `optim.load_state_dict(sd)` after dcp.load are
//    set_model_state_dict / set_optimizer_state_dict: LibTorch's optimizer keeps Adam's step as an
//    integer outside the state dict ([Note: LibTorch's optimizer step is an integer]).
//  * dcp.save / dcp.load(checkpoint_id=dir) write and read tdc's safetensors checkpoints.
//  * with_temp_dir on the inner function of a subtest grid: a directory of its own per subtest,
//    under the test's temp dir.
//  * FSDP1's `FSDP.state_dict_type(model, type)` context is the guard
//    FullyShardedDataParallel::state_dict_type returns.
//  * Inputs (torch.randn, the same on every rank in PyTorch, which seeds every rank alike) come
//    from a generator of their own seeded 0: the same on every rank under every launcher.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include "tdc/checkpoint/checkpoint.h"
#include "tdc/state_dict/state_dict.h"
#include "tdc/conformance/checks.h"
#include "tdc/conformance/state_dict_checks.h"
#include "tdc/conformance/support.h"
#include "tdc/device_mesh.h"
#include "tdc/fixtures/models.h"
#include "tdc/fsdp/fully_shard.h"
#include "tdc/fsdp1/fully_sharded_data_parallel.h"
#include "tdc/fsdp1/wrap.h"
#include "tdc/harness/harness.h"
#include "tdc/harness/subtests.h"
#include "tdc/nn/layers.h"
#include "tdc/tp/parallelize.h"

namespace {

using namespace tdc;
using checkpoint::StateDict;
using checkpoint::StateDictOptions;
using conformance::state_dicts_equal;
using harness::Axis;
using harness::ctx;
using FSDP = fsdp1::FullyShardedDataParallel;

constexpr int kWorld = 4;  // min(4, #devices) with 4 devices

// _get_base_model(mlp_dim): Sequential(MLP(d), Sequential(MLP(d), Linear(d, d)), MLP(d)).
nn::ModulePtr _get_base_model(int64_t mlp_dim = 2) {
  auto inner = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<fixtures::MLP>(mlp_dim), std::make_shared<nn::Linear>(mlp_dim, mlp_dim)});
  auto model = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<fixtures::MLP>(mlp_dim), inner, std::make_shared<fixtures::MLP>(mlp_dim)});
  conformance::sync_from_rank0(*model);
  return model;
}

// Sequential(MLP(d, dim_multiplier) x 3): the TP methods' base model.
nn::ModulePtr mlp_x3(int64_t mlp_dim, int64_t dim_multiplier = 4) {
  std::vector<nn::ModulePtr> mlps;
  for (int i = 0; i < 3; ++i) mlps.push_back(std::make_shared<fixtures::MLP>(mlp_dim, true, false, dim_multiplier));
  auto model = std::make_shared<nn::Sequential>(mlps);
  conformance::sync_from_rank0(*model);
  return model;
}

// fully_shard each top-level child, then the root.
void shard_children_and_root(nn::Module& model, const fsdp::FullyShardOptions& options = {}) {
  for (auto& [name, child] : model.named_children_tdc()) fsdp::fully_shard(*child, options);
  fsdp::fully_shard(model, options);
}

// {f"{i}.in_proj": ColwiseParallel, f"{i}.out_proj": RowwiseParallel for i in 0, 1, 2}.
tp::ParallelizePlan mlp_tp_plan(bool use_local_output = true, int first = 0) {
  tp::ParallelizePlan plan;
  for (int i = first; i < 3; ++i) {
    plan.emplace_back(std::to_string(i) + ".in_proj", tp::ColwiseParallel{.use_local_output = use_local_output});
    plan.emplace_back(std::to_string(i) + ".out_proj", tp::RowwiseParallel{.use_local_output = use_local_output});
  }
  return plan;
}

// torch.randn(shape, device=...): the same numbers on every rank (PyTorch seeds every rank alike and
// does not re-seed); a generator of its own gives that under every launcher (thread-launched
// ranks share the global one).
at::Tensor randn_on_every_rank(std::vector<int64_t> shape) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  return at::randn(shape, gen).to(fixtures::device());
}

void train_step(nn::Module& model, torch::optim::Optimizer& optim, const at::Tensor& inp) {
  model(inp).sum().backward();
  optim.step();
}

const StateDictOptions kFullOffload{.full_state_dict = true, .cpu_offload = true};

// dcp.save(state_dict, checkpoint_id=dir) of {name: sub-dict, ...}.
void dcp_save(const std::vector<std::pair<std::string, StateDict>>& parts, const std::string& dir) {
  StateDict sd;
  for (const auto& [name, part] : parts) sd.merge(part.with_prefix(name));
  checkpoint::save(sd, dir);
}

// FSDP(model, device_mesh=..., use_orig_params=True, auto_wrap_policy=always_wrap_policy).
std::shared_ptr<FSDP> fsdp1_always_wrap(nn::ModulePtr model, const std::optional<DeviceMesh>& device_mesh = {}) {
  fsdp1::FSDPOptions options;
  options.device_mesh = device_mesh;
  options.use_orig_params = true;
  options.auto_wrap_policy = fsdp1::always_wrap_policy();
  return FSDP::make(std::move(model), options);
}

// dcp.load({model_key: get_model_state_dict(model), optim_key: get_optimizer_state_dict(model,
// optim)}, checkpoint_id=dir) (only those keys), then model.load_state_dict / optim.load_state_dict
// (set_model_state_dict / set_optimizer_state_dict, see the header).
void load_from(nn::Module& model, torch::optim::Optimizer& optim, const std::string& dir, const std::string& model_key,
               const std::string& optim_key) {
  auto [msd, osd] = checkpoint::get_state_dict(model, optim);
  StateDict state_dict = msd.with_prefix(model_key);
  state_dict.merge(osd.with_prefix(optim_key));
  checkpoint::load(state_dict, dir);
  checkpoint::set_model_state_dict(model, state_dict.sub(model_key));
  checkpoint::set_optimizer_state_dict(model, optim, state_dict.sub(optim_key));
}

// ---------------------------------------------------------------- test_1d_fsdp_get_model_state_dict

void _test_1d_fsdp_get_model_state_dict(int64_t mlp_dim) {
  nn::ModulePtr base_model = _get_base_model(mlp_dim);
  nn::ModulePtr model1 = base_model->deep_copy();
  shard_children_and_root(*model1);
  StateDict osd = checkpoint::module_state_dict(*model1);
  StateDict dsd = checkpoint::get_model_state_dict(*model1);
  ASSERT_TRUE(state_dicts_equal(osd, dsd));

  // Parameters stay unsharded after a forward without resharding: the state dicts still present
  // the sharded DTensors.
  nn::ModulePtr model2 = base_model->deep_copy();
  shard_children_and_root(*model2, {.reshard_after_forward = false});
  (*model2)(randn_on_every_rank({2, mlp_dim}));
  StateDict osd2 = checkpoint::module_state_dict(*model2);
  StateDict dsd2 = checkpoint::get_model_state_dict(*model2);
  ASSERT_TRUE(state_dicts_equal(osd2, dsd2));
  for (const auto& [key, value] : dsd2) {
    if (std::holds_alternative<tensor::DTensor>(value)) {
      EXPECT_EQ(tensor::to_string(std::get<tensor::DTensor>(value).placements()), "(Shard(0))") << key;
    }
  }
}

TDC_DIST_TEST(TestFullyShardWithDistributedStateDict, test_1d_fsdp_get_model_state_dict, .world_size = kWorld) {
  TDC_REQUIRE_CAPABILITY("fsdp2");
  TDC_REQUIRE_CAPABILITY("checkpoint");
  conformance::world();
  harness::subtests(Axis<int64_t>("mlp_dim", {2, 3, 4, 5}), _test_1d_fsdp_get_model_state_dict);
}

// ---------------------------------------------------------------- test_1d_fsdp_cpu_offload_full_model_state_dict

TDC_DIST_TEST(TestFullyShardWithDistributedStateDict, test_1d_fsdp_cpu_offload_full_model_state_dict,
              .world_size = kWorld) {
  TDC_REQUIRE_CAPABILITY("fsdp2");
  TDC_REQUIRE_CAPABILITY("checkpoint");
  conformance::world();
  nn::ModulePtr orig_model = _get_base_model();
  nn::ModulePtr fsdp_model = orig_model->deep_copy();
  shard_children_and_root(*fsdp_model);
  StateDict osd = checkpoint::module_state_dict(*orig_model);
  StateDict dsd = checkpoint::get_model_state_dict(*fsdp_model, kFullOffload);
  if (ctx().rank == 0) {
    ASSERT_TRUE(state_dicts_equal(osd, dsd));
    // As PyTorch: the CPU check is on the unsharded model's dict; the full dict is checked too.
    for (const auto& [key, value] : osd) EXPECT_TRUE(checkpoint::local_tensor(value).is_cpu()) << key;
    for (const auto& [key, value] : dsd) EXPECT_TRUE(checkpoint::local_tensor(value).is_cpu()) << key;
  } else {
    EXPECT_TRUE(dsd.empty());
  }
}

// ---------------------------------------------------------------- test_save_with_fsdp1_and_load_with_fsdp2

void _test_save_with_fsdp1_and_load_with_fsdp2(const std::string& state_dict_type) {
  const std::string temp_dir = ctx().temp_dir.string() + "/" + state_dict_type;
  const fsdp1::StateDictType type = state_dict_type == "FULL_STATE_DICT" ? fsdp1::StateDictType::FULL_STATE_DICT
                                                                         : fsdp1::StateDictType::SHARDED_STATE_DICT;
  // Save state dict with model wrapped with FSDP1.
  nn::ModulePtr base_model = _get_base_model();
  base_model->to(fixtures::device());
  auto fsdp1_model = fsdp1_always_wrap(base_model);
  torch::optim::AdamW fsdp1_optim(fsdp1_model->params(), torch::optim::AdamWOptions(0.1));
  train_step(*fsdp1_model, fsdp1_optim, randn_on_every_rank({2}));
  {
    auto guard = FSDP::state_dict_type(*fsdp1_model, type);
    // FSDP.sharded_optim_state_dict(model, optim) is checkpoint::fsdp1_sharded_optim_state_dict in
    // tdc, beside the state-dict API it calls (docs/decisions.md, libtdc's layering).
    dcp_save({{"model", fsdp1_model->state_dict()},
              {"optim", checkpoint::fsdp1_sharded_optim_state_dict(*fsdp1_model, fsdp1_optim)}},
             temp_dir);
  }
  auto [fsdp1_full_msd, fsdp1_full_osd] = checkpoint::get_state_dict(*fsdp1_model, fsdp1_optim, kFullOffload);

  // Load state dict into model with FSDP2 applied.
  nn::ModulePtr fsdp2_model = _get_base_model();
  shard_children_and_root(*fsdp2_model);
  torch::optim::AdamW fsdp2_optim(fsdp2_model->params(), torch::optim::AdamWOptions(0.1));
  load_from(*fsdp2_model, fsdp2_optim, temp_dir, "model", "optim");
  auto [fsdp2_full_msd, fsdp2_full_osd] = checkpoint::get_state_dict(*fsdp2_model, fsdp2_optim, kFullOffload);

  // Compare full state dict to make sure they are the same.
  ASSERT_TRUE(state_dicts_equal(fsdp2_full_msd, fsdp1_full_msd));
  ASSERT_TRUE(state_dicts_equal(fsdp1_full_osd, fsdp2_full_osd));
}

TDC_DIST_TEST(TestFullyShardWithDistributedStateDict, test_save_with_fsdp1_and_load_with_fsdp2, .world_size = kWorld,
              .timeout_s = 120) {
  TDC_REQUIRE_CAPABILITY("fsdp1");
  TDC_REQUIRE_CAPABILITY("fsdp2");
  TDC_REQUIRE_CAPABILITY("checkpoint");
  conformance::world();
  harness::subtests(Axis<std::string>("state_dict_type", {"FULL_STATE_DICT", "SHARDED_STATE_DICT"}),
                    _test_save_with_fsdp1_and_load_with_fsdp2);
}

// ---------------------------------------------------------------- test_save_with_fsdp1_and_load_with_fsdp2_tp

// FSDP1 given the whole 2-D mesh and no hybrid strategy shards over mesh dim 0, as PyTorch (Part
// F.11; fully_sharded_data_parallel.h, [Note: FSDP1 sharded state-dict layout]).
TDC_DIST_TEST(TestFullyShardWithDistributedStateDict, test_save_with_fsdp1_and_load_with_fsdp2_tp, .world_size = kWorld,
              .timeout_s = 120) {
  TDC_REQUIRE_CAPABILITY("fsdp1");
  TDC_REQUIRE_CAPABILITY("fsdp2");
  TDC_REQUIRE_CAPABILITY("tp");
  TDC_REQUIRE_CAPABILITY("checkpoint");
  conformance::world();
  const std::string temp_dir = ctx().temp_dir.string() + "/ckpt";
  DeviceMesh global_mesh = init_device_mesh(fixtures::device_type(), {2, ctx().world_size / 2}, {"dp", "tp"});
  DeviceMesh dp_mesh = global_mesh["dp"], tp_mesh = global_mesh["tp"];

  // The original model and FSDP1 over a copy of it, one step each.
  nn::ModulePtr base_model = mlp_x3(2);
  base_model->to(fixtures::device());
  torch::optim::AdamW base_optim(base_model->params(), torch::optim::AdamWOptions(0.1));
  auto fsdp1_model = fsdp1_always_wrap(base_model->deep_copy(), global_mesh);
  torch::optim::AdamW fsdp1_optim(fsdp1_model->params(), torch::optim::AdamWOptions(0.1));
  const at::Tensor inp = randn_on_every_rank({2});
  train_step(*base_model, base_optim, inp);
  train_step(*fsdp1_model, fsdp1_optim, inp);

  auto [base_msd, base_osd] = checkpoint::get_state_dict(*base_model, base_optim, kFullOffload);
  auto [fsdp1_msd, fsdp1_osd] = checkpoint::get_state_dict(*fsdp1_model, fsdp1_optim, {.full_state_dict = false});
  dcp_save(
      {{"model_full", base_msd}, {"optim_full", base_osd}, {"model_sharded", fsdp1_msd}, {"optim_sharded", fsdp1_osd}},
      temp_dir);

  // FSDP2 + TP on the 2-D mesh, loaded from each source in turn.
  nn::ModulePtr fsdp2_tp_model = mlp_x3(2);
  fsdp2_tp_model->to(fixtures::device());
  tp::parallelize_module(*fsdp2_tp_model, tp_mesh, mlp_tp_plan());
  shard_children_and_root(*fsdp2_tp_model, {.mesh = dp_mesh});
  torch::optim::AdamW fsdp2_tp_optim(fsdp2_tp_model->params(), torch::optim::AdamWOptions(0.1));
  for (const std::string src : {"full", "sharded"}) {
    SCOPED_TRACE("src_state_dict_type=" + src);
    load_from(*fsdp2_tp_model, fsdp2_tp_optim, temp_dir, "model_" + src, "optim_" + src);
    auto [fsdp2_tp_full_msd, fsdp2_tp_full_osd] =
        checkpoint::get_state_dict(*fsdp2_tp_model, fsdp2_tp_optim, kFullOffload);
    ASSERT_TRUE(state_dicts_equal(base_msd, fsdp2_tp_full_msd));
    ASSERT_TRUE(state_dicts_equal(base_osd, fsdp2_tp_full_osd));
  }
}

// ---------------------------------------------------------------- test_save_with_tp_and_load_with_fsdp2_tp

TDC_DIST_TEST(TestFullyShardWithDistributedStateDict, test_save_with_tp_and_load_with_fsdp2_tp, .world_size = kWorld,
              .timeout_s = 120) {
  TDC_REQUIRE_CAPABILITY("fsdp2");
  TDC_REQUIRE_CAPABILITY("tp");
  TDC_REQUIRE_CAPABILITY("checkpoint");
  conformance::world();
  const std::string temp_dir = ctx().temp_dir.string();
  const tp::ParallelizePlan tp_parallelize_plan = mlp_tp_plan();
  DeviceMesh global_mesh_1d = init_device_mesh(fixtures::device_type(), {ctx().world_size}, {"tp"});
  DeviceMesh global_mesh_2d = init_device_mesh(fixtures::device_type(), {2, ctx().world_size / 2}, {"dp", "tp"});

  // Base model and the TP model, one step each.
  nn::ModulePtr base_model = mlp_x3(2);
  base_model->to(fixtures::device());
  torch::optim::AdamW base_optim(base_model->params(), torch::optim::AdamWOptions(0.1));
  nn::ModulePtr tp_model = base_model->deep_copy();
  tp::parallelize_module(*tp_model, global_mesh_1d, tp_parallelize_plan);
  torch::optim::AdamW tp_optim(tp_model->params(), torch::optim::AdamWOptions(0.1));
  const at::Tensor inp = randn_on_every_rank({2});
  train_step(*base_model, base_optim, inp);
  train_step(*tp_model, tp_optim, inp);

  auto [base_msd, base_osd] = checkpoint::get_state_dict(*base_model, base_optim, kFullOffload);
  auto [tp_msd, tp_osd] = checkpoint::get_state_dict(*tp_model, tp_optim);
  dcp_save({{"model_full", base_msd}, {"optim_full", base_osd}, {"model_sharded", tp_msd}, {"optim_sharded", tp_osd}},
           temp_dir + "/ckpt");

  // Load each into FSDP2 + TP on the 2-D mesh.
  for (const std::string src : {"full", "sharded"}) {
    SCOPED_TRACE("src=" + src);
    const std::string msd_name = "model_" + src, osd_name = "optim_" + src;
    nn::ModulePtr fsdp2_tp_model = mlp_x3(2);
    fsdp2_tp_model->to(fixtures::device());
    tp::parallelize_module(*fsdp2_tp_model, global_mesh_2d["tp"], tp_parallelize_plan);
    shard_children_and_root(*fsdp2_tp_model, {.mesh = global_mesh_2d["dp"]});
    torch::optim::AdamW fsdp2_tp_optim(fsdp2_tp_model->params(), torch::optim::AdamWOptions(0.1));
    load_from(*fsdp2_tp_model, fsdp2_tp_optim, temp_dir + "/ckpt", msd_name, osd_name);
    auto [fsdp2_tp_full_msd, fsdp2_tp_full_osd] =
        checkpoint::get_state_dict(*fsdp2_tp_model, fsdp2_tp_optim, kFullOffload);
    ASSERT_TRUE(state_dicts_equal(base_msd, fsdp2_tp_full_msd));
    ASSERT_TRUE(state_dicts_equal(base_osd, fsdp2_tp_full_osd));
  }
}

// ---------------------------------------------------------------- test_save_with_fsdp2_tp_and_load_with_tp

void _test_save_with_fsdp2_tp_and_load_with_tp(bool allow_implicit_replication) {
  const std::string temp_dir = ctx().temp_dir.string() + (allow_implicit_replication ? "/implicit" : "/explicit");
  const int64_t mlp_dim = 5;
  // Uneven sharding needs DTensor outputs (upstream issue 150336). With implicit replication the
  // plan leaves MLP 0 out: its parameters stay plain tensors under TP (PyTorch's
  // implicit_replication(): tdc's DTensor is not a tensor subclass, so plain and distributed
  // parameters mix without a context).
  const tp::ParallelizePlan tp_parallelize_plan =
      mlp_tp_plan(/*use_local_output=*/false, allow_implicit_replication ? 1 : 0);
  DeviceMesh global_mesh_1d = init_device_mesh(fixtures::device_type(), {ctx().world_size}, {"tp"});
  DeviceMesh global_mesh_2d = init_device_mesh(fixtures::device_type(), {2, ctx().world_size / 2}, {"dp", "tp"});

  for (bool save_full_state_dict : {true, false}) {
    SCOPED_TRACE("save_full_state_dict=" + std::to_string(save_full_state_dict));
    // Save a checkpoint from FSDP2 + TP.
    nn::ModulePtr base_model = mlp_x3(mlp_dim, 1);
    base_model->to(fixtures::device());
    torch::optim::AdamW base_optim(base_model->params(), torch::optim::AdamWOptions(0.1));
    nn::ModulePtr fsdp2_tp_model = base_model->deep_copy();
    tp::parallelize_module(*fsdp2_tp_model, global_mesh_2d["tp"], tp_parallelize_plan);
    shard_children_and_root(*fsdp2_tp_model, {.mesh = global_mesh_2d["dp"]});
    torch::optim::AdamW fsdp2_tp_optim(fsdp2_tp_model->params(), torch::optim::AdamWOptions(0.1));
    const at::Tensor inp = randn_on_every_rank({mlp_dim});
    train_step(*base_model, base_optim, inp);
    train_step(*fsdp2_tp_model, fsdp2_tp_optim, inp);

    auto [base_msd, base_osd] = checkpoint::get_state_dict(*base_model, base_optim, kFullOffload);
    auto [fsdp2_tp_msd, fsdp2_tp_osd] =
        checkpoint::get_state_dict(*fsdp2_tp_model, fsdp2_tp_optim, {.full_state_dict = save_full_state_dict});
    dcp_save({{"model", fsdp2_tp_msd}, {"optim", fsdp2_tp_osd}}, temp_dir);
    auto [fsdp2_tp_full_msd, fsdp2_tp_full_osd] =
        checkpoint::get_state_dict(*fsdp2_tp_model, fsdp2_tp_optim, kFullOffload);

    // Load it into TP on the 1-D mesh.
    nn::ModulePtr tp_model = mlp_x3(mlp_dim, 1);
    tp_model->to(fixtures::device());
    tp::parallelize_module(*tp_model, global_mesh_1d, tp_parallelize_plan);
    torch::optim::AdamW tp_optim(tp_model->params(), torch::optim::AdamWOptions(0.1));
    load_from(*tp_model, tp_optim, temp_dir, "model", "optim");
    auto [tp_full_msd, tp_full_osd] = checkpoint::get_state_dict(*tp_model, tp_optim, kFullOffload);

    // Compare the base model with the TP model, and FSDP2 + TP with TP.
    ASSERT_TRUE(state_dicts_equal(base_msd, tp_full_msd));
    ASSERT_TRUE(state_dicts_equal(base_osd, tp_full_osd));
    ASSERT_TRUE(state_dicts_equal(fsdp2_tp_full_msd, tp_full_msd));
    ASSERT_TRUE(state_dicts_equal(fsdp2_tp_full_osd, tp_full_osd));
  }
}

TDC_DIST_TEST(TestFullyShardWithDistributedStateDict, test_save_with_fsdp2_tp_and_load_with_tp, .world_size = kWorld,
              .timeout_s = 120) {
  TDC_REQUIRE_CAPABILITY("fsdp2");
  TDC_REQUIRE_CAPABILITY("tp");
  TDC_REQUIRE_CAPABILITY("checkpoint");
  conformance::world();
  harness::subtests(Axis<bool>("allow_implicit_replication", {true, false}), _test_save_with_fsdp2_tp_and_load_with_tp);
}

}  // namespace
