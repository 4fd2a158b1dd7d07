// Unit tests of FSDP1's state dicts over 1-D and 2-D meshes (issue 15): the sharded layout of
// [Note: FSDP1 sharded state-dict layout] (placements as PyTorch 2.13 gives them, measured live),
// tdc::checkpoint's model and optimizer state dicts on FSDP1 models (values equal to an unwrapped
// model's, round trips, loads into FSDP2), FSDP1 over tensor parallel, and bad input.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <torch/optim/adam.h>

#include "tdc/checkpoint/checkpoint.h"
#include "tdc/checkpoint/errors.h"
#include "tdc/state_dict/state_dict.h"
#include "tdc/conformance/checks.h"
#include "tdc/conformance/state_dict_checks.h"
#include "tdc/conformance/support.h"
#include "tdc/device_mesh.h"
#include "tdc/fixtures/models.h"
#include "tdc/fsdp/fully_shard.h"
#include "tdc/fsdp1/fully_sharded_data_parallel.h"
#include "tdc/harness/harness.h"
#include "tdc/harness/subtests.h"
#include "tdc/nn/checkpoint.h"
#include "tdc/tp/parallelize.h"

namespace {

using tdc::conformance::assert_close;
using tdc::conformance::Tolerance;
using tdc::conformance::torch_allclose;

using namespace tdc;
using checkpoint::StateDict;
using fsdp1::FSDPOptions;
using fsdp1::FullyShardedDataParallel;
using fsdp1::StateDictType;
using tensor::Placements;
using tensor::Replicate;
using tensor::Shard;
using ::testing::HasSubstr;

DeviceMesh mesh_2d() { return init_device_mesh("cpu", {2, 2}, {"dp", "tp"}); }

// SimpleModel, TP {net1 Colwise, net2 Rowwise} on mesh["tp"], FSDP1 on mesh["dp"].
std::shared_ptr<FullyShardedDataParallel> tp_fsdp1(const DeviceMesh& mesh, bool use_orig_params) {
  at::manual_seed(0);
  auto model = std::make_shared<fixtures::SimpleModel>();
  tp::parallelize_module(*model, mesh["tp"], {{"net1", tp::ColwiseParallel{}}, {"net2", tp::RowwiseParallel{}}});
  return FullyShardedDataParallel::make(model, {.device_mesh = mesh["dp"], .use_orig_params = use_orig_params});
}

// Seed 0 on every rank: the same values everywhere, and in every model made here.
std::shared_ptr<fixtures::SimpleModel> unwrapped() {
  at::manual_seed(0);
  return std::make_shared<fixtures::SimpleModel>();
}

// One Adam step of sum(model(x)) with the input of this rank's dp coordinate.
void adam_step(nn::Module& model, torch::optim::Optimizer& optim, int64_t input_seed) {
  at::manual_seed(input_seed);
  model({fixtures::SimpleModel::get_input()})[0].sum().backward();
  optim.step();
}

void expect_full_values_equal(const StateDict& sharded, const StateDict& plain, const std::string& what) {
  ASSERT_EQ(sharded.keys(), plain.keys()) << what;
  for (const auto& key : sharded.keys()) {
    const at::Tensor full = std::holds_alternative<tensor::DTensor>(sharded.at(key))
                                ? checkpoint::as_dtensor(sharded, key).full_tensor()
                                : checkpoint::as_tensor(sharded, key);
    const at::Tensor& want = checkpoint::as_tensor(plain, key);
    EXPECT_TRUE(torch_allclose(full, want)) << what << " " << key << " max diff " << (full - want).abs().max();
  }
}

// The placements PyTorch 2.13 gives (FSDP1 over TP on a (2, 2) mesh; FSDP1 on the whole 2-D mesh;
// a 1-D mesh), and full values equal to the unwrapped model's.
TDC_DIST_TEST(FSDP1StateDict, ShardedLayoutMatchesPyTorch, .world_size = 4, .timeout_s = 120) {
  conformance::world();
  const DeviceMesh mesh = mesh_2d();
  const StateDict plain = checkpoint::get_model_state_dict(*unwrapped());
  auto model = tp_fsdp1(mesh, true);
  EXPECT_TRUE(model->uses_dtensor_extension());
  const StateDict sd = checkpoint::get_model_state_dict(*model);
  const std::map<std::string, Placements> want = {
      {"net1.weight", {Shard{0}, Shard{0}}},    {"net1.bias", {Shard{0}, Shard{0}}},
      {"net2.weight", {Shard{0}, Shard{1}}},    {"net2.bias", {Shard{0}, Replicate{}}},
      {"net3.weight", {Shard{0}, Replicate{}}}, {"net3.bias", {Shard{0}, Replicate{}}}};
  for (const auto& [key, placements] : want) {
    const auto& d = checkpoint::as_dtensor(sd, key);
    EXPECT_EQ(d.placements(), placements) << key << ": " << tensor::to_string(d.placements());
    EXPECT_TRUE(d.device_mesh() == mesh) << key;
  }
  expect_full_values_equal(sd, plain, "FSDP1 over TP");

  FSDPOptions whole{.device_mesh = mesh, .use_orig_params = true};
  auto on_whole = FullyShardedDataParallel::make(unwrapped(), whole);
  EXPECT_FALSE(on_whole->uses_dtensor_extension());
  EXPECT_EQ(on_whole->process_group()->size(), 2);
  const StateDict sd_whole = checkpoint::get_model_state_dict(*on_whole);
  EXPECT_EQ(checkpoint::as_dtensor(sd_whole, "net1.weight").placements(), (Placements{Replicate{}, Shard{0}}));
  expect_full_values_equal(sd_whole, plain, "FSDP1 on the whole 2-D mesh");

  auto on_1d = FullyShardedDataParallel::make(unwrapped(), {.device_mesh = init_device_mesh("cpu", {4})});
  EXPECT_FALSE(on_1d->uses_dtensor_extension());
  const StateDict sd_1d = checkpoint::get_model_state_dict(*on_1d);
  EXPECT_EQ(checkpoint::as_dtensor(sd_1d, "net1.weight").placements(), (Placements{Shard{0}}));
  expect_full_values_equal(sd_1d, plain, "FSDP1 on a 1-D mesh");
}

// Optimizer state of FSDP1 (over TP and 1-D, both use_orig_params) equals an unwrapped model's
// after the same steps, keyed by the original FQNs.
TDC_DIST_TEST(FSDP1StateDict, OptimizerStateEqualsUnwrapped, .world_size = 4, .timeout_s = 180) {
  conformance::world();
  const DeviceMesh mesh = mesh_2d();
  const int64_t dp = mesh.get_local_rank("dp");
  harness::subtests(
      harness::Axis<bool>("use_orig_params", {false, true}), harness::Axis<bool>("tp", {false, true}),
      [&](bool orig, bool with_tp) {
        auto ref = unwrapped();
        torch::optim::Adam ref_optim(ref->params(), torch::optim::AdamOptions(0.01));
        std::shared_ptr<FullyShardedDataParallel> model =
            with_tp ? tp_fsdp1(mesh, orig)
                    : FullyShardedDataParallel::make(unwrapped(), {.device_mesh = mesh["dp"], .use_orig_params = orig});
        torch::optim::Adam optim(model->params(), torch::optim::AdamOptions(0.01));
        for (int step = 0; step < 2; ++step) {
          adam_step(*model, optim, 10 * step + dp);
          optim.zero_grad();
          // The reference sees the mean gradient over the dp ranks: average by hand.
          for (int64_t r = 0; r < 2; ++r) {
            at::manual_seed(10 * step + r);
            ((*ref)({fixtures::SimpleModel::get_input()})[0].sum() / 2).backward();
          }
          ref_optim.step();
          ref_optim.zero_grad();
        }
        const StateDict osd = checkpoint::get_optimizer_state_dict(*model, optim);
        const StateDict ref_osd = checkpoint::get_optimizer_state_dict(*ref, ref_optim);
        ASSERT_EQ(osd.size(), ref_osd.size());
        for (const auto& key : ref_osd.keys()) {
          ASSERT_TRUE(osd.contains(key)) << key;
          if (key == "param_groups") continue;
          const auto& v = osd.at(key);
          const at::Tensor got = std::holds_alternative<tensor::DTensor>(v) ? std::get<tensor::DTensor>(v).full_tensor()
                                                                            : std::get<at::Tensor>(v);
          EXPECT_TRUE(assert_close(got, checkpoint::as_tensor(ref_osd, key), Tolerance{1e-5, 1e-6}))
              << key << " got " << got << " want " << checkpoint::as_tensor(ref_osd, key);
        }
        EXPECT_EQ(std::get<nlohmann::json>(osd.at("param_groups"))[0]["params"],
                  std::get<nlohmann::json>(ref_osd.at("param_groups"))[0]["params"]);
      });
}

// set_model_state_dict / set_optimizer_state_dict restore an FSDP1 model after more steps, from
// the sharded and from the full form.
TDC_DIST_TEST(FSDP1StateDict, RoundTrips, .world_size = 4, .timeout_s = 180) {
  conformance::world();
  const DeviceMesh mesh = mesh_2d();
  harness::subtests(
      harness::Axis<bool>("use_orig_params", {false, true}), harness::Axis<bool>("full", {false, true}),
      [&](bool orig, bool full) {
        auto model = tp_fsdp1(mesh, orig);
        torch::optim::Adam optim(model->params(), torch::optim::AdamOptions(0.01));
        adam_step(*model, optim, 1);
        const checkpoint::StateDictOptions o{.full_state_dict = full};
        const StateDict msd = conformance::deep_copy(checkpoint::get_model_state_dict(*model, o));
        const StateDict osd = conformance::deep_copy(checkpoint::get_optimizer_state_dict(*model, optim, o));
        adam_step(*model, optim, 2);
        ASSERT_FALSE(conformance::state_dicts_equal(checkpoint::get_model_state_dict(*model, o), msd));
        checkpoint::set_model_state_dict(*model, msd, o);
        checkpoint::set_optimizer_state_dict(*model, optim, osd, o);
        EXPECT_TRUE(conformance::state_dicts_equal(checkpoint::get_model_state_dict(*model, o), msd));
        EXPECT_TRUE(conformance::state_dicts_equal(checkpoint::get_optimizer_state_dict(*model, optim, o), osd));
      });
}

// FSDP1's own API: set_state_dict_type + state_dict() round trip, sharded_optim_state_dict and
// load_optim_state_dict, optim_state_dict by the state dict type.
TDC_DIST_TEST(FSDP1StateDict, FsdpApi, .world_size = 4, .timeout_s = 120) {
  conformance::world();
  auto model = tp_fsdp1(mesh_2d(), true);
  torch::optim::Adam optim(model->params(), torch::optim::AdamOptions(0.01));
  adam_step(*model, optim, 1);
  FullyShardedDataParallel::set_state_dict_type(*model, StateDictType::SHARDED_STATE_DICT);
  EXPECT_EQ(model->current_state_dict_type(), StateDictType::SHARDED_STATE_DICT);
  const StateDict sd = conformance::deep_copy(model->state_dict());
  const StateDict osd = conformance::deep_copy(checkpoint::fsdp1_sharded_optim_state_dict(*model, optim));
  EXPECT_TRUE(conformance::state_dicts_equal(checkpoint::fsdp1_optim_state_dict(*model, optim), osd));
  adam_step(*model, optim, 2);
  model->load_state_dict(sd);
  checkpoint::fsdp1_load_optim_state_dict(*model, optim, osd);
  EXPECT_TRUE(conformance::state_dicts_equal(model->state_dict(), sd));
  EXPECT_TRUE(conformance::state_dicts_equal(checkpoint::fsdp1_sharded_optim_state_dict(*model, optim), osd));
  {
    auto full = FullyShardedDataParallel::state_dict_type(*model, StateDictType::FULL_STATE_DICT);
    const StateDict full_osd = checkpoint::fsdp1_optim_state_dict(*model, optim);
    EXPECT_TRUE(std::holds_alternative<at::Tensor>(full_osd.at("state.net1.weight.exp_avg")));
    EXPECT_EQ(checkpoint::as_tensor(full_osd, "state.net1.weight.exp_avg").sizes(), (c10::IntArrayRef{8, 5}));
  }
  auto local = FullyShardedDataParallel::state_dict_type(*model, StateDictType::LOCAL_STATE_DICT);
  EXPECT_THAT(conformance::error_of([&] { checkpoint::fsdp1_optim_state_dict(*model, optim); }),
              HasSubstr("LOCAL_STATE_DICT"));
}

// An FSDP1 checkpoint (over TP) loads into TP x FSDP2 with equal values (DCP reshards).
TDC_DIST_TEST(FSDP1StateDict, LoadsIntoFsdp2, .world_size = 4, .timeout_s = 120) {
  conformance::world();
  const DeviceMesh mesh = mesh_2d();
  auto model = tp_fsdp1(mesh, true);
  torch::optim::Adam optim(model->params(), torch::optim::AdamOptions(0.01));
  adam_step(*model, optim, 1);
  const std::string dir = (harness::ctx().temp_dir / "ckpt").string();
  StateDict saved = checkpoint::get_model_state_dict(*model).with_prefix("model");
  saved.merge(checkpoint::get_optimizer_state_dict(*model, optim).with_prefix("optim"));
  checkpoint::save(saved, dir);

  at::manual_seed(1);  // other values than the saved ones
  auto fsdp2 = std::make_shared<fixtures::SimpleModel>();
  tp::parallelize_module(*fsdp2, mesh["tp"], {{"net1", tp::ColwiseParallel{}}, {"net2", tp::RowwiseParallel{}}});
  fsdp::fully_shard(*fsdp2, {.mesh = mesh["dp"]});
  torch::optim::Adam optim2(fsdp2->params(), torch::optim::AdamOptions(0.01));
  StateDict into = checkpoint::get_model_state_dict(*fsdp2).with_prefix("model");
  into.merge(checkpoint::get_optimizer_state_dict(*fsdp2, optim2).with_prefix("optim"));
  checkpoint::load(into, dir);
  checkpoint::set_model_state_dict(*fsdp2, into.sub("model"));
  checkpoint::set_optimizer_state_dict(*fsdp2, optim2, into.sub("optim"));
  const checkpoint::StateDictOptions full{.full_state_dict = true};
  EXPECT_TRUE(conformance::state_dicts_equal(checkpoint::get_model_state_dict(*fsdp2, full),
                                             checkpoint::get_model_state_dict(*model, full)));
  EXPECT_TRUE(conformance::state_dicts_equal(checkpoint::get_optimizer_state_dict(*fsdp2, optim2, full),
                                             checkpoint::get_optimizer_state_dict(*model, optim, full)));
}

// FSDP1 over TP with activation recompute (nn::checkpoint on net1 and net2 inside the unit)
// trains exactly as without it ([Note: FSDP1 and activation recompute]); with
// use_orig_params=false tdc refuses it with a clear error.
TDC_DIST_TEST(FSDP1StateDict, TpWithActivationRecompute, .world_size = 4, .timeout_s = 120) {
  conformance::world();
  const DeviceMesh mesh = mesh_2d();
  harness::subtests(harness::Axis<bool>("use_orig_params", {false, true}), [&](bool orig) {
    auto plain = tp_fsdp1(mesh, orig);
    at::manual_seed(0);
    auto inner = std::make_shared<fixtures::SimpleModel>();
    tp::parallelize_module(*inner, mesh["tp"], {{"net1", tp::ColwiseParallel{}}, {"net2", tp::RowwiseParallel{}}});
    for (auto& [name, child] : inner->named_children_tdc()) {
      if (name == "net1" || name == "net2") nn::checkpoint(*child);
    }
    auto recomputed = FullyShardedDataParallel::make(inner, {.device_mesh = mesh["dp"], .use_orig_params = orig});
    torch::optim::Adam o1(plain->params(), torch::optim::AdamOptions(0.01));
    torch::optim::Adam o2(recomputed->params(), torch::optim::AdamOptions(0.01));
    if (!orig) {
      EXPECT_THAT(conformance::error_of([&] { adam_step(*recomputed, o2, 0); }),
                  HasSubstr("activation recompute (nn::checkpoint) inside an FSDP1 unit needs use_orig_params=true"));
      return;
    }
    for (int step = 0; step < 2; ++step) {
      adam_step(*plain, o1, step + mesh.get_local_rank("dp"));
      o1.zero_grad();
      adam_step(*recomputed, o2, step + mesh.get_local_rank("dp"));
      o2.zero_grad();
    }
    EXPECT_TRUE(conformance::state_dicts_equal(checkpoint::get_model_state_dict(*recomputed),
                                               checkpoint::get_model_state_dict(*plain)));
  });
}

// Bad input: a TP'd model under FSDP1 on a mesh that is no slice of TP's; an optimizer over other
// parameters; an optimizer state dict of another model; a state-dict type NO_SHARD cannot give; a
// sharded entry of the wrong shape (nothing changes).
TDC_DIST_TEST(FSDP1StateDict, BadInput, .world_size = 4, .timeout_s = 120) {
  conformance::world();
  const DeviceMesh mesh = mesh_2d();
  auto tp_model = std::make_shared<fixtures::SimpleModel>();
  tp::parallelize_module(*tp_model, mesh["tp"], {{"net1", tp::ColwiseParallel{}}});
  EXPECT_THAT(conformance::error_of(
                  [&] { FullyShardedDataParallel::make(tp_model, {.device_mesh = init_device_mesh("cpu", {4})}); }),
              HasSubstr("'net1.weight' is distributed over"));

  auto model = tp_fsdp1(mesh, true);
  torch::optim::Adam optim(model->params(), torch::optim::AdamOptions(0.01));
  adam_step(*model, optim, 1);
  auto other = unwrapped();
  torch::optim::Adam other_optim(other->params(), torch::optim::AdamOptions(0.01));
  EXPECT_THAT(conformance::error_of([&] { checkpoint::get_optimizer_state_dict(*model, other_optim); }),
              HasSubstr("is not a parameter of the model"));
  adam_step(*other, other_optim, 1);
  StateDict foreign = checkpoint::get_optimizer_state_dict(*other, other_optim);
  foreign.set("state.net9.weight.exp_avg", at::zeros({2}));
  const StateDict before = conformance::deep_copy(checkpoint::get_optimizer_state_dict(*model, optim));
  EXPECT_THAT(conformance::error_of([&] { checkpoint::set_optimizer_state_dict(*model, optim, foreign); }),
              HasSubstr("net9.weight"));
  EXPECT_TRUE(conformance::state_dicts_equal(checkpoint::get_optimizer_state_dict(*model, optim), before));

  auto no_shard = FullyShardedDataParallel::make(
      unwrapped(), {.device_mesh = mesh["dp"], .sharding_strategy = fsdp1::ShardingStrategy::NO_SHARD});
  EXPECT_THAT(conformance::error_of(
                  [&] { FullyShardedDataParallel::set_state_dict_type(*no_shard, StateDictType::SHARDED_STATE_DICT); }),
              HasSubstr("NO_SHARD"));

  FullyShardedDataParallel::set_state_dict_type(*model, StateDictType::SHARDED_STATE_DICT);
  const StateDict sd = conformance::deep_copy(model->state_dict());
  StateDict wrong = conformance::deep_copy(sd);
  wrong.set("net3.weight", at::zeros({3, 3}));
  EXPECT_THAT(conformance::error_of([&] { model->load_state_dict(wrong); }),
              HasSubstr("'net3.weight' has shape [3, 3] but the parameter's is [12, 4]"));
  EXPECT_TRUE(conformance::state_dicts_equal(model->state_dict(), sd));
}

}  // namespace
