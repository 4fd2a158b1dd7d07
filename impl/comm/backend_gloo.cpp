// The built-in "gloo" backend. This is the only TU that includes ProcessGroupGloo.hpp: it needs
// USE_C10D_GLOO and gloo's own headers and costs ~10 s to compile (docs/decisions.md, "Build").
//
// [Note: Gloo is created inside LibTorch]
// LibTorch links its own pinned copy of gloo and ships none of its headers; the gloo headers this
// TU is compiled with come from elsewhere (Debian's libgloo-dev) and may declare other classes
// than the gloo inside LibTorch. So this TU only *declares* gloo things and never runs code from
// those headers: it calls two functions compiled inside LibTorch (Options::create_default, which
// picks the device as torch.distributed does: GLOO_SOCKET_IFNAME, else the hostname's address,
// else loopback; and ProcessGroupGloo's constructor) and touches no gloo type itself. Nothing of
// gloo may be instantiated here: an inline gloo function or template emitted into libtdc would be
// exported and could interpose on LibTorch's own copy, with another class layout (the SIGSEGV in
// ProcessGroupGloo::enqueue seen against 2.11, docs/compat.md). CTest tdc_gloo_isolation_test
// fails the build's tests if libtdc.so defines any symbol that mentions gloo.
#include <algorithm>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "internal.h"

namespace tdc::comm::detail {

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    const GroupOptions& options) {
  auto opts = c10d::ProcessGroupGloo::Options::create_default(options.timeout);
  // LibTorch gives two worker threads per device; async ops in flight at once need at least two.
  opts->threads = std::max(opts->threads, 2);
  c10::intrusive_ptr<c10d::Backend> backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
  return backend;
}

}  // namespace tdc::comm::detail
