#include "tdc/conformance/support.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

#include <stdexcept>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tdc/comm/backend_registry.h"
#include "tdc/comm/op_paths.h"
#include "tdc/implementation.h"
#include "tdc/harness/harness.h"
#include "tdc/harness/implementation.h"
#include "tdc/harness/phases.h"

namespace tdc::conformance {

namespace {
// The implementation under test describes itself ([Note: implementation descriptor]): whatever
// library the dynamic linker loaded as libtdc.so (the reference, or `tdc run --impl LIB`).
harness::ImplementationInfo describe_loaded_implementation() {
  const tdc_implementation_descriptor* d = tdc_implementation();
  Dl_info where{};
  std::string library;
  if (dladdr(reinterpret_cast<void*>(&tdc_implementation), &where) && where.dli_fname) {
    char resolved[PATH_MAX];  // the file itself, not the libtdc.so link `tdc run --impl` made
    library = realpath(where.dli_fname, resolved) ? resolved : where.dli_fname;
  }
  if (d == nullptr || d->abi_version != TDC_IMPLEMENTATION_ABI || d->name == nullptr)
    throw std::runtime_error(
        fmt::format("implementation library '{}': tdc_implementation() returned {} (abi_version {}; this suite reads "
                    "abi_version {} with a name; docs/plugging-in.md)",
                    library, d ? "a descriptor" : "no descriptor", d ? d->abi_version : -1, TDC_IMPLEMENTATION_ABI));
  harness::ImplementationInfo info{d->name, d->version ? d->version : "", library, {}};
  for (const char* const* f = d->features; f && *f; ++f) info.features.emplace_back(*f);
  return info;
}
const bool declared = [] {
  harness::declare_implementation(describe_loaded_implementation());
  return true;
}();

// The run's backend must exist here (built in, or registered by --tdc_backend_lib), checked once
// before any test instead of failing every test with the same message.
void check_backend(const harness::PreflightSettings& s) {
  auto& registry = comm::BackendRegistry::instance();
  if (!s.backend_lib.empty()) registry.load_plugin(s.backend_lib);  // throws naming the library
  if (!registry.has(s.backend))
    throw std::invalid_argument(
        fmt::format("backend '{}': unknown c10d backend (known here: {}{}); a backend from a plug-in needs "
                    "its library (tdc run --backend-lib LIB)",
                    s.backend, fmt::join(registry.names(), ", "),
                    s.backend_lib.empty() ? "" : fmt::format(", after loading {}", s.backend_lib)));
}
const bool preflight_registered = [] {
  harness::register_preflight(&check_backend);
  return true;
}();

// [Note: rank reports] results.json's "comm_ops": per backend, the collectives it ran natively
// and those tdc emulated ([Note: which ops ran natively], tdc/comm/op_paths.h).
const bool comm_ops_reported = [] {
  harness::add_rank_reporter("comm_ops", {.reset = &comm::reset_op_paths, .collect = &comm::op_paths});
  return true;
}();
}  // namespace

comm::GroupPtr world() {
  const auto& c = harness::ctx();
  // The default group is per thread; in the env launcher one thread runs many tests, each with
  // its own store, so a group made for an earlier test is replaced.
  thread_local std::string made_for;
  if (comm::is_initialized() && made_for == c.test_id) return comm::default_group();
  if (comm::is_initialized()) comm::destroy_process_group();
  if (!c.backend_lib.empty()) comm::BackendRegistry::instance().load_plugin(c.backend_lib);
  comm::GroupOptions opts;
  opts.backend = c.backend;
  opts.device_type = c.device_type;
  opts.name = "world";
  harness::mark_phase(c.test_id, c.rank, "group_start");
  auto g = comm::init_process_group(c.store, c.rank, c.world_size, opts);
  harness::mark_phase(c.test_id, c.rank, "group_end");
  made_for = c.test_id;
  return g;
}

}  // namespace tdc::conformance
