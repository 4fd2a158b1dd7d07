// What the implementation under test says about itself (its conformance glue declares it; for
// libtdc and libraries like it, from the [Note: implementation descriptor]).
#pragma once

#include <string>
#include <vector>

namespace tdc::harness {

// The implementation under test declares itself: its name and version (written into the run's
// results unless --tdc_implementation names it), the library it was loaded from, and the features
// it has (e.g. "fsdp2.cpu_offload"); a test that needs one it lacks reports NOT_SUPPORTED, never
// PASS. Until an implementation declares anything, every capability is assumed present.
struct ImplementationInfo {
  std::string name;
  std::string version;
  std::string library;  // the shared library's path, or empty
  std::vector<std::string> features;
};
void declare_implementation(const ImplementationInfo& info);
// What was declared, or nullptr.
const ImplementationInfo* declared_implementation();
// (harness.h's declare_capabilities(name, features) is the short form of declare_implementation
// for test code; has_capability is declared there.)

}  // namespace tdc::harness
