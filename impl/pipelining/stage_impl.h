// Internal to impl/pipelining: what a schedule does with a PipelineStage per microbatch
// (PyTorch's _PipelineStageBase): buffers, asynchronous sends and receives, forward, the three
// kinds of backward, and the data-parallel hooks (data_parallel.cpp).
#pragma once

#include <initializer_list>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdc/comm/collectives.h"
#include "tdc/fsdp/fully_shard.h"
#include "tdc/pipelining/schedule.h"
#include "tdc/pipelining/stage.h"

namespace tdc::pipelining {

// Shape, dtype and requires_grad of one tensor crossing a stage boundary.
struct TensorMeta {
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
  bool requires_grad = false;
  friend bool operator==(const TensorMeta&, const TensorMeta&) = default;
  std::string str() const;  // "[1, 10] BFloat16"
};
TensorMeta meta_of(const at::Tensor& t);

// Sends and receives in flight, with the tensors they read or write (kept alive until waited).
struct P2POps {
  std::vector<comm::Work> works;
  std::vector<at::Tensor> tensors;
  void wait();
};

enum class BackwardKind { Full, Input, Weight };

// The data parallelism wrapped around a stage's module.
enum class DataParallel { None, DDP, FSDP };

// [Note: a microbatch's phase] One microbatch on one stage, within a step:
//   PENDING -> FORWARDED -> BACKWARD_DONE                        (B: full backward)
//   PENDING -> FORWARDED -> INPUT_GRAD_DONE -> BACKWARD_DONE      (I, then W: zero bubble)
// SEND_F needs FORWARDED or later, SEND_B INPUT_GRAD_DONE or BACKWARD_DONE. Every transition is
// checked; a schedule that breaks one gets a ScheduleError naming the stage, the action, the
// microbatch and both phases. begin_step() puts every microbatch back to PENDING.
enum class MicrobatchPhase { PENDING, FORWARDED, INPUT_GRAD_DONE, BACKWARD_DONE };
const char* to_string(MicrobatchPhase phase);

// One microbatch's state between its forward and its backward(s).
struct MicrobatchState {
  nn::Tensors inputs;   // leaves (received) or the caller's chunk (first stage)
  nn::Tensors outputs;  // as the module returned them
  at::Tensor loss;      // last stage with a loss_fn
  nn::Tensors input_grads;
  MicrobatchPhase phase = MicrobatchPhase::PENDING;
};

struct PipelineStage::Impl {
  Impl(nn::ModulePtr submod, int stage_index, int num_stages, c10::Device device, comm::GroupPtr group);

  std::string label() const;  // "PipelineStage 2 (rank 0 of the pipeline group)"
  // [Note: a microbatch's phase]: throws ScheduleError naming the action, `mb` and both phases
  // unless `now` is in `allowed`.
  void check_phase(int mb, const char* action, MicrobatchPhase now,
                   std::initializer_list<MicrobatchPhase> allowed) const;
  int rank_of_stage(int stage) const;

  // ---------------------------------------------------------------- per step
  // Sizes the per-microbatch state for n microbatches and clears last step's (PyTorch's
  // clear_runtime_states).
  void begin_step(int n_microbatches, bool has_backward);
  // [Note: shape inference] (shape_inference.cpp). Collective along the pipeline, in stage order.
  void infer_shapes(const nn::Tensors& first_inputs, const std::vector<PipelineStage*>& local_stages);
  bool shapes_known() const { return output_meta.has_value(); }

  // ---------------------------------------------------------------- communication
  P2POps post_recv_activations(int mb);
  P2POps post_send_activations(int mb);
  P2POps post_recv_grads(int mb);
  P2POps post_send_grads(int mb);

  // ---------------------------------------------------------------- compute
  // Runs the module on microbatch mb: the caller's chunk on the first stage, else the received
  // activations (or `local_inputs` handed over by the previous stage on this rank). Computes the
  // loss on the last stage. Returns the outputs.
  nn::Tensors forward(int mb, const nn::Tensors& chunk, const at::Tensor& target, const LossFn& loss_fn,
                      const nn::Tensors* local_inputs = nullptr);
  // Full (B) or input-only (I) backward from the loss (last stage) or the received output
  // gradients; W computes the weight gradients after an I. `last_backward`: this stage's last
  // backward-like action of the step (B or W), which synchronises DDP.
  void backward(int mb, BackwardKind kind, bool last_backward, const nn::Tensors* local_grads = nullptr);
  // REDUCE_GRAD: FSDP reduce-scatters the accumulated gradients and reshards; then the gradients
  // are divided by `scale` (after the data-parallel reduction).
  void reduce_grad(int scale);

  // ---------------------------------------------------------------- data parallelism (data_parallel.cpp)
  void run_backward_with_dp(BackwardKind kind, bool last_backward, const std::function<void()>& body);
  // FSDP stages: every fully_shard'ed module in the stage's module (UNSHARD / RESHARD actions).
  void fsdp_unshard_async();
  void fsdp_wait_unshard();
  bool fsdp_unshard_pending() const { return !unshard_handles.empty(); }
  void fsdp_reshard();

  nn::ModulePtr submod;
  int stage_index;
  int num_stages;
  c10::Device device;
  comm::GroupPtr group;
  DataParallel dp = DataParallel::None;

  bool has_backward = true;
  std::optional<std::vector<TensorMeta>> input_meta;   // what this stage receives (non-first)
  std::optional<std::vector<TensorMeta>> output_meta;  // what it sends (non-last)
  std::vector<nn::Tensors> act_buffers;                // [mb] receive buffers for activations
  std::vector<nn::Tensors> grad_buffers;               // [mb] receive buffers for output gradients
  std::vector<MicrobatchState> mbs;
  std::vector<fsdp::UnshardHandle> unshard_handles;  // UNSHARD issued, not waited yet
  StageToRank stage_to_rank;                         // set by the schedule (loop placement until then)
};

}  // namespace tdc::pipelining
