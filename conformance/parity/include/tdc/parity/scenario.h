// Parity scenarios (fixtures/scenarios/*.json): one training run that tdc and PyTorch 2.13 both
// do from the same initial weights and data, so that their traces can be compared.
//
//   Scenario s = parity::load_scenario("fixtures/scenarios/fsdp_mlp_adam_ws2.json");
//
// The file format is documented in docs/results-schema.md ("Parity scenarios"). load_scenario
// checks every field and how they fit together (mesh vs recipe vs world size vs batch) before
// anything runs; a bad file is a ScenarioError naming the file, the field and the value.
// Pure data: no LibTorch, so tdc-cli (which never links libtdc) reads scenarios too.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace tdc::parity {

// "scenario 'FILE': field 'recipe.kind': unknown value 'foo' (known: ...)".
struct ScenarioError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The model: "mlp_stack" (common_fsdp MLPStack(dim)), "mlp_layers" (a Sequential of `layers`
// common_fsdp MLP(dim)), "transformer" (common_dtensor Transformer, dropout 0, tied embeddings);
// the FSDP1 test models of common_fsdp, built as the FSDP1 tests build them (deterministic=True:
// the fixture seeds its own weights; its get_input gives each rank its inputs, its get_loss the
// loss): "nested_wrapped_module" (NestedWrappedModule), "transformer_with_shared_params"
// (TransformerWithSharedParams, eval mode, dropout off). These take no other field, and go with
// recipe fsdp1, or none (unwrapped on 1 rank: the reference that shows what the model's own
// arithmetic contributes).
struct ModelSpec {
  std::string type;
  int64_t dim = 0;
  int64_t layers = 0;                                              // mlp_layers
  int64_t vocab_size = 0, n_layers = 0, n_heads = 0, seq_len = 0;  // transformer
  // One of the FSDP1 test models: no seeds and no batch in the scenario (the fixture has them).
  bool is_fsdp1_fixture() const;
};

struct MixedPrecision {
  std::string param_dtype;  // "float32", "bfloat16", "float16"
  std::string reduce_dtype = "float32";
};

// How the model is parallelized. kind: none, ddp, tp, fsdp, hsdp, tp_fsdp, pipeline, fsdp1
// (FullyShardedDataParallel as the FSDP1 tests wrap their models: the model's init with
// FSDPInitMode.RECURSIVE, then a root unit).
struct Recipe {
  std::string kind;
  std::string sharding_strategy;                  // fsdp1: "FULL_SHARD", "SHARD_GRAD_OP" or "NO_SHARD"
  bool use_orig_params = false;                   // fsdp1
  std::optional<MixedPrecision> mixed_precision;  // FSDP kinds
  int grad_accum = 1;                             // micro-batches per step (not pipeline)
  bool activation_checkpointing = false;          // per block, before fully_shard
  std::string schedule;                           // pipeline: "GPipe" or "1F1B"
  int microbatches = 1;                           // pipeline
  std::optional<int> checkpoint_resume_at;        // save + rebuild + load before this step
};

struct OptimizerSpec {
  std::string type;  // "sgd" or "adam"
  double lr = 0;
  double momentum = 0;  // sgd
};

// A quantity passes when |tdc - pytorch| <= atol + rtol * scale (scale: |pytorch|; for a
// parameter's sum, its abs_sum). `why` says where the numbers come from.
struct Tolerance {
  double rtol = 0, atol = 0;
  std::string why;
};

// [Note: scenario requires a release] A scenario that a PyTorch release cannot run, because
// that release's own operators refuse it (the same error on tdc's side, since tdc computes with
// that release's LibTorch), names the first release that can and why:
//   "requires": {"pytorch": "2.12", "why": "..."}
// `tdc parity` reports it NOT_SUPPORTED (with the why) on an older LibTorch and runs neither
// side; NOT_SUPPORTED is not a failure. It is never a way to hide a tdc bug: the why must name
// the PyTorch behaviour, and the scenario must pass on every release it names.
struct Requirement {
  std::vector<int> min_pytorch;  // e.g. {2, 12}
  std::string why;
};

struct Scenario {
  std::filesystem::path file;
  std::string name, description;
  ModelSpec model;
  int64_t init_seed = 0, data_seed = 0;  // not for the FSDP1 test models (0)
  int world_size = 1;
  std::vector<int64_t> mesh_shape;
  std::vector<std::string> mesh_dim_names;
  Recipe recipe;
  int64_t batch = 0;  // global rows (sequences) per micro-batch; 0 for the FSDP1 test models
  OptimizerSpec optimizer;
  int steps = 0;
  Tolerance tolerance;
  std::optional<Requirement> requires_release;
  // Test-only: the tdc side multiplies its learning rate by this (a deliberately wrong run, to
  // show that the verdict catches it). 1 in every real scenario.
  double perturb_tdc_lr_scale = 1.0;

  // The data-parallel degree the batch is split over (1 for tp and none).
  int64_t dp_size() const;
};

// Reads and checks one scenario file. Throws ScenarioError.
Scenario load_scenario(const std::filesystem::path& file);

// Why the scenario cannot run against PyTorch `version` ("2.11.0", "2.12.1+cu130"), or nullopt
// when it can ([Note: scenario requires a release]). Throws ScenarioError when `version` does not
// start with MAJOR.MINOR.
std::optional<std::string> unmet_requirement(const Scenario& s, const std::string& version);

// "fsdp (dp 2) + bf16 + grad accum 3": the recipe in words, for tables.
std::string describe_recipe(const Scenario& s);

}  // namespace tdc::parity
