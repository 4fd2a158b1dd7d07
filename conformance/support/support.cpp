#include "tdc/conformance/support.h"

#include "tdc/comm/backend_registry.h"
#include "tdc/harness/harness.h"

namespace tdc::conformance {

namespace {
// What the reference implementation (libtdc) supports today; conformance tests that need more
// report NOT_SUPPORTED (docs/plugging-in.md). Grows with each issue that lands a component.
const bool declared = [] {
  harness::declare_capabilities(
      "tdc", {"comm", "device_mesh", "dtensor", "tp", "ddp", "ddp.tp_pre_transform", "fsdp2", "fsdp2.cpu_offload",
              "fsdp2.mixed_precision", "fsdp2.hsdp", "fsdp2.all_gather_extensions", "checkpoint"});
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
  auto g = comm::init_process_group(c.store, c.rank, c.world_size, opts);
  made_for = c.test_id;
  return g;
}

}  // namespace tdc::conformance
