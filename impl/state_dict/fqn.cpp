// PyTorch FQNs without wrapper segments (fqn.h).
#include "fqn.h"

#include <sstream>
#include <vector>

#include <stdexcept>

#include <fmt/format.h>

#include "tdc/ddp/ddp.h"
#include "tdc/fsdp1/fully_sharded_data_parallel.h"

namespace tdc::checkpoint::detail {

std::string wrapper_child(const nn::Module& module) {
  if (dynamic_cast<const ddp::DistributedDataParallel*>(&module)) return "module";
  if (dynamic_cast<const fsdp1::FullyShardedDataParallel*>(&module)) return "_fsdp_wrapped_module";
  return "";
}

fsdp1::FullyShardedDataParallel* fsdp1_root(nn::Module& model) {
  if (auto* root = dynamic_cast<fsdp1::FullyShardedDataParallel*>(&model)) return root;
  for (const auto& [fqn, m] : model.named_modules_tdc()) {
    if (dynamic_cast<fsdp1::FullyShardedDataParallel*>(m)) {
      throw std::invalid_argument(fmt::format(
          "tdc::checkpoint: {} is not an FSDP1 wrapper but holds one at '{}'; state dicts of FSDP1 models need the "
          "root wrapped too (FullyShardedDataParallel::make on the whole model)",
          model.type_name(), fqn));
    }
  }
  return nullptr;
}

std::string clean_fqn(nn::Module& root, const std::string& fqn) {
  std::vector<std::string> parts;
  std::stringstream ss(fqn);
  for (std::string part; std::getline(ss, part, '.');) parts.push_back(part);
  std::string out;
  nn::Module* m = &root;
  for (size_t i = 0; i < parts.size(); ++i) {
    const bool last = i + 1 == parts.size();
    const bool hidden = !last && m && wrapper_child(*m) == parts[i];
    if (!hidden) out += (out.empty() ? "" : ".") + parts[i];
    if (!last && m) {
      nn::Module* next = nullptr;
      for (const auto& [name, child] : m->named_children_tdc()) {
        if (name == parts[i]) next = child.get();
      }
      m = next;
    }
  }
  return out;
}

std::map<const void*, std::string> param_fqns(nn::Module& root) {
  std::map<const void*, std::string> out;
  for (const auto& [fqn, t] : root.named_params()) out.emplace(t.unsafeGetTensorImpl(), clean_fqn(root, fqn));
  return out;
}

}  // namespace tdc::checkpoint::detail
