// State-dict checks for conformance tests (state_dict_checks.h).
#include "tdc/conformance/state_dict_checks.h"

#include <set>

#include <ATen/ATen.h>

#include "tdc/conformance/checks.h"

namespace tdc::conformance {

using checkpoint::StateDict;
using checkpoint::Value;

::testing::AssertionResult state_dicts_equal(const StateDict& actual, const StateDict& expected) {
  const auto ak = actual.keys(), ek = expected.keys();
  if (std::set(ak.begin(), ak.end()) != std::set(ek.begin(), ek.end())) {
    auto r = ::testing::AssertionFailure() << "the key sets differ; actual:";
    for (const auto& k : ak) r << " " << k;
    r << "; expected:";
    for (const auto& k : ek) r << " " << k;
    return r;
  }
  for (const auto& key : ek) {
    const Value& a = actual.at(key);
    const Value& e = expected.at(key);
    if (a.index() != e.index()) return ::testing::AssertionFailure() << "'" << key << "': entries of different kinds";
    if (const auto* ej = std::get_if<nlohmann::json>(&e)) {
      if (std::get<nlohmann::json>(a) != *ej) {
        return ::testing::AssertionFailure()
               << "'" << key << "': " << std::get<nlohmann::json>(a).dump() << " != " << ej->dump();
      }
      continue;
    }
    if (const auto* ed = std::get_if<tensor::DTensor>(&e)) {
      const auto& ad = std::get<tensor::DTensor>(a);
      if (!(ad.device_mesh() == ed->device_mesh()) || ad.placements() != ed->placements() ||
          ad.shape() != ed->shape()) {
        return ::testing::AssertionFailure()
               << "'" << key << "': " << ad.spec().to_string() << " != " << ed->spec().to_string();
      }
    }
    const at::Tensor at_ = checkpoint::local_tensor(a).detach().cpu(), et = checkpoint::local_tensor(e).detach().cpu();
    if (at_.scalar_type() != et.scalar_type() || at_.sizes() != et.sizes()) {
      return ::testing::AssertionFailure()
             << "'" << key << "': " << at_.toString() << at_.sizes() << " != " << et.toString() << et.sizes();
    }
    if (at::isFloatingType(et.scalar_type())) {
      auto r = assert_equal(at_, et);
      if (!r) return ::testing::AssertionFailure() << "'" << key << "': " << r.message();
    } else if (!at::equal(at_, et)) {
      return ::testing::AssertionFailure() << "'" << key << "': values differ";
    }
  }
  return ::testing::AssertionSuccess();
}

StateDict deep_copy(const StateDict& sd) {
  StateDict out;
  for (const auto& [key, v] : sd) {
    if (const auto* d = std::get_if<tensor::DTensor>(&v)) {
      out.set(key, tensor::DTensor(d->to_local().detach().clone(), d->spec()));
    } else if (const auto* t = std::get_if<at::Tensor>(&v)) {
      out.set(key, t->detach().clone());
    } else {
      out.set(key, v);
    }
  }
  return out;
}

}  // namespace tdc::conformance
