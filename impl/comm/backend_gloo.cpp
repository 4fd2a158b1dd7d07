// The built-in "gloo" backend. This is the only TU that includes ProcessGroupGloo.hpp: it needs
// USE_C10D_GLOO and gloo's own headers and costs ~10 s to compile (docs/decisions.md, "Build").
#include <cstdlib>
#include <string>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "internal.h"

namespace tdc::comm::detail {

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    const GroupOptions& options) {
  auto opts = c10d::ProcessGroupGloo::Options::create(options.timeout);
  // Same device choice as torch.distributed: GLOO_SOCKET_IFNAME names the interface for
  // multi-host runs; otherwise the hostname's address, falling back to loopback.
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname != nullptr && *ifname != '\0') {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  } else {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  // Two worker threads is Gloo's default; async ops in flight at once need more than one.
  opts->threads = 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
}

}  // namespace tdc::comm::detail
