// The built-in "nccl" backend, compiled in only when LibTorch was built with NCCL (CMake defines
// USE_C10D_NCCL for this TU then). On a CPU-only LibTorch this TU registers nothing, so the
// registry lists only "gloo" and asking for "nccl" gets the unknown-backend message.
#include <stdexcept>

#include "internal.h"

#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace tdc::comm::detail {

#ifdef USE_C10D_NCCL

bool nccl_available() { return true; }

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    const GroupOptions& options) {
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = options.timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
}

#else

bool nccl_available() { return false; }

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                                    const GroupOptions&) {
  throw std::logic_error("make_nccl_backend: this libtdc was built against a LibTorch without NCCL");
}

#endif

}  // namespace tdc::comm::detail
