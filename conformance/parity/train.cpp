// tdc's side of a parity scenario (train.h). Each function has its namesake in
// tools/parity/run_scenario.py.
#include "train.h"

#include <cmath>
#include <memory>
#include <set>
#include <stdexcept>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include "tdc/checkpoint/checkpoint.h"
#include "tdc/checkpoint/detail/safetensors.h"
#include "tdc/state_dict/state_dict.h"
#include "tdc/comm/collectives.h"
#include "tdc/comm/process_group.h"
#include "tdc/conformance/support.h"
#include "tdc/ddp/ddp.h"
#include "tdc/device_mesh.h"
#include "tdc/fixtures/fsdp1_models.h"
#include "tdc/fixtures/models.h"
#include "tdc/fsdp/fully_shard.h"
#include "tdc/fsdp1/fully_sharded_data_parallel.h"
#include "tdc/fsdp1/wrap.h"
#include "tdc/nn/checkpoint.h"
#include "tdc/nn/layers.h"
#include "tdc/pipelining/schedule.h"
#include "tdc/tensor/module_params.h"

namespace tdc::parity {

namespace {

namespace fs = std::filesystem;
using TensorMap = std::map<std::string, at::Tensor>;

// ------------------------------------------------------------------ inputs, model, loss

// Every tensor of the inputs file (plain safetensors: each entry a whole tensor).
TensorMap read_inputs(const fs::path& path) {
  const checkpoint::detail::FileHeader file = checkpoint::detail::read_header(path.string());
  TensorMap out;
  for (const auto& chunk : file.chunks)
    out[chunk.key] = checkpoint::detail::read_rows(file, chunk, 0, chunk.shape.empty() ? 1 : chunk.shape[0]);
  return out;
}

const at::Tensor& input(const TensorMap& inputs, const std::string& key) {
  auto it = inputs.find(key);
  if (it == inputs.end()) throw std::runtime_error(fmt::format("the inputs file has no tensor '{}'", key));
  return it->second;
}

nn::ModulePtr build_model(const ModelSpec& m) {
  using fixtures::DEVICEInitMode, fixtures::FSDPInitMode;
  if (m.type == "nested_wrapped_module")  // unwrapped, seeded by the fixture; the default group
    return fixtures::NestedWrappedModule::init(nullptr, FSDPInitMode::NO_FSDP, DEVICEInitMode::DEVICE_BEFORE, {},
                                               /*deterministic=*/true);
  if (m.type == "transformer_with_shared_params")
    return fixtures::TransformerWithSharedParams::init(nullptr, FSDPInitMode::NO_FSDP, DEVICEInitMode::DEVICE_BEFORE,
                                                       {}, /*deterministic=*/true);
  if (m.type == "mlp_stack") return std::make_shared<fixtures::MLPStack>(m.dim);
  if (m.type == "mlp_layers") {
    std::vector<nn::ModulePtr> layers;
    for (int64_t i = 0; i < m.layers; ++i) layers.push_back(std::make_shared<fixtures::MLP>(m.dim));
    return std::make_shared<nn::Sequential>(layers);
  }
  fixtures::ModelArgs a;
  a.n_layers = m.n_layers;
  a.vocab_size = m.vocab_size;
  a.max_seq_len = m.seq_len;
  a.dim = m.dim;
  a.n_heads = m.n_heads;
  a.dropout_p = 0.0;
  a.weight_tying = true;
  return std::make_shared<fixtures::Transformer>(a);
}

// The modules that get activation checkpointing and their own fully_shard.
std::vector<nn::ModulePtr> blocks(nn::Module& model, const std::string& type) {
  nn::Module& parent = type == "transformer" ? model.submodule("layers") : model;
  std::vector<nn::ModulePtr> out;
  for (auto& [name, child] : parent.named_children_tdc())
    if (child->type_name() != "LayerNorm") out.push_back(child);
  return out;
}

at::Tensor loss_of(const at::Tensor& y, const at::Tensor& target) {
  if (target.scalar_type() == at::kLong) return at::cross_entropy_loss(y.flatten(0, 1), target.flatten());
  return at::mse_loss(y, target);
}

at::ScalarType dtype_of(const std::string& name) {
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  return at::kFloat;
}

fsdp::MixedPrecisionPolicy mp_policy(const Recipe& r) {
  if (!r.mixed_precision) return {};
  return {.param_dtype = dtype_of(r.mixed_precision->param_dtype),
          .reduce_dtype = dtype_of(r.mixed_precision->reduce_dtype)};
}

// ------------------------------------------------------------------ the recipes

// One rank's parallelized model.
struct Run {
  struct Part {
    std::optional<int64_t> offset;  // pipeline: index of the stage's first layer in the model
    nn::ModulePtr module;           // its parameters are traced under their FQNs (+ offset)
  };
  std::vector<Part> parts;
  nn::Module* call = nullptr;  // what forward calls: the model or its DDP wrapper
  std::shared_ptr<ddp::DistributedDataParallel> ddp;
  nn::Module* fsdp_root = nullptr;
  int64_t dp_index = 0, dp_size = 1, pp_rank = 0, pp_size = 1;
  // Declared in this order so that the schedule goes before the stage it points at.
  std::unique_ptr<pipelining::PipelineStage> stage;
  std::unique_ptr<pipelining::PipelineScheduleRuntime> schedule;
  std::shared_ptr<fsdp1::FullyShardedDataParallel> fsdp1_root;  // the root unit (recipe fsdp1)
  fixtures::FSDPTestModel* test_model =
      nullptr;  // an FSDP1 test model (its inputs, get_loss)                // the model inside it (get_loss)
};

// ------------------------------------------------------------------ FSDP1 (recipe fsdp1)

constexpr const char* kFsdpWrapped = "_fsdp_wrapped_module.";

// The FQN without FSDP1's wrapper segments (PyTorch's clean_tensor_name).
std::string clean_fqn(std::string fqn) {
  const std::string seg = kFsdpWrapped;
  for (size_t at = fqn.find(seg); at != std::string::npos; at = fqn.find(seg, at)) fqn.erase(at, seg.size());
  return fqn;
}

fsdp1::ShardingStrategy sharding_strategy_of(const std::string& name) {
  if (name == "FULL_SHARD") return fsdp1::ShardingStrategy::FULL_SHARD;
  if (name == "SHARD_GRAD_OP") return fsdp1::ShardingStrategy::SHARD_GRAD_OP;
  if (name == "NO_SHARD") return fsdp1::ShardingStrategy::NO_SHARD;
  throw std::invalid_argument(fmt::format("unknown sharding strategy '{}'", name));
}

fsdp1::WrapPolicy policy_of(const fixtures::WrapRequest& r) {
  using AutoWrap = fixtures::WrapRequest::AutoWrap;
  if (r.auto_wrap == AutoWrap::ALWAYS) return fsdp1::always_wrap_policy();
  if (r.auto_wrap == AutoWrap::MODULE_TYPES)
    return fsdp1::ModuleWrapPolicy(std::set<std::string>(r.module_types.begin(), r.module_types.end()));
  return {};
}

// [Note: FSDP1 parity wrapping] run_scenario.py's build_fsdp1 does what test_fsdp_core's
// _test_fsdp_parity does: model_class.init(group, RECURSIVE, DEVICE_BEFORE, fsdp_kwargs,
// deterministic=True) wraps the units the fixture asks for while it builds the model, a root unit
// goes around it when init did not wrap the root, and the weights of the inputs file are written
// into the full parameters. Here the weights go into the model before anything is wrapped, and the
// units are the same: tdc's fixture is built with a wrap function that only records which modules
// it would wrap (and with which request) and leaves them unwrapped; after loading, one
// FullyShardedDataParallel::make on the root wraps exactly those, bottom-up, as nested units
// (a CustomPolicy over the recorded modules; or, when the fixture's request was for the root
// itself, the auto-wrap policy it asked for). Same units, same FQNs, same flat parameters.
void build_fsdp1(const Scenario& sc, const TensorMap& inputs, const DeviceMesh& mesh, Run& run) {
  const comm::GroupPtr group = mesh.get_group();
  fsdp1::FSDPOptions options;
  options.process_group = group;
  options.sharding_strategy = sharding_strategy_of(sc.recipe.sharding_strategy);
  options.use_orig_params = sc.recipe.use_orig_params;
  options.device_id = c10::Device(c10::kCPU);
  struct Requested {
    nn::Module* module;
    fixtures::WrapRequest request;
  };
  std::vector<Requested> requested;
  const fixtures::FSDPWrapFn record = [&](nn::ModulePtr m, const fixtures::WrapRequest& r) {
    requested.push_back({m.get(), r});
    return m;
  };
  using fixtures::DEVICEInitMode, fixtures::FSDPInitMode;
  const nn::ModulePtr model =
      sc.model.type == "nested_wrapped_module"
          ? fixtures::NestedWrappedModule::init(group, FSDPInitMode::RECURSIVE, DEVICEInitMode::DEVICE_BEFORE, record,
                                                /*deterministic=*/true)
          : fixtures::TransformerWithSharedParams::init(group, FSDPInitMode::RECURSIVE, DEVICEInitMode::DEVICE_BEFORE,
                                                        record, /*deterministic=*/true);
  {
    at::NoGradGuard no_grad;
    for (auto& [name, p] : model->named_params()) p.copy_(input(inputs, "init." + name));
  }
  fsdp1::FSDPOptions root = options;
  std::set<nn::Module*> inner;
  for (const auto& [module, request] : requested) {
    if (request.group && request.group != group)
      throw std::logic_error(fmt::format("{}::init asked for a unit on another process group", model->type_name()));
    if (module == model.get()) {
      root.auto_wrap_policy = policy_of(request);
    } else if (request.auto_wrap != fixtures::WrapRequest::AutoWrap::NONE) {
      throw std::logic_error(
          fmt::format("{}::init asked for an auto-wrapped inner unit (not supported here)", model->type_name()));
    } else {
      inner.insert(module);
    }
  }
  if (!inner.empty()) {
    if (root.auto_wrap_policy)
      throw std::logic_error(fmt::format("{}::init asked for inner units and a root policy", model->type_name()));
    root.auto_wrap_policy = fsdp1::CustomPolicy([inner](nn::Module& m) { return inner.count(&m) > 0; },
                                                fmt::format("the units {}::init(RECURSIVE) wraps", model->type_name()));
  }
  run.fsdp1_root = fsdp1::FullyShardedDataParallel::make(model, root);
  run.test_model = &fixtures::test_model_of(*run.fsdp1_root);
  run.call = run.fsdp1_root.get();
  run.dp_index = mesh.get_rank();
  run.dp_size = mesh.size();
  run.parts = {{std::nullopt, run.fsdp1_root}};
}

// Sums {key: value} over the ranks (float64 all-reduce on the default group, keys in order).
std::map<std::string, double> all_ranks_sum(const std::map<std::string, double>& values) {
  std::vector<double> flat;
  for (const auto& [k, v] : values) flat.push_back(v);
  at::Tensor t = at::tensor(flat, at::kDouble);
  comm::all_reduce(t);
  std::map<std::string, double> out;
  size_t i = 0;
  for (const auto& [k, v] : values) out[k] = t[static_cast<int64_t>(i++)].item<double>();
  return out;
}

double squares(const at::Tensor& g) {
  const at::Tensor d = g.detach().to(at::kDouble);
  return (d * d).sum().item<double>();
}

// [Note: FSDP1 gradient trace] in run_scenario.py: per original parameter with
// use_orig_params = true (this rank's part; none or undefined: 0), per unit's flat parameter
// ("<unit>._flat_param", wrapper-free) otherwise; summed over the ranks.
std::map<std::string, double> fsdp1_grad_squares(Run& run) {
  std::map<std::string, double> local;
  if (run.fsdp1_root->options().use_orig_params) {
    for (auto& [fqn, p] : run.fsdp1_root->named_params()) {
      const at::Tensor& g = p.grad();
      local[clean_fqn(fqn)] = g.defined() ? squares(g) : 0.0;
    }
  } else {
    for (auto& [fqn, m] : run.fsdp1_root->named_modules_tdc()) {
      auto* unit = dynamic_cast<fsdp1::FullyShardedDataParallel*>(m);
      if (!unit || !unit->flat_param().defined()) continue;
      const at::Tensor& g = unit->flat_param().grad();
      if (!g.defined())
        throw std::runtime_error(fmt::format("FSDP unit '{}' has no flat gradient after backward", fqn));
      local[clean_fqn((fqn.empty() ? "" : fqn + ".") + kFsdpWrapped + "_flat_param")] = squares(g);
    }
  }
  return all_ranks_sum(local);
}

// The full parameters, as summon_full_params shows them.
std::map<std::string, Checksums> fsdp1_param_checksums(Run& run) {
  fsdp1::SummonOptions options;
  options.writeback = false;
  const fsdp1::SummonFullParams full(*run.fsdp1_root, options);
  std::map<std::string, Checksums> out;
  for (auto& [fqn, p] : run.fsdp1_root->named_params()) {
    const at::Tensor v = p.detach().to(at::kDouble);
    out[clean_fqn(fqn)] = {v.sum().item<double>(), v.abs().sum().item<double>(), v.norm().item<double>()};
  }
  return out;
}

void build_pipeline(const Scenario& sc, const nn::ModulePtr& model, const DeviceMesh& mesh, Run& run) {
  const DeviceMesh pp_mesh = mesh["pp"];
  run.pp_rank = pp_mesh.get_local_rank();
  run.pp_size = pp_mesh.size();
  std::vector<nn::ModulePtr> layers;
  for (auto& [name, layer] : model->named_children_tdc()) layers.push_back(layer);
  const int64_t per_stage = static_cast<int64_t>(layers.size()) / run.pp_size;
  const int64_t offset = run.pp_rank * per_stage;
  auto stage_module = std::make_shared<nn::Sequential>(
      std::vector<nn::ModulePtr>(layers.begin() + offset, layers.begin() + offset + per_stage));
  const auto& names = mesh.mesh_dim_names();
  if (std::find(names.begin(), names.end(), "dp") != names.end()) {
    const DeviceMesh dp_mesh = mesh["dp"];
    run.dp_index = dp_mesh.get_local_rank();
    run.dp_size = dp_mesh.size();
    const fsdp::FullyShardOptions config{.mesh = dp_mesh, .mp_policy = mp_policy(sc.recipe)};
    for (auto& [name, layer] : stage_module->named_children_tdc()) {
      fsdp::FullyShardOptions layer_config = config;
      layer_config.reshard_after_forward = false;
      fsdp::fully_shard(*layer, layer_config);
    }
    fsdp::fully_shard(*stage_module, config);
  }
  run.stage = std::make_unique<pipelining::PipelineStage>(stage_module, static_cast<int>(run.pp_rank),
                                                          static_cast<int>(run.pp_size), at::kCPU, pp_mesh.get_group());
  run.schedule = pipelining::make_schedule(pipelining::schedule_kind(sc.recipe.schedule), {run.stage.get()},
                                           sc.recipe.microbatches, &loss_of);
  run.parts = {{offset, stage_module}};
}

std::unique_ptr<Run> build(const Scenario& sc, const TensorMap& inputs, const std::optional<DeviceMesh>& mesh) {
  const Recipe& recipe = sc.recipe;
  const std::string& kind = recipe.kind;
  auto run = std::make_unique<Run>();
  if (kind == "fsdp1") {
    build_fsdp1(sc, inputs, *mesh, *run);
    return run;
  }
  nn::ModulePtr model = build_model(sc.model);
  {
    at::NoGradGuard no_grad;
    for (auto& [name, p] : model->named_params()) p.copy_(input(inputs, "init." + name));
  }
  if (kind == "pipeline") {
    build_pipeline(sc, model, *mesh, *run);
    return run;
  }
  if ((kind == "none" || kind == "ddp" || kind == "fsdp" || kind == "hsdp") && recipe.activation_checkpointing) {
    for (auto& b : blocks(*model, sc.model.type)) nn::checkpoint(*b);
  }
  run->call = model.get();
  if (kind == "none" && sc.model.is_fsdp1_fixture()) run->test_model = &fixtures::test_model_of(*model);
  if (kind == "ddp") {
    run->ddp = std::make_shared<ddp::DistributedDataParallel>(model, mesh->get_group());
    run->call = run->ddp.get();
    run->dp_index = mesh->get_local_rank();
    run->dp_size = mesh->size();
  } else if (kind == "tp") {
    static_cast<fixtures::MLPStack&>(*model).parallelize_tp(*mesh);
  } else if (kind == "fsdp" || kind == "hsdp") {
    const fsdp::FullyShardOptions config{.mesh = *mesh, .mp_policy = mp_policy(recipe)};
    for (auto& b : blocks(*model, sc.model.type)) fsdp::fully_shard(*b, config);
    fsdp::fully_shard(*model, config);
    run->fsdp_root = model.get();
    run->dp_index = mesh->get_rank();
    run->dp_size = mesh->size();
  } else if (kind == "tp_fsdp") {
    static_cast<fixtures::MLPStack&>(*model).parallelize((*mesh)["tp"], (*mesh)["dp"], recipe.activation_checkpointing,
                                                         {.mp_policy = mp_policy(recipe)});
    run->fsdp_root = model.get();
    run->dp_index = (*mesh)["dp"].get_local_rank();
    run->dp_size = (*mesh)["dp"].size();
  }
  run->parts = {{std::nullopt, model}};
  return run;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Scenario& sc, const Run& run) {
  std::vector<at::Tensor> params;
  for (const auto& part : run.parts)
    for (const auto& p : part.module->params()) params.push_back(p);
  const double lr = sc.optimizer.lr * sc.perturb_tdc_lr_scale;
  if (sc.optimizer.type == "sgd")
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(lr).momentum(sc.optimizer.momentum));
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(lr));
}

// ------------------------------------------------------------------ what is traced

std::string model_fqn(const std::string& fqn, const std::optional<int64_t>& offset) {
  if (!offset) return fqn;
  const size_t dot = fqn.find('.');
  return std::to_string(std::stoll(fqn.substr(0, dot)) + *offset) + fqn.substr(dot);
}

// {fqn: sum of squares of the full gradient} (float64); collective for distributed parameters.
std::map<std::string, double> grad_squares(Run& run) {
  if (run.fsdp1_root) return fsdp1_grad_squares(run);
  std::map<std::string, double> out;
  for (auto& part : run.parts) {
    for (auto& np : tensor::named_params_with_specs(*part.module)) {
      const at::Tensor g = np.full_grad();
      if (!g.defined()) throw std::runtime_error(fmt::format("parameter '{}' has no gradient after backward", np.fqn));
      const at::Tensor d = g.detach().to(at::kDouble);
      out[model_fqn(np.fqn, part.offset)] = (d * d).sum().item<double>();
    }
  }
  return out;
}

std::map<std::string, Checksums> param_checksums(Run& run) {
  if (run.fsdp1_root) return fsdp1_param_checksums(run);
  std::map<std::string, Checksums> out;
  for (auto& part : run.parts) {
    for (auto& np : tensor::named_params_with_specs(*part.module)) {
      const at::Tensor v = np.full().detach().to(at::kDouble);
      out[model_fqn(np.fqn, part.offset)] = {v.sum().item<double>(), v.abs().sum().item<double>(),
                                             v.norm().item<double>()};
    }
  }
  return out;
}

// ------------------------------------------------------------------ one rank

at::Tensor local(const at::Tensor& t, const Run& run) { return at::chunk(t, run.dp_size)[run.dp_index]; }

// Forward + backward of every micro step; the rank's mean local loss, or none (pipeline ranks
// without the last stage).
std::optional<double> train_step(const Scenario& sc, Run& run, const TensorMap& inputs, int s) {
  if (run.test_model) {  // the fixture's inputs for this rank and its loss
    nn::Tensors x;
    for (int i = 0;; ++i) {
      auto it = inputs.find(fmt::format("data.step{}.rank{}.input{}", s, run.dp_index, i));
      if (it == inputs.end()) break;
      x.push_back(it->second);
    }
    const at::Tensor loss = run.test_model->get_loss(x, (*run.call)(x));
    run.test_model->run_backward(loss);
    return static_cast<double>(loss.item<float>());
  }
  const std::string data = fmt::format("data.step{}.micro", s);
  if (run.schedule) {
    const at::Tensor x = local(input(inputs, data + "0.input"), run);
    const at::Tensor y = local(input(inputs, data + "0.target"), run);
    if (run.pp_rank == 0) {
      run.schedule->step({x});
      return std::nullopt;
    }
    if (run.pp_rank == run.pp_size - 1) {
      std::vector<at::Tensor> losses;
      run.schedule->step({}, y, &losses);
      double total = 0;
      for (const auto& l : losses) total += static_cast<double>(l.item<float>());
      return total / static_cast<double>(losses.size());
    }
    run.schedule->step();
    return std::nullopt;
  }
  const int accum = sc.recipe.grad_accum;
  double total = 0;
  for (int micro = 0; micro < accum; ++micro) {
    const bool sync = micro == accum - 1;
    if (run.fsdp_root) fsdp::as_fsdp(*run.fsdp_root).set_requires_gradient_sync(sync);
    const at::Tensor x = local(input(inputs, fmt::format("{}{}.input", data, micro)), run);
    const at::Tensor y = local(input(inputs, fmt::format("{}{}.target", data, micro)), run);
    std::optional<ddp::DistributedDataParallel::NoSync> no_sync;
    if (run.ddp && !sync) no_sync.emplace(*run.ddp);
    const at::Tensor loss = loss_of((*run.call)(nn::Tensors{x}).at(0), y);
    (loss / accum).backward();
    total += static_cast<double>(loss.item<float>());
  }
  return total / accum;
}

// Saves model + optimizer with tdc::checkpoint, builds everything anew and loads them back.
void resume(const Scenario& sc, const TensorMap& inputs, const std::optional<DeviceMesh>& mesh,
            std::unique_ptr<Run>& run, std::unique_ptr<torch::optim::Optimizer>& optim, const fs::path& dir) {
  auto both = [](nn::Module& model, torch::optim::Optimizer& o) {
    auto [msd, osd] = checkpoint::get_state_dict(model, o);
    checkpoint::StateDict all = msd.with_prefix("model");
    all.merge(osd.with_prefix("optim"));
    return all;
  };
  checkpoint::save(both(*run->parts[0].module, *optim), dir.string());
  std::unique_ptr<Run> fresh = build(sc, inputs, mesh);
  std::unique_ptr<torch::optim::Optimizer> fresh_optim = make_optimizer(sc, *fresh);
  checkpoint::StateDict all = both(*fresh->parts[0].module, *fresh_optim);
  checkpoint::load(all, dir.string());
  checkpoint::set_state_dict(*fresh->parts[0].module, *fresh_optim, all.sub("model"), all.sub("optim"));
  optim = std::move(fresh_optim);
  run = std::move(fresh);
}

}  // namespace

RankResult train_rank(const Scenario& sc, const fs::path& inputs_file, const fs::path& work_dir) {
  conformance::world();
  const TensorMap inputs = read_inputs(inputs_file);
  std::optional<DeviceMesh> mesh;
  if (sc.recipe.kind != "none") mesh = init_device_mesh("cpu", sc.mesh_shape, sc.mesh_dim_names);
  std::unique_ptr<Run> run = build(sc, inputs, mesh);
  std::unique_ptr<torch::optim::Optimizer> optim = make_optimizer(sc, *run);
  RankResult result;
  for (int s = 0; s < sc.steps; ++s) {
    if (sc.recipe.checkpoint_resume_at && s == *sc.recipe.checkpoint_resume_at)
      resume(sc, inputs, mesh, run, optim, work_dir / "checkpoint");
    result.losses.push_back(train_step(sc, *run, inputs, s));
    result.grad_sq.push_back(grad_squares(*run));
    optim->step();
    optim->zero_grad(/*set_to_none=*/true);
  }
  result.params = param_checksums(*run);
  return result;
}

nlohmann::json to_json(const RankResult& r) {
  nlohmann::json losses = nlohmann::json::array();
  for (const auto& l : r.losses) losses.push_back(l ? nlohmann::json(*l) : nlohmann::json(nullptr));
  nlohmann::json params = nlohmann::json::object();
  for (const auto& [k, c] : r.params) params[k] = {{"sum", c.sum}, {"abs_sum", c.abs_sum}, {"norm", c.norm}};
  return {{"losses", losses}, {"grad_sq", r.grad_sq}, {"params", params}};
}

RankResult rank_result_from_json(const nlohmann::json& j) {
  RankResult r;
  for (const auto& l : j.at("losses")) r.losses.push_back(l.is_null() ? std::nullopt : std::optional(l.get<double>()));
  r.grad_sq = j.at("grad_sq").get<std::vector<std::map<std::string, double>>>();
  for (const auto& [k, c] : j.at("params").items())
    r.params[k] = {c.at("sum").get<double>(), c.at("abs_sum").get<double>(), c.at("norm").get<double>()};
  return r;
}

// [Note: parity trace merge] Both sides reduce the ranks' results the same way, in the same
// order, in float64: per step, loss = the mean of the reporting ranks' losses (summed in rank
// order), gradient norm = sqrt of the sum over FQNs (sorted) of each parameter's squared norm
// (the lowest rank's value: data-parallel replicas hold the same full gradient); parameters: the
// lowest rank's checksums of each FQN. run_scenario.py's merge() is the same function.
Trace merge_ranks(const Scenario& sc, const std::vector<RankResult>& ranks, const std::string& version) {
  Trace t{.scenario = sc.name, .side = "tdc", .version = version, .world_size = sc.world_size};
  for (int s = 0; s < sc.steps; ++s) {
    double total = 0;
    int reported = 0;
    std::map<std::string, double> sq;
    for (const auto& r : ranks) {
      if (r.losses.at(s)) {
        total += *r.losses.at(s);
        ++reported;
      }
      for (const auto& [k, v] : r.grad_sq.at(s)) sq.emplace(k, v);
    }
    if (reported == 0) throw std::runtime_error(fmt::format("step {}: no rank reported a loss", s));
    double acc = 0;
    for (const auto& [k, v] : sq) acc += v;
    t.steps.push_back({s, total / reported, std::sqrt(acc)});
  }
  for (const auto& r : ranks)
    for (const auto& [k, c] : r.params) t.params.emplace(k, c);
  return t;
}

}  // namespace tdc::parity
