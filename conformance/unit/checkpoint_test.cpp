// Unit tests of tdc::checkpoint: state dicts (FQNs, kinds, full / cpu_offload, strict checks,
// all-or-nothing set), optimizer state dicts, save/load round trips with resharding (TP x FSDP2
// -> FSDP2 -> plain, world 4 -> world 1), the manifest's JSON values, atomic save under crashes
// at every step, bad checkpoints refused with a message naming the file, key and value, and state
// dicts as bytes (to_bytes / from_bytes: torch.save(sd, BytesIO) / torch.load).
#include <sys/wait.h>
#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "tdc/checkpoint/checkpoint.h"
#include "tdc/checkpoint/errors.h"
#include "tdc/checkpoint/serialize.h"
#include "tdc/state_dict/state_dict.h"
#include "tdc/comm/collectives.h"
#include "tdc/conformance/checks.h"
#include "tdc/conformance/support.h"
#include "tdc/ddp/ddp.h"
#include "tdc/device_mesh.h"
#include "tdc/fixtures/models.h"
#include "tdc/fsdp/fully_shard.h"
#include "tdc/harness/harness.h"
#include "tdc/nn/layers.h"
#include "tdc/tp/parallelize.h"

namespace {

using tdc::conformance::assert_close;
using tdc::conformance::Tolerance;

using namespace tdc;
using checkpoint::StateDict;
using checkpoint::StateDictOptions;
using harness::ctx;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

using conformance::error_of;

// test_fsdp_dsd's base model: Sequential(MLP(d), Sequential(MLP(d), Linear(d, d)), MLP(d)), the
// first MLP with a buffer.
nn::ModulePtr base_model(int64_t d = 6) {
  auto inner = std::make_shared<nn::Sequential>(
      std::vector<nn::ModulePtr>{std::make_shared<fixtures::MLP>(d), std::make_shared<nn::Linear>(d, d)});
  return std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<fixtures::MLP>(d, true, /*with_buffer=*/true), inner, std::make_shared<fixtures::MLP>(d)});
}

void fully_shard_children(nn::Module& model, const DeviceMesh& mesh) {
  for (auto& [name, child] : model.named_children_tdc()) fsdp::fully_shard(*child, {.mesh = mesh});
  fsdp::fully_shard(model, {.mesh = mesh});
}

// TP on the "tp" dim (in_proj Colwise, out_proj Rowwise for every MLP), then FSDP2 on "dp".
void tp_fsdp(nn::Module& model, const DeviceMesh& mesh2d) {
  tp::ParallelizePlan plan;
  for (const char* mlp : {"0", "1.0", "2"}) {
    plan.emplace_back(std::string(mlp) + ".in_proj", tp::ColwiseParallel{});
    plan.emplace_back(std::string(mlp) + ".out_proj", tp::RowwiseParallel{});
  }
  tp::parallelize_module(model, mesh2d["tp"], plan);
  fully_shard_children(model, mesh2d["dp"]);
}

// Same inputs on every rank, one Adam step.
void train_step(nn::Module& model, torch::optim::Optimizer& optim, uint64_t seed, int64_t d = 6) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor loss = model(at::randn({2, d}, gen)).sum();
  loss.backward();
  optim.step();
  optim.zero_grad();
}

std::string temp(const std::string& name) { return (ctx().temp_dir / name).string(); }

void expect_same(const StateDict& a, const StateDict& b) {
  ASSERT_EQ(a.keys(), b.keys());
  for (const auto& key : a.keys()) {
    if (std::holds_alternative<nlohmann::json>(a.at(key))) {
      EXPECT_EQ(std::get<nlohmann::json>(a.at(key)), std::get<nlohmann::json>(b.at(key))) << key;
      continue;
    }
    EXPECT_TRUE(assert_close(checkpoint::as_tensor(a, key), checkpoint::as_tensor(b, key), Tolerance{0, 0})) << key;
  }
}

// Full state dicts (model, and optimizer prefixed "optim.") on every rank.
StateDict full_state(nn::Module& model, torch::optim::Optimizer* optim) {
  StateDict sd = checkpoint::get_model_state_dict(model, {.full_state_dict = true});
  if (optim)
    sd.merge(checkpoint::get_optimizer_state_dict(model, *optim, {.full_state_dict = true}).with_prefix("optim"));
  return sd;
}

// ------------------------------------------------------------------ StateDict

TDC_DIST_TEST(StateDictTest, NestingAndAccessors, .world_size = 1) {
  StateDict sd;
  sd.set("a", at::ones({2}));
  sd.set("b", nlohmann::json{{"lr", 0.1}});
  StateDict nested = sd.with_prefix("model");
  EXPECT_EQ(nested.keys(), (std::vector<std::string>{"model.a", "model.b"}));
  EXPECT_EQ(nested.sub("model").keys(), sd.keys());
  EXPECT_TRUE(checkpoint::as_tensor(nested, "model.a").is_same(checkpoint::as_tensor(sd, "a")));
  EXPECT_THAT(error_of([&] { sd.merge(sd); }), HasSubstr("key 'a' is in both"));
  EXPECT_THAT(error_of([&] { checkpoint::as_dtensor(sd, "a"); }), HasSubstr("'a' holds a tensor, not a DTensor"));
  EXPECT_THAT(error_of([&] { sd.at("nope"); }), HasSubstr("no key 'nope'"));
}

// ------------------------------------------------------------------ model state dicts

TDC_DIST_TEST(StateDictTest, FsdpEntriesAreDTensorsWithPyTorchFqns, .world_size = 2) {
  conformance::world();
  at::manual_seed(0);
  auto model = base_model();
  auto plain = model->deep_copy();
  fully_shard_children(*model, init_device_mesh("cpu", {2}));
  StateDict sd = checkpoint::get_model_state_dict(*model);
  EXPECT_EQ(sd.keys(), checkpoint::get_model_state_dict(*plain).keys());
  EXPECT_TRUE(sd.contains("0.buffer"));
  const auto& w = checkpoint::as_dtensor(sd, "0.in_proj.weight");
  EXPECT_EQ(tensor::to_string(w.placements()), "(Shard(0))");
  EXPECT_EQ(w.shape(), (std::vector<int64_t>{24, 6}));
  // The local tensor is the parameter itself: writing the state dict writes the model.
  EXPECT_TRUE(w.to_local().is_alias_of(model->named_params()[0].second));
  // Full: every rank gets the whole tensors, equal to the unsharded copy.
  expect_same(checkpoint::get_model_state_dict(*model, {.full_state_dict = true}),
              checkpoint::get_model_state_dict(*plain));
  // cpu_offload: only rank 0.
  StateDict offloaded = checkpoint::get_model_state_dict(*model, {.full_state_dict = true, .cpu_offload = true});
  EXPECT_EQ(offloaded.empty(), ctx().rank != 0);
}

TDC_DIST_TEST(StateDictTest, DdpPrefixIsDropped, .world_size = 2) {
  auto group = conformance::world();
  at::manual_seed(0);
  auto ddp = std::make_shared<ddp::DistributedDataParallel>(base_model(), group);
  EXPECT_EQ(checkpoint::module_state_dict(*ddp).keys().front(), "module.0.in_proj.weight");
  StateDict sd = checkpoint::get_model_state_dict(*ddp);
  EXPECT_EQ(sd.keys().front(), "0.in_proj.weight");
  EXPECT_EQ(sd.keys(), checkpoint::get_model_state_dict(ddp->module()).keys());
  checkpoint::set_model_state_dict(*ddp, sd);  // round trip through the cleaned FQNs
}

TDC_DIST_TEST(StateDictTest, SetNamesEveryBadKeyAndChangesNothing, .world_size = 2) {
  conformance::world();
  at::manual_seed(0);
  auto model = base_model();
  fully_shard_children(*model, init_device_mesh("cpu", {2}));
  const StateDict before = checkpoint::get_model_state_dict(*model, {.full_state_dict = true});
  StateDict sd = checkpoint::get_model_state_dict(*model, {.full_state_dict = true});
  for (auto& [key, value] : sd) value = at::zeros_like(std::get<at::Tensor>(value));
  sd.erase("2.out_proj.bias");
  sd.set("2.extra", at::zeros({1}));
  sd.set("0.in_proj.bias", at::zeros({23}));
  const std::string err = error_of([&] { checkpoint::set_model_state_dict(*model, sd, {.full_state_dict = true}); });
  EXPECT_THAT(err, HasSubstr("missing keys: 2.out_proj.bias"));
  EXPECT_THAT(err, HasSubstr("unexpected keys: 2.extra"));
  EXPECT_THAT(err, HasSubstr("'0.in_proj.bias': shape [23] in the state dict, [24] in the target"));
  sd.set("0.in_proj.bias", at::zeros({24}, at::kDouble));
  EXPECT_THAT(error_of([&] { checkpoint::set_model_state_dict(*model, sd, {.strict = false}); }),
              HasSubstr("'0.in_proj.bias': dtype torch.float64 in the state dict, torch.float32 in the target"));
  expect_same(checkpoint::get_model_state_dict(*model, {.full_state_dict = true}), before);
  // Not strict: the present keys are set, the missing one keeps its value.
  sd.erase("2.extra");
  sd.set("0.in_proj.bias", at::zeros({24}));
  checkpoint::set_model_state_dict(*model, sd, {.strict = false});
  StateDict after = checkpoint::get_model_state_dict(*model, {.full_state_dict = true});
  EXPECT_EQ(checkpoint::as_tensor(after, "0.in_proj.weight").abs().sum().item<double>(), 0.0);
  EXPECT_TRUE(assert_close(checkpoint::as_tensor(after, "2.out_proj.bias"),
                           checkpoint::as_tensor(before, "2.out_proj.bias"), Tolerance{0, 0}));
}

TDC_DIST_TEST(StateDictTest, BroadcastFromRank0SetsEveryRanksShard, .world_size = 4) {
  conformance::world();
  at::manual_seed(0);
  auto model = base_model();
  auto source = model->deep_copy();
  for (auto& p : source->params()) p.data().normal_();
  tp_fsdp(*model, init_device_mesh("cpu", {2, 2}, {"dp", "tp"}));
  StateDict full = ctx().rank == 0 ? checkpoint::get_model_state_dict(*source) : StateDict{};
  checkpoint::set_model_state_dict(*model, full, {.full_state_dict = true, .broadcast_from_rank0 = true});
  expect_same(checkpoint::get_model_state_dict(*model, {.full_state_dict = true}),
              checkpoint::get_model_state_dict(*source));
}

// ------------------------------------------------------------------ optimizer state dicts

TDC_DIST_TEST(StateDictTest, OptimizerStateKeyedByFqn, .world_size = 2) {
  conformance::world();
  at::manual_seed(0);
  auto model = base_model();
  fully_shard_children(*model, init_device_mesh("cpu", {2}));
  torch::optim::Adam optim(model->params(), torch::optim::AdamOptions(0.01));
  // Empty state is initialised as PyTorch does (a step with lr 0): every key exists, values stay.
  const StateDict before = checkpoint::get_model_state_dict(*model, {.full_state_dict = true});
  StateDict osd = checkpoint::get_optimizer_state_dict(*model, optim);
  expect_same(checkpoint::get_model_state_dict(*model, {.full_state_dict = true}), before);
  {
    // The lr-0 step matters where zero gradients still move a parameter: AdamW's decoupled weight
    // decay (default 1e-2) would scale every parameter by 1 - lr * weight_decay.
    SCOPED_TRACE("AdamW");
    torch::optim::AdamW adamw(model->params(), torch::optim::AdamWOptions(0.01));
    EXPECT_TRUE(checkpoint::get_optimizer_state_dict(*model, adamw).contains("state.0.in_proj.weight.exp_avg"));
    expect_same(checkpoint::get_model_state_dict(*model, {.full_state_dict = true}), before);
  }
  EXPECT_TRUE(osd.contains("state.0.in_proj.weight.exp_avg"));
  EXPECT_EQ(checkpoint::as_tensor(osd, "state.0.in_proj.weight.step").dim(), 0);
  EXPECT_EQ(tensor::to_string(checkpoint::as_dtensor(osd, "state.0.in_proj.weight.exp_avg_sq").placements()),
            "(Shard(0))");
  const auto& groups = std::get<nlohmann::json>(osd.at("param_groups"));
  EXPECT_EQ(groups[0]["lr"].get<double>(), 0.01);
  EXPECT_EQ(groups[0]["params"][0], "0.in_proj.weight");
  // A round trip restores the steps and the moments: the next step is the same on both.
  train_step(*model, optim, 1);
  train_step(*model, optim, 2);
  auto [msd, osd2] = checkpoint::get_state_dict(*model, optim);
  at::manual_seed(1);
  auto other = base_model();
  fully_shard_children(*other, init_device_mesh("cpu", {2}));
  torch::optim::Adam other_optim(other->params(), torch::optim::AdamOptions(0.5));
  checkpoint::set_state_dict(*other, other_optim, checkpoint::get_model_state_dict(*model, {.full_state_dict = true}),
                             checkpoint::get_optimizer_state_dict(*model, optim, {.full_state_dict = true}),
                             {.full_state_dict = true});
  EXPECT_EQ(
      std::get<nlohmann::json>(checkpoint::get_optimizer_state_dict(*other, other_optim).at("param_groups"))[0]["lr"],
      0.01);
  train_step(*model, optim, 3);
  train_step(*other, other_optim, 3);
  expect_same(full_state(*other, &other_optim), full_state(*model, &optim));
}

TDC_DIST_TEST(StateDictTest, OptimizerStateForOtherParametersIsRefused, .world_size = 1) {
  auto model = base_model();
  auto other = base_model();
  torch::optim::SGD optim(other->params(), torch::optim::SGDOptions(0.1).momentum(0.9));
  EXPECT_THAT(error_of([&] { checkpoint::get_optimizer_state_dict(*model, optim); }),
              HasSubstr("is not a parameter of the model"));
  torch::optim::SGD mine(model->params(), torch::optim::SGDOptions(0.1).momentum(0.9));
  StateDict osd = checkpoint::get_optimizer_state_dict(*model, mine);
  EXPECT_TRUE(osd.contains("state.0.in_proj.weight.momentum_buffer"));
  osd.set("state.9.weight.momentum_buffer", at::zeros({1}));
  EXPECT_THAT(error_of([&] { checkpoint::set_optimizer_state_dict(*model, mine, osd); }),
              HasSubstr("unexpected keys: state.9.weight.momentum_buffer"));
}

// ------------------------------------------------------------------ save / load

// TP x FSDP2 on 4 ranks saves; loads into FSDP2 on the same 4 ranks (another mesh, other Shard
// dims) and into a plain model on each rank alone (world 1): values bit-exact.
TDC_DIST_TEST(CheckpointTest, SaveTpFsdpLoadFsdpAndPlain, .world_size = 4, .timeout_s = 120) {
  auto world = conformance::world();
  at::manual_seed(0);
  auto model = base_model();
  tp_fsdp(*model, init_device_mesh("cpu", {2, 2}, {"dp", "tp"}));
  torch::optim::Adam optim(model->params(), torch::optim::AdamOptions(0.01));
  train_step(*model, optim, 7);
  auto [msd, osd] = checkpoint::get_state_dict(*model, optim);
  StateDict sd = msd.with_prefix("model");
  sd.merge(osd.with_prefix("optim"));
  const std::string dir = temp("ckpt");
  checkpoint::save(sd, dir);
  const StateDict expected = full_state(*model, &optim);

  at::manual_seed(1);
  auto fsdp_model = base_model();
  fully_shard_children(*fsdp_model, init_device_mesh("cpu", {4}));
  torch::optim::Adam fsdp_optim(fsdp_model->params(), torch::optim::AdamOptions(0.5));
  auto [fmsd, fosd] = checkpoint::get_state_dict(*fsdp_model, fsdp_optim);
  StateDict target = fmsd.with_prefix("model");
  target.merge(fosd.with_prefix("optim"));
  checkpoint::load(target, dir);
  checkpoint::set_optimizer_state_dict(*fsdp_model, fsdp_optim, target.sub("optim"));  // steps and param_groups
  expect_same(full_state(*fsdp_model, &fsdp_optim), expected);

  // World 1: each rank alone, a plain model.
  std::vector<comm::GroupPtr> selves;
  for (int r = 0; r < ctx().world_size; ++r) {
    if (r == ctx().rank) selves.push_back(comm::new_group({r}));
  }
  auto plain = base_model();
  StateDict plain_sd = checkpoint::get_model_state_dict(*plain).with_prefix("model");
  checkpoint::load(plain_sd, dir, {.group = selves.front(), .allow_partial_load = true});
  expect_same(checkpoint::get_model_state_dict(*plain),
              checkpoint::get_model_state_dict(*model, {.full_state_dict = true}));
}

// HSDP: (Replicate, Shard(0)) entries; the replicas over the first mesh dim are written once and
// load back into a 1-D FSDP2 model bit-exact.
TDC_DIST_TEST(CheckpointTest, HsdpSavesOneReplicaAndLoadsIntoFsdp, .world_size = 4, .timeout_s = 120) {
  conformance::world();
  at::manual_seed(0);
  auto model = base_model();
  auto plain = model->deep_copy();
  fully_shard_children(*model, init_device_mesh("cpu", {2, 2}, {"replicate", "shard"}));
  StateDict sd = checkpoint::get_model_state_dict(*model);
  EXPECT_EQ(tensor::to_string(checkpoint::as_dtensor(sd, "0.in_proj.weight").placements()), "(Replicate(), Shard(0))");
  const std::string dir = temp("ckpt");
  checkpoint::save(sd, dir);
  // Each element once: the files' data sections add up to the model's bytes (not twice that).
  int64_t data_bytes = 0, model_bytes = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    uint64_t header = 0;
    std::ifstream(e.path(), std::ios::binary).read(reinterpret_cast<char*>(&header), 8);
    data_bytes += static_cast<int64_t>(fs::file_size(e.path()) - 8 - header);
  }
  for (const auto& [key, v] : checkpoint::get_model_state_dict(*plain))
    model_bytes += checkpoint::local_tensor(v).nbytes();
  EXPECT_EQ(data_bytes, model_bytes);
  at::manual_seed(1);
  auto other = base_model();
  fully_shard_children(*other, init_device_mesh("cpu", {4}));
  StateDict target = checkpoint::get_model_state_dict(*other);
  checkpoint::load(target, dir);
  expect_same(checkpoint::get_model_state_dict(*other, {.full_state_dict = true}),
              checkpoint::get_model_state_dict(*plain));
}

TDC_DIST_TEST(CheckpointTest, JsonValuesGoToTheManifest, .world_size = 2) {
  conformance::world();
  StateDict sd;
  sd.set("w", at::arange(6, at::kFloat));
  sd.set("extra", nlohmann::json{{"epoch", 3}, {"note", "x"}});
  const std::string dir = temp("ckpt");
  checkpoint::save(sd, dir);
  StateDict back;
  back.set("w", at::zeros({6}));
  back.set("extra", nlohmann::json());
  checkpoint::load(back, dir);
  EXPECT_EQ(std::get<nlohmann::json>(back.at("extra"))["epoch"], 3);
  EXPECT_TRUE(assert_close(checkpoint::as_tensor(back, "w"), at::arange(6, at::kFloat), Tolerance{0, 0}));
  // The replicated tensor was written once.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.path().extension() == ".safetensors";
  EXPECT_EQ(files, 1);
}

TDC_DIST_TEST(CheckpointTest, PartialDTensorIsRefused, .world_size = 2) {
  conformance::world();
  auto mesh = init_device_mesh("cpu", {2});
  StateDict sd;
  sd.set("p", tensor::from_local(at::ones({2}), mesh, {tensor::Partial{}}));
  EXPECT_THAT(error_of([&] { checkpoint::save(sd, temp("ckpt")); }), HasSubstr("'p': it is a Partial DTensor"));
  EXPECT_FALSE(fs::exists(temp("ckpt")));
}

// Replicas that differ would make the checkpoint's value depend on which rank wrote it.
TDC_DIST_TEST(CheckpointTest, ReplicasThatDifferAreRefused, .world_size = 2) {
  conformance::world();
  StateDict sd;
  sd.set("r", at::full({3}, static_cast<float>(ctx().rank)));
  EXPECT_THAT(error_of([&] { checkpoint::save(sd, temp("ckpt")); }),
              HasSubstr("'r': ranks 0 and 1 hold different values for its replicated part at [0] size [3]"));
  EXPECT_FALSE(fs::exists(temp("ckpt")));
}

// [Note: atomic save]: a save killed at any step leaves the old checkpoint or the new one.
TDC_DIST_TEST(CheckpointTest, CrashAtAnyStepLeavesOldOrNew, .world_size = 1, .timeout_s = 120) {
  const std::string dir = temp("ckpt");
  auto state = [](float v) {
    StateDict sd;
    sd.set("a", at::full({64}, v));
    sd.set("b", at::full({3, 5}, v));
    return sd;
  };
  checkpoint::save(state(1.0f), dir);
  for (const char* point : {"rank-files-written", "manifest-written", "before-swap", "after-swap"}) {
    SCOPED_TRACE(point);
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("TDC_CHECKPOINT_CRASH_AT", point, 1);
      try {
        checkpoint::save(state(2.0f), dir);
      } catch (...) {
      }
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 86) << "the crash point was not reached";
    StateDict back = state(0.0f);
    checkpoint::load(back, dir);
    const float a = checkpoint::as_tensor(back, "a")[0].item<float>();
    EXPECT_TRUE(a == 1.0f || a == 2.0f);
    EXPECT_TRUE(assert_close(checkpoint::as_tensor(back, "b"), at::full({3, 5}, a), Tolerance{0, 0}))
        << "a mix of two checkpoints";
    // Whatever staging directory the crash left is refused as a checkpoint.
    for (const auto& e : fs::directory_iterator(ctx().temp_dir)) {
      if (e.path().filename().string().find("tdc-staging") == std::string::npos) continue;
      StateDict s = state(0.0f);
      const std::string err = error_of([&] { checkpoint::load(s, e.path().string()); });
      EXPECT_TRUE(err.find("unfinished") != std::string::npos ||
                  err.find("holds no .safetensors") != std::string::npos || err.find("lacks") != std::string::npos ||
                  err.find("(no error)") != std::string::npos)
          << err;
      fs::remove_all(e.path());
    }
    checkpoint::save(state(1.0f), dir);  // and the next save works
  }
}

// Each bad checkpoint is refused with the file / key / value named, and the state dict is intact.
TDC_DIST_TEST(CheckpointTest, BadCheckpointsAreRefusedAndNothingIsLoaded, .world_size = 2) {
  conformance::world();
  auto mesh = init_device_mesh("cpu", {2});
  auto sharded = [&](float v) {
    StateDict sd;
    sd.set("w", tensor::distribute_tensor(at::full({5, 3}, v), mesh, {tensor::Shard{0}}));
    sd.set("b", at::full({4}, v));
    return sd;
  };
  const std::string dir = temp("ckpt");
  checkpoint::save(sharded(1.0f), dir);
  auto refused = [&](const std::string& d, StateDict target) {
    const StateDict before = sharded(0.0f);
    const std::string err = error_of([&] { checkpoint::load(target, d); });
    EXPECT_EQ(checkpoint::as_dtensor(target, "w").to_local().sum().item<float>(), 0.0f) << "half-loaded: " << err;
    return err;
  };
  // A dtype or shape the target does not have.
  StateDict wrong_dtype = sharded(0.0f);
  wrong_dtype.set("b", at::zeros({4}, at::kDouble));
  EXPECT_THAT(refused(dir, wrong_dtype), HasSubstr("'b' is F32 in the checkpoint but F64 in the state dict"));
  StateDict wrong_shape = sharded(0.0f);
  wrong_shape.set("b", at::zeros({5}));
  EXPECT_THAT(refused(dir, wrong_shape), HasSubstr("'b' has shape [4] in the checkpoint but [5] in the state dict"));
  StateDict extra_key = sharded(0.0f);
  extra_key.set("c", at::zeros({1}));
  EXPECT_THAT(refused(dir, extra_key), HasSubstr("lacks 1 key(s) of the state dict: c"));
  comm::barrier();
  // A shard file missing (the manifest lists it), then with no manifest either (PyTorch-style).
  const std::string rank1 = (fs::path(dir) / "shard-00002-model-00001-of-00001.safetensors").string();
  if (ctx().rank == 0) fs::rename(rank1, temp("aside"));
  comm::barrier();
  EXPECT_THAT(refused(dir, sharded(0.0f)), HasSubstr("lacks 'shard-00002-model-00001-of-00001.safetensors'"));
  comm::barrier();
  if (ctx().rank == 0) fs::rename(fs::path(dir) / "tdc-checkpoint.json", temp("manifest"));
  comm::barrier();
  EXPECT_THAT(refused(dir, sharded(0.0f)),
              HasSubstr("says the global shape is [5, 3], but the chunks reach [3, 3] (a missing chunk?)"));
  comm::barrier();
  // A stale file from another save next to a complete one.
  if (ctx().rank == 0) {
    fs::rename(temp("aside"), rank1);
    fs::rename(temp("manifest"), fs::path(dir) / "tdc-checkpoint.json");
    fs::copy_file(rank1, fs::path(dir) / "shard-00003-model-00001-of-00001.safetensors");
  }
  comm::barrier();
  EXPECT_THAT(refused(dir, sharded(0.0f)), HasSubstr("which its manifest does not list"));
  comm::barrier();
  // A directory holding something else is never overwritten by a save.
  if (ctx().rank == 0) {
    fs::create_directories(temp("mine"));
    std::ofstream(temp("mine") + "/notes.txt") << "keep me";
  }
  comm::barrier();
  EXPECT_THAT(error_of([&] { checkpoint::save(sharded(1.0f), temp("mine")); }),
              HasSubstr("holds 'notes.txt' and is not a tdc checkpoint"));
  EXPECT_TRUE(fs::exists(temp("mine") + "/notes.txt"));
  EXPECT_THAT(error_of([&] { checkpoint::save(sharded(1.0f), dir, {.replace_existing = false}); }),
              HasSubstr("already holds a checkpoint"));
}

// ------------------------------------------------------------------ to_bytes / from_bytes

// Entry by entry: same keys in the same order, same kinds; tensors of the same dtype, shape and
// values (fresh contiguous CPU tensors, sharing nothing with the input); DTensors with equal local
// tensors and specs (mesh, placements, global shape and stride, dtype); JSON values equal.
void expect_round_trip(const StateDict& in, const StateDict& out) {
  ASSERT_EQ(in.keys(), out.keys());
  for (const auto& [key, value] : in) {
    SCOPED_TRACE(key);
    const checkpoint::Value& back = out.at(key);
    ASSERT_EQ(value.index(), back.index()) << "the kind changed";
    if (const auto* j = std::get_if<nlohmann::json>(&value)) {
      EXPECT_EQ(*j, std::get<nlohmann::json>(back));
      continue;
    }
    const at::Tensor& a = checkpoint::local_tensor(value);
    const at::Tensor& b = checkpoint::local_tensor(back);
    EXPECT_EQ(a.scalar_type(), b.scalar_type());
    EXPECT_EQ(a.sizes(), b.sizes());
    EXPECT_TRUE(b.is_contiguous());
    EXPECT_TRUE(b.device().is_cpu());
    EXPECT_TRUE(assert_close(a, b, Tolerance{0, 0}));
    if (a.numel() > 0) {
      EXPECT_FALSE(a.is_alias_of(b)) << "from_bytes must return fresh tensors";
    }
    if (const auto* d = std::get_if<tensor::DTensor>(&value)) {
      const tensor::DTensor& e = std::get<tensor::DTensor>(back);
      EXPECT_TRUE(e.device_mesh() == d->device_mesh()) << e.device_mesh().to_string();
      EXPECT_EQ(e.placements(), d->placements()) << tensor::to_string(e.placements());
      EXPECT_EQ(e.shape(), d->shape());
      EXPECT_EQ(e.spec().stride, d->spec().stride);
      EXPECT_EQ(e.spec().dtype, d->spec().dtype);
    }
  }
}

// Deep copies (values, not handles), to show that to_bytes changes nothing.
StateDict deep_copy(const StateDict& sd) {
  StateDict out;
  for (const auto& [key, value] : sd) {
    if (const auto* t = std::get_if<at::Tensor>(&value))
      out.set(key, t->clone());
    else if (const auto* d = std::get_if<tensor::DTensor>(&value))
      out.set(key, tensor::DTensor(d->to_local().clone(), d->spec()));
    else
      out.set(key, value);
  }
  return out;
}

TDC_DIST_TEST(SerializeTest, PlainTensorsAndJsonRoundTrip, .world_size = 1) {
  StateDict sd;
  sd.set("w", at::arange(6, at::kFloat).reshape({2, 3}) / 3);
  sd.set("half", (at::arange(5, at::kFloat) / 7).to(at::kBFloat16));
  sd.set("ids", at::arange(4, at::kLong) * 1000000007LL - 3);
  sd.set("mask", at::tensor({1, 0, 1}, at::kLong).to(at::kBool));
  sd.set("f64", at::tensor({1e-300, -2.5, 1.0 / 3}, at::kDouble));
  sd.set("step", at::scalar_tensor(7.0, at::kFloat));  // 0-dim
  sd.set("empty", at::empty({0, 4}));
  const at::Tensor base = at::arange(12, at::kFloat).reshape({3, 4});
  sd.set("transposed", base.t());  // non-contiguous
  sd.set("param_groups", nlohmann::json::array({{{"lr", 0.01}, {"betas", {0.9, 0.999}}, {"params", {"w", "ids"}}}}));
  sd.set("note", nlohmann::json("épreuve"));
  const StateDict before = deep_copy(sd);

  const std::string bytes = checkpoint::to_bytes(sd);
  EXPECT_EQ(checkpoint::to_bytes(sd), bytes) << "to_bytes is deterministic";
  const StateDict back = checkpoint::from_bytes(bytes);
  expect_round_trip(sd, back);
  EXPECT_EQ(checkpoint::as_tensor(back, "step").dim(), 0);
  EXPECT_EQ(checkpoint::as_tensor(back, "transposed").sizes(), (at::IntArrayRef{4, 3}));
  // The input is unchanged: values, and the non-contiguous view is still a view of its base.
  expect_same(sd, before);
  EXPECT_FALSE(checkpoint::as_tensor(sd, "transposed").is_contiguous());
  EXPECT_TRUE(checkpoint::as_tensor(sd, "transposed").is_alias_of(base));
  // Bytes of bytes: the same again.
  EXPECT_EQ(checkpoint::to_bytes(back), bytes);
  // An empty state dict.
  EXPECT_TRUE(checkpoint::from_bytes(checkpoint::to_bytes(StateDict{})).empty());
}

TDC_DIST_TEST(SerializeTest, DTensorsRoundTripOnOneAndTwoDimMeshes, .world_size = 4) {
  conformance::world();
  const DeviceMesh mesh1 = init_device_mesh("cpu", {4});
  const DeviceMesh mesh2 = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  const at::Tensor rows = at::arange(5 * 3, at::kFloat).reshape({5, 3});  // 5 rows: uneven over 4 and 2
  const at::Tensor big = at::arange(7 * 6, at::kFloat).reshape({7, 6}) / 11;
  using tensor::Partial;
  using tensor::Replicate;
  using tensor::Shard;
  using tensor::StridedShard;
  StateDict sd;
  sd.set("rows", tensor::distribute_tensor(rows, mesh1, {Shard{0}}));  // rank 3's shard is empty
  sd.set("cols", tensor::distribute_tensor(big, mesh1, {Shard{1}}));
  sd.set("replicated", tensor::distribute_tensor(big.to(at::kBFloat16), mesh1, {Replicate{}}));
  sd.set("partial", tensor::from_local(at::full({2}, static_cast<float>(ctx().rank)), mesh1, {Partial{}}));
  sd.set("tp_fsdp", tensor::distribute_tensor(big, mesh2, {StridedShard{0, 2}, Shard{0}}));
  sd.set("dp_tp", tensor::distribute_tensor(big, mesh2, {Shard{0}, Shard{1}}));
  sd.set("hsdp", tensor::distribute_tensor(rows.to(at::kLong), mesh2, {Replicate{}, Shard{0}}));
  sd.set("tp_only", tensor::distribute_tensor(big, mesh2["tp"], {Shard{0}}));  // a slice's mesh
  sd.set("state.rows.step", at::scalar_tensor(1.0, at::kFloat));
  sd.set("param_groups", nlohmann::json::array({{{"lr", 0.1}, {"params", {"rows"}}}}));
  const StateDict before = deep_copy(sd);

  const StateDict back = checkpoint::from_bytes(checkpoint::to_bytes(sd), {mesh1, mesh2, mesh2["tp"]});
  expect_round_trip(sd, back);
  for (const auto& [key, value] : before) {
    if (const auto* d = std::get_if<tensor::DTensor>(&value)) {
      EXPECT_TRUE(assert_close(checkpoint::as_dtensor(sd, key).to_local(), d->to_local(), Tolerance{0, 0}))
          << key << " changed";
    }
  }
  // The loaded DTensors are usable: the full tensors are the originals.
  EXPECT_TRUE(assert_close(checkpoint::as_dtensor(back, "rows").full_tensor(), rows, Tolerance{0, 0}));
  EXPECT_TRUE(assert_close(checkpoint::as_dtensor(back, "tp_fsdp").full_tensor(), big, Tolerance{0, 0}));
  EXPECT_TRUE(assert_close(checkpoint::as_dtensor(back, "dp_tp").full_tensor(), big, Tolerance{0, 0}));
  EXPECT_TRUE(assert_close(checkpoint::as_dtensor(back, "tp_only").full_tensor(), big, Tolerance{0, 0}));
  EXPECT_TRUE(
      assert_close(checkpoint::as_dtensor(back, "partial").full_tensor(), at::full({2}, 6.0f), Tolerance{0, 0}));
  EXPECT_EQ(checkpoint::as_dtensor(back, "rows").to_local().size(0), ctx().rank < 2 ? 2 : ctx().rank == 2 ? 1 : 0);
}

TDC_DIST_TEST(SerializeTest, AMeshMatchingNoneIsNamedWithTheCandidates, .world_size = 4) {
  conformance::world();
  const DeviceMesh mesh1 = init_device_mesh("cpu", {4});
  const DeviceMesh mesh2 = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  const DeviceMesh other_names = init_device_mesh("cpu", {2, 2}, {"replicate", "shard"});
  StateDict sd;
  sd.set("b", at::ones({2}));
  sd.set("w", tensor::distribute_tensor(at::ones({4, 4}), mesh2, {tensor::Shard{0}, tensor::Replicate{}}));
  const std::string bytes = checkpoint::to_bytes(sd);
  const std::string recorded =
      "entry 1 ('w') was saved on DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp')), which matches "
      "none of the meshes given";
  EXPECT_THAT(error_of([&] { checkpoint::from_bytes(bytes); }), HasSubstr(recorded + " (none)"));
  EXPECT_THAT(
      error_of([&] {
        checkpoint::from_bytes(bytes, {mesh1, other_names});
      }),
      HasSubstr(recorded +
                " (DeviceMesh('cpu', [0, 1, 2, 3]); DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('replicate', "
                "'shard')))"));
  // Slices of the recorded mesh are other meshes.
  EXPECT_THAT(error_of([&] { checkpoint::from_bytes(bytes, {mesh2["dp"], mesh2["tp"]}); }), HasSubstr(recorded));
  EXPECT_NO_THROW(checkpoint::from_bytes(bytes, {mesh1, other_names, mesh2}));
  // What to_bytes cannot write: a clear error naming the key.
  StateDict odd;
  odd.set("z", at::ones({2}, at::kComplexDouble));
  EXPECT_THAT(error_of([&] { checkpoint::to_bytes(odd); }),
              HasSubstr("to_bytes: 'z': dtype ComplexDouble has no safetensors name"));
}

// A few bad byte strings, each refused with what is wrong (checkpoint_fuzz_test mutates many).
TDC_DIST_TEST(SerializeTest, BadBytesAreRefusedWithWhatIsWrong, .world_size = 1) {
  StateDict sd;
  sd.set("w", at::arange(4, at::kFloat));
  const std::string bytes = checkpoint::to_bytes(sd);
  using checkpoint::from_bytes;
  EXPECT_THAT(error_of([&] { from_bytes(bytes.substr(0, 5)); }), HasSubstr("from_bytes: 5 bytes are too few"));
  EXPECT_THAT(error_of([&] { from_bytes(bytes.substr(0, 20)); }), HasSubstr("but 12 bytes follow it"));
  EXPECT_THAT(error_of([&] { from_bytes(bytes.substr(0, bytes.size() - 1)); }),
              HasSubstr("the header says the data section holds 16 bytes, but 15 follow the header"));
  std::string flipped = bytes;
  flipped.back() = static_cast<char>(flipped.back() ^ 1);
  EXPECT_THAT(error_of([&] { from_bytes(flipped); }),
              HasSubstr("entry 0 ('w'): its 16 bytes do not match its checksum (corrupt data)"));
  std::string big_length = bytes;
  big_length[7] = 0x40;  // + 2^62
  uint64_t claimed = 0;
  std::memcpy(&claimed, big_length.data(), 8);
  EXPECT_THAT(error_of([&] { from_bytes(big_length); }),
              HasSubstr(fmt::format("the header length is {}, but {} bytes follow it", claimed, bytes.size() - 8)));
  std::string version = bytes;
  version.replace(version.find("\"version\":1"), 11, "\"version\":2");
  EXPECT_THAT(error_of([&] { from_bytes(version); }),
              HasSubstr("the header's version is 2; this reader knows version 1"));
  EXPECT_THAT(error_of([&] { from_bytes(std::string(8, '\0')); }), HasSubstr("the header is not valid JSON"));
  EXPECT_TRUE(assert_close(checkpoint::as_tensor(from_bytes(bytes), "w"), at::arange(4, at::kFloat), Tolerance{0, 0}));
}

}  // namespace
