// UnitState (unit_state.h): hooks, lazy init, prefetching and the end-of-backward callback of one
// FSDP1 unit.
#include "unit_state.h"

#include "common.h"
#include "tdc/comm/argument_checks.h"
#include "tdc/comm/gather_strings.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>

namespace tdc::fsdp1 {

namespace {

// The lines of a plan exchanged by agree_collective_plans ('\n'-joined).
std::vector<std::string> plan_lines(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size() && !text.empty()) {
    const size_t end = std::min(text.find('\n', start), text.size());
    out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

struct UnitRef : torch::CustomClassHolder {
  explicit UnitRef(std::shared_ptr<UnitState> s) : state(std::move(s)) {}
  std::shared_ptr<UnitState> state;
};

// [Note: FSDP1 and autograd] One node per unit and forward call, standing for PyTorch's
// post-backward hook on the flat parameter's AccumulateGrad. Its input is the flat parameter (so
// autograd runs it); its outputs are the unsharded views the module computes with. Autograd calls
// backward once, when the gradients of every view have arrived: that is the unit's post-backward.
// It returns no gradient for the flat parameter: post_backward puts the reduced gradient into the
// shard's .grad itself (accumulating, as FSDP1 does).
struct UnshardViews : torch::autograd::Function<UnshardViews> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, c10::intrusive_ptr<UnitRef> ref,
                                                const at::Tensor& flat_param) {
    ctx->saved_data["unit"] = c10::IValue::make_capsule(ref);
    std::vector<at::Tensor> views = ref->state->handle()->unsharded_views();
    return views;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto capsule = ctx->saved_data["unit"].toCapsule();
    static_cast<UnitRef*>(capsule.get())->state->post_backward(grads);
    return {at::Tensor(), at::Tensor()};
  }
};

nn::Tensors cast_floating(nn::Tensors xs, at::ScalarType dtype) {
  for (auto& x : xs) {
    if (x.defined() && at::isFloatingType(x.scalar_type()) && x.scalar_type() != dtype) x = x.to(dtype);
  }
  return xs;
}

std::string unit_label(const std::string& fqn, const nn::Module& wrapped) {
  return fqn.empty() ? fmt::format("<root> ({})", wrapped.type_name())
                     : fmt::format("'{}' ({})", fqn, wrapped.type_name());
}

}  // namespace

UnitState::UnitState(FSDPOptions options, comm::GroupPtr shard_pg, comm::GroupPtr replicate_pg,
                     std::unique_ptr<detail::FlatParamHandle> handle, std::vector<nn::Module*> ignored)
    : options_(std::move(options)),
      shard_pg_(std::move(shard_pg)),
      replicate_pg_(std::move(replicate_pg)),
      handle_(std::move(handle)),
      ignored_(std::move(ignored)) {}

void UnitState::attach(FullyShardedDataParallel* wrapper) {
  wrapper_ = wrapper;
  label_ = fmt::format("({})", wrapped().type_name());
  if (handle_) handle_->set_owner(wrapper_, label_);
}

nn::Module& UnitState::wrapped() const { return wrapper_->module(); }

void UnitState::set_training_state(TrainingState next, const char* action,
                                   std::initializer_list<TrainingState> allowed) {
  detail::check_state(label_, action, training_state_, allowed);
  training_state_ = next;
}

void UnitState::check_idle(const char* action) const {
  const bool in_backward = torch::autograd::get_current_graph_task_id() != -1;
  if (training_state_ != TrainingState::IDLE || in_backward) {
    detail::throw_lifecycle_error(
        label_, action,
        in_backward ? fmt::format("{} during a backward pass", to_string(training_state_)) : to_string(training_state_),
        "IDLE (outside forward, backward and summon_full_params)");
  }
}

// ------------------------------------------------------------------ lazy init

const char* to_string(UnitRole role) {
  switch (role) {
    case UnitRole::UNSET:
      return "UNSET";
    case UnitRole::ROOT:
      return "ROOT";
    case UnitRole::NON_ROOT:
      return "NON_ROOT";
  }
  return "?";
}

// The first unit to run forward is the root of every unit below it (PyTorch's _lazy_init;
// [Note: an FSDP1 unit's role]).
void UnitState::lazy_init() {
  if (role_ != UnitRole::UNSET) return;
  role_ = UnitRole::ROOT;
  root_ = this;
  tree_.clear();
  pre_forward_order_.clear();
  post_forward_order_.clear();
  exec_order_frozen_ = false;
  for (auto& [fqn, m] : wrapper_->named_modules_tdc()) {
    auto* unit = dynamic_cast<FullyShardedDataParallel*>(m);
    if (!unit) continue;
    UnitState& s = unit->unit();
    tree_.push_back(&s);
    s.label_ = unit_label(detail::clean_fqn(fqn), s.wrapped());
    if (s.handle_) s.handle_->set_owner(s.wrapper_, s.label_);
    if (&s == this) continue;
    detail::check_state(s.label_, fmt::format("becoming a non-root unit of {}", label_).c_str(), s.role_,
                        {UnitRole::UNSET, UnitRole::NON_ROOT});
    s.role_ = UnitRole::NON_ROOT;
    s.root_ = this;
    s.tree_.clear();
  }
  check_offloaded_devices();
  cast_root_buffers();
  agree_collective_plans();
}

// [Note: FSDP1 checks its collectives once per tree] Instead of each flat parameter checking the
// first call of each of its collectives across ranks ([Note: cross-rank argument checks]), the
// root's lazy init compares what every flat parameter of the tree will issue (the all-gathers, the
// reduction, the replicate group's all-reduce: dtype and sizes) in one exchange per process group,
// groups in the order the tree first uses them. Every rank sees every rank's list, so ranks whose
// trees differ all throw, naming the first unit that differs; otherwise the handles' collectives
// skip the per-call checks, as they did after their first call.
void UnitState::agree_collective_plans() {
  if (!comm::argument_checks()) return;
  struct GroupPlan {
    comm::GroupPtr group;
    std::vector<std::string> units, ops;
  };
  std::vector<GroupPlan> plans;
  for (UnitState* s : tree_) {
    if (!s->handle_) continue;
    for (auto& [group, op] : s->handle_->collective_plan()) {
      auto it = std::find_if(plans.begin(), plans.end(), [&](const GroupPlan& p) { return p.group == group; });
      if (it == plans.end()) it = plans.insert(plans.end(), GroupPlan{group, {}, {}});
      it->units.push_back(s->label_);
      it->ops.push_back(op);
    }
  }
  for (const auto& p : plans) {
    const auto mine = fmt::format("{}", fmt::join(p.ops, "\n"));
    const auto all = comm::all_gather_strings(mine, p.group);
    if (std::all_of(all.begin(), all.end(), [&](const std::string& x) { return x == mine; })) continue;
    throw_plan_mismatch(p.group, p.units, all);
  }
  for (UnitState* s : tree_) {
    if (s->handle_) s->handle_->mark_collectives_checked();
  }
}

void UnitState::throw_plan_mismatch(const comm::GroupPtr& group, const std::vector<std::string>& units,
                                    const std::vector<std::string>& all) const {
  std::vector<std::vector<std::string>> ops;
  size_t longest = 0;
  for (const auto& text : all) {
    ops.push_back(plan_lines(text));
    longest = std::max(longest, ops.back().size());
  }
  size_t i = 0;
  while (i < longest &&
         std::all_of(ops.begin(), ops.end(), [&](const auto& o) { return i < o.size() && o[i] == ops[0][i]; }))
    ++i;
  std::vector<std::string> per_rank;
  for (size_t r = 0; r < ops.size(); ++r) {
    per_rank.push_back(fmt::format("rank {}: {}", r, i < ops[r].size() ? ops[r][i] : "none"));
  }
  throw std::invalid_argument(fmt::format(
      "FSDP1 root {}: the ranks' flat parameters would issue different collectives on group '{}' (size {}), "
      "from its collective {} on (unit {}): {}. Every rank must wrap the same model the same way.",
      label_, group->name(), group->size(), i + 1, i < units.size() ? units[i] : units.back(),
      fmt::join(per_rank, "; ")));
}

void UnitState::check_offloaded_devices() const {
  for (UnitState* s : tree_) {
    if (!s->options_.cpu_offload.offload_params || !s->handle_) continue;
    const c10::Device d = s->handle_->flat_param().device();
    if (d.type() != c10::kCPU) {
      throw std::runtime_error(fmt::format(
          "An FSDP-managed module with parameter CPU offloading enabled has parameters on {}. Make sure to not move "
          "the module from CPU when offloading parameters. (FSDP unit {})",
          d.str(), s->label_));
    }
  }
}

void UnitState::cast_root_buffers() {
  for (UnitState* s : tree_) {
    const auto& mp = s->options_.mixed_precision;
    if (!mp || !mp->buffer_dtype) continue;
    for (auto& [name, b] : s->wrapped().named_bufs(/*recurse=*/true)) {
      if (!at::isFloatingType(b.scalar_type()) || b.scalar_type() == *mp->buffer_dtype) continue;
      cast_buffers.emplace_back(b, b.scalar_type());
      at::NoGradGuard no_grad;
      at::Tensor(b).set_data(b.to(*mp->buffer_dtype));
    }
  }
}

// ------------------------------------------------------------------ forward

nn::Tensors UnitState::pre_forward(nn::Tensors inputs) {
  lazy_init();  // a no-op once the role is set
  if (handle_ && !options_.use_orig_params && at::GradMode::is_enabled() && recomputes_inside()) {
    // The checkpoint Function learns that its output needs a gradient from the parameters it
    // reads; with use_orig_params=false the registered originals are empty, so a first layer
    // would get none. Refuse rather than train wrong.
    throw std::invalid_argument(fmt::format(
        "{}: activation recompute (nn::checkpoint) inside an FSDP1 unit needs use_orig_params=true in tdc (the "
        "registered parameters are empty with use_orig_params=false; docs/fsdp1.md)",
        label_));
  }
  // FORWARD_BACKWARD too: activation checkpointing recomputes a unit's forward inside backward.
  set_training_state(TrainingState::FORWARD_BACKWARD, "forward",
                     {TrainingState::IDLE, TrainingState::FORWARD_BACKWARD});
  const auto& mp = options_.mixed_precision;
  if (mp && mp->param_dtype) {
    const bool cast = is_root() ? mp->cast_root_forward_inputs : mp->cast_forward_inputs;
    if (cast && (handle_ || is_root())) inputs = cast_floating(std::move(inputs), *mp->param_dtype);
  }
  if (!handle_) return inputs;
  handle_->set_state(
      HandleTrainingState::FORWARD, "forward",
      {HandleTrainingState::IDLE, HandleTrainingState::BACKWARD_PRE, HandleTrainingState::BACKWARD_POST});
  handle_->ran_pre_backward = false;
  record_execution(&UnitState::pre_forward_order_);
  handle_->unshard();
  if (options_.forward_prefetch) prefetch(+1);
  apply_unshard_node();
  return inputs;
}

void UnitState::record_execution(std::vector<UnitState*> UnitState::*order) {
  UnitState* root = root_ ? root_ : this;
  if (root->exec_order_frozen_) return;
  auto& list = root->*order;
  if (std::find(list.begin(), list.end(), this) == list.end()) list.push_back(this);
}

void UnitState::apply_unshard_node() {
  std::vector<at::Tensor> views;
  if (at::GradMode::is_enabled() && handle_->flat_param().requires_grad()) {
    views = UnshardViews::apply(c10::make_intrusive<UnitRef>(shared_from_this()), handle_->flat_param());
    testing::detail::notify_register_post_backward_hook();
  } else {
    views = handle_->unsharded_views();
  }
  // Views of parameters that do not require grad must not require it either.
  for (size_t i = 0; i < views.size(); ++i) {
    if (!handle_->slots()[i].requires_grad && views[i].requires_grad()) views[i] = views[i].detach();
  }
  handle_->install_substitutes(views);
}

nn::Tensors UnitState::post_forward(nn::Tensors outputs) {
  if (handle_) {
    record_execution(&UnitState::post_forward_order_);
    handle_->clear_substitutes();
    const bool reshard_after_forward = !is_root() && (options_.sharding_strategy == ShardingStrategy::FULL_SHARD ||
                                                      options_.sharding_strategy == ShardingStrategy::HYBRID_SHARD);
    reshard(reshard_after_forward && handle_->sharded());
    handle_->set_state(HandleTrainingState::IDLE, "post-forward", {HandleTrainingState::FORWARD});
  }
  if (at::GradMode::is_enabled()) {
    testing::detail::notify_register_pre_backward_hooks();
    std::weak_ptr<UnitState> weak = weak_from_this();
    for (auto& y : outputs) {
      if (!y.defined() || !y.requires_grad()) continue;
      y.register_hook([weak](const at::Tensor& g) {
        if (auto s = weak.lock()) s->pre_backward();
        return g;
      });
    }
  } else if (is_root()) {
    // No backward follows a no-grad forward: the root's end-of-backward work happens now.
    root_end_of_backward();
  }
  training_state_ = TrainingState::IDLE;  // as PyTorch's _post_forward; pre-backward re-enters
  if (is_root()) exec_order_frozen_ = true;
  return outputs;
}

// ------------------------------------------------------------------ backward

void UnitState::pre_backward() {
  if (is_root() && !end_of_backward_queued_) {
    end_of_backward_queued_ = true;
    std::weak_ptr<UnitState> weak = weak_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([weak] {
      if (auto s = weak.lock()) s->root_end_of_backward();
    });
  }
  if (!handle_ || handle_->ran_pre_backward) return;
  set_training_state(TrainingState::FORWARD_BACKWARD, "pre-backward",
                     {TrainingState::IDLE, TrainingState::FORWARD_BACKWARD});
  handle_->set_state(HandleTrainingState::BACKWARD_PRE, "pre-backward",
                     {HandleTrainingState::IDLE, HandleTrainingState::BACKWARD_POST});
  handle_->ran_pre_backward = true;
  handle_->unshard();
  if (recomputes_inside()) install_backward_leaves();
  if (options_.backward_prefetch == BackwardPrefetch::BACKWARD_PRE) prefetch(-1);
}

bool UnitState::recomputes_inside() const {
  for (const auto& [fqn, m] : wrapped().named_modules_tdc()) {
    if (m->checkpointed()) return true;
  }
  return false;
}

void UnitState::install_backward_leaves() {
  backward_leaves_.clear();
  const auto views = handle_->unsharded_views();
  for (size_t i = 0; i < views.size(); ++i) {
    backward_leaves_.push_back(views[i].detach().requires_grad_(handle_->slots()[i].requires_grad));
  }
  handle_->install_substitutes(backward_leaves_);
}

void UnitState::post_backward(const std::vector<at::Tensor>& grads) {
  handle_->set_state(HandleTrainingState::BACKWARD_POST, "post-backward",
                     {HandleTrainingState::BACKWARD_PRE, HandleTrainingState::IDLE});
  if (!backward_leaves_.empty()) {
    deferred_grads_ = grads;  // [Note: FSDP1 and activation recompute]
    return;
  }
  reduce_grads(grads);
}

void UnitState::finish_deferred_backward() {
  std::vector<at::Tensor> grads = deferred_grads_;
  grads.resize(backward_leaves_.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& g = backward_leaves_[i].grad();
    if (!g.defined()) continue;
    grads[i] = grads[i].defined() ? grads[i] + g : g;
  }
  handle_->clear_substitutes();
  backward_leaves_.clear();
  deferred_grads_.clear();
  if (handle_->state() == HandleTrainingState::BACKWARD_PRE) {
    handle_->set_state(HandleTrainingState::BACKWARD_POST, "post-backward (deferred)",
                       {HandleTrainingState::BACKWARD_PRE});
  }
  reduce_grads(grads);
}

// [Note: FSDP1 async reduce-scatter] As FSDP2's ([Note: async reduce-scatter], fsdp/state.cpp):
// a unit's gradients are reduce-scattered while the backward of the units before it computes, as
// PyTorch's FSDP1 does on its post-backward stream. The root keeps the one reduction in flight;
// the next unit's post-backward finishes it (the rest of the reduction: the replicate group's
// all-reduce, the post-divide, the cast, the add to the sharded .grad) before issuing its own, and
// the root's end of backward finishes the last, so every .grad is complete when backward()
// returns. Same collectives on the same buffers in the same order: the values do not change. A
// backward the root's end-of-backward callback was not queued for (it did not pass through the
// root's output) reduces synchronously.
void UnitState::reduce_grads(const std::vector<at::Tensor>& grads) {
  at::Tensor flat_grad = handle_->flatten_grads(grads);
  UnitState* root = root_ ? root_ : this;
  if (sync_gradients) {
    root->finish_pending_reduce();
    const bool async_op = root->end_of_backward_queued_;
    handle_->reduce_and_accumulate(std::move(flat_grad), async_op);
    if (async_op) root->pending_reduce_ = this;
  } else {
    handle_->accumulate_unsharded(flat_grad);
  }
  if (options_.backward_prefetch == BackwardPrefetch::BACKWARD_POST) prefetch(-1);
  const bool reshard_strategy = options_.sharding_strategy == ShardingStrategy::FULL_SHARD ||
                                options_.sharding_strategy == ShardingStrategy::HYBRID_SHARD;
  reshard(handle_->sharded() && (sync_gradients || reshard_strategy));
}

void UnitState::finish_pending_reduce() {
  if (pending_reduce_ == nullptr) return;
  UnitState* unit = pending_reduce_;
  pending_reduce_ = nullptr;
  unit->handle_->finish_reduce();
}

void UnitState::reshard(bool free) {
  testing::detail::notify_before_reshard(*handle_);
  if (free) handle_->reshard();
}

// Forward (+1): the unit after this one in pre-forward order. Backward (-1): the unit before
// this one in post-forward order, whose backward runs next. Only once the order is known (from the
// second iteration on), and never a unit whose backward already ran.
// [Note: FSDP1 async prefetch] A prefetch issues the all-gather and returns (the handle is
// UNSHARDING, [Note: FSDP1 unshard lifecycle] in flat_param.h): the gather runs on the backend's
// threads while this unit computes, as on PyTorch's unshard stream, and the prefetched unit's own
// unshard (its pre-forward or pre-backward) waits for it. A prefetched unit whose forward or
// backward does not come is waited for and resharded at the root's end of backward.
void UnitState::prefetch(int direction) {
  UnitState* root = root_ ? root_ : this;
  if (!root->exec_order_frozen_) return;
  const auto& order = direction > 0 ? root->pre_forward_order_ : root->post_forward_order_;
  auto it = std::find(order.begin(), order.end(), this);
  if (it == order.end()) return;
  const int64_t j = (it - order.begin()) + direction;
  if (j < 0 || j >= static_cast<int64_t>(order.size())) return;
  UnitState* next = order[static_cast<size_t>(j)];
  if (direction < 0 && next->handle_->ran_pre_backward) return;
  // As PyTorch's _prefetch_handle: the handle is unsharded in the state it is prefetched for
  // (FORWARD or BACKWARD_PRE), which decides the views it exposes ([Note: which views an unshard
  // exposes]), then returns to the state it was in.
  auto& h = *next->handle_;
  const HandleTrainingState was = h.state();
  const HandleTrainingState as = direction > 0 ? HandleTrainingState::FORWARD : HandleTrainingState::BACKWARD_PRE;
  h.set_state(as, "prefetch", {was});
  h.unshard(/*async_op=*/true);  // [Note: FSDP1 async prefetch]
  h.set_state(was, "prefetch done", {as});
}

// [Note: FSDP1 end of backward] The root queues this when its first pre-backward hook fires:
// every unit is resharded (units whose backward did not run included) and returns to IDLE.
void UnitState::root_end_of_backward() {
  for (UnitState* s : tree_) {
    if (s->handle_ && !s->backward_leaves_.empty()) s->finish_deferred_backward();
  }
  end_of_backward_queued_ = false;
  finish_pending_reduce();
  for (UnitState* s : tree_) {
    if (s->handle_) {
      auto* h = s->handle_.get();
      h->wait_for_unshard();  // a prefetch whose unit did not run
      const bool keep = !s->sync_gradients && !(s->options_.sharding_strategy == ShardingStrategy::FULL_SHARD ||
                                                s->options_.sharding_strategy == ShardingStrategy::HYBRID_SHARD);
      if ((!keep || !h->sharded()) && h->is_unsharded()) s->reshard(/*free=*/true);
      h->set_state(HandleTrainingState::IDLE, "end of backward",
                   {HandleTrainingState::IDLE, HandleTrainingState::BACKWARD_PRE, HandleTrainingState::BACKWARD_POST});
      h->ran_pre_backward = false;
    }
    s->training_state_ = TrainingState::IDLE;
  }
}

}  // namespace tdc::fsdp1
