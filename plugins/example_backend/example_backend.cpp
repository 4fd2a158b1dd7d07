// An example c10d backend plug-in for tdc: "example", a c10d::Backend that forwards every op to
// an inner Gloo backend (made through tdc's registry) and counts the ops it served. It shows the
// whole plug-in contract: build a shared library linking libtdc, export
//
//   extern "C" void tdc_register_backends(tdc::comm::BackendRegistry&);
//
// and run the suite on it with `tdc run --backend-lib libtdc_example_backend.so --backend example`.
#include <atomic>
#include <cstdint>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "tdc/comm/backend_registry.h"

namespace {

// Ops served on the calling thread. Ranks are threads or processes, and a rank issues its ops on
// its own thread, so this is a per-rank count under every launcher.
thread_local int64_t tls_served = 0;

class ExampleBackend : public c10d::Backend {
 public:
  ExampleBackend(c10::intrusive_ptr<c10d::Backend> inner, int rank, int size)
      : c10d::Backend(rank, size), inner_(std::move(inner)) {}

  const std::string getBackendName() const override { return "example"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    return serve()->broadcast(tensors, opts);
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    return serve()->allreduce(tensors, opts);
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    return serve()->allgather(outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    return serve()->_allgather_base(output, input, opts);
  }
  // No _reduce_scatter_base on purpose: tdc then emulates reduce-scatter with alltoall_base,
  // which is what a minimal third-party backend looks like.
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    return serve()->alltoall_base(output, input, output_splits, input_splits, opts);
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return serve()->send(tensors, dst, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return serve()->recv(tensors, src, tag);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override { return serve()->barrier(opts); }

 private:
  c10d::Backend* serve() {
    ++tls_served;
    return inner_.get();
  }
  c10::intrusive_ptr<c10d::Backend> inner_;
};

}  // namespace

extern "C" {

void tdc_register_backends(tdc::comm::BackendRegistry& registry) {
  registry.add("example", [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                             const tdc::comm::GroupOptions& options) {
    auto inner = tdc::comm::BackendRegistry::instance().create("gloo", store, rank, size, options);
    return c10::make_intrusive<ExampleBackend>(std::move(inner), rank, size);
  });
}

// For tests (dlsym): ops the "example" backend served on the calling thread (rank).
int64_t tdc_example_backend_ops_served() { return tls_served; }
}
