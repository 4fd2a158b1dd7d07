// tdc::nn::Module: hooks, parameter indirection, PyTorch-style tree queries, deep copy.
#include "tdc/nn/module.h"

#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace tdc::nn {

namespace detail {
// checkpoint.cpp: the call operator's path for a checkpointed module.
Tensors checkpointed_call(Module& module, Tensors inputs);
}  // namespace detail

namespace {

thread_local int g_copy_depth = 0;

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

std::string quoted_list(const std::vector<std::string>& names) {
  if (names.empty()) return "none";
  std::string out;
  for (const auto& n : names) {
    if (!out.empty()) out += ", ";
    out += "'" + n + "'";
  }
  return out;
}

// Thrown by the default clone_empty(); deep_copy adds the FQN.
struct NotCopyable : std::logic_error {
  using std::logic_error::logic_error;
};

// PyTorch's named_modules(): pre-order, self first, each module once (at its first path).
// Walks LibTorch children too, so parameters of non-tdc children are not lost.
void walk(const torch::nn::Module& m, const std::string& prefix, std::unordered_set<const torch::nn::Module*>& seen,
          std::vector<std::pair<std::string, const torch::nn::Module*>>& out) {
  if (!seen.insert(&m).second) return;
  out.emplace_back(prefix, &m);
  for (const auto& item : m.named_children()) walk(*item.value(), join(prefix, item.key()), seen, out);
}

std::vector<std::pair<std::string, const torch::nn::Module*>> all_modules(const torch::nn::Module& root,
                                                                          const std::string& prefix) {
  std::unordered_set<const torch::nn::Module*> seen;
  std::vector<std::pair<std::string, const torch::nn::Module*>> out;
  walk(root, prefix, seen, out);
  return out;
}

const char* hook_kind(bool pre) { return pre ? "forward pre-hook" : "forward hook"; }

void check_replacement(const Module& m, bool pre, const Tensors& before, const Tensors& after) {
  const char* what = pre ? "inputs" : "outputs";
  if (after.size() != before.size()) {
    throw std::invalid_argument("tdc::nn: " + std::string(hook_kind(pre)) + " of module type '" + m.type_name() +
                                "' returned " + std::to_string(after.size()) + " " + what + ", but it received " +
                                std::to_string(before.size()) + "; a replacement must have as many " + what +
                                " as the hook received (return nullopt to keep them)");
  }
  for (size_t i = 0; i < after.size(); ++i) {
    if (!after[i].defined() && before[i].defined()) {
      throw std::invalid_argument("tdc::nn: " + std::string(hook_kind(pre)) + " of module type '" + m.type_name() +
                                  "' returned an undefined tensor for " + (pre ? "input " : "output ") +
                                  std::to_string(i) + " (the tensor it replaces is defined)");
    }
  }
}

}  // namespace

bool deep_copy_in_progress() { return g_copy_depth > 0; }

// ------------------------------------------------------------------ hooks

struct Module::Hooks {
  struct Entry {
    uint64_t id;
    ForwardPreHook pre;
    ForwardHook post;
    bool removed = false;
    std::shared_ptr<std::function<void()>> remover;
  };
  std::vector<std::shared_ptr<Entry>> pre, post;
  uint64_t next_id = 0;
};

void HookHandle::remove() {
  if (auto fn = remover_.lock()) (*fn)();  // the local copy keeps the remover alive while it runs
  remover_.reset();
}

bool HookHandle::active() const { return !remover_.expired(); }

namespace {
template <class Hooks, class Entry>
std::weak_ptr<std::function<void()>> install(const std::shared_ptr<Hooks>& hooks,
                                             std::vector<std::shared_ptr<Entry>> Hooks::*list,
                                             std::shared_ptr<Entry> entry) {
  entry->id = hooks->next_id++;
  std::weak_ptr<Hooks> weak = hooks;
  uint64_t id = entry->id;
  entry->remover = std::make_shared<std::function<void()>>([weak, list, id] {
    auto h = weak.lock();
    if (!h) return;
    auto& v = (*h).*list;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if ((*it)->id == id) {
        (*it)->removed = true;
        auto keep = *it;  // the remover being run lives in the entry
        v.erase(it);
        return;
      }
    }
  });
  std::weak_ptr<std::function<void()>> out = entry->remover;
  ((*hooks).*list).push_back(std::move(entry));
  return out;
}
}  // namespace

Module::Module(std::string type_name)
    : torch::nn::Module(type_name), type_name_(std::move(type_name)), hooks_(std::make_shared<Hooks>()) {}

Module::~Module() = default;

HookHandle Module::register_forward_pre_hook(ForwardPreHook hook) {
  if (!hook) throw std::invalid_argument("register_forward_pre_hook: empty hook for module type '" + type_name_ + "'");
  auto e = std::make_shared<Hooks::Entry>();
  e->pre = std::move(hook);
  HookHandle h;
  h.remover_ = install(hooks_, &Hooks::pre, std::move(e));
  return h;
}

HookHandle Module::register_forward_hook(ForwardHook hook) {
  if (!hook) throw std::invalid_argument("register_forward_hook: empty hook for module type '" + type_name_ + "'");
  auto e = std::make_shared<Hooks::Entry>();
  e->post = std::move(hook);
  HookHandle h;
  h.remover_ = install(hooks_, &Hooks::post, std::move(e));
  return h;
}

Tensors Module::operator()(Tensors inputs) {
  if (checkpointed_) return detail::checkpointed_call(*this, std::move(inputs));
  return call_uncheckpointed(std::move(inputs));
}

at::Tensor Module::operator()(const at::Tensor& input) {
  Tensors out = (*this)(Tensors{input});
  if (out.empty()) {
    throw std::runtime_error("tdc::nn: module of type '" + type_name_ + "' returned no outputs");
  }
  return out[0];
}

Tensors Module::call_uncheckpointed(Tensors inputs) {
  if (hooks_->pre.empty() && hooks_->post.empty()) {
    Tensors outputs = forward(inputs);
    transformed_.clear();
    return outputs;
  }
  if (!hooks_->pre.empty()) {
    auto snapshot = hooks_->pre;  // a hook may remove itself or others
    for (const auto& e : snapshot) {
      if (e->removed) continue;
      if (auto replaced = e->pre(*this, inputs)) {
        check_replacement(*this, true, inputs, *replaced);
        inputs = std::move(*replaced);
      }
    }
  }
  Tensors outputs = forward(inputs);
  transformed_.clear();  // the transformed parameters live in the autograd graph, not here
  if (!hooks_->post.empty()) {
    auto snapshot = hooks_->post;
    for (const auto& e : snapshot) {
      if (e->removed) continue;
      if (auto replaced = e->post(*this, inputs, outputs)) {
        check_replacement(*this, false, outputs, *replaced);
        outputs = std::move(*replaced);
      }
    }
  }
  return outputs;
}

Module& Module::child(const std::string& name) const {
  auto children = named_children();
  if (auto* c = children.find(name)) {
    if (auto* m = dynamic_cast<Module*>(c->get())) return *m;
    throw std::invalid_argument("tdc::nn: child '" + name + "' of module type '" + type_name_ +
                                "' is not a tdc::nn::Module");
  }
  throw_unknown("child", name);
}

// ------------------------------------------------------------------ parameters

void Module::throw_unknown(const char* what, const std::string& name) const {
  std::vector<std::string> known;
  std::string kind = what;
  if (kind == "parameter") {
    for (const auto& item : parameters_) known.push_back(item.key());
  } else if (kind == "buffer") {
    for (const auto& item : bufs_) known.push_back(item.key());
  } else {
    for (const auto& item : named_children()) known.push_back(item.key());
  }
  std::string plural = kind == "child" ? "children" : kind + "s";
  throw std::invalid_argument("tdc::nn: module of type '" + type_name_ + "' has no " + kind + " '" + name + "' (its " +
                              plural + ": " + quoted_list(known) + ")");
}

at::Tensor& Module::register_param(const std::string& name, at::Tensor tensor, bool requires_grad) {
  return register_parameter(name, std::move(tensor), requires_grad);
}

at::Tensor& Module::register_buf(const std::string& name, at::Tensor tensor, bool persistent) {
  register_buffer(name, tensor);  // checks the name; same tensor in both registries
  if (!persistent) non_persistent_.push_back(name);
  return bufs_.insert(name, std::move(tensor));
}

const at::Tensor& Module::p(const std::string& name) const {
  const at::Tensor* base = nullptr;
  if (!substitutes_.empty()) {
    auto it = substitutes_.find(name);
    if (it != substitutes_.end()) base = &it->second;
  }
  if (!base) base = parameters_.find(name);
  if (!base) throw_unknown("parameter", name);
  if (transforms_.empty()) return *base;
  auto tr = transforms_.find(name);
  if (tr == transforms_.end()) return *base;
  at::Tensor t = *base;
  for (const auto& fn : tr->second) t = fn(t);
  return transformed_[name] = std::move(t);
}

void Module::add_param_transform(const std::string& name, ParamTransform fn) {
  if (!parameters_.contains(name)) throw_unknown("parameter", name);
  if (!fn)
    throw std::invalid_argument("add_param_transform: empty function for parameter '" + name + "' of module type '" +
                                type_name_ + "'");
  transforms_[name].push_back(std::move(fn));
}

bool Module::has_param_transform(const std::string& name) const { return transforms_.count(name) > 0; }

const at::Tensor& Module::b(const std::string& name) const {
  if (const at::Tensor* t = bufs_.find(name)) return *t;
  throw_unknown("buffer", name);
}

bool Module::is_persistent_buf(const std::string& name) const {
  if (!bufs_.contains(name)) throw_unknown("buffer", name);
  return std::find(non_persistent_.begin(), non_persistent_.end(), name) == non_persistent_.end();
}

void Module::set_param_substitute(const std::string& name, at::Tensor tensor) {
  if (!parameters_.contains(name)) throw_unknown("parameter", name);
  if (!tensor.defined()) {
    throw std::invalid_argument("set_param_substitute: undefined tensor for parameter '" + name + "' of module type '" +
                                type_name_ + "'");
  }
  substitutes_[name] = std::move(tensor);
}

void Module::clear_param_substitute(const std::string& name) { substitutes_.erase(name); }
void Module::clear_param_substitutes() { substitutes_.clear(); }
bool Module::has_param_substitute(const std::string& name) const { return substitutes_.count(name) != 0; }

void Module::replace_param(const std::string& name, at::Tensor tensor) {
  at::Tensor* slot = parameters_.find(name);
  if (!slot) throw_unknown("parameter", name);
  *slot = std::move(tensor);
}

void Module::tie_param(const std::string& name, const at::Tensor& tensor) {
  if (!tensor.defined()) {
    throw std::invalid_argument("tie_param: undefined tensor for parameter '" + name + "' of module type '" +
                                type_name_ + "'");
  }
  if (at::Tensor* slot = parameters_.find(name)) {
    *slot = tensor;
  } else {
    if (name.empty() || name.find('.') != std::string::npos) {
      throw std::invalid_argument("tie_param: bad parameter name '" + name + "' for module type '" + type_name_ + "'");
    }
    parameters_.insert(name, tensor);
  }
}

void Module::set_param_meta(const std::string& name, std::any meta) {
  if (!parameters_.contains(name)) throw_unknown("parameter", name);
  meta_[name] = std::move(meta);
}

const std::any* Module::param_meta(const std::string& name) const {
  auto it = meta_.find(name);
  return it == meta_.end() ? nullptr : &it->second;
}

// ------------------------------------------------------------------ tree

std::vector<std::pair<std::string, ModulePtr>> Module::named_children_tdc() const {
  std::vector<std::pair<std::string, ModulePtr>> out;
  for (const auto& item : named_children()) {
    if (auto m = std::dynamic_pointer_cast<Module>(item.value())) out.emplace_back(item.key(), std::move(m));
  }
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules_tdc(const std::string& prefix) const {
  std::vector<std::pair<std::string, Module*>> out;
  for (auto& [name, m] : all_modules(*this, prefix)) {
    if (auto* t = dynamic_cast<const Module*>(m)) out.emplace_back(name, const_cast<Module*>(t));
  }
  return out;
}

namespace {
// Parameters or buffers of `root` (and its tree when `recurse`) in PyTorch order, each tensor once
// (tied / shared ones at their first FQN). `direct` lists one module's own tensors.
using DirectTensors = torch::OrderedDict<std::string, at::Tensor> (*)(const torch::nn::Module&);
std::vector<std::pair<std::string, at::Tensor>> unique_named_tensors(const Module& root, bool recurse,
                                                                     DirectTensors direct) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  auto add = [&](const std::string& prefix, const torch::nn::Module& m) {
    for (const auto& item : direct(m)) {
      const at::Tensor& t = item.value();
      if (!t.defined() || !seen.insert(t.unsafeGetTensorImpl()).second) continue;
      out.emplace_back(join(prefix, item.key()), t);
    }
  };
  if (!recurse) {
    add("", root);
    return out;
  }
  for (auto& [name, m] : all_modules(root, "")) add(name, *m);
  return out;
}
}  // namespace

std::vector<std::pair<std::string, at::Tensor>> Module::named_params(bool recurse) const {
  return unique_named_tensors(*this, recurse,
                              [](const torch::nn::Module& m) { return m.named_parameters(/*recurse=*/false); });
}

std::vector<at::Tensor> Module::params(bool recurse) const {
  std::vector<at::Tensor> out;
  for (auto& item : named_params(recurse)) out.push_back(std::move(item.second));
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Module::named_bufs(bool recurse) const {
  return unique_named_tensors(*this, recurse,
                              [](const torch::nn::Module& m) { return m.named_buffers(/*recurse=*/false); });
}

Module& Module::submodule(const std::string& path) {
  Module* cur = this;
  if (path.empty()) return *cur;
  std::string walked;
  size_t start = 0;
  for (;;) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    auto children = cur->named_children();
    auto* c = children.find(part);
    if (!c) {
      std::vector<std::string> names;
      for (const auto& item : children) names.push_back(item.key());
      throw std::invalid_argument("submodule: no module at '" + path + "': module '" + walked + "' (type '" +
                                  cur->type_name() + "') has no child '" + part +
                                  "' (its children: " + quoted_list(names) + ")");
    }
    auto* next = dynamic_cast<Module*>(c->get());
    if (!next) {
      throw std::invalid_argument("submodule: '" + join(walked, part) + "' on the way to '" + path +
                                  "' is not a tdc::nn::Module");
    }
    cur = next;
    walked = join(walked, part);
    if (dot == std::string::npos) return *cur;
    start = dot + 1;
  }
}

std::pair<Module*, std::string> Module::owner_of(const std::string& fqn) {
  size_t dot = fqn.rfind('.');
  std::string prefix = dot == std::string::npos ? "" : fqn.substr(0, dot);
  std::string name = dot == std::string::npos ? fqn : fqn.substr(dot + 1);
  Module& m = submodule(prefix);
  if (m.parameters_.contains(name) || m.bufs_.contains(name)) return {&m, name};
  std::vector<std::string> names;
  for (const auto& item : m.parameters_) names.push_back(item.key());
  for (const auto& item : m.bufs_) names.push_back(item.key());
  throw std::invalid_argument("owner_of: no parameter or buffer '" + fqn + "': module '" + prefix + "' (type '" +
                              m.type_name() + "') has " + quoted_list(names));
}

// ------------------------------------------------------------------ deep copy

ModulePtr Module::clone_empty() const {
  throw NotCopyable("module of type '" + type_name_ + "' cannot be copied: it does not implement clone_empty()");
}

struct ModuleCopier {
  std::unordered_map<const torch::nn::Module*, ModulePtr> modules;  // original -> copy
  std::unordered_map<const c10::TensorImpl*, at::Tensor> tensors;   // original -> copy
  std::unordered_set<const torch::nn::Module*> used;                // copies already placed

  static std::string where(const std::string& fqn) { return fqn.empty() ? "(root)" : fqn; }

  ModulePtr clone_of(const Module& m, const std::string& fqn) {
    ModulePtr c;
    ++g_copy_depth;
    try {
      c = m.clone_empty();
    } catch (const NotCopyable&) {
      --g_copy_depth;
      throw std::invalid_argument("deep_copy: module '" + where(fqn) + "' of type '" + m.type_name() +
                                  "' cannot be copied: it does not implement clone_empty()");
    } catch (...) {
      --g_copy_depth;
      throw;
    }
    --g_copy_depth;
    if (!c) {
      throw std::invalid_argument("deep_copy: clone_empty() of module '" + where(fqn) + "' (type '" + m.type_name() +
                                  "') returned null");
    }
    return c;
  }

  at::Tensor copy(const at::Tensor& t) {
    if (!t.defined()) return t;
    auto it = tensors.find(t.unsafeGetTensorImpl());
    if (it != tensors.end()) return it->second;
    at::Tensor c;
    {
      at::NoGradGuard no_grad;
      c = t.detach().clone();
    }
    if (t.requires_grad()) c.set_requires_grad(true);
    tensors.emplace(t.unsafeGetTensorImpl(), c);
    return c;
  }

  // Makes `dst` (a clone_empty() result or a child it built) equal to `src`.
  void copy_into(const Module& src, const ModulePtr& dst, const std::string& fqn) {
    modules[&src] = dst;
    used.insert(dst.get());
    dst->train(src.is_training());  // recursive; children set their own mode below

    // parameters: exactly src's names and order
    dst->parameters_.clear();
    for (const auto& item : src.parameters_) dst->parameters_.insert(item.key(), copy(item.value()));
    dst->meta_ = src.meta_;

    // buffers: dst registered its own (in both registries); refill them in place
    for (const auto& item : src.bufs_) {
      at::Tensor c = copy(item.value());
      if (at::Tensor* slot = dst->bufs_.find(item.key())) {
        if (slot->defined() && c.defined() && slot->unsafeGetTensorImpl() != c.unsafeGetTensorImpl()) {
          slot->set_data(c);
          tensors[item.value().unsafeGetTensorImpl()] = *slot;
        }
      } else {
        bool persistent = src.is_persistent_buf(item.key());
        dst->register_buf(item.key(), c, persistent);
      }
    }
    dst->non_persistent_ = src.non_persistent_;

    // children: src's names and order; reuse a child dst built of the same type
    auto existing = dst->named_children();
    std::vector<std::pair<std::string, ModulePtr>> wanted;
    for (const auto& item : src.named_children()) {
      const std::string child_fqn = fqn.empty() ? item.key() : fqn + "." + item.key();
      const auto* sc = dynamic_cast<const Module*>(item.value().get());
      if (!sc) {
        throw std::invalid_argument("deep_copy: module '" + where(child_fqn) + "' (child '" + item.key() +
                                    "' of module type '" + src.type_name() + "', LibTorch type '" +
                                    item.value()->name() + "') is not a tdc::nn::Module and cannot be copied");
      }
      auto done = modules.find(sc);
      if (done != modules.end()) {  // shared module: the same copy again
        wanted.emplace_back(item.key(), done->second);
        continue;
      }
      ModulePtr target;
      if (auto* have = existing.find(item.key())) {
        auto m = std::dynamic_pointer_cast<Module>(*have);
        if (m && typeid(*m) == typeid(*sc) && !used.count(m.get())) target = m;
      }
      if (!target) target = clone_of(*sc, child_fqn);
      copy_into(*sc, target, child_fqn);
      wanted.emplace_back(item.key(), target);
    }
    for (const auto& item : existing) dst->unregister_module(item.key());
    for (auto& [name, m] : wanted) dst->register_module(name, m);
  }
};

ModulePtr Module::deep_copy() const {
  ModuleCopier copier;
  ModulePtr root = copier.clone_of(*this, "");
  copier.copy_into(*this, root, "");
  return root;
}

}  // namespace tdc::nn
