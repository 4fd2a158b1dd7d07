// TwoTensor (tdc/conformance/two_tensor.h): the wrapper TensorImpl and its dispatch kernel.
#include "tdc/conformance/two_tensor.h"

#include <mutex>
#include <stdexcept>
#include <string>

#include <ATen/core/dispatch/Dispatcher.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/library.h>

#include "tdc/core/wrapper_tensor.h"

namespace tdc::conformance {
namespace {

class TwoTensorImpl final : public core::WrapperTensorImpl {
 public:
  TwoTensorImpl(at::Tensor a, at::Tensor b)
      : WrapperTensorImpl(c10::DispatchKeySet(c10::DispatchKey::PrivateUse2), a), a_(std::move(a)), b_(std::move(b)) {}

  std::vector<at::Tensor> parts() const override { return {a_, b_}; }
  const at::Tensor& a() const { return a_; }
  const at::Tensor& b() const { return b_; }

  // detach(), variable_data(), .data: a new wrapper over the same parts.
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(const c10::VariableVersion& version,
                                                              bool allow_metadata_change) const override {
    auto impl = c10::make_intrusive<TwoTensorImpl>(a_, b_);
    copy_tensor_metadata(this, impl.get(), version, allow_metadata_change);
    return impl;
  }
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(c10::VariableVersion&& version,
                                                              bool allow_metadata_change) const override {
    auto impl = c10::make_intrusive<TwoTensorImpl>(a_, b_);
    copy_tensor_metadata(this, impl.get(), std::move(version), allow_metadata_change);
    return impl;
  }
  // set_data() between TwoTensors.
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override {
    const auto* other = dynamic_cast<const TwoTensorImpl*>(impl.get());
    if (!other) throw std::invalid_argument("TwoTensor: set_data from a tensor that is not a TwoTensor");
    copy_tensor_metadata(other, this, version_counter(), allow_tensor_metadata_change());
    a_ = other->a_;
    b_ = other->b_;
  }

 private:
  at::Tensor a_, b_;
};

const TwoTensorImpl* impl_of(const at::Tensor& t) {
  return t.defined() ? dynamic_cast<const TwoTensorImpl*>(t.unsafeGetTensorImpl()) : nullptr;
}

at::Tensor wrap(at::Tensor a, at::Tensor b) {
  return at::Tensor(c10::make_intrusive<TwoTensorImpl>(std::move(a), std::move(b)));
}

// ------------------------------------------------------------------ the kernel

// One side of an argument: a TwoTensor's a or b, lists element-wise, anything else unchanged.
c10::IValue side_of(const c10::IValue& v, bool b) {
  if (v.isTensor()) {
    const auto* two = impl_of(v.toTensor());
    return two ? c10::IValue(b ? two->b() : two->a()) : v;
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) {
      const auto* two = impl_of(t);
      out.push_back(two ? (b ? two->b() : two->a()) : t);
    }
    return out;
  }
  if (v.isList()) {  // Tensor?[] and other generic lists
    c10::impl::GenericList in = v.toList();
    c10::impl::GenericList out(in.elementType());
    for (const c10::IValue& e : in) out.push_back(side_of(e, b));
    return out;
  }
  return v;
}

// A result from the two runs: tensors re-wrapped, anything else a's.
c10::IValue join(const c10::IValue& a, const c10::IValue& b) {
  if (a.isTensor() && b.isTensor()) {
    const at::Tensor& ta = a.toTensor();
    return ta.defined() ? c10::IValue(wrap(ta, b.toTensor())) : a;
  }
  if (a.isTensorList() && b.isTensorList()) {
    auto la = a.toTensorList(), lb = b.toTensorList();
    c10::List<at::Tensor> out;
    for (size_t i = 0; i < la.size(); ++i) out.push_back(wrap(la.get(i), lb.get(i)));
    return out;
  }
  return a;
}

// The argument a result aliases and writes (in-place and out= ops), if any.
std::optional<size_t> written_argument(const c10::FunctionSchema& schema, size_t ret) {
  const c10::AliasInfo* r = schema.returns()[ret].alias_info();
  if (!r || !r->isWrite()) return std::nullopt;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::AliasInfo* a = schema.arguments()[i].alias_info();
    if (a && a->isWrite() && a->beforeSets() == r->beforeSets()) return i;
  }
  return std::nullopt;
}

void two_tensor_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t n = schema.arguments().size();
  std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(n), stack->end());
  torch::jit::drop(*stack, n);
  torch::jit::Stack on_a, on_b;
  for (const auto& v : args) {
    on_a.push_back(side_of(v, false));
    on_b.push_back(side_of(v, true));
  }
  op.callBoxed(&on_a);
  op.callBoxed(&on_b);
  for (size_t i = 0; i < schema.returns().size(); ++i) {
    if (auto w = written_argument(schema, i)) {
      stack->push_back(args[*w]);  // return_and_correct_aliasing: the argument itself
    } else {
      stack->push_back(join(on_a[i], on_b[i]));
    }
  }
}

void register_kernel() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto kernel = [] { return torch::CppFunction::makeFromBoxedFunction<&two_tensor_kernel>(); };
    // Leaked on purpose: the registrations live as long as the process.
    auto* fallback = new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse2, __FILE__, __LINE__);
    fallback->fallback(kernel());
    auto* aten = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse2, __FILE__, __LINE__);
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      auto op = dispatcher.findOp(name);
      if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) continue;
      const std::string short_name = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
      aten->impl(short_name.c_str(), kernel());
    }
  });
}

}  // namespace

at::Tensor two_tensor(const at::Tensor& a, const at::Tensor& b) {
  auto mismatch = [](const char* what, const std::string& x, const std::string& y) {
    return std::invalid_argument(fmt::format("TwoTensor: a and b must have the same {}, got {} and {}", what, x, y));
  };
  if (!a.defined() || !b.defined()) throw std::invalid_argument("TwoTensor: a and b must be defined tensors");
  if (a.sizes() != b.sizes()) throw mismatch("shape", fmt::format("{}", a.sizes()), fmt::format("{}", b.sizes()));
  if (a.strides() != b.strides())
    throw mismatch("strides", fmt::format("{}", a.strides()), fmt::format("{}", b.strides()));
  if (a.storage_offset() != b.storage_offset())
    throw mismatch("storage offset", std::to_string(a.storage_offset()), std::to_string(b.storage_offset()));
  if (a.scalar_type() != b.scalar_type())
    throw mismatch("dtype", c10::toString(a.scalar_type()), c10::toString(b.scalar_type()));
  if (a.device() != b.device()) throw mismatch("device", a.device().str(), b.device().str());
  if (a.layout() != b.layout()) throw mismatch("layout", c10::str(a.layout()), c10::str(b.layout()));
  if (is_two_tensor(a) || is_two_tensor(b)) throw std::invalid_argument("TwoTensor: a and b must be plain tensors");
  register_kernel();
  at::Tensor out = wrap(a.detach(), b.detach());
  if (a.requires_grad()) out.requires_grad_(true);
  return out;
}

bool is_two_tensor(const at::Tensor& t) { return impl_of(t) != nullptr; }

TwoParts two_parts(const at::Tensor& t, const char* who) {
  const auto* two = impl_of(t);
  if (!two) {
    throw std::invalid_argument(fmt::format("{}: expected a TwoTensor, got a plain {} tensor", who,
                                            t.defined() ? c10::toString(t.scalar_type()) : "undefined"));
  }
  return {two->a(), two->b()};
}

}  // namespace tdc::conformance
