// Activation checkpointing as a custom autograd Function (the reentrant form of
// torch.utils.checkpoint): forward runs the module (hooks included) under no-grad and keeps only
// the inputs and the RNG state; backward restores the RNG state, reruns the module with grad
// enabled (hooks run again: FSDP unshards for the recompute), backpropagates the output
// gradients through the recomputed graph, and returns the input gradients.
//
// [Note: parameters as inputs] The module's parameters are passed to the Function as extra
// inputs that receive no gradient from it. They make the Function's outputs require grad whenever
// a parameter does, so backward runs even when no activation input requires grad (a first layer
// fed with data). Parameter gradients reach their leaves through the nested backward instead, via
// whatever tensors forward read (registered parameters or substitutes).
#include "tdc/nn/checkpoint.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/autograd.h>

#include <ATen/core/Generator.h>

#include <unordered_map>

namespace tdc::nn {

namespace {

struct RngState {
  at::Tensor cpu;
  at::Tensor accel;  // CUDA default generator of the inputs' device, when an input is on CUDA
  c10::DeviceIndex accel_index = -1;
};

RngState save_rng(const Tensors& inputs) {
  RngState s;
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    s.cpu = gen.get_state();
  }
  // As torch.utils.checkpoint: the device RNG of the devices the inputs live on (asking for a
  // CUDA generator otherwise would initialise CUDA).
  for (const auto& t : inputs) {
    if (t.defined() && t.is_cuda()) {
      auto gen = at::globalContext().defaultGenerator(t.device());
      std::lock_guard<std::mutex> lock(gen.mutex());
      s.accel = gen.get_state();
      s.accel_index = t.device().index();
      break;
    }
  }
  return s;
}

void restore_rng(const RngState& s) {
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(s.cpu);
  }
  if (s.accel.defined()) {
    auto gen = at::globalContext().defaultGenerator(c10::Device(at::kCUDA, s.accel_index));
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(s.accel);
  }
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The module must outlive the backward pass (it is recomputed there).
struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  // inputs: the module's inputs; params: see [Note: parameters as inputs].
  // (TensorList, not std::vector: only TensorList arguments become autograd inputs.)
  static variable_list forward(AutogradContext* ctx, Module* module, at::TensorList inputs_list,
                               at::TensorList params) {
    variable_list inputs = inputs_list.vec();
    RngState rng = save_rng(inputs);
    ctx->saved_data["module"] = reinterpret_cast<int64_t>(module);
    ctx->saved_data["num_params"] = static_cast<int64_t>(params.size());
    ctx->saved_data["rng_cpu"] = rng.cpu;
    if (rng.accel.defined()) {
      ctx->saved_data["rng_accel"] = rng.accel;
      ctx->saved_data["rng_accel_index"] = static_cast<int64_t>(rng.accel_index);
    }
    ctx->save_for_backward(inputs);
    Tensors out;
    {
      at::NoGradGuard no_grad;
      out = module->call_uncheckpointed(inputs);
    }
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto* module = reinterpret_cast<Module*>(ctx->saved_data["module"].toInt());
    const auto num_params = ctx->saved_data["num_params"].toInt();
    variable_list saved = ctx->get_saved_variables();
    // Fresh leaves for the recompute; their .grad are the input gradients. A tensor passed at
    // several positions (self-attention's q, k, v) gets one leaf, so identity checks in forward
    // behave as in the first run, and its gradient is returned once.
    Tensors inputs;
    std::vector<int64_t> first(saved.size(), -1);
    std::unordered_map<const c10::TensorImpl*, size_t> leaf_of;
    for (size_t i = 0; i < saved.size(); ++i) {
      const at::Tensor& t = saved[i];
      if (!t.defined()) {
        inputs.push_back(t);
        continue;
      }
      auto it = leaf_of.find(t.unsafeGetTensorImpl());
      if (it != leaf_of.end()) {
        inputs.push_back(inputs[it->second]);
        continue;
      }
      at::Tensor d = t.detach();
      if (ctx->needs_input_grad(i) && d.is_floating_point()) {
        d.set_requires_grad(true);
        first[i] = static_cast<int64_t>(i);
      }
      leaf_of.emplace(t.unsafeGetTensorImpl(), i);
      inputs.push_back(d);
    }
    RngState state;
    state.cpu = ctx->saved_data["rng_cpu"].toTensor();
    if (ctx->saved_data.count("rng_accel")) {
      state.accel = ctx->saved_data["rng_accel"].toTensor();
      state.accel_index = static_cast<c10::DeviceIndex>(ctx->saved_data["rng_accel_index"].toInt());
    }
    RngState now = save_rng(inputs);
    restore_rng(state);
    Tensors outputs;
    try {
      at::AutoGradMode grad(true);
      outputs = module->call_uncheckpointed(inputs);
    } catch (...) {
      restore_rng(now);
      throw;
    }
    restore_rng(now);

    variable_list outs, grads;
    for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        outs.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    if (!outs.empty()) torch::autograd::backward(outs, grads);

    variable_list result;
    result.emplace_back();  // the module pointer
    for (size_t i = 0; i < inputs.size(); ++i) {
      result.push_back(first[i] >= 0 ? inputs[i].grad() : at::Tensor());
    }
    for (int64_t i = 0; i < num_params; ++i) result.emplace_back();
    return result;
  }
};

}  // namespace

namespace detail {

Tensors checkpointed_call(Module& module, Tensors inputs) {
  if (!at::GradMode::is_enabled()) return module.call_uncheckpointed(std::move(inputs));
  // What forward reads: substitutes where installed (FSDP1's unsharded views; a registered
  // parameter may even be empty then), else the registered parameters.
  variable_list params;
  for (const auto& [prefix, m] : module.named_modules_tdc()) {
    for (const auto& item : m->named_parameters(/*recurse=*/false)) {
      const at::Tensor& t = m->has_param_substitute(item.key()) ? m->p(item.key()) : item.value();
      if (t.defined() && t.requires_grad()) params.push_back(t);
    }
  }
  return CheckpointFunction::apply(&module, at::TensorList(inputs), at::TensorList(params));
}

}  // namespace detail

void checkpoint(Module& module) { module.set_checkpointed(true); }

}  // namespace tdc::nn
