// tdc::nn::Module — a LibTorch module with what FSDP, TP, DDP and pipelining need and LibTorch
// lacks (docs/modules.md):
//
//  * forward pre-hooks and post-hooks, run by the call operator in registration order; a hook may
//    replace the inputs (pre) or the outputs (post); handles remove them;
//  * parameter indirection: a module reads its parameters through p("weight"), so a substitute
//    tensor (e.g. FSDP's unsharded parameter) can be installed for a name during forward while the
//    registered parameter stays what the optimizer sees;
//  * PyTorch semantics for the module tree: FQNs like "layers.0.attention.wq.weight",
//    named_modules / named_parameters in PyTorch's order with shared modules and shared
//    (tied) parameters yielded once;
//  * a metadata slot per parameter (DTensor specs of sharded parameters live there);
//  * deep copy of a whole model (tests copy the reference model), preserving weight tying;
//  * composable activation checkpointing (checkpoint.h).
//
// How a user model opts in: derive from tdc::nn::Module, register parameters with
// register_param / submodules with register_child (or LibTorch's register_module), read
// parameters with p(name) inside forward(), implement forward(const Tensors&) and clone_empty().
// docs/modules.md walks through an example.
#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

namespace tdc::nn {

using Tensors = std::vector<at::Tensor>;

class Module;
using ModulePtr = std::shared_ptr<Module>;

// Pre-hook: sees the inputs; returns replacement inputs or nullopt to keep them.
// Hook replacement rule (checked; std::invalid_argument naming the module type and hook kind):
// a replacement has exactly as many tensors as the hook received (pre: inputs, post: outputs),
// and each is defined unless the tensor it replaces was undefined (an optional input left out).
using ForwardPreHook = std::function<std::optional<Tensors>(Module& module, const Tensors& inputs)>;
// Post-hook: sees inputs and outputs; returns replacement outputs or nullopt to keep them.
using ForwardHook =
    std::function<std::optional<Tensors>(Module& module, const Tensors& inputs, const Tensors& outputs)>;

// Removes its hook on remove(); does nothing if the module is gone. Copyable.
class HookHandle {
 public:
  HookHandle() = default;
  void remove();
  bool active() const;

 private:
  friend class Module;
  std::weak_ptr<std::function<void()>> remover_;
};

class Module : public torch::nn::Module {
 public:
  explicit Module(std::string type_name);
  ~Module() override;

  // PyTorch's class name ("Linear", "TransformerBlock"): wrap policies and messages use it.
  const std::string& type_name() const { return type_name_; }

  // ---------------------------------------------------------------- calling
  // Runs pre-hooks, forward (or its checkpointed form), post-hooks.
  Tensors operator()(Tensors inputs);
  // One input tensor in, the first output out.
  at::Tensor operator()(const at::Tensor& input);
  virtual Tensors forward(const Tensors& inputs) = 0;

  // The direct tdc child `name` as currently registered (so a wrapper that replaced it is what
  // runs). tdc layers call their children through it; throws listing the children if missing.
  Module& child(const std::string& name) const;

  HookHandle register_forward_pre_hook(ForwardPreHook hook);
  HookHandle register_forward_hook(ForwardHook hook);

  // ---------------------------------------------------------------- parameters
  // Registers a parameter (requires_grad as given) and returns it.
  at::Tensor& register_param(const std::string& name, at::Tensor tensor, bool requires_grad = true);
  at::Tensor& register_buf(const std::string& name, at::Tensor tensor, bool persistent = true);
  // The tensor forward() must use for parameter `name` (direct, not dotted): the installed
  // substitute if any, else the registered parameter. Throws naming the module type and the
  // parameter names it has when `name` is not one of them.
  const at::Tensor& p(const std::string& name) const;
  // A registered buffer by (direct) name. Buffers are registered with LibTorch too (same tensor),
  // so LibTorch's to()/named_buffers() see them.
  const at::Tensor& b(const std::string& name) const;
  bool is_persistent_buf(const std::string& name) const;
  // The registered parameter `name` (direct; no substitute, no transform), nullptr if none.
  const at::Tensor* find_param(const std::string& name) const { return parameters_.find(name); }
  // Installs / removes a substitute for parameter `name` (used by FSDP during forward/backward).
  void set_param_substitute(const std::string& name, at::Tensor tensor);
  void clear_param_substitute(const std::string& name);
  void clear_param_substitutes();
  bool has_param_substitute(const std::string& name) const;
  // Replaces the registered parameter `name` (e.g. with its sharded leaf); keeps the name and
  // its position in named_parameters. The tensor is used as given (its requires_grad included).
  void replace_param(const std::string& name, at::Tensor tensor);
  // Ties: makes this module's parameter `name` the same tensor as `tensor` (PyTorch's
  // `output.weight = tok_embeddings.weight`); registers `name` if it is not yet a parameter.
  void tie_param(const std::string& name, const at::Tensor& tensor);

  // Read transforms: functions applied, in registration order, to what p(name) would otherwise
  // return (the substitute, else the registered parameter), at every p() call. Tensor parallel
  // uses them (RowwiseParallel's bias / n, SequenceParallel's gradient all-reduce), so they
  // compose with substitutes installed by FSDP. Not copied by deep_copy (like hooks).
  using ParamTransform = std::function<at::Tensor(const at::Tensor&)>;
  void add_param_transform(const std::string& name, ParamTransform fn);
  bool has_param_transform(const std::string& name) const;

  // Per-parameter metadata (DTensor specs etc.), by direct name.
  void set_param_meta(const std::string& name, std::any meta);
  const std::any* param_meta(const std::string& name) const;  // nullptr if none

  // ---------------------------------------------------------------- tree (PyTorch semantics)
  // Registers a tdc child; returns it. Children may also be registered with register_module.
  template <class M>
  std::shared_ptr<M> register_child(const std::string& name, std::shared_ptr<M> child) {
    return register_module(name, std::move(child));
  }
  // Direct tdc children in registration order (non-tdc children are skipped).
  std::vector<std::pair<std::string, ModulePtr>> named_children_tdc() const;
  // Pre-order, self first (name ""), shared modules once.
  std::vector<std::pair<std::string, Module*>> named_modules_tdc(const std::string& prefix = "") const;
  // Shared (tied) parameters once, at their first FQN, as PyTorch does. Order: PyTorch's (each
  // module's own parameters, modules in named_modules order). Use params() for optimizers:
  // LibTorch's parameters() repeats tied parameters and shared modules.
  std::vector<std::pair<std::string, at::Tensor>> named_params(bool recurse = true) const;
  std::vector<at::Tensor> params(bool recurse = true) const;  // for optimizers: no duplicates
  std::vector<std::pair<std::string, at::Tensor>> named_bufs(bool recurse = true) const;
  // The submodule at a dotted path ("layers.0.attention"); "" is this module. Throws naming the
  // path and the missing part.
  Module& submodule(const std::string& path);
  // The module that owns the parameter/buffer at a dotted FQN and the direct name in it.
  std::pair<Module*, std::string> owner_of(const std::string& fqn);

  // ---------------------------------------------------------------- copy
  // Deep copy of the whole tree: new modules with the same configuration, parameter and buffer
  // values copied (detached), requires_grad kept, ties and shared submodules preserved, hooks and
  // substitutes not copied. Throws naming the FQN and type of a module that cannot be copied.
  ModulePtr deep_copy() const;
  // A new module of the same type and configuration. It may build its children (a constructor
  // call is the usual implementation): deep_copy copies values into a child of the same name and
  // type, and replaces any other child with a copy of the original's. Parameters, buffers, ties,
  // metadata and train/eval mode are then made equal to the original's, so random
  // initialisation done here is wasted: constructors can skip it when deep_copy_in_progress().
  // Every tdc module implements it; the default throws (a module that cannot be copied).
  virtual ModulePtr clone_empty() const;

  // ---------------------------------------------------------------- activation checkpointing
  // Set by tdc::nn::checkpoint(); the call operator then recomputes forward in backward.
  void set_checkpointed(bool on) { checkpointed_ = on; }
  bool checkpointed() const { return checkpointed_; }

  // Runs forward with hooks but never checkpointed (checkpoint.cpp uses it for recompute).
  Tensors call_uncheckpointed(Tensors inputs);

 private:
  friend struct ModuleCopier;
  [[noreturn]] void throw_unknown(const char* what, const std::string& name) const;
  std::string type_name_;
  struct Hooks;
  std::shared_ptr<Hooks> hooks_;
  std::map<std::string, at::Tensor> substitutes_;
  std::map<std::string, std::any> meta_;
  std::map<std::string, std::vector<ParamTransform>> transforms_;
  mutable std::map<std::string, at::Tensor> transformed_;  // p()'s results of the current forward
  torch::OrderedDict<std::string, at::Tensor> bufs_;       // same tensors as LibTorch's buffers
  std::vector<std::string> non_persistent_;
  bool checkpointed_ = false;
};

// True on this thread while deep_copy() runs clone_empty(): constructors may skip random
// initialisation (the values are overwritten), so a copy consumes no RNG, as in PyTorch.
bool deep_copy_in_progress();

}  // namespace tdc::nn
