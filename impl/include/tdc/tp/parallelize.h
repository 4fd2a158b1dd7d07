// Tensor parallelism (torch.distributed.tensor.parallel): parallel styles applied to submodules
// by `parallelize_module(module, mesh, plan)`.
//
// How it works in tdc (architecture.md): a style shards the module's parameters in place (the
// registered parameter becomes the rank's local shard, its DTensorSpec is recorded as metadata,
// tensor/module_params.h) and installs forward hooks that convert the module's inputs and
// outputs between layouts. Activations between modules are local tensors; the layouts are the
// ones the styles declare (input_layouts / output_layouts), Megatron-style: the conversions and
// their conjugates in backward are collectives on the TP mesh:
//
//   ColwiseParallel   Linear weight/bias Shard(0) (Embedding weight Shard(1)); input converted
//                     from input_layouts to Replicate (backward: the partial input gradient is
//                     reduced back to input_layouts: all-reduce, or reduce-scatter for a Shard);
//                     output Shard(-1) converted to output_layouts.
//   RowwiseParallel   Linear weight Shard(1), bias Replicate (added once: bias/n per rank before
//                     the reduction, as DTensor's Partial does); Embedding weight Shard(0)
//                     (vocabulary: out-of-range ids give zero rows). Input converted from
//                     input_layouts to Shard(-1) (Embedding: Replicate); the Partial output is
//                     reduced to output_layouts (all-reduce for Replicate, reduce-scatter for Shard).
//   SequenceParallel  parameters Replicate; input and output Shard(sequence_dim). Each rank sees
//                     part of the sequence, so the parameter gradients are all-reduced over the
//                     TP mesh in backward (they are Replicate, like every gradient in tdc).
//   PrepareModuleInput / PrepareModuleOutput
//                     convert inputs / outputs from the given layouts to the desired ones.
//
// Differences from PyTorch (docs/decisions.md): module outputs are always local tensors, so
// use_local_output is accepted and recorded but changes nothing; a module's declared input
// layout is what its input is taken to be. Activations sharded on a dim are taken to be evenly
// sharded when a conversion needs their global shape (as PyTorch's from_local assumes), except
// the ColwiseParallel output dim, whose global size the weight's spec gives.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tdc/device_mesh.h"
#include "tdc/nn/module.h"
#include "tdc/tensor/placement.h"

namespace tdc::tp {

using tensor::Partial;
using tensor::Placement;
using tensor::Replicate;
using tensor::Shard;

struct ColwiseParallel {
  Placement input_layouts = Replicate{};
  Placement output_layouts = Shard{-1};
  bool use_local_output = true;
};

struct RowwiseParallel {
  Placement input_layouts = Shard{-1};
  Placement output_layouts = Replicate{};
  bool use_local_output = true;
};

struct SequenceParallel {
  int64_t sequence_dim = 1;
  bool use_local_output = false;
};

// One entry per forward input; nullopt leaves that input alone (PyTorch's None).
struct PrepareModuleInput {
  std::vector<std::optional<Placement>> input_layouts;
  std::vector<std::optional<Placement>> desired_input_layouts;
  bool use_local_output = false;
};

// One entry per forward output.
struct PrepareModuleOutput {
  std::vector<std::optional<Placement>> output_layouts;
  std::vector<std::optional<Placement>> desired_output_layouts;
  bool use_local_output = true;
};

// A parallel style: one of the above, or a custom one (a name and a function that parallelizes
// the module it is given on the 1-D mesh it is given).
class ParallelStyle {
 public:
  using ApplyFn = std::function<void(nn::Module& module, const DeviceMesh& mesh, const std::string& fqn)>;
  ParallelStyle(ColwiseParallel s);
  ParallelStyle(RowwiseParallel s);
  ParallelStyle(SequenceParallel s);
  ParallelStyle(PrepareModuleInput s);
  ParallelStyle(PrepareModuleOutput s);
  ParallelStyle(std::string name, ApplyFn apply);

  const std::string& name() const { return name_; }
  // Checks that the style can apply to `module` (type, parameters, layouts); throws
  // std::invalid_argument naming `fqn`, the module type and the problem. Changes nothing.
  void validate(const nn::Module& module, const DeviceMesh& mesh, const std::string& fqn) const;
  void apply(nn::Module& module, const DeviceMesh& mesh, const std::string& fqn) const;

 private:
  std::string name_;
  std::function<void(const nn::Module&, const DeviceMesh&, const std::string&)> validate_;
  ApplyFn apply_;
};

// Keys are module FQNs relative to the module given to parallelize_module; each dot-separated
// part may be an fnmatch pattern ("layers.*.attention.wq", "layers.[0-1].feed_forward.w?").
// Entries apply in order.
using ParallelizePlan = std::vector<std::pair<std::string, ParallelStyle>>;

// Applies `plan` (or one style to `module` itself). `mesh` must be 1-D. Every key must match at
// least one submodule and every style must fit its modules: all of it is checked before anything
// changes, so a bad plan leaves the module untouched (std::invalid_argument naming the key).
nn::Module& parallelize_module(nn::Module& module, const DeviceMesh& mesh, const ParallelizePlan& plan);
nn::Module& parallelize_module(nn::Module& module, const DeviceMesh& mesh, const ParallelStyle& style);

// The submodules (FQN, module) a plan key matches under `root`, in named_modules order.
std::vector<std::pair<std::string, nn::Module*>> match_modules(nn::Module& root, const std::string& pattern);

}  // namespace tdc::tp
