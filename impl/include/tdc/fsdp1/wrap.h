// FSDP1 auto-wrap policies (torch.distributed.fsdp.wrap): which submodules of the module given to
// FullyShardedDataParallel become FSDP units of their own.
//
//   fsdp1::FSDPOptions opts;
//   opts.auto_wrap_policy = fsdp1::ModuleWrapPolicy({"TransformerEncoderLayer", "TransformerDecoderLayer"});
//   auto model = fsdp1::FullyShardedDataParallel::make(net, opts);
//
// A policy is asked bottom-up, as PyTorch's _recursive_wrap: for each child, first with
// recurse = true ("may I look inside?"), then, after the child's own children were wrapped, with
// recurse = false ("wrap this one?") and the number of its parameters not yet in a unit. The
// module given to FullyShardedDataParallel is always wrapped (it is the root of the call).
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>

#include "tdc/nn/module.h"

namespace tdc::fsdp1 {

class WrapPolicy {
 public:
  // PyTorch's policy callable: (module, recurse, nonwrapped_numel) -> bool.
  using Fn = std::function<bool(nn::Module& module, bool recurse, int64_t nonwrapped_numel)>;
  WrapPolicy() = default;  // no auto wrapping
  // `name` is for messages ("ModuleWrapPolicy({Linear})"). `module_types`: the types the policy
  // targets, checked against the tree when wrapping (an unknown type is an error).
  WrapPolicy(std::string name, Fn fn, std::set<std::string> module_types = {});
  explicit operator bool() const { return static_cast<bool>(fn_); }
  bool operator()(nn::Module& module, bool recurse, int64_t nonwrapped_numel) const;
  const std::string& name() const { return name_; }
  const std::set<std::string>& module_types() const { return module_types_; }

 private:
  std::string name_ = "none";
  Fn fn_;
  std::set<std::string> module_types_;
};

// Every submodule is its own unit (torch.distributed.fsdp.wrap.always_wrap_policy).
WrapPolicy always_wrap_policy();
// Submodules whose type_name() is one of `module_types` (PyTorch class names). Wrapping throws
// std::invalid_argument when a name matches no module of the tree (a typo wraps nothing silently
// in PyTorch; here it is named, with the types the tree has).
WrapPolicy ModuleWrapPolicy(std::set<std::string> module_types);
// Submodules holding at least `min_num_params` parameters not yet wrapped
// (size_based_auto_wrap_policy; PyTorch's default threshold 1e8).
WrapPolicy size_based_auto_wrap_policy(int64_t min_num_params = 100000000);
// Submodules for which `fn` returns true (lambda_auto_wrap_policy / CustomPolicy without kwargs).
WrapPolicy CustomPolicy(std::function<bool(nn::Module& module)> fn, std::string name = "CustomPolicy");

}  // namespace tdc::fsdp1
