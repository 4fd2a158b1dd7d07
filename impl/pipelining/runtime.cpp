// PipelineScheduleRuntime (schedule.h): construction checks, step(), and the execution of one
// rank's action list (PyTorch's _PipelineScheduleRuntime._step_microbatches).
#include <map>
#include <stdexcept>
#include <utility>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "stage_impl.h"

namespace tdc::pipelining {

// ------------------------------------------------------------------ construction

namespace {

void check_stage_list(const std::vector<PipelineStage*>& stages, int n_microbatches) {
  if (stages.empty()) throw std::invalid_argument("pipeline schedule: no stages given");
  if (n_microbatches < 1) {
    throw std::invalid_argument(fmt::format("pipeline schedule: n_microbatches must be >= 1, got {}", n_microbatches));
  }
  std::set<int> seen;
  for (PipelineStage* s : stages) {
    if (!s) throw std::invalid_argument("pipeline schedule: a stage is null");
    if (s->num_stages() != stages[0]->num_stages() || s->group() != stages[0]->group()) {
      throw std::invalid_argument(fmt::format(
          "pipeline schedule: stage {} (num_stages {}) and stage {} (num_stages {}) belong to different pipelines "
          "(num_stages or process group differ)",
          stages[0]->stage_index(), stages[0]->num_stages(), s->stage_index(), s->num_stages()));
    }
    if (!seen.insert(s->stage_index()).second) {
      throw std::invalid_argument(fmt::format("pipeline schedule: stage {} is given twice", s->stage_index()));
    }
  }
}

}  // namespace

PipelineScheduleRuntime::PipelineScheduleRuntime(std::vector<PipelineStage*> stages, int n_microbatches, LossFn loss_fn,
                                                 bool scale_grads)
    : stages_(std::move(stages)),
      n_microbatches_(n_microbatches),
      loss_fn_(std::move(loss_fn)),
      scale_grads_(scale_grads) {
  check_stage_list(stages_, n_microbatches_);
  std::sort(stages_.begin(), stages_.end(),
            [](PipelineStage* a, PipelineStage* b) { return a->stage_index() < b->stage_index(); });
  rank_ = stages_[0]->group_rank();
  pp_size_ = stages_[0]->group_size();
  num_stages_ = stages_[0]->num_stages();
  check_stages_cover_pipeline();
}

PipelineScheduleRuntime::~PipelineScheduleRuntime() = default;

// Collective over the pipeline group: every stage index on exactly one rank.
void PipelineScheduleRuntime::check_stages_cover_pipeline() const {
  at::Tensor owners = at::zeros({num_stages_}, at::kInt);
  for (PipelineStage* s : stages_) owners[s->stage_index()] = 1;
  comm::all_reduce(owners, comm::ReduceOp::SUM, stages_[0]->group());
  std::vector<int> missing, repeated;
  for (int s = 0; s < num_stages_; ++s) {
    const int n = owners[s].item<int>();
    if (n == 0) missing.push_back(s);
    if (n > 1) repeated.push_back(s);
  }
  if (!missing.empty() || !repeated.empty()) {
    throw std::invalid_argument(fmt::format(
        "pipeline schedule: the stages of the {} pipeline ranks must cover 0..{} exactly once; missing: [{}], on "
        "several ranks: [{}]",
        pp_size_, num_stages_ - 1, fmt::join(missing, ", "), fmt::join(repeated, ", ")));
  }
}

void PipelineScheduleRuntime::set_compute_order(ComputeOrder order) {
  for (PipelineStage* s : stages_) {
    if (s->stage_index() % pp_size_ != rank_) {
      throw std::invalid_argument(fmt::format(
          "pipeline schedule: stage {} is on pipeline rank {}, but this schedule places stage s on rank s % {} "
          "(rank {} runs stages {}, {}, ...)",
          s->stage_index(), rank_, pp_size_, rank_, rank_, rank_ + pp_size_));
    }
  }
  pipeline_order = std::move(order);
  pipeline_order_with_comms = lower(pipeline_order, n_microbatches_);
  check_lists_before_step();
}

// [Note: schedule validation] (schedule_ir.h) runs once per distinct set of lists.
void PipelineScheduleRuntime::check_lists_before_step() {
  if (pipeline_order_with_comms == validated_ && !validated_.empty()) return;
  if (!pipeline_order_with_comms.count(rank_)) {
    throw ScheduleError(fmt::format("pipeline schedule: pipeline_order_with_comms has no list for rank {}", rank_));
  }
  StageToRank stage_to_rank = loop_placement(pp_size_, num_stages_);
  for (const auto& [rank, actions] : pipeline_order_with_comms) {
    for (const Action& a : actions) {
      if (a.type != ActionType::OverlapFB) stage_to_rank[a.stage] = rank;
      for (const Action& sub : a.sub_actions) stage_to_rank[sub.stage] = rank;
    }
  }
  for (PipelineStage* s : stages_) stage_to_rank[s->stage_index()] = rank_;
  validate_comms(pipeline_order_with_comms, stage_to_rank, num_stages_, n_microbatches_);
  for (PipelineStage* s : stages_) s->impl().stage_to_rank = stage_to_rank;
  validated_ = pipeline_order_with_comms;
}

// ------------------------------------------------------------------ one step

namespace {

// Splits on dim 0 into n equal microbatches. Uneven splits are refused here, before any stage
// sends: the receive buffers have the shape of microbatch 0 (PyTorch would fail later, or
// mismatch buffers silently: pytorch#126600).
std::vector<nn::Tensors> split_microbatches(const nn::Tensors& tensors, int n, const char* what) {
  std::vector<nn::Tensors> chunks(n);
  for (const auto& t : tensors) {
    if (t.dim() == 0 || t.size(0) < n) {
      throw std::invalid_argument(fmt::format(
          "pipeline schedule: cannot split the {} of shape [{}] into {} microbatches along dim 0 (needs at least {} "
          "rows)",
          what, fmt::join(t.sizes(), ", "), n, n));
    }
    if (t.size(0) % n != 0) {
      throw std::invalid_argument(fmt::format(
          "pipeline schedule: the {} of shape [{}] does not split evenly into {} microbatches along dim 0 ({} rows); "
          "every microbatch must have the same shape (the stages' receive buffers are sized by the first)",
          what, fmt::join(t.sizes(), ", "), n, t.size(0)));
    }
    auto parts = at::tensor_split(t, n, 0);
    for (int i = 0; i < n; ++i) chunks[i].push_back(parts[i]);
  }
  return chunks;
}

}  // namespace

// The state of one step on this rank: receives in flight, sends to wait, local hand-offs.
struct PipelineScheduleRuntime::Run {
  PipelineScheduleRuntime& self;
  std::map<int, PipelineStage*> stages;
  std::vector<nn::Tensors> input_chunks;
  nn::Tensors target_chunks;
  std::map<std::pair<int, int>, P2POps> fwd_recvs, bwd_recvs;  // (stage, mb)
  std::vector<P2POps> sends;
  std::map<std::pair<int, int>, nn::Tensors> local_acts, local_grads;  // for (stage, mb) from a local neighbour
  std::map<int, int> backward_count;                                   // B or W per stage
  std::map<int, nn::Tensors> last_outputs;                             // mb -> last stage's outputs

  PipelineStage::Impl& stage(int index) {
    auto it = stages.find(index);
    if (it == stages.end()) {
      throw ScheduleError(fmt::format("stage {} is not on pipeline rank {}", index, self.rank_));
    }
    return it->second->impl();
  }
  bool local(int index) const { return stages.count(index) > 0; }

  void perform(const Action& a);
  void assert_unsharded(PipelineStage::Impl& s);
  void wait_recv(std::map<std::pair<int, int>, P2POps>& recvs, const Action& a, const char* what);
};

void PipelineScheduleRuntime::Run::assert_unsharded(PipelineStage::Impl& s) {
  if (s.dp != DataParallel::FSDP) return;
  if (s.fsdp_unshard_pending()) {
    s.fsdp_wait_unshard();
    self.unsharded_stages_.insert(s.stage_index);
  }
  if (!self.unsharded_stages_.count(s.stage_index)) {
    throw ScheduleError(
        fmt::format("compute on FSDP stage {} while it is sharded (no UNSHARD before it)", s.stage_index));
  }
}

void PipelineScheduleRuntime::Run::wait_recv(std::map<std::pair<int, int>, P2POps>& recvs, const Action& a,
                                             const char* what) {
  auto it = recvs.find({a.stage, *a.microbatch});
  if (it == recvs.end()) throw ScheduleError(fmt::format("{} runs before its {} was received", a.str(), what));
  it->second.wait();
  recvs.erase(it);
}

void PipelineScheduleRuntime::Run::perform(const Action& a) {
  if (a.type == ActionType::OverlapFB) {
    for (const Action& sub : a.sub_actions) perform(sub);
    return;
  }
  const bool needs_mb = a.is_compute() || a.type == ActionType::SendF || a.type == ActionType::RecvF ||
                        a.type == ActionType::SendB || a.type == ActionType::RecvB;
  if (needs_mb && (!a.microbatch || *a.microbatch < 0 || *a.microbatch >= self.n_microbatches_)) {
    throw ScheduleError(fmt::format("{} needs a microbatch in [0, {})", a.str(), self.n_microbatches_));
  }
  PipelineStage::Impl& s = stage(a.stage);
  const int mb = a.microbatch.value_or(-1);
  const bool last_stage = a.stage == self.num_stages_ - 1, first_stage = a.stage == 0;
  switch (a.type) {
    case ActionType::SendF:
      sends.push_back(s.post_send_activations(mb));
      return;
    case ActionType::SendB:
      sends.push_back(s.post_send_grads(mb));
      return;
    case ActionType::RecvF:
      if (!fwd_recvs.emplace(std::pair{a.stage, mb}, s.post_recv_activations(mb)).second) {
        throw ScheduleError(fmt::format("{}: received twice without a forward in between", a.str()));
      }
      return;
    case ActionType::RecvB:
      if (!bwd_recvs.emplace(std::pair{a.stage, mb}, s.post_recv_grads(mb)).second) {
        throw ScheduleError(fmt::format("{}: received twice without a backward in between", a.str()));
      }
      return;
    case ActionType::Unshard:
      if (s.dp != DataParallel::FSDP) return;
      if (self.unsharded_stages_.count(a.stage) || s.fsdp_unshard_pending()) {
        throw ScheduleError(
            fmt::format("{}: stage {} is unsharded already (UNSHARD twice without RESHARD)", a.str(), a.stage));
      }
      s.fsdp_unshard_async();
      return;
    case ActionType::Reshard:
      if (s.dp != DataParallel::FSDP) return;
      if (s.fsdp_unshard_pending()) {
        throw ScheduleError(
            fmt::format("{}: RESHARD before the stage's UNSHARD finished (no compute between)", a.str()));
      }
      if (!self.unsharded_stages_.erase(a.stage)) {
        throw ScheduleError(fmt::format("{}: RESHARD of stage {} without UNSHARD", a.str(), a.stage));
      }
      s.fsdp_reshard();
      return;
    case ActionType::Forward: {
      assert_unsharded(s);
      const nn::Tensors* local_in = nullptr;
      if (!first_stage && local(a.stage - 1)) {
        local_in = &local_acts.at({a.stage, mb});
      } else if (!first_stage) {
        wait_recv(fwd_recvs, a, "input (RECV_F)");
      }
      static const nn::Tensors kNone;
      nn::Tensors out = s.forward(mb, first_stage ? input_chunks.at(mb) : kNone,
                                  last_stage && !target_chunks.empty() ? target_chunks.at(mb) : at::Tensor(),
                                  self.loss_fn_, local_in);
      if (local_in) local_acts.erase({a.stage, mb});
      if (last_stage) {
        for (auto& y : out) last_outputs[mb].push_back(y.detach());
      } else if (local(a.stage + 1)) {
        local_acts[{a.stage + 1, mb}] = out;
      }
      return;
    }
    case ActionType::FullBackward:
    case ActionType::BackwardInput: {
      assert_unsharded(s);
      const nn::Tensors* local_g = nullptr;
      if (!last_stage && local(a.stage + 1)) {
        local_g = &local_grads.at({a.stage, mb});
      } else if (!last_stage) {
        wait_recv(bwd_recvs, a, "output gradient (RECV_B)");
      }
      const bool full = a.type == ActionType::FullBackward;
      const bool last_backward = full && ++backward_count[a.stage] == self.n_microbatches_;
      s.backward(mb, full ? BackwardKind::Full : BackwardKind::Input, last_backward, local_g);
      if (local_g) local_grads.erase({a.stage, mb});
      if (!first_stage && local(a.stage - 1)) local_grads[{a.stage - 1, mb}] = s.mbs.at(mb).input_grads;
      return;
    }
    case ActionType::BackwardWeight: {
      assert_unsharded(s);
      const bool last_backward = ++backward_count[a.stage] == self.n_microbatches_;
      s.backward(mb, BackwardKind::Weight, last_backward);
      return;
    }
    case ActionType::ReduceGrad:
      s.reduce_grad(self.scale_grads_ ? self.n_microbatches_ : 1);
      return;
    case ActionType::OverlapFB:
      return;  // handled above
  }
}

nn::Tensors PipelineScheduleRuntime::step(const nn::Tensors& inputs, const at::Tensor& target,
                                          std::vector<at::Tensor>* losses) {
  const bool has_backward = static_cast<bool>(loss_fn_);
  if (has_backward && !at::GradMode::is_enabled()) {
    throw std::logic_error(
        "step() requires gradients to be enabled for backward computation; it should not be used under "
        "torch.no_grad() (NoGradGuard)");
  }
  check_lists_before_step();
  Run run{*this};
  for (PipelineStage* s : stages_) run.stages[s->stage_index()] = s;
  const bool has_first = run.local(0), has_last = run.local(num_stages_ - 1);
  // Refusals of this rank's inputs are agreed over the pipeline group before any stage sends, so
  // every rank stops instead of waiting for a peer that gave up.
  std::string refusal;
  try {
    if (has_first && inputs.empty())
      throw std::invalid_argument("pipeline schedule: the first stage's rank must pass the inputs to step()");
    if (!has_first && !inputs.empty())
      throw std::invalid_argument(fmt::format(
          "pipeline schedule: inputs given to step() on pipeline rank {}, which does not run stage 0", rank_));
    if (has_last && has_backward && !target.defined())
      throw std::invalid_argument(
          "pipeline schedule: the last stage's rank must pass the target to step() (there is a loss_fn)");
    if (has_first) run.input_chunks = split_microbatches(inputs, n_microbatches_, "input");
    if (has_last && target.defined()) {
      for (auto& c : split_microbatches({target}, n_microbatches_, "target")) run.target_chunks.push_back(c[0]);
    }
  } catch (const std::exception& e) {
    refusal = e.what();
  }
  at::Tensor refused = at::tensor({refusal.empty() ? 0 : 1}, at::kInt);
  comm::all_reduce(refused, comm::ReduceOp::SUM, stages_[0]->group());
  if (!refusal.empty()) throw std::invalid_argument(refusal);
  if (refused.item<int>() > 0) {
    throw std::invalid_argument(
        "pipeline schedule: another pipeline rank refused its step() arguments (see its error)");
  }
  for (PipelineStage* s : stages_) s->impl().begin_step(n_microbatches_, has_backward);
  if (!stages_initialized_) {
    for (PipelineStage* s : stages_)
      s->impl().infer_shapes(s->is_first() ? run.input_chunks.at(0) : nn::Tensors{}, stages_);
    stages_initialized_ = true;
  }
  const std::vector<Action>& actions = pipeline_order_with_comms.at(rank_);
  for (size_t i = 0; i < actions.size(); ++i) {
    try {
      run.perform(actions[i]);
    } catch (const ScheduleError& e) {
      throw ScheduleError(
          fmt::format("pipeline rank {}, step {}, action {}: {}", rank_, i, actions[i].str(), e.what()));
    }
  }
  for (auto& s : run.sends) s.wait();
  for (PipelineStage* s : stages_) {
    if (s->impl().fsdp_unshard_pending()) {
      throw ScheduleError(fmt::format("pipeline rank {}: stage {} was UNSHARDed but never used (unused unshard)", rank_,
                                      s->stage_index()));
    }
  }
  if (!has_last) return {};
  if (losses) {
    losses->clear();
    for (const auto& st : run.stage(num_stages_ - 1).mbs) losses->push_back(st.loss);
  }
  nn::Tensors merged;
  const size_t n_out = run.last_outputs.empty() ? 0 : run.last_outputs.begin()->second.size();
  for (size_t k = 0; k < n_out; ++k) {
    std::vector<at::Tensor> parts;
    for (auto& [mb, outs] : run.last_outputs) parts.push_back(outs[k]);
    merged.push_back(at::cat(parts, 0));
  }
  return merged;
}

// ------------------------------------------------------------------ the seed schedules

namespace {
ScheduleShape shape_of(const PipelineScheduleRuntime& r, size_t local_stages) {
  return ScheduleShape{r.pp_size(), static_cast<int>(local_stages), r.n_microbatches()};
}
}  // namespace

ScheduleGPipe::ScheduleGPipe(PipelineStage& stage, int n, LossFn loss_fn, bool scale_grads)
    : PipelineScheduleRuntime({&stage}, n, std::move(loss_fn), scale_grads) {
  set_compute_order(compute_order(ScheduleKind::GPipe, shape_of(*this, 1)));
}
Schedule1F1B::Schedule1F1B(PipelineStage& stage, int n, LossFn loss_fn, bool scale_grads)
    : PipelineScheduleRuntime({&stage}, n, std::move(loss_fn), scale_grads) {
  set_compute_order(compute_order(ScheduleKind::OneFOneB, shape_of(*this, 1)));
}
ScheduleLoopedBFS::ScheduleLoopedBFS(std::vector<PipelineStage*> stages, int n, LossFn loss_fn, bool scale_grads)
    : PipelineScheduleRuntime(stages, n, std::move(loss_fn), scale_grads) {
  set_compute_order(compute_order(ScheduleKind::LoopedBFS, shape_of(*this, stages.size())));
}
ScheduleInterleaved1F1B::ScheduleInterleaved1F1B(std::vector<PipelineStage*> stages, int n, LossFn loss_fn,
                                                 bool scale_grads)
    : PipelineScheduleRuntime(stages, n, std::move(loss_fn), scale_grads) {
  set_compute_order(compute_order(ScheduleKind::Interleaved1F1B, shape_of(*this, stages.size())));
}
ScheduleInterleavedZeroBubble::ScheduleInterleavedZeroBubble(std::vector<PipelineStage*> stages, int n, LossFn loss_fn,
                                                             bool scale_grads)
    : PipelineScheduleRuntime(stages, n, std::move(loss_fn), scale_grads) {
  set_compute_order(compute_order(ScheduleKind::InterleavedZeroBubble, shape_of(*this, stages.size())));
}

std::unique_ptr<PipelineScheduleRuntime> make_schedule(ScheduleKind kind, std::vector<PipelineStage*> stages, int n,
                                                       LossFn loss_fn, bool scale_grads) {
  if (is_single_stage(kind) && stages.size() != 1) {
    throw std::invalid_argument(
        fmt::format("{} runs exactly one stage per rank, got {}", schedule_name(kind), stages.size()));
  }
  switch (kind) {
    case ScheduleKind::GPipe:
      return std::make_unique<ScheduleGPipe>(*stages[0], n, std::move(loss_fn), scale_grads);
    case ScheduleKind::OneFOneB:
      return std::make_unique<Schedule1F1B>(*stages[0], n, std::move(loss_fn), scale_grads);
    case ScheduleKind::LoopedBFS:
      return std::make_unique<ScheduleLoopedBFS>(stages, n, std::move(loss_fn), scale_grads);
    case ScheduleKind::Interleaved1F1B:
      return std::make_unique<ScheduleInterleaved1F1B>(stages, n, std::move(loss_fn), scale_grads);
    case ScheduleKind::InterleavedZeroBubble:
      return std::make_unique<ScheduleInterleavedZeroBubble>(stages, n, std::move(loss_fn), scale_grads);
  }
  throw std::invalid_argument("make_schedule: unknown schedule kind");
}

}  // namespace tdc::pipelining
