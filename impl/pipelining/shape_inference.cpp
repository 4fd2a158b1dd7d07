// [Note: shape inference] The receive buffers of a stage need the shapes and dtypes of what its
// neighbours send. They are learnt on the first step, along the pipeline in stage order: the
// first stage runs its module on microbatch 0 and sends the output metadata (an int64 tensor) to
// the next stage, which runs its module on zeros of that shape, and so on; the last stage only
// receives. Gradients have the shapes and dtypes of the tensors they belong to, so no backward
// runs (PyTorch runs one). The pass runs under no_grad, with the random number generators saved
// and restored (it must not move the training RNG), outside any DDP synchronisation (PyTorch's
// pass arms DDP's reducer, which breaks its second step: docs/pipelining.md), and reshards FSDP
// modules afterwards. A received tensor requires grad when it is floating point and the schedule
// has a backward. Later microbatches must match: stage.cpp checks every output against the
// inferred metadata (uneven batch splits are refused there with both shapes).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "stage_impl.h"

namespace tdc::pipelining {

namespace {

// [count, then per tensor: dtype, requires_grad, ndim, dims...]
at::Tensor encode(const std::vector<TensorMeta>& metas) {
  std::vector<int64_t> v{static_cast<int64_t>(metas.size())};
  for (const auto& m : metas) {
    v.push_back(static_cast<int64_t>(m.dtype));
    v.push_back(m.requires_grad ? 1 : 0);
    v.push_back(static_cast<int64_t>(m.shape.size()));
    v.insert(v.end(), m.shape.begin(), m.shape.end());
  }
  return at::tensor(v, at::kLong);
}

std::vector<TensorMeta> decode(const at::Tensor& t) {
  const int64_t* p = t.data_ptr<int64_t>();
  const int64_t* end = p + t.numel();
  std::vector<TensorMeta> out(static_cast<size_t>(*p++));
  for (auto& m : out) {
    m.dtype = static_cast<at::ScalarType>(*p++);
    m.requires_grad = *p++ != 0;
    const int64_t ndim = *p++;
    m.shape.assign(p, p + ndim);
    p += ndim;
  }
  TORCH_CHECK(p == end, "pipelining: malformed shape metadata");
  return out;
}

void send_meta(const std::vector<TensorMeta>& metas, int dst, const comm::GroupPtr& group) {
  at::Tensor payload = encode(metas);
  at::Tensor size = at::tensor({payload.numel()}, at::kLong);
  comm::send(size, dst, group).wait();
  comm::send(payload, dst, group).wait();
}

std::vector<TensorMeta> recv_meta(int src, const comm::GroupPtr& group) {
  at::Tensor size = at::zeros({1}, at::kLong);
  comm::recv(size, src, group).wait();
  at::Tensor payload = at::zeros({size.item<int64_t>()}, at::kLong);
  comm::recv(payload, src, group).wait();
  return decode(payload);
}

// Saves the default generators of the CPU and of `device`, restores them on scope exit.
class RngFork {
 public:
  explicit RngFork(c10::Device device) {
    save(at::globalContext().defaultGenerator(c10::DeviceType::CPU));
    if (!device.is_cpu()) save(at::globalContext().defaultGenerator(device));
  }
  ~RngFork() {
    for (auto& [gen, state] : saved_) gen.set_state(state);
  }

 private:
  void save(at::Generator gen) { saved_.emplace_back(gen, gen.get_state()); }
  std::vector<std::pair<at::Generator, at::Tensor>> saved_;
};

}  // namespace

void PipelineStage::Impl::infer_shapes(const nn::Tensors& first_inputs,
                                       const std::vector<PipelineStage*>& local_stages) {
  const bool is_first = stage_index == 0, is_last = stage_index == num_stages - 1;
  const PipelineStage::Impl* prev_local = nullptr;
  for (PipelineStage* s : local_stages) {
    if (s->stage_index() == stage_index - 1) prev_local = &s->impl();
  }
  const bool next_local = rank_of_stage(stage_index + (is_last ? 0 : 1)) == group->rank() && !is_last;
  if (!is_first) input_meta = prev_local ? *prev_local->output_meta : recv_meta(rank_of_stage(stage_index - 1), group);
  if (is_last) {
    output_meta = std::vector<TensorMeta>{};
    return;
  }
  nn::Tensors inputs;
  if (is_first) {
    inputs = first_inputs;
  } else {
    for (const auto& m : *input_meta)
      inputs.push_back(at::zeros(m.shape, at::TensorOptions().dtype(m.dtype).device(device)));
  }
  std::vector<TensorMeta> metas;
  {
    RngFork rng(device);
    at::NoGradGuard no_grad;
    for (const auto& y : (*submod)(inputs)) {
      TensorMeta m = meta_of(y);
      m.requires_grad = has_backward && at::isFloatingType(y.scalar_type());
      metas.push_back(std::move(m));
    }
  }
  if (dp == DataParallel::FSDP) fsdp_reshard();
  output_meta = metas;
  if (!next_local) send_meta(metas, rank_of_stage(stage_index + 1), group);
}

}  // namespace tdc::pipelining
