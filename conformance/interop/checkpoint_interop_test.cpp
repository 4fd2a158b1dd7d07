// Checkpoints handed between tdc and PyTorch (torch.distributed.checkpoint with
// HuggingFaceStorageWriter / HuggingFaceStorageReader, the venv's torch), both ways, across world
// sizes and layouts. The PyTorch side is tools/checkpoint/dcp_interop.py; rank 0 runs it.
//
// Both sides build test_fsdp_dsd's base model, Sequential(MLP(6, with_buffer), Sequential(MLP(6),
// Linear(6, 6)), MLP(6)) (dim 6 is uneven: on 4 ranks some FSDP shards are empty), in one of the
// layouts
//   plain:    no parallelism, no process group;
//   fsdp:     fully_shard on "0", "1", "2", then the root (1-D mesh over the world);
//   fsdp_tp:  2-D mesh (2, ws/2) ("dp", "tp"): in_proj ColwiseParallel and out_proj RowwiseParallel
//             of the MLPs "0", "1.0", "2" on "tp", then fully_shard as fsdp on "dp";
//   fsdp1, fsdp1_orig (tdc only): FSDP1, FullyShardedDataParallel(FULL_SHARD over the world, an
//             MLP-wrap policy), use_orig_params false / true;
//   fsdp1_tp (tdc only): TP as fsdp_tp, then FullyShardedDataParallel(device_mesh = mesh["dp"],
//             use_orig_params = true, the MLP-wrap policy) -- FSDP1's DTensor extension;
// and take one Adam(lr=0.01) step on model(x).sum() so that the optimizer has state. A checkpoint
// CKPT holds CKPT/model (the model state dict) and CKPT/optim (the optimizer state dict: tdc saves
// all of it, its param_groups go to tdc's manifest, which PyTorch's reader must ignore; PyTorch
// saves {"state": ...}, tensors only). The saving side also writes its full state dict (keys
// model.<fqn>, optim.state.<fqn>.<name>) as a reference REF, which the loading side compares with
// bit for bit after loading CKPT into its model and optimizer (set_state_dict) and gathering the
// full state dict back. The loading side starts from other values (another seed, or the other
// language's initialisation), so a value the load missed shows as a difference.
//
// Limits: starting Python and importing torch takes seconds on a loaded 2-core machine, so each
// test has a 300 s deadline and the PyTorch side is stopped after 240 s (kPythonLimitS).
#include <array>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/optim/adam.h>
#include <fmt/ranges.h>

#include "tdc/checkpoint/checkpoint.h"
#include "tdc/state_dict/state_dict.h"
#include "tdc/comm/process_group.h"
#include "tdc/conformance/checks.h"
#include "tdc/conformance/pytorch_side.h"
#include "tdc/conformance/support.h"
#include "tdc/device_mesh.h"
#include "tdc/fixtures/models.h"
#include "tdc/fsdp/fully_shard.h"
#include "tdc/fsdp1/fully_sharded_data_parallel.h"
#include "tdc/harness/harness.h"
#include "tdc/nn/layers.h"
#include "tdc/tp/parallelize.h"

namespace {

using namespace tdc;
using checkpoint::StateDict;
using harness::ctx;
namespace fs = std::filesystem;

constexpr int64_t kDim = 6;
constexpr int kPythonLimitS = 240;

// ------------------------------------------------------------------ the model, as dcp_interop.py

nn::ModulePtr build_model(const std::string& layout, uint64_t seed) {
  at::manual_seed(seed);
  auto mlp = [](bool with_buffer) { return std::make_shared<fixtures::MLP>(kDim, true, with_buffer); };
  auto inner = std::make_shared<nn::Sequential>(
      std::vector<nn::ModulePtr>{mlp(false), std::make_shared<nn::Linear>(kDim, kDim)});
  auto model = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{mlp(true), inner, mlp(false)});
  if (layout == "plain") return model;

  conformance::world();
  conformance::sync_from_rank0(*model);  // thread-launched ranks share one generator
  const int ws = ctx().world_size;
  DeviceMesh dp_mesh;
  if (layout == "fsdp1" || layout == "fsdp1_orig") {
    return fsdp1::FullyShardedDataParallel::make(
        model, {.auto_wrap_policy = fsdp1::ModuleWrapPolicy({"MLP"}), .use_orig_params = layout == "fsdp1_orig"});
  }
  if (layout == "fsdp") {
    dp_mesh = init_device_mesh("cpu", {ws});
  } else {  // fsdp_tp, fsdp1_tp
    DeviceMesh mesh = init_device_mesh("cpu", {2, ws / 2}, {"dp", "tp"});
    tp::ParallelizePlan plan;
    for (const char* m : {"0", "1.0", "2"}) {
      plan.emplace_back(fmt::format("{}.in_proj", m), tp::ColwiseParallel{});
      plan.emplace_back(fmt::format("{}.out_proj", m), tp::RowwiseParallel{});
    }
    tp::parallelize_module(*model, mesh["tp"], plan);
    dp_mesh = mesh["dp"];
  }
  if (layout == "fsdp1_tp") {
    return fsdp1::FullyShardedDataParallel::make(
        model, {.device_mesh = dp_mesh, .auto_wrap_policy = fsdp1::ModuleWrapPolicy({"MLP"}), .use_orig_params = true});
  }
  for (auto& [name, child] : model->named_children_tdc()) fsdp::fully_shard(*child, {.mesh = dp_mesh});
  fsdp::fully_shard(*model, {.mesh = dp_mesh});
  return model;
}

// Adam(lr=0.01), one step on model(x).sum(), x = randn(2, 6) the same on every rank.
std::unique_ptr<torch::optim::Adam> train_one_step(nn::Module& model) {
  auto optim = std::make_unique<torch::optim::Adam>(model.params(), torch::optim::AdamOptions(0.01));
  at::Tensor x = at::randn({2, kDim}, at::make_generator<at::CPUGeneratorImpl>(1));
  model(x).sum().backward();
  optim->step();
  optim->zero_grad();
  return optim;
}

// ------------------------------------------------------------------ full state dicts

// The full state dict keyed as the reference (model.<fqn>, optim.state.<fqn>.<name>): on rank 0;
// other ranks get an empty dict. Collective.
StateDict full_state(nn::Module& model, torch::optim::Optimizer& optim) {
  const checkpoint::StateDictOptions opts{.full_state_dict = true, .cpu_offload = true};
  StateDict osd = checkpoint::get_optimizer_state_dict(model, optim, opts);
  osd.erase("param_groups");  // not a tensor: not in the reference
  StateDict full = checkpoint::get_model_state_dict(model, opts).with_prefix("model");
  full.merge(osd.with_prefix("optim"));
  return full;
}

StateDict clone(const StateDict& sd) {
  StateDict out;
  for (const auto& [key, value] : sd) out.set(key, checkpoint::as_tensor(sd, key).clone());
  return out;
}

// The group rank 0 saves and loads references with: rank 0 alone (no group without a world).
comm::GroupPtr rank0_group() { return comm::is_initialized() ? comm::new_group({0}) : nullptr; }

// Tensor keys in the header of every *.safetensors file of `dir` (to check that a reference has
// no key tdc lacks: checkpoint::load reads only the keys it is asked for).
std::set<std::string> safetensors_keys(const fs::path& dir) {
  std::set<std::string> keys;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::array<unsigned char, 8> n{};
    in.read(reinterpret_cast<char*>(n.data()), 8);
    uint64_t size = 0;
    for (int i = 7; i >= 0; --i) size = (size << 8) | n[i];
    std::string header(size, '\0');
    in.read(header.data(), static_cast<std::streamsize>(size));
    const nlohmann::json parsed = nlohmann::json::parse(header);  // outlives the loop over items()
    for (const auto& [key, value] : parsed.items()) {
      if (key != "__metadata__") keys.insert(key);
    }
  }
  return keys;
}

// Every difference between `got` (full tensors) and the reference `want`: keys, dtype, shape,
// values (bit-exact). Empty when they are equal.
std::vector<std::string> differences(const StateDict& got, const StateDict& want) {
  std::vector<std::string> out;
  for (const auto& key : want.keys()) {
    if (!got.contains(key)) out.push_back("missing in tdc: " + key);
  }
  for (const auto& [key, value] : got) {
    if (!want.contains(key)) {
      out.push_back("not in the reference: " + key);
      continue;
    }
    const at::Tensor& g = checkpoint::as_tensor(got, key);
    const at::Tensor& w = checkpoint::as_tensor(want, key);
    if (g.scalar_type() != w.scalar_type() || g.sizes() != w.sizes()) {
      out.push_back(fmt::format("{}: tdc {} {}, reference {} {}", key, c10::toString(g.scalar_type()), g.sizes(),
                                c10::toString(w.scalar_type()), w.sizes()));
    } else if (!at::equal(g, w)) {
      const double diff = (g.to(at::kDouble) - w.to(at::kDouble)).abs().max().item<double>();
      out.push_back(fmt::format("{}: values differ, max abs difference {:.3e}", key, diff));
    }
  }
  return out;
}

std::string join(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += "\n  " + l;
  return s;
}

// ------------------------------------------------------------------ the PyTorch side

// Rank 0 runs `dcp_interop.py <args>` while the other ranks wait; true on every rank if it succeeded.
bool pytorch_side(const std::string& args) {
  return conformance::pytorch_side("tools/checkpoint/dcp_interop.py", args, kPythonLimitS);
}

std::string dirs(const fs::path& ckpt, const fs::path& ref) {
  return fmt::format("--dir '{}' --ref '{}'", ckpt.string(), ref.string());
}

// ------------------------------------------------------------------ tdc saves, PyTorch loads

// tdc trains on `layout` and saves CKPT (model/, optim/) and the reference; then PyTorch loads
// CKPT on `py_nproc` ranks with `py_layout` and compares with the reference.
void tdc_saves_pytorch_loads(const std::string& layout, const std::string& py_layout, int py_nproc) {
  TDC_SKIP_UNLESS_DEVICE("cpu");
  const fs::path ckpt = ctx().temp_dir / "ckpt", ref = ctx().temp_dir / "ref";
  if (ctx().rank == 0) fs::create_directory(ckpt);  // save writes model/ and optim/ in it
  nn::ModulePtr model = build_model(layout, 0);
  auto optim = train_one_step(*model);

  auto [msd, osd] = checkpoint::get_state_dict(*model, *optim);
  ASSERT_TRUE(osd.contains("param_groups"));  // saved too: tdc's manifest, ignored by PyTorch
  // The sharded form: parameters and their optimizer state are DTensors (FSDP1: its sharded
  // state-dict layout), on the 2-D mesh when TP is in the layout.
  for (const std::string key : {"0.in_proj.weight", "1.1.bias"}) {  // an MLP's and the root unit's
    ASSERT_TRUE(std::holds_alternative<tensor::DTensor>(msd.at(key))) << key;
    ASSERT_TRUE(std::holds_alternative<tensor::DTensor>(osd.at("state." + key + ".exp_avg"))) << key;
  }
  const bool tp = layout.ends_with("_tp");
  EXPECT_EQ(checkpoint::as_dtensor(msd, "0.in_proj.weight").device_mesh().ndim(), tp ? 2 : 1);
  checkpoint::save(msd, (ckpt / "model").string());
  checkpoint::save(osd, (ckpt / "optim").string());

  StateDict full = full_state(*model, *optim);
  if (ctx().rank == 0) checkpoint::save(full, ref.string(), {.group = rank0_group()});
  harness::barrier();

  pytorch_side(fmt::format("load --layout {} --nproc {} {}", py_layout, py_nproc, dirs(ckpt, ref)));
}

TDC_DIST_SUITE(TdcToPyTorch, .world_size = 4, .timeout_s = 300);

TDC_DIST_TEST(TdcToPyTorch, SavedOnWs4TpFsdpLoadsInPyTorchWs2Fsdp) { tdc_saves_pytorch_loads("fsdp_tp", "fsdp", 2); }

TDC_DIST_TEST(TdcToPyTorch, SavedOnWs4TpFsdpLoadsInPyTorchWs1Plain) { tdc_saves_pytorch_loads("fsdp_tp", "plain", 1); }

// FSDP1-saved checkpoints (sharded state dicts of FullyShardedDataParallel models) load into
// PyTorch's plain model and Adam: values equal to tdc's full state dict.
TDC_DIST_TEST(TdcToPyTorch, Fsdp1SavedOnWs4LoadsInPyTorchWs1Plain) { tdc_saves_pytorch_loads("fsdp1", "plain", 1); }

TDC_DIST_TEST(TdcToPyTorch, Fsdp1OrigParamsSavedOnWs4LoadsInPyTorchWs1Plain) {
  tdc_saves_pytorch_loads("fsdp1_orig", "plain", 1);
}

TDC_DIST_TEST(TdcToPyTorch, Fsdp1OverTpSavedOnWs4LoadsInPyTorchWs1Plain) {
  tdc_saves_pytorch_loads("fsdp1_tp", "plain", 1);
}

// ------------------------------------------------------------------ PyTorch saves, tdc loads

// PyTorch trains on `py_layout` (`py_nproc` ranks) and saves CKPT and the reference; then tdc
// loads CKPT into a model on `layout` and its Adam, and compares its full state with the reference.
void pytorch_saves_tdc_loads(const std::string& py_layout, int py_nproc, const std::string& layout) {
  TDC_SKIP_UNLESS_DEVICE("cpu");
  const fs::path ckpt = ctx().temp_dir / "ckpt", ref = ctx().temp_dir / "ref";
  if (!pytorch_side(fmt::format("save --layout {} --nproc {} {}", py_layout, py_nproc, dirs(ckpt, ref)))) return;

  nn::ModulePtr model = build_model(layout, 1);
  auto optim = train_one_step(*model);
  StateDict before = clone(full_state(*model, *optim));  // a full dict may share the model's tensors

  auto [msd, osd] = checkpoint::get_state_dict(*model, *optim);
  StateDict osd_tensors = osd;  // shares the tensors; PyTorch saved no param_groups
  osd_tensors.erase("param_groups");
  checkpoint::load(msd, (ckpt / "model").string());
  checkpoint::load(osd_tensors, (ckpt / "optim").string());
  checkpoint::set_state_dict(*model, *optim, msd, osd);
  StateDict after = full_state(*model, *optim);

  if (ctx().rank != 0) return;
  // The reference, read by tdc into fresh tensors of the same keys, dtypes and shapes.
  StateDict want;
  for (const auto& [key, value] : after) want.set(key, at::zeros_like(checkpoint::as_tensor(after, key)));
  checkpoint::load(want, ref.string(), {.group = rank0_group()});
  std::set<std::string> tdc_keys;
  for (const auto& key : after.keys()) tdc_keys.insert(key);
  EXPECT_EQ(safetensors_keys(ref), tdc_keys) << "the reference's keys and tdc's full state dict's";

  EXPECT_FALSE(differences(before, want).empty()) << "tdc's model already held PyTorch's values before the load";
  const std::vector<std::string> diff = differences(after, want);
  EXPECT_TRUE(diff.empty()) << diff.size() << " differences from PyTorch's full state dict:" << join(diff);
}

TDC_DIST_SUITE(PyTorchToTdc, .world_size = 4, .timeout_s = 300);

TDC_DIST_TEST(PyTorchToTdc, SavedOnWs2FsdpLoadsInTdcWs4TpFsdp) { pytorch_saves_tdc_loads("fsdp", 2, "fsdp_tp"); }

TDC_DIST_TEST(PyTorchToTdc, SavedOnWs2FsdpLoadsInTdcWs1Plain, .world_size = 1) {
  pytorch_saves_tdc_loads("fsdp", 2, "plain");
}

}  // namespace
