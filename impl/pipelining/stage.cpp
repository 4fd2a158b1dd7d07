// PipelineStage (stage.h) and its per-microbatch work (stage_impl.h): buffers, sends and
// receives, forward, backward. Shape inference: shape_inference.cpp; data parallelism:
// data_parallel.cpp.
#include "stage_impl.h"

#include <stdexcept>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/autograd.h>

#include "tdc/core/lifecycle.h"
#include "tdc/ddp/ddp.h"

namespace tdc::pipelining {

// ------------------------------------------------------------------ small pieces

std::string TensorMeta::str() const { return fmt::format("[{}] {}", fmt::join(shape, ", "), c10::toString(dtype)); }

TensorMeta meta_of(const at::Tensor& t) { return TensorMeta{t.sizes().vec(), t.scalar_type(), t.requires_grad()}; }

void P2POps::wait() {
  for (auto& w : works) w.wait();
  works.clear();
  tensors.clear();
}

namespace {

DataParallel data_parallel_of(nn::Module& m) {
  if (dynamic_cast<ddp::DistributedDataParallel*>(&m)) return DataParallel::DDP;
  if (fsdp::is_fully_sharded(m)) return DataParallel::FSDP;
  return DataParallel::None;
}

at::Tensor empty_like_meta(const TensorMeta& m, c10::Device device) {
  return at::zeros(m.shape, at::TensorOptions().dtype(m.dtype).device(device));
}

}  // namespace

// ------------------------------------------------------------------ PipelineStage

PipelineStage::PipelineStage(nn::ModulePtr submod, int stage_index, int num_stages, c10::Device device,
                             comm::GroupPtr group)
    : impl_(std::make_unique<Impl>(std::move(submod), stage_index, num_stages, device, std::move(group))) {}
PipelineStage::~PipelineStage() = default;

nn::Module& PipelineStage::submod() const { return *impl_->submod; }
const nn::ModulePtr& PipelineStage::submod_ptr() const { return impl_->submod; }
int PipelineStage::stage_index() const { return impl_->stage_index; }
int PipelineStage::num_stages() const { return impl_->num_stages; }
const comm::GroupPtr& PipelineStage::group() const { return impl_->group; }
int PipelineStage::group_rank() const { return impl_->group->rank(); }
int PipelineStage::group_size() const { return impl_->group->size(); }
c10::Device PipelineStage::device() const { return impl_->device; }

PipelineStage::Impl::Impl(nn::ModulePtr m, int index, int n, c10::Device dev, comm::GroupPtr g)
    : submod(std::move(m)), stage_index(index), num_stages(n), device(dev), group(comm::resolve(g)) {
  if (!submod) throw std::invalid_argument("PipelineStage: the stage's module is null");
  if (n < 1) throw std::invalid_argument(fmt::format("PipelineStage: num_stages must be >= 1, got {}", n));
  if (index < 0 || index >= n) {
    throw std::invalid_argument(
        fmt::format("PipelineStage: stage_index {} is outside [0, {}) (num_stages = {})", index, n, n));
  }
  dp = data_parallel_of(*submod);
  stage_to_rank = loop_placement(group->size(), n);
}

std::string PipelineStage::Impl::label() const {
  return fmt::format("PipelineStage {} (pipeline rank {} of {})", stage_index, group->rank(), group->size());
}

int PipelineStage::Impl::rank_of_stage(int stage) const {
  auto it = stage_to_rank.find(stage);
  if (it == stage_to_rank.end()) {
    throw ScheduleError(fmt::format("{}: no rank runs stage {} in this schedule", label(), stage));
  }
  return it->second;
}

void PipelineStage::Impl::begin_step(int n_microbatches, bool backward) {
  has_backward = backward;
  mbs.assign(n_microbatches, MicrobatchState{});
  act_buffers.resize(n_microbatches);
  grad_buffers.resize(n_microbatches);
}

// ------------------------------------------------------------------ sends and receives

namespace {

// Buffers for one microbatch, made once and reused by every step ([Note: one buffer per
// microbatch]: a receive in flight must never share memory with another microbatch's).
nn::Tensors& buffers_for(std::vector<nn::Tensors>& per_mb, int mb, const std::vector<TensorMeta>& metas,
                         c10::Device device) {
  nn::Tensors& bufs = per_mb.at(mb);
  if (bufs.size() != metas.size()) {
    bufs.clear();
    for (const auto& m : metas) bufs.push_back(empty_like_meta(m, device));
  }
  return bufs;
}

P2POps post_sends(const nn::Tensors& tensors, int dst, const comm::GroupPtr& group) {
  P2POps ops;
  for (const auto& t : tensors) {
    at::Tensor payload = t.detach().contiguous();
    ops.works.push_back(comm::send(payload, dst, group));
    ops.tensors.push_back(std::move(payload));
  }
  return ops;
}

P2POps post_recvs(nn::Tensors& buffers, int src, const comm::GroupPtr& group) {
  P2POps ops;
  for (auto& b : buffers) {
    ops.works.push_back(comm::recv(b, src, group));
    ops.tensors.push_back(b);
  }
  return ops;
}

}  // namespace

const char* to_string(MicrobatchPhase phase) {
  switch (phase) {
    case MicrobatchPhase::PENDING:
      return "PENDING";
    case MicrobatchPhase::FORWARDED:
      return "FORWARDED";
    case MicrobatchPhase::INPUT_GRAD_DONE:
      return "INPUT_GRAD_DONE";
    case MicrobatchPhase::BACKWARD_DONE:
      return "BACKWARD_DONE";
  }
  return "?";
}

void PipelineStage::Impl::check_phase(int mb, const char* action, MicrobatchPhase now,
                                      std::initializer_list<MicrobatchPhase> allowed) const {
  core::check_transition(now, allowed, [&](const std::string& is, const std::string& needs) {
    throw ScheduleError(fmt::format("{}: {} of microbatch {} while {}; it needs {}", label(), action, mb, is, needs));
  });
}

P2POps PipelineStage::Impl::post_recv_activations(int mb) {
  if (!input_meta) throw ScheduleError(fmt::format("{}: RECV_F before the stage's input shapes are known", label()));
  return post_recvs(buffers_for(act_buffers, mb, *input_meta, device), rank_of_stage(stage_index - 1), group);
}

P2POps PipelineStage::Impl::post_send_activations(int mb) {
  const MicrobatchState& st = mbs.at(mb);
  if (st.phase == MicrobatchPhase::PENDING) {
    throw ScheduleError(fmt::format("{}: SEND_F of microbatch {} before its forward ran", label(), mb));
  }
  return post_sends(st.outputs, rank_of_stage(stage_index + 1), group);
}

P2POps PipelineStage::Impl::post_recv_grads(int mb) {
  if (!output_meta) throw ScheduleError(fmt::format("{}: RECV_B before the stage's output shapes are known", label()));
  std::vector<TensorMeta> grad_meta = *output_meta;
  for (auto& m : grad_meta) m.requires_grad = false;
  return post_recvs(buffers_for(grad_buffers, mb, grad_meta, device), rank_of_stage(stage_index + 1), group);
}

P2POps PipelineStage::Impl::post_send_grads(int mb) {
  const MicrobatchState& st = mbs.at(mb);
  if (st.phase != MicrobatchPhase::INPUT_GRAD_DONE && st.phase != MicrobatchPhase::BACKWARD_DONE) {
    throw ScheduleError(fmt::format("{}: SEND_B of microbatch {} before its backward ran", label(), mb));
  }
  return post_sends(st.input_grads, rank_of_stage(stage_index - 1), group);
}

// ------------------------------------------------------------------ forward

namespace {

// Received activations become leaves of this stage's graph; their gradients are what SEND_B sends.
nn::Tensors as_leaves(const nn::Tensors& received, const std::vector<TensorMeta>& metas, bool has_backward) {
  nn::Tensors leaves;
  for (size_t i = 0; i < received.size(); ++i) {
    at::Tensor leaf = received[i].detach();
    leaf.requires_grad_(has_backward && metas[i].requires_grad);
    leaves.push_back(std::move(leaf));
  }
  return leaves;
}

}  // namespace

nn::Tensors PipelineStage::Impl::forward(int mb, const nn::Tensors& chunk, const at::Tensor& target,
                                         const LossFn& loss_fn, const nn::Tensors* local_inputs) {
  MicrobatchState& st = mbs.at(mb);
  if (st.phase != MicrobatchPhase::PENDING) {
    throw ScheduleError(fmt::format("{}: microbatch {} forwarded twice in one step", label(), mb));
  }
  nn::Tensors inputs;
  if (stage_index == 0) {
    inputs = chunk;
  } else {
    const nn::Tensors& received = local_inputs ? *local_inputs : act_buffers.at(mb);
    inputs = as_leaves(received, *input_meta, has_backward);
  }
  nn::Tensors outputs;
  {
    at::AutoGradMode grad_mode(has_backward && at::GradMode::is_enabled());
    outputs = (*submod)(inputs);
  }
  if (stage_index != num_stages - 1) {
    for (size_t i = 0; i < outputs.size(); ++i) {
      TensorMeta got = meta_of(outputs[i]);
      got.requires_grad = (*output_meta)[i].requires_grad;
      if (outputs.size() != output_meta->size() || !(got == (*output_meta)[i])) {
        throw std::runtime_error(fmt::format(
            "{}: microbatch {}'s output {} is {} but the first step inferred {}; the next stage's receive "
            "buffers have the inferred shape (every microbatch must have the same shape: an uneven batch split?)",
            label(), mb, i, got.str(), (*output_meta)[i].str()));
      }
    }
  }
  if (stage_index == num_stages - 1 && loss_fn && has_backward) {
    if (!target.defined()) {
      throw std::invalid_argument(
          fmt::format("{}: the last stage computes the loss but step() got no target", label()));
    }
    st.loss = loss_fn(outputs.at(0), target);
  }
  st.inputs = std::move(inputs);
  st.outputs = outputs;
  st.phase = MicrobatchPhase::FORWARDED;
  return outputs;
}

// ------------------------------------------------------------------ backward

namespace {

nn::Tensors params_requiring_grad(nn::Module& m) {
  nn::Tensors out;
  for (auto& p : m.params()) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

}  // namespace

// [Note: split backward] B runs autograd over the whole stage graph: parameter gradients
// accumulate (firing DDP's and FSDP's hooks) and the received inputs get .grad, which SEND_B
// sends. Zero bubble splits it: I = autograd::grad to the stage's inputs only, keeping the graph;
// W = autograd::backward restricted to the parameters (`inputs=`), which runs their gradient
// accumulators, so DDP's reducer and FSDP see W as an ordinary backward. (PyTorch's W calls
// autograd.grad and adds to .grad by hand, which bypasses DDP's hooks: pytorch#144530.) The
// shared part of the graph is differentiated twice; the stages are small pieces of a model. The
// first stage has no inputs that need gradients: its I does nothing and its W is the whole
// backward, as in PyTorch.
void PipelineStage::Impl::backward(int mb, BackwardKind kind, bool last_backward, const nn::Tensors* local_grads) {
  MicrobatchState& st = mbs.at(mb);
  if (st.phase == MicrobatchPhase::PENDING) {
    throw ScheduleError(fmt::format("{}: backward of microbatch {} before its forward", label(), mb));
  }
  if (kind == BackwardKind::Weight && st.phase == MicrobatchPhase::FORWARDED) {
    throw ScheduleError(fmt::format("{}: W of microbatch {} before its I", label(), mb));
  }
  check_phase(mb,
              kind == BackwardKind::Full    ? "B"
              : kind == BackwardKind::Input ? "I"
                                            : "W",
              st.phase, {kind == BackwardKind::Weight ? MicrobatchPhase::INPUT_GRAD_DONE : MicrobatchPhase::FORWARDED});
  if (!has_backward) throw ScheduleError(fmt::format("{}: backward in a schedule without a loss_fn", label()));
  nn::Tensors roots, root_grads;
  if (stage_index == num_stages - 1) {
    if (!st.loss.defined())
      throw ScheduleError(fmt::format("{}: backward of microbatch {} without a loss", label(), mb));
    roots = {st.loss};
  } else {
    const nn::Tensors& grads = local_grads ? *local_grads : grad_buffers.at(mb);
    for (size_t i = 0; i < st.outputs.size(); ++i) {
      if (!st.outputs[i].requires_grad()) continue;
      roots.push_back(st.outputs[i]);
      root_grads.push_back(grads.at(i));
    }
  }
  nn::Tensors inputs_with_grad;
  for (const auto& x : st.inputs) {
    if (x.requires_grad()) inputs_with_grad.push_back(x);
  }
  auto input_grads_from_leaves = [&] {
    st.input_grads.clear();
    for (const auto& x : st.inputs) {
      at::Tensor g = x.requires_grad() ? x.grad() : at::Tensor();
      st.input_grads.push_back(g.defined() ? g : at::zeros_like(x));
    }
  };
  switch (kind) {
    case BackwardKind::Full:
      run_backward_with_dp(kind, last_backward, [&] { torch::autograd::backward(roots, root_grads, false, false); });
      input_grads_from_leaves();
      st.phase = MicrobatchPhase::BACKWARD_DONE;
      break;
    case BackwardKind::Input:
      if (!inputs_with_grad.empty()) {
        run_backward_with_dp(kind, false, [&] {
          nn::Tensors g = torch::autograd::grad(roots, inputs_with_grad, root_grads, /*retain_graph=*/true,
                                                /*create_graph=*/false, /*allow_unused=*/true);
          st.input_grads.clear();
          size_t k = 0;
          for (const auto& x : st.inputs) {
            at::Tensor gx = x.requires_grad() ? g[k++] : at::Tensor();
            st.input_grads.push_back(gx.defined() ? gx : at::zeros_like(x));
          }
        });
      }
      st.phase = MicrobatchPhase::INPUT_GRAD_DONE;
      break;
    case BackwardKind::Weight: {
      nn::Tensors params = params_requiring_grad(*submod);
      run_backward_with_dp(kind, last_backward,
                           [&] { torch::autograd::backward(roots, root_grads, false, false, params); });
      st.phase = MicrobatchPhase::BACKWARD_DONE;
      break;
    }
  }
  if (st.phase == MicrobatchPhase::BACKWARD_DONE) {
    st.outputs = {};  // the graph is freed; keep nothing alive past the last backward
    st.loss = st.loss.defined() ? st.loss.detach() : st.loss;
  }
}

}  // namespace tdc::pipelining
