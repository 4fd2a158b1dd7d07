// StateDict: what every state dict in tdc is (a module's, FSDP1's, the state-dict API's, DCP's):
// a flat, ordered map from a dotted key to a tensor, a DTensor or JSON. Nested dicts use dotted
// keys, as DCP flattens them:
//   model:      "layers.0.weight" -> DTensor or tensor, persistent buffers included;
//   optimizer:  "state.layers.0.weight.exp_avg" -> DTensor or tensor (laid out as the parameter),
//               "state.layers.0.weight.step"    -> 0-dim float32 tensor (PyTorch's form),
//               "param_groups"                  -> JSON: [{"lr": ..., ..., "params": [FQNs]}].
// Copying a StateDict copies tensor handles, not data: a loaded entry writes into the tensor the
// model or optimizer holds. The state-dict API (tdc/state_dict/state_dict.h) names these
// checkpoint::StateDict and checkpoint::Value.
#pragma once

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "tdc/tensor/dtensor.h"

namespace tdc::tensor {

using StateDictValue = std::variant<at::Tensor, DTensor, nlohmann::json>;

class StateDict {
 public:
  using Entry = std::pair<std::string, StateDictValue>;
  StateDict() = default;

  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }
  bool contains(const std::string& key) const;
  // Throws std::out_of_range naming the key.
  StateDictValue& at(const std::string& key);
  const StateDictValue& at(const std::string& key) const;
  // Inserts at the end, or replaces the value of an existing key in place.
  void set(const std::string& key, StateDictValue value);
  bool erase(const std::string& key);
  std::vector<std::string> keys() const;

  // Nesting as DCP flattens it: with_prefix("model") has "model.<key>" for every key; sub("model")
  // is the reverse (the entries under "model.", prefix removed). Tensor handles are shared.
  StateDict with_prefix(const std::string& prefix) const;
  StateDict sub(const std::string& prefix) const;
  // Adds every entry of `other` (keys must not exist yet: std::invalid_argument naming one).
  void merge(const StateDict& other);

  auto begin() { return entries_.begin(); }
  auto end() { return entries_.end(); }
  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }

 private:
  std::vector<Entry> entries_;
};

// Convenience accessors (std::invalid_argument naming the key and the kind it holds).
const at::Tensor& as_tensor(const StateDict& sd, const std::string& key);
const DTensor& as_dtensor(const StateDict& sd, const std::string& key);
// The entry's local tensor (a DTensor's local shard, or the tensor).
const at::Tensor& local_tensor(const StateDictValue& value);
// "tensor", "DTensor [Shard(0)] on DeviceMesh(...)", "JSON value": for messages.
std::string kind_name(const StateDictValue& value);
// The entry's global shape (a DTensor's logical shape, or the tensor's); std::invalid_argument for
// a JSON value.
std::vector<int64_t> global_shape(const StateDictValue& value);

}  // namespace tdc::tensor
