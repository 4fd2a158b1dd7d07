// DistributedDataParallel (a wrapper module) and replicate (the same Reducer installed on the
// module itself through forward hooks). The reduction logic is in reducer.cpp.
#include "tdc/ddp/ddp.h"

#include <fmt/ranges.h>

#include "tdc/tensor/module_params.h"

#include <map>
#include <mutex>
#include <stdexcept>

#include <fmt/format.h>

#include "reducer.h"

namespace tdc::ddp {

// ------------------------------------------------------------------------------ DDP
DistributedDataParallel::DistributedDataParallel(nn::ModulePtr module, comm::GroupPtr group, DDPOptions options)
    : nn::Module("DistributedDataParallel"), module_(std::move(module)) {
  if (!module_) throw std::invalid_argument("DistributedDataParallel: module is null");
  register_child("module", module_);  // parameters appear as "module.<fqn>", as in PyTorch
  reducer_ = Reducer::create(*module_, std::move(group), options, "DistributedDataParallel");
}

DistributedDataParallel::~DistributedDataParallel() = default;

nn::Tensors DistributedDataParallel::forward(const nn::Tensors& inputs) {
  reducer_->pre_forward();
  nn::Tensors outputs = (*module_)(inputs);
  reducer_->post_forward(outputs);
  return outputs;
}

nn::ModulePtr DistributedDataParallel::clone_empty() const {
  throw std::logic_error(
      "DistributedDataParallel cannot be copied: deep_copy the wrapped module (ddp.module()) and "
      "wrap the copy");
}

const BackwardStats& DistributedDataParallel::last_backward() const { return reducer_->stats(); }

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& d) : d_(d), previous_(d.reducer_->sync()) {
  d_.reducer_->set_sync(false);
}
DistributedDataParallel::NoSync::~NoSync() { d_.reducer_->set_sync(previous_); }

// ------------------------------------------------------------------------------ replicate
namespace {

// Which modules are replicated, for replicate_last_backward / set_requires_gradient_sync. The
// module's hooks own the Reducer; the registry only observes it.
std::mutex registry_mu;
std::map<const nn::Module*, std::weak_ptr<Reducer>>& registry() {
  static std::map<const nn::Module*, std::weak_ptr<Reducer>> r;
  return r;
}

std::shared_ptr<Reducer> reducer_of(const nn::Module& module, const char* api) {
  std::lock_guard<std::mutex> lock(registry_mu);
  auto it = registry().find(&module);
  std::shared_ptr<Reducer> r = it == registry().end() ? nullptr : it->second.lock();
  if (!r)
    throw std::invalid_argument(
        fmt::format("{}: module of type '{}' was not replicated (call "
                    "tdc::ddp::replicate(module) first)",
                    api, module.type_name()));
  return r;
}

}  // namespace

nn::Module& replicate(nn::Module& module, comm::GroupPtr group, DDPOptions options) {
  {
    std::lock_guard<std::mutex> lock(registry_mu);
    auto it = registry().find(&module);
    if (it != registry().end() && !it->second.expired())
      throw std::invalid_argument(
          fmt::format("replicate: module of type '{}' is already replicated", module.type_name()));
  }
  std::shared_ptr<Reducer> reducer = Reducer::create(module, std::move(group), options, "replicate");
  module.register_forward_pre_hook([reducer](nn::Module&, const nn::Tensors&) -> std::optional<nn::Tensors> {
    reducer->pre_forward();
    return std::nullopt;
  });
  module.register_forward_hook(
      [reducer](nn::Module&, const nn::Tensors&, const nn::Tensors& outputs) -> std::optional<nn::Tensors> {
        reducer->post_forward(outputs);
        return std::nullopt;
      });
  std::lock_guard<std::mutex> lock(registry_mu);
  registry()[&module] = reducer;
  return module;
}

const BackwardStats& replicate_last_backward(nn::Module& module) {
  return reducer_of(module, "replicate_last_backward")->stats();
}

void replicate_set_requires_gradient_sync(nn::Module& module, bool sync) {
  reducer_of(module, "replicate_set_requires_gradient_sync")->set_sync(sync);
}

int pre_dp_module_transform(nn::Module& module) {
  int found = 0;
  for (const auto& np : tensor::named_params_with_specs(module)) {
    if (!np.dtensor) continue;
    ++found;
    std::vector<int64_t> expect = np.dtensor->spec().local_shape();
    if (np.tensor.sizes().vec() != expect) {
      throw std::invalid_argument(fmt::format(
          "pre_dp_module_transform: parameter '{}' has local shape [{}] but its spec {} gives [{}] on this rank",
          np.fqn, fmt::join(np.tensor.sizes(), ", "), np.dtensor->spec().to_string(), fmt::join(expect, ", ")));
    }
  }
  return found;
}

}  // namespace tdc::ddp
