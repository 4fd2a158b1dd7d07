// FSDP1 auto-wrap policies (wrap.h).
#include "tdc/fsdp1/wrap.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>

namespace tdc::fsdp1 {

WrapPolicy::WrapPolicy(std::string name, Fn fn, std::set<std::string> module_types)
    : name_(std::move(name)), fn_(std::move(fn)), module_types_(std::move(module_types)) {
  if (!fn_) throw std::invalid_argument(fmt::format("WrapPolicy '{}': empty function", name_));
}

bool WrapPolicy::operator()(nn::Module& module, bool recurse, int64_t nonwrapped_numel) const {
  return fn_ && fn_(module, recurse, nonwrapped_numel);
}

WrapPolicy always_wrap_policy() {
  return WrapPolicy("always_wrap_policy", [](nn::Module&, bool, int64_t) { return true; });
}

WrapPolicy ModuleWrapPolicy(std::set<std::string> module_types) {
  if (module_types.empty()) throw std::invalid_argument("ModuleWrapPolicy: no module types given");
  auto types = module_types;
  return WrapPolicy(
      fmt::format("ModuleWrapPolicy({{{}}})", fmt::join(module_types, ", ")),
      [types](nn::Module& m, bool recurse, int64_t) { return recurse || types.count(m.type_name()) > 0; },
      std::move(module_types));
}

WrapPolicy size_based_auto_wrap_policy(int64_t min_num_params) {
  if (min_num_params < 0) {
    throw std::invalid_argument(fmt::format("size_based_auto_wrap_policy: min_num_params {} < 0", min_num_params));
  }
  return WrapPolicy(fmt::format("size_based_auto_wrap_policy({})", min_num_params),
                    [min_num_params](nn::Module&, bool recurse, int64_t n) { return recurse || n >= min_num_params; });
}

WrapPolicy CustomPolicy(std::function<bool(nn::Module& module)> fn, std::string name) {
  if (!fn) throw std::invalid_argument(fmt::format("{}: empty function", name));
  return WrapPolicy(std::move(name),
                    [fn = std::move(fn)](nn::Module& m, bool recurse, int64_t) { return recurse || fn(m); });
}

}  // namespace tdc::fsdp1
