// FSDP1's enums, FQN cleaning and the lifecycle error (common.h).
#include "common.h"

#include <fmt/format.h>

#include <stdexcept>

namespace tdc::fsdp1 {

const char* to_string(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::FULL_SHARD:
      return "FULL_SHARD";
    case ShardingStrategy::SHARD_GRAD_OP:
      return "SHARD_GRAD_OP";
    case ShardingStrategy::NO_SHARD:
      return "NO_SHARD";
    case ShardingStrategy::HYBRID_SHARD:
      return "HYBRID_SHARD";
    case ShardingStrategy::_HYBRID_SHARD_ZERO2:
      return "_HYBRID_SHARD_ZERO2";
  }
  return "?";
}

const char* to_string(BackwardPrefetch prefetch) {
  return prefetch == BackwardPrefetch::BACKWARD_PRE ? "BACKWARD_PRE" : "BACKWARD_POST";
}

const char* to_string(StateDictType type) {
  switch (type) {
    case StateDictType::FULL_STATE_DICT:
      return "FULL_STATE_DICT";
    case StateDictType::LOCAL_STATE_DICT:
      return "LOCAL_STATE_DICT";
    case StateDictType::SHARDED_STATE_DICT:
      return "SHARDED_STATE_DICT";
  }
  return "?";
}

const char* to_string(TrainingState state) {
  switch (state) {
    case TrainingState::IDLE:
      return "IDLE";
    case TrainingState::FORWARD_BACKWARD:
      return "FORWARD_BACKWARD";
    case TrainingState::SUMMON_FULL_PARAMS:
      return "SUMMON_FULL_PARAMS";
  }
  return "?";
}

const char* to_string(HandleTrainingState state) {
  switch (state) {
    case HandleTrainingState::IDLE:
      return "IDLE";
    case HandleTrainingState::FORWARD:
      return "FORWARD";
    case HandleTrainingState::BACKWARD_PRE:
      return "BACKWARD_PRE";
    case HandleTrainingState::BACKWARD_POST:
      return "BACKWARD_POST";
    case HandleTrainingState::SUMMON_FULL_PARAMS:
      return "SUMMON_FULL_PARAMS";
  }
  return "?";
}

namespace detail {

std::string clean_fqn(const std::string& fqn) {
  const std::string seg = kWrappedModuleName;
  std::string out;
  size_t start = 0;
  while (start <= fqn.size()) {
    size_t dot = fqn.find('.', start);
    if (dot == std::string::npos) dot = fqn.size();
    std::string part = fqn.substr(start, dot - start);
    if (part != seg && !part.empty()) out += (out.empty() ? "" : ".") + part;
    start = dot + 1;
  }
  return out;
}

void throw_lifecycle_error(const std::string& who, const char* action, const std::string& now,
                           const std::string& expected) {
  throw std::logic_error(fmt::format("FSDP unit {}: {} while {}; it needs {}", who, action, now, expected));
}

std::string join_fqn(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

std::vector<std::pair<std::string, FullyShardedDataParallel*>> named_units(nn::Module& root) {
  std::vector<std::pair<std::string, FullyShardedDataParallel*>> out;
  for (auto& [fqn, m] : root.named_modules_tdc()) {
    if (auto* u = dynamic_cast<FullyShardedDataParallel*>(m)) out.emplace_back(clean_fqn(fqn), u);
  }
  return out;
}

}  // namespace detail
}  // namespace tdc::fsdp1
