// The optimizer state dict (state_dict.h) for LibTorch's Adam, AdamW and SGD, in PyTorch's form:
// per-parameter state keyed "state.<param FQN>.<name>" (laid out as the parameter: a DTensor when
// the parameter is one), `step` as a 0-dim float32 tensor, and "param_groups" as JSON with the
// groups' hyperparameters and their parameters' FQNs.
//
// [Note: LibTorch's optimizer step is an integer]
// LibTorch keeps Adam's step as an int64 in AdamParamState where PyTorch keeps a float32 tensor.
// The state dict presents a fresh 0-dim float32 tensor (PyTorch's form, which PyTorch's reader
// expects); loading into it does not reach the optimizer by itself: set_optimizer_state_dict
// writes it back. Every other state tensor is the optimizer's own, so a checkpoint load into the
// state dict updates the optimizer in place, as in PyTorch.
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "assign.h"
#include "common.h"
#include "fqn.h"
#include "tdc/checkpoint/errors.h"
#include "tdc/state_dict/state_dict.h"
#include "tdc/core/optimizer_access.h"
#include "tdc/fsdp1/fully_sharded_data_parallel.h"
#include "tdc/fsdp1/optim_state.h"
#include "tdc/tensor/module_params.h"
#include "tdc/comm/gather_strings.h"

namespace tdc::checkpoint {
namespace {

// The optimizer's parameters with the FQNs they stand for (several for an FSDP1 flat parameter)
// and their layouts.
struct OptimParam {
  at::Tensor param;
  std::vector<std::string> fqns;
  std::optional<tensor::DTensorSpec> spec;
  size_t group = 0;
};

// Tensor -> (FQNs, layout) for every parameter the model's optimizer may step.
using KnownParams = std::map<const void*, std::pair<std::vector<std::string>, std::optional<tensor::DTensorSpec>>>;

KnownParams known_params(nn::Module& model) {
  KnownParams known;
  if (auto* root = detail::fsdp1_root(model)) {
    for (auto& op : fsdp1::detail::optimizer_params(*root)) {
      known[op.param.unsafeGetTensorImpl()] = {std::move(op.fqns), std::nullopt};
    }
    return known;
  }
  for (const auto& p : tensor::named_params_with_specs(model)) {
    known[p.tensor.unsafeGetTensorImpl()] = {{detail::clean_fqn(model, p.fqn)},
                                             p.dtensor ? std::optional(p.dtensor->spec()) : std::nullopt};
  }
  return known;
}

std::vector<OptimParam> optim_params(nn::Module& model, torch::optim::Optimizer& optim, bool ignore_frozen) {
  const KnownParams known = known_params(model);
  std::vector<OptimParam> out;
  for (size_t g = 0; g < optim.param_groups().size(); ++g) {
    const auto& params = optim.param_groups()[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      auto it = known.find(params[i].unsafeGetTensorImpl());
      if (it == known.end()) {
        throw std::invalid_argument(fmt::format(
            "tdc::checkpoint: parameter {} of the optimizer's param group {} (shape [{}]) is not a parameter of the "
            "model (its FQN is unknown)",
            i, g, fmt::join(params[i].sizes(), ", ")));
      }
      if (ignore_frozen && !params[i].requires_grad()) continue;
      out.push_back(OptimParam{params[i], it->second.first, it->second.second, g});
    }
  }
  return out;
}

// PyTorch's _init_optim_state: when there is no state and no gradient, zero gradients and one
// step with lr 0 create every state entry without changing a parameter.
void init_optim_state(torch::optim::Optimizer& optim) {
  if (!optim.state().empty()) return;
  for (auto& g : optim.param_groups()) {
    for (auto& p : g.params()) {
      if (p.grad().defined()) return;
    }
  }
  std::vector<double> lrs;
  for (auto& g : optim.param_groups()) {
    for (auto& p : g.params()) {
      if (p.requires_grad()) p.mutable_grad() = at::zeros_like(p);
    }
    lrs.push_back(g.options().get_lr());
    g.options().set_lr(0.0);
  }
  optim.step();
  for (size_t i = 0; i < lrs.size(); ++i) optim.param_groups()[i].options().set_lr(lrs[i]);
  optim.zero_grad(true);
}

using core::OptimKind;
using core::ParamState;

void set_step(torch::optim::Optimizer& optim, OptimKind kind, const at::Tensor& p, int64_t step) {
  auto& s = *optim.state().at(p.unsafeGetTensorImpl());
  if (kind == OptimKind::Adam) static_cast<torch::optim::AdamParamState&>(s).step(step);
  if (kind == OptimKind::AdamW) static_cast<torch::optim::AdamWParamState&>(s).step(step);
}

nlohmann::json group_json(const torch::optim::OptimizerOptions& o, OptimKind kind) {
  nlohmann::json g;
  auto adam = [&](const auto& a) {
    g["lr"] = a.lr();
    g["betas"] = {std::get<0>(a.betas()), std::get<1>(a.betas())};
    g["eps"] = a.eps();
    g["weight_decay"] = a.weight_decay();
    g["amsgrad"] = a.amsgrad();
  };
  if (kind == OptimKind::Adam) adam(static_cast<const torch::optim::AdamOptions&>(o));
  if (kind == OptimKind::AdamW) adam(static_cast<const torch::optim::AdamWOptions&>(o));
  if (kind == OptimKind::SGD) {
    const auto& s = static_cast<const torch::optim::SGDOptions&>(o);
    g["lr"] = s.lr();
    g["momentum"] = s.momentum();
    g["dampening"] = s.dampening();
    g["weight_decay"] = s.weight_decay();
    g["nesterov"] = s.nesterov();
  }
  return g;
}

// Applies a group's hyperparameters; throws CheckpointError naming the group and the key.
std::function<void()> apply_group(torch::optim::OptimizerOptions& o, OptimKind kind, const nlohmann::json& g,
                                  size_t index) {
  auto num = [&](const char* key) -> std::optional<double> {
    if (!g.contains(key)) return std::nullopt;
    if (!g[key].is_number()) {
      throw CheckpointError(fmt::format("param_groups[{}].{} is {}, not a number", index, key, g[key].dump()));
    }
    return g[key].get<double>();
  };
  auto flag = [&](const char* key) -> std::optional<bool> {
    if (!g.contains(key)) return std::nullopt;
    if (!g[key].is_boolean()) {
      throw CheckpointError(fmt::format("param_groups[{}].{} is {}, not a boolean", index, key, g[key].dump()));
    }
    return g[key].get<bool>();
  };
  if (kind == OptimKind::SGD) {
    auto& s = static_cast<torch::optim::SGDOptions&>(o);
    auto lr = num("lr"), m = num("momentum"), d = num("dampening"), wd = num("weight_decay");
    auto n = flag("nesterov");
    return [&s, lr, m, d, wd, n] {
      if (lr) s.lr(*lr);
      if (m) s.momentum(*m);
      if (d) s.dampening(*d);
      if (wd) s.weight_decay(*wd);
      if (n) s.nesterov(*n);
    };
  }
  std::optional<std::tuple<double, double>> betas;
  if (g.contains("betas")) {
    const auto& b = g["betas"];
    if (!b.is_array() || b.size() != 2 || !b[0].is_number() || !b[1].is_number()) {
      throw CheckpointError(fmt::format("param_groups[{}].betas is {}, not two numbers", index, b.dump()));
    }
    betas = std::make_tuple(b[0].get<double>(), b[1].get<double>());
  }
  auto lr = num("lr"), eps = num("eps"), wd = num("weight_decay");
  auto ams = flag("amsgrad");
  auto apply = [=](auto& a) {
    if (lr) a.lr(*lr);
    if (betas) a.betas(*betas);
    if (eps) a.eps(*eps);
    if (wd) a.weight_decay(*wd);
    if (ams) a.amsgrad(*ams);
  };
  if (kind == OptimKind::Adam) return [&o, apply] { apply(static_cast<torch::optim::AdamOptions&>(o)); };
  return [&o, apply] { apply(static_cast<torch::optim::AdamWOptions&>(o)); };
}

// "state.<fqn>.<name>" entries of a plain, DDP, TP or FSDP2 model: the optimizer's own tensors.
void add_param_state(StateDict& out, torch::optim::Optimizer& optim, OptimKind kind, const OptimParam& op) {
  auto st = core::optimizer_param_state(optim, kind, op.param);
  if (!st) return;
  const std::string prefix = "state." + op.fqns.front() + ".";
  if (st->step) out.set(prefix + "step", at::scalar_tensor(static_cast<double>(*st->step), at::kFloat));
  for (const auto& [name, t] : st->tensors) {
    if (!t.defined()) continue;
    if (op.spec) {
      out.set(prefix + name, tensor::DTensor(t, *op.spec));
    } else {
      out.set(prefix + name, t);
    }
  }
}

// The same for an FSDP1 model: copies laid out as the parameters' sharded entries
// ([Note: FSDP1 sharded state-dict layout]); the step of each original parameter is its flat
// parameter's.
void add_fsdp1_state(StateDict& out, fsdp1::FullyShardedDataParallel& root, torch::optim::Optimizer& optim,
                     OptimKind kind, const std::vector<OptimParam>& params) {
  std::map<std::string, const OptimParam*> by_fqn;
  for (const auto& op : params) {
    for (const auto& f : op.fqns) by_fqn[f] = &op;
  }
  std::set<std::string> done;
  for (auto& e : fsdp1::detail::optimizer_state_entries(root, optim)) {
    auto it = by_fqn.find(e.fqn);
    if (it == by_fqn.end()) continue;  // not in this optimizer (or frozen and ignored)
    auto st = core::optimizer_param_state(optim, kind, it->second->param);
    const std::string prefix = "state." + e.fqn + ".";
    if (st && st->step) out.set(prefix + "step", at::scalar_tensor(static_cast<double>(*st->step), at::kFloat));
    for (auto& [name, v] : e.tensors) out.set(prefix + name, std::move(v));
    done.insert(e.fqn);
  }
  for (const auto& op : params) {  // parameters FSDP does not manage
    if (!done.count(op.fqns.front())) add_param_state(out, optim, kind, op);
  }
}

StateDict sharded_optim_state(nn::Module& model, torch::optim::Optimizer& optim, bool ignore_frozen) {
  const OptimKind kind = core::optimizer_kind(optim);
  init_optim_state(optim);
  StateDict out;
  const auto params = optim_params(model, optim, ignore_frozen);
  if (auto* root = detail::fsdp1_root(model)) {
    add_fsdp1_state(out, *root, optim, kind, params);
  } else {
    for (const auto& op : params) add_param_state(out, optim, kind, op);
  }
  nlohmann::json groups = nlohmann::json::array();
  for (size_t g = 0; g < optim.param_groups().size(); ++g) {
    nlohmann::json j = group_json(optim.param_groups()[g].options(), kind);
    j["params"] = nlohmann::json::array();
    for (const auto& op : params) {
      if (op.group != g) continue;
      for (const auto& f : op.fqns) j["params"].push_back(f);
    }
    groups.push_back(std::move(j));
  }
  out.set("param_groups", groups);
  return out;
}

}  // namespace

StateDict get_optimizer_state_dict(nn::Module& model, torch::optim::Optimizer& optim, const StateDictOptions& options) {
  StateDict sharded = sharded_optim_state(model, optim, options.ignore_frozen_params);
  return options.full_state_dict ? detail::to_full(sharded, options) : sharded;
}

namespace detail {

// Stages an optimizer load; the returned function commits it (cannot fail).
std::function<void()> stage_optimizer(nn::Module& model, torch::optim::Optimizer& optim, const StateDict& given,
                                      const StateDictOptions& options) {
  const OptimKind kind = core::optimizer_kind(optim);
  StateDict targets = sharded_optim_state(model, optim, options.ignore_frozen_params);
  nlohmann::json groups = std::get<nlohmann::json>(targets.at("param_groups"));
  targets.erase("param_groups");
  // param_groups travel as JSON: under broadcast_from_rank0, rank 0's.
  std::optional<nlohmann::json> given_groups;
  if (given.contains("param_groups")) {
    if (const auto* j = std::get_if<nlohmann::json>(&given.at("param_groups"))) given_groups = *j;
  }
  std::optional<std::string> error;
  std::vector<std::function<void()>> group_updates;
  try {
    if (given_groups) {
      if (!given_groups->is_array() || given_groups->size() != groups.size()) {
        throw CheckpointError(fmt::format("param_groups has {} groups, the optimizer {}",
                                          given_groups->is_array() ? given_groups->size() : 0, groups.size()));
      }
      for (size_t g = 0; g < groups.size(); ++g) {
        const auto& gg = (*given_groups)[g];
        if (gg.contains("params")) {
          auto a = gg["params"].get<std::vector<std::string>>(),
               b = groups[g]["params"].get<std::vector<std::string>>();
          if (std::set(a.begin(), a.end()) != std::set(b.begin(), b.end())) {
            throw CheckpointError(fmt::format("param_groups[{}] holds parameters [{}], the optimizer's group [{}]", g,
                                              fmt::join(a, ", "), fmt::join(b, ", ")));
          }
        }
        group_updates.push_back(apply_group(optim.param_groups()[g].options(), kind, gg, g));
      }
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (options.broadcast_from_rank0) {
    // Only rank 0's dict counts: its verdict and its groups.
    const comm::GroupPtr world = resolve_group(nullptr);
    const bool rank0 = group_rank(world) == 0;
    agree("set_optimizer_state_dict", rank0 ? error : std::nullopt, "", world);
    const auto dumps = comm::all_gather_strings(rank0 && given_groups ? given_groups->dump() : "", world);
    if (!rank0 && !dumps[0].empty()) {
      const auto j = nlohmann::json::parse(dumps[0]);
      group_updates.clear();
      for (size_t g = 0; g < groups.size(); ++g) {
        group_updates.push_back(apply_group(optim.param_groups()[g].options(), kind, j[g], g));
      }
    }
  } else {
    agree("set_optimizer_state_dict", error, "", resolve_group(nullptr));
  }
  auto assignments = stage("set_optimizer_state_dict", targets, given, options);
  const auto params = optim_params(model, optim, options.ignore_frozen_params);
  fsdp1::FullyShardedDataParallel* fsdp1_model = fsdp1_root(model);
  return [assignments = std::move(assignments), targets, params, group_updates, kind, &optim, fsdp1_model] {
    commit(assignments);
    // FSDP1: the targets were copies; now into the flat parameters' state (collective).
    if (fsdp1_model) fsdp1::detail::write_optimizer_state_entries(*fsdp1_model, optim, targets);
    for (const auto& op : params) {
      for (const auto& fqn : op.fqns) {
        const std::string key = "state." + fqn + ".step";
        if (!targets.contains(key)) continue;
        set_step(optim, kind, op.param, std::llround(as_tensor(targets, key).item<double>()));
        break;
      }
    }
    for (const auto& update : group_updates) update();
  };
}

}  // namespace detail

void set_optimizer_state_dict(nn::Module& model, torch::optim::Optimizer& optim, const StateDict& state_dict,
                              const StateDictOptions& options) {
  detail::stage_optimizer(model, optim, state_dict, options)();
}

// ------------------------------------------------------------------ FSDP1's optimizer state-dict calls

StateDict fsdp1_optim_state_dict(fsdp1::FullyShardedDataParallel& model, torch::optim::Optimizer& optim) {
  switch (model.current_state_dict_type()) {
    case fsdp1::StateDictType::FULL_STATE_DICT:
      return get_optimizer_state_dict(model, optim, {.full_state_dict = true});
    case fsdp1::StateDictType::SHARDED_STATE_DICT:
      return get_optimizer_state_dict(model, optim);
    case fsdp1::StateDictType::LOCAL_STATE_DICT:
      break;
  }
  throw std::invalid_argument(
      "fsdp1_optim_state_dict (FSDP.optim_state_dict): LOCAL_STATE_DICT has no optimizer state dict form (as in "
      "PyTorch); use FULL_STATE_DICT or SHARDED_STATE_DICT");
}

StateDict fsdp1_sharded_optim_state_dict(fsdp1::FullyShardedDataParallel& model, torch::optim::Optimizer& optim) {
  return get_optimizer_state_dict(model, optim);
}

void fsdp1_load_optim_state_dict(fsdp1::FullyShardedDataParallel& model, torch::optim::Optimizer& optim,
                                 const StateDict& optim_state_dict) {
  set_optimizer_state_dict(model, optim, optim_state_dict);
}

}  // namespace tdc::checkpoint
