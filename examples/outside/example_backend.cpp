// An example c10d backend plug-in for tdc: "example", a c10d::Backend that forwards every op to
// an inner Gloo backend (made through tdc's registry) and counts the ops it served. It shows the
// whole plug-in contract: build a shared library linking libtdc, export
//
//   extern "C" void tdc_register_backends(tdc::comm::BackendRegistry&);
//
// and run the suite on it with `tdc run --backend-lib libtdc_example_backend.so --backend example`.
//
// Three backends, for tdc's own tests of [Note: native ops or emulation]:
//   example          no _reduce_scatter_base: tdc emulates reduce-scatter with alltoall_base
//   example_rs       its own _reduce_scatter_base (Gloo's): tdc uses it
//   example_bad_rs   a deliberately wrong _reduce_scatter_base (every rank gets the next rank's
//                    chunk): the suite must fail on it
#include <atomic>
#include <cstdint>
#include <string>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "tdc/comm/backend_registry.h"

namespace {

// Ops served on the calling thread. Ranks are threads or processes, and a rank issues its ops on
// its own thread, so this is a per-rank count under every launcher.
thread_local int64_t tls_served = 0;
thread_local int64_t tls_reduce_scatters = 0;  // _reduce_scatter_base calls served

enum class ReduceScatter { None, Native, Wrong };

class ExampleBackend : public c10d::Backend {
 public:
  ExampleBackend(c10::intrusive_ptr<c10d::Backend> inner, int rank, int size, std::string name, ReduceScatter rs)
      : c10d::Backend(rank, size), inner_(std::move(inner)), name_(std::move(name)), rs_(rs) {}

  const std::string getBackendName() const override { return name_; }

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
  // "example" has no _reduce_scatter_base (c10d's Backend refuses it): tdc then emulates
  // reduce-scatter with alltoall_base, which is what a minimal third-party backend looks like.
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    if (rs_ == ReduceScatter::None) return c10d::Backend::_reduce_scatter_base(output, input, opts);
    ++tls_reduce_scatters;
    if (rs_ == ReduceScatter::Native) return serve()->_reduce_scatter_base(output, input, opts);
    // The bug: chunks rotated by one, so rank r receives the reduction of chunk r + 1.
    at::Tensor rotated = input.roll(-output.numel());
    return serve()->_reduce_scatter_base(output, rotated, opts);
  }
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
  std::string name_;
  ReduceScatter rs_;
};

void add_example(tdc::comm::BackendRegistry& registry, const std::string& name, ReduceScatter rs) {
  // Nothing declared (tdc::comm::BackendOps{}): tdc finds out whether reduce-scatter is native.
  registry.add(name, [name, rs](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                const tdc::comm::GroupOptions& options) {
    auto inner = tdc::comm::BackendRegistry::instance().create("gloo", store, rank, size, options);
    return c10::make_intrusive<ExampleBackend>(std::move(inner), rank, size, name, rs);
  });
}

}  // namespace

extern "C" {

void tdc_register_backends(tdc::comm::BackendRegistry& registry) {
  add_example(registry, "example", ReduceScatter::None);
  add_example(registry, "example_rs", ReduceScatter::Native);
  add_example(registry, "example_bad_rs", ReduceScatter::Wrong);
}
// For tests (dlsym): ops the "example" backend served on the calling thread (rank).
int64_t tdc_example_backend_ops_served() { return tls_served; }
// For tests (dlsym): _reduce_scatter_base calls the example backends served on the calling thread.
int64_t tdc_example_backend_reduce_scatters() { return tls_reduce_scatters; }
}
