#include "tdc/comm/backend_registry.h"

#include <dlfcn.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "internal.h"
#include "tdc/libtorch_compat.h"

namespace tdc::comm {

struct BackendRegistry::Impl {
  // One lock for names and plug-ins: thread-launched ranks load the same plug-in concurrently.
  mutable std::recursive_mutex mu;
  std::map<std::string, BackendFactory> factories;
  std::map<std::string, BackendOps> ops;
  std::set<std::string> loaded_plugins;  // canonical paths
};

BackendRegistry::BackendRegistry() : impl_(std::make_shared<Impl>()) {
  impl_->factories["gloo"] = &detail::make_gloo_backend;
  impl_->ops["gloo"] = {.reduce_scatter = compat::kGlooReduceScatterHonoursOp,
                        .avg = false,
                        .reduce_scatter_by_alltoall = true,
                        .all_gather_by_p2p = true,
                        .gather_by_alltoall = true};
  if (detail::nccl_available()) {
    impl_->factories["nccl"] = &detail::make_nccl_backend;
    impl_->ops["nccl"] = {.reduce_scatter = true, .avg = true};
  }
}

BackendRegistry& BackendRegistry::instance() {
  // Never destroyed: plug-ins' factories live in libraries that are never dlclose()d, and ranks
  // may still create groups while static destructors run in other threads.
  static BackendRegistry* registry = new BackendRegistry();
  return *registry;
}

void BackendRegistry::add(const std::string& name, BackendFactory factory, BackendOps ops) {
  if (name.empty()) throw std::invalid_argument("BackendRegistry::add: backend name is empty");
  if (!factory) {
    throw std::invalid_argument(fmt::format("BackendRegistry::add: backend '{}' has no factory", name));
  }
  std::lock_guard<std::recursive_mutex> lock(impl_->mu);
  if (impl_->factories.count(name) != 0) {
    throw std::invalid_argument(fmt::format("BackendRegistry::add: backend '{}' is already registered", name));
  }
  impl_->factories.emplace(name, std::move(factory));
  impl_->ops[name] = ops;
}

BackendOps BackendRegistry::ops_of(const std::string& name) const {
  std::lock_guard<std::recursive_mutex> lock(impl_->mu);
  auto it = impl_->ops.find(name);
  return it == impl_->ops.end() ? BackendOps{} : it->second;
}

bool BackendRegistry::has(const std::string& name) const {
  std::lock_guard<std::recursive_mutex> lock(impl_->mu);
  return impl_->factories.count(name) != 0;
}

std::vector<std::string> BackendRegistry::names() const {
  std::lock_guard<std::recursive_mutex> lock(impl_->mu);
  std::vector<std::string> out;
  for (const auto& [name, factory] : impl_->factories) out.push_back(name);
  return out;
}

c10::intrusive_ptr<c10d::Backend> BackendRegistry::create(const std::string& name,
                                                          const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                          int size, const GroupOptions& options) const {
  BackendFactory factory;
  {
    std::lock_guard<std::recursive_mutex> lock(impl_->mu);
    auto it = impl_->factories.find(name);
    if (it == impl_->factories.end()) {
      throw std::invalid_argument(
          fmt::format("unknown c10d backend '{}'; known backends: {} (a plug-in adds more: "
                      "BackendRegistry::load_plugin / --tdc_backend_lib)",
                      name, fmt::join(names(), ", ")));
    }
    factory = it->second;
  }
  // Outside the lock: creating a backend is a collective that waits for the other ranks, which
  // (as threads) may need the registry meanwhile.
  auto backend = factory(store, rank, size, options);
  if (!backend) {
    throw std::runtime_error(fmt::format("backend '{}': factory returned no backend", name));
  }
  return backend;
}

void BackendRegistry::load_plugin(const std::string& path) {
  std::error_code ec;
  auto canonical = std::filesystem::canonical(path, ec);
  if (ec) {
    throw std::runtime_error(fmt::format("cannot load backend plug-in '{}': {}", path, ec.message()));
  }
  std::lock_guard<std::recursive_mutex> lock(impl_->mu);
  if (impl_->loaded_plugins.count(canonical.string()) != 0) return;
  // RTLD_LOCAL: plug-ins stay out of each other's way; they reach tdc through libtdc, which
  // the process has loaded already. Never dlclose()d: their factories stay registered.
  void* handle = dlopen(canonical.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    throw std::runtime_error(fmt::format("cannot load backend plug-in '{}': {}", path, err ? err : "dlopen failed"));
  }
  dlerror();
  void* sym = dlsym(handle, TDC_PLUGIN_REGISTER_SYMBOL);
  if (sym == nullptr) {
    dlclose(handle);
    throw std::runtime_error(
        fmt::format("backend plug-in '{}' does not export extern \"C\" {}(tdc::comm::BackendRegistry&)", path,
                    TDC_PLUGIN_REGISTER_SYMBOL));
  }
  reinterpret_cast<tdc_register_backends_fn>(sym)(*this);
  impl_->loaded_plugins.insert(canonical.string());
}

}  // namespace tdc::comm
