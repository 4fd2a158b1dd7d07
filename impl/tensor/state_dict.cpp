// StateDict (tdc/tensor/state_dict.h).
#include "tdc/tensor/state_dict.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "tdc/tensor/placement.h"

namespace tdc::tensor {

// ------------------------------------------------------------------ StateDict

bool StateDict::contains(const std::string& key) const {
  return std::any_of(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.first == key; });
}

StateDictValue& StateDict::at(const std::string& key) {
  for (auto& e : entries_) {
    if (e.first == key) return e.second;
  }
  throw std::out_of_range(fmt::format("state dict has no key '{}' ({} keys)", key, entries_.size()));
}

const StateDictValue& StateDict::at(const std::string& key) const { return const_cast<StateDict*>(this)->at(key); }

void StateDict::set(const std::string& key, StateDictValue value) {
  for (auto& e : entries_) {
    if (e.first == key) {
      e.second = std::move(value);
      return;
    }
  }
  entries_.emplace_back(key, std::move(value));
}

bool StateDict::erase(const std::string& key) {
  auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.first == key; });
  if (it == entries_.end()) return false;
  entries_.erase(it);
  return true;
}

std::vector<std::string> StateDict::keys() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.first);
  return out;
}

StateDict StateDict::with_prefix(const std::string& prefix) const {
  StateDict out;
  for (const auto& [k, v] : entries_) out.entries_.emplace_back(prefix + "." + k, v);
  return out;
}

StateDict StateDict::sub(const std::string& prefix) const {
  StateDict out;
  const std::string p = prefix + ".";
  for (const auto& [k, v] : entries_) {
    if (k.starts_with(p)) out.entries_.emplace_back(k.substr(p.size()), v);
  }
  return out;
}

void StateDict::merge(const StateDict& other) {
  for (const auto& [k, v] : other.entries_) {
    if (contains(k)) throw std::invalid_argument(fmt::format("StateDict::merge: key '{}' is in both dicts", k));
  }
  for (const auto& e : other.entries_) entries_.push_back(e);
}

const at::Tensor& as_tensor(const StateDict& sd, const std::string& key) {
  const StateDictValue& v = sd.at(key);
  if (const auto* t = std::get_if<at::Tensor>(&v)) return *t;
  throw std::invalid_argument(fmt::format("state dict key '{}' holds a {}, not a tensor", key, kind_name(v)));
}

const DTensor& as_dtensor(const StateDict& sd, const std::string& key) {
  const StateDictValue& v = sd.at(key);
  if (const auto* d = std::get_if<DTensor>(&v)) return *d;
  throw std::invalid_argument(fmt::format("state dict key '{}' holds a {}, not a DTensor", key, kind_name(v)));
}

std::string kind_name(const StateDictValue& value) {
  if (const auto* d = std::get_if<DTensor>(&value)) {
    return fmt::format("DTensor {} on {}", to_string(d->placements()), d->device_mesh().to_string());
  }
  if (std::holds_alternative<at::Tensor>(value)) return "tensor";
  return "JSON value";
}

std::vector<int64_t> global_shape(const StateDictValue& value) {
  if (const auto* d = std::get_if<DTensor>(&value)) return d->shape();
  if (const auto* t = std::get_if<at::Tensor>(&value)) return t->sizes().vec();
  throw std::invalid_argument("tdc::checkpoint: a JSON value has no shape");
}

const at::Tensor& local_tensor(const StateDictValue& value) {
  if (const auto* d = std::get_if<DTensor>(&value)) return d->to_local();
  if (const auto* t = std::get_if<at::Tensor>(&value)) return *t;
  throw std::invalid_argument("tdc::checkpoint: a JSON value has no tensor");
}

}  // namespace tdc::tensor
