// Backends by name. Built-ins: "gloo" (always), "nccl" (when LibTorch has CUDA).
// A plug-in is a shared library exporting
//
//   extern "C" void tdc_register_backends(tdc::comm::BackendRegistry& registry);
//
// which calls registry.add("name", factory) for each c10d::Backend it provides
// (see plugins/example_backend and docs/plugging-in.md).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "tdc/comm/process_group.h"

namespace tdc::comm {

using BackendFactory = std::function<c10::intrusive_ptr<c10d::Backend>(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const GroupOptions& options)>;

class BackendRegistry {
 public:
  static BackendRegistry& instance();

  // Throws std::invalid_argument if `name` is already registered.
  void add(const std::string& name, BackendFactory factory);
  bool has(const std::string& name) const;
  std::vector<std::string> names() const;
  // Throws std::invalid_argument naming the unknown backend and the known ones.
  c10::intrusive_ptr<c10d::Backend> create(const std::string& name, const c10::intrusive_ptr<c10d::Store>& store,
                                           int rank, int size, const GroupOptions& options) const;

  // dlopen()s `path` and calls its tdc_register_backends. Idempotent per path. Throws
  // std::runtime_error naming the library when it cannot be opened or lacks the symbol.
  void load_plugin(const std::string& path);

 private:
  BackendRegistry();
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace tdc::comm

extern "C" {
// The symbol a plug-in exports.
using tdc_register_backends_fn = void (*)(tdc::comm::BackendRegistry&);
}
#define TDC_PLUGIN_REGISTER_SYMBOL "tdc_register_backends"
