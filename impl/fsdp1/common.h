// FSDP1's shared vocabulary inside libtdc: names, the lifecycle check, the test-observer calls.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "tdc/core/lifecycle.h"
#include "tdc/fsdp1/fully_sharded_data_parallel.h"

namespace tdc::fsdp1::detail {

class FlatParamHandle;

inline constexpr const char* kFlatParamName = "_flat_param";
inline constexpr const char* kWrappedModuleName = "_fsdp_wrapped_module";

// `fqn` without the FSDP wrapper segments ("_fsdp_wrapped_module."), as PyTorch's state dicts.
std::string clean_fqn(const std::string& fqn);

// Every FSDP unit of `root`'s tree, pre-order, with its FQN (wrapper segments removed).
std::vector<std::pair<std::string, FullyShardedDataParallel*>> named_units(nn::Module& root);
// "<prefix>.<name>", or `name` when the prefix is empty.
std::string join_fqn(const std::string& prefix, const std::string& name);

// Throws std::logic_error "FSDP unit <who>: <action> while <state>; it needs <expected>".
[[noreturn]] void throw_lifecycle_error(const std::string& who, const char* action, const std::string& now,
                                        const std::string& expected);
template <class State>
void check_state(const std::string& who, const char* action, State now, std::initializer_list<State> allowed) {
  core::check_transition(now, allowed, [&](const std::string& state, const std::string& expected) {
    throw_lifecycle_error(who, action, state, expected);
  });
}

}  // namespace tdc::fsdp1::detail

namespace tdc::fsdp1::testing::detail {
// Calls the calling thread's observers (testing.h), if any.
void notify_register_pre_backward_hooks();
void notify_register_post_backward_hook();
void notify_unsharded_views(bool as_params);
void notify_before_reshard(const fsdp1::detail::FlatParamHandle& handle);
}  // namespace tdc::fsdp1::testing::detail
